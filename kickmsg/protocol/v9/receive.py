"""Subscribing on a layout-9 region (WIRE9.md B.4, B.10-B.12).

``Subscriber`` claims a ring at construction (join, B.4), receives without
blocking (B.10: skip markers and overwritten entries counted as losses, the
claim's tag checked against the position as 0.9.2 does, pin, seqlock
re-check, length read from the slot under the pin), blocks on the ring's
futex word (B.11), and gives the ring back with ``close`` (leave and drain,
B.12). Every atomic goes through the region's ``kickmsg.atomics`` door.
"""
import os

from kickmsg import owners, process
from kickmsg.errors import CapacityError
from kickmsg.atomics import FUTEX_TIMED_OUT
from kickmsg.protocol import freestack
from kickmsg.protocol.v9.layout import (
    HAS_WAITER_OFFSET,
    LOST_COUNT_OFFSET,
    META_OFFSET,
    OWNER_PID_OFFSET,
    OWNER_STARTTIME_OFFSET,
    PAYLOAD_LEN_OFFSET,
    REFCOUNT_OFFSET,
    RING_DRAINING,
    RING_FREE,
    RING_LIVE,
    RING_STATE_MASK,
    SEQUENCE_OFFSET,
    STATE_FLIGHT_OFFSET,
    U32_MAX,
    WAITER_FUTEX,
    WAITER_NONE,
    WRITE_POS_OFFSET,
)
from kickmsg.protocol.v9 import repair
from kickmsg.protocol.v9.region import Region
from kickmsg.protocol.v9.words import (
    meta_slot_field,
    meta_tag,
    meta_tag_of,
    seq_locked,
    seq_pos,
    seq_skip,
)

__all__ = [
    "POLL_SLEEP_NS", "RECEIVE_ITERATIONS", "RINGS_NAMED", "SampleView", "Subscriber", "UNCOMMITTED_POLL_NS",
    "YIELDS_BEFORE_SLEEP", "ring_holders",
]

RECEIVE_ITERATIONS = 64  # B.10
YIELDS_BEFORE_SLEEP = 64  # B.11
POLL_SLEEP_NS = 100_000  # B.11: 100 us naps while the head is claimed but not committed
UNCOMMITTED_POLL_NS = 1_000_000  # a WaitSet's nap while the head is claimed but not committed

RINGS_NAMED = 8  # a join's error names the holders of at most this many rings


def ring_holders(region: Region) -> str:
    """Who holds each ring (pid, alive or dead; the first RINGS_NAMED
    rings), for a join that found none free, and what frees them."""
    ops = region.atomics
    holders = []
    for index in range(min(region.geometry.max_subs, RINGS_NAMED)):
        ring = region.ring_address(index)
        state_flight = ops.load_acquire_u32(ring + STATE_FLIGHT_OFFSET)
        state, in_flight = ("Free", "Live", "Draining", "Reclaiming")[state_flight & RING_STATE_MASK], state_flight >> 2
        pid = ops.load_acquire_u64(ring + OWNER_PID_OFFSET)
        start = ops.load_relaxed_u64(ring + OWNER_STARTTIME_OFFSET)
        if state == "Free" and not in_flight:
            holders.append(f"ring {index} Free now (freed since the join looked: try again)")
        elif state == "Free":
            holders.append(f"ring {index} retired ({in_flight} publisher(s) counted in flight)")
        elif pid == 0:
            holders.append(f"ring {index} {state}, no owner recorded")
        else:
            holders.append(f"ring {index} {state}, pid {pid} {'dead' if region.owner_is_dead(pid, start) else 'alive'}")
    if region.geometry.max_subs > RINGS_NAMED:
        holders.append(f"{region.geometry.max_subs - RINGS_NAMED} more rings (kickmsg stats {region.name} --all-rings)")
    return (f"{'; '.join(holders)}; kickmsg repair {region.name} --dead-subscribers frees a dead holder's ring, "
            f"--retired a retired one once its publishers are gone")


