"""What both layouts' headers say: 0.9.2's ``SharedRegion.info()`` and
``stats()`` (WIRE9.md B.18; layout 4 reports the same, with no counters),
the snapshots the tools read, and the header fields region creation writes.

``region_info`` builds ``RegionInfo`` from a region's geometry and header
(``config_differences`` says how two geometries' configs differ);
``write_header`` stores the geometry's fields in a new header. The two
layouts' headers have these fields under the same names.
"""
import ctypes
import os
from dataclasses import dataclass, field
from typing import Protocol

from kickmsg.config import ChannelType

__all__ = [
    "ChannelGeometry", "DrainedRing", "HeaderGeometry", "HeaderWords", "HealthCounts", "RegionInfo", "RegionStats", "RingStats", "RingWords",
    "config_differences", "region_info", "write_header",
]


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


@dataclass(frozen=True)
class HeaderWords:
    """The header's atomic words, each read once with acquire, for the tools
    (a snapshot: racy under traffic)."""

    magic: int
    free_top: int  # generation << 32 | slot
    schema_state: int


@dataclass(frozen=True)
class RingWords:
    """One ring's words, each read once with acquire, for the tools (a
    snapshot: racy under traffic). ``window`` holds (position, sequence,
    slot) for each position of the live window [max(0, write_pos -
    capacity), write_pos), oldest first: the slot is layout 4's slot_idx
    (read after the sequence), 0 on layout 9. Layout 9 only: ``metas``, the
    meta word of every entry in entry order, and the owner in the ring's
    header."""

    index: int
    state_flight: int
    write_pos: int
    window: list[tuple[int, int, int]]
    metas: list[int] = field(default_factory=list)
    owner_pid: int = 0
    owner_starttime: int = 0


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


class HeaderGeometry(ChannelGeometry, Protocol):
    """What both layouts' ``Geometry`` say of a region's layout."""

    @property
    def creator_name_len(self) -> int: ...

    @property
    def sub_rings_offset(self) -> int: ...

    @property
    def pool_offset(self) -> int: ...

    @property
    def mask(self) -> int: ...

    @property
    def slot_stride(self) -> int: ...

    @property
    def ring_stride(self) -> int: ...


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


def write_header(header: ctypes.Structure, geometry: HeaderGeometry, version: int, created_at_ns: int) -> None:
    """Region creation's header step, both layouts: plain stores of the
    version, the geometry's fields, this process as the creator, the
    creation time and the creator name's length (nobody reads them before
    magic is stored, with release)."""
    header.version = version
    header.channel_type = geometry.channel_type
    header.total_size = geometry.total_size
    header.sub_rings_offset = geometry.sub_rings_offset
    header.pool_offset = geometry.pool_offset
    header.max_subs = geometry.max_subs
    header.sub_ring_capacity = geometry.capacity
    header.sub_ring_mask = geometry.mask
    header.pool_size = geometry.pool_size
    header.slot_data_size = geometry.slot_data_size
    header.slot_stride = geometry.slot_stride
    header.sub_ring_stride = geometry.ring_stride
    header.commit_timeout_us = geometry.commit_timeout_us
    header.config_hash = geometry.config_hash
    header.creator_pid = os.getpid()
    header.created_at_ns = created_at_ns
    header.creator_name_len = geometry.creator_name_len
