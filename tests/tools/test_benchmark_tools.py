"""The optimisation tools in benchmarks/ run and report every figure they
document (their timings are not asserted: tests never assert on time)."""
import pathlib
import re
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]


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
    # A send pre-checks the rings with one call per Live ring (and one past the last); more Live rings, more calls.
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
    # Each part but the kernel's is a span of one process's own steps; the
    # woken subscriber may return before the waker's system call does.
    assert all(float(value) >= 0 for label, value in parts.items() if label != "kernel wake-up"), output
    assert float(parts["total"]) > 0, output
    assert leftovers("km_latency_") == before


# -- bench_core / bench_report: issue 17's peers, table and targets ----------------------

sys.path.insert(0, str(ROOT / "benchmarks"))

import bench_core  # noqa: E402
import bench_report  # noqa: E402


def a_run(pingpong_us: dict, fanout: dict, throughput: dict, frames_8mb: dict, inproc_ns: dict,
          parked_us: dict | None = None, parked_pinned_us: dict | None = None) -> dict:
    """A results dictionary as bench_core makes it, with the fields the
    summary and the targets read."""
    return {
        "inproc": {"64": {peer: {"median_ns": ns} for peer, ns in inproc_ns.items()}},
        "pingpong": {"64": {peer: {"median_us": us} for peer, us in pingpong_us.items()}},
        "latency": {"64_block": {peer: {"median_us": us} for peer, us in (parked_us or {}).items()},
                    "64_pinned": {peer: {"median_us": us} for peer, us in (parked_pinned_us or {}).items()}},
        "fanout": {"4": {peer: {"median_msgs_s": rate, "loss_fraction": 0.1} for peer, rate in fanout.items()}},
        "throughput": {"1": {peer: {"median_msgs_s": rate} for peer, rate in throughput.items()}},
        "frames": {str(8 << 20): frames_8mb},
    }


def test_targets_are_judged_on_each_layout_and_say_by_how_much_one_is_missed():
    results = a_run(
        pingpong_us={"ours": 6.0, "ours9": 7.0, "native": 30.0, "mp_pipe": 20.0, "mp_queue": 90.0, "zmq": 80.0,
                     "faster_fifo": 25.0, "iceoryx2": 4.0, "zenoh": 50.0},
        parked_us={"ours": 40.0, "ours9": 60.0, "mp_pipe": 50.0},
        parked_pinned_us={"ours": 70.0, "ours9": 30.0, "mp_pipe": 50.0},
        fanout={"ours": 100e3, "ours9": 90e3, "mp_pipe": 80e3},
        throughput={"ours": 200e3, "ours9": 100e3, "mp_pipe": {"error": "it broke"}},
        frames_8mb={"ours": {"median_fps": 1900, "first_pass_fps": 400},
                    "native": {"median_fps": 2000, "first_pass_fps": 500},
                    "ours9": {"median_fps": 1900, "first_pass_fps": 400},
                    "native9": {"median_fps": 1900, "first_pass_fps": 400}},
        inproc_ns={"ours": 6000.0, "native": 200.0, "ours9": 6000.0, "native9": 300.0},
    )
    results["throughput"]["1"]["mp_pipe"] = {"error": "it broke"}
    results["scaling"] = {"ours": {"16": {"64": {"median_ns": 20000.0}}, "64": {"64": {"median_ns": 32000.0}}}}
    found = {(target["layout"], target["target"].split(" (")[0]): target for target in bench_report.targets(results)}
    verdicts = {key: target["met"] for key, target in found.items()}
    expected_4 = {
        "in-process 64 B send + receive: within 1.5x mp.Pipe's": None,  # mp.Pipe has no in-process cell here
        "in-process 64 B send + receive: within 15x native": False,
        "streaming 4 KB: at least 0.8x mp.Pipe's msgs/s received": None,  # that peer failed: no data, not a verdict
        "fan-out 64 B to 4 processes: at least 0.8x mp.Pipe's msgs/s received": True,
        "one message per ms, receiver parked: within 1.3x mp.Pipe's latency": True,
        "the same, pinned to cores 0 and 1: within 1.3x mp.Pipe's latency": False,  # 1.4x
        "ping-pong one-way 64 B: ahead of mp_pipe": True,
        "ping-pong one-way 64 B: ahead of mp_queue": True,
        "ping-pong one-way 64 B: ahead of zmq": True,
        "ping-pong one-way 64 B: ahead of faster_fifo": True,
        "ping-pong one-way 64 B: ahead of iceoryx2": False,
        "ping-pong one-way 64 B: ahead of zenoh": True,
        "8 MB frames >= 0.9x native": True,
        "8 MB frames, first pass, >= 0.9x native": False,
        "publishing 64 B to 16 idle rings: at most 1 us per ring": False,  # 1.25 us per ring
        "publishing 64 B to 64 idle rings: at most 1 us per ring": True,  # 0.5 us per ring
    }
    assert {name: met for (layout, name), met in verdicts.items() if layout == "4"} == expected_4
    on_9 = {name: met for (layout, name), met in verdicts.items() if layout == "9"}
    assert on_9["one message per ms, receiver parked: within 1.3x mp.Pipe's latency"] is True  # 1.2x
    assert on_9["the same, pinned to cores 0 and 1: within 1.3x mp.Pipe's latency"] is True  # 0.6x
    assert on_9["in-process 64 B send + receive: within 15x native9"] is False  # 20x: against the native that speaks 9
    assert on_9["8 MB frames, first pass, >= 0.9x native9"] is True
    assert not any(name.startswith("publishing") for name in on_9)  # no scaling measured for ours9
    between = {name: (target["value"], target["met"]) for (layout, name), target in found.items() if layout == "9/4"}
    # Layout 9's cost over layout 4's: times 9/4, rates 4/9.
    assert between["layout 9 within 1.2x of layout 4: one-way latency 64 B, blocking receive, one message per ms"] == (1.5, False)
    assert between["layout 9 within 1.2x of layout 4: streaming 4 KB, 1 subscriber process, msgs/s"] == (2.0, False)
    assert between["layout 9 within 1.2x of layout 4: in-process send + receive, 64 B"] == (1.0, True)
    assert found[("4", "in-process 64 B send + receive: within 15x native")]["value"] == 30.0
    assert found[("4", "in-process 64 B send + receive: within 15x native")]["by"] == "100% over"
    assert found[("4", "8 MB frames, first pass, >= 0.9x native")]["by"] == "11% short"
    assert found[("4", "ping-pong one-way 64 B: ahead of iceoryx2")]["by"] == "50% over"
    assert found[("4", "fan-out 64 B to 4 processes: at least 0.8x mp.Pipe's msgs/s received")]["lost"] == 0.1


