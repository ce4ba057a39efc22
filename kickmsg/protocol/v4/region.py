"""A layout-4 region: the mapped ``Region`` and its ring addresses; create,
open and create_or_open checks, initialisation (seed 000 "Region
creation", "Opening a region"); what it reports (info, stats, the schema,
read-only snapshots for the tools).

``kickmsg.SharedRegion`` holds a ``Region`` as its core on a layout-4
region (``kickmsg.protocol.cores.RegionCore`` is the shape both layouts'
cores share) and hands it to the flows (``publish``, ``receive``,
``rings``, ``repair``).
"""
import ctypes
import functools
import time
import warnings
from collections.abc import Sequence

from kickmsg import layouts, shm
from kickmsg.atomics import HARDWARE, Atomics
from kickmsg.config import MAX_POOL_SIZE, MAX_SUBSCRIBERS, ChannelType, Config, ConfigError, channel_type_of
from kickmsg import owners
from kickmsg.errors import ConfigMismatchError, CorruptRegionError, RegionInitTimeout, VersionMismatchError
from kickmsg.protocol import freestack
from kickmsg.protocol.info import (
    HeaderWords, RegionInfo, RegionStats, RingStats, RingWords, config_differences, region_info, write_header,
)
from kickmsg.protocol.v4 import layout
from kickmsg.protocol.v4.layout import Geometry, Header
from kickmsg.schema import SchemaInfo

__all__ = [
    "CREATE_ATTEMPTS", "INIT_POLL_ATTEMPTS", "INIT_POLL_INTERVAL_S", "Region", "RingAddresses", "attach",
    "bytes_text", "check_creatable", "create", "create_or_map", "create_or_open", "file_stamp", "has_layout",
    "initialise", "is_initialised", "new_geometry", "read_stamp", "refuse_identity_on_layout_4",
    "rings_of_live_subscribers", "stamped_version",
]

INIT_POLL_ATTEMPTS = 200  # create_or_open waits up to 200 x 10 ms for the creator
INIT_POLL_INTERVAL_S = 0.010
CREATE_ATTEMPTS = 100  # unlink-then-create retries when racing other creators


class RingAddresses:
    """Addresses of one subscriber ring's atomic words. (Attributes, not a
    NamedTuple: the flows read these fields at every step; in the compiled
    build, region.pxd makes them C fields.)"""

    def __init__(self, index: int, state_flight: int, write_pos: int, has_waiter: int, entries: range) -> None:
        self.index = index  # the ring's number
        self.state_flight = state_flight
        self.write_pos = write_pos  # its low 32 bits are the futex word
        self.has_waiter = has_waiter
        self.entries = entries  # address of each entry: position p is entries[p & mask]


