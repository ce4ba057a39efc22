"""Publisher and AllocatedSlot: the publish flow.

Publish flow (spec, "Publisher"): 1. pop a free slot; 2. write the payload;
3. pre-set its refcount to max_subs; 4. push it into every Live ring with a
two-phase commit; 5. give back, in one step, the references of the rings it
was not delivered to. ``send`` and ``allocate`` do steps 1-2;
``Publisher._publish`` does steps 3-5.
"""
import errno
import os
import time
import weakref
from typing import Self
from collections.abc import Buffer

from kickmsg import owners, process, treiber
from kickmsg.atomics import Atomics
from kickmsg.audit import explain_empty_pool
from kickmsg.layout import (
    IN_FLIGHT_ONE,
    INVALID_SLOT,
    LOCKED_SEQUENCE,
    PAYLOAD_LEN_OFFSET,
    REFCOUNT_OFFSET,
    RING_LIVE,
    RING_STATE_MASK,
    SEQUENCE_OFFSET,
    SLOT_IDX_OFFSET,
    U32_MAX,
    U64_MAX,
    entry_is_stuck,
)
from kickmsg.region import SharedRegion

MAX_LOCK_ATTEMPTS = 64  # CAS attempts on a ring entry before giving up on that ring
CLOCK_CHECK_SPINS = 1024  # wait_and_capture_slot reads the clock once per this many spins


