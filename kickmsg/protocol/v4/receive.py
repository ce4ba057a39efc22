"""Receiving on a layout-4 region (seed 000 "Subscriber"): the layout-4
subscriber core.

``Subscriber`` owns one ring: it joins it (``rings.join``; with none Free,
after leaving the rings of dead subscribers on their behalf), receives
(``pin_next``, receive steps 1-3: find the next committed entry, pin its
slot; then the copy and the unpin, or a ``SampleView`` that unpins when
released), skips to the newest entry, gives a WaitSet the words it sleeps
on, parks on the ring's futex (the blocking receive) and leaves
(``rings.leave``: drain and free). Its read position is private to the
process; publishers write, the subscriber only reads entries and pins or
releases slot references. ``kickmsg.Subscriber`` adds the policy.
"""
import copy
import time
from collections.abc import Callable

from kickmsg import owners, process
from kickmsg.errors import CapacityError
from kickmsg.protocol import freestack
from kickmsg.protocol.v4 import repair, rings
from kickmsg.protocol.v4.layout import (
    LOCKED_SEQUENCE,
    PAYLOAD_LEN_OFFSET,
    REFCOUNT_OFFSET,
    RING_FREE,
    RING_STATE_MASK,
    SEQUENCE_OFFSET,
    SLOT_IDX_OFFSET,
    U32_MAX,
)
from kickmsg.protocol.v4.region import Region, RingAddresses

__all__ = ["MAX_RECEIVE_ATTEMPTS", "SampleView", "Subscriber", "UNCOMMITTED_POLL_NS", "pin_next", "ring_holders"]

MAX_RECEIVE_ATTEMPTS = 64  # entries a single try_receive may skip as lost
UNCOMMITTED_POLL_NS = 1_000_000  # the nap while a claimed entry is not committed yet (its wake-up may come first)


class SampleView:
    """A received message in place: one pinned reference to its slot,
    released by ``release()`` (or when collected). Read-only
    ``memoryview(view)`` works until then."""

    __slots__ = ("_exports", "_length", "_owner_pid", "_region", "ring_pos", "slot", "valid")

    def __init__(self, region: Region, slot: int, length: int, ring_pos: int) -> None:
        self._region = region
        self.slot = slot  # the pinned slot
        self._length = length
        self.ring_pos = ring_pos
        self._exports = 0
        self.valid = True
        self._owner_pid = process.pid

    def __len__(self) -> int:
        return self._length

    def __buffer__(self, flags: int) -> memoryview:
        if not self.valid:
            raise BufferError("SampleView was released")
        self._exports += 1
        return self._region.payload_view(self.slot, self._length).toreadonly()

    def __release_buffer__(self, view: memoryview) -> None:
        self._exports -= 1
        view.release()

    def release(self) -> None:
        """Drop the pin (receive's unpin); idempotent."""
        if not self.valid:
            return
        if self._exports:
            raise BufferError(f"SampleView still has {self._exports} memoryview(s) open")
        self.valid = False
        freestack.release_slot(self._region, self.slot)

    def __del__(self) -> None:
        if self.valid and process.pid == self._owner_pid:  # dropped unreleased, and not a forked child's copy
            self.release()


