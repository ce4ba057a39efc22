"""Subscriber and SampleView: receiving, one API over both layouts.

Each subscriber owns one ring of the region through its layout's core
(``kickmsg.protocol.v4.receive.Subscriber`` or
``kickmsg.protocol.v9.receive.Subscriber``, chosen by ``region.layout``):
the core joins, receives (copied and in place), skips to the newest entry,
parks on the ring's futex (the blocking receive), gives a WaitSet its words
and leaves. What this module adds is policy: the spin budget, check-ins and
following a re-created region, owner records (``kickmsg.owners``, layout
4), counters and errors.
"""
import datetime
import os
import time
import weakref
from collections.abc import Callable
from typing import Self, TypeVar

from kickmsg import owners
from kickmsg.config import to_microseconds
from kickmsg.protocol import v9
from kickmsg.protocol.cores import SampleViewCore, SubscriberCore
from kickmsg.protocol.v4 import receive as receive4
from kickmsg.protocol.v4 import region as region4
from kickmsg.region import NEVER, SharedRegion

__all__ = ["DEFAULT_SPIN_S", "SampleView", "Subscriber", "UNCOMMITTED_POLL_NS"]

M = TypeVar("M")  # what a receive gives: bytes or a SampleView

UNCOMMITTED_POLL_NS = receive4.UNCOMMITTED_POLL_NS  # the nap while a claimed entry is not committed yet
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

    On a layout-4 region the ring's owner is recorded beside the region
    (``kickmsg.owners``); on a layout-9 region the core records it in the
    ring header, which also counts its losses.
    """

    def __init__(self, region: SharedRegion, *, spin: datetime.timedelta | float = DEFAULT_SPIN_S):
        if not isinstance(region, SharedRegion):
            raise TypeError(f"Subscriber needs a SharedRegion, got {region!r}")
        self._spin_ns = to_microseconds(spin, "spin") * 1000
        self._idle_gap_ns: int | None = None  # how long the last wait for a message took (None: no wait yet)
        self._blocking = False  # inside a blocking receive
        region.require_writable("subscribe")
        region = region.reopen_if_recreated() or region  # a stale region object: use what the name leads to
        self._lost = 0  # counted by the cores of rings we followed away from
        self._skipped = 0  # the same for skipped and drain_timeouts
        self._drain_timeouts = 0
        self._rejoined = 0
        self._closed = False
        self._waiting_on: SubscriberCore | None = None  # the core whose has_waiter a WaitSet set for us
        self._take(region, *_join_and_record(region))

    def _take(self, region: SharedRegion, core: SubscriberCore, sidecar: owners.Sidecar | None) -> None:
        """Make a joined ring ours: leave it (and close ``sidecar``, which
        holds our owner record) when closed or collected."""
        self._region, self._core, self._sidecar = region, core, sidecar
        self._core_try_receive, self._core_try_receive_view = core.try_receive, core.try_receive_view  # bound once
        self._reported = (core.read_pos, self.lost)  # (read_pos, lost) last written to the owner record
        self._next_check_in_ns = region.next_check_in_ns()
        self._teardown = weakref.finalize(self, _leave, core, region, os.getpid(), region.incarnation(), sidecar)

    @property
    def region(self) -> SharedRegion:
        """The region this subscriber reads from."""
        return self._region

    @property
    def core(self) -> SubscriberCore:
        """The layout's core that owns our ring (``kickmsg.protocol.cores.SubscriberCore``)."""
        return self._core

    @property
    def lost(self) -> int:
        """Messages this subscriber missed: overwritten in its ring before it
        read them, or found unreadable."""
        return self._lost + self._core.lost

    @property
    def skipped(self) -> int:
        """Committed messages passed over by ``try_receive_latest`` /
        ``receive_latest`` to reach the newest one (not counted in ``lost``)."""
        return self._skipped + self._core.skipped

    @property
    def drain_timeouts(self) -> int:
        """Times leaving the ring gave up waiting for an in-flight publisher."""
        return self._drain_timeouts + self._core.drain_timeouts

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
        if self._closed:
            self._check_open()
        checking_in = time.monotonic_ns() >= self._next_check_in_ns
        if checking_in:
            self._check_in(report=False)  # follow a re-created region before receiving
        data = self._core_try_receive()
        # The record, after this receive: at a check-in, or when a poll found nothing (going idle).
        if checking_in or (data is None and not self._blocking):
            self._report_if_stale()
        return data

    def try_receive_view(self) -> "SampleView | None":
        """The next message in place (zero-copy, its slot pinned until the
        view is released), or None if none is ready."""
        if self._closed:
            self._check_open()
        checking_in = time.monotonic_ns() >= self._next_check_in_ns
        if checking_in:
            self._check_in(report=False)  # follow a re-created region before receiving
        view = self._core_try_receive_view()
        # The record, after this receive: at a check-in, or when a poll found nothing (going idle).
        if checking_in or (view is None and not self._blocking):
            self._report_if_stale()
        return None if view is None else SampleView(view)

    def receive(self, timeout: datetime.timedelta | float | None = None) -> bytes | None:
        """Like ``try_receive``, but sleeps (without the GIL) up to ``timeout``
        (a timedelta or seconds; None, the default, waits until a message
        comes: Ctrl-C interrupts it). None on timeout."""
        return self._receive_blocking(self.try_receive, _copied, False, timeout)

    def receive_view(self, timeout: datetime.timedelta | float | None = None) -> "SampleView | None":
        """Like ``try_receive_view``, blocking up to ``timeout``."""
        return self._receive_blocking(self.try_receive_view, SampleView, False, timeout)

    def try_receive_latest(self) -> bytes | None:
        """The newest committed message (a copy), passing over older unread
        ones (counted in ``skipped``), or None if nothing new is ready."""
        self._skip_to_newest()
        return self.try_receive()

    def _skip_to_newest(self) -> None:
        """Read-latest (also kickmsg.typed's): the core moves read_pos to the newest committed entry."""
        self._check_open()
        self._core.skip_to_newest()

    def receive_latest(self, timeout: datetime.timedelta | float | None = None) -> bytes | None:
        """Like ``try_receive_latest``, blocking up to ``timeout``."""
        return self._receive_blocking(self.try_receive_latest, _copied, True, timeout)

    def __iter__(self) -> Self:
        """Iterate over the messages available now (copies), then stop."""
        return self

    def __next__(self) -> bytes:
        data = self.try_receive()
        if data is None:
            raise StopIteration
        return data

    def _receive_blocking(
        self,
        attempt: Callable[[], M | None],
        made: Callable[[SampleViewCore], M],
        latest: bool,
        timeout: datetime.timedelta | float | None,
    ) -> M | None:
        """Spin, then park: call ``attempt`` (a non-blocking receive) while
        the last wait for a message took less than the spin budget, for up to
        that budget (holding the GIL, no system call: a message is seen the
        moment it is committed); then the core's blocking receive (``made``
        turns its view into what we return), which parks on the futex until
        a message, the deadline or the next check-in. A topic slower than
        the budget never spins."""
        deadline_ns = _deadline_ns(timeout)
        self._blocking = True  # its misses write no record: check-ins and giving up do
        try:
            message = attempt()
            if message is not None:
                return message
            began_ns = time.monotonic_ns()
            if self._idle_gap_ns is not None and self._idle_gap_ns < self._spin_ns:
                spin_until_ns = began_ns + self._spin_ns
                if deadline_ns is not None:
                    spin_until_ns = min(spin_until_ns, deadline_ns)
                while message is None and time.monotonic_ns() < spin_until_ns:
                    message = attempt()
            while message is None:
                if deadline_ns is not None and time.monotonic_ns() >= deadline_ns:
                    self._report_if_stale()  # giving up, idle: leave the record current
                    return None
                # Wake for the next check-in (it follows a re-created region,
                # whose publishers would never wake us on this one's futex, and
                # brings our record up to date), not sooner.
                park_until_ns = min(NEVER if deadline_ns is None else deadline_ns, self._next_check_in_ns)
                view = self._core.receive_view_until(None if park_until_ns == NEVER else park_until_ns, latest)
                if view is not None:
                    message = made(view)
                elif time.monotonic_ns() >= self._next_check_in_ns or self._core.rewound:
                    self._check_in()
            self._idle_gap_ns = time.monotonic_ns() - began_ns
            return message
        finally:
            self._blocking = False

    def _check_in(self, report: bool = True) -> None:
        """Every CHECK_IN_INTERVAL_NS while receiving or waiting: follow the
        region's name if it was re-created, and bring our owner record up
        to date (unless ``report`` is False: the caller does, after its
        receive)."""
        self._next_check_in_ns = self._region.next_check_in_ns()
        self._follow_if_recreated()
        if report:
            self._report_if_stale()

    def _report_if_stale(self) -> None:
        """Write read_pos and lost into our owner record (layout 4, for
        ``kickmsg stats``/``watch``) if they changed since last written: at
        check-in (a sleeping receive wakes for it), when a blocking receive
        gives up and when a poll (not a blocking receive's) finds nothing;
        never per message or per wake-up of a blocking receive."""
        if self._sidecar:
            progress = (self._core.read_pos, self.lost)
            if progress != self._reported:
                self._sidecar.report_progress(self._core.ring_index, *progress)
                self._reported = progress

    def _follow_if_recreated(self) -> None:
        """If our region was re-created (beyond 0.1.0), go on in the new one.
        Re-created in place by this package (layout 4), it kept our ring
        Live at its write position: read on (what we had not read shows as
        lost entries). Otherwise join a ring of the new region and leave the
        old ring (if it is still ours); what we had not read there counts as
        lost, and so does what a new object's rings hold when we join
        (published before we joined)."""
        region, core = self._region, self._core
        new_region = region.reopen_if_recreated()
        if new_region is None:
            return
        in_place = new_region.mapping.identity == region.mapping.identity
        new_core = new_region.core
        if (in_place and isinstance(core, receive4.Subscriber) and isinstance(new_core, region4.Region)
                and self._sidecar and self._sidecar.records_us(core.ring_index, new_region.created_at_ns)):
            self._teardown.detach()  # our ring and record live on in the new incarnation
            self._take(new_region, core.in_region(new_core), self._sidecar)
        else:
            unread = core.unread(ring_reset=in_place)
            # A new object's rings all began at 0: what its rings hold was published before we join.
            published_before = 0 if in_place else new_region.stats().total_writes
            joined = _join_and_record(new_region)  # none free: raise, try again at the next call
            self._teardown()  # leave the old ring (its drain timeout is counted in the old core)
            self._lost += core.lost + unread + published_before
            self._skipped += core.skipped
            self._drain_timeouts += core.drain_timeouts
            self._take(new_region, *joined)
        self._rejoined += 1

    # -- waiting together with other subscribers (kickmsg.waitset, kickmsg.aio) --

    def _announce_wait(self, check_in: bool) -> tuple[int, int, int] | None:
        """A blocking receive's steps before it sleeps, for a WaitSet that
        sleeps on many rings at once: check in first if ``check_in``, then
        the core's ``announce_wait`` (has_waiter = 1, write_pos read again).
        None if a receive has something to do now; else the futex word, the
        value seen there, and the longest sleep in ns (-1: no limit).
        has_waiter stays set until ``_end_wait``."""
        self._check_open()
        if check_in:
            self._end_wait()  # checking in may take us to another ring
            self._check_in()
        core = self._core
        self._waiting_on = core
        word = core.announce_wait()
        if core.rewound:
            self._next_check_in_ns = 0  # reset by a re-create in place: the next receive checks in
        return word

    def _has_message_ready(self) -> bool:
        """Whether a receive has something to do now, looked at without
        announcing a wait (a WaitSet's spin: publishers make no wake-up call)."""
        self._check_open()
        ready = self._core.has_message_ready()
        if self._core.rewound:
            self._next_check_in_ns = 0
        return ready

    def _end_wait(self) -> None:
        """After the sleep: has_waiter = 0 on the ring ``_announce_wait`` set it on."""
        if self._waiting_on is not None:
            self._waiting_on.end_wait()
            self._waiting_on = None

    # -- leaving --------------------------------------------------------------

    def close(self) -> None:
        """Leave the ring: release its references and free it for a new
        subscriber. Views already received stay valid."""
        if self._teardown.alive:
            self._closed = True
            self._end_wait()
            self._teardown()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def __repr__(self) -> str:
        state = "closed" if self._closed else f"ring={self._core.ring_index}, read_pos={self._core.read_pos}"
        return (
            f"Subscriber(region={self._region.name!r}, layout={self._region.layout}, {state}, lost={self.lost}, "
            f"drain_timeouts={self.drain_timeouts}, rejoined={self._rejoined})"
        )


