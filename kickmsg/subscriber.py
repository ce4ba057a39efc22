"""Subscriber and SampleView: receiving, the API of both layouts.

Each subscriber owns one ring of the region. Its read position is private to
the process; publishers write, the subscriber only reads entries and pins or
releases slot references. On a layout-4 region, joining and leaving the ring
(``kickmsg.protocol.v4.rings``) and the receive flow
(``kickmsg.protocol.v4.receive``) are the layout-4 core's; ``Subscriber9``
and ``SampleView9`` hand a layout-9 region to the layout-9 core
(``kickmsg.protocol.v9.receive``).
"""
import datetime
import os
import time
import weakref
from collections.abc import Callable
from typing import Self, TypeVar

from kickmsg import layouts, process
from kickmsg import owners
from kickmsg.protocol import freestack
from kickmsg.atomics import FUTEX_TIMED_OUT
from kickmsg.config import to_microseconds
from kickmsg.protocol.v4 import receive as receive4
from kickmsg.protocol.v4 import rings as rings4
from kickmsg.protocol.v4 import region as region4
from kickmsg.protocol.v4.layout import (
    LOCKED_SEQUENCE,
    RING_FREE,
    RING_STATE_MASK,
    SEQUENCE_OFFSET,
    U32_MAX,
)
from kickmsg.protocol import v9
from kickmsg.protocol.v9.receive import POLL_SLEEP_S, YIELDS_BEFORE_SLEEP
from kickmsg.protocol.v9.layout import (
    HAS_WAITER_OFFSET,
    SEQUENCE_OFFSET as SEQUENCE_OFFSET_9,
    WAITER_FUTEX,
    WAITER_NONE,
    WRITE_POS_OFFSET,
    seq_locked,
    seq_pos,
)
from kickmsg.protocol.v4.region import RingAddresses
from kickmsg.region import SharedRegion

__all__ = ["DEFAULT_SPIN_S", "SampleView", "SampleView9", "Subscriber", "Subscriber9", "UNCOMMITTED_POLL_NS"]

M = TypeVar("M")  # what a receive gives: bytes or a SampleView

UNCOMMITTED_POLL_NS = 1_000_000  # sleep slice while a claimed entry is not committed yet
DEFAULT_SPIN_S = 0.0001  # a blocking receive's polling budget before it parks (Subscriber(spin=...))


