"""Publishing on a layout-9 region (WIRE9.md B.5-B.9, B.15).

``Publisher.publish`` is the whole per-message flow: admission, position claim,
wait for the previous commit, position-tagged lock (the words: ``words``),
self-repair by stealing a lock proven stable for a commit timeout, claim takeover,
commit by CAS, the seq_cst fence and the waiter check. Step letters are B.6's;
every atomic goes through the region's ``kickmsg.atomics`` door, its order in its name."""
import os

from kickmsg.protocol import freestack
from kickmsg.protocol.v9.layout import (
    DROPPED_COUNT_OFFSET,
    HAS_WAITER_OFFSET,
    IN_FLIGHT_ONE,
    INVALID_SLOT,
    META_OFFSET,
    PAYLOAD_LEN_OFFSET,
    REFCOUNT_OFFSET,
    RING_LIVE,
    RING_STATE_MASK,
    SEQUENCE_OFFSET,
    SEQ_VALUE_MASK,
    STATE_FLIGHT_OFFSET,
    U32_MAX,
    WAITER_CARRIER,
    WAITER_FUTEX,
    WRITE_POS_OFFSET,
)
from kickmsg.protocol.v9.region import Region
from kickmsg.protocol.v9.words import (
    meta_precedes,
    meta_slot_field,
    pack_meta,
    publisher_lock,
    repairer_lock,
    seq_locked,
    seq_pos,
    skip_marker,
)

__all__ = ["LOCK_ATTEMPTS", "Publisher", "SPINS_PER_CLOCK_CHECK", "steal_and_skip", "wake_ring"]

LOCK_ATTEMPTS = 64  # B.6 e
SPINS_PER_CLOCK_CHECK = 1024  # B.7


def wake_ring(region: Region, ring: int) -> bool:
    """B.15: after the caller's sc fence, wake a futex waiter; return whether
    a carrier waiter (2) is parked (we have no wake backend to signal)."""
    ops = region.atomics
    waiter = ops.load_relaxed_u32(ring + HAS_WAITER_OFFSET)
    if waiter == WAITER_FUTEX:
        ops.futex_wake_all(ring + WRITE_POS_OFFSET)  # low 32 bits of write_pos, FUTEX_WAKE, INT_MAX
    return waiter == WAITER_CARRIER


def steal_and_skip(region: Region, entry: int, observed: int, pos: int) -> bool:
    """Replace the exact sequence value ``observed`` with a skip marker for
    ``pos`` (through the repairer lock); the meta word and its reference
    stay for the next publisher or drainer. B.8 step 3, B.13 repair."""
    ops = region.atomics
    # CAS(strong, acq/relaxed) observed -> repairer lock
    if ops.cas_acquire_u64(entry + SEQUENCE_OFFSET, observed, repairer_lock(pos)) != observed:
        return False
    ops.store_release_u64(entry + SEQUENCE_OFFSET, skip_marker(pos))
    ops.fetch_add_relaxed_u64(region.steal_count_address, 1)
    return True


