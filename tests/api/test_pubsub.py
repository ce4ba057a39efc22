"""Publish/receive semantics in one process: fan-out, loss, pool exhaustion,
zero-copy buffers and their lifetimes, subscriber teardown, blocking. Each
test runs on layout 4 and layout 9 (the ``layout`` fixture), but those that
read layout 4's ring entries or its words."""
import datetime
import errno
import gc
import struct
import threading
import time

import numpy as np
import pytest

import rawregion
from conftest import layout4_only
from kickmsg.atomics import Atomics
from kickmsg import AllocatedSlot, ChannelType, Config, PoolEmptyError, Publisher, SampleView, SharedRegion, Subscriber
from kickmsg.ops.audit import explain_empty_pool


pytestmark = pytest.mark.usefixtures("layout")


def make_region(name, channel_type=ChannelType.PubSub, **changes):
    fields = dict(max_subscribers=4, sub_ring_capacity=8, pool_size=64, max_payload_size=64, commit_timeout=0.01)
    fields.update(changes)
    return SharedRegion.create(name, channel_type, Config(**fields))


def free_slots(name):
    """The slots on the free stack, read independently of the package."""
    return rawregion.pool(rawregion.read_bytes(name)).free_slots


def refcount(name, slot):
    return rawregion.pool(rawregion.read_bytes(name)).refcounts[slot]


def ring_state(name, index):
    return rawregion.ring(rawregion.read_bytes(name), index)


def last_entry_slot(name, ring_index, position):
    """The slot index the ring entry at ``position`` refers to."""
    ring = ring_state(name, ring_index)
    sequence, slot, _ = ring.entries[position % len(ring.entries)]
    assert sequence == position + 1
    return slot


def drain_all(subscriber):
    return list(subscriber)


# -- delivery -----------------------------------------------------------------------


def test_fan_out_to_every_subscriber(shm_name):
    region = make_region(shm_name)
    subscribers = [Subscriber(region) for _ in range(3)]
    publisher = Publisher(region)
    messages = [f"message {i}".encode() for i in range(5)]
    for message in messages:
        assert publisher.send(message) == len(message)
    for subscriber in subscribers:
        assert drain_all(subscriber) == messages
        assert subscriber.lost == 0
    for subscriber in subscribers:
        subscriber.close()
    rawregion.assert_pool_whole(shm_name)


def test_publish_returns_rings_delivered(shm_name):
    region = make_region(shm_name)
    publisher = Publisher(region)
    slot = publisher.allocate(3)
    assert slot.publish() == 0  # nobody listening
    subscribers = [Subscriber(region) for _ in range(2)]
    slot = publisher.allocate(3)
    memoryview(slot)[:] = b"abc"
    assert slot.publish() == 2
    assert slot.published
    for subscriber in subscribers:
        assert subscriber.try_receive() == b"abc"
        subscriber.close()
    rawregion.assert_pool_whole(shm_name)


def test_send_accepts_buffers(shm_name):
    region = make_region(shm_name)
    subscriber = Subscriber(region)
    publisher = Publisher(region)
    publisher.send(bytearray(b"ba"))
    publisher.send(memoryview(b"mv"))
    publisher.send(np.arange(4, dtype=np.uint16))
    publisher.send(b"")
    assert drain_all(subscriber) == [b"ba", b"mv", np.arange(4, dtype=np.uint16).tobytes(), b""]
    subscriber.close()


def test_subscriber_sees_only_later_messages(shm_name):
    region = make_region(shm_name)
    publisher = Publisher(region)
    early = Subscriber(region)
    publisher.send(b"before")
    late = Subscriber(region)
    publisher.send(b"after")
    assert drain_all(early) == [b"before", b"after"]
    assert drain_all(late) == [b"after"]
    early.close()
    late.close()
    rawregion.assert_pool_whole(shm_name)


