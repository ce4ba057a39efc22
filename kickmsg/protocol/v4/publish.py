"""Publishing on a layout-4 region (seed 000 "Publisher", "wait_and_capture_slot").

Publish flow: 1. pop a free slot; 2. write the payload; 3. pre-set its
refcount to max_subs; 4. push it into every Live ring with a two-phase
commit; 5. give back, in one step, the references of the rings it was not
delivered to. ``Publisher.send`` runs the whole flow; ``allocate`` (step 1)
reserves a slot whose payload its caller writes (step 2, ``payload``) and
``publish`` runs steps 3-5. Every atomic goes through the region's
``kickmsg.atomics`` door with its order in its name.
"""
import os
import time

from kickmsg.atomics import Atomics
from kickmsg.protocol import freestack
from kickmsg.protocol.v4.layout import (
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
from kickmsg.protocol.v4.region import Region

__all__ = ["CLOCK_CHECK_SPINS", "MAX_LOCK_ATTEMPTS", "Publisher", "wait_and_capture_slot"]

MAX_LOCK_ATTEMPTS = 64  # CAS attempts on a ring entry before giving up on that ring
CLOCK_CHECK_SPINS = 1024  # wait_and_capture_slot reads the clock once per this many spins


class Publisher:
    """Publishes into every Live ring of one layout-4 region."""

    def __init__(self, region: Region) -> None:
        self.region = region
        self.pending = INVALID_SLOT  # the slot allocate() reserved and publish() has not consumed
        self.dropped = 0  # deliveries abandoned: the ring entry not locked within MAX_LOCK_ATTEMPTS

    def allocate(self) -> int:
        """Step 1 for a message written in place: reserve a free slot of
        ``slot_data_size`` bytes. Its index, or ``INVALID_SLOT`` when the
        pool is empty. A previous reservation not yet published goes back
        to the pool."""
        if self.pending != INVALID_SLOT:
            self.give_back(self.pending)
        # 1. Pop a free slot.
        self.pending = freestack.pop(self.region, empty_on_corrupt_head=False)
        return self.pending

    def payload(self, slot: int, length: int) -> memoryview:
        """Step 2's buffer: the first ``length`` payload bytes of a reserved
        slot, for its caller to write."""
        start = self.region.payload_offsets[slot]
        return self.region.mapping.buffer[start : start + length]

    def give_back(self, slot: int) -> None:
        """Return a reserved slot that will not be published to the pool."""
        if slot == self.pending:
            self.pending = INVALID_SLOT
        freestack.push(self.region, slot)

    def set_aside(self, slot: int) -> None:
        """``slot`` is no longer the reservation but stays out of the pool
        (a buffer over it is still alive): ``give_back(slot)`` returns it."""
        if slot == self.pending:
            self.pending = INVALID_SLOT

    def send(self, data: bytes | bytearray | memoryview) -> int:
        """Copy ``data`` into a free slot and publish it (steps 1-5; a
        reservation is left alone): ``len(data)``. Raises ``PoolEmptyError``
        if the pool is empty."""
        region = self.region
        length = len(data)
        if length > region.geometry.slot_data_size:
            raise ValueError(f"message too large: {length} bytes exceeds max_payload_size "
                             f"{region.geometry.slot_data_size} of {region.name}")
        # 1. Pop a free slot.
        slot = freestack.pop(region, empty_on_corrupt_head=False)
        if slot == INVALID_SLOT:
            raise freestack.empty_pool_error(region)
        # 2. Write the payload into it.
        start = region.payload_offsets[slot]
        region.mapping.buffer[start : start + length] = data
        self._deliver(slot, length)
        return length

    def publish(self, slot: int, length: int) -> int:
        """Steps 3-5 for the reserved ``slot`` holding ``length`` bytes.
        Returns the rings it was committed to."""
        if slot != self.pending:
            raise ValueError(f"slot {slot} is not this publisher's reservation")
        # Too long: the slot goes back, nothing is delivered.
        if length > self.region.geometry.slot_data_size:
            self.give_back(slot)
            raise ValueError(f"publish(len) exceeds slot max_size: {length} > {self.region.geometry.slot_data_size}")
        self.pending = INVALID_SLOT
        return self._deliver(slot, length)

    def _deliver(self, slot: int, payload_len: int) -> int:
        """Steps 3-5: deliver a written slot to every Live ring; returns the
        rings it was committed to."""
        region = self.region
        ops = region.atomics
        geometry = region.geometry
        capacity, mask, pool_size = geometry.capacity, geometry.mask, geometry.pool_size
        commit_timeout_ns = geometry.commit_timeout_us * 1000
        # 3. Pre-set the refcount to max_subs before touching any ring, so an
        #    eviction in one ring cannot free the slot while we visit the next.
        #    Release, not the spec's relaxed: a pin must see the lock that freed it (docs/explanation/verification.md: "a seqlock re-check that reads the past").
        ops.store_release_u32(region.slot_addresses[slot] + REFCOUNT_OFFSET, geometry.max_subs)
        delivered = 0
        dropped = 0
        excess = 0  # references held for rings we did not deliver to
        rings = region.rings
        first_state_flight, ring_stride, max_subs = rings[0].state_flight, geometry.ring_stride, geometry.max_subs
        index = 0  # the next ring to pre-check
        # 4. For each ring:
        while index < max_subs:
            # Relaxed pre-check: skip rings that are not Live without an RMW
            # (one call reads the states up to the next Live ring).
            found = ops.find_relaxed_u32(first_state_flight, ring_stride, index, max_subs, RING_STATE_MASK, RING_LIVE)
            if found < 0:
                excess += max_subs - index  # none Live from index on
                break
            live, state_flight = found >> 32, found & U32_MAX
            excess += live - index  # the rings skipped
            index = live + 1
            ring = rings[live]
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
            # fetch_add(write_pos, 1): claim a position; its committed sequence will be position + 1.
            position = ops.fetch_add_acq_rel_u64(ring.write_pos, 1)
            entry = ring.entries[position & mask]
            sequence = (position + 1) & U64_MAX
            # If ring full (wrap): wait_and_capture_slot, the previous occupant's;
            # its release is deferred until we hold the lock.
            if position >= capacity:
                previous_sequence = position - capacity + 1
                evicted_slot = wait_and_capture_slot(ops, entry, previous_sequence, commit_timeout_ns)
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
                    freestack.release_slot(region, evicted_slot)
                # Write entry fields. Release, not the spec's relaxed: their readers must see our lock (docs/explanation/verification.md: "a seqlock re-check that reads the past").
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
                dropped += 1
                excess += 1
            # Release admission, on every path: a draining subscriber waits
            # for in_flight to reach 0.
            ops.fetch_sub_release_u32(ring.state_flight, IN_FLIGHT_ONE)
            # Wake the subscriber only if it sleeps (skip the syscall otherwise).
            if committed and ops.load_relaxed_u32(ring.has_waiter):
                ops.futex_wake_all(ring.write_pos)
        # 5. Batch excess: one fetch_sub for all the rings not delivered to.
        if excess:
            freestack.release_slot(region, slot, excess)
        self.dropped += dropped
        return delivered


def wait_and_capture_slot(ops: Atomics, entry: int, expected_sequence: int, timeout_ns: int) -> int:
    """Wait until the entry's previous occupant has committed (sequence >=
    expected and not LOCKED) and return the slot it holds; after
    ``timeout_ns`` assume that writer crashed and return ``INVALID_SLOT``."""
    deadline = None  # read the clock only once we have to wait
    spins = 0
    while True:
        sequence = ops.load_acquire_u64(entry + SEQUENCE_OFFSET)
        if sequence >= expected_sequence and sequence != LOCKED_SEQUENCE:
            return ops.load_relaxed_u32(entry + SLOT_IDX_OFFSET)  # committed: capture the old slot
        if deadline is None:
            deadline = time.monotonic_ns() + timeout_ns
        spins += 1
        if spins % CLOCK_CHECK_SPINS == 0:  # check the clock every 1024 iterations
            if time.monotonic_ns() >= deadline:
                return INVALID_SLOT  # timeout: the writer crashed
            os.sched_yield()  # let a preempted writer on this CPU finish
