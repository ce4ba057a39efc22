"""Health and repair (diagnose, repair_locked_entries, reset_retired_rings,
reclaim_orphaned_slots) and the read-only audit.

States are set up by poking /dev/shm/<name> through a separate mmap with
offsets from WIRE.md, and results are checked with ``rawregion`` (an
independent decoder), so these tests do not trust the package's own layout
code. Counting rules are WIRE.md's "Behaviour details of 0.1.0"; the native
0.1.0 is run on byte-for-byte copies of damaged regions for comparison, and
audits a region it created while it keeps it busy.
"""
import mmap
import os
import random
import re
import signal
import struct

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import rawregion
from conftest import on_layout4
from kickmsg import ChannelType, Config, Publisher, SchemaInfo, SharedRegion, Subscriber, audit, unlink_shm

# These tests check layout 4's own: its byte offsets (WIRE.md) and 0.1.0's repair rules.
pytestmark = on_layout4
from nativepeer import run_native, run_ours, start_native, start_ours

INVALID_SLOT = 0xFFFFFFFF
LOCKED = 0xFFFFFFFFFFFFFFFF
FREE, LIVE, DRAINING = 0, 1, 2
UNSET, CLAIMING, SET = 0, 1, 2
# commit_timeout 1 ms bounds every wait on a stuck entry or in-flight publisher.
SMALL = dict(max_subscribers=3, sub_ring_capacity=8, pool_size=16, max_payload_size=56, commit_timeout=0.001)
CAPACITY = SMALL["sub_ring_capacity"]
POOL = SMALL["pool_size"]


class Raw:
    """A region's bytes by name: offsets from WIRE.md, pokes through mmap."""

    def __init__(self, name):
        self.name = name
        self.h = rawregion.header(self.snapshot())

    def snapshot(self) -> bytes:
        return rawregion.read_bytes(self.name)

    def poke(self, offset, fmt, *values):
        with open(f"/dev/shm{self.name}", "r+b") as file, mmap.mmap(file.fileno(), 0) as memory:
            struct.pack_into(fmt, memory, offset, *values)

    # offsets
    def ring(self, index):
        return self.h["sub_rings_offset"] + index * self.h["sub_ring_stride"]

    def entry(self, ring, position):
        return self.ring(ring) + 128 + 16 * (position % self.h["sub_ring_capacity"])

    def slot(self, index):
        return self.h["pool_offset"] + index * self.h["slot_stride"]

    # pokes
    def set_ring(self, ring, state, in_flight=0, write_pos=None):
        self.poke(self.ring(ring), "<I", in_flight << 2 | state)
        if write_pos is not None:
            self.poke(self.ring(ring) + 64, "<Q", write_pos)

    def set_entry(self, ring, position, sequence, slot=INVALID_SLOT, length=0):
        self.poke(self.entry(ring, position), "<QII", sequence, slot, length)

    def set_refcount(self, slot, refcount):
        self.poke(self.slot(slot), "<I", refcount)

    def set_next_free(self, slot, next_slot):
        self.poke(self.slot(slot) + 4, "<I", next_slot)

    def set_free_top(self, slot):
        generation = self.h["free_top"] >> 32
        self.poke(768, "<Q", generation << 32 | slot)

    def set_schema_state(self, state):
        self.poke(192, "<I", state)

    def set_free_stack(self, slots):
        """Link ``slots`` top first as the free stack (INVALID_SLOT: empty)."""
        for upper, lower in zip(slots, slots[1:] + [INVALID_SLOT]):
            self.set_next_free(upper, lower)
        self.set_free_top(slots[0] if slots else INVALID_SLOT)

    # reads
    def refcount(self, slot):
        return rawregion.pool(self.snapshot()).refcounts[slot]

    def read_ring(self, ring):
        return rawregion.ring(self.snapshot(), ring)


def make(name, **changes):
    """A fresh small region and its raw view."""
    region = SharedRegion.create(name, ChannelType.PubSub, Config(**dict(SMALL, **changes)))
    return region, Raw(name)


# -- an independent model of WIRE.md's rules, over raw bytes -----------------------------------


def window(ring, capacity):
    """Positions of a ring's live window [max(0, wp - capacity), wp)."""
    return range(max(0, ring.write_pos - capacity), ring.write_pos)


def is_stuck(sequence, position, capacity):
    """LOCKED, or more than one wrap behind, in u64 arithmetic as 0.1.0 computes it."""
    return sequence == LOCKED or (sequence + capacity) % 2**64 < (position + 1) % 2**64


def expected_health(data):
    """(locked, retired, draining, live, schema_stuck) as WIRE.md counts them."""
    h = rawregion.header(data)
    capacity = h["sub_ring_capacity"]
    locked = retired = draining = live = 0
    for index in range(h["max_subs"]):
        ring = rawregion.ring(data, index)
        live += ring.state == LIVE
        retired += ring.state == FREE and ring.in_flight > 0
        draining += ring.state == DRAINING and ring.in_flight > 0
        locked += sum(is_stuck(ring.entries[p % capacity][0], p, capacity) for p in window(ring, capacity))
    return locked, retired, draining, live, h["schema_state"] == CLAIMING


def as_tuple(report):
    return (report.locked_entries, report.retired_rings, report.draining_rings, report.live_rings, report.schema_stuck)


# -- diagnose -----------------------------------------------------------------------------------


def test_diagnose_fresh_region(shm_name):
    region, _ = make(shm_name)
    assert as_tuple(region.diagnose()) == (0, 0, 0, 0, False)


def test_diagnose_counts_live_rings_of_real_subscribers(shm_name):
    region, _ = make(shm_name)
    first, second = Subscriber(region), Subscriber(region)
    Publisher(region).send(b"x")
    assert as_tuple(region.diagnose()) == (0, 0, 0, 2, False)
    first.close()
    assert as_tuple(region.diagnose()) == (0, 0, 0, 1, False)
    second.close()


# state_flight of one ring -> (retired, draining, live)
RING_STATES = {
    "free": (FREE, 0, (0, 0, 0)),
    "free_in_flight": (FREE, 1, (1, 0, 0)),
    "free_many_in_flight": (FREE, 2**30 - 1, (1, 0, 0)),
    "live": (LIVE, 0, (0, 0, 1)),
    "live_in_flight": (LIVE, 3, (0, 0, 1)),
    "draining_quiet": (DRAINING, 0, (0, 0, 0)),
    "draining_in_flight": (DRAINING, 2, (0, 1, 0)),
    "invalid_state": (3, 0, (0, 0, 0)),
    "invalid_state_in_flight": (3, 1, (0, 0, 0)),
}


