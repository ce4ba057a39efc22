"""Layout-9 flows in one process: what a corrupt or hostile region does to
them (a counted loss, an empty pool, a refused region; never a crash), and
the shared-memory effects 0.9.2 shows (WIRE9.md B.4-B.12)."""
import os

import pytest

from kickmsg.protocol.v9 import ChannelConfig, Publisher, Region, Subscriber, layout, words
from kickmsg.protocol.v9.layout import INVALID_SLOT


@pytest.fixture
def region(shm_name):
    return Region.create(shm_name, 1, ChannelConfig(2, 4, 8, 32), "flows")


def _entry(region, pos, ring=0):
    return region.entry_address(ring, pos)


def test_one_send_leaves_the_measured_words(region):
    """B.6's measurement: one subscriber of two rings, one send: refcount 1,
    payload_len 5, entry (seq 1, meta tag 1 | slot + 1), generation + 1."""
    sub = Subscriber(region)
    ops = region.atomics
    top = ops.load_acquire_u64(region.free_top_address)
    assert Publisher(region).send(b"hello") == 5
    slot = top & 0xFFFFFFFF
    assert ops.load_acquire_u64(_entry(region, 0) + layout.SEQUENCE_OFFSET) == 1
    assert ops.load_acquire_u64(_entry(region, 0) + layout.META_OFFSET) == words.pack_meta(0, slot)
    assert ops.load_acquire_u32(region.slot_address(slot) + layout.REFCOUNT_OFFSET) == 1
    assert ops.load_acquire_u32(region.slot_address(slot) + layout.PAYLOAD_LEN_OFFSET) == 5
    assert ops.load_acquire_u64(region.free_top_address) >> 32 == (top >> 32) + 1
    ring = region.ring_address(0)
    assert ops.load_acquire_u64(ring + layout.OWNER_PID_OFFSET) == os.getpid()
    assert ops.load_acquire_u64(ring + layout.OWNER_STARTTIME_OFFSET) > 0
    assert sub.try_receive() == b"hello"


def test_no_subscriber_no_delivery(region):
    assert Publisher(region).send(b"x") == 1
    stats = region.stats()
    assert stats.total_writes == 0 and stats.pool_free == 8 and stats.total_drops == 0


@pytest.mark.parametrize(
    "corrupt",
    ["slot field beyond the pool", "no claim", "refcount 0", "refcount saturated", "length beyond the slot"],
)
def test_corrupt_entries_are_counted_losses(region, corrupt):
    sub = Subscriber(region)
    pub = Publisher(region)
    pub.send(b"first")
    pub.send(b"second")
    ops = region.atomics
    meta_address = _entry(region, 0) + layout.META_OFFSET
    slot = words.meta_slot_field(ops.load_acquire_u64(meta_address)) - 1
    slot_address = region.slot_address(slot)
    if corrupt == "slot field beyond the pool":
        ops.store_release_u64(meta_address, words.pack_meta(0, 5000))
    elif corrupt == "no claim":
        ops.store_release_u64(meta_address, words.meta_tag_of(0) << 24)
    elif corrupt == "refcount 0":
        ops.store_release_u32(slot_address + layout.REFCOUNT_OFFSET, 0)
    elif corrupt == "refcount saturated":
        ops.store_release_u32(slot_address + layout.REFCOUNT_OFFSET, 0xFFFFFFFF)
    else:
        ops.store_release_u32(slot_address + layout.PAYLOAD_LEN_OFFSET, 33)
    assert sub.try_receive() == b"second"
    assert sub.lost == 1 and region.stats().rings[0].lost_count == 1


def test_hostile_write_pos_is_a_drop_not_a_crash(region):
    sub = Subscriber(region)
    region.atomics.store_release_u64(region.ring_address(0) + layout.WRITE_POS_OFFSET, layout.SEQ_VALUE_MASK)
    pub = Publisher(region)
    assert pub.publish(pub.allocate(), 0) == 0 and pub.dropped == 1
    assert sub.try_receive() is None  # the overrun is counted; the never-written entries are 'not yet'
    assert sub.lost == 2**62 - 4
    assert region.stats().pool_free == 8


def test_allocate_returns_the_previous_reservation(region):
    pub = Publisher(region)
    first = pub.allocate()
    second = pub.allocate()
    assert first != INVALID_SLOT and second != INVALID_SLOT
    assert region.stats().pool_free == 7  # the first went back
    with pytest.raises(ValueError, match="exceeds slot max_size"):
        pub.publish(second, 33)
    assert region.stats().pool_free == 8


def test_a_view_pins_its_slot_until_released(region):
    sub = Subscriber(region)
    pub = Publisher(region)
    pub.send(b"pinned")
    view = sub.try_receive_view()
    assert view is not None and view.ring_pos == 0
    with memoryview(view) as data:
        assert bytes(data) == b"pinned"
        with pytest.raises(BufferError):
            view.release()
    sub.close()  # the drain drops the ring's claim; the pin keeps the slot
    assert region.stats().pool_free == 7
    view.release()
    assert region.stats().pool_free == 8
    with pytest.raises(BufferError):
        memoryview(view)


def test_leave_drains_keeping_tags(region):
    """Drain clears the slot field only (0x...0004 -> 0x...0000)."""
    sub = Subscriber(region)
    pub = Publisher(region)
    for i in range(6):
        pub.send(b"%d" % i)
    assert region.stats().pool_free == 4
    sub.close()
    ops = region.atomics
    for pos in range(2, 6):
        assert ops.load_acquire_u64(_entry(region, pos) + layout.META_OFFSET) == words.meta_tag_of(pos) << 24
    stats = region.stats()
    assert stats.pool_free == 8 and stats.rings[0].state == "Free"
    assert ops.load_acquire_u64(region.ring_address(0) + layout.OWNER_PID_OFFSET) == 0


def test_join_takes_free_rings_only_and_says_when_none_is_left(region):
    ops = region.atomics
    # a retired ring (Free, in_flight 1) is not claimable
    ops.store_release_u32(region.ring_address(0) + layout.STATE_FLIGHT_OFFSET, layout.IN_FLIGHT_ONE)
    sub = Subscriber(region)
    assert sub.ring_index == 1
    with pytest.raises(RuntimeError, match="No free subscriber slots"):
        Subscriber(region)


def test_leave_with_a_publisher_stuck_in_flight_retires_the_ring(shm_name):
    region = Region.create(shm_name, 1, ChannelConfig(1, 4, 8, 32, commit_timeout_us=1000))
    sub = Subscriber(region)
    region.atomics.fetch_add_relaxed_u32(region.ring_address(0) + layout.STATE_FLIGHT_OFFSET, layout.IN_FLIGHT_ONE)
    assert sub.close() is False and sub.drain_timeouts == 1
    stats = region.stats()
    assert (stats.rings[0].state, stats.rings[0].in_flight) == ("Free", 1)