class Subscriber:
    """Receives every message published to a region from now on, through a
    ring of its own. A slow subscriber only loses its own messages (counted
    in ``lost``); it never slows publishers or other subscribers.

    A subscriber is used by one thread at a time. It leaves its ring when
    closed (``close()``, ``with``) or garbage collected.

    Beyond 0.1.0: if the region is re-created under it (in place, or
    unlinked and replaced), the subscriber notices within 0.1 s while it
    receives or waits (at once if it waits and a re-create in place reset
    its ring), goes on in the new region and counts it in ``rejoined``. A
    re-create in place by this package keeps its ring; otherwise it joins
    a ring of the new region. The messages it had not read in the old ring
    count as lost, and so do those a new object's rings hold when it joins
    (published there before it joined; after a re-create in place, whose
    rings may keep older positions, they are not counted).

    Beyond 0.1.0, ``spin`` (a timedelta or seconds; 0: never): a blocking
    receive whose previous wait took less than ``spin`` keeps trying for up
    to that long, holding the GIL, before it sleeps on the futex.

    On a layout-9 region the object is a ``Subscriber9``, which receives
    through the layout-9 core (``kickmsg.protocol.v9.receive``).
    """

    def __new__(cls, region: SharedRegion, *, spin: datetime.timedelta | float = DEFAULT_SPIN_S) -> "Subscriber":
        if cls is Subscriber and isinstance(region, SharedRegion) and region.layout == layouts.LAYOUT_9:
            return super().__new__(Subscriber9)
        return super().__new__(cls)

    def __init__(self, region: SharedRegion, *, spin: datetime.timedelta | float = DEFAULT_SPIN_S):
        if not isinstance(region, SharedRegion):
            raise TypeError(f"Subscriber needs a SharedRegion, got {region!r}")
        self._spin_ns = to_microseconds(spin, "spin") * 1000
        self._idle_gap_ns: int | None = None  # how long the last wait for a message took (None: no wait yet)
        self._blocking = False  # inside a blocking receive
        region.require_writable("subscribe")
        region = region.reopen_if_recreated() or region  # a stale region object: use what the name leads to
        self._cursor = receive4.Cursor()  # read_pos, lost: what the receive flow keeps
        self._skipped = 0
        self._drain_timeouts = 0
        self._rejoined = 0
        self._closed = False
        self._waiting_on: tuple[SharedRegion, RingAddresses] | None = None  # (region, ring) whose has_waiter a WaitSet set for us
        self._take_ring(region, *_join_and_record(region))

    def _take_ring(
        self,
        region: SharedRegion,
        ring: RingAddresses,
        start_pos: int,
        sidecar: owners.Sidecar | None,
        read_pos: int | None = None,
    ) -> None:
        """Make a ring we joined ours: read from ``read_pos`` (default: the
        start position), leave it (and close ``sidecar``, which holds our
        owner record) when closed or collected."""
        self._region = region
        self._ring, self._start_pos = ring, start_pos
        self._sidecar = sidecar
        cursor = self._cursor
        cursor.read_pos = cursor.write_pos_seen = start_pos if read_pos is None else read_pos
        self._reported = (cursor.read_pos, cursor.lost)  # (read_pos, lost) last written to the owner record
        self._next_check_in_ns = region.next_check_in_ns()
        self._teardown = weakref.finalize(
            self, _leave_ring, region, ring, start_pos, os.getpid(), region.incarnation(), self._sidecar
        )

    @property
    def region(self) -> SharedRegion:
        """The region this subscriber reads from."""
        return self._region

    @property
    def lost(self) -> int:
        """Messages this subscriber missed: overwritten in its ring before it
        read them, or found unreadable."""
        return self._cursor.lost

    @property
    def skipped(self) -> int:
        """Committed messages passed over by ``try_receive_latest`` /
        ``receive_latest`` to reach the newest one (not counted in ``lost``)."""
        return self._skipped

    @property
    def drain_timeouts(self) -> int:
        """Times leaving the ring gave up waiting for an in-flight publisher."""
        return self._drain_timeouts

    @property
    def rejoined(self) -> int:
        """Times this subscriber followed its region's name to a re-created
        region (beyond 0.1.0)."""
        return self._rejoined

    # -- receiving ----------------------------------------------------------

    def _check_open(self) -> None:
        if self._closed:
            raise ValueError(f"this subscriber of {self._region.name} is closed")

    def try_receive(self) -> bytes | None:
        """The next message as a copy, or None if none is ready."""
        self._check_open()
        region: region4.Region = self._region.core  # type: ignore[assignment]  # a layout-4 subscriber's  (the slot is pinned in this region, even if the check-in follows a new one)
        pinned = receive4.pin_next(region, self._ring, self._cursor)
        if time.monotonic_ns() >= self._next_check_in_ns:
            self._check_in()
        if pinned is None:
            if not self._blocking:  # a poll found nothing: going idle, leave the record current
                self._report_if_stale()
            return None
        slot, length, _ = pinned
        start = region.payload_offsets[slot]
        data = bytes(region.mapping.buffer[start : start + length])
        freestack.release_slot(region, slot)  # unpin
        return data

    def try_receive_view(self) -> "SampleView | None":
        """The next message in place (zero-copy, its slot pinned until the
        view is released), or None if none is ready."""
        self._check_open()
        region = self._region  # the slot is pinned in this region, even if the check-in follows a new one
        pinned = receive4.pin_next(region.core, self._ring, self._cursor)  # type: ignore[arg-type]  # a layout-4 subscriber's
        if time.monotonic_ns() >= self._next_check_in_ns:
            self._check_in()
        if pinned is None:
            if not self._blocking:  # a poll found nothing: going idle, leave the record current
                self._report_if_stale()
            return None
        slot, length, ring_pos = pinned
        return SampleView(region, slot, length, ring_pos)

    def receive(self, timeout: datetime.timedelta | float | None = None) -> bytes | None:
        """Like ``try_receive``, but sleeps (without the GIL) up to ``timeout``
        (a timedelta or seconds; None, the default, waits until a message
        comes: Ctrl-C interrupts it). None on timeout."""
        return self._receive_blocking(self.try_receive, timeout)

    def receive_view(self, timeout: datetime.timedelta | float | None = None) -> "SampleView | None":
        """Like ``try_receive_view``, blocking up to ``timeout``."""
        return self._receive_blocking(self.try_receive_view, timeout)

    def try_receive_latest(self) -> bytes | None:
        """The newest committed message (a copy), passing over older unread
        ones (counted in ``skipped``), or None if nothing new is ready."""
        self._skip_to_newest()
        return self.try_receive()

    def receive_latest(self, timeout: datetime.timedelta | float | None = None) -> bytes | None:
        """Like ``try_receive_latest``, blocking up to ``timeout``."""
        return self._receive_blocking(self.try_receive_latest, timeout)

    def __iter__(self) -> Self:
        """Iterate over the messages available now (copies), then stop."""
        return self

    def __next__(self) -> bytes:
        data = self.try_receive()
        if data is None:
            raise StopIteration
        return data

    def _skip_to_newest(self) -> None:
        """Read-latest: move read_pos to the newest committed entry of the
        ring. Only our private read position moves; the ring's slot
        references are still released by eviction and drain."""
        self._check_open()
        region, cursor = self._region, self._cursor
        ops = region.core.atomics
        capacity = region.geometry.capacity
        write_pos = ops.load_acquire_u64(self._ring.write_pos)
        if write_pos - cursor.read_pos > capacity:  # already overwritten: lost, as in receive
            cursor.lost += write_pos - capacity - cursor.read_pos
            cursor.read_pos = write_pos - capacity
        # Newest first: the first entry holding its own committed sequence.
        for position in range(write_pos - 1, cursor.read_pos, -1):
            sequence = ops.load_acquire_u64(self._ring.entries[position & region.geometry.mask] + SEQUENCE_OFFSET)
            if sequence == position + 1:
                self._skipped += position - cursor.read_pos
                cursor.read_pos = position
                return

    def _check_in(self) -> None:
        """Every CHECK_IN_INTERVAL_NS while receiving or waiting: follow the
        region's name if it was re-created, and bring our owner record up
        to date."""
        self._next_check_in_ns = self._region.next_check_in_ns()
        self._follow_if_recreated()
        self._report_if_stale()

    def _report_if_stale(self) -> None:
        """Write read_pos and lost into our owner record (for ``kickmsg
        stats``/``watch``) if they changed since last written: at check-in
        (a sleeping receive wakes for it), when a blocking receive gives up
        and when a poll (not a blocking receive's) finds nothing; never per
        message or per wake-up of a blocking receive."""
        progress = (self._cursor.read_pos, self._cursor.lost)
        if self._sidecar and progress != self._reported:
            self._sidecar.report_progress(self._ring.index, *progress)
            self._reported = progress

    def _follow_if_recreated(self) -> None:
        """If our region was re-created (beyond 0.1.0), go on in the new one.
        Re-created in place by this package, it kept our ring Live at its
        write position: read on (what we had not read shows as lost entries).
        Otherwise join a ring of the new region and leave the old ring (if it
        is still ours); what we had not read there counts as lost, and so
        does what a new object's rings hold when we join (published before
        we joined)."""
        region, ring = self._region, self._ring
        new_region = region.reopen_if_recreated()
        if new_region is None:
            return
        in_place = new_region.mapping.identity == region.mapping.identity
        if in_place and self._sidecar and self._sidecar.records_us(ring.index, new_region.created_at_ns):
            self._teardown.detach()  # our ring and record live on in the new incarnation
            ring_there = new_region.core.ring(ring.index)  # type: ignore[union-attr]  # a layout-4 subscriber's
            self._take_ring(new_region, ring_there, self._start_pos, self._sidecar, self._cursor.read_pos)
        else:
            if in_place:
                write_pos = self._cursor.write_pos_seen  # the old ring's contents are gone: what we last saw
            else:
                write_pos = region.core.atomics.load_acquire_u64(ring.write_pos)  # the old object, orphaned
            unread = min(max(0, write_pos - self._cursor.read_pos), region.geometry.capacity)
            # A new object's rings all began at 0: what its rings hold was published before we join.
            published_before = 0 if in_place else new_region.stats().total_writes
            joined = _join_and_record(new_region)  # none free: raise, try again at the next call
            if not self._teardown():
                self._drain_timeouts += 1
            self._take_ring(new_region, *joined)
            self._cursor.lost += unread + published_before
        self._rejoined += 1

    def _receive_blocking(self, attempt: Callable[[], M | None], timeout: datetime.timedelta | float | None) -> M | None:
        """Spin, then park: call ``attempt`` (a non-blocking receive) until
        it returns a message or ``timeout`` passes. While the last wait for
        a message took less than the spin budget, keep trying for up to that
        budget (holding the GIL, no system call: a message is seen the moment
        it is committed); then, or at once, sleep on the futex between
        attempts. A topic slower than the budget never spins."""
        deadline_ns = _deadline_ns(timeout)
        self._blocking = True  # its misses write no record: check-ins and giving up do
        try:
            message = attempt()
            if message is not None:
                return message
            began_ns = time.monotonic_ns()
            recent = self._idle_gap_ns is not None and self._idle_gap_ns < self._spin_ns
            spin_until_ns = began_ns + self._spin_ns if recent else began_ns
            while message is None:
                now_ns = time.monotonic_ns()
                if deadline_ns is not None and now_ns >= deadline_ns:
                    self._report_if_stale()  # giving up, idle: leave the record current
                    break
                if now_ns >= spin_until_ns:
                    self._sleep_until_written(deadline_ns)
                message = attempt()
            self._idle_gap_ns = time.monotonic_ns() - began_ns
            return message
        finally:
            self._blocking = False

    def _sleep_until_written(self, deadline_ns: int | None) -> None:
        """Sleep on the ring's futex until write_pos moves, or the deadline
        (none at all once it has passed)."""
        remaining_ns = -1 if deadline_ns is None else deadline_ns - time.monotonic_ns()
        if deadline_ns is not None and remaining_ns <= 0:
            return
        ops = self._region.core.atomics
        ring = self._ring
        ops.store_relaxed_u32(ring.has_waiter, 1)
        write_pos = ops.load_acquire_u64(ring.write_pos)
        if write_pos < self._cursor.read_pos:
            # A ring's write_pos never goes back: the region was re-created in
            # place. Check in now rather than at the next interval.
            ops.store_relaxed_u32(ring.has_waiter, 0)
            self._next_check_in_ns = 0
            return
        if write_pos != self._cursor.read_pos:
            # A publisher claimed a position but has not committed it; its
            # wake-up may come before we sleep, so only nap briefly.
            remaining_ns = _at_most(remaining_ns, UNCOMMITTED_POLL_NS)
        if self._region.mapping.shared:
            # Wake for the next check-in (it follows a re-created region,
            # whose publishers would never wake us on this one's futex, and
            # brings our record up to date), not sooner.
            remaining_ns = _at_most(remaining_ns, max(0, self._next_check_in_ns - time.monotonic_ns()))
        # The kernel returns at once if write_pos no longer equals what we saw.
        ops.futex_wait(ring.write_pos, write_pos & U32_MAX, remaining_ns)
        ops.store_relaxed_u32(ring.has_waiter, 0)

    # -- waiting together with other subscribers (kickmsg.waitset, kickmsg.aio) --

    def _announce_wait(self, check_in: bool) -> tuple[int, int, int] | None:
        """A blocking receive's steps before it sleeps, for a WaitSet that
        sleeps on many rings at once: check in first if ``check_in``, then
        store has_waiter = 1 (relaxed) and read write_pos (acquire). Returns
        None if a receive has something to do now (``_ready_at``); else the
        futex word, the value seen there, and the longest sleep in ns (-1: no
        limit; a short nap while a claimed entry is not committed yet).
        has_waiter stays set until ``_end_wait``."""
        self._check_open()
        if check_in:
            self._end_wait()  # checking in may take us to another ring
            self._check_in()
        region, ring = self._region, self._ring
        ops = region.core.atomics
        ops.store_relaxed_u32(ring.has_waiter, 1)
        self._waiting_on = (region, ring)
        write_pos = ops.load_acquire_u64(ring.write_pos)
        ready = self._ready_at(write_pos)
        if ready:
            return None
        # Empty: sleep until written. Claimed but not committed yet: its
        # wake-up may come before we sleep, so only nap.
        return ring.write_pos, write_pos & U32_MAX, -1 if ready is None else UNCOMMITTED_POLL_NS

    def _has_message_ready(self) -> bool:
        """Whether a receive has something to do now, looked at without
        announcing a wait (a WaitSet's spin: publishers make no wake-up call)."""
        self._check_open()
        return bool(self._ready_at(self._region.core.atomics.load_acquire_u64(self._ring.write_pos)))

    def _ready_at(self, write_pos: int) -> bool | None:
        """Given our ring's write_pos (just loaded, acquire): True if a
        receive has something to do now (a committed entry, the ring lapped
        us, or a re-create in place reset it), None if the ring is empty,
        False if the next entry is claimed but not committed yet."""
        region, read_pos = self._region, self._cursor.read_pos
        if write_pos == read_pos:
            return None
        if write_pos < read_pos:
            self._next_check_in_ns = 0  # reset by a re-create in place: the next receive checks in
            return True
        if write_pos - read_pos > region.geometry.capacity:
            return True  # lapped: the oldest entry is there to read
        entry = self._ring.entries[read_pos & region.geometry.mask]
        sequence = region.core.atomics.load_acquire_u64(entry + SEQUENCE_OFFSET)
        return sequence != LOCKED_SEQUENCE and sequence > read_pos  # committed (or overwritten since)

    def _end_wait(self) -> None:
        """After the sleep: has_waiter = 0 on the ring ``_announce_wait`` set it on."""
        if self._waiting_on is not None:
            region, ring = self._waiting_on
            region.core.atomics.store_relaxed_u32(ring.has_waiter, 0)
            self._waiting_on = None

    # -- leaving --------------------------------------------------------------

    def close(self) -> None:
        """Leave the ring: release its references and free it for a new
        subscriber. Views already received stay valid."""
        if self._teardown.alive:
            self._closed = True
            if not self._teardown():
                self._drain_timeouts += 1

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def __repr__(self) -> str:
        state = "closed" if self._closed else f"ring={self._ring.index}, read_pos={self._cursor.read_pos}"
        return (
            f"Subscriber(region={self._region.name!r}, {state}, lost={self._cursor.lost}, "
            f"drain_timeouts={self._drain_timeouts}, rejoined={self._rejoined})"
        )


