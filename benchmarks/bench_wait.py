"""Waiting on kickmsg channels from asyncio and with a WaitSet, against pyzmq,
in one run on one machine.

  1. asyncio, one channel: a publisher process stamps time.monotonic_ns()
     into a 64 B message every millisecond; the receiving process runs an
     event loop and awaits each message: ``await kickmsg.aio.receive(sub)``
     against ``await socket.recv()`` on a ``zmq.asyncio`` SUB socket. For
     reference, the same with a blocking receive (``Subscriber.receive`` /
     ``socket.recv``), as in bench_core.py.
  2. waiting on many channels: the same publisher sends each message into
     the next of 1, 10 or 100 channels in turn; the receiver waits on all of
     them (``WaitSet.wait()`` / ``zmq.Poller.poll()`` over as many SUB
     sockets), then receives from those ready.
  3. idle CPU: the process CPU time of one 2-second wait (0.5 s with
     --quick) with nothing published: WaitSet.wait(2.0) over 1, 10 and 100
     subscribers and aio.receive(sub, 2.0), against zmq.Poller.poll(2000)
     over as many sockets and a zmq.asyncio recv under
     asyncio.wait_for(..., 2.0).

Latency is the difference between the stamp and the receiver's clock once it
holds the message. Each measurement is one receiver and one publisher
process; the samples are cut into repeats (after a warm-up that also lets
0MQ connect): medians of the repeats' medians and p99s. 0MQ: PUB connects
to a SUB bound on ipc://, one socket pair per channel. Ratios are ours /
pyzmq's from this run. Results go to benchmarks/results/bench_wait.json.

Run (from the repository root; ``make bench`` runs it after bench_core.py):
    .venv/bin/python benchmarks/bench_wait.py           # about 1 minute
    .venv/bin/python benchmarks/bench_wait.py --quick   # smoke run
"""
import argparse
import asyncio
import json
import os
import pathlib
import platform
import secrets
import statistics
import struct
import subprocess
import sys
import time

HERE = pathlib.Path(__file__).resolve().parent
RESULTS_DIR = HERE / "results"
STAMP = struct.Struct("<QQ")  # sequence, monotonic_ns at send
STOP_SEQUENCE = 2**64 - 1
SIZE = 64
PERIOD_S = 0.001
SETTINGS = {
    "full": {"warmup": 300, "samples": 1000, "repeats": 5, "idle_s": 2.0},
    "quick": {"warmup": 200, "samples": 200, "repeats": 2, "idle_s": 0.5},
}
CHANNELS = (1, 10, 100)
# (row, ours' receiver, pyzmq's receiver, channels)
LATENCY_ROWS = [("asyncio: await one message, 1 channel", "aio", "zmq_aio", 1)]
LATENCY_ROWS += [("blocking receive, 1 channel (reference)", "receive", "zmq_recv", 1)]
LATENCY_ROWS += [(f"WaitSet.wait / zmq.Poller.poll, {n} channel{'s' * (n > 1)}", "waitset", "zmq_poller", n) for n in CHANNELS]
IDLE_ROWS = [(f"idle wait, {n} channel{'s' * (n > 1)}", "waitset", "zmq_poller", n) for n in CHANNELS]
IDLE_ROWS += [("idle await (asyncio), 1 channel", "aio", "zmq_aio", 1)]


# -- the two ends (run as child processes of this script) -----------------------------


def endpoints(prefix: str, count: int) -> list[str]:
    return [f"ipc:///tmp/{prefix}_{index}.ipc" for index in range(count)]


def shm_names(prefix: str, count: int) -> list[str]:
    return [f"/{prefix}_{index}" for index in range(count)]


def open_receiver(kind: str, prefix: str, count: int):
    """The receiving end: (what to close, the receive-or-wait objects)."""
    if kind.startswith("zmq"):
        import zmq
        import zmq.asyncio

        context = zmq.asyncio.Context() if kind == "zmq_aio" else zmq.Context()
        sockets = []
        for endpoint in endpoints(prefix, count):
            socket = context.socket(zmq.SUB)
            socket.setsockopt(zmq.LINGER, 0)
            socket.setsockopt(zmq.SUBSCRIBE, b"")
            socket.bind(endpoint)
            sockets.append(socket)
        return context, sockets
    import kickmsg

    cfg = kickmsg.Config(max_subscribers=2, sub_ring_capacity=64, pool_size=128, max_payload_size=SIZE)
    regions = [kickmsg.SharedRegion.create(name, kickmsg.ChannelType.PubSub, cfg) for name in shm_names(prefix, count)]
    return regions, [kickmsg.Subscriber(region) for region in regions]


