"""The Kickmsg v4 shared-memory layout, byte for byte as kickmsg 0.1.0 writes it.

A region is ``[Header | creator name | rings | slot pool]``::

    Header (832 B) + creator name      header_size = align64(832 + name_len)
    max_subs rings, each               ring_stride = align64(128 + capacity*16)
        SubRingHeader (128 B) then capacity Entry records (16 B each)
    pool_size slots, each              slot_stride = align64(8 + max_payload)
        SlotHeader (8 B) then the payload bytes

Everything is little-endian with native alignment. The ctypes structures give
the offsets; every atomic field is read and written through
``kickmsg.atomics`` at ``base address + offset``, never through ctypes.
"""
import ctypes
from dataclasses import dataclass

# The words layout 4 shares with layout 9, named here as part of layout 4.
from kickmsg.protocol.common import (
    CACHE_LINE,
    CHANNEL_BROADCAST,
    CHANNEL_PUBSUB,
    DEFAULT_COMMIT_TIMEOUT_US,
    IN_FLIGHT_ONE,
    INVALID_SLOT,
    MAGIC,
    MAX_COMMIT_TIMEOUT_US,
    RING_DRAINING,
    RING_FREE,
    RING_LIVE,
    RING_STATE_MASK,
    SCHEMA_CLAIMING,
    SCHEMA_SET,
    SCHEMA_UNSET,
    U16_MAX,
    U32_MAX,
    U64_MAX,
    CorruptRegionError,
    SchemaInfoLayout,
    align64,
    config_hash,
)

__all__ = [
    "CACHE_LINE", "CHANNEL_BROADCAST", "CHANNEL_PUBSUB", "CREATED_AT_OFFSET", "CorruptRegionError",
    "DEFAULT_COMMIT_TIMEOUT_US", "ENTRY_SIZE", "Entry", "FREE_TOP_OFFSET", "Field", "Geometry", "HAS_WAITER_OFFSET",
    "HEADER_SIZE", "Header", "INVALID_SLOT", "IN_FLIGHT_ONE", "LOCKED_SEQUENCE", "MAGIC", "MAGIC_OFFSET",
    "MAX_COMMIT_TIMEOUT_US", "NEXT_FREE_OFFSET", "PAYLOAD_LEN_OFFSET", "REFCOUNT_OFFSET", "RING_DRAINING",
    "RING_FREE", "RING_HEADER_SIZE", "RING_LIVE", "RING_STATE_MASK", "RING_STATE_NAMES", "SCHEMA_CLAIMING",
    "SCHEMA_SET", "SCHEMA_STATE_OFFSET", "SCHEMA_UNSET", "SEQUENCE_OFFSET", "SLOT_HEADER_SIZE", "SLOT_IDX_OFFSET",
    "STATE_FLIGHT_OFFSET", "SchemaInfoLayout", "SlotHeader", "SubRingHeader", "U16_MAX", "U32_MAX", "U64_MAX",
    "VERSION", "VERSION_OFFSET", "WRITE_POS_OFFSET", "config_hash", "entry_is_stuck", "field_at",
]

VERSION = 4
LOCKED_SEQUENCE = 0xFFFFFFFFFFFFFFFF
RING_STATE_NAMES = {RING_FREE: "Free", RING_LIVE: "Live", RING_DRAINING: "Draining"}


class Header(ctypes.Structure):
    """Region header; the creator name's bytes follow it (no NUL)."""

    _fields_ = [
        ("magic", ctypes.c_uint64),  # atomic
        ("version", ctypes.c_uint32),
        ("channel_type", ctypes.c_uint32),
        ("total_size", ctypes.c_uint64),
        ("sub_rings_offset", ctypes.c_uint64),
        ("pool_offset", ctypes.c_uint64),
        ("max_subs", ctypes.c_uint64),
        ("sub_ring_capacity", ctypes.c_uint64),
        ("sub_ring_mask", ctypes.c_uint64),
        ("pool_size", ctypes.c_uint64),
        ("slot_data_size", ctypes.c_uint64),
        ("slot_stride", ctypes.c_uint64),
        ("sub_ring_stride", ctypes.c_uint64),
        ("commit_timeout_us", ctypes.c_uint64),
        ("config_hash", ctypes.c_uint64),
        ("creator_pid", ctypes.c_uint64),
        ("created_at_ns", ctypes.c_uint64),  # CLOCK_MONOTONIC, as 0.1.0 writes it
        ("creator_name_len", ctypes.c_uint16),
        ("_pad_to_schema_state", ctypes.c_uint8 * 62),
        ("schema_state", ctypes.c_uint32),  # atomic, own cache line
        ("_pad_to_schema_data", ctypes.c_uint8 * 60),
        ("schema_data", SchemaInfoLayout),
        ("free_top", ctypes.c_uint64),  # atomic: generation << 32 | slot index
        ("_pad_to_end", ctypes.c_uint8 * 56),
    ]


