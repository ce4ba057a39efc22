"""SharedRegion: create, open and describe one channel's shared memory.

On a layout-4 region, ``SharedRegion`` is the layout-4 core's ``Region``
(``kickmsg.protocol.v4.region``) with the version-agnostic API above it:
its constructors, ring lifecycle and repairs run the core's flows
(``kickmsg.protocol.v4``: ``region``, ``rings``, ``repair``). A layout-9
region is a ``Layout9Region``: the same API, each call handed to the
layout-9 core (``kickmsg.protocol.v9``). The constructors read the version
word and return the one the region's layout needs.
"""
import os
import time
import warnings
from dataclasses import dataclass, field
from typing import NoReturn

from kickmsg import layouts, process, shm
from kickmsg import owners
from kickmsg.protocol.v4 import layout
from kickmsg.protocol.v4 import region as region4
from kickmsg.protocol.v4 import repair as repair4
from kickmsg.protocol.v4 import rings as rings4
from kickmsg.protocol.v4.region import RingAddresses, check_creatable
from kickmsg.protocol import freestack
from kickmsg.protocol.info import DrainedRing, HealthCounts, RegionInfo, RegionStats, RingStats, region_info
from kickmsg.atomics import HARDWARE, Atomics
from kickmsg.config import ChannelType, Config, ConfigError, channel_type_of
from kickmsg.errors import Layout4Only
from kickmsg.protocol import v9
from kickmsg.protocol.v9 import layout as layout9
from kickmsg.protocol.v9 import liveness as liveness9
from kickmsg.protocol.v9 import repair as repair9
from kickmsg.protocol.v9.layout import VersionMismatchError
from kickmsg.schema import SchemaInfo

__all__ = ["CHECK_IN_INTERVAL_NS", "DeadSubscriberReport", "HealthReport", "Layout9Region", "NEVER", "SharedRegion", "unlink_shm",
           "warn_of_stranded_holders"]

CHECK_IN_INTERVAL_NS = 100_000_000  # how often publishers and subscribers look whether their region was re-created
NEVER = 1 << 63  # a region in private memory is never re-created


@dataclass(frozen=True)
class HealthReport:
    """What ``SharedRegion.diagnose()`` found. A single nonzero reading may be
    transient; counts that persist across two readings more than
    commit_timeout apart mean crash damage."""

    locked_entries: int  # entries stuck LOCKED or more than one wrap behind
    retired_rings: int  # Free rings with in_flight > 0 (teardown timed out)
    draining_rings: int  # Draining rings with in_flight > 0 (usually transient)
    live_rings: int  # rings with a subscriber
    schema_stuck: bool  # schema_state left at Claiming
    # Beyond 0.1.0:
    dead_subscriber_rings: int = 0  # Live or Draining rings whose recorded owner died (kickmsg.owners)
    pool_too_small: bool = False  # by its geometry, or rings hold so many slots that sends can fail for good (from_counts)
    stranded_slots: int = 0  # slots only rings that are not Live hold: kickmsg repair drains them

    @property
    def healthy(self) -> bool:
        """Nothing found that needs a repair (live rings are not damage)."""
        return not (
            self.locked_entries or self.retired_rings or self.draining_rings or self.schema_stuck
            or self.dead_subscriber_rings or self.pool_too_small or self.stranded_slots
        )

    @classmethod
    def from_counts(cls, found: HealthCounts, geometry: layout.Geometry) -> "HealthReport":
        """The report of a layout's ``diagnose`` counts, with the geometry's
        hazards. Every Live ring keeps the slots of its last
        sub_ring_capacity messages (the same slots for all when their
        windows hold the same messages), and the slots only rings that are
        not Live hold are out of reach: the pool is too small when what is
        left cannot hold a ring's worth plus the slot a publisher writes,
        or when ring claims hold every slot (Live rings whose windows hold
        different messages: claims a reclaim did not drain, kept by a ring
        joined since), as no publisher can then write to replace them."""
        return cls(
            found.locked_entries, found.retired_rings, found.draining_rings, found.live_rings, found.schema_stuck,
            dead_subscriber_rings=found.dead_rings,
            pool_too_small=(
                bool(geometry.hazards()) or geometry.pool_size - found.stranded_slots <= geometry.capacity
                or found.live_held_slots + found.stranded_slots >= geometry.pool_size
            ),
            stranded_slots=found.stranded_slots,
        )

    def __repr__(self) -> str:
        return (
            f"HealthReport(locked={self.locked_entries}, retired={self.retired_rings}, "
            f"draining={self.draining_rings}, live={self.live_rings}, schema_stuck={self.schema_stuck}, "
            f"dead_subscriber_rings={self.dead_subscriber_rings}, pool_too_small={self.pool_too_small}, "
            f"stranded_slots={self.stranded_slots})"
        )


