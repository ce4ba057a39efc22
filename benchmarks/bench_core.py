"""Benchmark suite: this package against the native kickmsg 0.1.0 binding,
multiprocessing.Pipe, multiprocessing.Queue and pyzmq, in one run on one
machine.

Peers (benchmarks/peers.py): ``ours`` (this package), ``native`` (kickmsg
0.1.0 from .native/kickmsg-0.1.0, run with ``python -S`` so only the binding
is importable), ``mp_pipe`` (multiprocessing.Pipe(duplex=False), one per
subscriber), ``mp_queue`` (multiprocessing.Queue, one per subscriber) and
``zmq`` (pyzmq XPUB -> SUB over ipc://). Every measurement runs in a fresh
worker process tree of one peer (benchmarks/core_worker.py), one at a time.

Benchmarks (exactly what is timed: see core_worker.py):

  1. in-process send + receive, 64 B and 4 KB: one process sends a message
     and receives it (kickmsg: send + try_receive; the others: their blocking
     receive, as their delivery is asynchronous). ns per pair: median over
     repeats of the mean; p99 over 16-pair batches.
  2. cross-process one-way latency, 64 B and 64 KB, with a blocking receive
     and with a spinning one (non-blocking receive in a loop): one message
     per millisecond carrying its monotonic_ns send stamp. Median and p99 of
     each repeat (a block of consecutive messages), medians over repeats.
  3. fan-out throughput, 64 B messages, one publisher to 1 and to 4
     subscriber processes, as fast as the publisher can: messages received
     per second, summed over the subscribers (median over rounds; the worst
     round too), with the fraction lost (kickmsg rings and 0MQ PUB drop when a
     subscriber lags; the pipes and queues block the publisher). Queue
     maxsize and 0MQ high-water marks are 1000.
  4. large frames, 1 MB and 8 MB, one publisher to one subscriber process, as
     fast as possible: each frame produced by copying a prepared image into
     the buffer that is sent (kickmsg: the allocated slot, published in
     place) and received as a numpy array (kickmsg: a view over the slot).
     Frames/s and GB/s received (median over rounds), p99 of the time between
     frames. kickmsg: pool 8, ring 4; Queue maxsize and 0MQ HWM 4.
  5. resident memory added by ``import kickmsg`` and opening a channel
     (default Config, a Publisher, a Subscriber, one message), in a fresh
     process, ours and native (benchmarks/rss_probe.py).
  6. scaling, ours and native: the cost of one ``send`` with 1, 4, 16, 64
     subscriber rings (none reading: every ring has wrapped) and 64 B, 1 KB,
     16 KB, 256 KB payloads, printed as a markdown table for the README.

Then the targets of issue 8, as ratios from this run, met or missed. Results
go to benchmarks/results/bench.json and a chart to benchmarks/results/bench.png
(bench_quick.json and bench_quick.png for --quick). The machine (CPU model,
cores, Python, kernel) and how busy it was are printed with the results:
other work on the machine skews every number, latency tails most.

Run (from the repository root; ``make bench`` installs what is needed):
    .venv/bin/python benchmarks/bench_core.py           # full, 3-4 minutes on 2 cores
    .venv/bin/python benchmarks/bench_core.py --quick   # smoke run, under a minute
"""
import argparse
import json
import os
import pathlib
import platform
import secrets
import signal
import statistics
import subprocess
import sys
import sysconfig
import time

HERE = pathlib.Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(HERE))

import bench_report  # noqa: E402

WORKER = HERE / "core_worker.py"
RSS_PROBE = HERE / "rss_probe.py"
NATIVE_DIR = ROOT / ".native" / "kickmsg-0.1.0"
SITE_DIR = sysconfig.get_paths()["purelib"]  # numpy for the native worker (which runs with -S)
RESULTS_DIR = HERE / "results"
PREFIX = f"kmbench_{os.getpid()}_{secrets.token_hex(3)}"
PEERS = ("ours", "native", "mp_pipe", "mp_queue", "zmq")
KICKMSG_PEERS = ("ours", "native")
MB = 1 << 20

