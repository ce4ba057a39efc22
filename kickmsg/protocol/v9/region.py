"""A layout-9 channel region: create, open, create_or_open (WIRE9.md B.1-B.3),
info and stats (B.18), the schema (B.17), read-only snapshots for the tools.

``Region`` holds the mapping, the validated geometry snapshot and the atomics
door; every address it hands out is computed from the snapshot.
``kickmsg.SharedRegion`` holds one as its core on a layout-9 region
(``kickmsg.protocol.cores.RegionCore`` is the shape both layouts' cores share).
"""
import time
from collections.abc import Callable
from dataclasses import dataclass

from kickmsg import layouts, shm
from kickmsg.atomics import HARDWARE, Atomics
from kickmsg.protocol import freestack
from kickmsg.protocol.info import (
    HeaderWords, RegionInfo, RegionStats, RingStats, RingWords, config_differences, region_info, write_header,
)
from kickmsg.protocol.v9 import liveness
from kickmsg.protocol.v9.layout import (
    DEFAULT_COMMIT_TIMEOUT_US,
    CREATED_AT_OFFSET,
    ENTRY_SIZE,
    FREE_TOP_OFFSET,
    HEADER_SIZE,
    INVALID_SLOT,
    MAGIC,
    MAGIC_OFFSET,
    META_OFFSET,
    OWNER_PID_OFFSET,
    OWNER_STARTTIME_OFFSET,
    RING_HEADER_SIZE,
    RING_STATE_MASK,
    RING_STATE_NAMES,
    SCHEMA_DATA_OFFSET,
    SCHEMA_SET,
    SCHEMA_STATE_OFFSET,
    SEQUENCE_OFFSET,
    SLOT_HEADER_SIZE,
    STATE_FLIGHT_OFFSET,
    STEAL_COUNT_OFFSET,
    VERSION,
    WRITE_POS_OFFSET,
    DROPPED_COUNT_OFFSET,
    LOST_COUNT_OFFSET,
    REFCOUNT_OFFSET,
    CorruptRegionError,
    Geometry,
    Header,
    SchemaInfoLayout,
    VersionMismatchError,
    realtime_ns,
    shm_mode,
    validate,
)
from kickmsg.schema import SchemaInfo
from kickmsg.errors import ConfigMismatchError, RegionInitTimeout

__all__ = ["ChannelConfig", "OPEN_ATTEMPTS", "OPEN_RETRY_S", "Region", "RegionInitTimeout", "sleep_ns"]

OPEN_ATTEMPTS = 200  # B.3: create_or_open polls an uninitialised region this often...
OPEN_RETRY_S = 0.010  # ...this far apart (about 2 s in all)


def _mismatch(header: Header, wanted: Geometry) -> str:
    """How the existing region's config differs from ``wanted``; the two
    config hashes if its header holds no config this layout accepts."""
    try:
        existing = Geometry.for_config(
            header.channel_type, header.max_subs, header.sub_ring_capacity, header.pool_size,
            header.slot_data_size, header.commit_timeout_us,
        )
    except ValueError:
        return f"config_hash 0x{header.config_hash:016x}, ours 0x{wanted.config_hash:016x}"
    return config_differences(existing, wanted)


@dataclass(frozen=True)
class ChannelConfig:
    """0.9.2's Config: the five geometry fields, commit timeout, schema, identity."""

    max_subscribers: int = 16
    sub_ring_capacity: int = 64
    pool_size: int = 256
    max_payload_size: int = 4096
    commit_timeout_us: int = DEFAULT_COMMIT_TIMEOUT_US
    schema: SchemaInfo | None = None
    identity: int = 0

    def geometry(self, channel_type: int, creator_name_len: int = 0) -> Geometry:
        return Geometry.for_config(
            channel_type, self.max_subscribers, self.sub_ring_capacity, self.pool_size, self.max_payload_size,
            self.commit_timeout_us, creator_name_len,
        )


def sleep_ns(ns: int) -> None:
    """The repairs' sleep of a commit timeout (B.13), and a blocking
    receive's nap on a claimed head (B.11)."""
    time.sleep(ns / 1e9)


