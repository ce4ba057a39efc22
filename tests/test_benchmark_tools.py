"""The optimisation tools in benchmarks/ run and report every figure they
document (their timings are not asserted: tests never assert on time)."""
import pathlib
import re
import subprocess
import sys

ROOT = pathlib.Path(__file__).resolve().parent.parent


def run_tool(*arguments: str) -> str:
    done = subprocess.run(
        [sys.executable, *arguments], cwd=ROOT, capture_output=True, text=True, timeout=180
    )
    assert done.returncode == 0, done.stderr
    return done.stdout


def leftovers(prefix: str) -> list:
    return sorted(pathlib.Path("/dev/shm").glob(prefix + "*"))


def test_hotpath_times_every_operation_it_documents_and_leaves_no_region():
    before = leftovers("km_hotpath_")
    output = run_tool("benchmarks/hotpath.py", "--rounds", "1", "--repeats", "1")
    rows = re.findall(r"^  (\S.*?) {2,}(-?\d+)(?: \[ *(\d+\.\d)\])?$", output, re.MULTILINE)
    figures = {name: int(ns) for name, ns, _ in rows}
    calls = {name: float(count) for name, _, count in rows if count}  # shim calls per operation
    flows = [
        "pair 64 B", "pair view 64 B", "pair alloc 64 B", "send, 1 of 16", "send, 1 rings", "send, 4 rings",
        "send, 16 rings", "send after sleep", "pop + push",
    ]
    expected = flows + ["shim: load_relaxed_u32", "shim: store_relaxed_u32", "shim: cas_acq_rel_u64", "builtin abs()"]
    assert sorted(figures) == sorted(expected), output
    assert all(figures[name] > 0 for name in flows), output
    assert sorted(calls) == sorted(flows), output
    # A send into one of 16 rings pre-checks all 16; more Live rings, more calls.
    assert calls["send, 1 of 16"] > 16 and calls["send, 1 rings"] < calls["send, 4 rings"] < calls["send, 16 rings"]
    only = run_tool("benchmarks/hotpath.py", "--rounds", "1", "--repeats", "1", "--only", "pop")
    assert re.findall(r"^  (\S.*?) {2,}-?\d+", only, re.MULTILINE) == ["pop + push"], only
    assert leftovers("km_hotpath_") == before


def test_latency_breakdown_splits_each_wake_up_and_leaves_no_region():
    before = leftovers("km_latency_")
    output = run_tool("benchmarks/latency_breakdown.py", "--messages", "40")
    woke = re.search(r"^(\d+) of 40 messages \(64 B\) woke a sleeping subscriber", output, re.MULTILINE)
    assert woke and int(woke.group(1)) > 0, output
    parts = dict(re.findall(r"^  (\S.*?)\s+(-?\d+\.\d)$", output, re.MULTILINE))
    assert list(parts) == ["to wake call", "wake call", "kernel wake-up", "to message", "total"], output
    assert all(float(value) > 0 for value in parts.values()), output
    assert leftovers("km_latency_") == before
