"""`make demo`: several processes sharing one Kickmsg channel.

Two publisher processes send stamped messages into one channel; three
subscriber processes receive them, one of them deliberately slow. Each
subscriber has its own ring, so the slow one only loses its own messages
while the fast ones get everything. At the end every slot is back in the
pool. Run it:  python examples/demo.py
"""
import multiprocessing
import os
import statistics
import struct
import time

import kickmsg

MESSAGES_PER_PUBLISHER = 3000
PUBLISHERS = 2
RATE_HZ = 2000  # per publisher: telemetry-like traffic
MESSAGE = struct.Struct("<QII")  # publish time (monotonic ns), publisher id, sequence number


def publish(channel: str, publisher_id: int, start) -> None:
    publisher = kickmsg.Publisher(kickmsg.SharedRegion.open(channel))
    start.wait()
    began = time.monotonic()
    for sequence in range(MESSAGES_PER_PUBLISHER):
        time.sleep(max(0.0, began + sequence / RATE_HZ - time.monotonic()))
        message = MESSAGE.pack(time.monotonic_ns(), publisher_id, sequence)
        while True:
            try:
                publisher.send(message)
                break
            except BlockingIOError:  # pool dry: every slot is still referenced
                time.sleep(0.0001)


def subscribe(channel: str, label: str, pause_s: float, joined, results) -> None:
    with kickmsg.Subscriber(kickmsg.SharedRegion.open(channel)) as subscriber:
        joined.release()
        received, in_order, latencies = 0, True, []
        last_sequence = {}
        while received + subscriber.lost < PUBLISHERS * MESSAGES_PER_PUBLISHER:
            data = subscriber.receive(timeout=5.0)
            if data is None:
                break
            stamp, publisher_id, sequence = MESSAGE.unpack(data)
            latencies.append(time.monotonic_ns() - stamp)
            in_order &= sequence > last_sequence.get(publisher_id, -1)
            last_sequence[publisher_id] = sequence
            received += 1
            if pause_s:
                time.sleep(pause_s)
        median_us = statistics.median(latencies) / 1000 if latencies else float("nan")
        results.put((label, received, subscriber.lost, in_order, median_us))


def main() -> None:
    channel = f"/kickmsg_demo_{os.getpid()}"
    config = kickmsg.Config(max_subscribers=4, sub_ring_capacity=256, pool_size=1024, max_payload_size=64)
    region = kickmsg.SharedRegion.create(channel, kickmsg.ChannelType.PubSub, config, "demo")
    print(f"channel {region!r}")
    context = multiprocessing.get_context("spawn")
    joined, start, results = context.Semaphore(0), context.Event(), context.Queue()
    subscribers = [
        context.Process(target=subscribe, args=(channel, label, pause, joined, results))
        for label, pause in (("fast-1", 0), ("fast-2", 0), ("slow", 0.002))
    ]
    publishers = [context.Process(target=publish, args=(channel, i, start)) for i in range(PUBLISHERS)]
    try:
        for process in subscribers + publishers:
            process.start()
        for _ in subscribers:
            joined.acquire(timeout=30)
        began = time.monotonic()
        start.set()
        print(
            f"{PUBLISHERS} publishers x {MESSAGES_PER_PUBLISHER} messages at {RATE_HZ} Hz "
            f"-> {len(subscribers)} subscribers (one sleeps 2 ms per message)"
        )
        print(f"{'subscriber':<11}{'received':>9}{'lost':>7}{'in order':>10}{'median latency':>16}")
        for _ in subscribers:
            label, received, lost, in_order, median_us = results.get(timeout=120)
            print(f"{label:<11}{received:>9}{lost:>7}{str(in_order):>10}{median_us:>13.1f} us")
        print(f"done in {time.monotonic() - began:.2f} s")
        for process in subscribers + publishers:
            process.join(timeout=30)
        free = _free_slots(region)
        print(f"pool after everyone left: {free} of {config.pool_size} slots free")
    finally:
        for process in subscribers + publishers:
            if process.is_alive():
                process.kill()
        region.unlink()


def _free_slots(region: kickmsg.SharedRegion) -> int:
    """Walk the free stack (read-only) and count its slots."""
    from kickmsg.layout import INVALID_SLOT, NEXT_FREE_OFFSET

    ops = region.atomics
    count, slot = 0, ops.load_acquire_u64(region.free_top_address) & 0xFFFFFFFF
    while slot != INVALID_SLOT and count <= region.geometry.pool_size:
        count += 1
        slot = ops.load_relaxed_u32(region.slot_address(slot) + NEXT_FREE_OFFSET)
    return count


if __name__ == "__main__":
    main()