def test_ring_overflow_counts_lost_exactly(shm_name):
    region = make_region(shm_name, sub_ring_capacity=8, pool_size=64)
    subscriber = Subscriber(region)
    fast = Subscriber(region)
    publisher = Publisher(region)
    sent = [struct.pack("<I", i) for i in range(20)]
    for i, message in enumerate(sent):
        publisher.send(message)
        assert fast.try_receive() == message  # a fast subscriber loses nothing
    received = drain_all(subscriber)
    assert received == sent[-8:]
    assert subscriber.lost == 20 - 8
    assert fast.lost == 0
    subscriber.close()
    fast.close()
    rawregion.assert_pool_whole(shm_name)


def test_ring_pos(shm_name):
    region = make_region(shm_name, sub_ring_capacity=8)
    subscriber = Subscriber(region)
    publisher = Publisher(region)
    for i in range(3):
        publisher.send(bytes([i]))
    positions = []
    for _ in range(3):
        with subscriber.try_receive_view() as view:
            positions.append(view.ring_pos)
    assert positions == [0, 1, 2]
    for i in range(12):  # overflow: positions 3..14, only 7..14 survive
        publisher.send(bytes([i]))
    view = subscriber.try_receive_view()
    assert view.ring_pos == 7
    assert subscriber.lost == 4
    view.release()
    subscriber.close()


def test_iteration_yields_available_then_stops(shm_name):
    region = make_region(shm_name)
    subscriber = Subscriber(region)
    publisher = Publisher(region)
    assert list(subscriber) == []
    for message in (b"a", b"b", b"c"):
        publisher.send(message)
    assert list(subscriber) == [b"a", b"b", b"c"]
    assert list(subscriber) == []
    publisher.send(b"d")
    assert list(subscriber) == [b"d"]
    subscriber.close()


def test_broadcast_channel(shm_name):
    region = make_region(shm_name, ChannelType.Broadcast)
    assert region.channel_type is ChannelType.Broadcast
    members = [(Publisher(region), Subscriber(region)) for _ in range(3)]
    for i, (publisher, _) in enumerate(members):
        publisher.send(f"from {i}".encode())
    for _, subscriber in members:
        assert drain_all(subscriber) == [b"from 0", b"from 1", b"from 2"]
        subscriber.close()
    rawregion.assert_pool_whole(shm_name)


# -- errors -------------------------------------------------------------------------


@layout4_only
def test_pool_exhaustion_by_views_says_so(shm_name):
    """A ring of 2 keeps 2 slots; views held pin the others until the pool
    is empty. send's error names the pool and where to look; the audit's
    explanation names the cause: slots pinned by views."""
    region = make_region(shm_name, max_subscribers=1, sub_ring_capacity=2, pool_size=4)
    subscriber = Subscriber(region)
    publisher = Publisher(region)
    views = []
    for i in range(4):
        publisher.send(bytes([i]))
        views.append(subscriber.try_receive_view())
    assert free_slots(shm_name) == []
    with pytest.raises(PoolEmptyError) as info:
        publisher.send(b"one too many")
    assert isinstance(info.value, BlockingIOError) and info.value.errno == errno.EAGAIN
    assert f"slot pool of {shm_name} exhausted: all 4 slots in use" in str(info.value)
    assert f"kickmsg audit {shm_name}" in str(info.value)
    message = explain_empty_pool(region)
    assert f"slot pool of {shm_name} exhausted: 0 of 4 slots free, 2 held by ring entries" in message
    assert "2 only pinned by views (or leaked)" in message and "release views sooner" in message
    assert "allocated and not yet published" not in message
    assert publisher.allocate(1) is None
    assert [bytes(v) for v in views] == [bytes([i]) for i in range(4)]
    subscriber.close()
    assert free_slots(shm_name) == []  # the views still pin every slot
    for view in views:
        view.release()
    rawregion.assert_pool_whole(shm_name)