def _at_most(timeout_ns: int, bound_ns: int) -> int:
    """A futex timeout (negative: none) no longer than ``bound_ns``."""
    return bound_ns if timeout_ns < 0 else min(timeout_ns, bound_ns)


def _deadline_ns(timeout: datetime.timedelta | float | None) -> int | None:
    if timeout is None:
        return None
    return time.monotonic_ns() + to_microseconds(timeout, "timeout") * 1000


def _join_or_reclaim(region: SharedRegion) -> tuple[RingAddresses, int]:
    """Join a ring; with none Free, first reclaim the rings whose recorded
    owner died (beyond 0.1.0: a channel heals itself) and try once more."""
    core: region4.Region = region.core  # type: ignore[assignment]  # a layout-4 subscriber's
    joined = rings4.join(core)
    if joined is None and region.mapping.shared and region.reclaim_dead_subscribers().reclaimed:
        joined = rings4.join(core)
    if joined is None:
        raise RuntimeError(
            f"No free subscriber slots in {region.name}: all {region.geometry.max_subs} rings are taken or "
            f"retired ({_ring_holders(region)})"
        )
    return joined


def _join_and_record(region: SharedRegion) -> tuple[RingAddresses, int, owners.Sidecar | None]:
    """Join a ring and record ourselves as its owner: the ring, the start
    position and the sidecar holding our record. A join interrupted while
    recording (Ctrl-C, ...) leaves the ring Free, as it found it; a record
    that cannot be written only warns (``kickmsg.owners``)."""
    ring, start_pos = _join_or_reclaim(region)
    try:
        return ring, start_pos, _record_ownership(region, ring, start_pos)
    except BaseException:
        rings4.leave(region.core, ring, start_pos)  # type: ignore[arg-type]  # a layout-4 subscriber's
        raise