def receive_loop(kind: str, ends: list, warmup: int) -> list[int]:
    """Receive until the stop message; the latencies (ns) after the warm-up."""
    clock, unpack = time.monotonic_ns, STAMP.unpack_from
    latencies = []

    def note(data) -> bool:
        sequence, stamp = unpack(data)
        if sequence == STOP_SEQUENCE:
            return False
        if sequence >= warmup:
            latencies.append(clock() - stamp)
        return True

    if kind == "receive":
        (subscriber,) = ends
        while note(subscriber.receive(None)):
            pass
    elif kind == "zmq_recv":
        (socket,) = ends
        while note(socket.recv()):
            pass
    elif kind == "waitset":
        import kickmsg

        waitset = kickmsg.WaitSet()
        for subscriber in ends:
            waitset.add(subscriber)
        going = True
        while going:
            for subscriber in waitset.wait():
                while going and (data := subscriber.try_receive()) is not None:
                    going = note(data)
    elif kind == "zmq_poller":
        import zmq

        poller = zmq.Poller()
        for socket in ends:
            poller.register(socket, zmq.POLLIN)
        going = True
        while going:
            for socket, _ in poller.poll():
                going = going and note(socket.recv(zmq.NOBLOCK))
    elif kind == "aio":
        from kickmsg import aio

        async def main():
            while note(await aio.receive(ends[0])):
                pass

        asyncio.run(main())
    elif kind == "zmq_aio":

        async def main():
            while note(await ends[0].recv()):
                pass

        asyncio.run(main())
    return latencies


def idle_wait(kind: str, ends: list, seconds: float) -> float:
    """Process CPU seconds of one wait of ``seconds`` with nothing published."""
    before = time.process_time()
    if kind == "waitset":
        import kickmsg

        waitset = kickmsg.WaitSet()
        for subscriber in ends:
            waitset.add(subscriber)
        assert waitset.wait(seconds) == []
    elif kind == "zmq_poller":
        import zmq

        poller = zmq.Poller()
        for socket in ends:
            poller.register(socket, zmq.POLLIN)
        assert poller.poll(seconds * 1000) == []
    elif kind == "aio":
        from kickmsg import aio

        assert asyncio.run(aio.receive(ends[0], seconds)) is None
    elif kind == "zmq_aio":

        async def main():
            try:
                await asyncio.wait_for(ends[0].recv(), seconds)
            except TimeoutError:
                return None

        assert asyncio.run(main()) is None
    return time.process_time() - before


def receiver(args: dict) -> None:
    owner, ends = open_receiver(args["kind"], args["prefix"], args["channels"])
    print("ready", flush=True)
    if args["idle"]:
        result = {"cpu_s": idle_wait(args["kind"], ends, args["idle_s"])}
    else:
        result = {"latencies_ns": receive_loop(args["kind"], ends, args["warmup"])}
    print(json.dumps(result), flush=True)
    if not args["kind"].startswith("zmq"):
        for region in owner:
            region.unlink()


def publisher(args: dict) -> None:
    """Send warmup + samples stamped messages, one per period, into the
    channels in turn, then the stop message into each."""
    count = args["channels"]
    if args["kind"].startswith("zmq"):
        import zmq

        context = zmq.Context()
        sockets = [context.socket(zmq.PUB) for _ in range(count)]
        for socket, endpoint in zip(sockets, endpoints(args["prefix"], count)):
            socket.setsockopt(zmq.LINGER, 0)  # stop messages the receiver no longer reads: drop them at exit
            socket.connect(endpoint)
        sends = [socket.send for socket in sockets]
    else:
        import kickmsg

        sends = [kickmsg.Publisher(kickmsg.SharedRegion.open(name)).send for name in shm_names(args["prefix"], count)]
    clock, pack, padding = time.monotonic_ns, STAMP.pack, bytes(SIZE - STAMP.size)
    period_ns = int(PERIOD_S * 1e9)
    next_send = clock() + period_ns
    for sequence in range(args["warmup"] + args["samples"]):
        remaining = next_send - clock()
        if remaining > 0:
            time.sleep(remaining / 1e9)
        stamp = clock()
        next_send = stamp + period_ns  # a late wake-up delays the next message, never two back to back
        sends[sequence % count](pack(sequence, stamp) + padding)
    time.sleep(0.05)
    for send in sends:
        send(pack(STOP_SEQUENCE, 0) + padding)


# -- the run ---------------------------------------------------------------------------------


def child(role: str, args: dict) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, __file__, "--role", role, json.dumps(args)], stdout=subprocess.PIPE, text=True
    )


