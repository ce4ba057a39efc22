"""The three Node patterns: PubSub (1-to-N), Broadcast (N-to-N), Mailbox (N-to-1).

A "sensor" node advertises a topic, a "planner" node subscribes to it, both
join a broadcast channel, and the planner answers a request through the
sensor's mailbox. Both nodes live in this one process here; each could be in
its own process (or use the native library) without changing a line.
Run it:  python examples/node_patterns.py
"""
import os

import kickmsg


def main() -> None:
    prefix = f"kmexample{os.getpid()}"  # keeps this run's names apart
    config = kickmsg.Config(max_subscribers=4, sub_ring_capacity=16, pool_size=64, max_payload_size=256)
    sensor = kickmsg.Node("sensor", prefix=prefix)
    planner = kickmsg.Node("planner", prefix=prefix)
    try:
        # PubSub: /{prefix}_imu, created by the publisher, opened by subscribers.
        imu = sensor.advertise("imu", config)
        readings = planner.subscribe("imu")
        imu.send(b"ax=0.1 ay=0.0 az=9.8")
        print("pubsub   :", readings.try_receive())

        # Broadcast: /{prefix}_broadcast_events; every member publishes and receives.
        sensor_events = sensor.join_broadcast("events", config)
        planner_events = planner.join_broadcast("events", config)
        sensor_events.pub.send(b"sensor: calibrated")
        planner_events.pub.send(b"planner: route ready")
        print("broadcast:", list(planner_events.sub), list(sensor_events.sub))

        # Mailbox: /{prefix}_sensor_mbx_requests, read by its owner only.
        inbox = sensor.create_mailbox("requests", config)
        planner.open_mailbox("sensor", "requests").send(b"planner: send me your rate")
        print("mailbox  :", inbox.receive(timeout=1.0))
        print(sensor, planner, sep="\n")
    finally:
        sensor.unlink_topic("imu")
        sensor.unlink_broadcast("events")
        sensor.unlink_mailbox("requests")
        kickmsg.Registry.unlink(prefix)  # the namespace's participant registry (layout 9's nodes list themselves)


if __name__ == "__main__":
    main()