class SampleView:
    """A received message in place: one pinned reference to its slot,
    released by ``release()`` (leaving a ``with`` block, or when collected). Read-only
    ``memoryview(view)`` works until then."""

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
        return self._region.payload(self.slot, self._length).toreadonly()

    def __release_buffer__(self, view: memoryview) -> None:
        self._exports -= 1
        view.release()

    def __bytes__(self) -> bytes:
        if not self.valid:
            raise BufferError("SampleView was released")
        return bytes(self._region.payload(self.slot, self._length))

    def release(self) -> None:
        """Drop the pin (acq_rel); the last reference pushes the slot."""
        if not self.valid:
            return
        if self._exports:
            raise BufferError(f"SampleView still has {self._exports} memoryview(s) open")
        self.valid = False
        freestack.release_slot(self._region, self.slot)

    def __del__(self) -> None:
        if self.valid and process.pid == self._owner_pid:  # dropped unreleased, and not a forked child's copy
            self.release()

    def __enter__(self) -> "SampleView":
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.release()


class Subscriber:
    """One claimed ring of a layout-9 region."""

    def __init__(self, region: Region) -> None:
        self.region = region
        self.lost = 0
        self.skipped = 0  # committed messages passed over by skip_to_newest
        self.drain_timeouts = 0
        self.rewound = False  # never: a layout-9 region is re-created as a new object, not in place
        self._claimed_head = (-1, 0)  # B.11: the head seen claimed, not committed, and the yields on it in a row
        self.ring_index = -1
        self.ring = 0
        self.owner_pid = os.getpid()
        self._join()

    # -- B.4 Join ---------------------------------------------------------------

    def _join(self) -> None:
        """B.4; with no ring Free, leave the rings of provably dead owners
        on their behalf (``repair.reclaim_dead_rings``) and try once more
        (beyond 0.9.2, as our layout-4 join: a channel heals itself)."""
        if not self._try_join():
            if not repair.reclaim_dead_rings(self.region) or not self._try_join():
                # 5. none free
                raise CapacityError(f"No free subscriber slots in {self.region.name} "
                                   f"({self.region.geometry.max_subs} rings: {ring_holders(self.region)})")

    def _try_join(self) -> bool:
        region = self.region
        ops = region.atomics
        for index in range(region.geometry.max_subs):
            ring = region.ring_address(index)
            # 1. the drain floor, read before the claim
            write_pos = ops.load_acquire_u64(ring + WRITE_POS_OFFSET)
            # 2. Free with no publisher in flight -> Live
            if ops.cas_acq_rel_u32(ring + STATE_FLIGHT_OFFSET, RING_FREE, RING_LIVE) != RING_FREE:
                continue
            # 3. owner identity: start time first, then the pid (release)
            pid, start_time = region.process_identity()
            ops.store_relaxed_u64(ring + OWNER_STARTTIME_OFFSET, start_time)
            ops.store_release_u64(ring + OWNER_PID_OFFSET, pid)
            # 4. where reading starts
            write_pos_again = ops.load_acquire_u64(ring + WRITE_POS_OFFSET)
            self.ring_index = index
            self.ring = ring
            self.start_pos = write_pos
            self.read_pos = max(write_pos, write_pos_again)
            return True
        return False

    # -- B.10 Receive ---------------------------------------------------------------

    def unread(self, ring_reset: bool = False) -> int:
        """Messages written to our ring that we had not read, at most a
        ring's worth (what following a re-created region counts as lost).
        ``ring_reset`` (a re-create in place) never happens on layout 9: a
        re-created region is a new object."""
        write_pos = self.region.atomics.load_acquire_u64(self.ring + WRITE_POS_OFFSET)
        return min(max(0, write_pos - self.read_pos), self.region.geometry.capacity)

    def lose(self, count: int = 1) -> None:
        """Count ``count`` messages lost, here and in the ring header's lost_count."""
        self.lost += count
        self.region.atomics.fetch_add_relaxed_u64(self.ring + LOST_COUNT_OFFSET, count)

    def _unpin(self, slot: int) -> None:
        freestack.release_slot(self.region, slot)

    def pin_next(self) -> tuple[int, int, int] | None:
        """B.10, steps 1-8: find the next committed entry and pin its slot.
        Returns (slot, length, ring position), or None (nothing committed yet)."""
        if self.ring_index < 0:
            raise RuntimeError("Subscriber was closed")
        region = self.region
        g = region.geometry
        ops = region.atomics
        ring = self.ring
        for _ in range(RECEIVE_ITERATIONS):
            # 1. anything new?
            write_pos = ops.load_acquire_u64(ring + WRITE_POS_OFFSET)
            if write_pos <= self.read_pos:
                return None
            # 2. overrun by more than a lap: skip what was overwritten
            if write_pos - self.read_pos > g.capacity:
                self.lose(write_pos - self.read_pos - g.capacity)
                self.read_pos = write_pos - g.capacity
            # 3. the entry's sequence
            entry = region.ring_entries[self.ring_index][self.read_pos & g.mask]
            expected = self.read_pos + 1
            s1 = ops.load_acquire_u64(entry + SEQUENCE_OFFSET)
            # 4. not this position's commit
            if s1 != expected:
                if seq_skip(s1) and seq_pos(s1) == expected:
                    self.lose()  # a skip marker: consumed, no sample
                    self.read_pos += 1
                    continue
                if seq_locked(s1) or seq_pos(s1) < expected:
                    return None  # claimed, not yet committed
                self.lose()  # overwritten by a later lap
                self.read_pos += 1
                continue
            # 5. the claim must be this position's and name a slot in range
            meta = ops.load_relaxed_u64(entry + META_OFFSET)
            field = meta_slot_field(meta)
            if meta_tag(meta) != meta_tag_of(self.read_pos) or field == 0 or field - 1 >= g.pool_size:
                self.lose()
                self.read_pos += 1
                continue
            slot = field - 1
            slot_address = region.slot_addresses[slot]
            # 6. pin: refcount + 1 unless it is 0 (free) or saturated
            refcount = ops.load_acquire_u32(slot_address + REFCOUNT_OFFSET)
            pinned = False
            while refcount not in (0, U32_MAX):
                found = ops.cas_acq_rel_u32(slot_address + REFCOUNT_OFFSET, refcount, refcount + 1)
                if found == refcount:
                    pinned = True
                    break
                refcount = found
            if not pinned:
                self.lose()
                self.read_pos += 1
                continue
            # 7. seqlock re-check
            if ops.load_acquire_u64(entry + SEQUENCE_OFFSET) != s1:
                self._unpin(slot)
                self.lose()
                self.read_pos += 1
                continue
            # 8. the length, under the pin
            length = ops.load_relaxed_u32(slot_address + PAYLOAD_LEN_OFFSET)
            if length > g.slot_data_size:
                self._unpin(slot)
                self.lose()
                self.read_pos += 1
                continue
            # 9. success
            position = self.read_pos
            self.read_pos += 1
            return slot, length, position
        return None

    def try_receive_view(self) -> SampleView | None:
        """The next message in place (its slot pinned until the view is released), or None."""
        pinned = self.pin_next()
        if pinned is None:
            return None
        return SampleView(self.region, *pinned)

    def try_receive(self) -> bytes | None:
        """The next message copied out (under the pin, then unpinned), or None."""
        pinned = self.pin_next()
        if pinned is None:
            return None
        slot, length, _ = pinned
        data = bytes(self.region.payload(slot, length))
        freestack.release_slot(self.region, slot)  # unpin
        return data

    def skip_to_newest(self) -> None:
        """Read-latest: move read_pos to the newest entry committed at its
        own position (a skip marker or lock is passed by); those passed
        over count in ``skipped``, what was overwritten in ``lost``."""
        region = self.region
        ops = region.atomics
        write_pos = ops.load_acquire_u64(self.ring + WRITE_POS_OFFSET)
        if write_pos - self.read_pos > region.geometry.capacity:  # overwritten: lost, as in receive
            skipped_to = write_pos - region.geometry.capacity
            self.lose(skipped_to - self.read_pos)
            self.read_pos = skipped_to
        for position in range(write_pos - 1, self.read_pos, -1):
            sequence = ops.load_acquire_u64(region.entry_address(self.ring_index, position) + SEQUENCE_OFFSET)
            if sequence == position + 1:
                self.skipped += position - self.read_pos
                self.read_pos = position
                return

    # -- B.11 Blocking receive ---------------------------------------------------------

    def receive_view(self, timeout_s: float) -> SampleView | None:
        """Wait up to ``timeout_s`` seconds for the next message in place."""
        return self.receive_view_until(self.region.monotonic_ns() + int(timeout_s * 1e9))

    def receive(self, timeout_s: float) -> bytes | None:
        """Wait up to ``timeout_s`` seconds for the next message, copied out."""
        view = self.receive_view(timeout_s)
        if view is None:
            return None
        with view:
            return bytes(view)

    def receive_view_until(self, deadline_ns: int | None, latest: bool = False) -> SampleView | None:
        """The blocking receive: the next message in place (``latest``: the
        newest, as ``skip_to_newest``), parking until one is committed or
        ``deadline_ns`` (``region.monotonic_ns``; None: none) passes. None then."""
        while True:
            if latest:
                self.skip_to_newest()
            view = self.try_receive_view()
            if view is not None or not self.park(deadline_ns):
                return view

    def park(self, deadline_ns: int | None) -> bool:
        """B.11's wait, once: nothing claimed, park on the low 32 bits of
        write_pos (has_waiter = 1, seq_cst fence); the head claimed but not
        committed (its commit brings no wake-up), yield, and nap after
        YIELDS_BEFORE_SLEEP yields in a row on it. False (not waiting) once
        the deadline has passed; else True, to try a receive again."""
        remaining = -1 if deadline_ns is None else deadline_ns - self.region.monotonic_ns()
        if deadline_ns is not None and remaining <= 0:
            return False
        ops = self.region.atomics
        ring = self.ring
        current = ops.load_relaxed_u64(ring + WRITE_POS_OFFSET)
        if current <= self.read_pos:
            # nothing claimed: park on the low 32 bits of write_pos
            ops.store_relaxed_u32(ring + HAS_WAITER_OFFSET, WAITER_FUTEX)
            ops.fence_seq_cst()
            outcome = ops.futex_wait(ring + WRITE_POS_OFFSET, current & U32_MAX, remaining)
            ops.store_relaxed_u32(ring + HAS_WAITER_OFFSET, WAITER_NONE)
            if outcome < 0 and outcome != FUTEX_TIMED_OUT:
                raise OSError(-outcome, f"futex_wait on {self.region.name}: {os.strerror(-outcome)}")
            return True
        # head claimed, not committed: no wake will come for its commit
        position, yields = self._claimed_head
        yields = yields + 1 if position == self.read_pos else 1
        self._claimed_head = (self.read_pos, yields)
        if yields <= YIELDS_BEFORE_SLEEP:
            os.sched_yield()
        else:
            self.region.sleep_ns(POLL_SLEEP_NS if remaining < 0 else min(POLL_SLEEP_NS, remaining))
        return True

    # -- waiting on many rings at once (a WaitSet's words, B.11's steps before the sleep) ------

    def announce_wait(self) -> tuple[int, int, int] | None:
        """has_waiter = 1, seq_cst fence, write_pos (acquire). None if a
        receive has something to do now (``ready_at``); else the futex word,
        the value seen there and the longest sleep in ns (-1: no limit; a nap
        while the head is claimed but not committed). has_waiter stays set
        until ``end_wait``."""
        ops = self.region.atomics
        ops.store_relaxed_u32(self.ring + HAS_WAITER_OFFSET, WAITER_FUTEX)
        ops.fence_seq_cst()
        write_pos = ops.load_acquire_u64(self.ring + WRITE_POS_OFFSET)
        ready = self.ready_at(write_pos)
        if ready:
            return None
        return self.ring + WRITE_POS_OFFSET, write_pos & U32_MAX, -1 if ready is None else UNCOMMITTED_POLL_NS

    def has_message_ready(self) -> bool:
        """Whether a receive has something to do now, looked at without
        announcing a wait (a WaitSet's spin)."""
        return bool(self.ready_at(self.region.atomics.load_acquire_u64(self.ring + WRITE_POS_OFFSET)))

    def ready_at(self, write_pos: int) -> bool | None:
        """Given the ring's write_pos (just loaded, acquire): True if a
        receive has something to do (a committed entry, a skip marker, or
        the ring lapped us), None if the ring is empty, False while the next
        entry is claimed but not committed."""
        if write_pos <= self.read_pos:
            return None
        if write_pos - self.read_pos > self.region.geometry.capacity:
            return True
        entry = self.region.entry_address(self.ring_index, self.read_pos)
        sequence = self.region.atomics.load_acquire_u64(entry + SEQUENCE_OFFSET)
        return not seq_locked(sequence) and seq_pos(sequence) > self.read_pos

    def end_wait(self) -> None:
        """After a WaitSet's sleep: has_waiter = 0."""
        self.region.atomics.store_relaxed_u32(self.ring + HAS_WAITER_OFFSET, WAITER_NONE)

    # -- B.12 Leave and drain --------------------------------------------------------

    def close(self, record: owners.Sidecar | None = None) -> bool:
        """Give the ring back: Draining, wait for admitted publishers, drain
        every claim in the window, Free. Returns whether it quiesced (else
        the ring is left retired: Free with publishers still counted).
        ``record``: an owner record kept beside the region, cleared with the
        owner (layout 9 records its owner in the ring header: none)."""
        if self.ring_index < 0:
            return True
        region = self.region
        ops = region.atomics
        address = self.ring + STATE_FLIGHT_OFFSET
        # 1. Draining, keeping in_flight (also overrides a Reclaiming)
        state_flight = ops.load_relaxed_u32(address)
        while True:
            found = ops.cas_acq_rel_u32(address, state_flight, (state_flight & ~RING_STATE_MASK) | RING_DRAINING)
            if found == state_flight:
                break
            state_flight = found
        # 2. wait for in_flight = 0, at most one commit timeout
        deadline = region.monotonic_ns() + region.geometry.commit_timeout_us * 1000
        quiesced = True
        while ops.load_acquire_u32(address) >> 2:
            if region.monotonic_ns() >= deadline:
                quiesced = False
                self.drain_timeouts += 1
                break
            os.sched_yield()
        # 3. clear the owner
        ops.store_relaxed_u32(self.ring + HAS_WAITER_OFFSET, WAITER_NONE)
        ops.store_relaxed_u64(self.ring + OWNER_PID_OFFSET, 0)
        ops.store_relaxed_u64(self.ring + OWNER_STARTTIME_OFFSET, 0)
        if record:
            record.release(self.ring_index)
        # 4. drain and free, or leave it retired
        if quiesced:
            repair.drain_window(region, self.ring_index, self.start_pos)
            ops.store_release_u32(address, RING_FREE)
        else:
            state_flight = ops.load_acquire_u32(address)
            while True:
                # CAS(weak, release/acq): acq_rel is the door's release CAS that fails acquire
                found = ops.cas_acq_rel_u32(address, state_flight, (state_flight & ~RING_STATE_MASK) | RING_FREE)
                if found == state_flight:
                    break
                state_flight = found
        self.ring_index = -1
        return quiesced

    def __del__(self) -> None:
        # As the native Subscriber's destructor: leave when dropped (not a forked child's copy).
        if getattr(self, "ring_index", -1) >= 0 and self.owner_pid == os.getpid():
            self.close()

    def __enter__(self) -> "Subscriber":
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