@layout4_only
def test_pool_exhaustion_by_unpublished_slots_says_so(shm_name):
    """Slots allocated and never published are named as the cause."""
    region = make_region(shm_name, max_subscribers=1, sub_ring_capacity=2, pool_size=4)
    publishers = [Publisher(region) for _ in range(4)]
    slots = [publisher.allocate(8) for publisher in publishers]
    with pytest.raises(PoolEmptyError):
        Publisher(region).send(b"no room")
    assert "4 allocated or being written" in explain_empty_pool(region)
    assert "publish or drop allocated slots" in explain_empty_pool(region)
    del slots
    gc.collect()
    rawregion.assert_pool_whole(shm_name)


def test_oversize_send(shm_name):
    region = make_region(shm_name, max_payload_size=64)
    publisher = Publisher(region)
    with pytest.raises(ValueError, match="max_payload_size"):
        publisher.send(bytes(65))
    assert publisher.send(bytes(64)) == 64
    rawregion.assert_pool_whole(shm_name)  # no subscriber: the slot went straight back


def test_oversize_allocate(shm_name):
    region = make_region(shm_name, max_payload_size=64)
    publisher = Publisher(region)
    assert publisher.allocate(65) is None
    slot = publisher.allocate(64)
    assert isinstance(slot, AllocatedSlot) and len(slot) == 64


def test_double_publish(shm_name):
    region = make_region(shm_name)
    slot = Publisher(region).allocate(4)
    slot.publish()
    with pytest.raises(ValueError, match="more than once"):
        slot.publish()


def test_closed_subscriber_refuses_receive(shm_name):
    region = make_region(shm_name)
    subscriber = Subscriber(region)
    subscriber.close()
    subscriber.close()  # idempotent
    for call in (
        subscriber.try_receive,
        subscriber.try_receive_view,
        lambda: subscriber.receive(0.01),
        lambda: subscriber.receive_view(0.01),
    ):
        with pytest.raises(ValueError):
            call()


def test_no_free_subscriber_slots(shm_name):
    region = make_region(shm_name, max_subscribers=2)
    first, second = Subscriber(region), Subscriber(region)
    with pytest.raises(RuntimeError, match="No free subscriber slots"):
        Subscriber(region)
    first.close()
    third = Subscriber(region)  # the freed ring is reusable
    second.close()
    third.close()


# -- AllocatedSlot buffers -----------------------------------------------------------------


def test_allocated_slot_buffer_rules(shm_name):
    region = make_region(shm_name)
    subscriber = Subscriber(region)
    slot = Publisher(region).allocate(5)
    view = memoryview(slot)
    assert not view.readonly and len(view) == 5
    view[:] = b"hello"
    slot.publish()
    with pytest.raises(BufferError):
        memoryview(slot)
    view.release()
    assert subscriber.try_receive() == b"hello"
    subscriber.close()
    rawregion.assert_pool_whole(shm_name)


def test_second_allocate_gives_first_slot_back(shm_name):
    region = make_region(shm_name, sub_ring_capacity=2, pool_size=4)
    publisher = Publisher(region)
    first = publisher.allocate(8)
    assert len(free_slots(shm_name)) == 3
    second = publisher.allocate(8)
    assert len(free_slots(shm_name)) == 3  # first came back, second was taken
    with pytest.raises(BufferError):
        memoryview(first)
    del first, second
    gc.collect()
    rawregion.assert_pool_whole(shm_name)


def test_second_allocate_waits_for_live_memoryview(shm_name):
    region = make_region(shm_name, sub_ring_capacity=2, pool_size=4)
    publisher = Publisher(region)
    first = publisher.allocate(8)
    view = memoryview(first)
    second = publisher.allocate(8)
    assert len(free_slots(shm_name)) == 2  # first is still being written through `view`
    view.release()
    assert len(free_slots(shm_name)) == 3
    del first, second
    gc.collect()
    rawregion.assert_pool_whole(shm_name)