class Publisher:
    """Publishes messages into every subscriber ring of a region.

    Any number of publishers, in any processes, may share a region. A
    publisher is used by one thread at a time.

    Beyond 0.1.0: if the region is re-created under it (in place, or
    unlinked and replaced), the publisher notices within 0.1 s of sending,
    publishes into the new region from then on, and counts it in
    ``rejoined``; a slot allocated in the old region and published after
    that is not delivered and counts in ``dropped``.

    Also beyond 0.1.0: it records itself beside the region (``name``, by
    default the program's; ``kickmsg.owners``) so that tools see it, with
    its counts as of its last check-in, until it is garbage-collected or
    its process ends.
    """

    def __init__(self, region: SharedRegion, name: str | None = None):
        if not isinstance(region, SharedRegion):
            raise TypeError(f"Publisher needs a SharedRegion, got {region!r}")
        region.require_writable("publish")
        self._region = region.reopen_if_recreated() or region  # a stale region object: use what the name leads to
        self._next_check_in_ns = self._region.next_check_in_ns()
        self._dropped = 0
        self._rejoined = 0
        self._pending: weakref.ref[AllocatedSlot] | None = None  # weak reference to the AllocatedSlot not yet published
        self._sent = 0
        self._record = self._record_ourselves(name)
        self._closed = False

    @property
    def region(self) -> SharedRegion:
        """The region this publisher writes into."""
        return self._region

    @property
    def dropped(self) -> int:
        """Deliveries abandoned because the ring entry could not be locked
        (contention, or a crashed writer's entry); each is one message lost
        for one subscriber, or a slot allocated in a region that was
        re-created before it was published. A dry pool is not counted here."""
        return self._dropped

    @property
    def rejoined(self) -> int:
        """Times this publisher followed its region's name to a re-created
        region (beyond 0.1.0)."""
        return self._rejoined

    def send(self, data: Buffer) -> int:
        """Copy ``data`` (any C-contiguous bytes-like object) into a slot and
        publish it. Returns its length.

        Raises ``ValueError`` if it exceeds max_payload_size and
        ``BlockingIOError`` (EAGAIN) if the slot pool is empty, saying why.
        """
        size = self._send_unless_pool_empty(data)
        if size is None:
            raise BlockingIOError(errno.EAGAIN, explain_empty_pool(self._region))
        return size

    def _send_unless_pool_empty(self, data: Buffer) -> int | None:
        """``send`` without the explanation of an empty pool (one look at
        the whole region): None then. For callers that retry."""
        self._check_open()
        if time.monotonic_ns() >= self._next_check_in_ns:
            self._follow_if_recreated()
        region = self._region
        # Bytes are copied as they are; any other buffer as its raw bytes.
        payload = data if isinstance(data, (bytes, bytearray)) else memoryview(data).cast("B")
        size = len(payload)
        if size > region.geometry.slot_data_size:
            raise ValueError(
                f"message too large: {size} bytes exceeds max_payload_size "
                f"{region.geometry.slot_data_size} of {region.name}"
            )
        # 1. Pop a free slot.
        slot = treiber.pop(region)
        if slot == INVALID_SLOT:
            return None
        # 2. Write the payload into it.
        start = region.payload_offsets[slot]
        region.mapping.buffer[start : start + size] = payload
        self._publish(slot, size)
        return size

    def allocate(self, len: int) -> "AllocatedSlot | None":
        """Reserve a slot for a ``len``-byte message to be written in place
        (``memoryview(slot)``, ``numpy.frombuffer(slot, ...)``), then call
        ``slot.publish()``. Returns None if ``len`` exceeds max_payload_size
        or the pool is empty. A slot still pending from an earlier
        ``allocate`` is given back first.
        """
        if not isinstance(len, int) or len < 0:
            raise ValueError(f"allocate needs a non-negative int length, got {len!r}")
        self._check_open()
        if time.monotonic_ns() >= self._next_check_in_ns:
            self._follow_if_recreated()
        if len > self._region.geometry.slot_data_size:
            return None
        pending = self._pending() if self._pending else None
        if pending is not None:
            pending._abandon()
        # 1. Pop a free slot; step 2 is the caller's, through the buffer.
        slot = treiber.pop(self._region)
        if slot == INVALID_SLOT:
            return None
        allocated = AllocatedSlot(self, slot, len)
        self._pending = weakref.ref(allocated)
        return allocated

    def close(self) -> None:
        """Stop publishing: give back a slot allocated and not published
        (publishing it afterwards delivers nothing) and clear this
        publisher's record, so tools no longer list it. ``send`` and
        ``allocate`` then raise ValueError. Also done by garbage collection."""
        if self._closed:
            return
        self._closed = True
        pending = self._pending() if self._pending else None
        if pending is not None:
            pending._abandon()
        if self._record is not None:
            self._record.release()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def _check_open(self) -> None:
        if self._closed:
            raise ValueError(f"this publisher of {self._region.name} is closed")

    def _record_ourselves(self, name: str | None) -> "owners.PublisherEntry | None":
        """Our publisher record, released when this object goes (None in
        private memory)."""
        if not self._region.mapping.shared:
            return None
        record = owners.PublisherEntry(self._region.name, self._region.mapping.mode, owners.program_name() if name is None else name)
        weakref.finalize(self, record.release)
        return record

    def _follow_if_recreated(self) -> None:
        """Publish into the region now under our region's name, if it was
        re-created (beyond 0.1.0); update our record's counters."""
        self._next_check_in_ns = self._region.next_check_in_ns()
        new_region = self._region.reopen_if_recreated()
        if new_region is not None:
            self._region = new_region
            self._rejoined += 1
        if self._record is not None:
            self._record.check_in(self._sent, self._dropped)

    def _publish(self, slot: int, payload_len: int) -> int:
        """Publish flow steps 3-5 for a written slot. Returns the number of
        rings it was committed to."""
        self._sent += 1
        region = self._region
        ops = region.atomics
        geometry = region.geometry
        capacity, mask, pool_size = geometry.capacity, geometry.mask, geometry.pool_size
        commit_timeout_ns = geometry.commit_timeout_us * 1000
        # 3. Pre-set the refcount to max_subs before touching any ring, so an
        #    eviction in one ring cannot free the slot while we visit the next.
        #    Release, not the spec's relaxed: a pin must see the lock that freed it (README: "a seqlock re-check that reads the past").
        ops.store_release_u32(region.slot_addresses[slot] + REFCOUNT_OFFSET, geometry.max_subs)
        delivered = 0
        excess = 0  # references held for rings we did not deliver to
        # 4. For each ring:
        for ring in region.rings:
            # Relaxed pre-check: skip rings that are not Live without an RMW.
            state_flight = ops.load_relaxed_u32(ring.state_flight)
            admitted = False
            # CAS admission: check Live and increment in_flight in one step.
            while state_flight & RING_STATE_MASK == RING_LIVE:
                found = ops.cas_acq_rel_u32(ring.state_flight, state_flight, (state_flight + IN_FLIGHT_ONE) & U32_MAX)
                if found == state_flight:
                    admitted = True
                    break
                state_flight = found
            if not admitted:
                excess += 1
                continue
            # Claim a position; its committed sequence will be position + 1.
            position = ops.fetch_add_acq_rel_u64(ring.write_pos, 1)
            entry = ring.entries[position & mask]
            sequence = (position + 1) & U64_MAX
            # If the ring wrapped: wait for the previous occupant's commit and
            # capture its slot; its release is deferred until we hold the lock.
            if position >= capacity:
                previous_sequence = position - capacity + 1
                evicted_slot = _wait_and_capture_slot(ops, entry, previous_sequence, commit_timeout_ns)
            else:
                previous_sequence = 0
                evicted_slot = INVALID_SLOT
            # Two-phase commit, phase 1: CAS-lock the entry (prev_seq -> LOCKED),
            # retrying only while another publisher holds it.
            for _ in range(MAX_LOCK_ATTEMPTS):
                found = ops.cas_acq_rel_u64(entry + SEQUENCE_OFFSET, previous_sequence, LOCKED_SEQUENCE)
                if found != LOCKED_SEQUENCE:
                    break
            committed = found == previous_sequence
            if committed:
                # Deferred release: we own the entry now. Drop this ring's
                # reference to the evicted slot, unless a subscriber's drain
                # already did (and marked the entry INVALID_SLOT).
                if evicted_slot < pool_size and ops.load_relaxed_u32(entry + SLOT_IDX_OFFSET) != INVALID_SLOT:
                    treiber.release_slot(region, evicted_slot)
                # Release, not the spec's relaxed: their readers must see our lock (README: "a seqlock re-check that reads the past").
                ops.store_release_u32(entry + SLOT_IDX_OFFSET, slot)
                ops.store_release_u32(entry + PAYLOAD_LEN_OFFSET, payload_len)
                # Phase 2: commit with a release store of the real sequence.
                ops.store_release_u64(entry + SEQUENCE_OFFSET, sequence)
                delivered += 1
            else:
                # Lock failure. Self-repair an entry that is stuck (LOCKED by a
                # crashed writer, or more than one wrap behind) so the next
                # publisher at this position does not time out too. The
                # captured slot is not released: it may belong to a newer
                # message by now (a bounded leak, recoverable by GC).
                if entry_is_stuck(found, position, capacity):
                    ops.store_relaxed_u32(entry + SLOT_IDX_OFFSET, INVALID_SLOT)
                    ops.store_relaxed_u32(entry + PAYLOAD_LEN_OFFSET, 0)
                    ops.store_release_u64(entry + SEQUENCE_OFFSET, sequence)
                self._dropped += 1
                excess += 1
            # Release admission, on every path: a draining subscriber waits
            # for in_flight to reach 0.
            ops.fetch_sub_release_u32(ring.state_flight, IN_FLIGHT_ONE)
            # Wake the subscriber only if it sleeps (skip the syscall otherwise).
            if committed and ops.load_relaxed_u32(ring.has_waiter):
                ops.futex_wake_all(ring.write_pos)
        # 5. Batch excess: one fetch_sub for all the rings not delivered to.
        if excess:
            treiber.release_slot(region, slot, excess)
        return delivered

    def __repr__(self) -> str:
        return f"Publisher(region={self._region.name!r}, dropped={self._dropped})"


