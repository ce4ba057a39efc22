"""A typed channel: numpy records, checked against the channel's type on join.

The publisher advertises an Imu record type; its fingerprints go into the
region's schema descriptor. A subscriber with the same type receives
zero-copy record arrays; one whose type differs is refused with the list of
differences. Run it:  python examples/typed_imu.py
"""
import os
import time

import kickmsg
from kickmsg import typed

Imu = typed.RecordType(
    "Imu", [("stamp_ns", "<u8"), ("accel", "<f4", (3,)), ("gyro", "<f4", (3,))]
)
ImuOld = typed.RecordType(  # an older build: no gyro, double-precision accel
    "Imu", [("stamp_ns", "<u8"), ("accel", "<f8", (3,))]
)


def main() -> None:
    node = kickmsg.Node("imu-driver", prefix=f"kmexample{os.getpid()}")
    try:
        publisher = typed.advertise(node, "imu", Imu, kickmsg.Config(max_payload_size=10 * Imu.dtype.itemsize))
        subscriber = typed.subscribe(node, "imu", Imu)
        print("channel schema:", node.topic_schema("imu"))

        publisher.send((time.monotonic_ns(), (0.1, 0.0, 9.81), (0.0, 0.0, 0.01)))
        batch = publisher.allocate(3)  # three records written in place
        batch.records["stamp_ns"] = time.monotonic_ns()
        batch.records["accel"] = [[0.1, 0.0, 9.8], [0.2, 0.0, 9.8], [0.3, 0.0, 9.8]]
        batch.publish()

        while (records := subscriber.try_receive()) is not None:
            print(f"{len(records)} record(s), over the slot itself: {not records.flags.owndata}")
            print("  accel:", records["accel"].tolist())

        try:
            typed.subscribe(node, "imu", ImuOld)
        except typed.TypeMismatchError as error:
            print("old build refused:", error)
    finally:
        node.unlink_topic("imu")
        kickmsg.Registry.unlink(node.prefix)  # the namespace's participant registry (layout 9's nodes list themselves)


if __name__ == "__main__":
    main()