def test_dropped_unpublished_slot_returns_to_pool(shm_name):
    region = make_region(shm_name)
    publisher = Publisher(region)
    slot = publisher.allocate(10)
    memoryview(slot)[:] = bytes(10)
    assert len(free_slots(shm_name)) == 63
    del slot
    gc.collect()
    rawregion.assert_pool_whole(shm_name)


@layout4_only
def test_numpy_over_allocated_slot_is_zero_copy(shm_name):
    region = make_region(shm_name)
    subscriber = Subscriber(region)
    publisher = Publisher(region)
    before = set(free_slots(shm_name))
    slot = publisher.allocate(16)
    (index,) = before - set(free_slots(shm_name))
    array = np.frombuffer(memoryview(slot), dtype=np.uint32)
    assert array.flags.writeable and not array.flags.owndata
    array[:] = [0xDEADBEEF, 1, 2, 3]
    h = rawregion.header(rawregion.read_bytes(shm_name))
    start = h["pool_offset"] + index * h["slot_stride"] + 8
    assert rawregion.read_bytes(shm_name)[start : start + 16] == struct.pack("<4I", 0xDEADBEEF, 1, 2, 3)
    slot.publish()

    view = subscriber.try_receive_view()
    received = np.asarray(view)
    assert received.dtype == np.uint8 and not received.flags.writeable and not received.flags.owndata
    assert isinstance(received.base, memoryview)
    assert np.shares_memory(array, received)
    assert received.tobytes() == struct.pack("<4I", 0xDEADBEEF, 1, 2, 3)
    array[1] = 77  # the same bytes: the subscriber's array sees the write
    assert received[4] == 77
    del array, received, view, slot
    gc.collect()
    subscriber.close()
    rawregion.assert_pool_whole(shm_name)


# -- SampleView ------------------------------------------------------------------------------


@layout4_only
def test_sample_view_basics(shm_name):
    region = make_region(shm_name, max_subscribers=1)
    subscriber = Subscriber(region)
    Publisher(region).send(b"payload")
    slot = last_entry_slot(shm_name, 0, 0)
    assert refcount(shm_name, slot) == 1  # the ring's reference
    view = subscriber.try_receive_view()
    assert isinstance(view, SampleView)
    assert view.valid and len(view) == 7 and bytes(view) == b"payload"
    assert memoryview(view).readonly
    assert refcount(shm_name, slot) == 2  # ring + pin
    view.release()
    assert not view.valid
    assert refcount(shm_name, slot) == 1
    view.release()  # idempotent: no second decrement
    assert refcount(shm_name, slot) == 1
    with pytest.raises(BufferError):
        memoryview(view)
    subscriber.close()
    rawregion.assert_pool_whole(shm_name)


@layout4_only
def test_sample_view_context_manager(shm_name):
    region = make_region(shm_name, max_subscribers=1)
    subscriber = Subscriber(region)
    Publisher(region).send(b"ctx")
    slot = last_entry_slot(shm_name, 0, 0)
    with subscriber.try_receive_view() as view:
        assert bytes(view) == b"ctx"
        assert refcount(shm_name, slot) == 2
    assert not view.valid
    assert refcount(shm_name, slot) == 1
    subscriber.close()
    rawregion.assert_pool_whole(shm_name)


@layout4_only
def test_memoryview_keeps_view_and_pin_alive(shm_name):
    region = make_region(shm_name, max_subscribers=1)
    subscriber = Subscriber(region)
    Publisher(region).send(b"kept")
    slot = last_entry_slot(shm_name, 0, 0)
    view = subscriber.try_receive_view()
    buffer = memoryview(view)
    del view
    gc.collect()
    assert refcount(shm_name, slot) == 2
    subscriber.close()  # drops the ring's reference, the pin stays
    del subscriber
    gc.collect()
    assert refcount(shm_name, slot) == 1
    assert bytes(buffer) == b"kept"
    buffer.release()
    rawregion.assert_pool_whole(shm_name)