def _ring_holders(region: SharedRegion) -> str:
    """Who holds the rings, for the error of a join that found none free."""
    records = owners.read_owners(region.name, region.geometry.max_subs) or []
    recorded = sum(held for _, held in records)
    core: region4.Region = region.core  # type: ignore[assignment]  # a layout-4 subscriber's
    retired = sum(
        core.atomics.load_acquire_u32(ring.state_flight) & RING_STATE_MASK == RING_FREE for ring in core.rings
    )
    held = region.geometry.max_subs - retired
    return (
        f"{recorded} by live subscribers of this package, {held - recorded} by subscribers that record no "
        f"owner (e.g. native ones, or ones that could not record themselves: once no process reads such a ring, "
        f"kickmsg repair --ring N --force frees it) or are leaving, {retired} retired by a timed-out teardown "
        f"(kickmsg repair --retired)"
    )


def _record_ownership(region: SharedRegion, ring: RingAddresses, start_pos: int) -> owners.Sidecar | None:
    """Record this process as the ring's owner in the region's sidecar, so
    the ring can be reclaimed if we die (None if it cannot be recorded, or
    the region's name no longer leads to it: nobody could reclaim it by
    name, and the file there is another region's)."""
    if not region.mapping.shared or not region.mapping.is_named():
        return None  # a region in private memory has nobody else to tell
    sidecar = owners.Sidecar.open(region.name, create_with_mode=region.mapping.mode)
    if sidecar is None:
        return None
    claimed = False
    try:
        claimed = sidecar.claim(ring.index, start_pos, region.incarnation()[1])
    finally:
        if not claimed:
            sidecar.close()  # and with it our lock on the record
    return sidecar if claimed else None