class Region:
    """A mapped layout-4 region, its geometry and the atomics door; the
    addresses the flows use, computed once from the geometry."""

    layout = layouts.LAYOUT_4

    def __init__(self, mapping: shm.Mapping, geometry: Geometry, atomics: Atomics = HARDWARE) -> None:
        """Wrap a mapping whose geometry is already known to fit (internal)."""
        self.mapping = mapping
        self.geometry = geometry
        self.atomics = atomics
        self.header = Header.from_address(mapping.address)  # the mapping outlives it: we hold both
        self.created_at_ns = self.header.created_at_ns  # which incarnation of the name this object is
        base = mapping.address
        self.magic_address = base + layout.MAGIC_OFFSET
        self.created_at_address = base + layout.CREATED_AT_OFFSET
        self.free_top_address = base + layout.FREE_TOP_OFFSET
        self.schema_state_address = base + layout.SCHEMA_STATE_OFFSET
        # The pool's addresses, computed once (a ring's: ``ring``). A range
        # computes its element on indexing and refuses an index outside it
        # (IndexError), so no index read from shared memory can become a
        # wild address.
        self.pool_address = base + geometry.pool_offset
        pool_size, slot_stride = geometry.pool_size, geometry.slot_stride
        self.slot_addresses = range(self.pool_address, self.pool_address + pool_size * slot_stride, slot_stride)
        payload_start = geometry.pool_offset + layout.SLOT_HEADER_SIZE  # in mapping.buffer
        self.payload_offsets = range(payload_start, payload_start + pool_size * slot_stride, slot_stride)
        self.rings_address = base + geometry.sub_rings_offset

    @functools.cached_property
    def rings(self) -> tuple[RingAddresses, ...]:
        """Every ring's addresses, in index order, built on first use (by the
        flows that visit every ring: publish, diagnose, repairs). A region
        the native library made may have millions of rings: whatever needs
        only some uses ``ring(index)`` and ``rings_in_use()``."""
        return tuple(self.ring(index) for index in range(self.geometry.max_subs))

    def ring(self, index: int) -> RingAddresses:
        """The addresses of ring ``index`` (0 <= index < max_subs)."""
        if not 0 <= index < self.geometry.max_subs:
            raise IndexError(f"{self.name} has no ring {index}: it has {self.geometry.max_subs}")
        ring = self.rings_address + index * self.geometry.ring_stride
        entries = ring + layout.RING_HEADER_SIZE
        return RingAddresses(
            index=index,
            state_flight=ring + layout.STATE_FLIGHT_OFFSET,
            write_pos=ring + layout.WRITE_POS_OFFSET,
            has_waiter=ring + layout.HAS_WAITER_OFFSET,
            entries=range(entries, entries + self.geometry.capacity * layout.ENTRY_SIZE, layout.ENTRY_SIZE),
        )

    def rings_in_use(self) -> list[int]:
        """The indices of the rings that are not idle. An idle ring is Free,
        with no publisher in flight, never written (``state_flight`` and
        ``write_pos`` both 0): it holds nothing and has nothing to show.
        Reads those two words of every ring (acquire), nothing else."""
        ops = self.atomics
        stride = self.geometry.ring_stride
        start = self.rings_address
        return [
            index
            for index, ring in enumerate(range(start, start + self.geometry.max_subs * stride, stride))
            if ops.load_acquire_u32(ring + layout.STATE_FLIGHT_OFFSET) or ops.load_acquire_u64(ring + layout.WRITE_POS_OFFSET)
        ]

    @property
    def name(self) -> str:
        return self.mapping.name

    def slot_address(self, slot: int) -> int:
        """The address of ``slot``'s header (IndexError outside the pool)."""
        return self.slot_addresses[slot]

    def payload_view(self, slot: int, length: int) -> memoryview:
        """The first ``length`` payload bytes of ``slot`` (both in range)."""
        start = self.payload_offsets[slot]
        return self.mapping.buffer[start : start + length]

    # -- what the region reports ----------------------------------------------

    def incarnation(self) -> tuple[int, int]:
        """(creator_pid, created_at_ns): changes when the region is re-created in place."""
        return self.header.creator_pid, self.header.created_at_ns

    def replaced(self) -> bool:
        """Re-initialised in place since this object attached (magic or
        creation stamp changed), or another object made under its name."""
        ops = self.atomics
        if ops.load_acquire_u64(self.magic_address) != layout.MAGIC:
            return True  # being re-initialised in place
        if ops.load_relaxed_u64(self.created_at_address) != self.created_at_ns:
            return True
        return self.mapping.is_replaced()

    def info(self) -> RegionInfo:
        """0.9.2's ``RegionInfo``: what the header says."""
        creator = bytes(self.mapping.buffer[layout.HEADER_SIZE : layout.HEADER_SIZE + self.geometry.creator_name_len])
        return region_info(self.name, self.geometry, self.layout, self.header, creator)

    def stats(self) -> RegionStats:
        """0.9.2's ``RegionStats`` (lock-free, racy by nature). Layout 4 has
        no counters in shared memory: drops, losses and steals read 0."""
        ops = self.atomics
        rings = []
        for ring in self.rings:
            state_flight = ops.load_acquire_u32(ring.state_flight)
            state = state_flight & layout.RING_STATE_MASK
            rings.append(
                RingStats(
                    state=layout.RING_STATE_NAMES.get(state, f"invalid ({state})"),
                    in_flight=state_flight >> 2,
                    write_pos=ops.load_acquire_u64(ring.write_pos),
                    dropped_count=0,
                    lost_count=0,
                )
            )
        return RegionStats(
            rings=rings,
            total_writes=max((r.write_pos for r in rings), default=0),
            live_rings=sum(r.state == "Live" for r in rings),
            pool_free=freestack.count_free(self),
            pool_size=self.geometry.pool_size,
        )

    def schema(self) -> SchemaInfo | None:
        """The published descriptor, or None while it is Unset or Claiming."""
        if self.atomics.load_acquire_u32(self.schema_state_address) != layout.SCHEMA_SET:
            return None
        return SchemaInfo.read_from(self.header.schema_data)

    def header_words(self) -> HeaderWords:
        """magic, free_top and schema_state (acquire), for the tools."""
        ops = self.atomics
        return HeaderWords(
            ops.load_acquire_u64(self.magic_address),
            ops.load_acquire_u64(self.free_top_address),
            ops.load_acquire_u32(self.schema_state_address),
        )

    def ring_words(self, index: int) -> RingWords:
        """Ring ``index``'s state_flight, write_pos and live window (each
        position's sequence, then its slot_idx; acquire), for the tools."""
        ops = self.atomics
        ring = self.ring(index)
        state_flight = ops.load_acquire_u32(ring.state_flight)
        write_pos = ops.load_acquire_u64(ring.write_pos)
        window = []
        for position in range(max(0, write_pos - self.geometry.capacity), write_pos):
            entry = ring.entries[position & self.geometry.mask]
            sequence = ops.load_acquire_u64(entry + layout.SEQUENCE_OFFSET)
            window.append((position, sequence, ops.load_acquire_u32(entry + layout.SLOT_IDX_OFFSET)))
        return RingWords(index, state_flight, write_pos, window)


