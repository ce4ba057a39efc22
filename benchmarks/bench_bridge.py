"""Two kickmsg bridges over Zenoh on loopback, against pyzmq PUB/SUB, in one
run on one machine.

Our path: a publisher process writes channel A; ``kickmsg bridge`` A exports
it, ``kickmsg bridge`` B (another process, key prefix of its own, connected
over tcp/127.0.0.1) imports it into channel B; a receiver process reads
channel B. Five processes, two shared-memory hops and one TCP hop. pyzmq's
path: the same publisher sends on a PUB socket bound to tcp://127.0.0.1, the
receiver reads a SUB socket connected to it: two processes, one TCP hop.

  1. one-way latency: a 64 B message stamped with time.monotonic_ns() every
     millisecond; latency is the receiver's clock minus the stamp (one
     machine: one clock). Medians of the repeats' medians and p99s, after a
     warm-up.
  2. throughput: as many 64 B messages as the publisher can send (kickmsg:
     Publisher.send, retried while the pool is empty; pyzmq: send, default
     high-water mark); messages received per second between the first and
     the last receipt, and the share of messages that arrived (both drop
     rather than slow the publisher down: the bridge's ring overflows,
     0MQ's queue reaches its high-water mark).

Before each measurement the publisher sends priming messages until the
receiver has seen one (so the path is open end to end: the SUB socket
connected, the bridges' description exchanged); they are not counted.

Results go to benchmarks/results/bench_bridge.json. Numbers taken while the
machine does other work are noisy; compare the two columns of one run.

Run (from the repository root; ``make bench`` runs it after bench_wait.py):
    .venv/bin/python benchmarks/bench_bridge.py           # under a minute
    .venv/bin/python benchmarks/bench_bridge.py --quick   # smoke run
"""
import argparse
import importlib.metadata
import json
import os
import pathlib
import platform
import secrets
import select
import signal
import socket
import statistics
import struct
import subprocess
import sys
import threading
import time

HERE = pathlib.Path(__file__).resolve().parent
ROOT = HERE.parent
RESULTS_DIR = HERE / "results"
STAMP = struct.Struct("<QQ")  # sequence, monotonic_ns at send
STOP_SEQUENCE = 2**64 - 1
PRIME_SEQUENCE = 2**64 - 2  # sent until the receiver has seen one
PRIME_PERIOD_S = 0.005
SIZE = 64
PERIOD_S = 0.001
GEOMETRY = {"max_subscribers": 4, "sub_ring_capacity": 1024, "pool_size": 2048, "max_payload_size": 1024}
SETTINGS = {
    "full": {"warmup": 300, "samples": 3000, "repeats": 5, "flood": 50_000},
    "quick": {"warmup": 200, "samples": 400, "repeats": 2, "flood": 5_000},
}
SILENCE_S = 2.0  # the receiver of a flood stops after this long without a message


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


# -- the two ends (run as child processes of this script) -----------------------------


def receiver(args: dict) -> None:
    """Receive until the stop message (or a silence); print the latencies,
    the count and the receive span."""
    if args["kind"] == "zmq":
        import zmq

        sub = zmq.Context().socket(zmq.SUB)
        sub.setsockopt(zmq.SUBSCRIBE, b"")
        sub.setsockopt(zmq.RCVTIMEO, int(SILENCE_S * 1000))
        sub.connect(args["endpoint"])

        def receive():
            try:
                return sub.recv()
            except zmq.Again:
                return None
    else:
        import kickmsg

        region = kickmsg.SharedRegion.create_or_open(args["channel"], kickmsg.ChannelType.PubSub, kickmsg.Config(**GEOMETRY))
        subscriber = kickmsg.Subscriber(region)

        def receive():
            return subscriber.receive(SILENCE_S)
    print("ready", flush=True)
    latencies, first, last, count, primed = [], None, None, 0, False
    clock = time.monotonic_ns
    while True:
        data = receive()
        now = clock()
        if data is None and first is not None:
            break
        if data is None:
            continue
        sequence, stamp = STAMP.unpack_from(data)
        if sequence == STOP_SEQUENCE:
            break
        if sequence == PRIME_SEQUENCE:  # the path is open end to end (bridges: description exchanged)
            if not primed:
                print("primed", flush=True)
                primed = True
            continue
        first = now if first is None else first
        last, count = now, count + 1
        if sequence >= args["warmup"]:
            latencies.append(now - stamp)
    print(json.dumps({"latencies_ns": latencies, "received": count, "span_ns": (last or 0) - (first or 0)}), flush=True)