@pytest.mark.parametrize("state, in_flight, counts", RING_STATES.values(), ids=RING_STATES.keys())
def test_diagnose_ring_states(shm_name, state, in_flight, counts):
    region, raw = make(shm_name)
    raw.set_ring(1, state, in_flight)
    assert as_tuple(region.diagnose()) == (0, *counts, False)


def test_diagnose_counts_every_ring(shm_name):
    region, raw = make(shm_name, max_subscribers=6)
    for ring, (state, in_flight) in enumerate([(LIVE, 0), (FREE, 1), (FREE, 3), (DRAINING, 1), (DRAINING, 0), (LIVE, 2)]):
        raw.set_ring(ring, state, in_flight)
    assert as_tuple(region.diagnose()) == (0, 2, 1, 2, False)


@pytest.mark.parametrize("state, stuck", [(UNSET, False), (CLAIMING, True), (SET, False), (7, False)])
def test_diagnose_schema_stuck(shm_name, state, stuck):
    region, raw = make(shm_name)
    raw.set_schema_state(state)
    assert region.diagnose().schema_stuck is stuck


def test_diagnose_locked_entries_in_the_window_only(shm_name):
    """LOCKED counts inside [max(0, wp - capacity), wp), not beyond wp."""
    region, raw = make(shm_name)
    raw.set_ring(0, LIVE, write_pos=5)
    raw.set_entry(0, 1, LOCKED)  # in the window
    raw.set_entry(0, 3, LOCKED)  # in the window
    raw.set_entry(0, 6, LOCKED)  # position 6 >= write_pos: not yet claimed
    assert region.diagnose().locked_entries == 2


def test_diagnose_stale_entries_boundary(shm_name):
    """An entry is stuck when more than one wrap behind: seq + capacity < pos + 1."""
    region, raw = make(shm_name)
    raw.set_ring(0, LIVE, write_pos=24)  # window 16..23
    for position in range(16, 24):
        raw.set_entry(0, position, position + 1)  # committed: fine
    raw.set_entry(0, 16, 16 + 1 - CAPACITY)  # exactly one wrap behind: a claim in progress, fine
    raw.set_entry(0, 17, 17 - CAPACITY)  # one more behind: stuck
    raw.set_entry(0, 18, 0)  # never committed: stuck
    raw.set_entry(0, 19, 19)  # seq == pos: claimed this lap, fine
    raw.set_entry(0, 20, 20 + 100)  # ahead (impossible, but not stuck)
    assert region.diagnose().locked_entries == 2


def test_diagnose_window_before_first_wrap(shm_name):
    """Before the first wrap the window starts at 0; seq 0 there is a claim in progress."""
    region, raw = make(shm_name)
    raw.set_ring(0, LIVE, write_pos=3)
    raw.set_entry(0, 0, 0)
    raw.set_entry(0, 1, 0)
    raw.set_entry(0, 2, LOCKED)
    assert region.diagnose().locked_entries == 1


def test_diagnose_huge_write_pos_scans_one_window(shm_name):
    region, raw = make(shm_name)
    raw.set_ring(2, FREE, write_pos=2**64 - 1)  # every entry holds seq 0: all stuck
    assert region.diagnose().locked_entries == CAPACITY


def test_diagnose_is_read_only(shm_name):
    region, raw = make(shm_name)
    subscriber = Subscriber(region)
    Publisher(region).send(b"x")
    raw.set_ring(1, FREE, 2, write_pos=30)
    raw.set_ring(2, DRAINING, 1, write_pos=9)
    raw.set_entry(0, 0, LOCKED)
    raw.set_schema_state(CLAIMING)
    before = raw.snapshot()
    region.diagnose()
    assert raw.snapshot() == before
    raw.set_schema_state(UNSET)
    subscriber.close()


# Random ring words: each entry's sequence drawn relative to the position that
# maps to it, so that committed, stale, uncommitted and locked all come up.
SEQUENCE_KINDS = st.one_of(
    st.sampled_from(["committed", "one lap behind", "two laps behind", "zero", "locked", "ahead"]),
    st.integers(0, 2**64 - 1),
)


def ring_words():
    return st.tuples(
        st.sampled_from([FREE, LIVE, DRAINING, 3]),
        st.one_of(st.just(0), st.integers(0, 5)),
        st.one_of(st.integers(0, 40), st.integers(0, 2**64 - 1)),
        st.lists(
            st.tuples(SEQUENCE_KINDS, st.one_of(st.integers(0, POOL - 1), st.just(INVALID_SLOT), st.integers(0, 2**32 - 1))),
            min_size=CAPACITY,
            max_size=CAPACITY,
        ),
    )


def apply_ring_words(raw, rings):
    """Write random state, write_pos and entries into every ring."""
    for index, (state, in_flight, write_pos, entries) in enumerate(rings):
        raw.set_ring(index, state, in_flight, write_pos)
        for slot_index, (kind, slot) in enumerate(entries):
            # The latest position below write_pos that maps to this entry.
            if write_pos > slot_index:
                position = write_pos - 1 - (write_pos - 1 - slot_index) % CAPACITY
            else:
                position = slot_index
            sequence = {
                "committed": position + 1,
                "one lap behind": position + 1 - CAPACITY,
                "two laps behind": position + 1 - 2 * CAPACITY,
                "zero": 0,
                "locked": LOCKED,
                "ahead": position + 1 + CAPACITY,
            }.get(kind, kind)
            raw.set_entry(index, position, sequence % 2**64, slot, 1)


PROPERTY = settings(max_examples=60, deadline=None, database=None, suppress_health_check=list(HealthCheck))


@PROPERTY
@given(rings=st.lists(ring_words(), min_size=3, max_size=3), schema_state=st.integers(0, 3))
def test_diagnose_matches_the_wire_rules(shm_name, rings, schema_state):
    region, raw = make(shm_name)
    apply_ring_words(raw, rings)
    raw.set_schema_state(schema_state)
    before = raw.snapshot()
    assert as_tuple(region.diagnose()) == expected_health(before)
    assert raw.snapshot() == before


# -- repair_locked_entries ------------------------------------------------------------------------


