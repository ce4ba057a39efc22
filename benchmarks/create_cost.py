"""What reserving a region's memory at create costs (issue 14, item 1).

``SharedRegion.create`` reserves every page of a new region
(``posix_fallocate``) so that a region the machine cannot back fails at once
with a clear error, not later with SIGBUS or the OOM killer. This measures,
in one run, the median time of ``create`` + ``unlink`` of a new region:

  ours          this package as it is (the reservation included)
  ours-sparse   this package with the reservation replaced by a plain
                ftruncate, as before (a sparse object)
  native        the native kickmsg 0.1.0 (its own process, -S: only the
                binding on its path), which zero-fills every byte at create

for the default config (1 MiB) and a 64 MiB one; and the same followed by
one write into every page of the pool (the first pass a publisher makes), so
that the time the reservation moves from first touch to create shows.

    .venv/bin/python benchmarks/create_cost.py [--repeats 30] [--json out.json]
"""
import argparse
import json
import os
import pathlib
import subprocess
import sys

ROOT = pathlib.Path(__file__).resolve().parent.parent
NATIVE_DIR = ROOT / ".native" / "kickmsg-0.1.0"
CONFIGS = {
    "default (1.0 MiB)": {},
    "64 MiB": {"pool_size": 16384, "max_payload_size": 4088},
}

# Runs in the measuring process (ours) or in a child (native): prints the
# median seconds of create (+ touch) + unlink, as JSON.
MEASURE = r"""
import json, mmap, os, statistics, sys, time
import kickmsg
config, repeats, touch, sparse = json.loads(sys.argv[1])
if sparse:  # the create of before: a sparse object, pages allocated on first touch
    os.posix_fallocate = lambda fd, offset, size: os.ftruncate(fd, offset + size)
name = f"/kmbench_create_{os.getpid()}"
cfg = kickmsg.Config()
for field, value in config.items():
    setattr(cfg, field, value)
times = []
for _ in range(repeats):
    began = time.perf_counter()
    region = kickmsg.SharedRegion.create(name, kickmsg.ChannelType.PubSub, cfg, "bench")
    if touch:  # one byte into every page of the object, as a first pass of publishing would
        with open("/dev/shm" + name, "r+b") as file, mmap.mmap(file.fileno(), 0) as memory:
            for offset in range(0, len(memory), mmap.PAGESIZE):
                memory[offset] = 1
    del region
    kickmsg.unlink_shm(name)
    times.append(time.perf_counter() - began)
print(json.dumps(statistics.median(times)))
"""


def measure(peer: str, config: dict, repeats: int, touch: bool) -> float:
    """Median seconds of one create (+ touch) + unlink for a peer."""
    arguments = json.dumps([config, repeats, touch, peer == "ours-sparse"])
    if peer == "native":
        command = [sys.executable, "-S", "-c", f"import sys; sys.path.insert(0, {str(NATIVE_DIR)!r})\n" + MEASURE]
    else:
        command = [sys.executable, "-c", MEASURE]
    done = subprocess.run(command + [arguments], capture_output=True, text=True, timeout=600, cwd=ROOT)
    if done.returncode:
        raise RuntimeError(f"{peer} failed: {done.stderr}")
    return json.loads(done.stdout)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=30)
    parser.add_argument("--json", metavar="FILE")
    args = parser.parse_args()
    if not (NATIVE_DIR / "kickmsg.abi3.so").exists():
        print(f"native kickmsg 0.1.0 not found in {NATIVE_DIR}: run `make bench`", file=sys.stderr)
        return 2
    peers = ("ours", "ours-sparse", "native")
    results = {}
    print(f"median of {args.repeats} runs each, {os.cpu_count()} CPUs")
    print(f"{'region':<20} {'what':<24}" + "".join(f"{peer:>14}" for peer in peers) + f"{'ours/native':>13}")
    for label, config in CONFIGS.items():
        for touch in (False, True):
            what = "create + touch + unlink" if touch else "create + unlink"
            row = {peer: measure(peer, config, args.repeats, touch) for peer in peers}
            results[f"{label}, {what}"] = row
            cells = "".join(f"{row[peer] * 1e3:>11.3f} ms" for peer in peers)
            print(f"{label:<20} {what:<24}{cells}{row['ours'] / row['native']:>12.2f}x")
    if args.json:
        pathlib.Path(args.json).write_text(json.dumps(results, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
