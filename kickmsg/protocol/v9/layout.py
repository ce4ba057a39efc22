"""The layout-9 channel region, byte for byte as native kickmsg 0.9.2 writes it
(WIRE9.md section A).

A region is ``[Header | creator name | rings | slot pool]``::

    Header (832 B) + creator name      header_size = align64(832 + name_len)
    max_subs rings, each               ring_stride = align64(128 + 16 * capacity)
        SubRingHeader (128 B) then capacity Entry records (16 B each)
    pool_size slots, each              slot_stride = align64(16 + max_payload)
        SlotHeader (16 B) then the payload bytes

The ctypes structures give the offsets; every atomic word is read and
written through ``kickmsg.atomics`` at ``base address + offset``, never
through ctypes. ``validate`` checks a header the way 0.9.2 does at open
(A.10) and returns a ``Geometry``: the private snapshot that every later
address, loop and bound uses, whatever peers write into the header after.
"""
import ctypes
import os
import sys
import time
from dataclasses import dataclass

from kickmsg.hash import FNV1A_64_OFFSET_BASIS, fnv1a_64

# -- A.1 Constants -------------------------------------------------------------

# The words layout 9 shares with layout 4 (A.1, A.6-A.8 unchanged), named here as part of layout 9.
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
from kickmsg.errors import VersionMismatchError

__all__ = [
    "CHANNEL_BROADCAST", "CHANNEL_NONE", "CHANNEL_PUBSUB", "CREATED_AT_OFFSET", "CorruptRegionError",
    "DEFAULT_COMMIT_TIMEOUT_US", "DEFAULT_MODE", "DROPPED_COUNT_OFFSET", "ENTRY_SIZE", "Entry", "FREE_TOP_OFFSET",
    "Geometry", "HAS_WAITER_OFFSET", "HEADER_SIZE", "Header", "INVALID_SLOT", "IN_FLIGHT_ONE", "LOST_COUNT_OFFSET",
    "MAGIC", "MAGIC_OFFSET", "MAX_POOL_SIZE", "META_OFFSET", "META_SLOT_BITS", "META_SLOT_MASK", "META_TAG_MASK",
    "META_TAG_SIGN", "MODE_VARIABLE", "NAME_MAX", "NEXT_FREE_OFFSET", "OWNER_PID_OFFSET", "OWNER_STARTTIME_OFFSET",
    "PAYLOAD_LEN_OFFSET", "REFCOUNT_OFFSET", "RING_DRAINING", "RING_FREE", "RING_HEADER_SIZE", "RING_LIVE",
    "RING_RECLAIMING", "RING_STATE_MASK", "RING_STATE_NAMES", "SCHEMA_CLAIMING", "SCHEMA_DATA_OFFSET", "SCHEMA_SET",
    "SCHEMA_STATE_OFFSET", "SCHEMA_UNSET", "SEQUENCE_OFFSET", "SEQ_LOCK_BIT", "SEQ_REPAIR_BIT", "SEQ_VALUE_MASK",
    "SLOT_HEADER_SIZE", "STATE_FLIGHT_OFFSET", "STEAL_COUNT_OFFSET", "SchemaInfoLayout", "SlotHeader",
    "SubRingHeader", "U32_MAX", "U64_MAX", "VERSION", "VersionMismatchError", "WAITER_CARRIER", "WAITER_FUTEX",
    "WAITER_NONE", "WRITE_POS_OFFSET", "align64", "blackboard_identity", "blackboard_shm_name",
    "broadcast_identity", "broadcast_shm_name", "compose_shm_name", "mailbox_identity", "mailbox_shm_name",
    "realtime_ns", "registry_shm_name", "sanitize_component", "shm_mode", "topic_identity", "topic_shm_name",
    "validate",
]

VERSION = 9
MAX_POOL_SIZE = (1 << 24) - 2  # slot index + 1 must fit the 24-bit meta field

SEQ_LOCK_BIT = 1 << 63
SEQ_REPAIR_BIT = 1 << 62
SEQ_VALUE_MASK = (1 << 62) - 1
META_SLOT_BITS = 24
META_SLOT_MASK = (1 << META_SLOT_BITS) - 1
META_TAG_MASK = (1 << 40) - 1
META_TAG_SIGN = 1 << 39