def test_a_run_of_a_few_peers_judges_only_the_targets_against_them():
    """The pure build's run (``--pure --peers ours,ours9,native,native9,mp_pipe``)
    leaves out the targets against the peers it did not run."""
    results = a_run(pingpong_us={"ours": 6.0, "mp_pipe": 20.0}, fanout={"ours": 100e3, "mp_pipe": 80e3}, throughput={},
                    frames_8mb={}, inproc_ns={"ours": 6000.0, "native": 200.0, "mp_pipe": 3000.0})
    found = {(target["layout"], target["target"].split(" (")[0]): target["met"] for target in bench_report.targets(results)}
    assert found[("4", "in-process 64 B send + receive: within 1.5x mp.Pipe's")] is False  # 2x
    assert found[("4", "ping-pong one-way 64 B: ahead of mp_pipe")] is True
    assert not any("zmq" in name or "iceoryx2" in name for _, name in found)
    assert not any(layout in ("9", "9/4") for layout, _ in found)  # ours9 not run


def test_the_summary_table_shows_ratios_to_ours_and_marks_failed_and_missing_cells():
    results = a_run(
        pingpong_us={"ours": 5.0, "native": 25.0, "zenoh": {"error": "no match"}},
        fanout={"ours": 100e3, "zmq": 1.5e6}, throughput={}, frames_8mb={}, inproc_ns={"ours": 6000.0, "native": 200.0},
    )
    results["pingpong"]["64"]["zenoh"] = {"error": "no match"}
    lines = bench_report.summary_markdown(results, ("ours", "native", "zmq", "zenoh")).splitlines()
    assert lines[0] == "| median (× ours) | ours | native | zmq | zenoh |"
    rows = {line.split(" | ")[0].lstrip("| "): line.strip("| ").split(" | ")[1:] for line in lines[2:]}
    assert rows["in-process send + receive, 64 B"] == ["6.00 µs", "200 ns (0.0333x)", "n/a", "n/a"]
    assert rows["one-way latency 64 B, blocking receive, ping-pong pinned"] == ["5.00 µs", "25.00 µs (5x)", "n/a", "failed"]
    assert rows["fan-out 64 B to 4 subscriber processes, msgs/s received"] == [
        "100.0 k/s, 10.0% lost", "n/a", "1.50 M/s, 10.0% lost (15x)", "n/a"]
    assert "in-process send + receive, 4 KB" not in rows  # not in this run at all


