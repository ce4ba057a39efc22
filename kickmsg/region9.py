"""SharedRegion on a layout-9 region (native kickmsg 0.9.2).

``Layout9Region`` is what ``SharedRegion.create``/``open``/``inspect``/
``create_or_open`` return for layout 9: the same public surface, each call
handed to the layout-9 core (``kickmsg.protocol.v9``: ``Region`` for the
mapping and its validated geometry, ``repair`` for diagnose, the repairs
and the schema claim). The layout-4 internals of ``SharedRegion`` (ring
addresses, the owner sidecars) are not available on it.
"""
from typing import NoReturn

from kickmsg import layouts, shm
from kickmsg.protocol.v4 import layout
from kickmsg.atomics import HARDWARE, Atomics
from kickmsg.protocol import v9
from kickmsg.protocol.v9 import repair
from kickmsg.protocol.v9.layout import (
    CREATED_AT_OFFSET,
    HEADER_SIZE,
    MAGIC,
    MAGIC_OFFSET,
    OWNER_PID_OFFSET,
    OWNER_STARTTIME_OFFSET,
    RING_DRAINING,
    RING_FREE,
    RING_LIVE,
    RING_RECLAIMING,
    RING_STATE_MASK,
    SCHEMA_STATE_OFFSET,
    STATE_FLIGHT_OFFSET,
    WRITE_POS_OFFSET,
    Header,
    VersionMismatchError,
    validate,
)
from kickmsg.protocol.v4.region import stamped_version
from kickmsg.region import DeadSubscriberReport, HealthReport, SharedRegion
from kickmsg.schema import SchemaInfo
from kickmsg.errors import Layout4Only

__all__ = ["Layout9Region", "attach", "create", "create_or_open", "described_geometry", "open_when_ready"]


def described_geometry(geometry: v9.Geometry) -> layout.Geometry:
    """The layout-9 geometry in the terms ``SharedRegion.geometry`` gives
    (the same thirteen fields, with the same meanings)."""
    return layout.Geometry(
        channel_type=geometry.channel_type,
        max_subs=geometry.max_subs,
        capacity=geometry.capacity,
        pool_size=geometry.pool_size,
        slot_data_size=geometry.slot_data_size,
        commit_timeout_us=geometry.commit_timeout_us,
        creator_name_len=geometry.creator_name_len,
        sub_rings_offset=geometry.sub_rings_offset,
        ring_stride=geometry.ring_stride,
        pool_offset=geometry.pool_offset,
        slot_stride=geometry.slot_stride,
        total_size=geometry.total_size,
        config_hash=geometry.config_hash,
    )