class Region:
    """One mapped layout-9 region and its validated geometry."""

    layout = layouts.LAYOUT_9

    def __init__(self, mapping: shm.Mapping, geometry: Geometry, atomics: Atomics = HARDWARE) -> None:
        if mapping.size < geometry.total_size:  # validate() saw to it; a private mapping must too
            raise CorruptRegionError(f"{mapping.name}: mapping of {mapping.size} bytes < total_size {geometry.total_size}")
        self.mapping = mapping
        self.geometry = geometry
        self.atomics = atomics
        # The clock of commit timeouts and receive deadlines, the repairs'
        # sleep and the receive's nap, and owner liveness (B.16: who this
        # process is, whether a recorded owner is dead). kickmsg.verify
        # replaces them with modelled ones: its actors are owners of their
        # own, and die at its choice.
        self.monotonic_ns: Callable[[], int] = time.monotonic_ns
        self.sleep_ns: Callable[[int], None] = sleep_ns
        self.process_identity: Callable[[], tuple[int, int]] = liveness.process_identity
        self.owner_is_dead: Callable[[int, int], bool] = liveness.owner_is_dead
        self.base = mapping.address
        self.header = Header.from_address(self.base)  # the mapping outlives it: we hold both
        self.created_at_ns = self.header.created_at_ns  # which incarnation of the name this object is (0 until initialised)
        self.free_top_address = self.base + FREE_TOP_OFFSET
        self.steal_count_address = self.base + STEAL_COUNT_OFFSET
        # Every ring's, entry's and slot's address, computed once: the flows
        # index these (a range holds three numbers, whatever its length).
        g = geometry
        first_ring = self.base + g.sub_rings_offset
        self.ring_addresses = range(first_ring, first_ring + g.max_subs * g.ring_stride, g.ring_stride)
        self.ring_entries = tuple(
            range(ring + RING_HEADER_SIZE, ring + RING_HEADER_SIZE + g.capacity * ENTRY_SIZE, ENTRY_SIZE)
            for ring in self.ring_addresses
        )  # entry of position p in ring i: ring_entries[i][p & mask]
        first_slot = self.base + g.pool_offset
        self.slot_addresses = range(first_slot, first_slot + g.pool_size * g.slot_stride, g.slot_stride)
        first_payload = g.pool_offset + SLOT_HEADER_SIZE  # in mapping.buffer
        self.payload_offsets = range(first_payload, first_payload + g.pool_size * g.slot_stride, g.slot_stride)

    # -- B.1 Create (exclusive) ----------------------------------------------

    @classmethod
    def create(
        cls, name: str, channel_type: int, config: ChannelConfig = ChannelConfig(), creator: str = "",
        atomics: Atomics = HARDWARE, mode: int | None = None,
    ) -> "Region":
        """Remove any object of that name, create it exclusively (mode
        0600 / $KICKMSG_SHM_MODE, or ``mode``: our extension), initialise it
        and store MAGIC last."""
        # 1. validate the config; 2. compute the layout
        creator_bytes = creator.encode("utf-8")
        geometry = config.geometry(channel_type, len(creator_bytes))
        shm.check_name(name)
        # 2. unlink, then create exclusive (never O_TRUNC: peers keep their old mapping)
        shm.unlink(name)
        mapping = shm.create_exclusive(name, geometry.total_size, shm_mode() if mode is None else mode)
        region = cls(mapping, geometry, atomics)
        region._initialise(creator_bytes, config)
        return region

    def _initialise(self, creator_bytes: bytes, config: ChannelConfig) -> None:
        """B.1 steps 3-8 on a fresh mapping of total_size zero bytes."""
        g = self.geometry
        ops = self.atomics
        buffer = self.mapping.buffer
        # 3. (a new object is all zeros already) plain stores of the header fields and the name
        header = Header.from_buffer(buffer)
        write_header(header, g, VERSION, realtime_ns())
        self.created_at_ns = header.created_at_ns
        buffer[HEADER_SIZE : HEADER_SIZE + len(creator_bytes)] = creator_bytes
        # 4. the schema, if given (MAGIC's release publishes it)
        if config.schema is not None:
            config.schema.write_to(SchemaInfoLayout.from_buffer(buffer, SCHEMA_DATA_OFFSET))
            ops.store_relaxed_u32(self.base + SCHEMA_STATE_OFFSET, SCHEMA_SET)
        # 5. free_top empty, steal_count 0, identity
        ops.store_relaxed_u64(self.free_top_address, INVALID_SLOT)
        ops.store_relaxed_u64(self.steal_count_address, 0)
        header.identity_hash = config.identity
        del header  # no ctypes view outlives this function
        # 6. every slot onto the stack, in order (slot pool_size - 1 ends on top)
        for slot in range(g.pool_size):
            ops.store_relaxed_u32(self.slot_address(slot) + REFCOUNT_OFFSET, 0)
            freestack.push(self, slot)
        # 7. the rings are all zero already (Free, no owner, counters 0)
        # 8. MAGIC last, with release
        ops.store_release_u64(self.base + MAGIC_OFFSET, MAGIC)

    # -- B.2 Open -------------------------------------------------------------

    @classmethod
    def open(cls, name: str, expected_identity: int = 0, atomics: Atomics = HARDWARE) -> "Region":
        """Map an existing region and validate it (A.10); no write to it."""
        try:
            mapping = shm.open_existing(name)
        except shm.EmptyObjectError:
            raise shm.RegionNotFoundError(f"no shared memory named {name} (the object is empty)") from None
        return cls.attach(mapping, expected_identity, atomics)

    @classmethod
    def attach(cls, mapping: shm.Mapping, expected_identity: int = 0, atomics: Atomics = HARDWARE) -> "Region":
        """Validate a mapped region (A.10) and wrap it; no write to it."""
        return cls(mapping, cls._validate(mapping, expected_identity, atomics), atomics)

    @staticmethod
    def _validate(mapping: shm.Mapping, expected_identity: int, atomics: Atomics) -> Geometry:
        magic = atomics.load_acquire_u64(mapping.address + MAGIC_OFFSET) if mapping.size >= 8 else 0
        header_bytes = bytes(mapping.buffer[:HEADER_SIZE])
        return validate(mapping.name, header_bytes, mapping.size, magic, expected_identity)

    # -- B.3 Create or open ------------------------------------------------------

    @classmethod
    def create_or_open(
        cls, name: str, channel_type: int, config: ChannelConfig = ChannelConfig(), creator: str = "",
        atomics: Atomics = HARDWARE, mode: int | None = None,
    ) -> "Region":
        """``mode`` (our extension) replaces 0.9.2's 0600 / $KICKMSG_SHM_MODE
        for the object this call creates."""
        # 1. validate, compute the layout
        creator_bytes = creator.encode("utf-8")
        geometry = config.geometry(channel_type, len(creator_bytes))
        # 2. try an exclusive create
        try:
            mapping = shm.create_exclusive(name, geometry.total_size, shm_mode() if mode is None else mode)
        except FileExistsError:
            pass
        else:
            region = cls(mapping, geometry, atomics)
            region._initialise(creator_bytes, config)
            return region
        # 3. open once it is initialised (the caller's schema is ignored here)
        for _ in range(OPEN_ATTEMPTS):
            opened: shm.Mapping | None
            try:
                opened = shm.open_existing(name)
            except (shm.RegionNotFoundError, shm.EmptyObjectError):
                opened = None
            if opened is not None and opened.size >= HEADER_SIZE:
                if atomics.load_acquire_u64(opened.address + MAGIC_OFFSET) == MAGIC:
                    header = Header.from_buffer_copy(bytes(opened.buffer[:HEADER_SIZE]))
                    if header.version != VERSION:
                        raise VersionMismatchError(
                            f"Region version mismatch on {name}: stamped by an incompatible kickmsg build "
                            f"(version {header.version}, this layout speaks {VERSION}); stop its users and unlink it"
                        )
                    if header.config_hash != geometry.config_hash:
                        raise ConfigMismatchError(f"Config mismatch on existing region: {name} ({_mismatch(header, geometry)})")
                    return cls(opened, cls._validate(opened, config.identity, atomics), atomics)
            time.sleep(OPEN_RETRY_S)  # the protocol's own poll (B.3 step 3)
        # 4. never initialised
        raise RegionInitTimeout(f"Timed out waiting for region init: {name}")

    # -- Addresses (from the snapshot only) ------------------------------------------

    @property
    def name(self) -> str:
        return self.mapping.name

    def ring_address(self, ring: int) -> int:
        return self.base + self.geometry.ring_offset(ring)

    def entry_address(self, ring: int, pos: int) -> int:
        return self.base + self.geometry.entry_offset(ring, pos)

    def slot_address(self, slot: int) -> int:
        """The address of ``slot`` (0 <= slot < pool_size)."""
        return self.slot_addresses[slot]

    def payload(self, slot: int, length: int) -> memoryview:
        """The first ``length`` payload bytes of ``slot`` (both in range)."""
        start = self.payload_offsets[slot]
        return self.mapping.buffer[start : start + length]

    def unlink(self) -> None:
        shm.unlink(self.name)

    # -- Reports ---------------------------------------------------------------

    def info(self) -> RegionInfo:
        header = Header.from_buffer_copy(bytes(self.mapping.buffer[:HEADER_SIZE]))
        creator = bytes(self.mapping.buffer[HEADER_SIZE : HEADER_SIZE + self.geometry.creator_name_len])
        return region_info(self.name, self.geometry, header.version, header, creator)

    def stats(self) -> RegionStats:
        """B.18: lock-free and racy by nature."""
        ops = self.atomics
        rings = []
        for index in range(self.geometry.max_subs):
            ring = self.ring_address(index)
            state_flight = ops.load_acquire_u32(ring + STATE_FLIGHT_OFFSET)
            rings.append(
                RingStats(
                    state=RING_STATE_NAMES[state_flight & RING_STATE_MASK],
                    in_flight=state_flight >> 2,
                    write_pos=ops.load_acquire_u64(ring + WRITE_POS_OFFSET),
                    dropped_count=ops.load_relaxed_u64(ring + DROPPED_COUNT_OFFSET),
                    lost_count=ops.load_relaxed_u64(ring + LOST_COUNT_OFFSET),
                )
            )
        return RegionStats(
            rings=rings,
            total_writes=max((r.write_pos for r in rings), default=0),
            total_drops=sum(r.dropped_count for r in rings),
            total_losses=sum(r.lost_count for r in rings),
            total_steals=ops.load_relaxed_u64(self.steal_count_address),
            live_rings=sum(r.state == "Live" for r in rings),
            pool_free=freestack.count_free(self),
            pool_size=self.geometry.pool_size,
        )

    def incarnation(self) -> tuple[int, int]:
        """(creator_pid, created_at_ns) of the header."""
        return self.header.creator_pid, self.header.created_at_ns

    def replaced(self) -> bool:
        """Whether another region was made under this one's name since we
        attached (layout 9 always creates a new object: unlink, then
        exclusive create): magic or creation stamp changed, or the name
        leads to another object."""
        ops = self.atomics
        if ops.load_acquire_u64(self.base + MAGIC_OFFSET) != MAGIC:
            return True
        if ops.load_relaxed_u64(self.base + CREATED_AT_OFFSET) != self.created_at_ns:
            return True
        return self.mapping.is_replaced()

    def rings_in_use(self) -> list[int]:
        """The indices of the rings that are not idle (Free, no publisher in
        flight, never written: both words 0), as on layout 4."""
        ops = self.atomics
        return [
            index
            for index, ring in enumerate(self.ring_addresses)
            if ops.load_acquire_u32(ring + STATE_FLIGHT_OFFSET) or ops.load_acquire_u64(ring + WRITE_POS_OFFSET)
        ]

    def header_words(self) -> HeaderWords:
        """magic, free_top and schema_state (acquire), for the tools."""
        ops = self.atomics
        return HeaderWords(
            ops.load_acquire_u64(self.base + MAGIC_OFFSET),
            ops.load_acquire_u64(self.free_top_address),
            ops.load_acquire_u32(self.base + SCHEMA_STATE_OFFSET),
        )

    def ring_words(self, index: int) -> RingWords:
        """Ring ``index``'s state_flight, write_pos, the sequence of each
        position of its live window, the meta word of every entry and its
        owner (acquire; the owner's start time relaxed, after its pid), for
        the tools."""
        ops = self.atomics
        ring = self.ring_addresses[index]
        entries = self.ring_entries[index]
        mask = self.geometry.mask
        state_flight = ops.load_acquire_u32(ring + STATE_FLIGHT_OFFSET)
        write_pos = ops.load_acquire_u64(ring + WRITE_POS_OFFSET)
        window = [
            (position, ops.load_acquire_u64(entries[position & mask] + SEQUENCE_OFFSET), 0)
            for position in range(max(0, write_pos - self.geometry.capacity), write_pos)
        ]
        metas = [ops.load_acquire_u64(entry + META_OFFSET) for entry in entries]
        owner_pid = ops.load_acquire_u64(ring + OWNER_PID_OFFSET)
        return RingWords(index, state_flight, write_pos, window, metas, owner_pid, ops.load_relaxed_u64(ring + OWNER_STARTTIME_OFFSET))

    def schema(self) -> SchemaInfo | None:
        """B.17 read: the descriptor once Set, else None."""
        if self.atomics.load_acquire_u32(self.base + SCHEMA_STATE_OFFSET) != SCHEMA_SET:
            return None
        copy = SchemaInfoLayout.from_buffer_copy(bytes(self.mapping.buffer[SCHEMA_DATA_OFFSET : SCHEMA_DATA_OFFSET + 512]))
        return SchemaInfo.read_from(copy)

    def __repr__(self) -> str:
        return f"Region(name={self.name!r}, layout={VERSION}, size={self.geometry.total_size})"

