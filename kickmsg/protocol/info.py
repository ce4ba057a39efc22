"""What 0.9.2's ``SharedRegion.info()`` and ``stats()`` report, for both
layouts (WIRE9.md B.18; layout 4 reports the same, with no counters).

``region_info`` builds ``RegionInfo`` from a region's geometry and header
(``config_differences`` says how two geometries' configs differ):
the header words it reads (creator_pid, created_at_ns) are at the same
offsets in both layouts.
"""
import ctypes
from dataclasses import dataclass, field
from typing import Protocol

from kickmsg.config import ChannelType

__all__ = ["ChannelGeometry", "DrainedRing", "HealthCounts", "RegionInfo", "RegionStats", "RingStats", "config_differences", "region_info"]


@dataclass(frozen=True)
class HealthCounts:
    """What a layout's ``diagnose`` counts (``kickmsg.HealthReport`` says
    what each means); dead_rings is beyond 0.1.0 and C++-only in 0.9.2."""

    locked_entries: int = 0
    retired_rings: int = 0
    draining_rings: int = 0
    live_rings: int = 0
    schema_stuck: bool = False
    dead_rings: int = 0
    stranded_slots: int = 0  # slots only rings that are not Live hold (beyond 0.9.2)
    live_held_slots: int = 0  # distinct slots Live rings hold (beyond 0.9.2)


@dataclass(frozen=True)
class DrainedRing:
    """A Free ring whose entries' claims (layout 4: references) a repair
    gave back (both layouts' ``drain_free_rings``): its index, the
    publishers its state counted in flight (more than 0: a retired ring,
    reset), and the slot of each claim given back (a slot goes back on the
    free stack once no ring or view holds it any more)."""

    ring: int
    in_flight: int
    slots: list[int]


@dataclass(frozen=True)
class RegionInfo:
    """What 0.9.2's ``SharedRegion.info()`` reports."""

    shm_name: str
    channel_type: int
    version: int
    config_hash: int
    total_size: int
    max_subs: int
    sub_ring_capacity: int
    pool_size: int
    max_payload_size: int
    commit_timeout_us: int
    creator_pid: int
    creator_name: str
    created_at_ns: int


@dataclass(frozen=True)
class RingStats:
    state: str
    in_flight: int
    write_pos: int
    dropped_count: int
    lost_count: int


@dataclass(frozen=True)
class RegionStats:
    """What 0.9.2's ``SharedRegion.stats()`` reports (B.18)."""

    rings: list[RingStats] = field(default_factory=list)
    total_writes: int = 0
    total_drops: int = 0
    total_losses: int = 0
    total_steals: int = 0
    live_rings: int = 0
    pool_free: int = 0
    pool_size: int = 0


class ChannelGeometry(Protocol):
    """What both layouts' ``Geometry`` say of the config that made a region."""

    @property
    def channel_type(self) -> int: ...

    @property
    def config_hash(self) -> int: ...

    @property
    def total_size(self) -> int: ...

    @property
    def max_subs(self) -> int: ...

    @property
    def capacity(self) -> int: ...

    @property
    def pool_size(self) -> int: ...

    @property
    def slot_data_size(self) -> int: ...

    @property
    def commit_timeout_us(self) -> int: ...


def config_differences(existing: ChannelGeometry, wanted: ChannelGeometry) -> str:
    """How an existing region's config differs from the one asked for
    (``pool_size is 4096 there, 2048 here``), for a config mismatch's error."""
    fields = (
        ("channel type", ChannelType(existing.channel_type).name, ChannelType(wanted.channel_type).name),
        ("max_subscribers", existing.max_subs, wanted.max_subs),
        ("sub_ring_capacity", existing.capacity, wanted.capacity),
        ("pool_size", existing.pool_size, wanted.pool_size),
        ("max_payload_size", existing.slot_data_size, wanted.slot_data_size),
        ("commit_timeout", f"{existing.commit_timeout_us} us", f"{wanted.commit_timeout_us} us"),
    )
    differences = [f"{label} is {there} there, {here} here" for label, there, here in fields if there != here]
    return "; ".join(differences) or (
        f"its config hash is 0x{existing.config_hash:016x}, this config's is 0x{wanted.config_hash:016x}"
    )


def region_info(name: str, geometry: ChannelGeometry, version: int, header: ctypes.Structure, creator: bytes) -> RegionInfo:
    """``RegionInfo`` of region ``name``: its geometry and layout version,
    its ``header``'s creator pid and creation time, the creator name's bytes."""
    g = geometry
    return RegionInfo(
        shm_name=name,
        channel_type=g.channel_type,
        version=version,
        config_hash=g.config_hash,
        total_size=g.total_size,
        max_subs=g.max_subs,
        sub_ring_capacity=g.capacity,
        pool_size=g.pool_size,
        max_payload_size=g.slot_data_size,
        commit_timeout_us=g.commit_timeout_us,
        creator_pid=header.creator_pid,
        creator_name=creator.decode("utf-8", errors="replace"),
        created_at_ns=header.created_at_ns,
    )