@dataclass(frozen=True)
class DeadSubscriberReport:
    """What ``reclaim_dead_subscribers()`` did, ring by ring."""

    reclaimed: list[tuple[int, int]]  # (ring, pid of the dead owner): drained and freed
    unrecorded: list[int]  # Live or Draining rings with no owner record (e.g. native subscribers): left alone
    timed_out: list[int]  # dead owner, but publishers stayed in flight: left retired
    claims_given_back: dict[int, int] = field(default_factory=dict)  # ring -> claims drained (layout 9)

    def __repr__(self) -> str:
        return (
            f"DeadSubscriberReport(reclaimed={self.reclaimed}, unrecorded={self.unrecorded}, "
            f"timed_out={self.timed_out}, claims_given_back={self.claims_given_back})"
        )


class SharedRegion(region4.Region):
    """One channel: a mapped Kickmsg region and its geometry.

    Build one with ``create``, ``open`` or ``create_or_open``. Publishers,
    subscribers, views and slots keep the mapping alive on their own, so a
    region object may be dropped while they are in use.
    """

    @property
    def core(self) -> region4.Region:
        """The per-layout core this region's flows run on (layout 4: itself, until
        the API holds its core by composition)."""
        return self

    @classmethod
    def _of(cls, region: region4.Region) -> "SharedRegion":
        """The region the layout-4 core made or checked, with this API."""
        return cls(region.mapping, region.geometry)

    # -- constructors -----------------------------------------------------

    @staticmethod
    def create(
        name: str, type: ChannelType, cfg: Config, creator: str = "", *, mode: int | None = None, layout: int | None = None
    ) -> "SharedRegion":
        """Create a fresh region, replacing any object of that name.

        ``layout`` (4 or 9; default ``$KICKMSG_LAYOUT``, else
        ``kickmsg.layouts.DEFAULT_LAYOUT``) chooses the channel layout:
        4 is native 0.1.0's, 9 native 0.9.2's. Layout 9 creates as 0.9.2
        does (unlink, then an exclusive create of mode 0600 /
        ``$KICKMSG_SHM_MODE``, or ``mode`` as below: our extension); what
        follows describes layout 4.

        An existing region with exactly this layout is re-initialised in
        place, as 0.1.0 does, so every process attached to it sees the new
        region (re-create only while the channel is idle: operations in
        flight elsewhere would land on the new region). Beyond 0.1.0, the
        rings of live subscribers of this package stay Live in the new
        region, so they miss nothing published into it (what they had not
        read of the old one counts in their ``lost``). Any other object is
        unlinked and a new one made, so that nobody attached to the old one
        faults on pages that no longer exist or writes at offsets that no
        longer mean the same. Publishers and subscribers of this package
        attached to the old region follow the name (see ``Subscriber``).

        Beyond 0.1.0: ``mode`` (default ``$KICKMSG_SHM_MODE``, else 0600)
        sets the permission bits of a new object; a region larger than the
        memory the machine can give it, or whose pool cannot outlast its
        rings, or beyond this package's bounds (``kickmsg.config``:
        MAX_SUBSCRIBERS rings, MAX_POOL_SIZE slots), is refused with
        ``ConfigError`` (a ``ValueError``) before anything is created; the
        memory is reserved at once. A ``creator`` that is not a str is a
        TypeError naming it. Replacing a channel of the other layout that
        live processes map warns (``RuntimeWarning``), naming them: they
        cannot follow the name to a region of another layout.
        """
        check_creator(creator)
        warn_of_stranded_holders(name, layouts.chosen_layout(layout))
        if layouts.chosen_layout(layout) == layouts.LAYOUT_9:
            return _create9(name, type, cfg, creator, mode, create_or_open=False)
        return SharedRegion._of(region4.create(name, type, cfg, creator, mode))

    @staticmethod
    def open(name: str, expected_identity: int = 0) -> "SharedRegion":
        """Attach to an initialised region of layout 4 or 9 (the version word
        says which). A geometry that cannot work (``Geometry.hazards``, e.g.
        made by another implementation) is flagged with a ``RuntimeWarning``.
        ``expected_identity`` (0.9.2's; 0: any) must match a layout-9
        region's stamped identity; layout 4 stamps none, so there it must be 0."""
        if not isinstance(expected_identity, int) or isinstance(expected_identity, bool):
            raise TypeError(f"expected_identity must be an int, got {expected_identity!r}")
        if not 0 <= expected_identity <= layout.U64_MAX:
            raise ValueError(f"expected_identity must be an unsigned 64-bit int, got {expected_identity}")
        try:
            mapping = shm.open_existing(name)
        except shm.EmptyObjectError:
            raise RuntimeError(f"Invalid shared memory (bad magic): {name} is empty (0 bytes)") from None
        return _attach(mapping, expected_identity)

    @staticmethod
    def inspect(name: str) -> "SharedRegion":
        """Attach read-only, for tools (beyond 0.1.0): geometry, schema(),
        diagnose(), audit() work; publishing, subscribing and repairing are
        refused. Works without write permission on the object."""
        try:
            mapping = shm.open_existing(name, writable=False)
        except shm.EmptyObjectError:
            raise RuntimeError(f"Invalid shared memory (bad magic): {name} is empty (0 bytes)") from None
        return _attach(mapping, 0)

    @staticmethod
    def create_or_open(
        name: str, type: ChannelType, cfg: Config, creator: str = "", *, mode: int | None = None, layout: int | None = None
    ) -> "SharedRegion":
        """Create the region if no object has this name, else open it once its
        creator has finished, and require the same config (same hash).
        ``mode`` and the refusals are ``create``'s, for the creating case
        (so a region of the native library beyond this package's bounds can
        be joined). ``layout`` is ``create``'s: the layout of a region this
        call creates; an existing region of the other layout is refused."""
        check_creator(creator)
        if layouts.chosen_layout(layout) == layouts.LAYOUT_9:
            return _create9(name, type, cfg, creator, mode, create_or_open=True)
        return SharedRegion._of(region4.create_or_open(name, type, cfg, creator, mode))

    # -- description ------------------------------------------------------

    @property
    def channel_type(self) -> ChannelType:
        return ChannelType(self.geometry.channel_type)

    def incarnation(self) -> tuple[int, int]:
        """(creator_pid, created_at_ns): changes when the region is
        re-created in place."""
        return self.header.creator_pid, self.header.created_at_ns

    def replaced(self) -> bool:
        """Whether this region was re-created since this object attached to
        it (beyond 0.1.0): re-initialised in place (magic or creation stamp
        changed), or unlinked and another object made under its name. A
        name merely unlinked is not. Never, for a region in private memory."""
        if not self.mapping.shared:
            return False
        ops = self.atomics
        if ops.load_acquire_u64(self.magic_address) != layout.MAGIC:
            return True  # being re-initialised in place
        if ops.load_relaxed_u64(self.created_at_address) != self.created_at_ns:
            return True
        return self.mapping.is_replaced()

    def next_check_in_ns(self) -> int:
        """When (time.monotonic_ns) a user of this region should next look
        whether it was re-created: CHECK_IN_INTERVAL_NS from now, or NEVER
        for a region in private memory."""
        return time.monotonic_ns() + CHECK_IN_INTERVAL_NS if self.mapping.shared else NEVER

    def reopen_if_recreated(self) -> "SharedRegion | None":
        """The region now under this one's name, if it was re-created (see
        ``replaced``) and the new one is ready; else None. A new object that
        is not a usable Kickmsg region raises, as ``open`` would, and so
        does one of the other layout (a publisher or subscriber of one
        layout cannot go on in the other: make a new one)."""
        new_region = _open_if_ready(self.name) if self.replaced() else None
        if new_region is not None and new_region.layout != self.layout:
            raise RuntimeError(
                f"{self.name} was re-created with layout {new_region.layout}; users of its layout-{self.layout} "
                f"region cannot follow it: open it anew"
            )
        return new_region

    @property
    def read_only(self) -> bool:
        """Attached with ``inspect``: nothing may be written."""
        return not self.mapping.writable

    def require_writable(self, action: str) -> None:
        """Refuse ``action`` on a read-only region (it would fault)."""
        if not self.mapping.writable:
            raise ValueError(f"cannot {action}: {self.name} was attached read-only (SharedRegion.inspect)")

    def unlink(self) -> None:
        """Remove the region's name; attached processes keep their mapping."""
        unlink_shm(self.name)

    def info(self) -> RegionInfo:
        """0.9.2's ``RegionInfo``: what the header says (both layouts)."""
        creator = bytes(self.mapping.buffer[layout.HEADER_SIZE : layout.HEADER_SIZE + self.geometry.creator_name_len])
        return region_info(self.name, self.geometry, self.layout, self.header, creator)

    def stats(self) -> RegionStats:
        """0.9.2's ``RegionStats`` (lock-free, racy by nature). Layout 4 has
        no counters in shared memory: drops, losses and steals read 0 (the
        rings' lost counts of our subscribers are in ``kickmsg.owners``)."""
        ops = self.atomics
        rings = []
        for ring in self.rings:
            state_flight = ops.load_acquire_u32(ring.state_flight)
            rings.append(
                RingStats(
                    state=v9.layout.RING_STATE_NAMES[state_flight & layout.RING_STATE_MASK],
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

    def __repr__(self) -> str:
        g = self.geometry
        return (
            f"SharedRegion(name={self.name!r}, type={self.channel_type.name}, max_subscribers={g.max_subs}, "
            f"sub_ring_capacity={g.capacity}, pool_size={g.pool_size}, max_payload_size={g.slot_data_size})"
        )

    # -- schema descriptor ------------------------------------------------

    def schema(self) -> SchemaInfo | None:
        """The published descriptor, or None while it is Unset or Claiming."""
        if self.atomics.load_acquire_u32(self.schema_state_address) != layout.SCHEMA_SET:
            return None
        return SchemaInfo.read_from(self.header.schema_data)

    def try_claim_schema(self, info: SchemaInfo) -> bool:
        """Publish ``info`` if no descriptor is set yet.

        Unset -> Claiming (CAS acq_rel), copy, Set (release). Returns False
        when another claimant got there first; a loser that sees Claiming
        waits a bounded while for it to finish, so read ``schema()`` after.
        """
        self.require_writable("claim the schema")
        if not isinstance(info, SchemaInfo):
            raise TypeError(f"try_claim_schema needs a SchemaInfo, got {info!r}")
        return repair4.try_claim_schema(self, info)

    def reset_schema_claim(self) -> bool:
        """Claiming -> Unset, to recover from a claimant that died mid-claim.

        Not safe under live traffic: call it only once the claimant is known
        to be gone, or a slow claimant could still finish into a new claim.
        """
        self.require_writable("reset the schema claim")
        return repair4.reset_schema_claim(self)

    # -- health and repair --------------------------------------------------

    def diagnose(self) -> HealthReport:
        """Read-only health scan; safe under live traffic. Idle rings (see
        ``rings_in_use``) have nothing to count."""
        return HealthReport.from_counts(repair4.diagnose(self), self.geometry)

    def dead_subscriber_rings(self) -> list[tuple[int, int]]:
        """(ring, pid) of each ring whose recorded owner died while it held
        it: Live, or Draining (died leaving). Read-only, beyond 0.1.0;
        ``reclaim_dead_subscribers`` frees them. Rings of subscribers that
        record no owner (native ones) are not counted."""
        return repair4.dead_subscriber_rings(self)

    def repair_locked_entries(self) -> int:
        """Commit every stuck entry as empty (INVALID_SLOT, length 0, sequence
        position + 1) so publishers wrapping onto it succeed again. Safe under
        live traffic in that nothing blocks or is corrupted; but an entry a
        live publisher holds LOCKED at that moment is committed empty under
        it, and if our INVALID_SLOT lands after its slot index, its message
        is lost for that ring and one reference to its slot leaks
        (``reclaim_orphaned_slots`` recovers it at quiescence; the spec calls
        this race benign, ``kickmsg verify --repair-pass`` shows it is not).
        Returns the number of entries repaired."""
        self.require_writable("repair entries")
        return repair4.repair_locked_entries(self)

    def reset_retired_rings(self, drain: bool = False) -> int:
        """Free | in_flight > 0 -> Free | 0, so new subscribers can claim those
        rings again. Only safe once the crashed publisher is known to be gone:
        a slow but alive one would later decrement in_flight into the state
        bits. Returns the number of rings reset.

        ``drain=True`` (beyond 0.1.0) also does the drain that the timed-out
        teardown skipped: it releases the references the ring's entries still
        hold, which otherwise stay taken until publishers wrap over them.
        """
        self.require_writable("reset rings")
        return repair4.reset_retired_rings(self, drain)

    def drain_free_rings(self, retired: bool = False) -> list[DrainedRing]:
        """Release the references Free rings' entries still hold (beyond
        0.1.0; left by a reset without drain): each ring drained, with the
        slots given back to the pool. Safe under traffic; ``retired`` also resets
        and drains retired rings, only once the crashed publisher is gone."""
        self.require_writable("drain rings")
        return repair4.drain_free_rings(self, retired)

    def leave_ring(self, ring: RingAddresses, start_pos: int, sidecar: owners.Sidecar | None = None) -> bool:
        """Subscriber teardown: stop admissions, wait for in-flight publishers,
        drain the ring's references, free the ring. Returns False if the
        publishers in flight did not finish within commit_timeout: the drain
        is then skipped and the ring left retired.

        ``sidecar`` (beyond 0.1.0) holds the ring's owner record; it is
        cleared before the ring is freed, so that it never outlives the
        ownership it records.
        """
        return rings4.leave(self, ring, start_pos, sidecar)

    def set_ring_state(self, ring: RingAddresses, state: int) -> None:
        """Replace the state bits of ``state_flight``, keeping in_flight (CAS seq_cst)."""
        rings4.set_state(self, ring, state)

    def reclaim_dead_subscribers(self) -> DeadSubscriberReport:
        """Leave, on their behalf, the rings whose subscriber died (beyond
        0.1.0; see ``kickmsg.owners``): Live rings, and Draining ones whose
        owner died during its own teardown. Each is drained and freed exactly
        as its owner's teardown would have done it, so this is safe with
        publishers in flight. Rings without an owner record (native
        subscribers) are left alone and reported. Pins of the dead owner's
        views stay: reclaim them with ``reclaim_orphaned_slots()`` at
        quiescence.
        """
        self.require_writable("reclaim rings")
        return DeadSubscriberReport(*repair4.reclaim_dead_subscribers(self))

    def free_ring(self, index: int) -> bool:
        """Free ring ``index`` although no record shows its owner dead (beyond
        0.1.0; ``kickmsg repair --ring N --force``): the way out for a Live
        or Draining ring no owner record accounts for, left by a subscriber
        killed while it could not record itself (``/dev/shm`` full) or by a
        native one. Only once no process reads it: a subscriber still reading
        it would share it with the next one to join. Refused (RuntimeError
        naming the pid) while a live process holds the ring's owner record.
        Drained and freed as its owner's teardown would have done it (with
        no record, over the ring's whole window: drained entries are marked
        INVALID_SLOT, so none is released twice). Returns False if the ring
        was Free already; a retired ring is ``reset_retired_rings``'s."""
        self.require_writable("free rings")
        return repair4.free_ring(self, index)

    def drain_ring(self, ring: RingAddresses, start_pos: int) -> None:
        """Drain: release the ring's reference to every committed entry of
        [max(write_pos - capacity, start_pos), write_pos) and mark each
        INVALID_SLOT, so a later eviction does not release it again.

        Only while no publisher is admitted to the ring (its state is not Live
        and in_flight is 0): write_pos is then final.
        """
        rings4.drain(self, ring, start_pos)

    def referenced_slots(self) -> set[int]:
        """The slot indices that committed entries in the rings' live windows
        name (read-only; the set ``reclaim_orphaned_slots`` keeps)."""
        return repair4.referenced_slots(self)

    def reclaim_orphaned_slots(self) -> int:
        """Give back every slot with a refcount that no ring entry references.

        NOT safe under live traffic: every publisher must be paused (one
        between its refcount pre-set and its ring pushes holds such a slot
        legitimately) and no SampleView may be alive (a view's pin is a
        reference no ring shows). Returns the number of slots reclaimed.
        """
        self.require_writable("reclaim slots")
        return repair4.reclaim_orphaned_slots(self)

    layout: int = layouts.LAYOUT_4  # the region's layout version (last in the class: ``layout`` above is the module)


def _described_geometry9(geometry: v9.Geometry) -> layout.Geometry:
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
        self._core9 = core
        self.mapping = core.mapping
        self.geometry = _described_geometry9(core.geometry)
        self.created_at_ns = core.info().created_at_ns  # which incarnation of the name this object is
        # The words both layouts have, under the names the tools use (the
        # slot headers start with refcount and next_free in both).
        # Layout 9's header (A.2) has every field of layout 4's under the same name.
        self.header = layout9.Header.from_address(core.base)  # type: ignore[assignment]  # the mapping outlives it: we hold both
        self.free_top_address = core.free_top_address
        self.schema_state_address = core.base + layout9.SCHEMA_STATE_OFFSET
        pool_address, slot_stride = core.base + core.geometry.pool_offset, core.geometry.slot_stride
        self.slot_addresses = range(pool_address, pool_address + core.geometry.pool_size * slot_stride, slot_stride)

    @property
    def core(self) -> v9.Region:  # type: ignore[override]  # until the API holds its core by composition
        """The layout-9 core this region's flows run on."""
        return self._core9

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
        if ops.load_acquire_u64(self.core.base + layout9.MAGIC_OFFSET) != layout9.MAGIC:
            return True
        if ops.load_relaxed_u64(self.core.base + layout9.CREATED_AT_OFFSET) != self.created_at_ns:
            return True
        return self.mapping.is_replaced()

    def rings_in_use(self) -> list[int]:
        """The indices of the rings that are not idle (Free, no publisher in
        flight, never written: both words 0), as on layout 4."""
        ops = self.atomics
        return [
            index
            for index in range(self.geometry.max_subs)
            if ops.load_acquire_u32((ring := self.core.ring_address(index)) + layout9.STATE_FLIGHT_OFFSET)
            or ops.load_acquire_u64(ring + layout9.WRITE_POS_OFFSET)
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
        return repair9.try_claim_schema(self.core, info)

    def reset_schema_claim(self) -> bool:
        self.require_writable("reset the schema claim")
        return repair9.reset_schema_claim(self.core)

    # -- health and repair (B.13) ------------------------------------------------------

    def diagnose(self) -> HealthReport:
        return HealthReport.from_counts(repair9.diagnose(self.core), self.geometry)

    def dead_subscriber_rings(self) -> list[tuple[int, int]]:
        """(ring, pid) of each Live, Draining or Reclaiming ring whose
        recorded owner (the ring header's pid and start time) is dead."""
        ops = self.atomics
        dead = []
        for index in range(self.geometry.max_subs):
            ring = self.core.ring_address(index)
            state = ops.load_acquire_u32(ring + layout9.STATE_FLIGHT_OFFSET) & layout9.RING_STATE_MASK
            if state in (layout9.RING_LIVE, layout9.RING_DRAINING, layout9.RING_RECLAIMING) and liveness9.owner_is_dead(ops.load_acquire_u64(ring + layout9.OWNER_PID_OFFSET), ops.load_relaxed_u64(ring + layout9.OWNER_STARTTIME_OFFSET)):
                dead.append((index, ops.load_acquire_u64(ring + layout9.OWNER_PID_OFFSET)))
        return dead

    def repair_locked_entries(self) -> int:
        self.require_writable("repair entries")
        return repair9.repair_locked_entries(self.core)

    def reset_retired_rings(self, drain: bool = False) -> int:
        """As 0.9.2: the rings become Free; their claims stay until
        publishers replace them. ``drain=True`` (our extension, as on
        layout 4) gives those claims back to the pool at once."""
        self.require_writable("reset rings")
        return repair9.reset_retired_rings(self.core, drain)

    def drain_free_rings(self, retired: bool = False) -> list[DrainedRing]:
        """Give back the claims Free rings still hold (our extension; left by
        0.9.2's reclaim_dead_rings and reset_retired_rings): each ring
        drained, with the slots given back to the pool. Safe under traffic;
        ``retired`` also resets and drains retired rings, only once the
        crashed publisher is gone."""
        self.require_writable("drain rings")
        return repair9.drain_free_rings(self.core, retired)

    def reclaim_dead_rings(self) -> int:
        """Leave, on their behalf, the rings whose owner is provably dead
        (B.13, done as the owner's leave: their claims go back to the pool;
        ``kickmsg.protocol.v9.repair.reclaim_dead_ring``). Returns how many."""
        self.require_writable("reclaim dead rings")
        return repair9.reclaim_dead_rings(self.core)

    def reclaim_dead_subscribers(self) -> DeadSubscriberReport:
        """``SharedRegion.reclaim_dead_subscribers`` by layout 9's own
        mechanism (``reclaim_dead_ring``): each ring whose owner in the ring
        header is provably dead is left on its behalf, its claims drained
        back to the pool. Every layout-9 subscriber, native or ours, records
        itself there: none is unrecorded. A ring whose publishers stayed in
        flight past the commit timeout is left retired (timed out)."""
        self.require_writable("reclaim rings")
        reclaimed: list[tuple[int, int]] = []
        timed_out: list[int] = []
        claims_given_back: dict[int, int] = {}
        for index, pid in self.dead_subscriber_rings():
            left = repair9.reclaim_dead_ring(self.core, index)
            if left is None:
                continue  # taken by another reclaimer meanwhile
            quiesced, claims_given_back[index] = left
            if quiesced:
                reclaimed.append((index, pid))
            else:
                timed_out.append(index)
        return DeadSubscriberReport(reclaimed, [], timed_out, claims_given_back)

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
        return repair9.reclaim_orphaned_slots(self.core)


def warn_of_stranded_holders(name: str, new_layout: int) -> None:
    """Before a create replaces a channel of another layout than
    ``new_layout`` (0.9.2's "create replaces", kept): a ``RuntimeWarning``
    naming the live processes that map it, found in /proc/PID/maps
    (``shm.processes_mapping``: every process of this user, every one as
    root). They cannot follow the name to a region of another layout: a
    native one goes on in the old object, publishing to nobody or waiting
    for nothing, and says nothing."""
    try:
        head = shm.read_head(shm.SHM_DIRECTORY + name, 12)
    except (OSError, ValueError):  # no such object (or one we may not read): nothing is replaced unseen
        return
    if len(head) < 12 or int.from_bytes(head[:8], "little") != layout.MAGIC:
        return
    found = int.from_bytes(head[8:12], "little")
    holders = shm.processes_mapping(name) if found != new_layout else []
    if holders:
        described = ", ".join(f"{pid} ({process.command_name(pid) or '?'})" for pid in holders)
        warnings.warn(
            f"{name}: replacing a layout-{found} channel that {'process' if len(holders) == 1 else 'processes'} "
            f"{described} still {'maps' if len(holders) == 1 else 'map'}: they cannot follow its name to the new "
            f"layout-{new_layout} region and go on in the old one unseen (stop them first, or join the channel with "
            f"layout={found})",
            RuntimeWarning, skip_file_prefixes=(os.path.dirname(__file__),),
        )


def unlink_shm(name: str) -> None:
    """Remove a shared-memory object by name with its sidecars, as a whole:
    if this process may not remove one of them (another user's file),
    ``RegionPermissionError`` names it and nothing is removed; no error if
    it is absent. Takes any name an object of /dev/shm can have, whatever
    its text (``shm.check_existing_name``): other programs' objects can go."""
    shm.check_existing_name(name)
    shm.check_may_remove(name, [shm.SHM_DIRECTORY + name, *owners.sidecar_paths(name)])
    shm.unlink(name)
    owners.unlink(name)


def _open_if_ready(name: str) -> SharedRegion | None:
    """``SharedRegion.open(name)``, or None while there is no object of that
    name or it is not initialised yet (being created)."""
    try:
        mapping = shm.open_existing(name)
    except (shm.RegionNotFoundError, shm.EmptyObjectError):
        return None
    if mapping.size < 8 or HARDWARE.load_acquire_u64(mapping.address + layout.MAGIC_OFFSET) != layout.MAGIC:
        return None
    return _attach(mapping, 0)


def _attach(mapping: shm.Mapping, expected_identity: int) -> SharedRegion:
    """Check an initialised-looking mapping and wrap it as the layout its
    version word (offset 8, after magic) names; flag a layout-4 geometry
    that cannot work (when attached to use it, not to inspect it)."""
    name = mapping.name
    if mapping.size < 8 or HARDWARE.load_acquire_u64(mapping.address + layout.MAGIC_OFFSET) != layout.MAGIC:
        raise RuntimeError(f"Invalid shared memory (bad magic): {name}")
    version = HARDWARE.load_relaxed_u32(mapping.address + layout.VERSION_OFFSET) if mapping.size >= 12 else None
    if version == layouts.LAYOUT_9:
        return _attach9(mapping, expected_identity)
    if version not in layouts.SUPPORTED_LAYOUTS:
        raise RuntimeError(
            f"Version mismatch: {name} has layout version {version}, this library reads layouts 4 and 9"
        )
    return SharedRegion._of(region4.attach(mapping, expected_identity))


def check_creator(creator: object) -> None:
    """The ``creator`` of ``create``/``create_or_open``: a str, else TypeError naming it."""
    if not isinstance(creator, str):
        raise TypeError(f"creator must be a str (the creator's name, stored in the header), got {creator!r}")


def _create9(
    name: str, type: ChannelType, cfg: Config, creator: str, mode: int | None, create_or_open: bool
) -> SharedRegion:
    """``create``/``create_or_open`` of a layout-9 region."""
    shm.check_name(name)
    if not isinstance(cfg, Config):
        raise TypeError(f"cfg must be a kickmsg.Config, got {cfg!r}")
    permissions = None if mode is None else shm.creation_mode(mode)  # None: 0.9.2's $KICKMSG_SHM_MODE, else 0600
    channel_type = channel_type_of(type)
    problem = cfg.validation_error()
    if problem:
        raise ConfigError(f"{problem} (creating {name})")
    config = v9.ChannelConfig(
        cfg.max_subscribers, cfg.sub_ring_capacity, cfg.pool_size, cfg.max_payload_size, cfg.commit_timeout_us,
        cfg.schema, cfg.identity,
    )
    try:
        geometry = config.geometry(channel_type, len(creator.encode("utf-8")))
    except ValueError as error:
        raise ConfigError(f"{error} (creating {name})") from None
    described = _described_geometry9(geometry)
    hazards = described.hazards()  # beyond 0.9.2, as on layout 4: a pool no larger than a ring
    if hazards:
        raise ConfigError(f"cannot create {name}: {hazards[0]}")
    if create_or_open and shm.object_size(name) is not None:
        return _create_or_open9(name, channel_type, config, creator, permissions)
    check_creatable(name, described, 0)
    if create_or_open:
        return _create_or_open9(name, channel_type, config, creator, permissions)
    owners.unlink(name)  # sidecars of a layout-4 region of that name
    return _create_new9(name, channel_type, config, creator, permissions)


def _attach9(mapping: shm.Mapping, expected_identity: int) -> Layout9Region:
    """Validate a mapped layout-9 region (A.10) and wrap it."""
    magic = HARDWARE.load_acquire_u64(mapping.address + layout9.MAGIC_OFFSET) if mapping.size >= 8 else 0
    geometry = layout9.validate(mapping.name, bytes(mapping.buffer[:layout9.HEADER_SIZE]), mapping.size, magic, expected_identity)
    return Layout9Region(v9.Region(mapping, geometry))


def _create_new9(name: str, channel_type: int, config: v9.ChannelConfig, creator: str, mode: int | None) -> Layout9Region:
    return Layout9Region(v9.Region.create(name, channel_type, config, creator, mode=mode))


def _create_or_open9(name: str, channel_type: int, config: v9.ChannelConfig, creator: str, mode: int | None) -> Layout9Region:
    """0.9.2's create_or_open; a layout-4 channel of that name is refused
    saying how this package joins it (0.9.2's words advise unlinking it)."""
    try:
        return Layout9Region(v9.Region.create_or_open(name, channel_type, config, creator, mode=mode))
    except VersionMismatchError:
        try:
            found = region4.stamped_version(shm.open_existing(name, writable=False))
        except (OSError, RuntimeError):  # gone meanwhile: 0.9.2's words stand
            found = None
        if found != layouts.LAYOUT_4:
            raise
        raise VersionMismatchError(
            f"Region version mismatch on {name}: it has layout 4, create_or_open was asked for layout 9 "
            f"(layout=4 or KICKMSG_LAYOUT=4 joins it)"
        ) from None
