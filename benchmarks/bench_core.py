"""Benchmark suite: this package, on both channel layouts, against the peers
a Python user would pick instead, in one run on one machine: the native
kickmsg 0.1.0 (layout 4) and 0.9.2 (layout 9) bindings, multiprocessing.Pipe
and Queue, pyzmq, faster-fifo, iceoryx2 and zenoh.

Peers (benchmarks/peers.py) and what each needed to be set up fairly:

  ours         this package on layout-4 channels ($KICKMSG_LAYOUT=4), default
               Subscriber (spins 100 µs, then parks).
  ours9        the same on layout-9 channels ($KICKMSG_LAYOUT=9).
  native       kickmsg 0.1.0 from .native/kickmsg-0.1.0, run with ``python -S``
               so only the binding is importable; its receive parks at once.
  native9      kickmsg 0.9.2 from .native/kickmsg-0.9.2, likewise.
  mp_pipe      multiprocessing.Pipe(duplex=False), one per subscriber;
               send_bytes / recv_bytes (no pickling).
  mp_queue     multiprocessing.Queue(maxsize 1000; 4 for frames), one per
               subscriber; put / get (pickled by its feeder thread).
  zmq          pyzmq XPUB -> SUB over ipc://, high-water marks 1000 (4 for
               frames); the publisher waits for every subscription first.
  faster_fifo  faster_fifo.Queue, one per subscriber, max_size_bytes room for
               1000 messages (4 frames), at least 1 MB; put / get with its
               default pickling; blocking get.
  iceoryx2     iceoryx2 0.10 Python binding, publish-subscribe service of
               Slice[c_uint8]: the publisher loans a sample and writes into
               it (zero-copy), the subscriber reads the sample in place
               (frames: a numpy view over it, released after use). Blocking
               receive: an event service beside it, the publisher notifies
               after each send, the subscriber waits on its listener (the
               event-based pattern of iceoryx2's examples). Subscriber buffer
               1000 (4 for frames), no history, safe overflow (drops the
               oldest, like a kickmsg ring). Its files carry this run's prefix
               (config: global prefix and root path).
  zenoh        eclipse-zenoh 1.10, peer mode, multicast and gossip scouting
               off, each subscriber's session listening on its own
               tcp/127.0.0.1 port and the publisher's session connecting to
               them (nothing leaves the host); shared memory transport on,
               and payloads of 4 KB and more are written into a buffer of its
               ShmProvider (blocking until a buffer is free) and travel by
               shared memory; 64 B payloads are put as bytes. Reliable:
               CongestionControl.BLOCK, subscriber FIFO of 1000 (4 for
               frames). Its Python API has no buffer view of a zenoh buffer:
               the publisher copies bytes into its SHM buffer and the
               subscriber copies out (to_bytes), so frames are not zero-copy
               from Python. Its SHM files (``N.zenoh``, named by zenoh) that
               appear during a worker and that no running process holds are
               unlinked after it.

Every measurement runs in a fresh worker process tree of one peer
(benchmarks/core_worker.py), one at a time; a failing peer is recorded
({"error": ...} and the errors list) and the run goes on.

Scenarios (exactly what is timed: see core_worker.py):

  1. in-process send + receive, 64 B and 4 KB: one process sends a message
     and receives it (kickmsg and iceoryx2: send + try_receive; the others:
     their blocking receive, as their delivery is asynchronous). ns per pair:
     median over repeats of the mean; p99 over 16-pair batches.
  2. ping-pong, 64 B: two processes pinned to cores 0 and 1, each receiving
     with the peer's blocking receive; one-way latency = half the round trip,
     median and p99 over 2000 trips; beside it, each side's CPU time over
     wall time while the trips ran (near 100 %: a receive that spins).
  3. paced one-way latency, 64 B, blocking receive: one message per
     millisecond carrying its monotonic_ns send stamp (a receiver that has
     gone to sleep between messages), once left to the scheduler and once
     with the publisher and the subscriber pinned to cores 0 and 1. Median
     and p99 of each repeat, medians over repeats; beside it, the median
     time of the publisher's send call (the cold send, after an idle ms).
  4. streaming throughput, 4 KB, one publisher to one subscriber process, and
  5. fan-out, 64 B, one publisher to 4 subscriber processes: as fast as the
     publisher can; messages received per second, summed over the
     subscribers (median over rounds; the worst round too), with the
     fraction lost (kickmsg rings, iceoryx2 and 0MQ PUB drop when a
     subscriber lags; the pipes, queues and zenoh block the publisher).
  6. large frames, 1 MB and 8 MB, one publisher to one subscriber process, as
     fast as possible: each frame produced by copying a prepared image into
     the buffer that is sent (kickmsg: the allocated slot, published in
     place, in 0.1.0's form on layout 4 and 0.9.2's on layout 9; iceoryx2:
     the loaned sample) and received as a numpy array
     (kickmsg, iceoryx2: a view, no copy). Frames/s and GB/s received
     (median over rounds), p99 of the time between frames; and the first
     pass: frames/s until the subscriber has 8 frames (the pool's size) on a
     fresh channel. kickmsg: pool 8, ring 4; queues and buffers 4.
  7. resident memory added by ``import kickmsg`` and opening a channel
     (default Config, a Publisher, a Subscriber, one message), in a fresh
     process, the four kickmsg peers (benchmarks/rss_probe.py).
  8. scaling, the four kickmsg peers: the cost of one ``send`` with 1, 4,
     16, 64 subscriber rings (none reading: every ring has wrapped) and 64 B,
     1 KB, 16 KB, 256 KB payloads, printed as a markdown table per layout
     (ours / native of that layout) for the README.
  9. layouts: each summary row's cost on layout 9 as a ratio to layout 4's,
     ours and native (a markdown table for the README).

Then a summary table of medians per layout (that layout's ours and native,
and the other peers) with ratios to ours on that layout, each also printed
as markdown for the README ("Summary for the README, layout 4 / 9"), and
issue 37's targets on both layouts, met or missed with the ratio, by how
much, and the losses beside throughput targets. Ours is the compiled build
(kickmsg/build.py), or the pure one with --pure. Results go to
benchmarks/results/bench.json and a chart to benchmarks/results/bench.png
(bench_quick.*, bench_pure.* for --quick, --pure). The machine (CPU model, cores, Python, kernel, peer versions)
and how busy it was are printed with the results: other work on the machine
skews every number, latency tails most.

Run (from the repository root; ``make bench`` installs what is needed):
    .venv/bin/python benchmarks/bench_core.py           # full, about 4.5 minutes on 2 cores (quiet)
    .venv/bin/python benchmarks/bench_core.py --quick   # smoke run, about 1.5 minutes (quiet)
    .venv/bin/python benchmarks/bench_core.py --quick --peers ours,ours9,mp_pipe
    .venv/bin/python benchmarks/bench_core.py --pure --peers ours,ours9,native,native9,mp_pipe   # the pure build
"""
import argparse
import importlib.metadata
import json
import os
import pathlib
import platform
import secrets
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import sysconfig
import time
from collections.abc import Callable
from typing import Any

