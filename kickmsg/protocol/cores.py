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

from kickmsg import shm
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


class SubscriberCore(Protocol):
    """One joined ring: receive, skip to newest, wait, leave
    (``protocol/v4/receive.py``, ``protocol/v9/receive.py``)."""


class SampleViewCore(Protocol):
    """One received message in place, pinned until released."""