def _leave_ring(
    region: SharedRegion,
    ring: RingAddresses,
    start_pos: int,
    owner_pid: int,
    incarnation: tuple[int, int],
    sidecar: owners.Sidecar | None,
) -> bool:
    """The subscriber's finalizer: the teardown flow. Returns False if the
    drain timed out."""
    if os.getpid() != owner_pid:
        return True  # a forked child's copy: the ring belongs to the parent
    left = True
    # Re-created since we joined, the ring is not ours, unless the re-create
    # kept it for us (in place, our record moved to the new incarnation).
    if region.incarnation() == incarnation or (
        sidecar is not None and sidecar.records_us(ring.index, region.incarnation()[1])
    ):
        left = rings4.leave(region.core, ring, start_pos, sidecar)  # type: ignore[arg-type]  # a layout-4 subscriber's
    if sidecar:
        sidecar.close()
    return left


class SampleView:
    """A received message in place: a read-only buffer over its slot.

    The slot stays pinned (it cannot be reused) until the view is released:
    by ``release()``, leaving a ``with`` block, or garbage collection. A
    memoryview or numpy array taken from the view keeps the pin alive too,
    even past ``release()``; new buffers are refused after it.
    """

    def __init__(self, region: SharedRegion, slot: int, length: int, ring_pos: int):
        self._region = region
        self._slot = slot
        self._length = length
        self._ring_pos = ring_pos
        self._released = False
        self._pinned = True
        self._exports = 0  # buffers handed out and not yet released
        self._owner_pid = process.pid

    def __len__(self) -> int:
        return 0 if self._released else self._length

    @property
    def ring_pos(self) -> int:
        """The ring position this message was read at."""
        return self._ring_pos

    @property
    def valid(self) -> bool:
        return not self._released

    def release(self) -> None:
        """End the view (idempotent); the pin goes once no buffer of it is alive."""
        self._released = True
        self._unpin_if_done()

    def __buffer__(self, flags: int) -> memoryview:
        if self._released:
            raise BufferError("SampleView is no longer valid (pin already released)")
        self._exports += 1
        start = self._region.core.payload_offsets[self._slot]  # type: ignore[union-attr]  # a layout-4 view's
        return self._region.mapping.buffer[start : start + self._length].toreadonly()

    def __release_buffer__(self, view: memoryview) -> None:
        self._exports -= 1
        self._unpin_if_done()

    def _unpin_if_done(self) -> None:
        if self._released and self._pinned and self._exports == 0:
            self._pinned = False
            freestack.release_slot(self._region.core, self._slot)

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.release()

    def __del__(self) -> None:
        if process.pid == self._owner_pid:  # not a forked child's copy
            self.release()

    def __repr__(self) -> str:
        return f"SampleView(len={len(self)}, ring_pos={self._ring_pos}, valid={self.valid})"