CHANNEL_NONE = 0  # never stamped in a region

RING_RECLAIMING = 3  # a fourth ring state (the low 2 bits of state_flight)
RING_STATE_NAMES = {RING_FREE: "Free", RING_LIVE: "Live", RING_DRAINING: "Draining", RING_RECLAIMING: "Reclaiming"}

WAITER_NONE = 0
WAITER_FUTEX = 1
WAITER_CARRIER = 2


# -- A.2-A.5 Structures --------------------------------------------------------


class Header(ctypes.Structure):
    """Region header (A.2); the creator name's bytes follow it (no NUL)."""

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
        ("created_at_ns", ctypes.c_uint64),  # CLOCK_REALTIME in layout 9
        ("creator_name_len", ctypes.c_uint16),
        ("_pad_to_schema_state", ctypes.c_uint8 * 62),
        ("schema_state", ctypes.c_uint32),  # atomic, own cache line
        ("_pad_to_schema_data", ctypes.c_uint8 * 60),
        ("schema_data", SchemaInfoLayout),
        ("free_top", ctypes.c_uint64),  # atomic: generation << 32 | slot index
        ("steal_count", ctypes.c_uint64),  # atomic
        ("identity_hash", ctypes.c_uint64),  # written once before MAGIC; 0 = unstamped
        ("_pad_to_end", ctypes.c_uint8 * 40),
    ]


class SubRingHeader(ctypes.Structure):
    """One subscriber ring's control words (A.3); its entries follow at +128."""

    _fields_ = [
        ("state_flight", ctypes.c_uint32),  # atomic: in_flight << 2 | state
        ("_pad_to_owner", ctypes.c_uint32),
        ("owner_pid", ctypes.c_uint64),  # atomic; 0 when Free
        ("owner_starttime", ctypes.c_uint64),  # atomic; /proc/<pid>/stat field 22
        ("_pad_to_write_pos", ctypes.c_uint8 * 40),
        ("write_pos", ctypes.c_uint64),  # atomic; futex word = its low 32 bits
        ("has_waiter", ctypes.c_uint32),  # atomic: 0, 1 futex, 2 carrier
        ("_pad_to_counters", ctypes.c_uint32),
        ("dropped_count", ctypes.c_uint64),  # atomic
        ("lost_count", ctypes.c_uint64),  # atomic
        ("_pad_to_end", ctypes.c_uint8 * 32),
    ]


class Entry(ctypes.Structure):
    """One ring entry (A.4): a tagged sequence word and a tagged claim."""

    _fields_ = [
        ("sequence", ctypes.c_uint64),  # atomic: committed pos+1, skip, or lock
        ("meta", ctypes.c_uint64),  # atomic: tag (pos+1 mod 2^40) << 24 | slot + 1
    ]


class SlotHeader(ctypes.Structure):
    """The metadata in front of each slot's payload (A.5)."""

    _fields_ = [
        ("refcount", ctypes.c_uint32),  # atomic
        ("next_free", ctypes.c_uint32),  # atomic: free-stack link
        ("payload_len", ctypes.c_uint32),  # atomic
        ("_pad", ctypes.c_uint32),
    ]


HEADER_SIZE = ctypes.sizeof(Header)
RING_HEADER_SIZE = ctypes.sizeof(SubRingHeader)
ENTRY_SIZE = ctypes.sizeof(Entry)
SLOT_HEADER_SIZE = ctypes.sizeof(SlotHeader)
assert (HEADER_SIZE, RING_HEADER_SIZE, ENTRY_SIZE, SLOT_HEADER_SIZE) == (832, 128, 16, 16)
assert (Header.schema_state.offset, Header.schema_data.offset, Header.free_top.offset) == (192, 256, 768)
assert (Header.steal_count.offset, Header.identity_hash.offset, Header.creator_name_len.offset) == (776, 784, 128)
assert (SubRingHeader.owner_pid.offset, SubRingHeader.owner_starttime.offset) == (8, 16)
assert (SubRingHeader.write_pos.offset, SubRingHeader.has_waiter.offset) == (64, 72)
assert (SubRingHeader.dropped_count.offset, SubRingHeader.lost_count.offset) == (80, 88)
assert SlotHeader.payload_len.offset == 8
assert (SlotHeader.refcount.offset, SlotHeader.next_free.offset) == (0, 4)  # kickmsg.protocol.freestack