@layout4_only
def test_memoryview_outlives_release(shm_name):
    region = make_region(shm_name, max_subscribers=1)
    subscriber = Subscriber(region)
    Publisher(region).send(b"xyz")
    slot = last_entry_slot(shm_name, 0, 0)
    view = subscriber.try_receive_view()
    buffer = memoryview(view)
    view.release()
    assert not view.valid
    assert refcount(shm_name, slot) == 2  # pinned while `buffer` lives
    assert bytes(buffer) == b"xyz"
    buffer.release()
    assert refcount(shm_name, slot) == 1
    subscriber.close()
    rawregion.assert_pool_whole(shm_name)


def test_view_outlives_subscriber_and_region(shm_name):
    region = make_region(shm_name)
    subscriber = Subscriber(region)
    Publisher(region).send(b"survivor")
    view = subscriber.try_receive_view()
    del subscriber, region
    gc.collect()
    assert bytes(view) == b"survivor"
    view.release()
    rawregion.assert_pool_whole(shm_name)


@layout4_only
def test_numpy_asarray_of_view(shm_name):
    region = make_region(shm_name, max_subscribers=1)
    subscriber = Subscriber(region)
    Publisher(region).send(np.arange(8, dtype=np.int16))
    slot = last_entry_slot(shm_name, 0, 0)
    view = subscriber.try_receive_view()
    array = np.frombuffer(view, dtype=np.int16)
    assert list(array) == list(range(8))
    view.release()
    assert refcount(shm_name, slot) == 2  # the array still pins it
    del array
    gc.collect()
    assert refcount(shm_name, slot) == 1
    subscriber.close()
    rawregion.assert_pool_whole(shm_name)


# -- teardown -----------------------------------------------------------------------------------


def test_close_frees_ring_and_drains(shm_name):
    region = make_region(shm_name)
    subscriber = Subscriber(region)
    publisher = Publisher(region)
    for i in range(5):
        publisher.send(bytes([i]))
    assert subscriber.try_receive() == b"\x00"
    assert ring_state(shm_name, 0).state == 1  # Live
    subscriber.close()
    ring = ring_state(shm_name, 0)
    assert (ring.state, ring.in_flight) == (0, 0)
    assert subscriber.drain_timeouts == 0
    rawregion.assert_pool_whole(shm_name)


def test_with_subscriber(shm_name):
    region = make_region(shm_name)
    publisher = Publisher(region)
    with Subscriber(region) as subscriber:
        assert ring_state(shm_name, 0).state == 1
        publisher.send(b"in")
        publisher.send(b"unread")
        assert subscriber.try_receive() == b"in"
    ring = ring_state(shm_name, 0)
    assert (ring.state, ring.in_flight) == (0, 0)
    rawregion.assert_pool_whole(shm_name)


def test_garbage_collected_subscriber_leaves_ring(shm_name):
    region = make_region(shm_name)
    Subscriber(region)  # dropped at once
    gc.collect()
    assert ring_state(shm_name, 0).state == 0
    Publisher(region).send(b"nobody")
    rawregion.assert_pool_whole(shm_name)


def test_drain_after_wrap(shm_name):
    """Closing after the ring wrapped releases exactly the live window."""
    region = make_region(shm_name, sub_ring_capacity=4, pool_size=16)
    subscriber = Subscriber(region)
    publisher = Publisher(region)
    for i in range(11):
        publisher.send(bytes([i]))
    assert len(free_slots(shm_name)) == 16 - 4
    subscriber.close()
    rawregion.assert_pool_whole(shm_name)


# -- blocking ------------------------------------------------------------------------------------


def test_receive_times_out(shm_name):
    region = make_region(shm_name)
    subscriber = Subscriber(region)
    assert subscriber.receive(0.02) is None
    assert subscriber.receive(datetime.timedelta(milliseconds=20)) is None
    assert subscriber.receive_view(0.02) is None
    subscriber.close()