def measure(kind: str, channels: int, settings: dict, prefix: str, idle: bool) -> dict:
    """One receiver (and, for latency, one publisher) process; its result."""
    args = dict(settings, kind=kind, channels=channels, prefix=f"{prefix}_{kind}_{channels}", idle=idle)
    started = [child("receiver", args)]
    try:
        if started[0].stdout.readline().strip() != "ready":
            raise RuntimeError(f"{kind}: the receiver did not start")
        if not idle:
            started.append(child("publisher", args))
            if started[1].wait(timeout=120) != 0:
                raise RuntimeError(f"{kind}: the publisher failed")
        stdout, _ = started[0].communicate(timeout=60)
        if started[0].returncode != 0:
            raise RuntimeError(f"{kind}: the receiver failed")
        return json.loads(stdout.strip().splitlines()[-1])
    finally:
        for process in started:
            if process.poll() is None:
                process.kill()
            process.wait()


def summary(latencies_ns: list, settings: dict) -> dict:
    samples = settings["samples"] // settings["repeats"]
    microseconds = [ns / 1000 for ns in latencies_ns]
    chunks = [microseconds[i : i + samples] for i in range(0, len(microseconds) - samples + 1, samples)]
    medians = [statistics.median(chunk) for chunk in chunks]
    return {
        "median_us": statistics.median(medians),
        "p99_us": statistics.median(sorted(chunk)[round(0.99 * (len(chunk) - 1))] for chunk in chunks),
        "median_us_runs": medians,
        "received": len(microseconds),
        "sent": settings["samples"],
    }


def remove_leftovers(prefix: str) -> None:
    for path in [*pathlib.Path("/dev/shm").glob(f"{prefix}_*"), *pathlib.Path("/tmp").glob(f"{prefix}_*")]:
        path.unlink(missing_ok=True)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="a short smoke run")
    parser.add_argument("--output", type=pathlib.Path, help="JSON results file (default: results/bench_wait.json, "
                        "results/bench_wait_quick.json with --quick)")
    parser.add_argument("--role", choices=["receiver", "publisher"], help=argparse.SUPPRESS)
    parser.add_argument("args", nargs="?", help=argparse.SUPPRESS)
    options = parser.parse_args()
    if options.role:
        {"receiver": receiver, "publisher": publisher}[options.role](json.loads(options.args))
        return 0
    import zmq

    settings = dict(SETTINGS["quick" if options.quick else "full"])
    settings["samples"] -= settings["samples"] % settings["repeats"]
    prefix = f"kmbenchwait_{os.getpid()}_{secrets.token_hex(3)}"
    print(f"{platform.processor() or platform.machine()}, {os.cpu_count()} cores, Python {platform.python_version()}, "
          f"pyzmq {zmq.__version__} / libzmq {zmq.zmq_version()}, load average {os.getloadavg()[0]:.2f}", file=sys.stderr)
    results = {"settings": settings, "latency": [], "idle": []}
    try:
        for row, ours, theirs, channels in LATENCY_ROWS:
            print(f"  {row} ...", file=sys.stderr, flush=True)
            measured = [summary(measure(kind, channels, settings, prefix, False)["latencies_ns"], settings)
                        for kind in (ours, theirs)]
            results["latency"].append({"row": row, "ours": measured[0], "zmq": measured[1]})
        for row, ours, theirs, channels in IDLE_ROWS:
            print(f"  {row} ...", file=sys.stderr, flush=True)
            measured = [measure(kind, channels, settings, prefix, True)["cpu_s"] for kind in (ours, theirs)]
            results["idle"].append({"row": row, "ours_cpu_ms": measured[0] * 1000, "zmq_cpu_ms": measured[1] * 1000})
    finally:
        remove_leftovers(prefix)
    print("\n| benchmark (median; p99) | kickmsg | pyzmq | ratio (median) |\n|---|---|---|---|")
    for entry in results["latency"]:
        ours, zmq_ = entry["ours"], entry["zmq"]
        print(f"| {entry['row']} | {ours['median_us']:.1f} µs; {ours['p99_us']:.0f} µs | "
              f"{zmq_['median_us']:.1f} µs; {zmq_['p99_us']:.0f} µs | {ours['median_us'] / zmq_['median_us']:.2f}× |")
    for entry in results["idle"]:
        print(f"| {entry['row']} ({settings['idle_s']:g} s): CPU time | {entry['ours_cpu_ms']:.1f} ms | "
              f"{entry['zmq_cpu_ms']:.1f} ms | |")
    output = options.output or RESULTS_DIR / f"bench_wait{'_quick' if options.quick else ''}.json"
    output.parent.mkdir(parents=True, exist_ok=True)
    output.write_text(json.dumps(results, indent=2) + "\n")
    print(f"\nresults written to {output}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