def create(name: str, type: ChannelType, cfg: Config, creator: str, mode: int | None) -> Region:
    """``SharedRegion.create`` of a layout-4 region (its docstring says how)."""
    refuse_identity_on_layout_4(name, cfg)
    geometry, creator_bytes = new_geometry(name, type, cfg, creator)
    permissions = shm.creation_mode(mode)
    reusable = shm.allocated_bytes(name) if shm.object_size(name) == geometry.total_size else 0
    check_creatable(name, geometry, reusable)
    for _ in range(CREATE_ATTEMPTS):
        mapping, created = create_or_map(name, geometry, permissions)
        if mapping is not None and created:
            owners.unlink(name)  # ring owners of a region removed without its sidecar
            return initialise(mapping, geometry, creator_bytes, cfg.schema, in_place=False)
        if mapping is not None and has_layout(mapping, geometry):
            kept = rings_of_live_subscribers(Region(mapping, geometry))
            return initialise(mapping, geometry, creator_bytes, cfg.schema, in_place=True, kept_rings=kept)
        owners.unlink(name)
        shm.unlink(name)
    raise RegionInitTimeout(f"could not create {name}: other processes keep re-creating it")


def create_or_open(name: str, type: ChannelType, cfg: Config, creator: str, mode: int | None) -> Region:
    """``SharedRegion.create_or_open`` of a layout-4 region."""
    refuse_identity_on_layout_4(name, cfg)
    geometry, creator_bytes = new_geometry(name, type, cfg, creator)
    permissions = shm.creation_mode(mode)
    if shm.object_size(name) is None:
        check_creatable(name, geometry, 0)  # only a region we may have to create must fit
    for _ in range(INIT_POLL_ATTEMPTS):
        mapping, created = create_or_map(name, geometry, permissions)
        if mapping is not None and created:
            owners.unlink(name)  # a sidecar left by a region removed without it
            return initialise(mapping, geometry, creator_bytes, cfg.schema, in_place=False)
        # Not ours: wait until its creator has stored magic (None: it was
        # unlinked meanwhile, or its creator is before ftruncate).
        if mapping is not None and stamped_version(mapping) not in (None, layouts.LAYOUT_4):
            found = stamped_version(mapping)
            hint = " (layout=9 or KICKMSG_LAYOUT=9 joins it)" if found == layouts.LAYOUT_9 else ""
            raise VersionMismatchError(f"Region version mismatch on {name}: it has layout {found}, create_or_open was asked for layout 4{hint}")
        if mapping is not None and is_initialised(mapping):
            region = attach(mapping, 0)
            if region.geometry.config_hash != geometry.config_hash:
                raise ConfigMismatchError(
                    f"Config mismatch on existing region: {name} ({config_differences(region.geometry, geometry)})"
                )
            return region
        time.sleep(INIT_POLL_INTERVAL_S)
    raise RegionInitTimeout(f"Timed out waiting for region init: {name}")


