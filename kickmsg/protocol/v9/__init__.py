"""Layout 9: channels byte-compatible with native ``kickmsg==0.9.2``.

Each module reads beside its section of WIRE9.md:

- ``layout``: constants, byte layout, sizes, hashes, validation, naming (A);
- ``words``: the sequence and meta words of a ring entry (A.4);
- ``region``: create, open, create_or_open, info, stats (B.1-B.3, B.18);
- ``publish``: ``Publisher``: allocate and publish with lock, steal, takeover, wake (B.5-B.9, B.15);
- ``receive``: ``Subscriber``, ``SampleView``: join, receive, skip to newest, blocking receive, a WaitSet's words,
  leave and drain (B.4, B.10-B.12; the drain is ``repair.drain_window``);
- ``repair``: diagnose, repair_locked_entries, reset_retired_rings, reclaim_dead_rings,
  reclaim_orphaned_slots, owner liveness, the schema claim (B.13, B.16, B.17);
- ``registry``: ``Registry``, ``NodeRows``: the participant registry, version 4 (C);
- ``blackboard``: ``Blackboard`` and its writers and readers, region version 2 (D).

The slot pool's free stack (B.14) and the words both layouts share are
beside it: ``kickmsg.protocol.freestack``, ``kickmsg.protocol.common``.
``kickmsg.SharedRegion``, ``Publisher``, ``Subscriber`` and ``SampleView``
hold this core's classes on a layout-9 region (``SharedRegion.core`` is a
``Region``), as they hold ``kickmsg.protocol.v4``'s on a layout-4 one.
"""
from kickmsg.protocol.v9.publish import Publisher
from kickmsg.protocol.v9.receive import SampleView, Subscriber
from kickmsg.protocol.v9.layout import CorruptRegionError, Geometry, VersionMismatchError
from kickmsg.protocol.info import RegionInfo, RegionStats, RingStats
from kickmsg.protocol.v9.region import ChannelConfig, Region

__all__ = [
    "ChannelConfig",
    "CorruptRegionError",
    "Geometry",
    "Publisher",
    "Region",
    "RegionInfo",
    "RegionStats",
    "RingStats",
    "SampleView",
    "Subscriber",
    "VersionMismatchError",
]
