"""Core benchmarks: this pure-Python kickmsg against the native kickmsg 0.1.0.

What is measured, on the same machine and in the same run, for both
implementations (each always in its own processes, see core_worker.py):

  (a) round trip in one process: ``Publisher.send`` then
      ``Subscriber.try_receive`` of 64 B and of 4 KB payloads, one publisher
      and one subscriber on a default-config PubSub region. Reported as
      nanoseconds per send + receive pair and pairs per second; the median of
      several timed repeats, after a warm-up that also sizes each repeat.
  (b) one-way latency across processes at 64 B: a publisher process stamps
      ``time.monotonic_ns()`` into each message and sends one every 1 ms
      (a little more when its sleep overshoots); a subscriber process
      blocked in ``receive(timeout)`` (asleep in the futex) computes
      ``monotonic_ns() - stamp`` on wake-up. Both ends use the same
      implementation. Reported as the median over repeats of each repeat's
      median and p99, in microseconds, after warm-up messages. The report
      also says for how many messages the subscriber was already waiting
      when the message was stamped (should be ~100%).

The table gives both implementations and ours/native as a time ratio (how
many times slower this package is). Results also go to
benchmarks/results/core.json.

Run (from the repository root):
    .venv/bin/python benchmarks/bench_core.py           # full, about a minute
    .venv/bin/python benchmarks/bench_core.py --quick   # smoke run, a few seconds
The native wheel must be installed in .native/kickmsg-0.1.0 (``make bench``
does that).
"""
import argparse
import json
import os
import pathlib
import platform
import secrets
import select
import signal
import statistics
import subprocess
import sys
import time

HERE = pathlib.Path(__file__).resolve().parent
ROOT = HERE.parent
WORKER = HERE / "core_worker.py"
NATIVE_DIR = ROOT / ".native" / "kickmsg-0.1.0"
RESULTS_FILE = HERE / "results" / "core.json"
SHM_PREFIX = f"kmbench_{os.getpid()}_{secrets.token_hex(3)}"
IMPLEMENTATIONS = ("ours", "native")

SETTINGS = {
    "full": {
        "roundtrip": {"sizes": [64, 4096], "repeats": 5, "warmup_s": 0.3, "repeat_s": 1.0},
        "latency": {"size": 64, "period_s": 0.001, "warmup": 300, "samples": 2000, "repeats": 5},
    },
    "quick": {
        "roundtrip": {"sizes": [64, 4096], "repeats": 3, "warmup_s": 0.05, "repeat_s": 0.1},
        "latency": {"size": 64, "period_s": 0.001, "warmup": 50, "samples": 200, "repeats": 3},
    },
}

_children: list[subprocess.Popen] = []  # processes started here, killed on failure


# -- running workers ----------------------------------------------------------


def worker_command(impl: str, mode: str, args: dict) -> list[str]:
    """The command line of a worker process for one implementation."""
    if impl == "native":
        # No site-packages (-S): our package is not importable there.
        return [sys.executable, "-S", str(WORKER), "native", str(NATIVE_DIR), mode, json.dumps(args)]
    return [sys.executable, str(WORKER), "ours", "-", mode, json.dumps(args)]


def start_worker(impl: str, mode: str, args: dict) -> subprocess.Popen:
    process = subprocess.Popen(
        worker_command(impl, mode, args), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=ROOT
    )
    _children.append(process)
    return process