def send_retrying(publisher: Publisher, data: Buffer, timeout_s: float) -> bool:
    """``publisher.send(data)``, retrying while the slot pool is empty (a
    pause of 1 ms, doubling up to 100 ms) for up to ``timeout_s`` seconds.
    False if the pool stayed empty that long. A retry reads only the free
    stack's top: why the pool is empty is never worked out."""
    deadline = time.monotonic() + timeout_s
    pause = 0.001
    while publisher._send_unless_pool_empty(data) is None:
        if time.monotonic() >= deadline:
            return False
        time.sleep(pause)
        pause = min(pause * 2, 0.1)
    return True


def _wait_and_capture_slot(ops: Atomics, entry: int, expected_sequence: int, timeout_ns: int) -> int:
    """Wait until the entry's previous occupant has committed (sequence >=
    expected and not LOCKED) and return the slot it holds; after
    ``timeout_ns`` assume that writer crashed and return ``INVALID_SLOT``."""
    deadline = None  # read the clock only once we have to wait
    spins = 0
    while True:
        sequence = ops.load_acquire_u64(entry + SEQUENCE_OFFSET)
        if sequence >= expected_sequence and sequence != LOCKED_SEQUENCE:
            return ops.load_relaxed_u32(entry + SLOT_IDX_OFFSET)
        if deadline is None:
            deadline = time.monotonic_ns() + timeout_ns
        spins += 1
        if spins % CLOCK_CHECK_SPINS == 0:
            if time.monotonic_ns() >= deadline:
                return INVALID_SLOT
            os.sched_yield()  # let a preempted writer on this CPU finish