SETTINGS = {
    "full": {
        "inproc": {"sizes": [64, 4096], "repeats": 5, "warmup_s": 0.2, "repeat_s": 0.3, "batch": 16},
        "latency": {"sizes": [64, 65536], "period_s": 0.001, "warmup": 200, "samples": 800, "repeats": 5},
        "fanout": {"subscribers": [1, 4], "size": 64, "duration_s": 1.0, "warmup_s": 0.3, "repeats": 3},
        "frames": {"sizes": [1 * MB, 8 * MB], "duration_s": 0.6, "warmup_s": 0.3, "repeats": 3},
        "scaling": {
            "rings": [1, 4, 16, 64], "sizes": [64, 1024, 16384, 262144],
            "repeats": 5, "warmup_s": 0.05, "repeat_s": 0.1, "batch": 8,
        },
    },
    "quick": {
        "inproc": {"sizes": [64, 4096], "repeats": 3, "warmup_s": 0.03, "repeat_s": 0.05, "batch": 16},
        "latency": {"sizes": [64, 65536], "period_s": 0.001, "warmup": 20, "samples": 100, "repeats": 3},
        "fanout": {"subscribers": [1, 4], "size": 64, "duration_s": 0.2, "warmup_s": 0.1, "repeats": 2},
        "frames": {"sizes": [1 * MB, 8 * MB], "duration_s": 0.2, "warmup_s": 0.1, "repeats": 2},
        "scaling": {
            "rings": [1, 4, 16, 64], "sizes": [64, 1024, 16384, 262144],
            "repeats": 3, "warmup_s": 0.01, "repeat_s": 0.02, "batch": 8,
        },
    },
}
STREAM_IDLE_S = 0.25  # fan-out and frames: a subscriber that got data ends a round after this long without
QUEUE_DEPTH = 1000  # mp.Queue maxsize and 0MQ high-water marks (0MQ's default) for latency and fan-out
FRAME_DEPTH = 4  # the same for frames, like the kickmsg ring of 4

_workers: list[subprocess.Popen] = []  # started here; killed (with their process group) on failure


# -- running workers -------------------------------------------------------------


def worker_command(script: pathlib.Path, peer: str, *args: str) -> list[str]:
    if peer == "native":
        return [sys.executable, "-S", str(script), peer, str(NATIVE_DIR), SITE_DIR, *args]
    return [sys.executable, str(script), peer, "-", "-", *args]


def run_worker(peer: str, mode: str, args: dict, timeout_s: float) -> dict:
    """Run one worker (its own session, so its process group can be killed
    with everything it forked) and return its JSON result."""
    if peer in KICKMSG_PEERS:
        args = dict(args, shm_name=f"/{PREFIX}_{mode}_{peer}")
    args = dict(args, socket_path=f"/tmp/{PREFIX}_{mode}.ipc", idle_s=args.get("idle_s", 1.0))
    command = worker_command(WORKER, peer, mode, json.dumps(args))
    return run_command(command, f"{mode} ({peer})", timeout_s)