class Publisher:
    """Publishes into every Live ring of one layout-9 region."""

    def __init__(self, region: Region) -> None:
        self.region = region
        self.pending = INVALID_SLOT  # the slot allocate() reserved and publish() has not consumed
        self.dropped = 0  # deliveries abandoned (B.9)

    # -- B.5 Allocate ---------------------------------------------------------

    def allocate(self) -> int:
        """Reserve a slot of ``slot_data_size`` bytes: its index, or
        ``INVALID_SLOT`` when the pool is empty. A previous reservation not
        yet published goes back to the pool."""
        # 1. give back the previous reservation
        if self.pending != INVALID_SLOT:
            self.give_back(self.pending)
        # 2. pop (an empty pool or a corrupt head reads as INVALID_SLOT)
        # 3. remember it
        self.pending = freestack.pop(self.region, empty_on_corrupt_head=True)
        return self.pending

    def payload(self, slot: int, length: int) -> memoryview:
        """The first ``length`` payload bytes of a reserved slot, for its
        caller to write."""
        return self.region.payload(slot, length)

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
        """Copy ``data`` into a slot and publish it (B.5, B.6): ``len(data)``.
        Raises ``PoolEmptyError`` if the pool is empty."""
        region = self.region
        length = len(data)
        if length > region.geometry.slot_data_size:
            raise ValueError(f"message too large: {length} bytes exceeds max_payload_size "
                             f"{region.geometry.slot_data_size} of {region.name}")
        slot = self.allocate()
        if slot == INVALID_SLOT:
            raise freestack.empty_pool_error(region)
        region.payload(slot, length)[:] = data
        self.publish(slot, length)
        return length

    # -- B.6 Publish ------------------------------------------------------------

    def publish(self, slot: int, length: int) -> int:
        """Deliver the reserved ``slot`` holding ``length`` bytes to every Live
        ring; returns how many rings received it."""
        region = self.region
        g = region.geometry
        ops = region.atomics
        if slot != self.pending:
            raise ValueError(f"slot {slot} is not this publisher's reservation")
        # 1. too long: the slot goes back, nothing is delivered
        if length > g.slot_data_size:
            self.give_back(slot)
            raise ValueError(f"publish(len) exceeds slot max_size: {length} > {g.slot_data_size}")
        # 2. take the slot; one reference per ring, returned below when unused
        self.pending = INVALID_SLOT
        slot_address = region.slot_addresses[slot]
        ops.store_relaxed_u32(slot_address + PAYLOAD_LEN_OFFSET, length)
        ops.store_release_u32(slot_address + REFCOUNT_OFFSET, g.max_subs)
        delivered = 0
        excess = 0
        rings = region.ring_addresses
        first_state_flight = rings[0] + STATE_FLIGHT_OFFSET
        index = 0  # the next ring to pre-check
        # 3. every ring
        while index < g.max_subs:
            # a. pre-check (relaxed; one call reads the states up to the next Live ring)
            found = ops.find_relaxed_u32(first_state_flight, g.ring_stride, index, g.max_subs, RING_STATE_MASK, RING_LIVE)
            if found < 0:
                excess += g.max_subs - index  # none Live from index on
                break
            live, state_flight = found >> 32, found & U32_MAX
            excess += live - index  # the rings skipped
            index = live + 1
            ring = rings[live]
            state_flight_address = ring + STATE_FLIGHT_OFFSET
            admitted = False
            # b. admission: in_flight += 1 while the ring stays Live
            while state_flight & RING_STATE_MASK == RING_LIVE and state_flight + IN_FLIGHT_ONE <= U32_MAX:
                found = ops.cas_acq_rel_u32(state_flight_address, state_flight, state_flight + IN_FLIGHT_ONE)
                if found == state_flight:
                    admitted = True
                    break
                state_flight = found
            if not admitted:
                excess += 1
                continue
            # c. claim a position
            pos = ops.fetch_add_acq_rel_u64(ring + WRITE_POS_OFFSET, 1)
            if pos >= SEQ_VALUE_MASK:  # ours: a corrupt write_pos no sequence word can express
                self._abandon(ring)
                excess += 1
                continue
            entry = region.ring_entries[live][pos & g.mask]
            prev_seq = pos - g.capacity + 1 if pos >= g.capacity else 0
            # d. wrapped: wait for the previous lap's commit
            last_seq, stable = 0, False
            if pos >= g.capacity:
                last_seq, stable = self._wait_for_commit(entry, prev_seq)
            # e. lock: CAS from the observed commit (or skip) carrying prev_seq
            lock_value = publisher_lock(pos)
            observed = last_seq
            locked = False
            for _ in range(LOCK_ATTEMPTS):
                if seq_locked(observed):
                    observed = ops.load_relaxed_u64(entry + SEQUENCE_OFFSET)
                    continue
                if seq_pos(observed) != prev_seq:
                    break  # something else committed here
                found = ops.cas_acquire_u64(entry + SEQUENCE_OFFSET, observed, lock_value)
                if found == observed:
                    locked = True
                    break
                observed = found
            # f. not locked: self-repair, abandon
            if not locked:
                self._self_repair(entry, pos, last_seq, stable)
                self._abandon(ring)
                excess += 1
                continue
            # g. early check: a repairer stole the lock
            if ops.load_acquire_u64(entry + SEQUENCE_OFFSET) != lock_value:
                self._abandon(ring)
                excess += 1
                continue
            # h. claim takeover: replace only an older claim
            my_meta = pack_meta(pos, slot)
            old = ops.load_acquire_u64(entry + META_OFFSET)
            taken = False
            while meta_precedes(old, pos):
                found = ops.cas_acq_rel_u64(entry + META_OFFSET, old, my_meta)
                if found == old:
                    taken = True
                    break
                old = found
            if not taken:  # a newer position claimed this entry: our reference stays with us
                self._abandon(ring)
                excess += 1
                continue
            # i. release the evicted claim (the previous lap's sample)
            evicted = meta_slot_field(old)
            if evicted and evicted - 1 < g.pool_size:
                freestack.release_slot(region, evicted - 1)
            # j. commit by CAS from our own lock
            if ops.cas_release_u64(entry + SEQUENCE_OFFSET, lock_value, pos + 1) != lock_value:
                self._abandon(ring)  # stolen after the takeover: the entry owns our reference
                continue
            # k. release admission, sc fence, wake
            ops.fetch_sub_release_u32(state_flight_address, IN_FLIGHT_ONE)
            ops.fence_seq_cst()
            wake_ring(region, ring)
            delivered += 1
        # 4. return the references no ring took
        if excess:
            previous = ops.fetch_sub_acq_rel_u32(slot_address + REFCOUNT_OFFSET, excess)
            if previous == excess:
                freestack.push(region, slot)
        # 5. (no wake backend: nothing to signal)
        return delivered

    # -- B.7 Wait for commit ----------------------------------------------------

    def _wait_for_commit(self, entry: int, prev_seq: int) -> tuple[int, bool]:
        """Wait until the entry's previous lap committed (or was skipped), at
        most one commit timeout: (last value read, stable), where stable
        means one lock value held for the whole timeout (the steal proof)."""
        ops = self.region.atomics
        address = entry + SEQUENCE_OFFSET
        # 1. already committed: no clock
        first = ops.load_acquire_u64(address)
        if not seq_locked(first) and seq_pos(first) >= prev_seq:
            return first, False
        # 2. spin, checking the clock every 1024 spins
        timeout_ns = self.region.geometry.commit_timeout_us * 1000
        start = self.region.monotonic_ns()
        spins = 0
        while True:
            current = ops.load_acquire_u64(address)
            if not seq_locked(current) and seq_pos(current) >= prev_seq:
                return current, False
            spins += 1
            if spins % SPINS_PER_CLOCK_CHECK == 0:
                if self.region.monotonic_ns() - start >= timeout_ns:
                    return current, seq_locked(first) and current == first
                os.sched_yield()  # ours: give the stalled writer a core (2-core machines)

    # -- B.8 Self-repair ----------------------------------------------------------

    def _self_repair(self, entry: int, pos: int, last_seq: int, stable: bool) -> None:
        """After a failed lock: steal a lock proven stable, or a commit more
        than one wrap stale, turning it into a skip marker for ``pos``."""
        ops = self.region.atomics
        # 1. look again
        seq = ops.load_acquire_u64(entry + SEQUENCE_OFFSET)
        # 2. only a stable lock, or a stale commit
        if seq_locked(seq):
            if not (stable and seq == last_seq):
                return
        elif seq_pos(seq) + self.region.geometry.capacity >= pos + 1:
            return
        # 3. steal and skip
        steal_and_skip(self.region, entry, seq, pos)

    # -- B.9 Abandon --------------------------------------------------------------

    def _abandon(self, ring: int) -> bool:
        """Count a drop, leave the ring, and wake it (write_pos moved, so a
        parked subscriber must see the loss). Returns wake_ring's carrier."""
        ops = self.region.atomics
        self.dropped += 1
        ops.fetch_add_relaxed_u64(ring + DROPPED_COUNT_OFFSET, 1)
        ops.fetch_sub_release_u32(ring + STATE_FLIGHT_OFFSET, IN_FLIGHT_ONE)
        ops.fence_seq_cst()
        return wake_ring(self.region, ring)