def test_receive_returns_available_message(shm_name):
    region = make_region(shm_name)
    subscriber = Subscriber(region)
    Publisher(region).send(b"ready")
    assert subscriber.receive(5.0) == b"ready"
    Publisher(region).send(b"view")
    with subscriber.receive_view(datetime.timedelta(seconds=5)) as view:
        assert bytes(view) == b"view"
    subscriber.close()


@pytest.mark.timeout(30)
def test_blocked_receive_does_not_block_publisher(shm_name):
    region = make_region(shm_name)
    subscriber = Subscriber(region)
    publisher = Publisher(region)
    results = []
    thread = threading.Thread(target=lambda: results.append(subscriber.receive(10.0)), daemon=True)
    thread.start()
    # Wait (bounded) until the receiver has announced that it sleeps.
    for _ in range(1000):
        if ring_state(shm_name, 0).has_waiter:
            break
        time.sleep(0.005)
    assert ring_state(shm_name, 0).has_waiter == 1
    publisher.send(b"wake up")  # runs while the other thread is blocked
    thread.join(timeout=10)
    assert not thread.is_alive()
    assert results == [b"wake up"]
    assert ring_state(shm_name, 0).has_waiter == 0
    subscriber.close()
    rawregion.assert_pool_whole(shm_name)


def test_send_retrying_waits_for_a_slot_to_come_back(shm_name):
    from kickmsg.publisher import send_retrying

    region = SharedRegion.create(shm_name, ChannelType.PubSub,
                                 Config(max_subscribers=1, sub_ring_capacity=1, pool_size=2, max_payload_size=8))
    publisher, subscriber = Publisher(region), Subscriber(region)
    publisher.send(b"a")
    view = subscriber.try_receive_view()  # pins a's slot
    publisher.send(b"b")  # the ring holds b's slot: no slot is free
    assert not send_retrying(publisher, b"c", 0.01)  # still dry after the timeout
    threading.Timer(0.05, view.release).start()
    assert send_retrying(publisher, b"c", 10.0)  # sent once the view gave its slot back
    assert subscriber.try_receive() == b"c"
    assert subscriber.lost == 1  # b, overwritten by c
    subscriber.close()


class CountingAtomics(Atomics):
    """Hardware atomics that count the 32-bit loads: refcounts, ring states,
    entries' slots (the free stack's top is a 64-bit word)."""

    u32_loads = 0

    def load_acquire_u32(self, address: int) -> int:
        self.u32_loads += 1
        return super().load_acquire_u32(address)

    def load_relaxed_u32(self, address: int) -> int:
        self.u32_loads += 1
        return super().load_relaxed_u32(address)


@layout4_only
def test_send_retrying_reads_only_the_top_of_a_dry_pool(shm_name):
    """Each retry of send_retrying on an empty pool reads the free stack's
    top and nothing else: the explanation of an empty pool (a look at every
    slot and ring) was once worked out on every retry, and thrown away."""
    from kickmsg.publisher import send_retrying

    region = SharedRegion.create(shm_name, ChannelType.PubSub,
                                 Config(max_subscribers=2, sub_ring_capacity=1, pool_size=2, max_payload_size=8))
    publisher, subscriber = Publisher(region), Subscriber(region)
    publisher.send(b"a")
    view = subscriber.try_receive_view()  # pins a's slot
    publisher.send(b"b")  # the ring holds b's slot: no slot is free
    counting = CountingAtomics()
    region.core.atomics = counting
    assert not send_retrying(publisher, b"c", 0.05)
    assert counting.u32_loads == 0
    # send's error names the pool and the audit, still without a look at the slots.
    with pytest.raises(PoolEmptyError, match="exhausted: all 2 slots in use") as raised:
        publisher.send(b"c")
    assert raised.value.errno == errno.EAGAIN
    assert counting.u32_loads == 0
    view.release()
    subscriber.close()