def attach(mapping: shm.Mapping, expected_identity: int) -> Region:
    """Check a mapping whose version word says layout 4 and wrap it; flag a
    geometry that cannot work (when attached to use it, not to inspect it)."""
    name = mapping.name
    if expected_identity:
        raise ConfigMismatchError(
            f"Identity mismatch on {name}: it is a layout-4 region, which stamps no identity "
            f"(expected 0x{expected_identity:016x})"
        )
    if mapping.size < layout.HEADER_SIZE:
        raise CorruptRegionError(
            f"Region {name} is truncated: {mapping.size} bytes, smaller than the {layout.HEADER_SIZE}-byte header"
        )
    header = Header.from_address(mapping.address)
    geometry = Geometry.from_header(header)
    problems = geometry.problems(mapping.size, header.sub_ring_mask)
    if problems:
        raise CorruptRegionError(f"Region {name} does not fit its mapping: " + "; ".join(problems))
    if mapping.writable:
        for hazard in geometry.hazards():
            warnings.warn(f"{name}: {hazard}", RuntimeWarning, stacklevel=4)  # the caller of SharedRegion.open or create_or_open
    return Region(mapping, geometry)


def refuse_identity_on_layout_4(name: str, cfg: Config) -> None:
    if cfg.identity:
        raise ConfigError(
            f"cannot create {name} with Config.identity 0x{cfg.identity:016x}: layout 4 stamps no identity "
            f"(layout=9 does)"
        )


def new_geometry(name: str, type: ChannelType, cfg: Config, creator: str) -> tuple[Geometry, bytes]:
    """Check the arguments of create/create_or_open; the region's geometry.
    An invalid channel type or config (0.1.0's rules, our wire limits, a
    geometry that cannot work: ``Geometry.hazards``) raises ``ConfigError``,
    both the ``ValueError`` we document and the ``RuntimeError`` of 0.1.0."""
    shm.check_name(name)
    if not isinstance(cfg, Config):
        raise TypeError(f"cfg must be a kickmsg.Config, got {cfg!r}")
    channel_type = channel_type_of(type)
    problem = cfg.validation_error()
    if problem:
        raise ConfigError(f"{problem} (creating {name})")
    creator_bytes = creator.encode("utf-8")[: layout.U16_MAX]
    geometry = Geometry.for_config(
        channel_type,
        cfg.max_subscribers,
        cfg.sub_ring_capacity,
        cfg.pool_size,
        cfg.max_payload_size,
        cfg.commit_timeout_us,
        len(creator_bytes),
    )
    hazards = geometry.hazards()
    if hazards:
        raise ConfigError(f"cannot create {name}: {hazards[0]}")
    return geometry, creator_bytes


def create_or_map(name: str, geometry: Geometry, permissions: int) -> tuple[shm.Mapping | None, bool]:
    """``shm.create_or_map``, a failed reservation told as ``ConfigError``."""
    try:
        return shm.create_or_map(name, geometry.total_size, permissions)
    except shm.NoRoomError as error:
        raise ConfigError(
            f"cannot create {name}: {error.strerror} while reserving {bytes_text(geometry.total_size)} "
            f"({geometry.total_size} bytes: {geometry.size_breakdown()})"
        ) from None