def _copied(view: SampleViewCore) -> bytes:
    """A core's view copied out, then released."""
    data = bytes(view)
    view.release()
    return data


def _deadline_ns(timeout: datetime.timedelta | float | None) -> int | None:
    if timeout is None:
        return None
    return time.monotonic_ns() + to_microseconds(timeout, "timeout") * 1000


def _join_and_record(region: SharedRegion) -> tuple[SubscriberCore, owners.Sidecar | None]:
    """Join a ring through the region's core; on layout 4, record ourselves
    as its owner beside the region (layout 9's core records the owner in
    the ring header). A join interrupted while recording (Ctrl-C, ...)
    leaves the ring Free, as it found it; a record that cannot be written
    only warns (``kickmsg.owners``)."""
    region_core = region.core
    if isinstance(region_core, v9.Region):
        return v9.Subscriber(region_core), None
    core = receive4.Subscriber(region_core)
    try:
        return core, _record_ownership(region, core)
    except BaseException:
        core.close()
        raise


def _record_ownership(region: SharedRegion, core: receive4.Subscriber) -> owners.Sidecar | None:
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
        claimed = sidecar.claim(core.ring_index, core.start_pos, region.created_at_ns)
    finally:
        if not claimed:
            sidecar.close()  # and with it our lock on the record
    return sidecar if claimed else None


