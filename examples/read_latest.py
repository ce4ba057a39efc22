"""Read-latest: a controller that only cares about the newest setpoint.

A publisher thread writes setpoints at 2 kHz; the control loop runs at
50 Hz and takes the newest one each cycle with ``receive_latest``, passing
over the older ones (counted in ``skipped``, not ``lost``).
Run it:  python examples/read_latest.py
"""
import os
import struct
import threading
import time

import kickmsg

SETPOINT = struct.Struct("<Qd")  # sequence, value


def publish_setpoints(region: kickmsg.SharedRegion, stop: threading.Event) -> None:
    publisher = kickmsg.Publisher(region)
    sequence = 0
    while not stop.is_set():
        publisher.send(SETPOINT.pack(sequence, sequence * 0.001))
        sequence += 1
        time.sleep(0.0005)


def main() -> None:
    name = f"/kmexample{os.getpid()}_setpoint"
    config = kickmsg.Config(max_subscribers=2, sub_ring_capacity=64, pool_size=128, max_payload_size=16)
    region = kickmsg.SharedRegion.create(name, kickmsg.ChannelType.PubSub, config, "controller")
    subscriber = kickmsg.Subscriber(region)
    stop = threading.Event()
    writer = threading.Thread(target=publish_setpoints, args=(region, stop))
    writer.start()
    try:
        for cycle in range(10):
            time.sleep(0.02)  # the control loop's own work
            data = subscriber.receive_latest(timeout=1.0)
            sequence, value = SETPOINT.unpack(data)
            print(f"cycle {cycle}: setpoint #{sequence} = {value:.3f}  (skipped {subscriber.skipped}, lost {subscriber.lost})")
    finally:
        stop.set()
        writer.join()
        region.unlink()


if __name__ == "__main__":
    main()