def has_layout(mapping: shm.Mapping, geometry: Geometry) -> bool:
    """Whether the mapped object is an initialised region laid out exactly
    as ``geometry`` says (so processes attached to it may run their flows
    over a re-initialised one), every page of it already allocated (so
    re-initialising it touches no page the machine cannot give)."""
    if mapping.size != geometry.total_size or not is_initialised(mapping):
        return False
    if shm.allocated_bytes(mapping.name) < mapping.size:
        return False
    return Geometry.from_header(Header.from_address(mapping.address)).same_layout(geometry)


def rings_of_live_subscribers(region: Region) -> list[tuple[int, int, int]]:
    """(ring, write_pos, has_waiter) of each Live ring held by a living
    subscriber of this package (its owner record's lock is held): the rings
    a re-create in place keeps for them."""
    ops = region.atomics
    records = owners.read_owners(region.name, region.geometry.max_subs) or []
    kept = []
    for ring, (record, held) in zip(region.rings, records):
        state = ops.load_acquire_u32(ring.state_flight) & layout.RING_STATE_MASK
        if state == layout.RING_LIVE and held and record is not None and record.region_created_at_ns == region.created_at_ns:
            kept.append((ring.index, ops.load_acquire_u64(ring.write_pos), ops.load_relaxed_u32(ring.has_waiter)))
    return kept


def initialise(
    mapping: shm.Mapping,
    geometry: Geometry,
    creator: bytes,
    schema: SchemaInfo | None,
    in_place: bool,
    kept_rings: Sequence[tuple[int, int, int]] = (),
) -> Region:
    """Lay out a region in the mapping; publish it by storing magic last.

    A new object is zero-filled by ftruncate. One re-initialised in place is
    first marked uninitialised (magic 0) and zeroed; ``kept_rings``
    (``rings_of_live_subscribers``) stay Live for their subscribers.
    """
    region = Region(mapping, geometry)
    ops = region.atomics
    header = region.header
    if in_place:
        ops.store_release_u64(mapping.address + layout.MAGIC_OFFSET, 0)
        ctypes.memset(mapping.address, 0, mapping.size)
    # 1. Header fields (created_at_ns: CLOCK_MONOTONIC in layout 4).
    write_header(header, geometry, layout.VERSION, time.monotonic_ns())
    region.created_at_ns = header.created_at_ns
    mapping.buffer[layout.HEADER_SIZE : layout.HEADER_SIZE + len(creator)] = creator
    # 2. Schema: nobody can see the region yet, so a relaxed Set suffices.
    if schema is not None:
        schema.write_to(header.schema_data)
        ops.store_relaxed_u32(region.schema_state_address, layout.SCHEMA_SET)
    # 3. Free stack: as if slots 0, 1, ..., pool_size-1 were pushed in order
    #    (each push bumps the generation; slot pool_size-1 ends on top).
    for slot in range(geometry.pool_size):
        below = slot - 1 if slot > 0 else layout.INVALID_SLOT
        ops.store_relaxed_u32(region.slot_addresses[slot] + layout.NEXT_FREE_OFFSET, below)
    ops.store_relaxed_u64(
        region.free_top_address, (geometry.pool_size & layout.U32_MAX) << 32 | (geometry.pool_size - 1)
    )
    # 4. Rings are Free with write_pos 0: already zero. Beyond 0.1.0, a ring
    #    kept for a live subscriber of the replaced incarnation stays Live at
    #    its write position, the entries of its window committed empty
    #    (INVALID_SLOT), its owner record moved to this incarnation: its
    #    subscriber reads on, counting the messages it had not read as lost.
    if in_place and mapping.shared:
        owners.restart(mapping.name, [ring for ring, _, _ in kept_rings], header.created_at_ns)
    for index, write_pos, has_waiter in kept_rings:
        ring = region.rings[index]
        for position in range(max(0, write_pos - geometry.capacity), write_pos):
            entry = ring.entries[position & geometry.mask]
            ops.store_relaxed_u32(entry + layout.SLOT_IDX_OFFSET, layout.INVALID_SLOT)
            ops.store_relaxed_u64(entry + layout.SEQUENCE_OFFSET, position + 1)
        ops.store_relaxed_u64(ring.write_pos, write_pos)
        ops.store_relaxed_u32(ring.has_waiter, has_waiter)
        ops.store_relaxed_u32(ring.state_flight, layout.RING_LIVE)
    # 5. Magic last, with release: create_or_open polls it with acquire.
    ops.store_release_u64(mapping.address + layout.MAGIC_OFFSET, layout.MAGIC)
    return region