def run_command(command: list[str], what: str, timeout_s: float) -> dict:
    process = subprocess.Popen(
        command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=ROOT, start_new_session=True
    )
    _workers.append(process)
    try:
        stdout, stderr = process.communicate(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        kill_worker(process)
        stdout, stderr = process.communicate()
        raise RuntimeError(f"{what}: no result within {timeout_s:.0f} s\n{stderr[-3000:]}") from None
    finally:
        kill_worker(process)  # its forked subscribers too, should any be left
    if process.returncode != 0 or not stdout.strip():
        raise RuntimeError(f"{what}: worker exited with status {process.returncode}\n{stderr[-3000:]}")
    return json.loads(stdout.strip().splitlines()[-1])


def kill_worker(process: subprocess.Popen) -> None:
    try:
        os.killpg(process.pid, signal.SIGKILL)  # the group of this worker only (start_new_session)
    except (ProcessLookupError, PermissionError):
        pass
    if process.poll() is None:
        process.wait()


def stop_workers() -> None:
    for process in _workers:
        kill_worker(process)


def remove_leftovers() -> None:
    """Unlink every shared-memory object (and owners sidecar) and ipc socket
    file this run may have left behind."""
    for path in list(pathlib.Path("/dev/shm").glob(f"{PREFIX}_*")) + list(pathlib.Path("/tmp").glob(f"{PREFIX}_*")):
        path.unlink(missing_ok=True)


# -- statistics ------------------------------------------------------------------


def percentile(values: list, fraction: float):
    """Nearest-rank percentile."""
    ordered = sorted(values)
    rank = max(1, round(fraction * len(ordered)))
    return ordered[min(rank, len(ordered)) - 1]


def batch_stats(batch_ns_runs: list, batch: int) -> dict:
    """Per repeat: mean ns per operation, p99 of the batches' ns per operation."""
    means = [sum(run) / (len(run) * batch) for run in batch_ns_runs]
    p99s = [percentile(run, 0.99) / batch for run in batch_ns_runs]
    return {
        "median_ns": statistics.median(means),
        "p99_ns": statistics.median(p99s),
        "mean_ns_runs": means,
        "p99_ns_runs": p99s,
        "operations_per_repeat": len(batch_ns_runs[0]) * batch,
    }


# -- the benchmarks ------------------------------------------------------------------


def bench_inproc(peer: str, settings: dict) -> dict:
    budget = 120 + 4 * len(settings["sizes"]) * (settings["warmup_s"] + settings["repeats"] * settings["repeat_s"])
    raw = run_worker(peer, "inproc", dict(settings, depth=QUEUE_DEPTH), budget)
    return {size: batch_stats(measured["batch_ns_runs"], measured["batch"]) for size, measured in raw["inproc"].items()}


def bench_latency(peer: str, settings: dict, size: int, spin: bool) -> dict:
    samples, repeats = settings["samples"], settings["repeats"]
    count = settings["warmup"] + samples * repeats
    args = {
        "size": size, "spin": spin, "period_s": settings["period_s"], "warmup": settings["warmup"],
        "samples": samples * repeats, "depth": QUEUE_DEPTH, "config": {"max_payload_size": max(4096, size)},
    }
    raw = run_worker(peer, "latency", args, 90 + 3 * count * settings["period_s"])
    measured = raw["latency"]
    latencies_us = [ns / 1000 for ns in measured["latencies_ns"]]
    if len(latencies_us) < samples:
        raise RuntimeError(f"latency ({peer}): only {len(latencies_us)} of {samples * repeats} samples received")
    chunks = [latencies_us[i * samples : (i + 1) * samples] for i in range(len(latencies_us) // samples)]
    medians = [statistics.median(chunk) for chunk in chunks]
    p99s = [percentile(chunk, 0.99) for chunk in chunks]
    return {
        "median_us": statistics.median(medians),
        "p99_us": statistics.median(p99s),
        "median_us_runs": medians,
        "p99_us_runs": p99s,
        "pooled_p99_us": percentile(latencies_us, 0.99),
        "max_us": max(latencies_us),
        "samples": len(latencies_us),
        "waited_fraction": measured["waited"] / len(latencies_us),
        "lost_by_sequence": measured["lost_by_sequence"],
        "timeouts": measured["timeouts"],
        "wrong_size": measured["bad_size"],
    }


def round_rate(round_: dict, subscriber: dict) -> float:
    """Messages per second one subscriber received in a round, from the
    publisher's start to the subscriber's last clock note."""
    elapsed_ns = subscriber["mark_ns"] - round_["start_ns"]
    return subscriber["mark_count"] * 1e9 / elapsed_ns if elapsed_ns > 0 else 0.0


def bench_fanout(peer: str, settings: dict, subscribers: int) -> dict:
    args = {
        "subscribers": subscribers, "size": settings["size"], "duration_s": settings["duration_s"],
        "warmup_s": settings["warmup_s"], "repeats": settings["repeats"], "depth": QUEUE_DEPTH,
        "idle_s": STREAM_IDLE_S, "config": {},
    }
    rounds_total = settings["warmup_s"] + settings["repeats"] * settings["duration_s"]
    raw = run_worker(peer, "fanout", args, 120 + 6 * rounds_total)["fanout"]
    totals, published, losses = [], [], []
    for round_ in raw["rounds"]:
        received = round_["subscribers"]
        totals.append(sum(round_rate(round_, subscriber) for subscriber in received))
        published.append(round_["sent"] * 1e9 / round_["publisher_ns"])
        losses.append(1 - sum(subscriber["count"] for subscriber in received) / (round_["sent"] * subscribers))
    return {
        "median_msgs_s": statistics.median(totals),
        "worst_msgs_s": min(totals),
        "best_msgs_s": max(totals),
        "per_subscriber_msgs_s": statistics.median(totals) / subscribers,
        "published_msgs_s": statistics.median(published),
        "loss_fraction": statistics.median(losses),
        "msgs_s_runs": totals,
        "lossy": raw["lossy"],
    }


def bench_frames(peer: str, settings: dict, size: int) -> dict:
    config = {"max_payload_size": size, "pool_size": 8, "sub_ring_capacity": 4, "max_subscribers": 4}
    args = {
        "size": size, "duration_s": settings["duration_s"], "warmup_s": settings["warmup_s"],
        "repeats": settings["repeats"], "depth": FRAME_DEPTH, "idle_s": STREAM_IDLE_S, "config": config,
    }
    rounds_total = settings["warmup_s"] + settings["repeats"] * settings["duration_s"]
    raw = run_worker(peer, "frames", args, 120 + 6 * rounds_total)["frames"]
    rates, p99s, losses = [], [], []
    for round_ in raw["rounds"]:
        (received,) = round_["subscribers"]
        rates.append(round_rate(round_, received))
        stamps = [round_["start_ns"]] + received["frame_ns"]
        intervals_ms = [(after - before) / 1e6 for before, after in zip(stamps, stamps[1:])]
        p99s.append(percentile(intervals_ms, 0.99) if intervals_ms else float("nan"))
        losses.append(1 - received["count"] / round_["sent"])
    fps = statistics.median(rates)
    return {
        "median_fps": fps,
        "gb_s": fps * size / 1e9,
        "worst_fps": min(rates),
        "p99_interval_ms": statistics.median(p99s),
        "loss_fraction": statistics.median(losses),
        "fps_runs": rates,
        "allocate_retries": raw["allocate_retries"],
    }


def bench_scaling(peer: str, settings: dict) -> dict:
    config = {"sub_ring_capacity": 64, "pool_size": 128, "max_payload_size": max(settings["sizes"])}
    points = len(settings["rings"]) * len(settings["sizes"])
    budget = 180 + 6 * points * (settings["warmup_s"] + settings["repeats"] * settings["repeat_s"])
    raw = run_worker(peer, "scaling", dict(settings, config=config), budget)["scaling"]
    return {
        rings: {size: batch_stats(measured["batch_ns_runs"], measured["batch"]) for size, measured in by_size.items()}
        for rings, by_size in raw.items()
    }


def bench_rss(peer: str) -> dict:
    command = worker_command(RSS_PROBE, peer, f"/{PREFIX}_rss_{peer}")
    raw = run_command(command, f"rss ({peer})", 60)
    start, imported, opened = raw["start_kb"], raw["imported_kb"], raw["opened_kb"]
    return {
        "import_mb": (imported["VmRSS"] - start["VmRSS"]) / 1024,
        "open_mb": (opened["VmRSS"] - imported["VmRSS"]) / 1024,
        "total_mb": (opened["VmRSS"] - start["VmRSS"]) / 1024,
        "parts_mb": {
            key: (opened[key] - start[key]) / 1024 for key in ("RssAnon", "RssFile", "RssShmem") if key in opened
        },
        "numpy_imported": raw["numpy_imported"],
        "modules_after_import": raw["modules_after_import"],
        "raw_kb": raw,
    }


def attempt(errors: list, what: str, function, *args):
    """Run one measurement; a failure is recorded and the suite goes on."""
    print(f"  {what} ...", file=sys.stderr, flush=True)
    try:
        return function(*args)
    except RuntimeError as error:
        errors.append(f"{what}: {error}")
        print(f"  FAILED {what}: {str(error).splitlines()[0]}", file=sys.stderr, flush=True)
        return None


def run_all(settings: dict, errors: list) -> dict:
    results = {"inproc": {}, "latency": {}, "fanout": {}, "frames": {}, "rss": {}, "scaling": {}}
    print("1/6 in-process send + receive", file=sys.stderr)
    for peer in PEERS:
        measured = attempt(errors, f"in-process, {peer}", bench_inproc, peer, settings["inproc"])
        for size in settings["inproc"]["sizes"]:
            results["inproc"].setdefault(str(size), {})[peer] = measured and measured[str(size)]
    print("2/6 cross-process one-way latency", file=sys.stderr)
    for spin in (False, True):
        for size in settings["latency"]["sizes"]:
            key = f"{size}_{'spin' if spin else 'block'}"
            for peer in PEERS:
                results["latency"].setdefault(key, {})[peer] = attempt(
                    errors, f"latency {key}, {peer}", bench_latency, peer, settings["latency"], size, spin
                )
    print("3/6 fan-out throughput", file=sys.stderr)
    for subscribers in settings["fanout"]["subscribers"]:
        for peer in PEERS:
            results["fanout"].setdefault(str(subscribers), {})[peer] = attempt(
                errors, f"fan-out to {subscribers}, {peer}", bench_fanout, peer, settings["fanout"], subscribers
            )
    print("4/6 large frames", file=sys.stderr)
    for size in settings["frames"]["sizes"]:
        for peer in PEERS:
            results["frames"].setdefault(str(size), {})[peer] = attempt(
                errors, f"frames {size // MB} MB, {peer}", bench_frames, peer, settings["frames"], size
            )
    print("5/6 resident memory", file=sys.stderr)
    for peer in KICKMSG_PEERS:
        results["rss"][peer] = attempt(errors, f"rss, {peer}", bench_rss, peer)
    print("6/6 publish scaling", file=sys.stderr)
    for peer in KICKMSG_PEERS:
        results["scaling"][peer] = attempt(errors, f"scaling, {peer}", bench_scaling, peer, settings["scaling"])
    return results


# -- machine -------------------------------------------------------------------------


def machine_info() -> dict:
    cpu = "unknown"
    try:
        for line in pathlib.Path("/proc/cpuinfo").read_text().splitlines():
            key, _, value = line.partition(":")
            if key.strip() in ("model name", "Model", "Hardware"):
                cpu = value.strip()
                break
    except OSError:
        pass
    import numpy
    import zmq

    return {
        "cpu": cpu,
        "cores": os.cpu_count(),
        "cores_usable": len(os.sched_getaffinity(0)),
        "python": f"{platform.python_implementation()} {platform.python_version()}",
        "kernel": f"{platform.system()} {platform.release()}",
        "machine": platform.machine(),
        "versions": {"numpy": numpy.__version__, "pyzmq": zmq.__version__, "libzmq": zmq.zmq_version()},
    }


def cpu_busy_fraction(seconds: float = 0.5) -> float | None:
    """How busy all CPUs are (0..1) over ``seconds``, from /proc/stat: other
    work on the machine skews every number here, latency tails most."""

    def sample():
        fields = [int(value) for value in pathlib.Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
        return fields[3] + fields[4], sum(fields)  # idle + iowait, total

    try:
        idle_before, total_before = sample()
        time.sleep(seconds)
        idle_after, total_after = sample()
    except (OSError, ValueError, IndexError):
        return None
    total = total_after - total_before
    return 1 - (idle_after - idle_before) / total if total else None


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="short smoke run (under a minute)")
    parser.add_argument("--output", type=pathlib.Path, help="JSON results file (default: results/bench.json, "
                        "results/bench_quick.json with --quick)")
    parser.add_argument("--chart", type=pathlib.Path, help="PNG chart (default: results/bench.png, bench_quick.png)")
    options = parser.parse_args()
    suffix = "_quick" if options.quick else ""
    options.output = options.output or RESULTS_DIR / f"bench{suffix}.json"
    options.chart = options.chart or RESULTS_DIR / f"bench{suffix}.png"
    if not (NATIVE_DIR / "kickmsg.abi3.so").exists():
        print(f"native kickmsg 0.1.0 not found in {NATIVE_DIR}: run `make bench`", file=sys.stderr)
        return 2
    free = os.statvfs("/dev/shm")
    if free.f_bavail * free.f_frsize < 512 * MB:
        print("less than 512 MB free in /dev/shm: the large-frame regions need about 70 MB each", file=sys.stderr)
        return 2
    # On SIGTERM too: kill the workers and unlink what they created (finally below).
    signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(128 + signum))
    mode = "quick" if options.quick else "full"
    settings = SETTINGS[mode]
    machine = machine_info()
    busy_before = cpu_busy_fraction()
    load_average = " ".join(pathlib.Path("/proc/loadavg").read_text().split()[:3])
    print(bench_report.machine_line(machine), file=sys.stderr)
    started, started_at = time.monotonic(), time.strftime("%Y-%m-%dT%H:%M:%S%z")
    errors: list[str] = []
    try:
        results = run_all(settings, errors)
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
    finally:
        stop_workers()
        remove_leftovers()
    report = {
        "mode": mode,
        "date": started_at,
        "duration_s": round(time.monotonic() - started, 1),
        "machine": machine,
        "cpu_busy_before": busy_before,
        "cpu_busy_after": cpu_busy_fraction(),
        "load_average": load_average,
        "settings": settings,
        "results": results,
        "errors": errors,
    }
    report["targets"] = bench_report.targets(results)
    report["scaling_markdown"] = bench_report.scaling_markdown(results["scaling"], settings["scaling"])
    print()
    bench_report.print_report(report)
    options.output.parent.mkdir(parents=True, exist_ok=True)
    options.output.write_text(json.dumps(report, indent=2) + "\n")
    try:
        import bench_chart

        bench_chart.draw(report, options.chart)
        chart_note = f", chart {options.chart}"
    except Exception as error:  # the chart is a convenience: report, do not fail the run
        chart_note = f" (no chart: {error!r})"
    print(f"\nresults written to {options.output}{chart_note}; {report['duration_s']} s")
    return 1 if errors else 0


if __name__ == "__main__":
    sys.exit(main())
