"""One thread, many topics: a WaitSet, with handlers in the style of a ROS
executor, then the plain ``wait()`` form.

A publisher process sends an IMU reading every 5 ms, a GPS fix every
100 ms and a speed setpoint every 2 ms. The node handles every IMU and GPS
message and, being a controller whose step takes 10 ms, only the newest
setpoint each time it wakes (read-latest). Then the same subscribers are waited on without
handlers, receiving by hand.

Run it:  python examples/waitset_handlers.py
"""
import multiprocessing
import os
import struct
import time

import kickmsg

READING = struct.Struct("<Qd")  # sequence, value
CONFIG = kickmsg.Config(max_subscribers=2, sub_ring_capacity=64, pool_size=128, max_payload_size=16)


def sensors(prefix: str, seconds: float) -> None:
    node = kickmsg.Node("sensors", prefix=prefix)
    imu, gps, setpoint = (node.advertise_or_join(topic, CONFIG) for topic in ("imu", "gps", "setpoint"))
    began = time.monotonic()
    for tick in range(int(seconds * 500)):  # every 2 ms
        time.sleep(max(0.0, began + tick * 0.002 - time.monotonic()))
        setpoint.send(READING.pack(tick, 1.0 + tick * 0.001))
        if tick % 3 == 0:
            imu.send(READING.pack(tick // 3, 9.81))
        if tick % 50 == 0:
            gps.send(READING.pack(tick // 50, 48.85))


def main() -> None:
    prefix = f"kmwaitset{os.getpid()}"
    node = kickmsg.Node("controller", prefix=prefix)
    imu, gps, setpoint = (node.subscribe_or_create(topic, CONFIG) for topic in ("imu", "gps", "setpoint"))
    publisher = multiprocessing.get_context("spawn").Process(target=sensors, args=(prefix, 2.0))
    publisher.start()
    counts = {"imu": 0, "gps": 0, "setpoint": 0}
    latest_setpoint = [0.0]

    def count(topic: str):
        def handler(message: bytes) -> None:
            counts[topic] += 1
        return handler

    def on_setpoint(message: bytes) -> None:
        counts["setpoint"] += 1
        latest_setpoint[0] = READING.unpack(message)[1]
        time.sleep(0.01)  # the control step's own work: setpoints pile up meanwhile

    try:
        with kickmsg.WaitSet() as waitset:
            # 1. Handlers: spin() calls them for each message, from this thread.
            waitset.add(imu, count("imu"))
            waitset.add(gps, count("gps"))
            waitset.add(setpoint, on_setpoint, latest=True)  # only the newest, the rest counted in skipped
            handled = waitset.spin(timeout=1.0)
            print(f"spin(1.0): {handled} messages handled: {counts}, setpoint now {latest_setpoint[0]:.3f} "
                  f"({setpoint.skipped} older setpoints skipped)")

            # 2. No handlers: wait() says which subscribers have a message; receive them yourself.
            waitset.close()
            for subscriber in (imu, gps):
                waitset.add(subscriber)
            received = {"imu": 0, "gps": 0}
            deadline = time.monotonic() + 0.5
            while time.monotonic() < deadline:
                for subscriber in waitset.wait(timeout=0.1):
                    topic = "imu" if subscriber is imu else "gps"
                    received[topic] += sum(1 for _ in subscriber)  # every message ready now
            print(f"wait() for 0.5 s: received {received}, lost {imu.lost + gps.lost}")
    finally:
        publisher.join()
        for topic in ("imu", "gps", "setpoint"):
            node.unlink_topic(topic)
        kickmsg.Registry.unlink(prefix)  # the namespace's participant registry (layout 9's nodes list themselves)


if __name__ == "__main__":
    main()