# Offsets of the atomic words, for address arithmetic.
MAGIC_OFFSET = Header.magic.offset
CREATED_AT_OFFSET = Header.created_at_ns.offset
SCHEMA_STATE_OFFSET = Header.schema_state.offset
SCHEMA_DATA_OFFSET = Header.schema_data.offset
FREE_TOP_OFFSET = Header.free_top.offset
STEAL_COUNT_OFFSET = Header.steal_count.offset
STATE_FLIGHT_OFFSET = SubRingHeader.state_flight.offset
OWNER_PID_OFFSET = SubRingHeader.owner_pid.offset
OWNER_STARTTIME_OFFSET = SubRingHeader.owner_starttime.offset
WRITE_POS_OFFSET = SubRingHeader.write_pos.offset
HAS_WAITER_OFFSET = SubRingHeader.has_waiter.offset
DROPPED_COUNT_OFFSET = SubRingHeader.dropped_count.offset
LOST_COUNT_OFFSET = SubRingHeader.lost_count.offset
SEQUENCE_OFFSET = Entry.sequence.offset
META_OFFSET = Entry.meta.offset
REFCOUNT_OFFSET = SlotHeader.refcount.offset
NEXT_FREE_OFFSET = SlotHeader.next_free.offset
PAYLOAD_LEN_OFFSET = SlotHeader.payload_len.offset


# A.4's sequence and meta words, and what each value says: kickmsg.protocol.v9.words.


# -- A.7 Sizes (align64, A.8 config_hash: kickmsg.protocol.common) ---------------


@dataclass(frozen=True)
class Geometry:
    """Where everything is in one region: the private snapshot (A.10 step 6)
    that all later arithmetic uses, never the shared header."""

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

    def ring_offset(self, index: int) -> int:
        return self.sub_rings_offset + index * self.ring_stride

    def entry_offset(self, ring: int, pos: int) -> int:
        return self.ring_offset(ring) + RING_HEADER_SIZE + (pos & self.mask) * ENTRY_SIZE

    def slot_offset(self, slot: int) -> int:
        return self.pool_offset + slot * self.slot_stride

    @classmethod
    def for_config(
        cls, channel_type: int, max_subscribers: int, sub_ring_capacity: int, pool_size: int, max_payload_size: int,
        commit_timeout_us: int = DEFAULT_COMMIT_TIMEOUT_US, creator_name_len: int = 0,
    ) -> "Geometry":
        """The layout 0.9.2 computes for a config (B.1 step 1 checks, A.7);
        ValueError with 0.9.2's message for a config it refuses."""
        if channel_type not in (CHANNEL_PUBSUB, CHANNEL_BROADCAST):
            raise ValueError(f"Unsupported channel type: {channel_type}")
        if sub_ring_capacity <= 0 or sub_ring_capacity & (sub_ring_capacity - 1):
            raise ValueError(f"sub_ring_capacity must be a power of 2 (got {sub_ring_capacity})")
        if pool_size <= 0:
            raise ValueError(f"pool_size must be > 0 (got {pool_size})")
        if pool_size > MAX_POOL_SIZE:
            raise ValueError(f"pool_size exceeds MAX_POOL_SIZE ({pool_size} > {MAX_POOL_SIZE})")
        if max_subscribers <= 0:
            raise ValueError(f"max_subscribers must be > 0 (got {max_subscribers})")
        if max_payload_size <= 0:
            raise ValueError(f"max_payload_size must be > 0 (got {max_payload_size})")
        if not 0 <= commit_timeout_us <= MAX_COMMIT_TIMEOUT_US:
            raise ValueError(f"commit_timeout must lie between 0 and {MAX_COMMIT_TIMEOUT_US} us (got {commit_timeout_us})")
        if not 0 <= creator_name_len <= U16_MAX:
            raise ValueError(f"creator name too long: {creator_name_len} bytes (at most {U16_MAX})")
        header_size = align64(HEADER_SIZE + creator_name_len)
        ring_stride = align64(RING_HEADER_SIZE + ENTRY_SIZE * sub_ring_capacity)
        slot_stride = align64(SLOT_HEADER_SIZE + max_payload_size)
        pool_offset = header_size + max_subscribers * ring_stride
        total_size = pool_offset + pool_size * slot_stride
        if total_size > U64_MAX // 2:
            raise ValueError(f"Config too large: total size {total_size} bytes")
        return cls(
            channel_type=channel_type,
            max_subs=max_subscribers,
            capacity=sub_ring_capacity,
            pool_size=pool_size,
            slot_data_size=max_payload_size,
            commit_timeout_us=commit_timeout_us,
            creator_name_len=creator_name_len,
            sub_rings_offset=header_size,
            ring_stride=ring_stride,
            pool_offset=pool_offset,
            slot_stride=slot_stride,
            total_size=total_size,
            config_hash=config_hash(
                channel_type, max_subscribers, sub_ring_capacity, pool_size, max_payload_size, commit_timeout_us
            ),
        )


