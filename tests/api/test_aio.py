"""kickmsg.aio: awaiting subscribers in asyncio.

One waiter thread per event loop sleeps on the rings of every subscriber
being awaited; awaiting never takes a message out of its ring, so timeouts
and cancellations lose nothing. The three-channel test is fed by three real
publisher processes, one of them the native 0.1.0.
"""
import asyncio
import datetime
import threading
import time

import pytest

from kickmsg import Config, Node, Publisher, Subscriber, aio, typed
from nativepeer import check_payload, race, start_native, start_native9, start_ours
from test_waitset import RECREATE_AND_PUBLISH, SMALL, channels, has_waiters, waitv_path  # noqa: F401 (fixtures)

# Every test on layout 4 and layout 9 (the ``layout`` fixture), but those marked layout4_only.
pytestmark = [pytest.mark.timeout(120), pytest.mark.usefixtures("layout")]


def waiter_threads() -> list[threading.Thread]:
    return [thread for thread in threading.enumerate() if thread.name == "kickmsg.aio waiter"]


def test_receive_and_its_forms(channels, prefix):
    (region,) = channels(1)
    subscriber, publisher = Subscriber(region), Publisher(region)
    node = Node("dashboard", prefix=prefix)
    Imu = typed.RecordType("Imu", [("seq", "<u4")])
    imu_publisher = typed.advertise(node, "imu", Imu, Config(**SMALL))
    imu = typed.subscribe(node, "imu", Imu)

    async def main():
        assert await aio.receive(subscriber, timeout=0.02) is None
        assert await aio.receive(subscriber, timeout=datetime.timedelta(milliseconds=20)) is None
        asyncio.get_running_loop().call_later(0.05, publisher.send, b"copy")
        assert await aio.receive(subscriber) == b"copy"
        publisher.send(b"view")
        with await aio.receive_view(subscriber, 1.0) as view:
            assert bytes(view) == b"view"
        for number in range(3):
            publisher.send(b"%d" % number)
        assert await aio.receive_latest(subscriber, 1.0) == b"2" and subscriber.skipped == 2
        asyncio.get_running_loop().call_later(0.05, imu_publisher.send, [(7,), (8,)])
        records = await aio.receive(imu, 1.0)
        assert records["seq"].tolist() == [7, 8] and not records.flags.writeable

    asyncio.run(main())
    assert has_waiters([region]) == [0]


def test_cancelling_or_timing_out_an_await_loses_nothing(channels):
    """300 numbered messages from a thread, 1 ms apart, read by awaits that
    mostly time out or are cancelled: every message arrives, in order."""
    (region,) = channels(1, sub_ring_capacity=512, pool_size=1024)
    subscriber = Subscriber(region)

    def publish():
        publisher = Publisher(region)
        for number in range(300):
            publisher.send(b"%d" % number)
            time.sleep(0.001)

    async def main():
        received, timeouts, cancelled = [], 0, 0
        while len(received) < 300:
            if len(received) % 2:
                message = await aio.receive(subscriber, timeout=0.0005)
                timeouts += message is None
            else:
                try:
                    message = await asyncio.wait_for(aio.receive(subscriber), timeout=0.0005)
                except TimeoutError:
                    message, cancelled = None, cancelled + 1
            if message is not None:
                received.append(int(message))
        return received, timeouts, cancelled

    publisher = threading.Thread(target=publish, daemon=True)
    publisher.start()
    received, timeouts, cancelled = asyncio.run(asyncio.wait_for(main(), 60))
    publisher.join()
    assert received == list(range(300)) and subscriber.lost == 0
    assert timeouts > 0 and cancelled > 0
    assert has_waiters([region]) == [0]


def test_a_cancelled_await_leaves_the_message_for_the_next_receive(channels):
    (region,) = channels(1)
    subscriber, publisher = Subscriber(region), Publisher(region)

    async def main():
        waiting = asyncio.create_task(aio.receive(subscriber))
        await asyncio.sleep(0.05)
        assert has_waiters([region]) == [1]  # announced, asleep in the waiter thread
        waiting.cancel()
        with pytest.raises(asyncio.CancelledError):
            await waiting
        assert has_waiters([region]) == [0]
        publisher.send(b"kept")
        return await aio.receive(subscriber, 1.0)

    assert asyncio.run(main()) == b"kept"


