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

__all__ = ["PublisherCore", "RegionCore", "SampleViewCore", "SubscriberCore"]


class RegionCore(Protocol):
    """One mapped region of one layout: its geometry, its addresses, its
    repairs (``protocol/v4/region.py``, ``protocol/v9/region.py``)."""


class PublisherCore(Protocol):
    """allocate -> publish -> send on one region (``protocol/v4/publish.py``,
    ``protocol/v9/publish.py``)."""


class SubscriberCore(Protocol):
    """One joined ring: receive, skip to newest, wait, leave
    (``protocol/v4/receive.py``, ``protocol/v9/receive.py``)."""


class SampleViewCore(Protocol):
    """One received message in place, pinned until released."""