def is_initialised(mapping: shm.Mapping) -> bool:
    """Magic and version are in place (read with acquire)."""
    if mapping.size < layout.HEADER_SIZE:
        return False
    magic = HARDWARE.load_acquire_u64(mapping.address + layout.MAGIC_OFFSET)
    return magic == layout.MAGIC and Header.from_address(mapping.address).version == layout.VERSION


def file_stamp(path: str) -> tuple[int, int] | None:
    """(magic, version word) read from the start of a region's file, without
    mapping it (both layouts stamp them there); None if the file is shorter.
    Raises what ``shm.read_head`` raises."""
    size = layout.VERSION_OFFSET + 4
    head = shm.read_head(path, size)
    if len(head) < size:
        return None
    return int.from_bytes(head[: layout.VERSION_OFFSET], "little"), int.from_bytes(head[layout.VERSION_OFFSET : size], "little")


def read_stamp(mapping: shm.Mapping) -> tuple[int, int | None]:
    """(magic, version word) of any mapping: magic read with acquire (0 if
    the mapping is smaller than it), then the version word, relaxed (None if
    the mapping ends before it). Both layouts stamp them at these offsets."""
    magic = HARDWARE.load_acquire_u64(mapping.address + layout.MAGIC_OFFSET) if mapping.size >= 8 else 0
    version = HARDWARE.load_relaxed_u32(mapping.address + layout.VERSION_OFFSET) if mapping.size >= 12 else None
    return magic, version


def stamped_version(mapping: shm.Mapping) -> int | None:
    """The version word of an initialised region (magic read with acquire), else None."""
    if mapping.size < layout.HEADER_SIZE or HARDWARE.load_acquire_u64(mapping.address + layout.MAGIC_OFFSET) != layout.MAGIC:
        return None
    return HARDWARE.load_relaxed_u32(mapping.address + layout.VERSION_OFFSET)


def check_creatable(name: str, geometry: Geometry, reusable: int) -> None:
    """Refuse (``ConfigError``) a region larger than the memory the machine
    can give it (``shm.room_for_new_object``), counting ``reusable`` bytes
    already held by the object it would re-initialise in place; then one
    beyond this package's bounds: more than MAX_SUBSCRIBERS rings (every
    publish visits every ring) or MAX_POOL_SIZE slots (create lays out
    every slot, the tools read every slot)."""
    room, limit = shm.room_for_new_object()
    if geometry.total_size > room + reusable:
        raise ConfigError(
            f"cannot create {name}: it would take {bytes_text(geometry.total_size)} "
            f"({geometry.total_size} bytes: {geometry.size_breakdown()}), but only {bytes_text(room)} "
            f"are {limit}; lower pool_size, max_payload_size, max_subscribers or sub_ring_capacity"
        )
    if geometry.max_subs > MAX_SUBSCRIBERS:
        raise ConfigError(
            f"cannot create {name}: max_subscribers must be at most {MAX_SUBSCRIBERS}, got {geometry.max_subs} "
            f"(every publish visits every ring, and so do the tools)"
        )
    if geometry.pool_size > MAX_POOL_SIZE:
        raise ConfigError(
            f"cannot create {name}: pool_size must be at most {MAX_POOL_SIZE}, got {geometry.pool_size} "
            f"(creating the region lays out every slot, and the tools read every slot)"
        )


def bytes_text(size: int) -> str:
    """``1084288`` -> ``1.0 MiB``."""
    value, unit = float(size), "bytes"
    for bigger in ("KiB", "MiB", "GiB", "TiB", "PiB"):
        if value < 1024:
            break
        value, unit = value / 1024, bigger
    return f"{size} bytes" if unit == "bytes" else f"{value:.1f} {unit}"
