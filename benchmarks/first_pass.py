"""The first pass over a large-frame pool, against later passes and native.

A page of shared memory costs a page fault the first time a process touches
it. This measures, for 8 MB frames (pool 8, ring 4), one publisher process
and one subscriber process in lockstep (each frame received before the next
is sent):

  send      the publisher's ``send`` (copying the frame into its slot)
  receive   the subscriber's ``receive`` (copying it out)

for the first ``pool_size`` frames (slots never used before: the first
pass) and for the frames after three passes (warm), as medians in ms, for

  ours      this package (or each ``--tree``: a checkout with its shim built)
  native    the native kickmsg 0.1.0 (its own processes, -S: only the binding)

    .venv/bin/python benchmarks/first_pass.py [--frames 64] [--tree DIR ...] [--json out.json]
"""
import argparse
import json
import os
import pathlib
import statistics
import subprocess
import sys

ROOT = pathlib.Path(__file__).resolve().parent.parent
NATIVE_DIR = ROOT / ".native" / "kickmsg-0.1.0"
FRAME = 8 * 1024 * 1024
POOL, RING = 8, 4

# The publisher: creates the region, starts the subscriber (the same code,
# argv[2] == "sub"), sends frames one at a time, each after the subscriber's
# go-ahead; prints {"send": [...], "receive": [...]} in seconds per frame.
WORKER = r"""
import json, subprocess, sys, time
import kickmsg
name, role, frames = sys.argv[1], sys.argv[2], int(sys.argv[3])
FRAME, POOL, RING = %d, %d, %d
if role == "sub":
    region = kickmsg.SharedRegion.open(name)
    subscriber = kickmsg.Subscriber(region)
    print("ready", flush=True)
    took = []
    for _ in range(frames):
        began = time.perf_counter()
        data = subscriber.receive(timeout=10.0)
        took.append(time.perf_counter() - began)
        assert data is not None and len(data) == FRAME, "a frame did not arrive"
        print("next", flush=True)
    print(json.dumps(took), flush=True)
    sys.exit(0)
cfg = kickmsg.Config()
cfg.max_subscribers, cfg.sub_ring_capacity, cfg.pool_size, cfg.max_payload_size = 1, RING, POOL, FRAME
region = kickmsg.SharedRegion.create(name, kickmsg.ChannelType.PubSub, cfg, "first-pass")
try:
    child = subprocess.Popen(sys.orig_argv[:-3] + [name, "sub", str(frames)], stdout=subprocess.PIPE, text=True)
    assert child.stdout.readline() == "ready\n"
    publisher = kickmsg.Publisher(region)
    frame = bytes(range(256)) * (FRAME // 256)
    took = []
    for _ in range(frames):
        began = time.perf_counter()
        publisher.send(frame)
        took.append(time.perf_counter() - began)
        assert child.stdout.readline() == "next\n"
    received = json.loads(child.stdout.readline())
    child.wait(timeout=10)
    print(json.dumps({"send": took, "receive": received}))
finally:
    kickmsg.unlink_shm(name)
""" % (FRAME, POOL, RING)


def run(peer: str, tree: pathlib.Path, frames: int) -> dict:
    """One lockstep run; medians in ms of the first pass and of warm frames."""
    name = f"/kmbench_first_{os.getpid()}_{peer.replace('/', '_')}"
    if peer == "native":
        command = [sys.executable, "-S", "-c", f"import sys; sys.path.insert(0, {str(NATIVE_DIR)!r})\n" + WORKER]
    else:
        command = [sys.executable, "-c", f"import sys; sys.path.insert(0, {str(tree)!r})\n" + WORKER]
    done = subprocess.run(command + [name, "pub", str(frames)], capture_output=True, text=True, timeout=300, cwd=ROOT)
    if done.returncode:
        raise RuntimeError(f"{peer} failed: {done.stderr}")
    times = json.loads(done.stdout)
    return {
        f"{side} {which}": round(statistics.median(times[side][span]) * 1e3, 3)
        for side in ("send", "receive")
        for which, span in (("first pass", slice(0, POOL)), ("warm", slice(3 * POOL, None)))
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--frames", type=int, default=64)
    parser.add_argument("--tree", action="append", type=pathlib.Path, help="a checkout of this package (repeatable)")
    parser.add_argument("--json", metavar="FILE")
    args = parser.parse_args()
    if args.frames < 4 * POOL:
        parser.error(f"--frames {args.frames}: need at least {4 * POOL} (a first pass and warm frames)")
    if not (NATIVE_DIR / "kickmsg.abi3.so").exists():
        print(f"native kickmsg 0.1.0 not found in {NATIVE_DIR}: run `make bench`", file=sys.stderr)
        return 2
    trees = [tree.resolve() for tree in args.tree or [ROOT]]
    peers = {f"ours {tree}" if len(trees) > 1 else "ours": tree for tree in trees} | {"native": ROOT}
    results = {peer: run(peer, tree, args.frames) for peer, tree in peers.items()}
    print(f"8 MB frames, pool {POOL}, ring {RING}, lockstep, {args.frames} frames; median ms per frame, {os.cpu_count()} CPUs")
    columns = list(next(iter(results.values())))
    print(f"{'':<34}" + "".join(f"{column:>20}" for column in columns))
    for peer, row in results.items():
        ratio = "" if peer == "native" else "   (ours/native: " + ", ".join(
            f"{row[column] / results['native'][column]:.2f}x" for column in columns) + ")"
        print(f"{peer:<34}" + "".join(f"{row[column]:>20.3f}" for column in columns) + ratio)
    if args.json:
        pathlib.Path(args.json).write_text(json.dumps(results, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