def repaired_bytes(data):
    """``data`` with every stuck entry committed empty, as WIRE.md says."""
    h = rawregion.header(data)
    capacity = h["sub_ring_capacity"]
    result = bytearray(data)
    count = 0
    for index in range(h["max_subs"]):
        ring = rawregion.ring(data, index)
        base = h["sub_rings_offset"] + index * h["sub_ring_stride"] + 128
        for position in window(ring, capacity):
            if is_stuck(ring.entries[position % capacity][0], position, capacity):
                struct.pack_into("<QII", result, base + 16 * (position % capacity), position + 1, INVALID_SLOT, 0)
                count += 1
    return bytes(result), count


def test_repair_fixes_exactly_the_stuck_entries(shm_name):
    region, raw = make(shm_name)
    raw.set_ring(0, LIVE, write_pos=20)  # window 12..19
    for position in range(12, 20):
        raw.set_entry(0, position, position + 1, slot=position % POOL, length=3)
    raw.set_entry(0, 13, LOCKED, slot=5, length=7)
    raw.set_entry(0, 15, 2, slot=6, length=9)  # more than one wrap behind
    raw.set_entry(0, 17, 17 + 1 - CAPACITY, slot=7, length=1)  # one wrap behind: left alone
    raw.set_ring(1, FREE, write_pos=2)
    raw.set_entry(1, 0, LOCKED, slot=1, length=1)
    raw.set_entry(1, 5, LOCKED, slot=1, length=1)  # outside the window: left alone
    before = raw.snapshot()
    expected, count = repaired_bytes(before)
    assert count == 3
    assert region.repair_locked_entries() == 3
    assert raw.snapshot() == expected
    ring = raw.read_ring(0)
    assert ring.entries[13 % CAPACITY] == (14, INVALID_SLOT, 0)
    assert ring.entries[15 % CAPACITY] == (16, INVALID_SLOT, 0)
    assert region.diagnose().locked_entries == 0
    assert region.repair_locked_entries() == 0  # nothing left to do


def test_repair_on_a_healthy_region_writes_nothing(shm_name):
    region, raw = make(shm_name)
    subscribers = [Subscriber(region), Subscriber(region)]
    publisher = Publisher(region)
    for i in range(20):
        publisher.send(bytes([i]))
    subscribers[0].try_receive()
    before = raw.snapshot()
    assert region.repair_locked_entries() == 0
    assert raw.snapshot() == before
    for subscriber in subscribers:
        subscriber.close()


@PROPERTY
@given(rings=st.lists(ring_words(), min_size=3, max_size=3))
def test_repair_matches_the_wire_rules(shm_name, rings):
    region, raw = make(shm_name)
    apply_ring_words(raw, rings)
    expected, count = repaired_bytes(raw.snapshot())
    assert region.repair_locked_entries() == count
    assert raw.snapshot() == expected
    # Nothing stuck is left, except within a ring's capacity of the u64
    # limit, where a correct commit (sequence position + 1) still reads as
    # stuck in u64 arithmetic (LOCKED itself, or wrapping past 2**64).
    at_limit = sum(
        is_stuck((position + 1) % 2**64, position, CAPACITY)
        for _, _, write_pos, _ in rings
        for position in range(max(0, write_pos - CAPACITY), write_pos)
    )
    assert region.diagnose().locked_entries <= at_limit


def crash_residue(raw, kind):
    """A subscriber on ring 0 has read positions 0..7; a publisher then
    claimed position 8 (entry index 0) and died: either holding the entry's
    lock (LOCKED) or, in this poke, leaving it two laps behind (seq 0)."""
    raw.poke(raw.ring(0) + 64, "<Q", CAPACITY + 1)  # write_pos 9: position 8 claimed
    sequence = LOCKED if kind == "locked" else 0
    raw.poke(raw.entry(0, CAPACITY), "<Q", sequence)


@pytest.mark.parametrize("kind", ["locked", "stale"])
def test_publisher_wrapping_onto_a_repaired_entry_succeeds(shm_name, kind):
    region, raw = make(shm_name)
    subscriber = Subscriber(region)
    publisher = Publisher(region)
    for i in range(CAPACITY):
        publisher.send(b"old %d" % i)
    assert [subscriber.try_receive() for _ in range(CAPACITY)] == [b"old %d" % i for i in range(CAPACITY)]
    crash_residue(raw, kind)
    assert subscriber.try_receive() is None  # stuck behind the dead writer's entry
    assert region.diagnose().locked_entries == 1
    assert region.repair_locked_entries() == 1
    # Positions 9..16: the last one wraps onto the repaired entry.
    for i in range(CAPACITY):
        publisher.send(b"new %d" % i)
    assert publisher.dropped == 0
    assert list(subscriber) == [b"new %d" % i for i in range(CAPACITY)]
    assert subscriber.lost == 1  # the repaired, empty entry
    subscriber.close()
    # The slot the dead writer evicted (message "old 0") is now referenced by
    # nobody: the audit sees it, reclaim_orphaned_slots gives it back.
    report = audit(region)
    assert len(report.leaked_slots) == 1
    assert region.reclaim_orphaned_slots() == 1
    rawregion.assert_pool_whole(shm_name)


@pytest.mark.parametrize("kind", ["locked", "stale"])
def test_without_repair_the_wrapping_publisher_drops_once_and_self_repairs(shm_name, kind):
    """The contrast case: without repair, the publisher wrapping onto the
    entry gives up on it (one drop) and heals it for the next lap."""
    region, raw = make(shm_name)
    subscriber = Subscriber(region)
    publisher = Publisher(region)
    for i in range(CAPACITY):
        publisher.send(b"old %d" % i)
    list(subscriber)
    crash_residue(raw, kind)
    for i in range(CAPACITY):
        publisher.send(b"new %d" % i)
    assert publisher.dropped == 1
    assert region.diagnose().locked_entries == 0  # healed in place
    assert list(subscriber) == [b"new %d" % i for i in range(CAPACITY - 1)]
    for i in range(CAPACITY):
        publisher.send(b"next %d" % i)
    assert publisher.dropped == 1
    assert list(subscriber) == [b"next %d" % i for i in range(CAPACITY)]
    subscriber.close()


# -- reset_retired_rings --------------------------------------------------------------------------