def publisher(args: dict) -> None:
    """Send warmup + samples stamped messages, one per period (or a flood
    of ``flood`` messages back to back), then stop messages."""
    if args["kind"] == "zmq":
        import zmq

        pub = zmq.Context().socket(zmq.PUB)
        pub.setsockopt(zmq.LINGER, 0)
        pub.bind(args["endpoint"])
        send = pub.send
    else:
        import kickmsg
        from kickmsg.publisher import send_retrying

        kick = kickmsg.Publisher(kickmsg.SharedRegion.open(args["channel"]))

        def send(data: bytes) -> None:
            send_retrying(kick, data, 1.0)
    clock, pack, padding = time.monotonic_ns, STAMP.pack, bytes(SIZE - STAMP.size)
    print("ready", flush=True)
    # Prime until the driver says go, once the receiver saw a message: the
    # path is open end to end (a SUB socket connected; a bridge, which drops
    # what arrives before its first description exchange, has had it).
    while not select.select([sys.stdin], [], [], PRIME_PERIOD_S)[0]:
        send(pack(PRIME_SEQUENCE, 0) + padding)
    sys.stdin.readline()
    if args.get("flood"):
        for sequence in range(args["flood"]):
            send(pack(sequence, clock()) + padding)
    else:
        period_ns = int(PERIOD_S * 1e9)
        next_send = clock() + period_ns
        for sequence in range(args["warmup"] + args["samples"]):
            remaining = next_send - clock()
            if remaining > 0:
                time.sleep(remaining / 1e9)
            stamp = clock()
            next_send = stamp + period_ns
            send(pack(sequence, stamp) + padding)
    time.sleep(0.5)
    for _ in range(3):
        send(pack(STOP_SEQUENCE, 0) + padding)
        time.sleep(0.05)


# -- the run ---------------------------------------------------------------------------------


def child(role: str, args: dict) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, __file__, "--role", role, json.dumps(args)],
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)


def start_bridges(a_channel: str, b_channel: str) -> list[subprocess.Popen]:
    """Bridge A exports, bridge B imports; returns once A's key has a
    matching subscriber."""
    endpoint = f"tcp/127.0.0.1:{free_port()}"
    command = [sys.executable, "-m", "kickmsg", "bridge", "--json", "--stats-interval", "0.2"]
    a = subprocess.Popen(command + ["--export", a_channel, "--key-prefix", "bench/a", "--listen", endpoint],
                         stdout=subprocess.PIPE, text=True, cwd=ROOT)
    b = subprocess.Popen(command + ["--import", f"bench/a/{a_channel[1:]}={b_channel}", "--key-prefix", "bench/b",
                                    "--connect", endpoint], stdout=subprocess.DEVNULL, cwd=ROOT)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        if select.select([a.stdout], [], [], 1.0)[0]:
            line = a.stdout.readline()
            if not line:
                break
            if json.loads(line)["channels"][0]["matched"]:  # then keep reading, so that its prints never block
                threading.Thread(target=a.stdout.read, daemon=True).start()
                return [a, b]
    for process in (a, b):
        process.kill()
    raise RuntimeError("the two bridges did not connect within 30 s")


