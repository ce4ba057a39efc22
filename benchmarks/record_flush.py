"""What the recorder's periodic flush costs (issue 24, item 4).

``kickmsg record`` writes what it received to its file every
``--flush-interval`` seconds (default 1), so that a recorder killed outright
loses at most that interval. This measures, in one run, the CPU time (user +
system, from the kernel's accounting of the child) of a ``kickmsg record``
process recording one channel published at 1 kHz for ``--seconds``, with

  flushed     --flush-interval 1 (the default)
  unflushed   --flush-interval 1e6 (nothing written before the end)

for Parquet and MCAP, the two settings alternating over ``--rounds``; and
reports the median CPU seconds of each and their ratio. Messages are 100
bytes, stamped; the recorder is stopped by SIGINT once it has read every
message, and its closing of the file is counted in both.

    .venv/bin/python benchmarks/record_flush.py [--seconds 10] [--rounds 3] [--json out.json]
"""
import argparse
import json
import os
import pathlib
import signal
import statistics
import subprocess
import sys
import tempfile
import time

import kickmsg
from kickmsg.ops import diagnostics
from kickmsg.recording import stamp

KICKMSG = [sys.executable, "-m", "kickmsg"]
RATE_HZ = 1000
PAYLOAD = 100
SETTINGS = {"flushed": "1", "unflushed": "1e6"}
CONFIG = kickmsg.Config(max_subscribers=4, sub_ring_capacity=4096, pool_size=8192, max_payload_size=PAYLOAD)


def wait_until(condition, what: str, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise RuntimeError(f"timed out waiting for {what}")
        time.sleep(0.01)


def recorder_ring(name: str) -> diagnostics.RingStats | None:
    """The recorder's ring, once it has joined (the only Live ring)."""
    live = [ring for ring in diagnostics.stats(name).rings if ring.state == "Live"]
    return live[0] if live else None


def publish_at_rate(publisher: kickmsg.Publisher, seconds: float) -> int:
    """Stamped messages at RATE_HZ for ``seconds``; returns how many."""
    body = bytes(PAYLOAD - stamp.SIZE)
    began = time.monotonic()
    count = 0
    while count < seconds * RATE_HZ:
        due = began + count / RATE_HZ
        ahead = due - time.monotonic()
        if ahead > 0:
            time.sleep(ahead)
        publisher.send(stamp.stamped(body))
        count += 1
    return count


def record_cpu_seconds(name: str, out: str, fmt: str, interval: str, seconds: float) -> tuple[float, int]:
    """CPU seconds of one ``kickmsg record`` run, and the messages it recorded."""
    recorder = subprocess.Popen(KICKMSG + ["record", name, "--out", out, "--format", fmt, "--flush-interval", interval,
                                           "--json"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        wait_until(lambda: recorder_ring(name) is not None, "the recorder to subscribe")
        publish_at_rate(kickmsg.Publisher(kickmsg.SharedRegion.open(name)), seconds)
        wait_until(lambda: recorder_ring(name).pending == 0, "the recorder to read every message")
        recorder.send_signal(signal.SIGINT)
        _, status, usage = os.wait4(recorder.pid, 0)
        recorder.returncode = os.waitstatus_to_exitcode(status)
        output, errors = recorder.stdout.read(), recorder.stderr.read()
    finally:
        recorder.kill()
    if recorder.returncode != 0:
        raise RuntimeError(f"kickmsg record failed: {errors}")
    messages = sum(channel["messages"] for channel in json.loads(output)["channels"].values())
    return usage.ru_utime + usage.ru_stime, messages


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=10, help="publishing time per run (default 10)")
    parser.add_argument("--rounds", type=int, default=3, help="runs of each setting (default 3)")
    parser.add_argument("--name", default=f"/kmbench_record_{os.getpid()}", help="shm name of the channel")
    parser.add_argument("--json", dest="json_path", help="write the figures as JSON")
    args = parser.parse_args()
    # layout 4: its ring keeps the recorder's read position, which says when it has read everything
    kickmsg.SharedRegion.create(args.name, kickmsg.ChannelType.PubSub, CONFIG, "bench", layout=4)
    results: dict[str, dict[str, list[float]]] = {}
    try:
        with tempfile.TemporaryDirectory() as scratch:
            for fmt in ("parquet", "mcap"):
                for round_number in range(args.rounds):
                    for setting, interval in SETTINGS.items():
                        out = str(pathlib.Path(scratch) / f"{fmt}-{setting}-{round_number}")
                        cpu, messages = record_cpu_seconds(args.name, out, fmt, interval, args.seconds)
                        results.setdefault(fmt, {}).setdefault(setting, []).append(cpu)
                        print(f"{fmt:8} {setting:10} round {round_number}: {cpu:.3f} s CPU, {messages} messages",
                              flush=True)
    finally:
        kickmsg.unlink_shm(args.name)
    summary = {}
    print(f"\nmedian CPU seconds of the recorder, {args.seconds:g} s at {RATE_HZ} Hz, {PAYLOAD}-byte messages")
    for fmt, settings in results.items():
        flushed, unflushed = (statistics.median(settings[key]) for key in SETTINGS)
        summary[fmt] = {"flushed_s": flushed, "unflushed_s": unflushed, "ratio": flushed / unflushed}
        print(f"  {fmt:8} flushed every 1 s {flushed:.3f}   never before the end {unflushed:.3f}   "
              f"ratio {flushed / unflushed:.3f}")
    if args.json_path:
        with open(args.json_path, "w", encoding="utf-8") as out:
            json.dump({"seconds": args.seconds, "rounds": args.rounds, "results": results, "summary": summary}, out,
                      indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