@pytest.mark.parametrize("drain", [False, True])
def test_reset_retired_rings_resets_exactly_free_rings_with_in_flight(shm_name, drain):
    region, raw = make(shm_name, max_subscribers=6)
    states = [(FREE, 1), (LIVE, 2), (DRAINING, 1), (FREE, 0), (FREE, 5), (3, 1)]
    for ring, (state, in_flight) in enumerate(states):
        raw.set_ring(ring, state, in_flight, write_pos=4)
    before = raw.snapshot()
    assert region.reset_retired_rings(drain=drain) == 2
    after = raw.snapshot()
    for ring, (state, in_flight) in enumerate(states):
        now = rawregion.ring(after, ring)
        if state == FREE and in_flight:
            assert (now.state, now.in_flight) == (FREE, 0)
        else:
            assert (now.state, now.in_flight) == (state, in_flight)
    # Nothing else changed: the rings' entries here hold no slot to release.
    for ring in (0, 4):
        raw.set_ring(ring, FREE, states[ring][1])
    assert raw.snapshot() == before
    assert region.reset_retired_rings(drain=drain) == 2  # (we put them back)
    assert region.diagnose().retired_rings == 0
    assert region.reset_retired_rings(drain=drain) == 0


def retire_a_ring(region, raw, messages):
    """A subscriber on ring 0 receives ``messages`` messages while a publisher
    'dies admitted' (in_flight poked to 1); its teardown times out and leaves
    the ring retired with its references still taken. Returns the ring's
    slots."""
    subscriber = Subscriber(region)
    publisher = Publisher(region)
    for i in range(messages):
        publisher.send(bytes([i]))
    list(subscriber)  # consumed: the ring's own references remain until drain
    raw.set_ring(0, LIVE, 1)
    subscriber.close()
    assert subscriber.drain_timeouts == 1
    ring = raw.read_ring(0)
    assert (ring.state, ring.in_flight) == (FREE, 1)
    slots = [ring.entries[p % CAPACITY][1] for p in range(ring.write_pos - messages, ring.write_pos)]
    assert all(raw.refcount(slot) == 1 for slot in slots)
    return slots


def test_reset_with_drain_releases_the_ring_references(shm_name):
    region, raw = make(shm_name)
    retire_a_ring(region, raw, 5)
    assert region.diagnose().retired_rings == 1
    assert region.reset_retired_rings(drain=True) == 1
    assert (raw.read_ring(0).state, raw.read_ring(0).in_flight) == (FREE, 0)
    assert all(entry[1] == INVALID_SLOT for entry in raw.read_ring(0).entries[:5])
    rawregion.assert_pool_whole(shm_name)
    assert audit(region).clean


def test_reset_without_drain_leaves_references_until_publishers_wrap(shm_name):
    """drain=False is 0.1.0's reset: the old entries keep their slots until a
    new subscriber's traffic evicts them."""
    region, raw = make(shm_name)
    slots = retire_a_ring(region, raw, 5)
    assert region.reset_retired_rings() == 1
    assert (raw.read_ring(0).state, raw.read_ring(0).in_flight) == (FREE, 0)
    assert all(raw.refcount(slot) == 1 for slot in slots)
    assert len(rawregion.pool(raw.snapshot()).free_slots) == POOL - 5
    subscriber = Subscriber(region)  # the ring can be joined again
    publisher = Publisher(region)
    for i in range(CAPACITY):
        publisher.send(bytes([i]))
    assert len(list(subscriber)) == CAPACITY
    subscriber.close()
    rawregion.assert_pool_whole(shm_name)


def test_reset_with_drain_does_not_release_a_previous_subscribers_entries_twice(shm_name):
    """Entries drained by an earlier subscriber of the ring are INVALID_SLOT:
    the reset's drain of the whole window skips them."""
    region, raw = make(shm_name)
    earlier = Subscriber(region)
    publisher = Publisher(region)
    for i in range(3):
        publisher.send(bytes([i]))
    earlier.close()  # normal teardown: drains positions 0..2
    assert raw.read_ring(0).write_pos == 3
    rawregion.assert_pool_whole(shm_name)
    retire_a_ring(region, raw, 2)  # positions 3..4 under a new subscriber
    assert region.reset_retired_rings(drain=True) == 1
    rawregion.assert_pool_whole(shm_name)  # no slot released twice (a refcount would wrap)


def test_reset_with_drain_leaves_live_and_draining_rings_alone(shm_name):
    region, raw = make(shm_name)
    live = Subscriber(region)  # ring 0
    Publisher(region).send(b"kept")
    raw.set_ring(1, DRAINING, 1)
    before = raw.snapshot()
    assert region.reset_retired_rings(drain=True) == 0
    assert raw.snapshot() == before
    raw.set_ring(1, FREE, 0)
    assert live.try_receive() == b"kept"
    live.close()
    rawregion.assert_pool_whole(shm_name)


def test_reset_with_drain_skips_locked_entries(shm_name):
    region, raw = make(shm_name)
    slots = retire_a_ring(region, raw, 3)
    raw.set_entry(0, 1, LOCKED, slot=slots[1], length=1)  # the dead publisher's claim
    assert region.reset_retired_rings(drain=True) == 1
    assert raw.refcount(slots[0]) == 0 and raw.refcount(slots[2]) == 0
    assert raw.refcount(slots[1]) == 1  # not released: a LOCKED entry holds no reference
    assert raw.read_ring(0).entries[1][0] == LOCKED


# -- reclaim_orphaned_slots -----------------------------------------------------------------------


def test_reclaim_orphaned_slots_exactly_the_unreferenced_ones(shm_name):
    region, raw = make(shm_name)
    raw.set_free_top(INVALID_SLOT)  # every slot off the stack, refcount 0
    raw.set_ring(0, LIVE, write_pos=12)  # window 4..11
    raw.set_ring(1, FREE, write_pos=3)  # window 0..2
    raw.set_entry(0, 4, 5, slot=1, length=1)  # committed: references slot 1
    raw.set_entry(0, 5, 6 + CAPACITY, slot=2, length=1)  # seq > pos + 1: still counts as referenced
    raw.set_entry(0, 6, LOCKED, slot=3, length=1)  # locked: no reference
    raw.set_entry(0, 7, 7, slot=4, length=1)  # uncommitted (seq == pos): no reference
    raw.set_entry(1, 4, 5, slot=5, length=1)  # beyond ring 1's write_pos: no reference
    raw.set_entry(1, 0, 1, slot=6, length=1)  # committed in a Free ring: referenced
    raw.set_entry(1, 1, 2, slot=INVALID_SLOT, length=0)  # repaired/drained entry
    refcounts = {1: 1, 2: 1, 3: 1, 4: 2, 5: 3, 6: 1, 7: 1, 8: 0}
    for slot, refcount in refcounts.items():
        raw.set_refcount(slot, refcount)
    rings_before = raw.snapshot()[raw.h["sub_rings_offset"] : raw.h["pool_offset"]]

    assert region.reclaim_orphaned_slots() == 4  # slots 3, 4, 5, 7

    data = raw.snapshot()
    pool = rawregion.pool(data)
    assert not pool.cycle and not pool.out_of_range
    assert sorted(pool.free_slots) == [3, 4, 5, 7]
    assert {slot: pool.refcounts[slot] for slot in refcounts} == {1: 1, 2: 1, 3: 0, 4: 0, 5: 0, 6: 1, 7: 0, 8: 0}
    assert data[raw.h["sub_rings_offset"] : raw.h["pool_offset"]] == rings_before  # rings untouched
    assert region.reclaim_orphaned_slots() == 0