class Subscriber:
    """One joined ring of a layout-4 region, and our place in it."""

    def __init__(self, region: Region) -> None:
        """Join a ring: the first Free one; with none Free, first leave the
        rings whose recorded owner died (beyond 0.1.0: a channel heals
        itself) and try once more. RuntimeError naming the holders if none
        is Free."""
        self.region = region
        joined = rings.join(region)
        if joined is None and region.mapping.shared and repair.reclaim_dead_subscribers(region)[0]:
            joined = rings.join(region)
        if joined is None:
            raise CapacityError(
                f"No free subscriber slots in {region.name}: all {region.geometry.max_subs} rings are taken or "
                f"retired ({ring_holders(region)})"
            )
        self.ring, self.start_pos = joined
        self.ring_index = self.ring.index
        self.read_pos = self.write_pos_seen = self.start_pos  # the next position to read; write_pos last seen
        self.lost = 0  # messages missed: overwritten before read, or unreadable
        self.skipped = 0  # committed messages passed over by skip_to_newest
        self.drain_timeouts = 0
        self.rewound = False  # the ring's write_pos was seen behind read_pos: re-created in place
        self.monotonic_ns: Callable[[], int] = time.monotonic_ns  # the blocking receive's clock (modelled: verify)

    def in_region(self, region: Region) -> "Subscriber":
        """This ring in ``region``, which re-created ours in place keeping
        the ring Live for us (beyond 0.1.0): the same ring, start and read
        positions and counts."""
        moved = copy.copy(self)
        moved.region, moved.ring, moved.rewound = region, region.ring(self.ring_index), False
        return moved

    def unread(self, ring_reset: bool = False) -> int:
        """Messages written to our ring that we had not read, at most a
        ring's worth (what following a re-created region counts as lost):
        up to its write_pos, or, with ``ring_reset`` (the region was
        re-created in place, its rings' contents are gone), up to the
        write_pos we last saw."""
        write_pos = self.write_pos_seen if ring_reset else self.region.atomics.load_acquire_u64(self.ring.write_pos)
        return min(max(0, write_pos - self.read_pos), self.region.geometry.capacity)

    # -- receiving -------------------------------------------------------------

    def try_receive(self) -> bytes | None:
        """The next message copied out (under the pin, then unpinned), or None."""
        region = self.region
        pinned = pin_next(region, self.ring, self)
        if pinned is None:
            return None
        slot, length, _ = pinned
        start = region.payload_offsets[slot]
        data = bytes(region.mapping.buffer[start : start + length])
        freestack.release_slot(region, slot)  # unpin
        return data

    def try_receive_view(self) -> SampleView | None:
        """The next message in place (its slot pinned until the view is released), or None."""
        region = self.region
        pinned = pin_next(region, self.ring, self)
        if pinned is None:
            return None
        return SampleView(region, *pinned)

    def skip_to_newest(self) -> None:
        """Read-latest: move read_pos to the newest committed entry of the
        ring (those passed over count in ``skipped``). Only our private read
        position moves; the ring's slot references are still released by
        eviction and drain."""
        region = self.region
        ops = region.atomics
        capacity = region.geometry.capacity
        write_pos = ops.load_acquire_u64(self.ring.write_pos)
        if write_pos - self.read_pos > capacity:  # already overwritten: lost, as in receive
            self.lost += write_pos - capacity - self.read_pos
            self.read_pos = write_pos - capacity
        # Newest first: the first entry holding its own committed sequence.
        for position in range(write_pos - 1, self.read_pos, -1):
            sequence = ops.load_acquire_u64(self.ring.entries[position & region.geometry.mask] + SEQUENCE_OFFSET)
            if sequence == position + 1:
                self.skipped += position - self.read_pos
                self.read_pos = position
                return

    # -- waiting (the blocking receive; a WaitSet's words) -------------------------

    def receive_view(self, timeout_s: float) -> SampleView | None:
        """Wait up to ``timeout_s`` seconds for the next message in place."""
        return self.receive_view_until(self.monotonic_ns() + int(timeout_s * 1e9))

    def receive(self, timeout_s: float) -> bytes | None:
        """Wait up to ``timeout_s`` seconds for the next message, copied out."""
        view = self.receive_view(timeout_s)
        if view is None:
            return None
        data = bytes(view)
        view.release()
        return data

    def receive_view_until(self, deadline_ns: int | None, latest: bool = False) -> SampleView | None:
        """The blocking receive: the next message in place (``latest``: the
        newest, as ``skip_to_newest``), parking on the ring's futex until one
        is committed or ``deadline_ns`` (``monotonic_ns``; None: none)
        passes. None then, or at once if the ring went back (``rewound``)."""
        while True:
            if latest:
                self.skip_to_newest()
            view = self.try_receive_view()
            if view is not None or not self.park(deadline_ns):
                return view

    def park(self, deadline_ns: int | None) -> bool:
        """Sleep on the ring's futex until write_pos moves or ``deadline_ns``
        passes. False (not sleeping) once the deadline has passed or the
        ring went back (re-created in place: ``rewound``); else True, to try
        a receive again."""
        remaining_ns = -1 if deadline_ns is None else deadline_ns - self.monotonic_ns()
        if deadline_ns is not None and remaining_ns <= 0:
            return False
        ops = self.region.atomics
        ring = self.ring
        ops.store_relaxed_u32(ring.has_waiter, 1)
        write_pos = ops.load_acquire_u64(ring.write_pos)
        if write_pos < self.read_pos:
            # A ring's write_pos never goes back: the region was re-created in place.
            ops.store_relaxed_u32(ring.has_waiter, 0)
            self.rewound = True
            return False
        if write_pos != self.read_pos:
            # A publisher claimed a position but has not committed it; its
            # wake-up may come before we sleep, so only nap briefly.
            remaining_ns = UNCOMMITTED_POLL_NS if remaining_ns < 0 else min(remaining_ns, UNCOMMITTED_POLL_NS)
        # The kernel returns at once if write_pos no longer equals what we saw.
        ops.futex_wait(ring.write_pos, write_pos & U32_MAX, remaining_ns)
        ops.store_relaxed_u32(ring.has_waiter, 0)
        return True

    def announce_wait(self) -> tuple[int, int, int] | None:
        """A blocking receive's steps before it sleeps, for a WaitSet that
        sleeps on many rings at once: has_waiter = 1 (relaxed), then
        write_pos (acquire). None if a receive has something to do now
        (``ready_at``); else the futex word, the value seen there and the
        longest sleep in ns (-1: no limit; a nap while a claimed entry is not
        committed yet). has_waiter stays set until ``end_wait``."""
        ops = self.region.atomics
        ops.store_relaxed_u32(self.ring.has_waiter, 1)
        write_pos = ops.load_acquire_u64(self.ring.write_pos)
        ready = self.ready_at(write_pos)
        if ready:
            return None
        return self.ring.write_pos, write_pos & U32_MAX, -1 if ready is None else UNCOMMITTED_POLL_NS

    def has_message_ready(self) -> bool:
        """Whether a receive has something to do now, looked at without
        announcing a wait (a WaitSet's spin)."""
        return bool(self.ready_at(self.region.atomics.load_acquire_u64(self.ring.write_pos)))

    def ready_at(self, write_pos: int) -> bool | None:
        """Given the ring's write_pos (just loaded, acquire): True if a
        receive has something to do now (a committed entry, the ring lapped
        us, or it went back: ``rewound``), None if the ring is empty, False
        if the next entry is claimed but not committed yet."""
        region, read_pos = self.region, self.read_pos
        if write_pos == read_pos:
            return None
        if write_pos < read_pos:
            self.rewound = True  # reset by a re-create in place
            return True
        if write_pos - read_pos > region.geometry.capacity:
            return True  # lapped: the oldest entry is there to read
        entry = self.ring.entries[read_pos & region.geometry.mask]
        sequence = region.atomics.load_acquire_u64(entry + SEQUENCE_OFFSET)
        return sequence != LOCKED_SEQUENCE and sequence > read_pos  # committed (or overwritten since)

    def end_wait(self) -> None:
        """After a WaitSet's sleep: has_waiter = 0."""
        self.region.atomics.store_relaxed_u32(self.ring.has_waiter, 0)

    # -- leaving ---------------------------------------------------------------

    def close(self, record: owners.Sidecar | None = None) -> bool:
        """Leave the ring (``rings.leave``: stop admissions, wait for
        in-flight publishers, drain, free). ``record`` holds our owner
        record: it is cleared just before the ring is Free, never
        outliving the ownership it records. False if the publishers in
        flight did not finish within commit_timeout (the ring is then left
        retired, not drained; counted in ``drain_timeouts``)."""
        left = rings.leave(self.region, self.ring, self.start_pos, record)
        self.drain_timeouts += not left
        return left


