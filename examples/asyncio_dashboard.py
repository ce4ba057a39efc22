"""An asyncio dashboard over three live topics, with no thread of its own.

Three processes publish: an IMU at 200 Hz (typed records), an event log a
few times a second, and a Spark driver running a few jobs inside
``DriverTelemetry`` (its job and stage progress, as JSON, into
``spark.telemetry``). One asyncio program consumes the three topics with
``kickmsg.aio.messages`` and prints a live summary every second, until the
Spark driver's telemetry ends.

Run it:  python examples/asyncio_dashboard.py   (needs Java 17+)
"""
import asyncio
import json
import multiprocessing
import os
import time

import kickmsg
from kickmsg import aio, typed
from kickmsg.spark.telemetry import TELEMETRY_CONFIG

Imu = typed.RecordType("Imu", [("stamp_ns", "<u8"), ("accel", "<f4", (3,))])
IMU_CONFIG = kickmsg.Config(max_subscribers=4, sub_ring_capacity=256, pool_size=1024,
                            max_payload_size=Imu.dtype.itemsize, schema=Imu.schema)
EVENTS_CONFIG = kickmsg.Config(max_subscribers=4, sub_ring_capacity=64, pool_size=128, max_payload_size=256)


# -- the three publisher processes ----------------------------------------------------


def imu_feeder(prefix: str, stop) -> None:
    publisher = typed.TypedPublisher(kickmsg.Node("imu", prefix=prefix).advertise_or_join("imu", IMU_CONFIG), Imu)
    began, sent = time.monotonic(), 0
    while not stop.is_set():
        time.sleep(max(0.0, began + sent / 200 - time.monotonic()))
        publisher.send((time.monotonic_ns(), (0.01 * sent, 0.0, 9.81)))
        sent += 1


def event_feeder(prefix: str, stop) -> None:
    publisher = kickmsg.Node("events", prefix=prefix).advertise_or_join("events", EVENTS_CONFIG)
    for number in range(10**9):
        if stop.wait(0.3):
            break
        publisher.send(f"event {number}: {('calibrated', 'door open', 'door closed', 'battery 87%')[number % 4]}".encode())


def spark_driver(prefix: str) -> None:
    import kickmsg.spark

    spark = kickmsg.spark.session("local[2]", "asyncio-dashboard")
    try:
        with kickmsg.spark.DriverTelemetry(spark, prefix=prefix):
            for size in (10_000_000, 20_000_000, 30_000_000):
                spark.range(size).selectExpr("id % 10 as key").groupBy("key").count().collect()
    finally:
        spark.stop()


# -- the dashboard ------------------------------------------------------------------------


async def dashboard(imu, events, telemetry) -> None:
    imu_records, last_event = 0, "-"
    jobs, stage = {}, ""  # job -> "running" or how it ended; the last stage's progress
    began = time.monotonic()

    async def show_every_second():
        while True:
            await asyncio.sleep(1.0)
            running = [job for job, state in jobs.items() if state == "running"]
            spark = f"{len(jobs) - len(running)} jobs done" + (f", job {running[0]} running {stage}" if running else "")
            spark = spark if jobs else "starting"
            print(f"{time.monotonic() - began:4.0f}s  imu {imu_records:5d} records (lost {imu.lost})  "
                  f"events: {last_event!r:28}  spark: {spark}", flush=True)

    printer = asyncio.create_task(show_every_second())
    async for subscriber, message in aio.messages(imu, events, telemetry):
        if subscriber is imu:
            imu_records += len(message)
        elif subscriber is events:
            last_event = message.decode()
        else:
            event = json.loads(message)
            if event["kind"] == "job_start":
                jobs[event["job"]] = "running"
            elif event["kind"] == "job_end":
                jobs[event["job"]] = event["status"].lower()
            elif event["kind"] == "stage":
                stage = f"(stage {event['stage']}: {event['completed']}/{event['tasks']} tasks)"
            elif event["kind"] == "telemetry_end":
                break
    printer.cancel()
    outcomes = sorted(set(jobs.values()))
    print(f"done: {imu_records} IMU records (lost {imu.lost}), {len(jobs)} Spark jobs ({', '.join(outcomes)})")


def main() -> None:
    prefix = f"kmaio{os.getpid()}"
    node = kickmsg.Node("dashboard", prefix=prefix)
    # Subscribed before anyone publishes, so that nothing is missed.
    imu = typed.TypedSubscriber(node.subscribe_or_create("imu", IMU_CONFIG), Imu)
    events = node.subscribe_or_create("events", EVENTS_CONFIG)
    telemetry = node.subscribe_or_create("spark.telemetry", TELEMETRY_CONFIG)
    spawn = multiprocessing.get_context("spawn")
    stop = spawn.Event()
    feeders = [
        spawn.Process(target=imu_feeder, args=(prefix, stop)),
        spawn.Process(target=event_feeder, args=(prefix, stop)),
        spawn.Process(target=spark_driver, args=(prefix,)),
    ]
    for feeder in feeders:
        feeder.start()
    try:
        asyncio.run(dashboard(imu, events, telemetry))
    finally:
        stop.set()
        for feeder in feeders:
            feeder.join(timeout=30)
            feeder.kill()
        for topic in ("imu", "events", "spark.telemetry"):
            node.unlink_topic(topic)
        kickmsg.Registry.unlink(prefix)  # the namespace's participant registry (layout 9's nodes list themselves)


if __name__ == "__main__":
    main()