def wait_for_line(process: subprocess.Popen, expected: str, timeout_s: float) -> None:
    """Read ``process``'s stdout until the line ``expected``, at most ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if select.select([process.stdout], [], [], 1.0)[0]:
            line = process.stdout.readline()
            if line.strip() == expected:
                return
            if not line:
                break
    raise RuntimeError(f"no {expected!r} from the receiver within {timeout_s:g} s")


def measure(kind: str, settings: dict, prefix: str, flood: bool) -> dict:
    """One publisher and one receiver (and, for kickmsg, two bridges)."""
    a_channel, b_channel = f"/{prefix}_a", f"/{prefix}_b"
    args = dict(settings, kind=kind, channel=a_channel, endpoint=f"tcp://127.0.0.1:{free_port()}",
                flood=settings["flood"] if flood else 0)
    started: list[subprocess.Popen] = []
    try:
        if kind == "kickmsg":
            import kickmsg

            kickmsg.SharedRegion.create(a_channel, kickmsg.ChannelType.PubSub, kickmsg.Config(**GEOMETRY), "bench")
            started.append(child("receiver", dict(args, channel=b_channel)))
            if started[-1].stdout.readline().strip() != "ready":
                raise RuntimeError("the receiver did not start")
            started += start_bridges(a_channel, b_channel)
            pub = child("publisher", args)
        else:
            pub = child("publisher", args)
            if pub.stdout.readline().strip() != "ready":
                raise RuntimeError("the publisher did not start")
            started.append(child("receiver", args))
            if started[0].stdout.readline().strip() != "ready":
                raise RuntimeError("the receiver did not start")
        started.append(pub)
        if kind == "kickmsg" and pub.stdout.readline().strip() != "ready":
            raise RuntimeError("the publisher did not start")
        wait_for_line(started[0], "primed", 60)
        pub.stdin.write("go\n")
        pub.stdin.flush()
        if pub.wait(timeout=300) != 0:
            raise RuntimeError(f"{kind}: the publisher failed")
        stdout, _ = started[0].communicate(timeout=60)
        return json.loads(stdout.strip().splitlines()[-1])
    finally:
        for process in started:
            if process.poll() is None:
                process.send_signal(signal.SIGTERM)
            try:
                process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()


def latency_summary(latencies_ns: list, settings: dict) -> dict:
    samples = settings["samples"] // settings["repeats"]
    microseconds = [ns / 1000 for ns in latencies_ns]
    chunks = [microseconds[i : i + samples] for i in range(0, len(microseconds) - samples + 1, samples)] or [microseconds]
    medians = [statistics.median(chunk) for chunk in chunks]
    return {
        "median_us": statistics.median(medians),
        "p99_us": statistics.median(sorted(chunk)[round(0.99 * (len(chunk) - 1))] for chunk in chunks),
        "received": len(microseconds),
        "sent": settings["samples"],
    }


def throughput_summary(result: dict, sent: int) -> dict:
    span_s = result["span_ns"] / 1e9
    return {"messages_per_s": result["received"] / span_s if span_s else 0.0, "received": result["received"],
            "sent": sent, "delivered": result["received"] / sent}


def remove_leftovers(prefix: str) -> None:
    for path in pathlib.Path("/dev/shm").glob(f"{prefix}_*"):
        path.unlink(missing_ok=True)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="a short smoke run")
    parser.add_argument("--output", type=pathlib.Path, help="JSON results file (default: results/bench_bridge.json, "
                        "results/bench_bridge_quick.json with --quick)")
    parser.add_argument("--role", choices=["receiver", "publisher"], help=argparse.SUPPRESS)
    parser.add_argument("args", nargs="?", help=argparse.SUPPRESS)
    options = parser.parse_args()
    if options.role:
        {"receiver": receiver, "publisher": publisher}[options.role](json.loads(options.args))
        return 0
    import zmq

    settings = dict(SETTINGS["quick" if options.quick else "full"])
    settings["samples"] -= settings["samples"] % settings["repeats"]
    prefix = f"kmbenchbridge_{os.getpid()}_{secrets.token_hex(3)}"
    print(f"{platform.processor() or platform.machine()}, {os.cpu_count()} cores, Python {platform.python_version()}, "
          f"eclipse-zenoh {importlib.metadata.version('eclipse-zenoh')}, pyzmq {zmq.__version__} / libzmq {zmq.zmq_version()}, "
          f"load average {os.getloadavg()[0]:.2f}", file=sys.stderr)
    results: dict = {"settings": settings}
    try:
        for kind in ("kickmsg", "zmq"):
            print(f"  {kind}: latency ...", file=sys.stderr, flush=True)
            measured = measure(kind, settings, f"{prefix}_{kind}_l", flood=False)
            results.setdefault("latency", {})[kind] = latency_summary(measured["latencies_ns"], settings)
            print(f"  {kind}: throughput ...", file=sys.stderr, flush=True)
            measured = measure(kind, settings, f"{prefix}_{kind}_t", flood=True)
            results.setdefault("throughput", {})[kind] = throughput_summary(measured, settings["flood"])
    finally:
        remove_leftovers(prefix)
    ours, theirs = results["latency"]["kickmsg"], results["latency"]["zmq"]
    print("\n| 64 B messages, loopback | kickmsg → bridge → Zenoh → bridge → kickmsg | pyzmq PUB/SUB (tcp) |\n|---|---|---|")
    print(f"| one-way latency, 1 kHz (median; p99) | {ours['median_us']:.0f} µs; {ours['p99_us']:.0f} µs | "
          f"{theirs['median_us']:.0f} µs; {theirs['p99_us']:.0f} µs |")
    ours, theirs = results["throughput"]["kickmsg"], results["throughput"]["zmq"]
    print(f"| throughput, {settings['flood']} sent back to back (received/s; delivered) | "
          f"{ours['messages_per_s']:,.0f}/s; {ours['delivered']:.0%} | {theirs['messages_per_s']:,.0f}/s; {theirs['delivered']:.0%} |")
    output = options.output or RESULTS_DIR / f"bench_bridge{'_quick' if options.quick else ''}.json"
    output.parent.mkdir(parents=True, exist_ok=True)
    output.write_text(json.dumps(results, indent=2) + "\n")
    print(f"\nresults written to {output}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