def ring_holders(region: Region) -> str:
    """Who holds the rings, for the error of a join that found none free."""
    records = owners.read_owners(region.name, region.geometry.max_subs) or []
    recorded = sum(held for _, held in records)
    retired = sum(
        region.atomics.load_acquire_u32(ring.state_flight) & RING_STATE_MASK == RING_FREE for ring in region.rings
    )
    held = region.geometry.max_subs - retired
    return (
        f"{recorded} by live subscribers of this package, {held - recorded} by subscribers that record no "
        f"owner (e.g. native ones, or ones that could not record themselves: once no process reads such a ring, "
        f"kickmsg repair --ring N --force frees it) or are leaving, {retired} retired by a timed-out teardown "
        f"(kickmsg repair --retired)"
    )


def pin_next(region: Region, ring: RingAddresses, cursor: Subscriber) -> tuple[int, int, int] | None:
    """Receive flow, steps 1-3: find the next committed entry of ``ring``
    and pin its slot. Returns (slot, payload length, ring position)."""
    ops = region.atomics
    geometry = region.geometry
    capacity, mask = geometry.capacity, geometry.mask
    for _ in range(MAX_RECEIVE_ATTEMPTS):
        # 1. Anything new? If the ring lapped us, skip to its oldest entry.
        write_pos = ops.load_acquire_u64(ring.write_pos)
        if write_pos - cursor.read_pos > capacity:
            cursor.lost += write_pos - capacity - cursor.read_pos
            cursor.read_pos = write_pos - capacity
        if cursor.read_pos >= write_pos:
            return None
        cursor.write_pos_seen = write_pos  # what a re-create in place would take from us
        # 2. Read the entry's sequence (acquire); it must be read_pos + 1.
        entry = ring.entries[cursor.read_pos & mask]
        expected = cursor.read_pos + 1
        sequence = ops.load_acquire_u64(entry + SEQUENCE_OFFSET)
        if sequence == LOCKED_SEQUENCE or sequence < expected:
            return None  # claimed but not committed yet: come back later
        if sequence > expected:
            cursor.lost += 1  # overwritten before we got to it
            cursor.read_pos += 1
            continue
        # 3. Read slot index and length; an impossible entry counts as lost.
        #    Acquire, not the spec's relaxed: to see their writer's lock (docs/explanation/verification.md: "a seqlock re-check that reads the past").
        slot = ops.load_acquire_u32(entry + SLOT_IDX_OFFSET)
        length = ops.load_acquire_u32(entry + PAYLOAD_LEN_OFFSET)
        if slot >= geometry.pool_size or length > geometry.slot_data_size:
            cursor.lost += 1
            cursor.read_pos += 1
            continue
        # Pin: refcount rc -> rc + 1, only while rc > 0 (0: freed meanwhile;
        # a saturated count can only be corruption).
        refcount_address = region.slot_addresses[slot] + REFCOUNT_OFFSET
        refcount = ops.load_relaxed_u32(refcount_address)
        pinned = False
        while 0 < refcount < U32_MAX:
            found = ops.cas_acq_rel_u32(refcount_address, refcount, refcount + 1)
            if found == refcount:
                pinned = True
                break
            refcount = found
        if not pinned:
            cursor.lost += 1
            cursor.read_pos += 1
            continue
        # Seqlock re-check: if the entry changed after we pinned, the slot
        # may hold another message by now.
        if ops.load_acquire_u64(entry + SEQUENCE_OFFSET) != sequence:
            freestack.release_slot(region, slot)
            cursor.lost += 1
            cursor.read_pos += 1
            continue
        ring_pos = cursor.read_pos
        cursor.read_pos += 1
        return slot, length, ring_pos
    return None