def finish_worker(process: subprocess.Popen, what: str, timeout_s: float) -> dict:
    """Wait for a worker; its result is the JSON object on its last stdout line."""
    try:
        stdout, stderr = process.communicate(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        process.kill()
        stdout, stderr = process.communicate()
        raise RuntimeError(f"{what}: no result within {timeout_s:.0f} s\n{stderr}") from None
    if process.returncode != 0 or not stdout.strip():
        raise RuntimeError(f"{what}: worker exited with status {process.returncode}\n{stderr}")
    return json.loads(stdout.strip().splitlines()[-1])


def shm_name(label: str) -> str:
    return f"/{SHM_PREFIX}_{label}"


def remove_shm_objects() -> None:
    """Unlink every shared-memory object this run may have left behind."""
    for path in pathlib.Path("/dev/shm").glob(f"{SHM_PREFIX}_*"):
        path.unlink(missing_ok=True)


def stop_children() -> None:
    for process in _children:
        if process.poll() is None:
            process.kill()
            process.wait()


# -- statistics ------------------------------------------------------------------


def percentile(values: list, fraction: float):
    """Nearest-rank percentile."""
    ordered = sorted(values)
    rank = max(1, round(fraction * len(ordered)))
    return ordered[min(rank, len(ordered)) - 1]


# -- the benchmarks -------------------------------------------------------------


def bench_roundtrip(impl: str, settings: dict) -> dict:
    """(a) send + try_receive in one process, per payload size."""
    budget = 60 + 3 * len(settings["sizes"]) * (settings["repeats"] * settings["repeat_s"] + settings["warmup_s"])
    process = start_worker(impl, "roundtrip", dict(settings, name=shm_name(f"rt_{impl}")))
    raw = finish_worker(process, f"round trip ({impl})", budget)
    results = {}
    for size, measured in raw["roundtrip"].items():
        runs = measured["ns_per_op_runs"]
        ns_per_op = statistics.median(runs)
        results[size] = {
            "ns_per_op": ns_per_op,
            "ops_per_s": 1e9 / ns_per_op,
            "ns_per_op_min": min(runs),
            "ns_per_op_max": max(runs),
            "ns_per_op_runs": runs,
            "iterations_per_repeat": measured["iterations_per_repeat"],
        }
    return {"module": raw["module"], "sizes": results}


def bench_latency(impl: str, settings: dict) -> dict:
    """(b) one-way latency, publisher process -> subscriber process blocked in
    receive(timeout), both of implementation ``impl``."""
    name = shm_name(f"lat_{impl}")
    samples, repeats = settings["samples"], settings["repeats"]
    count = settings["warmup"] + samples * repeats
    budget = 60 + 3 * count * settings["period_s"]
    subscriber = start_worker(
        impl,
        "subscribe",
        {"name": name, "size": settings["size"], "warmup": settings["warmup"], "samples": samples * repeats, "timeout_s": 2.0},
    )
    # The subscriber creates the region and joins before saying "ready".
    readable, _, _ = select.select([subscriber.stdout], [], [], 30)
    line = subscriber.stdout.readline() if readable else ""
    if line.strip() != "ready":
        subscriber.kill()
        raise RuntimeError(f"latency subscriber ({impl}) did not start:\n{subscriber.communicate()[1]}")
    publisher = start_worker(
        impl, "publish", {"name": name, "size": settings["size"], "count": count, "period_s": settings["period_s"]}
    )
    finish_worker(publisher, f"latency publisher ({impl})", budget)
    raw = finish_worker(subscriber, f"latency subscriber ({impl})", 30)
    latencies_us = [ns / 1000 for ns in raw["latencies_ns"]]
    if len(latencies_us) < samples:
        raise RuntimeError(f"latency ({impl}): only {len(latencies_us)} samples received of {samples * repeats}")
    chunks = [latencies_us[i * samples : (i + 1) * samples] for i in range(len(latencies_us) // samples)]
    medians = [statistics.median(chunk) for chunk in chunks]
    p99s = [percentile(chunk, 0.99) for chunk in chunks]
    return {
        "module": raw["module"],
        "median_us": statistics.median(medians),
        "p99_us": statistics.median(p99s),
        "median_us_runs": medians,
        "p99_us_runs": p99s,
        "pooled_median_us": statistics.median(latencies_us),
        "pooled_p99_us": percentile(latencies_us, 0.99),
        "max_us": max(latencies_us),
        "samples": len(latencies_us),
        "waited_fraction": raw["waited"] / len(latencies_us),
        "lost": raw["lost"],
        "lost_by_sequence": raw["lost_by_sequence"],
        "timeouts": raw["timeouts"],
    }


# -- report -----------------------------------------------------------------------


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
    return {
        "cpu": cpu,
        "cores": os.cpu_count(),
        "cores_usable": len(os.sched_getaffinity(0)),
        "python": f"{platform.python_implementation()} {platform.python_version()}",
        "kernel": f"{platform.system()} {platform.release()}",
        "machine": platform.machine(),
    }


def cpu_busy_fraction(seconds: float = 0.5) -> float | None:
    """How busy all CPUs are (0..1) over ``seconds``, from /proc/stat: other
    work on the machine skews every number here, latency tails most."""

    def sample():
        fields = [int(value) for value in pathlib.Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
        idle = fields[3] + fields[4]  # idle + iowait
        return idle, sum(fields)

    try:
        idle_before, total_before = sample()
        time.sleep(seconds)
        idle_after, total_after = sample()
    except (OSError, ValueError, IndexError):
        return None
    total = total_after - total_before
    return 1 - (idle_after - idle_before) / total if total else None


def format_ns(ns: float) -> str:
    return f"{ns / 1000:,.2f} µs" if ns >= 10_000 else f"{ns:,.0f} ns"


def format_rate(per_s: float) -> str:
    return f"{per_s / 1e6:.2f} M/s" if per_s >= 1e6 else f"{per_s / 1e3:.1f} k/s"


def table_rows(results: dict) -> list[tuple[str, str, str, str]]:
    """(benchmark, ours, native, ours/native) for every benchmark."""
    rows = []
    for size, label in (("64", "64 B"), ("4096", "4 KB")):
        ours = results["roundtrip"]["ours"]["sizes"][size]
        native = results["roundtrip"]["native"]["sizes"][size]
        rows.append(
            (
                f"round trip {label}, send+try_receive per op",
                f"{format_ns(ours['ns_per_op'])} ({format_rate(ours['ops_per_s'])})",
                f"{format_ns(native['ns_per_op'])} ({format_rate(native['ops_per_s'])})",
                f"{ours['ns_per_op'] / native['ns_per_op']:.1f}x",
            )
        )
    for key, label in (("median_us", "median"), ("p99_us", "p99")):
        ours = results["latency"]["ours"][key]
        native = results["latency"]["native"][key]
        rows.append((f"cross-process latency 64 B, {label}", f"{ours:.1f} µs", f"{native:.1f} µs", f"{ours / native:.1f}x"))
    return rows


def print_report(report: dict) -> None:
    machine = report["machine"]
    print(f"CPU:    {machine['cpu']} ({machine['cores']} cores, {machine['cores_usable']} usable), {machine['machine']}")
    print(f"Python: {machine['python']}    Kernel: {machine['kernel']}")
    busy = report["cpu_busy_before"]
    if busy is not None:
        warning = "  (WARNING: other work is running, results will be noisy)" if busy > 0.15 else ""
        print(f"Load:   CPUs {busy:.0%} busy just before the run, load average {report['load_average']}{warning}")
    print(f"Run:    {report['mode']}, medians over {report['settings']['roundtrip']['repeats']} (round trip) and "
          f"{report['settings']['latency']['repeats']} (latency) repeats; ratio = time ours / time native")
    print()
    header = ("benchmark", "ours", "native", "ours/native")
    rows = [header] + table_rows(report["results"])
    widths = [max(len(row[i]) for row in rows) for i in range(4)]
    for index, row in enumerate(rows):
        print("  ".join([row[0].ljust(widths[0])] + [cell.rjust(width) for cell, width in zip(row[1:], widths[1:])]))
        if index == 0:
            print("  ".join("-" * width for width in widths))
    print()
    for impl in IMPLEMENTATIONS:
        latency = report["results"]["latency"][impl]
        print(
            f"latency {impl:6}: {latency['samples']} samples, subscriber already waiting for "
            f"{latency['waited_fraction']:.1%} of them, max {latency['max_us']:.1f} µs, "
            f"lost {latency['lost']} (by sequence {latency['lost_by_sequence']}), timeouts {latency['timeouts']}"
        )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="short smoke run (a few seconds)")
    parser.add_argument("--output", type=pathlib.Path, default=RESULTS_FILE, help="JSON results file")
    options = parser.parse_args()
    if not (NATIVE_DIR / "kickmsg.abi3.so").exists():
        print(f"native kickmsg 0.1.0 not found in {NATIVE_DIR}: run `make bench`", file=sys.stderr)
        return 2
    # On SIGTERM too, stop the workers and unlink the regions (finally below).
    signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(128 + signum))
    mode = "quick" if options.quick else "full"
    settings = SETTINGS[mode]
    busy_before = cpu_busy_fraction()
    load_average = " ".join(pathlib.Path("/proc/loadavg").read_text().split()[:3])
    started = time.monotonic()
    results = {"roundtrip": {}, "latency": {}}
    try:
        for impl in IMPLEMENTATIONS:
            print(f"round trip, {impl} ...", file=sys.stderr, flush=True)
            results["roundtrip"][impl] = bench_roundtrip(impl, settings["roundtrip"])
        for impl in IMPLEMENTATIONS:
            print(f"cross-process latency, {impl} ...", file=sys.stderr, flush=True)
            results["latency"][impl] = bench_latency(impl, settings["latency"])
    except (RuntimeError, KeyboardInterrupt) as error:
        print(f"benchmark failed: {error}", file=sys.stderr)
        return 1
    finally:
        stop_children()
        remove_shm_objects()
    report = {
        "mode": mode,
        "date": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "duration_s": round(time.monotonic() - started, 1),
        "machine": machine_info(),
        "cpu_busy_before": busy_before,
        "load_average": load_average,
        "settings": settings,
        "results": results,
        "table": [dict(zip(("benchmark", "ours", "native", "ratio"), row)) for row in table_rows(results)],
    }
    print_report(report)
    options.output.parent.mkdir(parents=True, exist_ok=True)
    options.output.write_text(json.dumps(report, indent=2) + "\n")
    print(f"\nresults written to {options.output} ({report['duration_s']} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
