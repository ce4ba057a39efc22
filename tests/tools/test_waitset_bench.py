"""benchmarks/bench_wait.py (part of ``make bench``) runs and reports every
row it documents (its figures are not asserted: tests never assert on time)."""
import json
import pathlib
import re
import subprocess
import sys

from conftest import ROOT


def leftovers() -> list:
    return sorted([*pathlib.Path("/dev/shm").glob("kmbenchwait_*"), *pathlib.Path("/tmp").glob("kmbenchwait_*")])


def test_bench_wait_reports_every_row_and_leaves_nothing_behind(tmp_path):
    before = leftovers()
    output = tmp_path / "bench_wait.json"
    done = subprocess.run(
        [sys.executable, "benchmarks/bench_wait.py", "--quick", "--output", str(output)],
        cwd=ROOT, capture_output=True, text=True, timeout=240,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    rows = re.findall(r"^\| (.+?) \| ([\d.]+) (?:µs|ms)", done.stdout, re.MULTILINE)
    assert [row for row, _ in rows] == [
        "asyncio: await one message, 1 channel",
        "blocking receive, 1 channel (reference)",
        "WaitSet.wait / zmq.Poller.poll, 1 channel",
        "WaitSet.wait / zmq.Poller.poll, 10 channels",
        "WaitSet.wait / zmq.Poller.poll, 100 channels",
        "idle wait, 1 channel (0.5 s): CPU time",
        "idle wait, 10 channels (0.5 s): CPU time",
        "idle wait, 100 channels (0.5 s): CPU time",
        "idle await (asyncio), 1 channel (0.5 s): CPU time",
    ], done.stdout
    results = json.loads(output.read_text())
    for entry in results["latency"]:  # every message reached both receivers
        assert entry["ours"]["received"] == entry["ours"]["sent"], entry
        assert entry["zmq"]["received"] > 0, entry
    assert leftovers() == before
