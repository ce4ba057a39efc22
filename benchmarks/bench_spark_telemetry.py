"""Overhead of DriverTelemetry: the same Spark job with and without it.

A local[2] session runs an aggregation over 300 million rows (about two
seconds on a 2-core machine). After two warm-up runs, runs alternate (in ABBA order) without and with
``DriverTelemetry`` (polling every 0.25 s, publishing every job and stage
change), while a viewer process subscribes to the telemetry topic and reads
everything, as a dashboard would. Reported: the median wall time of each
side and the overhead ``median(with) / median(without) - 1``, plus how many
telemetry messages were published. The target is under 2 %.

Run:  .venv/bin/python benchmarks/bench_spark_telemetry.py [--pairs 12]
"""
import argparse
import json
import os
import pathlib
import platform
import statistics
import subprocess
import sys
import time

import kickmsg
import kickmsg.spark

RESULTS_FILE = pathlib.Path(__file__).resolve().parent / "results" / "spark_telemetry.json"
VIEWER = """
import sys, kickmsg
subscriber = kickmsg.Node("viewer", prefix=sys.argv[1]).subscribe_or_create("spark.telemetry", kickmsg.spark.telemetry.TELEMETRY_CONFIG)
print("ready", flush=True)
received = 0
while sys.stdin.readable():
    if subscriber.receive(0.2) is not None:
        received += 1
"""


def job(spark) -> float:
    """Wall seconds of one aggregation job."""
    began = time.perf_counter()
    spark.range(0, 300_000_000, numPartitions=8).selectExpr("id % 1000 as k", "id * 2 as v").groupBy("k").sum("v").collect()
    return time.perf_counter() - began


def cpu_model() -> str:
    for line in open("/proc/cpuinfo"):
        if line.startswith("model name"):
            return line.split(":", 1)[1].strip()
    return platform.processor()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pairs", type=int, default=12, help="runs with and without telemetry (default 12 each)")
    args = parser.parse_args()
    prefix = f"kmbenchtel{os.getpid()}"
    spark = kickmsg.spark.session("local[2]", "telemetry-overhead")
    viewer = subprocess.Popen(
        [sys.executable, "-c", "import kickmsg.spark.telemetry\n" + VIEWER, prefix],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
    )
    try:
        viewer.stdout.readline()
        for _ in range(2):
            job(spark)
        without, with_telemetry, published = [], [], 0
        for pair in range(args.pairs):
            for telemetry_on in (False, True) if pair % 2 == 0 else (True, False):  # ABBA: cancels drift
                if not telemetry_on:
                    without.append(job(spark))
                    continue
                with kickmsg.spark.DriverTelemetry(spark, prefix=prefix) as telemetry:
                    with_telemetry.append(job(spark))
                published += telemetry.published
        base, loaded = statistics.median(without), statistics.median(with_telemetry)
        overhead = loaded / base - 1
        print(f"CPU: {cpu_model()} ({os.cpu_count()} cores); Python {platform.python_version()}; Spark {spark.version}")
        print(f"job without telemetry: median {base:.3f} s over {args.pairs} runs ({min(without):.3f}-{max(without):.3f})")
        print(f"job with telemetry:    median {loaded:.3f} s over {args.pairs} runs ({min(with_telemetry):.3f}-{max(with_telemetry):.3f})")
        print(f"overhead: {overhead * 100:+.2f} %  ({published / args.pairs:.0f} telemetry messages per run)")
        RESULTS_FILE.parent.mkdir(exist_ok=True)
        RESULTS_FILE.write_text(json.dumps({
            "without_s": without, "with_s": with_telemetry, "median_without_s": base, "median_with_s": loaded,
            "overhead": overhead, "messages_per_run": published / args.pairs, "cpu": cpu_model(),
        }, indent=2))
    finally:
        viewer.stdin.close()
        viewer.kill()
        spark.stop()
        kickmsg.unlink_shm(f"/{prefix}_spark.telemetry")


if __name__ == "__main__":
    main()