class AllocatedSlot:
    """A slot reserved by ``Publisher.allocate``: a writable buffer of
    ``len(slot)`` bytes in shared memory, published by ``publish()``.

    Once published (or replaced by a newer ``allocate``), new buffers are
    refused with ``BufferError``. Memoryviews taken before stay usable, but
    writing through them after ``publish()`` changes a message that
    subscribers may be reading. A slot that is never published goes back to
    the pool when it is garbage collected, or replaced, and no buffer of it
    is alive.
    """

    def __init__(self, publisher: Publisher, slot: int, length: int):
        self._publisher = publisher
        self._region = publisher._region
        self._slot = slot
        self._length = length
        self._published = False
        self._abandoned = False  # replaced by a newer allocate() before publish()
        self._returned = False  # given back to the free stack
        self._exports = 0  # buffers handed out and not yet released
        self._owner_pid = process.pid

    def __len__(self) -> int:
        return self._length

    @property
    def published(self) -> bool:
        return self._published

    def publish(self) -> int:
        """Deliver the message to every Live ring; returns how many. A slot
        replaced by a newer ``allocate`` delivers nothing and returns 0."""
        if self._published:
            raise ValueError("AllocatedSlot.publish() called more than once")
        if self._region is not self._publisher._region:
            # The region was re-created since allocate(): the slot belongs
            # to the old one. Give it back there; the message is dropped.
            self._abandon()
            self._publisher._dropped += 1
            self._published = True
            return 0
        self._published = True
        if self._abandoned:
            return 0
        return self._publisher._publish(self._slot, self._length)

    def __buffer__(self, flags: int) -> memoryview:
        if self._published or self._abandoned:
            raise BufferError("AllocatedSlot has already been published; its buffer is no longer writable")
        self._exports += 1
        start = self._region.payload_offsets[self._slot]
        return self._region.mapping.buffer[start : start + self._length]

    def __release_buffer__(self, view: memoryview) -> None:
        self._exports -= 1
        self._give_back_if_abandoned()

    def _abandon(self) -> None:
        """Give up an unpublished slot (once no buffer of it is alive)."""
        if not self._published:
            self._abandoned = True
            self._give_back_if_abandoned()

    def _give_back_if_abandoned(self) -> None:
        if self._abandoned and not self._returned and self._exports == 0:
            self._returned = True
            treiber.push(self._region, self._slot)

    def __del__(self) -> None:
        if process.pid == self._owner_pid:  # not a forked child's copy
            self._abandon()

    def __repr__(self) -> str:
        return f"AllocatedSlot(len={self._length}, published={self._published}, region={self._region.name!r})"
