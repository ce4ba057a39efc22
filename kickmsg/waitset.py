"""WaitSet: sleep until any of many subscribers has a message; handlers.

A WaitSet sleeps on the futex words of all its subscribers' rings at once
(``futex_waitv``: ``kickmsg.protocol.common.sleep_on_words``). On each ring it announces
itself exactly as a blocking receive does: has_waiter = 1, then write_pos
read again, so a message published meanwhile is seen before it sleeps, and
publishers (native 0.1.0 included) wake it with the wake-up they already
make. It never receives: a message stays in its ring until received, and
has_waiter is cleared on every ring when a wait ends, however it ends.
"""
import datetime
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, NamedTuple, Self

from kickmsg.config import to_microseconds
from kickmsg.protocol.common import sleep_on_words
from kickmsg.region import NEVER, SharedRegion
from kickmsg.subscriber import DEFAULT_SPIN_S, Subscriber, _deadline_ns

if TYPE_CHECKING:
    from kickmsg.typed import TypedSubscriber  # not imported at run time: typed needs numpy

__all__ = ["Handler", "WaitSet", "Waitable", "ring_owner"]

type Waitable = Subscriber | TypedSubscriber  # what a WaitSet (and kickmsg.aio) waits on
Handler = Callable[[Any], object]  # handler(message): bytes from a Subscriber, records from a TypedSubscriber


class _Member:
    """A subscriber of a WaitSet: the object added (a Subscriber or a
    TypedSubscriber), its handler, and whether ``spin`` hands it only the
    newest message."""

    def __init__(self, added: Waitable, handler: Handler | None, latest: bool) -> None:
        self.added = added
        self.handler = handler
        self.latest = latest


class _Sleep(NamedTuple):
    """What to sleep on: the futex words and the values seen there, for at
    most ``timeout_ns`` (-1: no limit), and the regions holding the words
    (kept mapped while another thread sleeps on them)."""

    addresses: list[int]
    values: list[int]
    timeout_ns: int
    regions: list[SharedRegion]


def ring_owner(subscriber: Waitable) -> Subscriber:
    """The Subscriber whose ring to sleep on: the object itself, or the
    one a TypedSubscriber (kickmsg.typed) wraps."""
    owner = getattr(subscriber, "subscriber", subscriber)
    if not isinstance(owner, Subscriber):
        raise TypeError(f"a WaitSet waits on a Subscriber or a TypedSubscriber, not {subscriber!r}")
    return owner


def _sooner(first_ns: int, second_ns: int) -> int:
    """The shorter of two sleeps (negative: no limit)."""
    if first_ns < 0:
        return second_ns
    return first_ns if second_ns < 0 else min(first_ns, second_ns)