def test_reclaim_orphaned_slots_on_a_healthy_quiet_region_writes_nothing(shm_name):
    region, raw = make(shm_name)
    subscribers = [Subscriber(region), Subscriber(region)]
    publisher = Publisher(region)
    for i in range(11):
        publisher.send(bytes([i]))
    subscribers[1].try_receive()
    before = raw.snapshot()
    assert region.reclaim_orphaned_slots() == 0
    assert raw.snapshot() == before
    for subscriber in subscribers:
        subscriber.close()
    rawregion.assert_pool_whole(shm_name)


@PROPERTY
@given(
    rings=st.lists(ring_words(), min_size=3, max_size=3),
    refcounts=st.lists(st.sampled_from([0, 0, 1, 2, 3, 2**32 - 1]), min_size=POOL, max_size=POOL),
    free=st.lists(st.integers(0, POOL - 1), unique=True, max_size=POOL),
)
def test_reclaim_orphaned_slots_matches_the_wire_rules(shm_name, rings, refcounts, free):
    """Random rings and refcounts; a free stack of slots with refcount 0."""
    region, raw = make(shm_name)
    apply_ring_words(raw, rings)
    for slot in free:
        refcounts[slot] = 0
    for slot, refcount in enumerate(refcounts):
        raw.set_refcount(slot, refcount)
    raw.set_free_stack(free)
    data = raw.snapshot()
    referenced = set()
    for index in range(3):
        ring = rawregion.ring(data, index)
        for position in window(ring, CAPACITY):
            sequence, slot, _ = ring.entries[position % CAPACITY]
            if sequence >= position + 1 and sequence != LOCKED:
                referenced.add(slot)
    orphans = {slot for slot, refcount in enumerate(refcounts) if refcount and slot not in referenced}

    assert region.reclaim_orphaned_slots() == len(orphans)

    after = raw.snapshot()
    pool = rawregion.pool(after)
    assert not pool.cycle and not pool.out_of_range
    assert sorted(pool.free_slots) == sorted(orphans | set(free))
    assert pool.refcounts == [0 if slot in orphans else refcount for slot, refcount in enumerate(refcounts)]
    rings_area = slice(raw.h["sub_rings_offset"], raw.h["pool_offset"])
    assert after[rings_area] == data[rings_area]


# -- the operator runbook on real crash residue ---------------------------------------------------

CRASHING_PUBLISHER = r"""
from kickmsg.verify import faults
region = kickmsg.SharedRegion.open(P["name"])
publisher = kickmsg.Publisher(region)
for i in range(3):
    publisher.send(b"before %d" % i)
faults.crash_at(region, P["point"], notify=lambda point: ready())
publisher.send(b"never committed")
"""


@pytest.mark.timeout(60)
@pytest.mark.parametrize(
    "point, locked, retired",
    [("after_refcount", 0, 0), ("mid_ring_loop", 0, 0), ("after_claim", 0, 1), ("holding_lock", 1, 1)],
)
def test_runbook_recovers_from_a_publisher_killed_mid_publish(shm_name, point, locked, retired):
    """diagnose -> repair -> (subscribers leave) -> reset_retired_rings(drain)
    -> reclaim_orphaned_slots leaves a whole pool and a clean audit."""
    region, raw = make(shm_name)
    subscribers = [Subscriber(region), Subscriber(region)]
    with start_ours(CRASHING_PUBLISHER, name=shm_name, point=point) as child:
        child.wait_ready()  # stopped (or about to stop) at the crash point
        os.kill(child.proc.pid, signal.SIGKILL)
        child.proc.wait(timeout=10)
    for subscriber in subscribers:
        assert len(list(subscriber)) >= 3
    assert as_tuple(region.diagnose()) == (locked, 0, 0, 2, False)
    assert not audit(region).clean  # the dead publisher's slot is leaked
    assert region.repair_locked_entries() == locked
    for subscriber in subscribers:
        subscriber.close()
    assert region.diagnose().retired_rings == retired
    assert region.reset_retired_rings(drain=True) == retired
    assert region.reclaim_orphaned_slots() >= 1
    assert as_tuple(region.diagnose()) == (0, 0, 0, 0, False)
    report = audit(region)
    assert report.clean, report.verdict
    rawregion.assert_pool_whole(shm_name)


@pytest.mark.timeout(60)
def test_a_publisher_killed_after_pop_leaks_one_unrecoverable_slot(shm_name):
    """The spec's one unrecoverable leak: popped, refcount still 0, in no
    ring. The audit shows it as 'being written'; GC cannot tell it apart."""
    region, raw = make(shm_name)
    subscriber = Subscriber(region)
    with start_ours(CRASHING_PUBLISHER, name=shm_name, point="after_pop") as child:
        child.wait_ready()
        os.kill(child.proc.pid, signal.SIGKILL)
        child.proc.wait(timeout=10)
    subscriber.close()
    assert region.reclaim_orphaned_slots() == 0
    report = audit(region)
    assert len(report.being_written) == 1 and report.unreferenced_slots == report.being_written
    assert "unreferenced slots: 1" in report.verdict and "being written" not in report.verdict
    assert "re-create the channel" in report.fixes(shm_name)[0]  # layout 4: no repair tells it from a paused publisher's
    assert report.free_slots == POOL - 1


# -- safety contracts in the docstrings -----------------------------------------------------------


def words(text):
    return re.sub(r"\s+", " ", text or "").lower()


@pytest.mark.parametrize(
    "method, phrases",
    [
        (SharedRegion.diagnose, ["read-only", "safe under live traffic"]),
        (SharedRegion.repair_locked_entries, ["safe under live traffic", "returns the number"]),
        (SharedRegion.reset_retired_rings, ["only safe once the crashed publisher is known to be gone", "drain=true"]),
        (SharedRegion.reclaim_orphaned_slots, ["not safe under live traffic", "publisher", "sampleview"]),
        (audit, ["without writing"]),
    ],
    ids=lambda value: getattr(value, "__name__", None),
)
def test_docstrings_state_the_safety_contract(method, phrases):
    for phrase in phrases:
        assert phrase in words(method.__doc__), f"{method.__name__} docstring lacks {phrase!r}"