class Layout9Region(SharedRegion):
    """A mapped layout-9 region (built by ``SharedRegion``'s constructors)."""

    layout = 9

    def __init__(self, core: v9.Region) -> None:  # no super().__init__: it lays out layout 4
        self.core = core
        self.mapping = core.mapping
        self.geometry = described_geometry(core.geometry)
        self.created_at_ns = core.info().created_at_ns  # which incarnation of the name this object is
        # The words both layouts have, under the names the tools use (the
        # slot headers start with refcount and next_free in both).
        # Layout 9's header (A.2) has every field of layout 4's under the same name.
        self.header = Header.from_address(core.base)  # type: ignore[assignment]  # the mapping outlives it: we hold both
        self.free_top_address = core.free_top_address
        self.schema_state_address = core.base + SCHEMA_STATE_OFFSET
        pool_address, slot_stride = core.base + core.geometry.pool_offset, core.geometry.slot_stride
        self.slot_addresses = range(pool_address, pool_address + core.geometry.pool_size * slot_stride, slot_stride)

    def __getattr__(self, attribute: str) -> NoReturn:
        """Only for attributes this object lacks: layout 4's internals (ring
        and slot addresses, its header view, ...), which a tool that does not
        handle layout 9 yet reaches for. A clear error instead of a crash."""
        mapping = self.__dict__.get("mapping")
        name = mapping.name if mapping is not None else "this region"
        raise Layout4Only(f"{name} is a layout-9 region: {attribute} is layout 4's (this tool does not handle layout 9 yet)")

    @property
    def atomics(self) -> Atomics:
        """The core's atomics door (replaced here, it is replaced for every flow)."""
        return self.core.atomics

    @atomics.setter
    def atomics(self, atomics: Atomics) -> None:
        self.core.atomics = atomics

    # -- description ----------------------------------------------------------

    def incarnation(self) -> tuple[int, int]:
        info = self.core.info()
        return info.creator_pid, info.created_at_ns

    def replaced(self) -> bool:
        """Whether another region was made under this one's name since we
        attached (layout 9 always creates a new object: unlink, then
        exclusive create). Never, for a region in private memory."""
        if not self.mapping.shared:
            return False
        ops = self.atomics
        if ops.load_acquire_u64(self.core.base + MAGIC_OFFSET) != MAGIC:
            return True
        if ops.load_relaxed_u64(self.core.base + CREATED_AT_OFFSET) != self.created_at_ns:
            return True
        return self.mapping.is_replaced()

    def rings_in_use(self) -> list[int]:
        """The indices of the rings that are not idle (Free, no publisher in
        flight, never written: both words 0), as on layout 4."""
        ops = self.atomics
        return [
            index
            for index in range(self.geometry.max_subs)
            if ops.load_acquire_u32((ring := self.core.ring_address(index)) + STATE_FLIGHT_OFFSET)
            or ops.load_acquire_u64(ring + WRITE_POS_OFFSET)
        ]

    def payload_view(self, slot: int, length: int) -> memoryview:
        return self.core.payload(slot, length)

    def info(self) -> v9.RegionInfo:
        return self.core.info()

    def stats(self) -> v9.RegionStats:
        return self.core.stats()

    def __repr__(self) -> str:
        g = self.geometry
        return (
            f"SharedRegion(name={self.name!r}, layout=9, type={self.channel_type.name}, max_subscribers={g.max_subs}, "
            f"sub_ring_capacity={g.capacity}, pool_size={g.pool_size}, max_payload_size={g.slot_data_size})"
        )

    # -- schema descriptor (B.17) --------------------------------------------------

    def schema(self) -> SchemaInfo | None:
        return self.core.schema()

    def try_claim_schema(self, info: SchemaInfo) -> bool:
        self.require_writable("claim the schema")
        if not isinstance(info, SchemaInfo):
            raise TypeError(f"try_claim_schema needs a SchemaInfo, got {info!r}")
        return repair.try_claim_schema(self.core, info)

    def reset_schema_claim(self) -> bool:
        self.require_writable("reset the schema claim")
        return repair.reset_schema_claim(self.core)

    # -- health and repair (B.13) ------------------------------------------------------

    def diagnose(self) -> HealthReport:
        return HealthReport.from_counts(repair.diagnose(self.core), self.geometry)

    def dead_subscriber_rings(self) -> list[tuple[int, int]]:
        """(ring, pid) of each Live, Draining or Reclaiming ring whose
        recorded owner (the ring header's pid and start time) is dead."""
        ops = self.atomics
        dead = []
        for index in range(self.geometry.max_subs):
            ring = self.core.ring_address(index)
            state = ops.load_acquire_u32(ring + STATE_FLIGHT_OFFSET) & RING_STATE_MASK
            if state in (RING_LIVE, RING_DRAINING, RING_RECLAIMING) and repair.owner_is_dead(ops.load_acquire_u64(ring + OWNER_PID_OFFSET), ops.load_relaxed_u64(ring + OWNER_STARTTIME_OFFSET)):
                dead.append((index, ops.load_acquire_u64(ring + OWNER_PID_OFFSET)))
        return dead

    def repair_locked_entries(self) -> int:
        self.require_writable("repair entries")
        return repair.repair_locked_entries(self.core)

    def reset_retired_rings(self, drain: bool = False) -> int:
        """As 0.9.2: the rings become Free; their claims stay until
        publishers replace them. ``drain=True`` (our extension, as on
        layout 4) gives those claims back to the pool at once."""
        self.require_writable("reset rings")
        return repair.reset_retired_rings(self.core, drain)

    def reclaim_dead_rings(self) -> int:
        """Free the rings whose owner is provably dead (B.13, the Reclaiming
        state); their claims stay until publishers replace them."""
        self.require_writable("reclaim dead rings")
        return repair.reclaim_dead_rings(self.core)

    def reclaim_dead_subscribers(self) -> DeadSubscriberReport:
        """``SharedRegion.reclaim_dead_subscribers`` by layout 9's own
        mechanism (``reclaim_dead_rings``, B.13): the rings whose owner in
        the ring header is provably dead become Free; their claims stay until
        publishers replace them. Every layout-9 subscriber, native or ours,
        records itself there, and nothing is drained or waited for: none is
        unrecorded, none times out."""
        self.require_writable("reclaim rings")
        dead = self.dead_subscriber_rings()
        repair.reclaim_dead_rings(self.core)
        ops = self.atomics
        freed = [
            (index, pid) for index, pid in dead
            if ops.load_acquire_u32(self.core.ring_address(index) + STATE_FLIGHT_OFFSET) & RING_STATE_MASK == RING_FREE
        ]
        return DeadSubscriberReport(freed, [], [])

    def free_ring(self, index: int) -> bool:
        """Refused: layout 4's way out for a ring no owner record accounts
        for. On layout 9 every ring records its owner in its header, and
        ``reclaim_dead_subscribers`` frees it once that owner is dead."""
        raise RuntimeError(
            f"ring {index} of {self.name}: not freed by force on a layout-9 region, whose rings record their owner "
            f"(kickmsg repair --dead-subscribers frees a ring once its owner is dead)"
        )

    def reclaim_orphaned_slots(self) -> int:
        """0.9.2's claim counting: NOT safe under live traffic."""
        self.require_writable("reclaim slots")
        return repair.reclaim_orphaned_slots(self.core)