class SampleView9(SampleView):
    """``SampleView`` of a layout-9 message: the core's view (one pinned
    reference, B.10), released once no buffer of it is alive."""

    def __init__(self, core: v9.SampleView):
        self._core = core
        self._slot = core.slot
        self._length = len(core)
        self._ring_pos = core.ring_pos
        self._released = False
        self._pinned = True
        self._exports = 0
        self._owner_pid = process.pid

    def __buffer__(self, flags: int) -> memoryview:
        if self._released:
            raise BufferError("SampleView is no longer valid (pin already released)")
        self._exports += 1
        return memoryview(self._core)

    def __release_buffer__(self, view: memoryview) -> None:
        view.release()  # the core's own buffer
        self._exports -= 1
        self._unpin_if_done()

    def _unpin_if_done(self) -> None:
        if self._released and self._pinned and self._exports == 0:
            self._pinned = False
            self._core.release()


class Subscriber9(Subscriber):
    """``Subscriber`` on a layout-9 region: join, receive, blocking receive
    and leave through the layout-9 core (``kickmsg.protocol.v9.Subscriber``:
    B.4, B.10-B.12). The ring's owner is the pid and start time the core
    stores in the ring header (no sidecar); ``lost`` is also counted there.
    Spin-then-park, read-latest, WaitSet and asyncio waiting, and following a
    re-created region work as on layout 4."""

    def __init__(self, region: SharedRegion, *, spin: datetime.timedelta | float = DEFAULT_SPIN_S):
        self._spin_ns = to_microseconds(spin, "spin") * 1000
        self._idle_gap_ns = None
        self._blocking = False
        region.require_writable("subscribe")
        region = region.reopen_if_recreated() or region
        self._lost = 0  # lost in rings of regions we followed away from
        self._skipped = 0
        self._drain_timeouts = 0
        self._rejoined = 0
        self._waiting = False  # a WaitSet set has_waiter on our ring
        self._claimed_head = (-1, 0)  # B.11: the head position seen claimed, not committed, and the yields on it in a row
        self._owner_pid = process.pid
        self._closed = True  # until a ring is ours
        self._take(region)
        self._closed = False

    def _take(self, region: SharedRegion) -> None:
        if not isinstance(region.core, v9.Region):
            raise TypeError(f"{region.name} is not a layout-9 region")  # the name now leads to a layout-4 one
        core = v9.Subscriber(region.core)  # B.4 join; none free: raise, still on the region we had
        self._region, self._core = region, core
        self._next_check_in_ns = region.next_check_in_ns()

    @property
    def lost(self) -> int:
        return self._lost + self._core.lost

    @property
    def drain_timeouts(self) -> int:
        return self._drain_timeouts + self._core.drain_timeouts

    def try_receive(self) -> bytes | None:
        self._check_open()
        if time.monotonic_ns() >= self._next_check_in_ns:
            self._check_in()
        return self._core.try_receive()  # B.10, copied under the pin

    def try_receive_view(self) -> "SampleView | None":
        self._check_open()
        if time.monotonic_ns() >= self._next_check_in_ns:
            self._check_in()
        core_view = self._core.try_receive_view()  # B.10
        return None if core_view is None else SampleView9(core_view)

    def _skip_to_newest(self) -> None:
        """Read-latest: move the core's read position to the newest entry
        committed at its own position (a skip marker or lock is passed by)."""
        self._check_open()
        core = self._core
        region = core.region
        ops = region.atomics
        write_pos = ops.load_acquire_u64(core.ring + WRITE_POS_OFFSET)
        if write_pos - core.read_pos > region.geometry.capacity:
            skipped_to = write_pos - region.geometry.capacity
            core.lose(skipped_to - core.read_pos)  # overwritten: lost, as in receive
            core.read_pos = skipped_to
        for position in range(write_pos - 1, core.read_pos, -1):
            sequence = ops.load_acquire_u64(region.entry_address(core.ring_index, position) + SEQUENCE_OFFSET_9)
            if sequence == position + 1:
                self._skipped += position - core.read_pos
                core.read_pos = position
                return

    def _check_in(self) -> None:
        self._next_check_in_ns = self._region.next_check_in_ns()
        self._follow_if_recreated()

    def _report_if_stale(self) -> None:
        """Nothing to write: layout 9 keeps no owner record (the ring's
        header names its owner and counts its losses)."""

    def _follow_if_recreated(self) -> None:
        """A layout-9 region is re-created as a new object: join a ring of
        it, leave the old ring; what we had not read there counts as lost,
        and so does what the new object's rings hold when we join (the most
        any ring was written: published before we joined)."""
        new_region = self._region.reopen_if_recreated()
        if new_region is None:
            return
        old = self._core
        write_pos = old.region.atomics.load_acquire_u64(old.ring + WRITE_POS_OFFSET)
        unread = min(max(0, write_pos - old.read_pos), old.region.geometry.capacity)
        published_before = new_region.stats().total_writes  # into the new object before we join: lost
        self._take(new_region)  # none free: raise, try again at the next call
        if not old.close():
            self._drain_timeouts += 1
        self._lost += old.lost + unread + published_before
        self._drain_timeouts += old.drain_timeouts
        self._rejoined += 1

    def _sleep_until_written(self, deadline_ns: int | None) -> None:
        """B.11: park on the low 32 bits of write_pos with has_waiter = 1 and
        the seq_cst fence; while the head is claimed but not committed (its
        commit brings no wake), yield, and nap after 64 yields in a row."""
        remaining_ns = -1 if deadline_ns is None else deadline_ns - time.monotonic_ns()
        if deadline_ns is not None and remaining_ns <= 0:
            return
        core = self._core
        ops = core.region.atomics
        current = ops.load_relaxed_u64(core.ring + WRITE_POS_OFFSET)
        if current > core.read_pos:
            # B.11: the head is claimed, not committed, and its commit brings
            # no wake-up: yield (the caller tries again at once), and after
            # YIELDS_BEFORE_SLEEP yields in a row nap POLL_SLEEP_S.
            position, yields = self._claimed_head
            yields = yields + 1 if position == core.read_pos else 1
            self._claimed_head = (core.read_pos, yields)
            if yields <= YIELDS_BEFORE_SLEEP:
                os.sched_yield()
            else:
                time.sleep(_at_most(remaining_ns, int(POLL_SLEEP_S * 1e9)) / 1e9)
            return
        if self._region.mapping.shared:
            remaining_ns = _at_most(remaining_ns, max(0, self._next_check_in_ns - time.monotonic_ns()))
        ops.store_relaxed_u32(core.ring + HAS_WAITER_OFFSET, WAITER_FUTEX)
        ops.fence_seq_cst()
        outcome = ops.futex_wait(core.ring + WRITE_POS_OFFSET, current & U32_MAX, remaining_ns)
        ops.store_relaxed_u32(core.ring + HAS_WAITER_OFFSET, WAITER_NONE)
        if outcome < 0 and outcome != FUTEX_TIMED_OUT:
            raise OSError(-outcome, f"futex_wait on {self._region.name}: {os.strerror(-outcome)}")

    def _announce_wait(self, check_in: bool) -> tuple[int, int, int] | None:
        """B.11's steps before the sleep, for a WaitSet: has_waiter = 1,
        seq_cst fence, write_pos. As ``Subscriber._announce_wait``."""
        self._check_open()
        if check_in:
            self._end_wait()
            self._check_in()
        core = self._core
        ops = core.region.atomics
        ops.store_relaxed_u32(core.ring + HAS_WAITER_OFFSET, WAITER_FUTEX)
        ops.fence_seq_cst()
        self._waiting = True
        write_pos = ops.load_acquire_u64(core.ring + WRITE_POS_OFFSET)
        ready = self._ready_at(write_pos)
        if ready:
            return None
        return core.ring + WRITE_POS_OFFSET, write_pos & U32_MAX, -1 if ready is None else UNCOMMITTED_POLL_NS

    def _has_message_ready(self) -> bool:
        self._check_open()
        core = self._core
        return bool(self._ready_at(core.region.atomics.load_acquire_u64(core.ring + WRITE_POS_OFFSET)))

    def _ready_at(self, write_pos: int) -> bool | None:
        """True if a receive has something to do (a committed entry, a skip
        marker, or the ring lapped us), None if the ring is empty, False
        while the next entry is claimed but not committed."""
        core = self._core
        if write_pos <= core.read_pos:
            return None
        if write_pos - core.read_pos > core.region.geometry.capacity:
            return True
        entry = core.region.entry_address(core.ring_index, core.read_pos)
        sequence = core.region.atomics.load_acquire_u64(entry + SEQUENCE_OFFSET_9)
        return not seq_locked(sequence) and seq_pos(sequence) > core.read_pos

    def _end_wait(self) -> None:
        if self._waiting:
            self._waiting = False
            core = self._core
            core.region.atomics.store_relaxed_u32(core.ring + HAS_WAITER_OFFSET, WAITER_NONE)

    def close(self) -> None:
        """Leave the ring (B.12: drain every claim of its window, free it)."""
        if not self._closed:
            self._closed = True
            self._end_wait()
            self._core.close()

    def __del__(self) -> None:
        """Leave when collected, as 0.9.2's Subscriber (not in a forked child: the ring is the parent's)."""
        if getattr(self, "_closed", True) is False and process.pid == self._owner_pid:
            self.close()

    def __repr__(self) -> str:
        state = "closed" if self._closed else f"ring={self._core.ring_index}, read_pos={self._core.read_pos}"
        return f"Subscriber(region={self._region.name!r}, layout=9, {state}, lost={self.lost}, rejoined={self._rejoined})"