# -- A.10 Validation at open -----------------------------------------------------


def validate(name: str, header_bytes: bytes, mapped_size: int, magic: int, expected_identity: int = 0) -> Geometry:
    """Check a region's header in 0.9.2's order (A.10) and return the
    geometry snapshot. ``header_bytes`` is a copy of at least the first 832
    bytes (or all there is), ``magic`` the word at offset 0 as loaded with
    acquire. Raises ``CorruptRegionError`` (or ``VersionMismatchError``)
    naming the region, the field and its value."""
    # 1. size
    if mapped_size < HEADER_SIZE:
        raise CorruptRegionError(f"Buffer smaller than region Header: {name} maps {mapped_size} bytes, the header needs {HEADER_SIZE}")
    # 2. magic
    if magic != MAGIC:
        raise CorruptRegionError(f"Invalid shared memory (bad magic): {name} has magic 0x{magic:016x}, expected 0x{MAGIC:016x}")
    h = Header.from_buffer_copy(header_bytes[:HEADER_SIZE])
    # 3. version
    if h.version != VERSION:
        raise VersionMismatchError(
            f"Region version mismatch on {name}: version {h.version}, this layout speaks {VERSION}; "
            f"stamped by an incompatible kickmsg build"
        )
    # 4. mapped size
    if mapped_size < h.total_size:
        raise CorruptRegionError(f"Header geometry: {name} total_size {h.total_size} exceeds the mapped size {mapped_size}")

    # 5. geometry: 0.9.2's phrase first, then the region, the field and its value
    def bad(phrase: str, detail: str) -> CorruptRegionError:
        return CorruptRegionError(f"Header geometry: {phrase} ({name}: {detail})")

    if h.channel_type not in (CHANNEL_PUBSUB, CHANNEL_BROADCAST):
        raise bad("unsupported channel type", f"channel_type {h.channel_type} is neither 1 (PubSub) nor 2 (Broadcast)")
    if h.total_size < HEADER_SIZE:
        raise bad("total_size smaller than Header", f"total_size {h.total_size} < {HEADER_SIZE}")
    for field in ("max_subs", "pool_size", "slot_data_size", "sub_ring_capacity", "slot_stride", "sub_ring_stride"):
        if getattr(h, field) == 0:
            raise bad("zero-cardinality field", f"{field} is 0")
    capacity = h.sub_ring_capacity
    if h.pool_size > MAX_POOL_SIZE:
        raise bad("pool_size exceeds MAX_POOL_SIZE", f"pool_size {h.pool_size} exceeds MAX_POOL_SIZE {MAX_POOL_SIZE}")
    if capacity & (capacity - 1):
        raise bad("sub_ring_capacity not a power of 2", f"sub_ring_capacity {capacity} is not a power of two")
    if h.sub_ring_mask != capacity - 1:
        raise bad("sub_ring_mask inconsistent with capacity", f"sub_ring_mask {h.sub_ring_mask} != sub_ring_capacity - 1 ({capacity - 1})")
    if not HEADER_SIZE <= h.sub_rings_offset < h.pool_offset < h.total_size:
        raise bad(
            "ring/pool offsets out of range",
            f"offsets out of order: sub_rings_offset {h.sub_rings_offset}, pool_offset {h.pool_offset}, "
            f"total_size {h.total_size} (need {HEADER_SIZE} <= sub_rings_offset < pool_offset < total_size)",
        )
    if h.creator_name_len > h.sub_rings_offset - HEADER_SIZE:
        raise bad("creator_name_len exceeds tail", f"creator_name_len {h.creator_name_len} overlaps the rings at {h.sub_rings_offset}")
    for field in ("sub_rings_offset", "pool_offset", "sub_ring_stride", "slot_stride"):
        if getattr(h, field) % CACHE_LINE:
            raise bad("offset or stride not cache-line aligned", f"{field} {getattr(h, field)} is not a multiple of {CACHE_LINE}")
    if capacity > h.total_size // ENTRY_SIZE:
        raise bad("sub_ring_capacity too large", f"sub_ring_capacity {capacity} exceeds total_size / {ENTRY_SIZE}")
    if h.sub_ring_stride < RING_HEADER_SIZE + ENTRY_SIZE * capacity:
        raise bad("sub_ring_stride too small", f"sub_ring_stride {h.sub_ring_stride} < {RING_HEADER_SIZE} + {ENTRY_SIZE} x sub_ring_capacity {capacity}")
    if h.slot_data_size > h.total_size - SLOT_HEADER_SIZE:
        raise bad("slot_data_size too large", f"slot_data_size {h.slot_data_size} exceeds total_size - {SLOT_HEADER_SIZE}")
    if h.slot_stride < SLOT_HEADER_SIZE + h.slot_data_size:
        raise bad("slot_stride too small", f"slot_stride {h.slot_stride} < {SLOT_HEADER_SIZE} + slot_data_size {h.slot_data_size}")
    if h.max_subs > (h.pool_offset - h.sub_rings_offset) // h.sub_ring_stride:
        raise bad(
            "subscriber rings overflow pool_offset",
            f"max_subs {h.max_subs} rings of {h.sub_ring_stride} bytes do not fit between {h.sub_rings_offset} and {h.pool_offset}",
        )
    if h.pool_size > (h.total_size - h.pool_offset) // h.slot_stride:
        raise bad(
            "slot pool overflow total_size",
            f"pool_size {h.pool_size} slots of {h.slot_stride} bytes do not fit between {h.pool_offset} and {h.total_size}",
        )
    if h.commit_timeout_us > MAX_COMMIT_TIMEOUT_US:  # ours: 0.9.2 takes any value
        raise bad("commit_timeout_us too large", f"commit_timeout_us {h.commit_timeout_us} exceeds {MAX_COMMIT_TIMEOUT_US}")
    # 6. the private snapshot
    geometry = Geometry(
        channel_type=h.channel_type,
        max_subs=h.max_subs,
        capacity=capacity,
        pool_size=h.pool_size,
        slot_data_size=h.slot_data_size,
        commit_timeout_us=h.commit_timeout_us,
        creator_name_len=h.creator_name_len,
        sub_rings_offset=h.sub_rings_offset,
        ring_stride=h.sub_ring_stride,
        pool_offset=h.pool_offset,
        slot_stride=h.slot_stride,
        total_size=h.total_size,
        config_hash=h.config_hash,
    )
    # 7. identity
    if expected_identity and h.identity_hash and expected_identity != h.identity_hash:
        raise CorruptRegionError(
            f"Identity mismatch on existing region (shm name collision): {name} "
            f"(stamped 0x{h.identity_hash:016x}, expected 0x{expected_identity:016x})"
        )
    return geometry