def test_each_layout_has_its_summary_with_its_own_ours_and_native():
    assert bench_report.layout_peers(bench_report.PEERS, 4)[:3] == ["ours", "native", "mp_pipe"]
    nine = bench_report.layout_peers(bench_report.PEERS, 9)
    assert nine[:3] == ["ours9", "native9", "mp_pipe"] and "ours" not in nine and "native" not in nine
    results = a_run(pingpong_us={"ours9": 5.0, "native9": 10.0}, fanout={}, throughput={}, frames_8mb={}, inproc_ns={})
    lines = bench_report.summary_markdown(results, nine).splitlines()
    assert lines[0].startswith("| median (× ours9) | ours9 | native9 |")
    assert any("ping-pong" in line and "| 5.00 µs | 10.00 µs (2x) |" in line for line in lines), lines


def test_every_peer_makes_a_ping_pong_round_trip_between_two_processes(prefix, monkeypatch):
    """Each adapter of benchmarks/peers.py, through bench_core as `make bench`
    runs it: a worker process and its forked partner, 20 trips of 64 B."""
    monkeypatch.setattr(bench_core, "PREFIX", prefix)
    try:
        for peer in bench_report.PEERS:
            measured = bench_core.bench_pingpong(peer, {"size": 64, "warmup": 2, "trips": 20})
            assert measured["trips"] == 20, peer
            assert 0 < measured["median_us"] <= measured["max_us"], peer
            assert measured["ping_cpu_fraction"] > 0 and measured["pong_cpu_fraction"] > 0, peer
            assert measured["cpu_us_per_trip"] > 0, peer
    finally:
        bench_core.stop_workers()
        bench_core.remove_leftovers()
    assert not list(pathlib.Path("/tmp").glob(prefix + "*"))


@pytest.mark.parametrize("mode", ["block", "pinned"])
def test_the_paced_latency_runs_pinned_or_not_and_times_the_cold_send(prefix, monkeypatch, mode):
    """One message per ms, as `make bench` runs it, left to the scheduler
    and pinned: every message arrives, and the publisher's send call is
    timed beside the latency."""
    monkeypatch.setattr(bench_core, "PREFIX", prefix)
    settings = {"period_s": 0.001, "warmup": 5, "samples": 20, "repeats": 1}
    try:
        for peer in ("ours", "ours9", "mp_pipe"):
            measured = bench_core.bench_latency(peer, settings, 64, mode)
            assert measured["samples"] == 20 and measured["lost_by_sequence"] == 0 and measured["wrong_size"] == 0, peer
            assert 0 < measured["median_us"] <= measured["max_us"], peer
            assert 0 < measured["send_median_us"] <= measured["send_p99_us"], peer
    finally:
        bench_core.stop_workers()
        bench_core.remove_leftovers()
    assert not list(pathlib.Path("/tmp").glob(prefix + "*"))


def test_one_failing_peer_is_recorded_and_the_run_goes_on():
    errors: list = []

    def broken(peer: str) -> dict:
        raise RuntimeError(f"{peer}: worker exited with status 1\ntraceback")

    assert bench_core.attempt(errors, "ping-pong, zenoh", broken, "zenoh") == {
        "error": "zenoh: worker exited with status 1"
    }
    assert bench_core.attempt(errors, "ping-pong, ours", lambda peer: {"median_us": 5.0}, "ours") == {"median_us": 5.0}
    assert errors == ["ping-pong, zenoh: zenoh: worker exited with status 1\ntraceback"]


def test_a_shared_memory_file_counts_as_in_use_while_a_process_holds_it(prefix):
    """What keeps the bench from unlinking another program's zenoh files."""
    path = pathlib.Path(f"/dev/shm/{prefix}_held")
    path.write_bytes(b"x")
    holder = subprocess.Popen(
        [sys.executable, "-c", f"import sys; f = open({str(path)!r}, 'rb'); print('open', flush=True); sys.stdin.read()"],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
    )
    try:
        assert holder.stdout.readline() == "open\n"
        assert path in bench_core.shm_files_in_use()
    finally:
        holder.communicate(timeout=10)
    assert path not in bench_core.shm_files_in_use()


def test_record_flush_compares_both_formats_and_leaves_no_region(prefix):
    """benchmarks/record_flush.py: each format recorded flushed and not, every
    message recorded, a ratio per format; its channel is removed."""
    output = run_tool("benchmarks/record_flush.py", "--seconds", "0.3", "--rounds", "1", "--name", f"/{prefix}_flush")
    runs = re.findall(r"^(parquet|mcap) +(flushed|unflushed) +round 0: [\d.]+ s CPU, (\d+) messages$", output, re.MULTILINE)
    assert [(fmt, setting) for fmt, setting, _ in runs] == [
        ("parquet", "flushed"), ("parquet", "unflushed"), ("mcap", "flushed"), ("mcap", "unflushed")], output
    assert all(count == "300" for _, _, count in runs), output
    assert re.findall(r"^  (parquet|mcap) +flushed every 1 s [\d.]+ +never before the end [\d.]+ +ratio [\d.]+$",
                      output, re.MULTILINE) == ["parquet", "mcap"], output
    assert leftovers(prefix) == []
