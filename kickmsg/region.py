"""SharedRegion: create, open and describe one channel's shared memory.

One ``SharedRegion`` for both layouts: it holds its layout's core
(``kickmsg.protocol.v4.region.Region`` or ``kickmsg.protocol.v9.region.Region``,
the shape ``kickmsg.protocol.cores.RegionCore`` describes), chosen once by
the constructors from the version word, and runs that layout's repairs
(``kickmsg.protocol.v4.repair``, ``kickmsg.protocol.v9.repair``) over it.
What it adds is policy: read-only attachment, following a re-created
region, the reports of the repairs, errors. A method only one layout has
raises ``LayoutError`` on the other.
"""
import os
import time
import warnings
from dataclasses import dataclass, field

from kickmsg import layouts, process, shm
from kickmsg import owners
from kickmsg.protocol.v4 import layout
from kickmsg.protocol.v4 import region as region4
from kickmsg.protocol.v4 import repair as repair4
from kickmsg.protocol.v4.region import check_creatable
from kickmsg.protocol.info import DrainedRing, HealthCounts, RegionInfo, RegionStats
from kickmsg.config import ChannelType, Config, ConfigError, channel_type_of
from kickmsg.errors import CorruptRegionError, EmptyObjectError, LayoutError, VersionMismatchError
from kickmsg.protocol import v9
from kickmsg.protocol.v9 import repair as repair9
from kickmsg.schema import SchemaInfo

