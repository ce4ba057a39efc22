"""Spin, then park: what a blocking receive's polling budget buys and costs.

    .venv/bin/python benchmarks/spin_park.py [--tree DIR ...] [--spin S ...] [--plain DIR ...] [--json out.json]

For each subscriber setting (this package with each ``--spin`` budget,
default 0 and 100 us, in each ``--tree``; ``Subscriber(region)`` in each
``--plain`` checkout, e.g. one from before the budget existed; and the
native kickmsg 0.1.0),
two processes, each on its own core when the machine has two:

  ping-pong   one-way latency, 64 B: process A sends, B receives (blocking
              ``receive``) and answers on a second channel, A receives the
              answer; half the round trip, median and p99 over 2000 trips
  CPU 1 kHz   CPU time of a subscriber blocked in ``receive`` on a topic
              published at 1 kHz for 3 s, as a share of one core
  CPU idle    the same with nothing published

The native binding has no budget setting (its receive is what it is).
"""
import argparse
import json
import os
import pathlib
import subprocess
import sys

ROOT = pathlib.Path(__file__).resolve().parent.parent
NATIVE_DIR = ROOT / ".native" / "kickmsg-0.1.0"
TRIPS, WARMUP = 2000, 200

# argv: prefix role spin (seconds, or "native"); role "ping" starts "pong" as
# a child, "pub" starts "sub". The child of each pair prints JSON.
WORKER = r"""
import json, os, resource, subprocess, sys, time
import kickmsg
prefix, role, spin, trips, warmup = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4]), int(sys.argv[5])
def subscriber(region):
    return kickmsg.Subscriber(region) if spin in ("native", "plain") else kickmsg.Subscriber(region, spin=float(spin))
def pin(core):
    if os.cpu_count() >= 2:
        os.sched_setaffinity(0, {core})
def child(role):
    return subprocess.Popen(sys.orig_argv[:-5] + [prefix, role, spin, str(trips), str(warmup)], stdout=subprocess.PIPE, text=True)
cfg = kickmsg.Config()
cfg.max_subscribers = 2
if role == "ping":
    pin(0)
    there = kickmsg.SharedRegion.create(prefix + "_there", kickmsg.ChannelType.PubSub, cfg, "spin")
    back = kickmsg.SharedRegion.create(prefix + "_back", kickmsg.ChannelType.PubSub, cfg, "spin")
    try:
        inbox = subscriber(back)
        pong = child("pong")
        assert pong.stdout.readline() == "ready\n"
        out = kickmsg.Publisher(there)
        message, trips_ns = bytes(64), []
        for trip in range(warmup + trips):
            began = time.perf_counter_ns()
            out.send(message)
            assert inbox.receive(timeout=5.0) is not None, "no answer"
            trips_ns.append(time.perf_counter_ns() - began)
        out.send(b"")
        pong.wait(timeout=10)
        one_way = sorted(ns / 2 for ns in trips_ns[warmup:])
        print(json.dumps({"median_us": one_way[len(one_way) // 2] / 1e3, "p99_us": one_way[int(len(one_way) * 0.99)] / 1e3}))
    finally:
        kickmsg.unlink_shm(prefix + "_there"); kickmsg.unlink_shm(prefix + "_back")
elif role == "pong":
    pin(1)
    inbox = subscriber(kickmsg.SharedRegion.open(prefix + "_there"))
    out = kickmsg.Publisher(kickmsg.SharedRegion.open(prefix + "_back"))
    print("ready", flush=True)
    while (message := inbox.receive(timeout=5.0)):
        out.send(message)
elif role.startswith("pub"):
    rate = float(role[3:])  # messages per second; 0: none
    region = kickmsg.SharedRegion.create(prefix + "_topic", kickmsg.ChannelType.PubSub, cfg, "spin")
    try:
        sub = child("sub")
        assert sub.stdout.readline() == "ready\n"
        out, began = kickmsg.Publisher(region), time.monotonic()
        sent = 0
        while time.monotonic() - began < 3.0:
            if rate:
                out.send(b"tick")
                sent += 1
                time.sleep(max(0.0, began + sent / rate - time.monotonic()))
            else:
                time.sleep(0.1)
        out.send(b"")
        print(sub.stdout.readline(), end="")
        sub.wait(timeout=10)
    finally:
        kickmsg.unlink_shm(prefix + "_topic")
else:  # sub
    inbox = subscriber(kickmsg.SharedRegion.open(prefix + "_topic"))
    print("ready", flush=True)
    began, usage = time.monotonic(), resource.getrusage(resource.RUSAGE_SELF)
    while (message := inbox.receive(timeout=10.0)):
        pass
    spent = resource.getrusage(resource.RUSAGE_SELF)
    cpu = spent.ru_utime + spent.ru_stime - usage.ru_utime - usage.ru_stime
    print(json.dumps({"cpu_share": cpu / (time.monotonic() - began)}), flush=True)
"""


def run(spin: str, tree: pathlib.Path, role: str) -> dict:
    prefix = f"/kmbench_spin_{os.getpid()}"
    path, flags = (NATIVE_DIR, ["-S"]) if spin == "native" else (tree, [])  # native: only the binding on its path
    command = [sys.executable, *flags, "-c", f"import sys; sys.path.insert(0, {str(path)!r})\n" + WORKER]
    done = subprocess.run(command + [prefix, role, spin, str(TRIPS), str(WARMUP)], capture_output=True, text=True, timeout=120)
    if done.returncode:
        raise RuntimeError(f"{spin} {role} failed: {done.stderr}")
    return json.loads(done.stdout)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tree", action="append", type=pathlib.Path, help="a checkout of this package (repeatable)")
    parser.add_argument("--spin", action="append", type=float, help="budgets in seconds (repeatable; default 0 and 0.0001)")
    parser.add_argument("--plain", action="append", type=pathlib.Path, default=[], help="a checkout to run with Subscriber(region)")
    parser.add_argument("--json", metavar="FILE")
    args = parser.parse_args()
    if not (NATIVE_DIR / "kickmsg.abi3.so").exists():
        print(f"native kickmsg 0.1.0 not found in {NATIVE_DIR}: run `make bench`", file=sys.stderr)
        return 2
    trees = [tree.resolve() for tree in args.tree or [ROOT]]
    settings = [(f"{tree.name} spin={spin * 1e6:g}us", str(spin), tree) for tree in trees for spin in args.spin or [0.0, 0.0001]]
    settings += [(f"{tree.resolve().name} Subscriber(region)", "plain", tree.resolve()) for tree in args.plain]
    settings.append(("native", "native", ROOT))
    results = {}
    print(f"{'subscriber':<36}{'one-way median':>16}{'p99':>10}{'CPU 1 kHz':>11}{'CPU idle':>10}")
    for label, spin, tree in settings:
        row = run(spin, tree, "ping") | {
            "cpu_1khz": run(spin, tree, "pub1000")["cpu_share"], "cpu_idle": run(spin, tree, "pub0")["cpu_share"]
        }
        results[label] = row
        print(f"{label:<36}{row['median_us']:>13.1f} us{row['p99_us']:>7.1f} us{row['cpu_1khz']:>10.2%}{row['cpu_idle']:>10.2%}")
    if args.json:
        pathlib.Path(args.json).write_text(json.dumps(results, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