# -- A.9 Identity hash -----------------------------------------------------------


def _chain(text: str, seed: int) -> int:
    """FNV-1a of the bytes seeded with ``seed``, then of their length as 8 LE bytes."""
    data = text.encode("utf-8")
    return fnv1a_64(len(data).to_bytes(8, "little"), seed=fnv1a_64(data, seed=seed))


def topic_identity(namespace: str, topic: str) -> int:
    """``namespace`` sanitized (as the Node stores it), ``topic`` raw."""
    return _chain(topic, _chain(namespace, _chain("topic", FNV1A_64_OFFSET_BASIS)))


def broadcast_identity(namespace: str, channel: str) -> int:
    return _chain(channel, _chain(namespace, _chain("broadcast", FNV1A_64_OFFSET_BASIS)))


def mailbox_identity(namespace: str, owner: str, tag: str) -> int:
    """``namespace`` and ``owner`` sanitized, ``tag`` raw (0.9.2)."""
    return _chain(tag, _chain(owner, _chain(namespace, _chain("mailbox", FNV1A_64_OFFSET_BASIS))))


def blackboard_identity(namespace: str, name: str) -> int:
    """D.5: ``namespace`` and ``name`` raw; 0 is mapped to 1."""
    return _chain(name, _chain(namespace, _chain("blackboard", FNV1A_64_OFFSET_BASIS))) or 1