class SubRingHeader(ctypes.Structure):
    """One subscriber ring's control words; its entries follow at +128."""

    _fields_ = [
        ("state_flight", ctypes.c_uint32),  # atomic: in_flight << 2 | state
        ("_pad_to_write_pos", ctypes.c_uint8 * 60),
        ("write_pos", ctypes.c_uint64),  # atomic; futex word = its low 32 bits
        ("has_waiter", ctypes.c_uint32),  # atomic
        ("_pad_to_end", ctypes.c_uint8 * 52),
    ]


class Entry(ctypes.Structure):
    """One ring entry: which slot holds the message at a position."""

    _fields_ = [
        ("sequence", ctypes.c_uint64),  # atomic: position + 1 once committed
        ("slot_idx", ctypes.c_uint32),  # atomic
        ("payload_len", ctypes.c_uint32),  # atomic
    ]


class SlotHeader(ctypes.Structure):
    """The metadata in front of each slot's payload."""

    _fields_ = [
        ("refcount", ctypes.c_uint32),  # atomic
        ("next_free", ctypes.c_uint32),  # atomic: free-stack link
    ]


HEADER_SIZE = ctypes.sizeof(Header)
RING_HEADER_SIZE = ctypes.sizeof(SubRingHeader)
ENTRY_SIZE = ctypes.sizeof(Entry)
SLOT_HEADER_SIZE = ctypes.sizeof(SlotHeader)
assert (HEADER_SIZE, RING_HEADER_SIZE, ENTRY_SIZE, SLOT_HEADER_SIZE) == (832, 128, 16, 8)
assert (Header.schema_state.offset, Header.schema_data.offset, Header.free_top.offset) == (192, 256, 768)
assert (SubRingHeader.write_pos.offset, SubRingHeader.has_waiter.offset) == (64, 72)
assert (SlotHeader.refcount.offset, SlotHeader.next_free.offset) == (0, 4)  # kickmsg.protocol.freestack

# Offsets of the atomic words, for address arithmetic.
MAGIC_OFFSET = Header.magic.offset
VERSION_OFFSET = Header.version.offset  # the same word, offset 8, in every layout
CREATED_AT_OFFSET = Header.created_at_ns.offset  # changes when a region is re-created in place
SCHEMA_STATE_OFFSET = Header.schema_state.offset
FREE_TOP_OFFSET = Header.free_top.offset
STATE_FLIGHT_OFFSET = SubRingHeader.state_flight.offset
WRITE_POS_OFFSET = SubRingHeader.write_pos.offset
HAS_WAITER_OFFSET = SubRingHeader.has_waiter.offset
SEQUENCE_OFFSET = Entry.sequence.offset
SLOT_IDX_OFFSET = Entry.slot_idx.offset
PAYLOAD_LEN_OFFSET = Entry.payload_len.offset
REFCOUNT_OFFSET = SlotHeader.refcount.offset
NEXT_FREE_OFFSET = SlotHeader.next_free.offset


def entry_is_stuck(sequence: int, position: int, capacity: int) -> bool:
    """Whether the entry at ``position`` holds a writer's abandoned work:
    LOCKED, or more than one wrap behind (u64 arithmetic, as 0.1.0 does)."""
    return sequence == LOCKED_SEQUENCE or (sequence + capacity) & U64_MAX < (position + 1) & U64_MAX


