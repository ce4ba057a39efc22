"""The shape every layout's core has, described once.

``kickmsg.protocol.v4`` and ``kickmsg.protocol.v9`` each provide these four
classes; the API (``kickmsg.region``, ``kickmsg.publisher``,
``kickmsg.subscriber``) holds one of each by composition, chosen once when
the region is created or opened, and adds policy only (the spin budget,
check-ins and following a re-created region, owner records, counters,
errors). A core owns each flow whole: allocate -> publish -> send; join ->
receive (copied and in place) -> skip to newest -> the waiting words a
WaitSet needs -> park on the futex -> leave and drain. ``kickmsg verify``
explores these very methods.
"""
from typing import Protocol

from kickmsg import owners, shm
from kickmsg.atomics import Atomics
from kickmsg.protocol.info import ChannelGeometry, HeaderWords, RegionInfo, RegionStats, RingWords
from kickmsg.schema import SchemaInfo

__all__ = ["PublisherCore", "RegionCore", "SampleViewCore", "SubscriberCore"]


class RegionCore(Protocol):
    """One mapped region of one layout: its geometry, its addresses, what it
    reports (``protocol/v4/region.py``, ``protocol/v9/region.py``). Its
    repairs are functions of the same names over it in each layout's
    ``repair.py``."""

    layout: int  # 4 or 9: the version word
    mapping: shm.Mapping
    atomics: Atomics  # the door every flow's atomic access goes through
    created_at_ns: int  # which incarnation of the name this object is

    @property
    def name(self) -> str: ...

    @property
    def geometry(self) -> ChannelGeometry: ...

    def incarnation(self) -> tuple[int, int]:
        """(creator_pid, created_at_ns) of the header."""

    def replaced(self) -> bool:
        """Re-created since this object attached: magic or creation stamp
        changed, or the name leads to another object."""

    def rings_in_use(self) -> list[int]:
        """The rings that are not idle (state_flight or write_pos nonzero)."""

    def info(self) -> RegionInfo:
        """0.9.2's ``RegionInfo``."""

    def stats(self) -> RegionStats:
        """0.9.2's ``RegionStats`` (racy by nature)."""

    def schema(self) -> SchemaInfo | None:
        """The descriptor once Set, else None."""

    def header_words(self) -> HeaderWords:
        """The header's atomic words, for the tools."""

    def ring_words(self, index: int) -> RingWords:
        """A snapshot of ring ``index``'s words, for the tools."""


class PublisherCore(Protocol):
    """allocate -> publish -> send on one region (``protocol/v4/publish.py``,
    ``protocol/v9/publish.py``). It holds at most one reservation: the slot
    ``allocate`` reserved and ``publish`` has not consumed."""

    dropped: int  # deliveries abandoned: a ring entry not locked (layout 9: or its lock taken over)

    def allocate(self) -> int:
        """Reserve a free slot (a previous reservation goes back to the pool):
        its index, or INVALID_SLOT when the pool is empty."""
        ...

    def payload(self, slot: int, length: int) -> memoryview:
        """The first ``length`` payload bytes of a reserved slot, to write."""
        ...

    def publish(self, slot: int, length: int) -> int:
        """Deliver the reserved ``slot`` holding ``length`` bytes to every Live
        ring: how many rings received it."""
        ...

    def send(self, data: bytes | bytearray | memoryview) -> int:
        """Copy ``data`` into a free slot and publish it: ``len(data)``.
        ValueError if it is too long, PoolEmptyError if the pool is empty."""
        ...

    def give_back(self, slot: int) -> None:
        """Return a reserved slot that will not be published to the pool."""
        ...

    def set_aside(self, slot: int) -> None:
        """``slot`` stops being the reservation but stays out of the pool (a
        buffer over it is still alive) until ``give_back(slot)``."""
        ...


class SampleViewCore(Protocol):
    """One received message in place, its slot pinned until ``release()``;
    read-only ``memoryview(view)`` works until then
    (``protocol/v4/receive.py``, ``protocol/v9/receive.py``)."""

    slot: int  # the pinned slot
    ring_pos: int  # the ring position it was read at
    valid: bool  # not released yet

    def __len__(self) -> int: ...

    def __buffer__(self, flags: int) -> memoryview: ...

    def release(self) -> None:
        """Drop the pin (idempotent); BufferError while a memoryview of it is open."""


class SubscriberCore(Protocol):
    """One joined ring, joined when made (``protocol/v4/receive.py``,
    ``protocol/v9/receive.py``): receive (copied and in place), skip to
    newest, the blocking receive (park on the ring's futex), the words a
    WaitSet sleeps on, leave and drain."""

    ring_index: int
    start_pos: int  # where reading began: the drain's floor
    read_pos: int  # the next position to read (process-private)
    lost: int  # messages missed in this ring: overwritten, skipped or unreadable
    skipped: int  # committed messages passed over by skip_to_newest
    drain_timeouts: int  # leaves that gave up waiting for a publisher in flight
    rewound: bool  # write_pos was last seen behind read_pos: the region was re-created in place (layout 4)

    def try_receive(self) -> bytes | None:
        """The next message copied out, or None."""

    def try_receive_view(self) -> SampleViewCore | None:
        """The next message in place, or None."""

    def skip_to_newest(self) -> None:
        """Read-latest: read_pos to the newest committed entry."""

    def receive_view_until(self, deadline_ns: int | None, latest: bool = False) -> SampleViewCore | None:
        """The blocking receive: try, park, try again until a message or
        ``deadline_ns`` (None: no deadline; None returned then, or once
        ``rewound``)."""

    def receive_view(self, timeout_s: float) -> SampleViewCore | None:
        """``receive_view_until`` ``timeout_s`` seconds from now (0.9.2's shape)."""

    def receive(self, timeout_s: float) -> bytes | None:
        """The same, copied out."""

    def park(self, deadline_ns: int | None) -> bool:
        """One wait on the ring's futex (or a nap while the head is claimed,
        not committed); False once the deadline passed (or ``rewound``)."""

    def announce_wait(self) -> tuple[int, int, int] | None:
        """has_waiter = 1, then write_pos: None if a receive has something
        to do, else (futex word, value seen, longest sleep in ns, -1: none)."""

    def has_message_ready(self) -> bool:
        """Whether a receive has something to do, without announcing."""

    def end_wait(self) -> None:
        """has_waiter = 0 after a WaitSet's sleep."""

    def unread(self, ring_reset: bool = False) -> int:
        """Messages in the ring not read yet, at most a ring's worth."""

    def close(self, record: owners.Sidecar | None = None) -> bool:
        """Leave and drain the ring, clearing ``record`` (an owner record kept
        beside the region) just before it is Free; False if a publisher
        stayed in flight (the ring is left retired)."""