def attach(mapping: shm.Mapping, expected_identity: int) -> Layout9Region:
    """Validate a mapped layout-9 region (A.10) and wrap it."""
    magic = HARDWARE.load_acquire_u64(mapping.address + MAGIC_OFFSET) if mapping.size >= 8 else 0
    geometry = validate(mapping.name, bytes(mapping.buffer[:HEADER_SIZE]), mapping.size, magic, expected_identity)
    return Layout9Region(v9.Region(mapping, geometry))


def open_when_ready(name: str) -> Layout9Region | None:
    """The region under ``name`` once its creator has stored MAGIC, or None
    while there is none or it is not initialised yet."""
    try:
        mapping = shm.open_existing(name)
    except (shm.RegionNotFoundError, shm.EmptyObjectError):
        return None
    if mapping.size < 8 or HARDWARE.load_acquire_u64(mapping.address + MAGIC_OFFSET) != MAGIC:
        return None
    return attach(mapping, 0)


def create(name: str, channel_type: int, config: v9.ChannelConfig, creator: str, mode: int | None) -> Layout9Region:
    return Layout9Region(v9.Region.create(name, channel_type, config, creator, mode=mode))


def create_or_open(name: str, channel_type: int, config: v9.ChannelConfig, creator: str, mode: int | None) -> Layout9Region:
    """0.9.2's create_or_open; a layout-4 channel of that name is refused
    saying how this package joins it (0.9.2's words advise unlinking it)."""
    try:
        return Layout9Region(v9.Region.create_or_open(name, channel_type, config, creator, mode=mode))
    except VersionMismatchError:
        try:
            found = stamped_version(shm.open_existing(name, writable=False))
        except (OSError, RuntimeError):  # gone meanwhile: 0.9.2's words stand
            found = None
        if found != layouts.LAYOUT_4:
            raise
        raise VersionMismatchError(
            f"Region version mismatch on {name}: it has layout 4, create_or_open was asked for layout 9 "
            f"(layout=4 or KICKMSG_LAYOUT=4 joins it)"
        ) from None