# -- audit ----------------------------------------------------------------------------------------


def audited(region, raw):
    """audit(region), checking that it wrote nothing."""
    before = raw.snapshot()
    report = audit(region)
    assert raw.snapshot() == before, "audit wrote into the region"
    assert report.verdict.startswith("clean: " if report.clean else "DAMAGED: ")
    return report


def test_audit_fresh_region_is_clean(shm_name):
    region, raw = make(shm_name)
    report = audited(region, raw)
    assert report.clean
    assert report.free_slots == POOL and report.pool_size == POOL
    assert report.being_written == [] and report.leaked_slots == []
    assert report.rings == [] and report.idle_rings == 3  # Free, never written: counted, not listed
    assert report.schema_state == "Unset"
    assert report.verdict == f"clean: {POOL} of {POOL} slots free, 0 live rings"


def test_audit_with_subscribers_and_messages_at_quiescence_is_clean(shm_name):
    region, raw = make(shm_name)
    first, second = Subscriber(region), Subscriber(region)
    publisher = Publisher(region)
    for i in range(5):
        publisher.send(bytes([i]))
    first.try_receive(), first.try_receive()
    report = audited(region, raw)
    assert report.clean, report.verdict
    assert report.free_slots == POOL - 5
    assert [(r.state, r.write_pos, r.references) for r in report.rings] == [("Live", 5, 5), ("Live", 5, 5)]
    assert report.idle_rings == 1
    assert "2 live rings" in report.verdict
    first.close(), second.close()
    assert audited(region, raw).free_slots == POOL


def test_audit_with_a_wrapped_ring_is_clean(shm_name):
    region, raw = make(shm_name)
    subscriber = Subscriber(region)
    publisher = Publisher(region)
    for i in range(3 * CAPACITY + 3):
        publisher.send(bytes([i]))
    report = audited(region, raw)
    assert report.clean, report.verdict
    assert report.rings[0].references == CAPACITY
    subscriber.close()


def test_audit_reports_a_live_view_as_leaked_until_released(shm_name):
    region, raw = make(shm_name)
    subscriber = Subscriber(region)
    Publisher(region).send(b"pinned")
    view = subscriber.try_receive_view()
    slot = raw.read_ring(0).entries[0][1]
    report = audited(region, raw)
    assert report.leaked_slots == [slot]
    assert "leaked slots: 1" in report.verdict
    view.release()
    assert audited(region, raw).clean
    subscriber.close()


def test_audit_reports_an_allocated_slot_as_being_written(shm_name):
    region, raw = make(shm_name)
    publisher = Publisher(region)
    pending = publisher.allocate(4)
    report = audited(region, raw)
    assert not report.clean and len(report.being_written) == 1  # held still, as a live view's pin: counted
    assert report.free_slots == POOL - 1
    pending.publish()  # no subscriber: straight back to the pool
    assert audited(region, raw).being_written == []


# Each case: a poke on a region where ring 0 is Live and holds messages 0..2
# (slots on entries 0..2, refcount 1), and what the audit must report.
def damage_free_stack_cycle(raw, top, slots):
    below = rawregion.pool(raw.snapshot()).free_slots[3]
    raw.set_next_free(below, top)


def damage_link_out_of_range(raw, top, slots):
    raw.set_next_free(top, 5000)


def damage_refcount_on_the_stack(raw, top, slots):
    raw.set_refcount(top, 1)


def damage_referenced_slot_on_the_stack(raw, top, slots):
    raw.set_next_free(slots[0], top)  # slot 0's message is pushed while still in the ring
    raw.set_free_top(slots[0])


def damage_refcount_above(raw, top, slots):
    raw.set_refcount(slots[1], 3)


def damage_refcount_below(raw, top, slots):
    raw.set_refcount(slots[1], 0)


# (Damage to an entry also drops its slot's refcount to 0, so that the slot
# is merely "being written" and not leaked as well.)
def damage_locked_entry(raw, top, slots):
    raw.set_entry(0, 2, LOCKED, slots[2], 1)
    raw.set_refcount(slots[2], 0)


def damage_stale_entry(raw, top, slots):
    raw.poke(raw.ring(0) + 64, "<Q", 3 + 2 * CAPACITY)  # write_pos: entries now far behind
    for slot in slots:
        raw.set_refcount(slot, 0)


def damage_slot_out_of_range(raw, top, slots):
    raw.set_entry(0, 1, 2, 9999, 1)
    raw.set_refcount(slots[1], 0)


def damage_retired_ring(raw, top, slots):
    raw.set_ring(1, FREE, 1)


def damage_draining_in_flight(raw, top, slots):
    raw.set_ring(2, DRAINING, 2)


def damage_invalid_ring_state(raw, top, slots):
    raw.set_ring(2, 3, 0)


def damage_claiming_schema(raw, top, slots):
    raw.set_schema_state(CLAIMING)


def ring_of(report, index):
    """The audit of ring ``index`` (idle rings are not in report.rings)."""
    [ring] = [ring for ring in report.rings if ring.index == index]
    return ring


DAMAGE = {
    "free_stack_cycle": (damage_free_stack_cycle, lambda r: "cycle" in r.free_stack_problems[0], "free-stack problems: 1"),
    "link_out_of_range": (damage_link_out_of_range, lambda r: "5000" in r.free_stack_problems[0], "free-stack problems: 1"),
    "refcount_on_the_stack": (damage_refcount_on_the_stack, lambda r: len(r.double_free_candidates) == 1, "double-free candidates: 1"),
    "referenced_slot_on_the_stack": (
        damage_referenced_slot_on_the_stack,
        lambda r: len(r.double_free_candidates) == 1,
        "double-free candidates: 1",
    ),
    "refcount_above_references": (damage_refcount_above, lambda r: len(r.leaked_slots) == 1, "leaked slots: 1"),
    "refcount_below_references": (damage_refcount_below, lambda r: len(r.under_referenced_slots) == 1, "under-referenced slots: 1"),
    "locked_entry": (damage_locked_entry, lambda r: r.rings[0].locked_entries == [2], "locked entries: 1"),
    "stale_entries": (damage_stale_entry, lambda r: len(r.rings[0].stale_entries) == CAPACITY, f"stale entries: {CAPACITY}"),
    "entry_slot_out_of_range": (damage_slot_out_of_range, lambda r: r.rings[0].bad_entries == [1], "entries naming no slot: 1"),
    "retired_ring": (damage_retired_ring, lambda r: ring_of(r, 1).retired, "retired rings: 1"),
    "draining_in_flight": (
        damage_draining_in_flight,
        lambda r: (ring_of(r, 2).state, ring_of(r, 2).in_flight) == ("Draining", 2),
        "rings left Draining: 1",
    ),
    "invalid_ring_state": (damage_invalid_ring_state, lambda r: ring_of(r, 2).state == "invalid (3)", "rings in an invalid state: 1"),
    "claiming_schema": (damage_claiming_schema, lambda r: r.schema_state == "Claiming", "schema claims stuck at Claiming: 1"),
}