def test_a_subscriber_is_awaited_by_one_task_at_a_time(channels):
    regions = channels(2)
    subscribers = [Subscriber(region) for region in regions]

    async def main():
        first = asyncio.create_task(aio.receive(subscribers[0], 5.0))
        await asyncio.sleep(0.02)
        with pytest.raises(RuntimeError, match="already awaited by another task"):
            await aio.receive(subscribers[0], 1.0)
        with pytest.raises(RuntimeError, match="already awaited by another task"):
            await anext(aio.messages(subscribers[1], subscribers[0]))
        assert await aio.receive(subscribers[1], 0.02) is None  # the other one is free
        Publisher(regions[0]).send(b"to the first")
        return await first

    assert asyncio.run(main()) == b"to the first"


def test_closing_the_loop_stops_the_waiter_thread(channels):
    (region,) = channels(1)
    subscriber = Subscriber(region)
    for _ in range(2):  # a loop after another: each its own waiter, gone with it
        assert asyncio.run(aio.receive(subscriber, 0.05)) is None
        for thread in waiter_threads():
            thread.join(timeout=10)
        assert waiter_threads() == []


def test_an_idle_await_uses_almost_no_cpu(channels, waitv_path):
    subscribers = [Subscriber(region) for region in channels(3)]

    async def main():
        return await asyncio.gather(*(aio.receive(subscriber, 2.0) for subscriber in subscribers))

    before = time.process_time()
    assert asyncio.run(main()) == [None, None, None]
    used = time.process_time() - before
    assert used < 0.2, f"three idle awaits of 2 s ({waitv_path}) used {used:.3f} s of CPU"


# Publishes make_payload(0 .. count - 1) in bursts of 50, 2 ms apart (so
# that the consumer both sleeps and falls behind).
BURSTS = r"""
import time
publisher = kickmsg.Publisher(kickmsg.SharedRegion.open(P["name"]))
ready()
wait_go()
for start in range(0, P["count"], 50):
    publish(publisher, range(start, min(start + 50, P["count"])), P["how"])
    time.sleep(0.002)
done({"published": P["count"]})
"""


def test_three_channels_fed_by_three_processes_one_of_them_native(channels, waitv_path, layout):
    """``aio.messages`` over three channels, each fed by a process (ours by
    copy, ours in place, native 0.1.0 or 0.9.2 as the layout): per channel,
    messages arrive in order, intact, and received + lost is exactly what
    was published."""
    count = 3000
    regions = channels(3, sub_ring_capacity=64, pool_size=256, max_payload_size=256)
    subscribers = [Subscriber(region) for region in regions]
    publishers = [
        start_ours(BURSTS, name=regions[0].name, count=count, how="send"),
        start_ours(BURSTS, name=regions[1].name, count=count, how="allocate"),
        {4: start_native, 9: start_native9}[layout](BURSTS, name=regions[2].name, count=count, how="mixed"),
    ]
    received = {subscriber: [] for subscriber in subscribers}
    for thread in waiter_threads():  # those of earlier tests' loops end within a second
        thread.join(timeout=10)
    waiters_seen = set()

    async def consume():
        async for subscriber, message in aio.messages(*subscribers):
            received[subscriber].append(check_payload(message))
            waiters_seen.update(waiter_threads())
            if all(len(received[sub]) + sub.lost == count for sub in subscribers):
                return

    async def main():
        consumer = asyncio.create_task(consume())
        await asyncio.to_thread(race, publishers)
        await asyncio.wait_for(consumer, 60)

    asyncio.run(main())
    for subscriber in subscribers:
        seqs = received[subscriber]
        assert seqs == sorted(set(seqs)) and len(seqs) + subscriber.lost == count, subscriber
        assert seqs[-1] == count - 1  # the last one is never overwritten
    assert len(waiters_seen) == 1  # one thread for the three
    assert has_waiters(regions) == [0, 0, 0]


def test_an_await_follows_a_region_recreated_under_it(channels):
    (region,) = channels(1)
    subscriber = Subscriber(region)
    config = dict(SMALL, sub_ring_capacity=16, pool_size=32)
    with start_ours(RECREATE_AND_PUBLISH, name=region.name, config=config) as peer:
        peer.wait_ready()
        peer.tell()
        message = asyncio.run(aio.receive(subscriber, 20))
        peer.result()
    assert message == b"in the new region" and subscriber.rejoined == 1
