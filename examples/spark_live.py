"""Spark and live channels: a stream in, a batch out, and the driver's telemetry.

1. An IMU process publishes typed records at 200 Hz; a Spark streaming query
   reads the topic with ``format("kickmsg")`` and ``decode=true``, so the
   record fields are columns, and counts messages and losses per batch.
2. A DataFrame is written into a topic, one JSON message per row, and read
   back by a plain subscriber.
3. ``DriverTelemetry`` publishes the driver's job and stage progress into
   ``/{prefix}_spark.telemetry`` while a small job runs; a subscriber thread
   (it could be any process on the host, e.g. ``kickmsg echo``) prints it.

Run it:  python examples/spark_live.py   (needs Java 17+)
"""
import json
import multiprocessing
import os
import threading
import time

import kickmsg
import kickmsg.spark
from kickmsg import typed

Imu = typed.RecordType("Imu", [("stamp_ns", "<u8"), ("accel", "<f4", (3,))])


def imu_publisher(prefix: str, count: int, rate_hz: float) -> None:
    node = kickmsg.Node("imu", prefix=prefix)
    publisher = typed.TypedPublisher(node.advertise_or_join("imu", imu_config()), Imu)
    began = time.monotonic()
    for i in range(count):
        time.sleep(max(0.0, began + i / rate_hz - time.monotonic()))
        publisher.send((time.monotonic_ns(), (0.01 * i, 0.0, 9.81)))


def imu_config() -> kickmsg.Config:
    return kickmsg.Config(max_subscribers=4, sub_ring_capacity=256, pool_size=1024, max_payload_size=Imu.dtype.itemsize,
                          schema=Imu.schema)


def print_telemetry(prefix: str, stop: threading.Event) -> None:
    subscriber = kickmsg.Node("telemetry-viewer", prefix=prefix).subscribe("spark.telemetry")
    while not stop.is_set():
        message = subscriber.receive(0.1)
        if message is not None:
            event = json.loads(message)
            if event["kind"] in ("job_start", "job_end", "stage"):
                print("   telemetry:", {k: v for k, v in event.items() if k != "t"})
    subscriber.close()


def main() -> None:
    prefix = f"kmspark{os.getpid()}"
    node = kickmsg.Node("example", prefix=prefix)
    spark = kickmsg.spark.session("local[2]", "kickmsg-example")
    try:
        # 1. A live, typed stream.
        node.advertise("imu", imu_config())
        query = (
            spark.readStream.format("kickmsg").option("topic", "imu").option("prefix", prefix).option("decode", "true")
            .load()
            .writeStream.format("memory").queryName("imu").trigger(processingTime="500 milliseconds").start()
        )
        while not query.recentProgress and query.isActive:  # the first batch ran: the subscriber is in
            time.sleep(0.1)
        imu = multiprocessing.get_context("spawn").Process(target=imu_publisher, args=(prefix, 600, 200.0))
        imu.start()
        imu.join()
        time.sleep(1.5)  # a last micro-batch
        query.stop()
        summary = spark.sql("select count(*) as messages, sum(lost) as lost, max(accel[0]) as last_ax from imu").first()
        print(f"1. stream: {summary.messages} IMU records in {len(query.recentProgress)} batches, "
              f"lost {summary.lost}, last accel.x {summary.last_ax:.2f}")

        # 2. A batch write, read back by a subscriber.
        node.advertise("orders", kickmsg.Config(max_subscribers=2, sub_ring_capacity=64, pool_size=128))
        reader = node.subscribe("orders")
        spark.createDataFrame([(i, f"item-{i}", 9.5 * i) for i in range(20)], "id int, item string, price double") \
            .write.format("kickmsg").option("topic", "orders").option("prefix", prefix).mode("append").save()
        rows = [json.loads(message) for message in reader]
        print(f"2. write: {len(rows)} rows received as JSON messages, first {rows[0]}")

        # 3. The driver's telemetry while a job runs.
        stop = threading.Event()
        with kickmsg.spark.DriverTelemetry(spark, prefix=prefix) as telemetry:
            viewer = threading.Thread(target=print_telemetry, args=(prefix, stop))
            viewer.start()
            time.sleep(0.3)
            spark.range(3_000_000).selectExpr("id % 10 as key").groupBy("key").count().collect()
            time.sleep(0.3)
        stop.set()
        viewer.join()
        print(f"3. telemetry: {telemetry.published} messages published, {telemetry.dropped} dropped")
    finally:
        spark.stop()
        for topic in ("imu", "orders", "spark.telemetry"):
            node.unlink_topic(topic)
        kickmsg.Registry.unlink(prefix)  # the namespace's participant registry (layout 9's nodes list themselves)


if __name__ == "__main__":
    main()