HERE = pathlib.Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(HERE))

import bench_report  # noqa: E402

WORKER = HERE / "core_worker.py"
RSS_PROBE = HERE / "rss_probe.py"
NATIVE_DIR = ROOT / ".native" / "kickmsg-0.1.0"
NATIVE9_DIR = ROOT / ".native" / "kickmsg-0.9.2"
NATIVE_DIRS = {"native": NATIVE_DIR, "native9": NATIVE9_DIR}  # each run with ``python -S`` from its directory
OUR_LAYOUTS = {"ours": 4, "ours9": 9}  # $KICKMSG_LAYOUT of our workers
SITE_DIR = sysconfig.get_paths()["purelib"]  # numpy for the native worker (which runs with -S)
RESULTS_DIR = HERE / "results"
PREFIX = f"kmbench_{os.getpid()}_{secrets.token_hex(3)}"
PEERS = bench_report.PEERS
KICKMSG_PEERS = bench_report.KICKMSG_PEERS
MB = 1 << 20

SETTINGS = {
    "full": {
        "inproc": {"sizes": [64, 4096], "repeats": 5, "warmup_s": 0.2, "repeat_s": 0.3, "batch": 16},
        "pingpong": {"size": 64, "warmup": 200, "trips": 2000},
        "latency": {"sizes": [64], "modes": ["block", "pinned"], "period_s": 0.001, "warmup": 200, "samples": 600, "repeats": 5},
        "throughput": {"subscribers": [1], "size": 4096, "duration_s": 1.0, "warmup_s": 0.3, "repeats": 3},
        "fanout": {"subscribers": [4], "size": 64, "duration_s": 1.0, "warmup_s": 0.3, "repeats": 3},
        "frames": {"sizes": [1 * MB, 8 * MB], "duration_s": 0.6, "warmup_s": 0.3, "repeats": 3},
        "scaling": {
            "rings": [1, 4, 16, 64], "sizes": [64, 1024, 16384, 262144],
            "repeats": 5, "warmup_s": 0.05, "repeat_s": 0.1, "batch": 8,
        },
    },
    "quick": {
        "inproc": {"sizes": [64, 4096], "repeats": 3, "warmup_s": 0.03, "repeat_s": 0.05, "batch": 16},
        "pingpong": {"size": 64, "warmup": 50, "trips": 300},
        "latency": {"sizes": [64], "modes": ["block", "pinned"], "period_s": 0.001, "warmup": 20, "samples": 100, "repeats": 3},
        "throughput": {"subscribers": [1], "size": 4096, "duration_s": 0.2, "warmup_s": 0.1, "repeats": 2},
        "fanout": {"subscribers": [4], "size": 64, "duration_s": 0.2, "warmup_s": 0.1, "repeats": 2},
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
    if peer in NATIVE_DIRS:
        return [sys.executable, "-S", str(script), peer, str(NATIVE_DIRS[peer]), SITE_DIR, *args]
    return [sys.executable, str(script), peer, "-", "-", *args]


def peer_environment(peer: str) -> dict[str, str] | None:
    """The environment of a peer's worker: ours and ours9 get the layout of
    their channels ($KICKMSG_LAYOUT 4 and 9); the others inherit ours."""
    if peer not in OUR_LAYOUTS:
        return None
    return dict(os.environ, KICKMSG_LAYOUT=str(OUR_LAYOUTS[peer]))


def free_ports(count: int) -> list[int]:
    """``count`` TCP ports on 127.0.0.1 free right now (zenoh's endpoints)."""
    sockets = [socket.socket() for _ in range(count)]
    try:
        for each in sockets:
            each.bind(("127.0.0.1", 0))
        return [each.getsockname()[1] for each in sockets]
    finally:
        for each in sockets:
            each.close()


def run_worker(peer: str, mode: str, args: dict, timeout_s: float) -> dict:
    """Run one worker (its own session, so its process group can be killed
    with everything it forked) and return its JSON result."""
    if peer in KICKMSG_PEERS:
        args = dict(args, shm_name=f"/{PREFIX}_{mode}_{peer}")
    args = dict(
        args, socket_path=f"/tmp/{PREFIX}_{mode}.ipc", idle_s=args.get("idle_s", 1.0),
        iox_prefix=f"{PREFIX}_iox_", iox_root=f"/tmp/{PREFIX}_iox2/", ports=free_ports(8),
    )
    command = worker_command(WORKER, peer, mode, json.dumps(args))
    if peer == "zenoh":
        return run_zenoh_command(command, f"{mode} ({peer})", timeout_s)
    return run_command(command, f"{mode} ({peer})", timeout_s, peer_environment(peer))


def run_command(command: list[str], what: str, timeout_s: float, environment: dict[str, str] | None = None) -> dict:
    process = subprocess.Popen(
        command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=ROOT, start_new_session=True,
        env=environment,
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


def run_zenoh_command(command: list[str], what: str, timeout_s: float) -> dict:
    """zenoh names its shared-memory files itself (``<number>.zenoh``) and
    leaves them behind: unlink those that appeared during this worker and
    that no running process maps or holds open (another program's zenoh
    may be running on the machine too)."""
    before = set(pathlib.Path("/dev/shm").glob("*.zenoh"))
    try:
        return run_command(command, what, timeout_s)
    finally:
        appeared = set(pathlib.Path("/dev/shm").glob("*.zenoh")) - before
        for path in appeared - shm_files_in_use():
            path.unlink(missing_ok=True)


def shm_files_in_use() -> set[pathlib.Path]:
    """The /dev/shm files some running process maps or holds open."""
    used = set()
    for process in pathlib.Path("/proc").glob("[0-9]*"):
        try:
            for line in (process / "maps").read_text().splitlines():
                if "/dev/shm/" in line:
                    used.add(pathlib.Path(line[line.index("/dev/shm/"):].removesuffix(" (deleted)")))
            for descriptor in (process / "fd").iterdir():
                target = os.readlink(descriptor)
                if target.startswith("/dev/shm/"):
                    used.add(pathlib.Path(target))
        except OSError:
            continue  # gone, or not ours to read
    return used


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
        if path.is_dir():
            shutil.rmtree(path, ignore_errors=True)  # iceoryx2's root directory
        else:
            path.unlink(missing_ok=True)


# -- statistics ------------------------------------------------------------------


def percentile(values: list, fraction: float):
    """Nearest-rank percentile."""
    ordered = sorted(values)
    rank = max(1, round(fraction * len(ordered)))
    return ordered[min(rank, len(ordered)) - 1]


def batch_stats(batch_ns_runs: list, batch: int) -> dict:
    """Per repeat: mean ns per operation, p99 of the batches' ns per operation;
    and the median batch of all repeats per operation (a batch the machine's
    other work did not interrupt, as long as most were not)."""
    means = [sum(run) / (len(run) * batch) for run in batch_ns_runs]
    p99s = [percentile(run, 0.99) / batch for run in batch_ns_runs]
    return {
        "median_ns": statistics.median(means),
        "p99_ns": statistics.median(p99s),
        "median_batch_ns": statistics.median(ns for run in batch_ns_runs for ns in run) / batch,
        "mean_ns_runs": means,
        "p99_ns_runs": p99s,
        "operations_per_repeat": len(batch_ns_runs[0]) * batch,
    }


# -- the benchmarks ------------------------------------------------------------------


def bench_inproc(peer: str, settings: dict) -> dict:
    budget = 120 + 4 * len(settings["sizes"]) * (settings["warmup_s"] + settings["repeats"] * settings["repeat_s"])
    raw = run_worker(peer, "inproc", dict(settings, depth=QUEUE_DEPTH), budget)
    layout = OUR_LAYOUTS.get(peer)
    if layout is not None and raw["layout"] != layout:
        raise RuntimeError(f"inproc ({peer}): asked for layout {layout}, the worker's channel has layout {raw['layout']}")
    return {size: batch_stats(measured["batch_ns_runs"], measured["batch"]) for size, measured in raw["inproc"].items()}


def bench_latency(peer: str, settings: dict, size: int, mode: str) -> dict:
    """Paced one-way latency: one stamped message per ``period_s``; ``mode``
    "block" (blocking receive), "pinned" (the same, publisher and subscriber
    pinned to cores 0 and 1) or "spin" (a non-blocking receive in a loop).
    With it, what the publisher's ``send`` call took (the cold send)."""
    samples, repeats = settings["samples"], settings["repeats"]
    count = settings["warmup"] + samples * repeats
    args = {
        "size": size, "spin": mode == "spin", "pinned": mode == "pinned", "period_s": settings["period_s"],
        "warmup": settings["warmup"],
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
    send_us = [ns / 1000 for ns in raw["send_ns"]]
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
        "send_median_us": statistics.median(send_us),
        "send_p99_us": percentile(send_us, 0.99),
    }


def bench_pingpong(peer: str, settings: dict) -> dict:
    args = dict(settings, depth=QUEUE_DEPTH, config={"max_subscribers": 2})
    raw = run_worker(peer, "pingpong", args, 90 + settings["trips"] * 0.01)["pingpong"]
    one_way_us = [ns / 1000 for ns in raw["one_way_ns"]]
    return {
        "median_us": statistics.median(one_way_us),
        "p99_us": percentile(one_way_us, 0.99),
        "max_us": max(one_way_us),
        "trips": len(one_way_us),
        # CPU time over wall time while the trips ran, each side: near 1, a receive that spins.
        "ping_cpu_fraction": raw["ping_cpu_ns"] / raw["ping_wall_ns"],
        "pong_cpu_fraction": raw["pong_cpu_ns"] / raw["pong_wall_ns"],
        "cpu_us_per_trip": (raw["ping_cpu_ns"] + raw["pong_cpu_ns"]) / 1000 / len(one_way_us),
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
    first = raw["first_round"]
    (first_received,) = first["subscribers"]
    pool = config["pool_size"]
    # The first pass: from the start of round 0 (a fresh channel) to the
    # subscriber's clock at the pool_size-th frame it received (a lossy peer
    # that dropped frames on the way takes longer to get there).
    if len(first_received["frame_ns"]) >= pool:
        first_pass_fps = pool * 1e9 / (first_received["frame_ns"][pool - 1] - first["start_ns"])
    else:
        first_pass_fps = None  # fewer frames than that in the first round
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
        "first_pass_fps": first_pass_fps,
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
    raw = run_command(command, f"rss ({peer})", 60, peer_environment(peer))
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


def attempt(errors: list, what: str, function: Callable[..., dict], *args: Any) -> dict:
    """Run one measurement; a failure (of any kind) is recorded, the result
    is {"error": ...}, and the suite goes on."""
    print(f"  {what} ...", file=sys.stderr, flush=True)
    try:
        return function(*args)
    except Exception as error:  # one failing peer must not stop the run
        errors.append(f"{what}: {error}")
        print(f"  FAILED {what}: {str(error).splitlines()[0] if str(error) else repr(error)}", file=sys.stderr, flush=True)
        return {"error": (str(error).splitlines() or [repr(error)])[0]}


def run_all(settings: dict, errors: list, peers: tuple) -> dict:
    results: dict = {
        key: {} for key in ("inproc", "pingpong", "latency", "throughput", "fanout", "frames", "rss", "scaling")
    }
    kickmsg_peers = [peer for peer in KICKMSG_PEERS if peer in peers]
    print("1/8 in-process send + receive", file=sys.stderr)
    for peer in peers:
        measured = attempt(errors, f"in-process, {peer}", bench_inproc, peer, settings["inproc"])
        for size in settings["inproc"]["sizes"]:
            results["inproc"].setdefault(str(size), {})[peer] = measured if "error" in measured else measured[str(size)]
    print("2/8 cross-process ping-pong (one-way latency, blocking receive, pinned)", file=sys.stderr)
    size = settings["pingpong"]["size"]
    for peer in peers:
        results["pingpong"].setdefault(str(size), {})[peer] = attempt(
            errors, f"ping-pong {size} B, {peer}", bench_pingpong, peer, settings["pingpong"]
        )
    print("3/8 cross-process one-way latency, one message per ms", file=sys.stderr)
    for mode in settings["latency"]["modes"]:
        for size in settings["latency"]["sizes"]:
            key = f"{size}_{mode}"
            for peer in peers:
                results["latency"].setdefault(key, {})[peer] = attempt(
                    errors, f"latency {key}, {peer}", bench_latency, peer, settings["latency"], size, mode
                )
    for step, scenario in (("4/8", "throughput"), ("5/8", "fanout")):
        print(f"{step} {scenario}", file=sys.stderr)
        for subscribers in settings[scenario]["subscribers"]:
            for peer in peers:
                results[scenario].setdefault(str(subscribers), {})[peer] = attempt(
                    errors, f"{scenario} to {subscribers}, {peer}", bench_fanout, peer, settings[scenario], subscribers
                )
    print("6/8 large frames", file=sys.stderr)
    for size in settings["frames"]["sizes"]:
        for peer in peers:
            results["frames"].setdefault(str(size), {})[peer] = attempt(
                errors, f"frames {size // MB} MB, {peer}", bench_frames, peer, settings["frames"], size
            )
    print("7/8 resident memory", file=sys.stderr)
    for peer in kickmsg_peers:
        results["rss"][peer] = attempt(errors, f"rss, {peer}", bench_rss, peer)
    print("8/8 publish scaling", file=sys.stderr)
    for peer in kickmsg_peers:
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

    versions = {"numpy": numpy.__version__, "pyzmq": zmq.__version__, "libzmq": zmq.zmq_version()}
    for package in ("faster-fifo", "iceoryx2", "eclipse-zenoh"):
        try:
            versions[package] = importlib.metadata.version(package)
        except importlib.metadata.PackageNotFoundError:
            versions[package] = None
    return {
        "cpu": cpu,
        "cores": os.cpu_count(),
        "cores_usable": len(os.sched_getaffinity(0)),
        "python": f"{platform.python_implementation()} {platform.python_version()}",
        "kernel": f"{platform.system()} {platform.release()}",
        "machine": platform.machine(),
        "versions": versions,
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
    parser.add_argument("--quick", action="store_true", help="short smoke run (about 1.5 minutes on a quiet 2-core machine)")
    parser.add_argument("--output", type=pathlib.Path, help="JSON results file (default: results/bench.json, "
                        "results/bench_quick.json with --quick)")
    parser.add_argument("--chart", type=pathlib.Path, help="PNG chart (default: results/bench.png, bench_quick.png)")
    parser.add_argument("--peers", help=f"comma-separated subset of {','.join(PEERS)} (default: all)")
    parser.add_argument("--pure", action="store_true", help="ours and ours9 run the pure build (KICKMSG_PURE=1) instead "
                        "of the compiled one; results to bench_pure.json")
    options = parser.parse_args()
    if options.pure:
        os.environ["KICKMSG_PURE"] = "1"  # inherited by every worker; only ours and ours9 read it
    else:
        os.environ.pop("KICKMSG_PURE", None)
    build = "pure" if options.pure else "compiled"
    suffix = ("_quick" if options.quick else "") + ("_pure" if options.pure else "")
    options.output = options.output or RESULTS_DIR / f"bench{suffix}.json"
    options.chart = options.chart or RESULTS_DIR / f"bench{suffix}.png"
    for version, binding in (("0.1.0", NATIVE_DIR / "kickmsg.abi3.so"), ("0.9.2", NATIVE9_DIR / "kickmsg" / "_native.abi3.so")):
        if not binding.exists():
            print(f"native kickmsg {version} not found ({binding}): run `make bench`", file=sys.stderr)
            return 2
    free = os.statvfs("/dev/shm")
    if free.f_bavail * free.f_frsize < 512 * MB:
        print("less than 512 MB free in /dev/shm: the large-frame regions need about 70 MB each", file=sys.stderr)
        return 2
    # On SIGTERM too: kill the workers and unlink what they created (finally below).
    signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(128 + signum))
    peers = tuple(options.peers.split(",")) if options.peers else PEERS
    unknown = [peer for peer in peers if peer not in PEERS]
    if unknown:
        parser.error(f"--peers: unknown peer(s) {', '.join(unknown)}; known: {', '.join(PEERS)}")
    mode = "quick" if options.quick else "full"
    settings = SETTINGS[mode]
    machine = machine_info()
    busy_before = cpu_busy_fraction()
    load_average = " ".join(pathlib.Path("/proc/loadavg").read_text().split()[:3])
    print(bench_report.machine_line(machine), file=sys.stderr)
    started, started_at = time.monotonic(), time.strftime("%Y-%m-%dT%H:%M:%S%z")
    errors: list[str] = []
    try:
        results = run_all(settings, errors, peers)
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
    finally:
        stop_workers()
        remove_leftovers()
    report = {
        "mode": mode,
        "build": build,
        "date": started_at,
        "duration_s": round(time.monotonic() - started, 1),
        "machine": machine,
        "cpu_busy_before": busy_before,
        "cpu_busy_after": cpu_busy_fraction(),
        "load_average": load_average,
        "settings": settings,
        "peers": list(peers),
        "results": results,
        "errors": errors,
    }
    report["targets"] = bench_report.targets(results)
    report["scaling_markdown"] = {
        str(layout): bench_report.scaling_markdown(results["scaling"], settings["scaling"], layout)
        for layout in bench_report.LAYOUTS
    }
    report["summary_markdown"] = {
        str(layout): bench_report.summary_markdown(results, bench_report.layout_peers(peers, layout))
        for layout in bench_report.LAYOUTS
    }
    report["layouts_markdown"] = bench_report.layouts_markdown(results)
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