@dataclass(frozen=True)
class Geometry:
    """Where everything is in one region, in bytes from its start."""

    channel_type: int
    max_subs: int
    capacity: int  # entries per ring, a power of two
    pool_size: int
    slot_data_size: int  # max payload bytes per slot
    commit_timeout_us: int
    creator_name_len: int
    sub_rings_offset: int
    ring_stride: int
    pool_offset: int
    slot_stride: int
    total_size: int
    config_hash: int

    @property
    def mask(self) -> int:
        return self.capacity - 1

    def hazards(self) -> list[str]:
        """Why a region of this geometry would stop working by construction
        (empty when it is fine). A create refuses these; open, audit and
        diagnose flag a region another implementation made this way.

        Every Live ring keeps a reference to the slot of each of its last
        ``capacity`` messages, read or not, until publishers wrap over them.
        So with ``pool_size <= capacity`` a ring that has wrapped holds every
        slot, and the next send finds the pool empty for good.
        """
        if self.pool_size <= self.capacity:
            return [
                f"pool_size ({self.pool_size}) must be greater than sub_ring_capacity ({self.capacity}): "
                f"every Live ring keeps the slots of its last sub_ring_capacity messages referenced, so the "
                f"pool needs at least sub_ring_capacity + 1 slots, plus one per concurrent publisher and per "
                f"view held; with fewer, send() finds the pool empty for good once a ring has wrapped"
            ]
        return []

    def same_layout(self, other: "Geometry") -> bool:
        """Whether every offset, stride and count the flows use is the same
        in both (the channel type and creator name may differ): a process
        attached to one can safely run its flows over the other."""
        fields = ("max_subs", "capacity", "pool_size", "slot_data_size", "commit_timeout_us",
                  "sub_rings_offset", "ring_stride", "pool_offset", "slot_stride", "total_size")
        return all(getattr(self, name) == getattr(other, name) for name in fields)

    def size_breakdown(self) -> str:
        """Where the bytes of ``total_size`` go, naming the config fields."""
        return (
            f"pool_size={self.pool_size} slots of {self.slot_stride} bytes (max_payload_size={self.slot_data_size}), "
            f"max_subscribers={self.max_subs} rings of {self.ring_stride} bytes (sub_ring_capacity={self.capacity}), "
            f"header {self.sub_rings_offset} bytes"
        )

    @classmethod
    def for_config(
        cls,
        channel_type: int,
        max_subscribers: int,
        sub_ring_capacity: int,
        pool_size: int,
        max_payload_size: int,
        commit_timeout_us: int,
        creator_name_len: int,
    ) -> "Geometry":
        """The geometry 0.1.0 computes for a new region with this config."""
        sub_rings_offset = align64(HEADER_SIZE + creator_name_len)
        ring_stride = align64(RING_HEADER_SIZE + sub_ring_capacity * ENTRY_SIZE)
        slot_stride = align64(SLOT_HEADER_SIZE + max_payload_size)
        pool_offset = sub_rings_offset + max_subscribers * ring_stride
        return cls(
            channel_type=channel_type,
            max_subs=max_subscribers,
            capacity=sub_ring_capacity,
            pool_size=pool_size,
            slot_data_size=max_payload_size,
            commit_timeout_us=commit_timeout_us,
            creator_name_len=creator_name_len,
            sub_rings_offset=sub_rings_offset,
            ring_stride=ring_stride,
            pool_offset=pool_offset,
            slot_stride=slot_stride,
            total_size=pool_offset + pool_size * slot_stride,
            config_hash=config_hash(
                channel_type,
                max_subscribers,
                sub_ring_capacity,
                pool_size,
                max_payload_size,
                commit_timeout_us,
            ),
        )

    @classmethod
    def from_header(cls, header: Header) -> "Geometry":
        """The geometry a region's header claims (not yet checked)."""
        return cls(
            channel_type=header.channel_type,
            max_subs=header.max_subs,
            capacity=header.sub_ring_capacity,
            pool_size=header.pool_size,
            slot_data_size=header.slot_data_size,
            commit_timeout_us=header.commit_timeout_us,
            creator_name_len=header.creator_name_len,
            sub_rings_offset=header.sub_rings_offset,
            ring_stride=header.sub_ring_stride,
            pool_offset=header.pool_offset,
            slot_stride=header.slot_stride,
            total_size=header.total_size,
            config_hash=header.config_hash,
        )

    def problems(self, mapped_size: int, sub_ring_mask: int) -> list[str]:
        """Every way this geometry fails to describe a usable region inside a
        mapping of ``mapped_size`` bytes (empty when it is sound).

        Checks what the flows rely on: counts in range for their wire types,
        the ring mask, 8-byte alignment of every atomic word, non-overlapping
        areas and everything inside the mapping. Larger strides or offsets
        than 0.1.0 would choose are accepted.
        """
        found = []
        if self.channel_type not in (CHANNEL_PUBSUB, CHANNEL_BROADCAST):
            found.append(f"channel_type {self.channel_type} is neither 1 (PubSub) nor 2 (Broadcast)")
        if self.capacity <= 0 or self.capacity & (self.capacity - 1):
            found.append(f"sub_ring_capacity {self.capacity} is not a power of two")
        elif sub_ring_mask != self.capacity - 1:
            found.append(f"sub_ring_mask {sub_ring_mask} is not sub_ring_capacity - 1 ({self.capacity - 1})")
        if not 0 < self.max_subs <= U32_MAX:
            found.append(f"max_subs {self.max_subs} is not in 1..{U32_MAX}")
        if not 0 < self.pool_size < INVALID_SLOT:
            found.append(f"pool_size {self.pool_size} is not in 1..{INVALID_SLOT - 1}")
        if not 0 < self.slot_data_size <= U32_MAX:
            found.append(f"slot_data_size {self.slot_data_size} is not in 1..{U32_MAX}")
        if self.commit_timeout_us > MAX_COMMIT_TIMEOUT_US:
            found.append(f"commit_timeout_us {self.commit_timeout_us} is above the {MAX_COMMIT_TIMEOUT_US} us (1 day) limit")
        for name, value in (
            ("sub_rings_offset", self.sub_rings_offset),
            ("sub_ring_stride", self.ring_stride),
            ("pool_offset", self.pool_offset),
            ("slot_stride", self.slot_stride),
        ):
            if value % 8:
                found.append(f"{name} {value} is not a multiple of 8 (atomic words would be misaligned)")
        header_end = HEADER_SIZE + self.creator_name_len
        if self.sub_rings_offset < header_end:
            found.append(f"sub_rings_offset {self.sub_rings_offset} overlaps the header, which ends at {header_end}")
        if self.ring_stride < RING_HEADER_SIZE + self.capacity * ENTRY_SIZE:
            found.append(
                f"sub_ring_stride {self.ring_stride} is smaller than a ring of "
                f"{self.capacity} entries ({RING_HEADER_SIZE + self.capacity * ENTRY_SIZE})"
            )
        rings_end = self.sub_rings_offset + self.max_subs * self.ring_stride
        if self.pool_offset < rings_end:
            found.append(f"pool_offset {self.pool_offset} overlaps the rings, which end at {rings_end}")
        if self.slot_stride < SLOT_HEADER_SIZE + self.slot_data_size:
            found.append(
                f"slot_stride {self.slot_stride} is smaller than a slot of "
                f"{self.slot_data_size} payload bytes ({SLOT_HEADER_SIZE + self.slot_data_size})"
            )
        pool_end = self.pool_offset + self.pool_size * self.slot_stride
        if self.total_size < pool_end:
            found.append(f"total_size {self.total_size} is smaller than the end of the pool ({pool_end})")
        if self.total_size > mapped_size:
            found.append(f"total_size {self.total_size} exceeds the {mapped_size} bytes of the shared memory object")
        return found