def _leave(
    core: SubscriberCore,
    region: SharedRegion,
    owner_pid: int,
    incarnation: tuple[int, int],
    sidecar: owners.Sidecar | None,
) -> None:
    """The subscriber's finalizer: the core leaves the ring (clearing our
    owner record just before the ring is Free), then the record's file is
    closed."""
    if os.getpid() != owner_pid:
        return  # a forked child's copy: the ring belongs to the parent
    # Re-created since we joined, the ring is not ours, unless the re-create
    # kept it for us (in place, our record moved to the new incarnation).
    if region.incarnation() == incarnation or (
        sidecar is not None and sidecar.records_us(core.ring_index, region.created_at_ns)
    ):
        core.close(sidecar)
    if sidecar:
        sidecar.close()


class SampleView:
    """A received message in place: a read-only buffer over its slot.

    The slot stays pinned (it cannot be reused) until the view is released:
    by ``release()``, leaving a ``with`` block, or garbage collection. A
    memoryview or numpy array taken from the view keeps the pin alive too,
    even past ``release()``; new buffers are refused after it.
    """

    __slots__ = ("_core", "_exports", "_released")

    def __init__(self, core: SampleViewCore):
        self._core = core  # the layout's view: its pin goes at its release(), or with it when collected
        self._released = False
        self._exports = 0  # buffers handed out and not yet released

    def __len__(self) -> int:
        return 0 if self._released else len(self._core)

    @property
    def ring_pos(self) -> int:
        """The ring position this message was read at."""
        return self._core.ring_pos

    @property
    def valid(self) -> bool:
        return not self._released

    def release(self) -> None:
        """End the view (idempotent); the pin goes once no buffer of it is alive."""
        if not self._released:
            self._released = True
            if not self._exports:
                self._core.release()

    def __buffer__(self, flags: int) -> memoryview:
        if self._released:
            raise BufferError("SampleView is no longer valid (pin already released)")
        self._exports += 1
        return memoryview(self._core)

    def __release_buffer__(self, view: memoryview) -> None:
        view.release()  # the core's own buffer
        self._exports -= 1
        if self._released and not self._exports:
            self._core.release()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.release()

    def __repr__(self) -> str:
        return f"SampleView(len={len(self)}, ring_pos={self.ring_pos}, valid={self.valid})"