@pytest.mark.parametrize("damage, found, phrase", DAMAGE.values(), ids=DAMAGE.keys())
def test_audit_reports_damage(shm_name, damage, found, phrase):
    region, raw = make(shm_name)
    subscriber = Subscriber(region)
    publisher = Publisher(region)
    for i in range(3):
        publisher.send(bytes([i]))
    assert audited(region, raw).clean
    data = raw.snapshot()
    slots = [entry[1] for entry in rawregion.ring(data, 0).entries[:3]]
    top = rawregion.pool(data).free_slots[0]
    damage(raw, top, slots)
    report = audited(region, raw)
    assert not report.clean
    assert found(report), report
    assert phrase in report.verdict, report.verdict
    # Only this damage: nothing else is reported.
    # (a slot it takes out of use shows as unreferenced too, last)
    reported = report.verdict.removeprefix("DAMAGED: ").split("; ")[0].split(", unreferenced slots")[0]
    assert reported == phrase, report.verdict
    subscriber.close()  # (kept alive until here: its ring is part of the picture)


def test_audit_reports_several_damages_in_one_verdict(shm_name):
    region, raw = make(shm_name)
    raw.set_ring(1, FREE, 1)
    raw.set_schema_state(CLAIMING)
    raw.set_ring(0, LIVE, write_pos=1)
    raw.set_entry(0, 0, LOCKED)
    report = audited(region, raw)
    assert report.verdict.startswith("DAMAGED: locked entries: 1, retired rings: 1, schema claims stuck at Claiming: 1;")
    raw.set_schema_state(UNSET)


def test_audit_after_repairs_is_clean_again(shm_name):
    region, raw = make(shm_name)
    raw.set_ring(1, FREE, 2, write_pos=2)
    raw.set_entry(1, 0, LOCKED, 4, 1)
    raw.set_entry(1, 1, 2, 5, 1)
    raw.set_refcount(5, 1)  # held by entry 1, but ...
    raw.set_refcount(7, 2)  # ... this one is nobody's
    raw.set_free_stack([slot for slot in range(POOL) if slot not in (5, 7)])
    assert not audited(region, raw).clean
    assert region.repair_locked_entries() == 1
    assert region.reset_retired_rings(drain=True) == 1
    assert region.reclaim_orphaned_slots() == 1
    assert audited(region, raw).clean
    rawregion.assert_pool_whole(shm_name)


def test_audit_schema_states(shm_name):
    info = SchemaInfo()
    info.name = "pose"
    region = SharedRegion.create(shm_name, ChannelType.PubSub, Config(**SMALL, schema=info))
    raw = Raw(shm_name)
    assert audited(region, raw).schema_state == "Set"
    raw.set_schema_state(9)
    assert audited(region, raw).schema_state == "invalid (9)"


def test_diagnose_and_audit_through_a_read_only_attachment(shm_name):
    """SharedRegion.inspect (read-only) can diagnose and audit; the repairs,
    which would write, are refused with ValueError."""
    region, raw = make(shm_name)
    subscriber = Subscriber(region)
    Publisher(region).send(b"x")
    raw.set_ring(1, FREE, 1)
    inspected = SharedRegion.inspect(shm_name)
    assert as_tuple(inspected.diagnose()) == (0, 1, 0, 1, False)
    report = audited(inspected, raw)
    assert report.verdict.startswith("DAMAGED: retired rings: 1;")
    for repair in (inspected.repair_locked_entries, inspected.reset_retired_rings, inspected.reclaim_orphaned_slots,
                   inspected.reclaim_dead_subscribers):
        with pytest.raises(ValueError, match="read-only"):
            repair()
    raw.set_ring(1, FREE, 0)
    subscriber.close()


# -- audit on a region made by the native library ---------------------------------------------------

NATIVE_TRAFFIC = r"""
region = kickmsg.SharedRegion.create(P["name"], kickmsg.ChannelType.PubSub, make_config(P["config"]), "native")
subscribers = [kickmsg.Subscriber(region) for _ in range(2)]
publisher = kickmsg.Publisher(region)
for i in range(5):
    publisher.send(bytes([i]) * 10)
subscribers[0].try_receive()
subscribers[0].try_receive()
view = subscribers[1].try_receive_view()
ready()  # a view alive: its pin shows as a leaked slot
wait_go()
view.release()
ready()  # quiescent: clean
wait_go()
del view, subscribers
ready()  # subscribers gone: every slot free again
wait_go()
done("ok")
"""


@pytest.mark.timeout(60)
def test_audit_of_a_native_region(shm_name):
    config = {key: value for key, value in SMALL.items()}
    with start_native(NATIVE_TRAFFIC, name=shm_name, config=config) as native:
        native.wait_ready()
        region = SharedRegion.open(shm_name)
        raw = Raw(shm_name)
        report = audited(region, raw)
        assert report.leaked_slots and len(report.leaked_slots) == 1
        assert report.free_slots == POOL - 5
        native.tell()
        native.wait_ready()
        report = audited(region, raw)
        assert report.clean, report.verdict
        assert report.verdict == f"clean: {POOL - 5} of {POOL} slots free, 2 live rings"
        assert [(r.state, r.write_pos, r.references) for r in report.rings] == [("Live", 5, 5), ("Live", 5, 5)]
        assert report.idle_rings == 1
        assert as_tuple(region.diagnose()) == (0, 0, 0, 2, False)
        native.tell()
        native.wait_ready()
        report = audited(region, raw)
        assert report.clean and report.free_slots == POOL
        native.tell()
        assert native.result() == "ok"


# -- parity with the native library on damaged regions ----------------------------------------------