# -- A.11 Naming -----------------------------------------------------------------

NAME_MAX = 255
_KEPT = frozenset(b"abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_-.")


def sanitize_component(text: str, what: str = "component") -> str:
    """Drop leading '/', later '/' become '.', keep [A-Za-z0-9_.-], every
    other byte becomes '_' (per UTF-8 byte). Empty → ValueError."""
    data = text.encode("utf-8").lstrip(b"/")
    out = bytearray()
    for byte in data:
        if byte == ord("/"):
            out.append(ord("."))
        elif byte in _KEPT:
            out.append(byte)
        else:
            out.append(ord("_"))
    if not out:
        raise ValueError(f"kickmsg::sanitize_shm_component: {what} name is empty after sanitization (input: '{text}')")
    return out.decode("ascii")


def compose_shm_name(namespace: str, suffix: str) -> str:
    """'/' + namespace + '_' + suffix (both already sanitized), Linux form."""
    name = f"/{namespace}_{suffix}"
    if len(name) - 1 > NAME_MAX:
        raise OSError(36, f"kickmsg::compose_shm_name: shm name exceeds platform limit: {name}")  # ENAMETOOLONG
    return name


def topic_shm_name(namespace: str, topic: str) -> str:
    return compose_shm_name(sanitize_component(namespace, "namespace"), sanitize_component(topic, "topic"))


def broadcast_shm_name(namespace: str, channel: str) -> str:
    return compose_shm_name(sanitize_component(namespace, "namespace"), "broadcast_" + sanitize_component(channel, "channel"))


def mailbox_shm_name(namespace: str, owner: str, tag: str) -> str:
    suffix = sanitize_component(owner, "mailbox owner") + "_mbx_" + sanitize_component(tag, "mailbox tag")
    return compose_shm_name(sanitize_component(namespace, "namespace"), suffix)


def blackboard_shm_name(namespace: str, name: str) -> str:
    return compose_shm_name(sanitize_component(namespace, "namespace"), "bb_" + sanitize_component(name, "blackboard"))


def registry_shm_name(namespace: str) -> str:
    return compose_shm_name(sanitize_component(namespace, "namespace"), "registry")


# -- A.12 File modes ---------------------------------------------------------------

DEFAULT_MODE = 0o600
MODE_VARIABLE = "KICKMSG_SHM_MODE"
_process_mode: int | None = None


def shm_mode() -> int:
    """The permission bits of new objects, as 0.9.2 chooses them: octal
    ``$KICKMSG_SHM_MODE`` up to 07777, read once per process; an invalid
    value warns on stderr and gives 0600. The umask still applies."""
    global _process_mode
    if _process_mode is None:
        text = os.environ.get(MODE_VARIABLE, "")
        mode = DEFAULT_MODE
        if text:
            try:
                value = int(text, 8)
            except ValueError:
                value = -1
            if 0 <= value <= 0o7777:
                mode = value
            else:
                print(f"kickmsg: invalid {MODE_VARIABLE} '{text}' (expected octal permission bits, e.g. \"0666\"); using 0600", file=sys.stderr)
        _process_mode = mode
    return _process_mode


def realtime_ns() -> int:
    """created_at_ns: CLOCK_REALTIME nanoseconds in layout 9."""
    return time.time_ns()