class WaitSet:
    """Waits on many subscribers at once, from one thread.

    ``wait(timeout)`` returns the subscribers with a message ready, in the
    order they were added; ``spin_once``/``spin`` call the handler given to
    ``add`` for each message. Subscribers and typed subscribers
    (``kickmsg.typed``) both fit. While it waits, a WaitSet checks in for
    its subscribers every 0.1 s, so that they follow a re-created region as
    a blocking receive does (and it then sleeps on the new ring).

    Up to 128 subscribers (FUTEX_WAITV_MAX) sleep in the kernel; beyond
    that the others are compared between slices of that sleep (50 us
    doubling to 5 ms while nothing changes), so a message to one of them is
    seen within 5 ms.

    Spin, then park, as a blocking receive: while the last wait lasted less
    than ``spin`` (a timedelta or seconds; 0: never), the next one first
    looks at its subscribers' rings for up to that long without announcing
    itself (publishers make no wake-up call meanwhile), then sleeps.
    """

    def __init__(self, *, spin: datetime.timedelta | float = DEFAULT_SPIN_S) -> None:
        self._members: dict[Subscriber, _Member] = {}  # keyed by the subscriber owning the ring
        self._next_check_in_ns = 0  # when to check in for every subscriber: at the first wait
        self._spin_ns = to_microseconds(spin, "spin") * 1000
        self._idle_gap_ns: int | None = None  # how long the last wait took (None: no wait yet)

    def add(self, subscriber: Waitable, handler: Handler | None = None, *, latest: bool = False) -> None:
        """Wait on ``subscriber`` too. ``handler(message)`` is called by
        ``spin`` for each message (a copy, or a typed subscriber's records);
        with ``latest``, only for the newest one ready (read-latest: those
        passed over count in ``skipped``). A subscriber closed later
        is removed from the set by the next wait (it can receive nothing
        more)."""
        owner = ring_owner(subscriber)
        if handler is not None and not callable(handler):
            raise TypeError(f"a WaitSet handler must be callable, not {handler!r}")
        if owner._closed:
            raise ValueError(f"{subscriber!r} is closed: a WaitSet cannot wait on it")
        if owner in self._members:
            raise ValueError(f"{subscriber!r} is already in this WaitSet")
        self._members[owner] = _Member(subscriber, handler, latest)

    def remove(self, subscriber: Waitable) -> None:
        """Stop waiting on ``subscriber`` (KeyError if it is not here)."""
        owner = ring_owner(subscriber)
        if owner not in self._members:
            raise KeyError(f"{subscriber!r} is not in this WaitSet")
        del self._members[owner]
        owner._end_wait()

    def __contains__(self, subscriber: Waitable) -> bool:
        return ring_owner(subscriber) in self._members

    def __len__(self) -> int:
        return len(self._members)

    def wait(self, timeout: datetime.timedelta | float | None = None) -> list[Waitable]:
        """Sleep (without the GIL) until a subscriber has a message ready,
        at most ``timeout`` (a timedelta or seconds; None: no limit).
        Returns the subscribers with a message ready (empty on timeout);
        receiving is up to the caller. Subscribers closed since they were
        added are removed first."""
        self._remove_closed()
        if not self._members:
            raise ValueError("this WaitSet has no subscribers to wait on")
        deadline_ns = _deadline_ns(timeout)
        began_ns = time.monotonic_ns()
        ready = self._spin(began_ns, deadline_ns)
        try:
            while not ready:
                ready, sleep = self._look()
                if ready:
                    break
                remaining_ns = -1 if deadline_ns is None else deadline_ns - time.monotonic_ns()
                if deadline_ns is not None and remaining_ns <= 0:
                    for owner in self._members:
                        owner._report_if_stale()  # giving up, idle: leave their records current
                    break
                sleep_on_words(sleep.addresses, sleep.values, _sooner(remaining_ns, sleep.timeout_ns))
        finally:
            for owner in self._members:
                owner._end_wait()
        self._idle_gap_ns = time.monotonic_ns() - began_ns
        return ready

    def _remove_closed(self) -> None:
        """Forget the subscribers closed since they were added."""
        for owner in [owner for owner in self._members if owner._closed]:
            del self._members[owner]

    def _spin(self, began_ns: int, deadline_ns: int | None) -> list[Waitable]:
        """While the last wait lasted less than the spin budget: look at every
        ring (without announcing a wait) for up to that budget, or until the
        deadline. The subscribers with a message ready, or []."""
        if self._idle_gap_ns is None or self._idle_gap_ns >= self._spin_ns:
            return []
        until_ns = began_ns + self._spin_ns if deadline_ns is None else min(began_ns + self._spin_ns, deadline_ns)
        while time.monotonic_ns() < until_ns:
            ready = [member.added for owner, member in self._members.items() if owner._has_message_ready()]
            if ready:
                return ready
        return []

    def _look(self) -> tuple[list[Waitable], _Sleep]:
        """Check in for every subscriber when due, announce ourselves on
        every ring, and look: the subscribers with a message ready, and what
        to sleep on for the others."""
        check_in = time.monotonic_ns() >= self._next_check_in_ns
        if check_in:
            self._next_check_in_ns = min((owner.region.next_check_in_ns() for owner in self._members), default=NEVER)
        longest_ns = -1 if self._next_check_in_ns == NEVER else max(0, self._next_check_in_ns - time.monotonic_ns())
        ready: list[Waitable] = []
        addresses, values, regions = [], [], []
        for owner, member in self._members.items():
            word = owner._announce_wait(check_in)
            if word is None:
                ready.append(member.added)
                continue
            address, value, nap_ns = word
            addresses.append(address)
            values.append(value)
            regions.append(owner.region)
            longest_ns = _sooner(longest_ns, nap_ns)
        return ready, _Sleep(addresses, values, longest_ns, regions)

    # -- handlers ---------------------------------------------------------------

    def spin_once(self, timeout: datetime.timedelta | float | None = None) -> int:
        """Wait up to ``timeout`` for messages, then call each ready
        subscriber's handler for its messages (at most a ring's worth each,
        so that a busy channel cannot starve the others; the newest one
        only for a subscriber added with ``latest``). Returns how many
        messages were handled (0 on timeout)."""
        unhandled = [member.added for member in self._members.values() if member.handler is None]
        if unhandled:
            raise ValueError(f"spin needs a handler for every subscriber (add(subscriber, handler)): none for {unhandled[0]!r}")
        handled = 0
        for added in self.wait(timeout):
            owner = ring_owner(added)
            member = self._members[owner]
            handler = member.handler
            assert handler is not None  # checked above
            receive = added.try_receive_latest if member.latest else added.try_receive
            for _ in range(1 if member.latest else owner.region.geometry.capacity):
                message = receive()
                if message is None:
                    break
                handler(message)
                handled += 1
                if owner._closed:  # by its handler: the next wait removes it
                    break
        return handled

    def spin(self, timeout: datetime.timedelta | float | None = None) -> int:
        """``spin_once`` until ``timeout`` has passed (None: for ever; an
        exception from a handler, or Ctrl-C, ends it too). Returns how many
        messages were handled."""
        deadline_ns = _deadline_ns(timeout)
        handled = 0
        while deadline_ns is None or (remaining_ns := deadline_ns - time.monotonic_ns()) > 0:
            handled += self.spin_once(None if deadline_ns is None else remaining_ns / 1e9)
        return handled

    # -- closing ----------------------------------------------------------------

    def close(self) -> None:
        """Remove every subscriber (they stay open: they are the caller's)."""
        for owner in list(self._members):
            del self._members[owner]
            owner._end_wait()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def __repr__(self) -> str:
        names = ", ".join(owner.region.name for owner in self._members)
        return f"WaitSet({len(self._members)} subscribers: {names})"