__all__ = ["CHECK_IN_INTERVAL_NS", "DeadSubscriberReport", "HealthReport", "NEVER", "SharedRegion", "unlink_shm",
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


class SharedRegion:
    """One channel: a mapped Kickmsg region and its geometry.

    Build one with ``create``, ``open``, ``inspect`` or ``create_or_open``.
    It holds its layout's core (``core``: a ``kickmsg.protocol.v4.region.Region``
    or a ``kickmsg.protocol.v9.region.Region``, chosen once when it is
    created or opened) and adds policy: read-only attachment, following a
    re-created region, the reports of its repairs. A method only one layout
    has raises ``LayoutError`` on the other. Publishers, subscribers, views
    and slots keep the mapping alive on their own, so a region object may
    be dropped while they are in use.
    """

    def __init__(self, core: region4.Region | v9.Region) -> None:
        """Wrap the core a constructor made or checked (internal)."""
        self.core = core
        self.mapping = core.mapping
        self.layout = core.layout  # the region's layout version: 4 or 9
        self.created_at_ns = core.created_at_ns  # which incarnation of the name this object is
        # Layout 9's geometry in the terms of layout 4's (the same thirteen
        # fields, with the same meanings): what the tools describe.
        self.geometry = core.geometry if isinstance(core, region4.Region) else _described_geometry9(core.geometry)

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
        return SharedRegion(region4.create(name, type, cfg, creator, mode))

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
            raise EmptyObjectError(f"Invalid shared memory (bad magic): {name} is empty (0 bytes)") from None
        return _attach(mapping, expected_identity)

    @staticmethod
    def inspect(name: str) -> "SharedRegion":
        """Attach read-only, for tools (beyond 0.1.0): geometry, schema(),
        diagnose(), audit() work; publishing, subscribing and repairing are
        refused. Works without write permission on the object."""
        try:
            mapping = shm.open_existing(name, writable=False)
        except shm.EmptyObjectError:
            raise EmptyObjectError(f"Invalid shared memory (bad magic): {name} is empty (0 bytes)") from None
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
        return SharedRegion(region4.create_or_open(name, type, cfg, creator, mode))

    # -- description ------------------------------------------------------

    @property
    def name(self) -> str:
        return self.mapping.name

    @property
    def channel_type(self) -> ChannelType:
        return ChannelType(self.geometry.channel_type)

    def incarnation(self) -> tuple[int, int]:
        """(creator_pid, created_at_ns): changes when the region is
        re-created in place."""
        return self.core.incarnation()

    def replaced(self) -> bool:
        """Whether this region was re-created since this object attached to
        it (beyond 0.1.0): re-initialised in place (magic or creation stamp
        changed), or unlinked and another object made under its name. A
        name merely unlinked is not. Never, for a region in private memory."""
        return self.mapping.shared and self.core.replaced()

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
            raise VersionMismatchError(
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

    def rings_in_use(self) -> list[int]:
        """The indices of the rings that are not idle. An idle ring is Free,
        with no publisher in flight, never written (``state_flight`` and
        ``write_pos`` both 0): it holds nothing and has nothing to show."""
        return self.core.rings_in_use()

    def info(self) -> RegionInfo:
        """0.9.2's ``RegionInfo``: what the header says (both layouts)."""
        return self.core.info()

    def stats(self) -> RegionStats:
        """0.9.2's ``RegionStats`` (lock-free, racy by nature). Layout 4 has
        no counters in shared memory: drops, losses and steals read 0 (the
        rings' lost counts of our subscribers are in ``kickmsg.owners``)."""
        return self.core.stats()

    def __repr__(self) -> str:
        g = self.geometry
        shown = ", layout=9" if self.layout == layouts.LAYOUT_9 else ""
        return (
            f"SharedRegion(name={self.name!r}{shown}, type={self.channel_type.name}, max_subscribers={g.max_subs}, "
            f"sub_ring_capacity={g.capacity}, pool_size={g.pool_size}, max_payload_size={g.slot_data_size})"
        )

    # -- schema descriptor ------------------------------------------------

    def schema(self) -> SchemaInfo | None:
        """The published descriptor, or None while it is Unset or Claiming."""
        return self.core.schema()

    def try_claim_schema(self, info: SchemaInfo) -> bool:
        """Publish ``info`` if no descriptor is set yet.

        Unset -> Claiming (CAS acq_rel), copy, Set (release). Returns False
        when another claimant got there first; a loser that sees Claiming
        waits a bounded while for it to finish, so read ``schema()`` after.
        """
        self.require_writable("claim the schema")
        if not isinstance(info, SchemaInfo):
            raise TypeError(f"try_claim_schema needs a SchemaInfo, got {info!r}")
        core = self.core
        return repair4.try_claim_schema(core, info) if isinstance(core, region4.Region) else repair9.try_claim_schema(core, info)

    def reset_schema_claim(self) -> bool:
        """Claiming -> Unset, to recover from a claimant that died mid-claim.

        Not safe under live traffic: call it only once the claimant is known
        to be gone, or a slow claimant could still finish into a new claim.
        """
        self.require_writable("reset the schema claim")
        core = self.core
        return repair4.reset_schema_claim(core) if isinstance(core, region4.Region) else repair9.reset_schema_claim(core)

    # -- health and repair --------------------------------------------------

    def diagnose(self) -> HealthReport:
        """Read-only health scan; safe under live traffic. Idle rings (see
        ``rings_in_use``) have nothing to count."""
        core = self.core
        found = repair4.diagnose(core) if isinstance(core, region4.Region) else repair9.diagnose(core)
        return HealthReport.from_counts(found, self.geometry)

    def dead_subscriber_rings(self) -> list[tuple[int, int]]:
        """(ring, pid) of each ring whose recorded owner died while it held
        it: Live, or Draining (died leaving); on layout 9 also Reclaiming,
        the owner being the one its ring header records. Read-only, beyond
        0.1.0; ``reclaim_dead_subscribers`` frees them. On layout 4, rings
        of subscribers that record no owner (native ones) are not counted."""
        core = self.core
        return repair4.dead_subscriber_rings(core) if isinstance(core, region4.Region) else repair9.dead_subscriber_rings(core)

    def repair_locked_entries(self) -> int:
        """Commit every stuck entry as empty (INVALID_SLOT, length 0, sequence
        position + 1) so publishers wrapping onto it succeed again. Safe under
        live traffic in that nothing blocks or is corrupted; but an entry a
        live publisher holds LOCKED at that moment is committed empty under
        it, and if our INVALID_SLOT lands after its slot index, its message
        is lost for that ring and one reference to its slot leaks
        (``reclaim_orphaned_slots`` recovers it at quiescence; the spec calls
        this race benign, ``kickmsg verify --repair-pass`` shows it is not).
        On layout 9, each lock that stays the same for a commit timeout is
        stolen into a skip marker (B.13). Returns the number of entries repaired."""
        self.require_writable("repair entries")
        core = self.core
        return repair4.repair_locked_entries(core) if isinstance(core, region4.Region) else repair9.repair_locked_entries(core)

    def reset_retired_rings(self, drain: bool = False) -> int:
        """Free | in_flight > 0 -> Free | 0, so new subscribers can claim those
        rings again. Only safe once the crashed publisher is known to be gone:
        a slow but alive one would later decrement in_flight into the state
        bits. Returns the number of rings reset.

        ``drain=True`` (beyond 0.1.0 and 0.9.2) also does the drain that the
        timed-out teardown skipped: it releases the references (layout 9:
        claims) the ring's entries still hold, which otherwise stay taken
        until publishers wrap over them.
        """
        self.require_writable("reset rings")
        core = self.core
        return repair4.reset_retired_rings(core, drain) if isinstance(core, region4.Region) else repair9.reset_retired_rings(core, drain)

    def drain_free_rings(self, retired: bool = False) -> list[DrainedRing]:
        """Release the references (layout 9: claims) Free rings' entries
        still hold (beyond 0.1.0 and 0.9.2; left by a reset without drain,
        or by 0.9.2's reclaim_dead_rings): each ring drained, with the slots
        given back to the pool. Safe under traffic; ``retired`` also resets
        and drains retired rings, only once the crashed publisher is gone."""
        self.require_writable("drain rings")
        core = self.core
        return repair4.drain_free_rings(core, retired) if isinstance(core, region4.Region) else repair9.drain_free_rings(core, retired)

    def reclaim_dead_subscribers(self) -> DeadSubscriberReport:
        """Leave, on their behalf, the rings whose subscriber died (beyond
        0.1.0): Live rings, and Draining ones whose owner died during its
        own teardown. Each is drained and freed exactly as its owner's
        teardown would have done it, so this is safe with publishers in
        flight; one whose publishers stayed in flight past the commit
        timeout is left retired (timed out).

        Layout 4 reads the owner records of ``kickmsg.owners``: rings
        without one (native subscribers) are left alone and reported
        unrecorded, and pins of the dead owner's views stay (reclaim them
        with ``reclaim_orphaned_slots()`` at quiescence). Layout 9 uses its
        own mechanism (``kickmsg.protocol.v9.repair.reclaim_dead_ring``):
        every subscriber, native or ours, records itself in its ring's
        header, so none is unrecorded.
        """
        self.require_writable("reclaim rings")
        core = self.core
        if isinstance(core, region4.Region):
            return DeadSubscriberReport(*repair4.reclaim_dead_subscribers(core))
        return DeadSubscriberReport(*repair9.reclaim_dead_subscribers(core))

    def reclaim_dead_rings(self) -> int:
        """Layout 9: leave, on their behalf, the rings whose owner is provably
        dead (B.13, done as the owner's leave: their claims go back to the
        pool; ``kickmsg.protocol.v9.repair.reclaim_dead_ring``). Returns how
        many. ``LayoutError`` on layout 4 (``reclaim_dead_subscribers``)."""
        if not isinstance(self.core, v9.Region):
            raise LayoutError(f"{self.name} is a layout-4 region: reclaim_dead_rings is layout 9's (reclaim_dead_subscribers is its own)")
        self.require_writable("reclaim dead rings")
        return repair9.reclaim_dead_rings(self.core)

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
        was Free already; a retired ring is ``reset_retired_rings``'s.

        Layout 4 only: on layout 9 every ring records its owner in its
        header, and ``reclaim_dead_subscribers`` frees it once that owner is
        dead (``LayoutError``)."""
        if not isinstance(self.core, region4.Region):
            raise LayoutError(
                f"ring {index} of {self.name}: not freed by force on a layout-9 region, whose rings record their owner "
                f"(kickmsg repair --dead-subscribers frees a ring once its owner is dead)"
            )
        self.require_writable("free rings")
        return repair4.free_ring(self.core, index)

    def referenced_slots(self) -> set[int]:
        """Layout 4: the slot indices that committed entries in the rings'
        live windows name (read-only; the set ``reclaim_orphaned_slots``
        keeps). ``LayoutError`` on layout 9, whose slots are held by claims
        (``kickmsg audit`` lists them)."""
        if not isinstance(self.core, region4.Region):
            raise LayoutError(f"{self.name} is a layout-9 region: referenced_slots is layout 4's (kickmsg audit lists claims)")
        return repair4.referenced_slots(self.core)

    def reclaim_orphaned_slots(self) -> int:
        """Give back every slot with a refcount that no ring entry references
        (layout 9: that no entry claims; every claimed slot's refcount is set
        to its claims, 0.9.2's claim counting).

        NOT safe under live traffic: every publisher must be paused (one
        between its refcount pre-set and its ring pushes holds such a slot
        legitimately) and no SampleView may be alive (a view's pin is a
        reference no ring shows). Returns the number of slots reclaimed.
        """
        self.require_writable("reclaim slots")
        core = self.core
        return repair4.reclaim_orphaned_slots(core) if isinstance(core, region4.Region) else repair9.reclaim_orphaned_slots(core)


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


def warn_of_stranded_holders(name: str, new_layout: int) -> None:
    """Before a create replaces a channel of another layout than
    ``new_layout`` (0.9.2's "create replaces", kept): a ``RuntimeWarning``
    naming the live processes that map it, found in /proc/PID/maps
    (``shm.processes_mapping``: every process of this user, every one as
    root). They cannot follow the name to a region of another layout: a
    native one goes on in the old object, publishing to nobody or waiting
    for nothing, and says nothing."""
    try:
        stamp = region4.file_stamp(shm.SHM_DIRECTORY + name)
    except (OSError, ValueError):  # no such object (or one we may not read): nothing is replaced unseen
        return
    if stamp is None or stamp[0] != layout.MAGIC:
        return
    found = stamp[1]
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
    if region4.read_stamp(mapping)[0] != layout.MAGIC:
        return None
    return _attach(mapping, 0)


def _attach(mapping: shm.Mapping, expected_identity: int) -> SharedRegion:
    """Check an initialised-looking mapping and wrap the core of the layout
    its version word (after magic) names; flag a layout-4 geometry that
    cannot work (when attached to use it, not to inspect it)."""
    name = mapping.name
    magic, version = region4.read_stamp(mapping)
    if magic != layout.MAGIC:
        raise CorruptRegionError(f"Invalid shared memory (bad magic): {name}")
    if version == layouts.LAYOUT_9:
        return SharedRegion(v9.Region.attach(mapping, expected_identity))
    if version not in layouts.SUPPORTED_LAYOUTS:
        raise VersionMismatchError(
            f"Version mismatch: {name} has layout version {version}, this library reads layouts 4 and 9"
        )
    return SharedRegion(region4.attach(mapping, expected_identity))


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
    return SharedRegion(v9.Region.create(name, channel_type, config, creator, mode=permissions))


def _create_or_open9(name: str, channel_type: int, config: v9.ChannelConfig, creator: str, mode: int | None) -> SharedRegion:
    """0.9.2's create_or_open; a layout-4 channel of that name is refused
    saying how this package joins it (0.9.2's words advise unlinking it)."""
    try:
        return SharedRegion(v9.Region.create_or_open(name, channel_type, config, creator, mode=mode))
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