NATIVE_HEALTH = r"""
results = []
for name in P["names"]:
    region = kickmsg.SharedRegion.open(name)
    report = region.diagnose()
    results.append([report.locked_entries, report.retired_rings, report.draining_rings, report.live_rings,
                    report.schema_stuck, region.repair_locked_entries(), region.reset_retired_rings(),
                    region.reclaim_orphaned_slots()])
done(results)
"""


def health_and_repairs(region):
    """What NATIVE_HEALTH computes, with this package."""
    return [*as_tuple(region.diagnose()), region.repair_locked_entries(), region.reset_retired_rings(),
            region.reclaim_orphaned_slots()]


def random_damage(raw, rnd, sequence_kinds):
    """Random refcounts, a valid free stack of refcount-0 slots, random ring
    states, write positions and entries, a random schema state."""
    free = rnd.sample(range(POOL), rnd.randint(0, POOL))
    for slot in range(POOL):
        raw.set_refcount(slot, 0 if slot in free else rnd.choice([0, 0, 1, 2, 3]))
    raw.set_free_stack(free)
    for ring in range(3):
        write_pos = rnd.choice([0, 3, 8, 9, 15, 20, 31, 1000])
        raw.set_ring(ring, rnd.choice([FREE, LIVE, DRAINING]), rnd.choice([0, 0, 1, 2]), write_pos)
        for index in range(CAPACITY):
            position = write_pos - 1 - (write_pos - 1 - index) % CAPACITY if write_pos > index else index
            sequence = rnd.choice(sequence_kinds(position))
            raw.set_entry(ring, position, sequence, rnd.choice([rnd.randrange(POOL), INVALID_SLOT]), 1)
    raw.set_schema_state(rnd.choice([UNSET, CLAIMING, SET]))


def twin_regions(base, count, damage):
    """``count`` damaged regions and a byte-for-byte copy of each."""
    names = []
    for index in range(count):
        name = f"{base}_{index}"
        _, raw = make(name)
        damage(raw)
        with open(f"/dev/shm{name}_twin", "wb") as twin:
            twin.write(raw.snapshot())
        names.append(name)
    return names


@pytest.mark.timeout(60)
@pytest.mark.parametrize("seed", [1, 2, 3])
def test_health_and_repairs_match_the_native_library(shm_name, seed):
    """On the same damaged bytes, diagnose and the three repairs return what
    0.1.0 returns and leave the region byte-for-byte as 0.1.0 does."""
    rnd = random.Random(seed)

    def kinds(position):  # sequences well away from 2**64 (the u64 limit has a test of its own)
        return [position + 1, position + 1, max(0, position + 1 - CAPACITY), max(0, position + 1 - 2 * CAPACITY), 0,
                LOCKED, position + 1 + CAPACITY]

    names = twin_regions(shm_name, 30, lambda raw: random_damage(raw, rnd, kinds))
    try:
        native = run_native(NATIVE_HEALTH, names=[name + "_twin" for name in names])
        for name, expected in zip(names, native):
            assert health_and_repairs(SharedRegion.open(name)) == expected, name
            assert rawregion.read_bytes(name) == rawregion.read_bytes(name + "_twin"), name
    finally:
        for name in names:
            unlink_shm(name)
            unlink_shm(name + "_twin")


@pytest.mark.timeout(60)
def test_sequences_near_the_u64_limit_count_as_stuck_like_native(shm_name):
    def damage(raw):
        raw.set_ring(0, LIVE, write_pos=20)  # window 12..19
        for position in range(12, 20):
            raw.set_entry(0, position, position + 1, INVALID_SLOT, 0)
        raw.set_entry(0, 12, 2**64 - 3)  # (2**64 - 3 + 8) mod 2**64 = 5 < 13
        raw.set_entry(0, 14, 2**64 - CAPACITY)  # wraps to 0

    names = twin_regions(shm_name, 1, damage)
    try:
        native = run_native(NATIVE_HEALTH, names=[name + "_twin" for name in names])
        assert native[0][0] == 2  # what 0.1.0 counts
        assert health_and_repairs(SharedRegion.open(names[0])) == native[0]
        assert rawregion.read_bytes(names[0]) == rawregion.read_bytes(names[0] + "_twin")
    finally:
        unlink_shm(names[0])
        unlink_shm(names[0] + "_twin")


# -- recovery gaps: subscribers killed while leaving ------------------------------------------------

KILLED_WHILE_LEAVING = r"""
import os
from kickmsg.protocol.v4 import rings
region = kickmsg.SharedRegion.open(P["name"])
subscriber = kickmsg.Subscriber(region)
kickmsg.Publisher(region).send(b"held by the ring")
if P["at"] == "draining":  # teardown step 1 done (state -> Draining), then SIGKILL
    rings.set_state(region.core, subscriber.core.ring, 2)
else:  # the subscriber's own teardown done (ring Free), SIGKILL before anything else
    rings.leave(region.core, subscriber.core.ring, subscriber.core.start_pos, subscriber._sidecar)
done(os.getpid())
os._exit(0)  # no finalizer runs: as if killed
"""


@pytest.mark.timeout(60)
def test_ring_of_a_subscriber_killed_while_draining_can_be_recovered(shm_name):
    region, raw = make(shm_name, max_subscribers=1)
    pid = run_ours(KILLED_WHILE_LEAVING, name=shm_name, at="draining")
    assert (raw.read_ring(0).state, raw.read_ring(0).in_flight) == (DRAINING, 0)
    report = region.reclaim_dead_subscribers()
    assert report.reclaimed == [(0, pid)]
    with Subscriber(region):  # the ring is usable again
        pass
    rawregion.assert_pool_whole(shm_name)


NATIVE_SUBSCRIBER = r"""
region = kickmsg.SharedRegion.open(P["name"])
subscriber = kickmsg.Subscriber(region)
ready()
wait_go()
done("ok")
"""


@pytest.mark.timeout(60)
def test_reclaim_dead_subscribers_leaves_a_native_subscriber_alone(shm_name):
    region, raw = make(shm_name, max_subscribers=1)
    run_ours(KILLED_WHILE_LEAVING, name=shm_name, at="freed")
    assert raw.read_ring(0).state == FREE
    with start_native(NATIVE_SUBSCRIBER, name=shm_name) as native:
        native.wait_ready()  # the native subscriber is on ring 0
        report = region.reclaim_dead_subscribers()
        ring = raw.read_ring(0)
        native.tell()
        assert native.result() == "ok"
    assert report.reclaimed == [] and report.unrecorded == [0]
    assert ring.state == LIVE