# -- naming the bytes of a region ---------------------------------------------


@dataclass(frozen=True)
class Field:
    """A named span of a region."""

    label: str
    start: int
    size: int
    scalar: bool  # a little-endian integer (else bytes)


def _struct_field(struct_type: type[ctypes.Structure], base: int, rel: int, prefix: str) -> Field:
    """The field of a ctypes structure at ``base`` containing ``base + rel``."""
    for name, ctype, *_ in struct_type._fields_:  # (name, type[, bit width])
        info = getattr(struct_type, name)
        if info.offset <= rel < info.offset + info.size:
            if name == "schema_data":
                return _struct_field(SchemaInfoLayout, base + info.offset, rel - info.offset, prefix + "schema_data.")
            label = prefix + ("padding" if name.startswith("_pad") else name)
            is_int = not hasattr(ctype, "_length_") and not name.startswith("_pad")
            return Field(label, base + info.offset, info.size, is_int)
    return Field(prefix + "padding", base + rel, 1, False)


def field_at(geometry: Geometry, offset: int) -> Field:
    """Which header field, ring, entry or slot field holds byte ``offset``."""
    g = geometry
    if offset < HEADER_SIZE:
        return _struct_field(Header, 0, offset, "header.")
    if offset < HEADER_SIZE + g.creator_name_len:
        return Field("creator name", HEADER_SIZE, g.creator_name_len, False)
    if offset < g.sub_rings_offset:
        return Field("header padding", offset, 1, False)
    if offset < g.pool_offset:
        ring, rel = divmod(offset - g.sub_rings_offset, g.ring_stride)
        base = g.sub_rings_offset + ring * g.ring_stride
        if rel < RING_HEADER_SIZE:
            return _struct_field(SubRingHeader, base, rel, f"ring {ring}.")
        entry, rel = divmod(rel - RING_HEADER_SIZE, ENTRY_SIZE)
        if entry < g.capacity:
            entry_base = base + RING_HEADER_SIZE + entry * ENTRY_SIZE
            return _struct_field(Entry, entry_base, rel, f"ring {ring} entry {entry}.")
        return Field(f"ring {ring} padding", offset, 1, False)
    if offset < g.total_size:
        slot, rel = divmod(offset - g.pool_offset, g.slot_stride)
        base = g.pool_offset + slot * g.slot_stride
        if rel < SLOT_HEADER_SIZE:
            return _struct_field(SlotHeader, base, rel, f"slot {slot}.")
        if rel < SLOT_HEADER_SIZE + g.slot_data_size:
            return Field(f"slot {slot} payload", base + SLOT_HEADER_SIZE, g.slot_data_size, False)
        return Field(f"slot {slot} padding", offset, 1, False)
    return Field("past total_size", offset, 1, False)
