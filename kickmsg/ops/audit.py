"""Audit: a read-only check of a region's invariants (beyond 0.1.0).

Every slot should be in exactly one of these states:

- free: on the free stack, refcount 0;
- being written: off the stack, refcount 0, no ring entry names it (a
  publisher between pop and publish); one that stays so was lost by a
  publisher that died there (or is held by an allocation not published):
  an unreferenced slot, damage;
- referenced: its refcount equals the ring entries that hold it, plus one
  per live ``SampleView`` pin and per publisher in the middle of publishing;
  a slot only rings that are not Live hold (a reclaim or reset that did not
  drain) is stranded, damage: no publisher writes into those rings, so
  nothing would give it back.

The audit walks the free stack and every ring's live window (idle rings,
never written, have none: only their two header words are read) and reports what
breaks that: free-stack cycles or links out of the pool, slots whose refcount
exceeds what can release it (leaked) or falls short of the ring references
(a later release would free it twice), slots on the free stack that are still
referenced (double-free candidates), stuck entries, rings by state (a ring stays Draining only while its
subscriber leaves; one left Draining lost its subscriber mid-teardown), Live
rings whose recorded owner died (``kickmsg.owners``), and a geometry that
cannot work (``Geometry.hazards``: a pool no larger than a ring). It works on
any layout-4 or layout-9 region, including those made by the native library,
and never writes.

On layout 9 (WIRE9.md A.3-A.5) a slot's references are the claims (meta
words) of every entry of every ring, not only the committed entries of the
live windows: a claim holds its slot until a publisher replaces it. Locks
are tagged (publisher or repairer) and count as locked entries; skip
markers are consumed positions, not damage; a claim naming a slot outside
the pool or tagged for a position of another entry is a bad entry; a ring
left Reclaiming is damage like one left Draining; a ring's owner is the pid
and start time in its header.

On a channel with traffic one look is not enough: the look takes time while
slots move, and the flows pass through states that break the invariants for
a moment (a slot popped and pre-set but in no ring yet, an entry claimed but
not committed, one LOCKED while written, a slot released while a drain or an
eviction is half done). So what one look finds wrong is only a suspicion:
the audit looks again, sooner first, then later, and keeps only what every
look found in the same state (the same slot with the same refcount, free
stack membership and holding entries; the same entry at the same position;
the same ring in the same state). It reports that once it has held for
``settle_time_s``: twice the commit timeout (the longest the protocol lets
a writer hold an entry before treating it as crashed), at least 10 ms, at
most 1 s. What changes or goes away meanwhile was a flow in progress. A
region where nothing looks wrong takes a single look. Pins of views still
alive hold still: they count as leaked slots like those of a process that
died holding views.
"""
import time
from dataclasses import dataclass, field, replace

from kickmsg import owners
from kickmsg.protocol import freestack
from kickmsg.protocol.info import RingWords
from kickmsg.protocol.v4 import layout
from kickmsg.protocol.v4.layout import Geometry
from kickmsg.protocol.v9 import layout as v9layout
from kickmsg.protocol.v9 import words as v9words
from kickmsg.protocol.v9.liveness import owner_is_dead
from kickmsg.region import SharedRegion

__all__ = [
    "AuditReport", "FIRST_PAUSE_S", "LONGEST_SETTLE_S", "RingAudit", "SCHEMA_STATE_NAMES", "SHORTEST_SETTLE_S",
    "SlotReading", "audit", "explain_empty_pool", "look", "settle_time_s",
]

FIRST_PAUSE_S = 0.001  # before the second look; each later pause doubles
SHORTEST_SETTLE_S = 0.01  # a process may be paused that long on a busy machine
LONGEST_SETTLE_S = 1.0  # whatever commit timeout a header claims
SCHEMA_STATE_NAMES = {layout.SCHEMA_UNSET: "Unset", layout.SCHEMA_CLAIMING: "Claiming", layout.SCHEMA_SET: "Set"}


@dataclass
class RingAudit:
    index: int
    state: str  # Free, Live, Draining, Reclaiming (layout 9), or "invalid (3)" (layout 4)
    in_flight: int
    write_pos: int
    references: int  # committed entries of the live window that hold a slot
    locked_entries: list[int] = field(default_factory=list)  # positions stuck at LOCKED
    stale_entries: list[int] = field(default_factory=list)  # positions more than one wrap behind
    bad_entries: list[int] = field(default_factory=list)  # positions naming a slot outside the pool (layout 9: entry indices of bad claims)
    skip_entries: list[int] = field(default_factory=list)  # layout 9: positions consumed without a sample (not damage)
    owner_pid: int | None = None  # a Live or Draining ring's owner: its record (kickmsg.owners) on layout 4, the ring header on 9
    owner_alive: bool | None = None  # whether that owner still holds its record's lock (layout 9: is not provably dead)

    @property
    def retired(self) -> bool:
        """Free with in_flight > 0: unusable until reset_retired_rings()."""
        return self.state == "Free" and self.in_flight > 0

    @property
    def owner_dead(self) -> bool:
        """Its recorded owner died holding it: reclaim_dead_subscribers() frees it."""
        return self.owner_pid is not None and self.owner_alive is False


@dataclass(frozen=True)
class SlotReading:
    """What one look read of a slot found damaged."""

    refcount: int
    on_free_stack: bool
    entries: tuple[tuple[int, int], ...]  # (ring, position) of each committed entry naming it


@dataclass
class AuditReport:
    region: str
    pool_size: int
    free_slots: int  # distinct slots reached on the free stack
    free_stack_problems: list[str]
    being_written: list[int]
    leaked_slots: list[int]  # refcount above ring references (pins of views, dead or alive; crashed publishers)
    under_referenced_slots: list[int]  # refcount below ring references
    double_free_candidates: list[int]  # on the free stack yet with a refcount or a ring reference
    rings: list[RingAudit]  # every ring but the idle ones (SharedRegion.rings_in_use), in index order
    idle_rings: int  # Free, nothing in flight, never written: nothing to check
    schema_state: str
    hazards: list[str]  # why this geometry cannot work (Geometry.hazards)
    ring_references: list[int]  # per slot: committed entries of the rings' live windows naming it
    refcounts: list[int]  # per slot, as read
    # Rings in a state that is damage once it lasts: Free with publishers
    # admitted (retired), Draining, Reclaiming, state bits 3, Live or Draining with a dead owner.
    retired_rings: list[int]
    draining_rings: list[int]
    reclaiming_rings: list[int]  # layout 9: a reclaimer stopped between its two CASes (B.13)
    invalid_rings: list[int]
    dead_owner_rings: list[int]
    schema_stuck: bool  # a schema claim held at Claiming
    slot_readings: dict[int, SlotReading]  # each damaged slot, as read
    # Beyond these: slots being written that stayed so (lost by a publisher that died
    # between pop and publish, or held by an allocation not published), and slots that only
    # rings that are not Live hold; the slots on the free stack; the region's layout.
    unreferenced_slots: list[int] = field(default_factory=list)
    stranded_slots: list[int] = field(default_factory=list)
    free_slot_list: list[int] = field(default_factory=list)
    layout: int = 4

    def damage(self) -> dict[str, int]:
        """Each kind of damage the audit looks for, with how much it found."""
        return {
            "free-stack problems": len(self.free_stack_problems),
            "leaked slots": len(self.leaked_slots),
            "under-referenced slots": len(self.under_referenced_slots),
            "double-free candidates": len(self.double_free_candidates),
            "locked entries": sum(len(r.locked_entries) for r in self.rings),
            "stale entries": sum(len(r.stale_entries) for r in self.rings),
            "entries naming no slot": sum(len(r.bad_entries) for r in self.rings),
            "retired rings": len(self.retired_rings),
            "rings left Draining": len(self.draining_rings),
            "rings left Reclaiming": len(self.reclaiming_rings),
            "rings in an invalid state": len(self.invalid_rings),
            "rings held by dead subscribers": len(self.dead_owner_rings),
            "schema claims stuck at Claiming": int(self.schema_stuck),
            "pools too small for their rings": len(self.hazards),
            "unreferenced slots": len(self.unreferenced_slots),
            "slots held only by rings that are not Live": len(self.stranded_slots),
        }

    @property
    def clean(self) -> bool:
        return not any(self.damage().values())

    def fixes(self, name: str) -> list[str]:
        """Per kind of damage found, what it is and which command (or call)
        fixes it, for a region named ``name``."""
        recreate = f"no repair fixes it: re-create the channel (kickmsg create {name} --replace) once no process uses it"
        orphans = (f"kickmsg repair {name} --orphans --yes gives them back, with every publisher stopped and no "
                   f"view alive (a live view's pin goes when the view is released)")
        unreferenced = (
            f"lost by a publisher that died between allocating and publishing (or held by an allocation not yet "
            f"published): " + (orphans if self.layout == 9 else
                               "on layout 4 no repair can tell them from a paused publisher's (the spec's "
                               "unrecoverable leak): re-create the channel to get them back")
        )
        how = {
            "free-stack problems": recreate,
            "leaked slots": "references no ring entry accounts for (pins of views, dead or alive; crashed "
                            "publishers): " + orphans,
            "unreferenced slots": unreferenced,
            "slots held only by rings that are not Live": (
                f"no publisher writes into those rings, so nothing gives them back: kickmsg repair {name} drains "
                f"Free rings (retired ones: kickmsg repair {name} --retired --yes, once the crashed publisher is gone)"
            ),
            "under-referenced slots": recreate,
            "double-free candidates": recreate,
            "locked entries": f"kickmsg repair {name} repairs them",
            "stale entries": f"kickmsg repair {name} repairs them",
            "entries naming no slot": recreate,
            "retired rings": f"kickmsg repair {name} --retired --yes resets them, once the crashed publisher is gone",
            "rings left Draining": f"kickmsg repair {name} frees them once their subscriber is dead",
            "rings left Reclaiming": f"kickmsg repair {name} frees them (their reclaimer stopped half-way)",
            "rings in an invalid state": recreate,
            "rings held by dead subscribers": f"kickmsg repair {name} reclaims them",
            "schema claims stuck at Claiming": "region.reset_schema_claim() resets it, once the claimant is gone",
            "pools too small for their rings": f"re-create the channel with a larger pool (kickmsg create {name} "
                                               f"--replace --pool N)",
        }
        return [f"{what} ({count}): {how[what]}" for what, count in self.damage().items() if count]

    @property
    def verdict(self) -> str:
        """One line: ``clean: ...`` or ``DAMAGED: ...``."""
        live = sum(r.state == "Live" for r in self.rings)
        summary = f"{self.free_slots} of {self.pool_size} slots free, {live} live rings"
        moving = [slot for slot in self.being_written if slot not in self.unreferenced_slots]  # (damage: listed)
        if moving:
            summary += f", {len(moving)} slot(s) being written"
        found = ", ".join(f"{what}: {count}" for what, count in self.damage().items() if count)
        return f"DAMAGED: {found}; {summary}" if found else f"clean: {summary}"


def audit(region: SharedRegion) -> AuditReport:
    """Check ``region``'s invariants without writing anything. What a look
    finds wrong is reported only if every later look, until
    ``settle_time_s`` has passed, finds it in the same state (module
    docstring); a region where nothing looks wrong takes one look."""
    report = look(region)
    first_look = time.monotonic()
    settle_s = settle_time_s(region.geometry)
    pause = FIRST_PAUSE_S
    while not report.clean and time.monotonic() - first_look < settle_s:
        time.sleep(min(pause, max(0.0, first_look + settle_s - time.monotonic())))
        pause *= 2
        report = _still_there(report, look(region))
    return report


def settle_time_s(geometry: Geometry) -> float:
    """How long a suspicion must hold before the audit reports it: twice the
    commit timeout, within [SHORTEST_SETTLE_S, LONGEST_SETTLE_S]."""
    return min(max(2 * geometry.commit_timeout_us / 1e6, SHORTEST_SETTLE_S), LONGEST_SETTLE_S)


def look(region: SharedRegion) -> AuditReport:
    """One pass over ``region``: what it shows right now, transient states
    of flows in progress included."""
    core = region.core
    pool_size = region.geometry.pool_size

    # The free stack, bounded by the pool size, stopping at a cycle.
    free_slots, problem = freestack.walk(core)
    free, problems = set(free_slots), [] if problem is None else [problem]

    # Ring references, per layout: the entries that hold a slot.
    in_use = core.rings_in_use()
    snapshots = [core.ring_words(index) for index in in_use]
    rings, holders = _rings9(region, snapshots) if region.layout == 9 else _rings4(region, snapshots)

    # Each slot against its state.
    references = [len(holders.get(slot, ())) for slot in range(pool_size)]
    live_rings = {ring.index for ring in rings if ring.state == "Live"}
    stranded = [
        slot for slot in range(pool_size)
        if slot not in free and holders.get(slot) and not any(ring in live_rings for ring, _ in holders[slot])
    ]
    being_written, leaked, under_referenced, double_free = [], [], [], []
    refcounts = freestack.refcounts(core)
    for slot, refcount in enumerate(refcounts):
        if slot in free:
            if refcount or references[slot]:
                double_free.append(slot)
        elif refcount == 0 and references[slot] == 0:
            being_written.append(slot)
        elif refcount > references[slot]:
            leaked.append(slot)
        elif refcount < references[slot]:
            under_referenced.append(slot)
    slot_readings = {
        slot: SlotReading(refcounts[slot], slot in free, tuple(holders.get(slot, ())))
        for slot in leaked + under_referenced + double_free + being_written + stranded
    }

    schema_state = core.header_words().schema_state
    return AuditReport(
        region=region.name,
        pool_size=pool_size,
        free_slots=len(free),
        free_stack_problems=problems,
        being_written=being_written,
        leaked_slots=leaked,
        under_referenced_slots=under_referenced,
        double_free_candidates=double_free,
        rings=rings,
        idle_rings=region.geometry.max_subs - len(in_use),
        schema_state=SCHEMA_STATE_NAMES.get(schema_state, f"invalid ({schema_state})"),
        hazards=region.geometry.hazards(),
        ring_references=references,
        refcounts=refcounts,
        retired_rings=[r.index for r in rings if r.retired],
        draining_rings=[r.index for r in rings if r.state == "Draining"],
        reclaiming_rings=[r.index for r in rings if r.state == "Reclaiming"],
        invalid_rings=[r.index for r in rings if r.state.startswith("invalid")],
        dead_owner_rings=[r.index for r in rings if r.owner_dead],
        schema_stuck=schema_state == layout.SCHEMA_CLAIMING,
        slot_readings=slot_readings,
        unreferenced_slots=being_written,
        stranded_slots=stranded,
        free_slot_list=sorted(free),
        layout=region.layout,
    )


def _rings4(region: SharedRegion, snapshots: list[RingWords]) -> tuple[list[RingAudit], dict[int, list[tuple[int, int]]]]:
    """Layout 4: each ring in use, and per slot the (ring, position) of the
    committed entries of the live windows naming it. A ring's owner is its
    subscriber's record (``kickmsg.owners``), if it keeps one."""
    pool_size, capacity = region.geometry.pool_size, region.geometry.capacity
    holders: dict[int, list[tuple[int, int]]] = {}
    rings = []
    records = (owners.read_owners(region.name, region.geometry.max_subs) if region.mapping.shared else None) or []
    for ring in snapshots:
        state = ring.state_flight & layout.RING_STATE_MASK
        ring_audit = RingAudit(
            index=ring.index,
            state=layout.RING_STATE_NAMES.get(state, f"invalid ({state})"),
            in_flight=ring.state_flight >> 2,
            write_pos=ring.write_pos,
            references=0,
        )
        for position, sequence, held in ring.window:
            if sequence == layout.LOCKED_SEQUENCE:
                ring_audit.locked_entries.append(position)
            elif layout.entry_is_stuck(sequence, position, capacity):
                ring_audit.stale_entries.append(position)
            elif sequence == position + 1:
                if held < pool_size:
                    holders.setdefault(held, []).append((ring.index, position))
                    ring_audit.references += 1
                elif held != layout.INVALID_SLOT:
                    ring_audit.bad_entries.append(position)
        record, record_held = records[ring.index] if ring.index < len(records) else (None, False)
        if ring_audit.state in ("Live", "Draining") and record is not None and record.region_created_at_ns == region.created_at_ns:
            ring_audit.owner_pid, ring_audit.owner_alive = record.pid, record_held
        rings.append(ring_audit)
    return rings, holders


def _rings9(region: SharedRegion, snapshots: list[RingWords]) -> tuple[list[RingAudit], dict[int, list[tuple[int, int]]]]:
    """Layout 9 (WIRE9.md A.3, A.4): each ring in use, and per slot the
    (ring, entry index) of the claims naming it. In the live window an
    entry is locked (publisher or repairer lock), more than one wrap stale,
    a skip marker, or committed. Every entry of the ring may hold a claim
    (claims stay until a publisher replaces them), each one reference; a
    claim naming a slot outside the pool, or tagged for a position that
    does not map to its entry, is bad. A ring's owner is the pid and start
    time in its header."""
    g = region.geometry
    holders: dict[int, list[tuple[int, int]]] = {}
    rings = []
    for ring in snapshots:
        ring_audit = RingAudit(
            index=ring.index,
            state=v9layout.RING_STATE_NAMES[ring.state_flight & v9layout.RING_STATE_MASK],
            in_flight=ring.state_flight >> 2,
            write_pos=ring.write_pos,
            references=0,
        )
        for position, sequence, _ in ring.window:
            if v9words.seq_locked(sequence):
                ring_audit.locked_entries.append(position)
            elif v9words.seq_pos(sequence) + g.capacity < position + 1:
                ring_audit.stale_entries.append(position)
            elif v9words.seq_skip(sequence):
                ring_audit.skip_entries.append(position)
        for entry_index, meta in enumerate(ring.metas):
            field_value = v9words.meta_slot_field(meta)
            if not field_value:
                continue
            if field_value - 1 >= g.pool_size or (v9words.meta_tag(meta) - 1) & g.mask != entry_index:
                ring_audit.bad_entries.append(entry_index)
                continue
            holders.setdefault(field_value - 1, []).append((ring.index, entry_index))
            ring_audit.references += 1
        if ring_audit.state != "Free" and ring.owner_pid:
            ring_audit.owner_pid, ring_audit.owner_alive = ring.owner_pid, not owner_is_dead(ring.owner_pid, ring.owner_starttime)
        rings.append(ring_audit)
    return rings, holders


def _still_there(earlier: AuditReport, later: AuditReport) -> AuditReport:
    """``later``, with as damage only what ``earlier`` reported in the same
    state: the same slot read the same, the same entry position, the same
    ring (and, for a dead owner, the same owner)."""

    def same_slots(before: list[int], after: list[int]) -> list[int]:
        return [slot for slot in _in_both(after, before) if earlier.slot_readings[slot] == later.slot_readings[slot]]

    earlier_rings = {ring.index: ring for ring in earlier.rings}  # the rings in use may differ between looks
    never_seen = RingAudit(index=-1, state="", in_flight=0, write_pos=0, references=0)
    rings = [
        replace(
            after,
            locked_entries=_in_both(after.locked_entries, before.locked_entries),
            stale_entries=_in_both(after.stale_entries, before.stale_entries),
            bad_entries=_in_both(after.bad_entries, before.bad_entries),
        )
        for after in later.rings
        for before in [earlier_rings.get(after.index, never_seen)]
    ]
    later_rings = {ring.index: ring for ring in later.rings}
    leaked = same_slots(earlier.leaked_slots, later.leaked_slots)
    under_referenced = same_slots(earlier.under_referenced_slots, later.under_referenced_slots)
    double_free = same_slots(earlier.double_free_candidates, later.double_free_candidates)
    unreferenced = same_slots(earlier.unreferenced_slots, later.unreferenced_slots)
    stranded = same_slots(earlier.stranded_slots, later.stranded_slots)
    return replace(
        later,
        free_stack_problems=_in_both(later.free_stack_problems, earlier.free_stack_problems),
        leaked_slots=leaked,
        under_referenced_slots=under_referenced,
        double_free_candidates=double_free,
        rings=rings,
        retired_rings=_in_both(later.retired_rings, earlier.retired_rings),
        draining_rings=_in_both(later.draining_rings, earlier.draining_rings),
        reclaiming_rings=_in_both(later.reclaiming_rings, earlier.reclaiming_rings),
        invalid_rings=_in_both(later.invalid_rings, earlier.invalid_rings),
        dead_owner_rings=[
            ring for ring in _in_both(later.dead_owner_rings, earlier.dead_owner_rings)
            if earlier_rings[ring].owner_pid == later_rings[ring].owner_pid
        ],
        schema_stuck=earlier.schema_stuck and later.schema_stuck,
        slot_readings={
            slot: later.slot_readings[slot] for slot in leaked + under_referenced + double_free + unreferenced + stranded
        },
        unreferenced_slots=unreferenced,
        stranded_slots=stranded,
    )


def _in_both[T](later: list[T], earlier: list[T]) -> list[T]:
    """The items of ``later`` that ``earlier`` has too, in ``later``'s order."""
    seen = set(earlier)
    return [item for item in later if item in seen]


def explain_empty_pool(region: SharedRegion) -> str:
    """Why a region's slot pool is empty, for the error of a failed send:
    who holds the slots, and what to do about the cause that applies. From
    one look (the moment of the failure; ``audit`` would wait to settle)."""
    report = look(region)
    pool_size, capacity = region.geometry.pool_size, region.geometry.capacity
    in_rings = sum(count > 0 for count in report.ring_references)
    only_pinned = sum(
        refcount > 0 and references == 0 for refcount, references in zip(report.refcounts, report.ring_references)
    )
    unpublished = len(report.being_written)
    in_idle_rings = sum(ring.references for ring in report.rings if ring.state != "Live")
    causes = []
    if report.hazards:
        causes.append(report.hazards[0] + "; re-create the channel with a larger pool_size")
    if in_idle_rings:
        causes.append(
            f"{in_idle_rings} references are held by rings that are no longer Live (a teardown that timed out, a "
            f"reclaim or reset that did not drain): kickmsg repair {region.name} drains Free rings (retired ones: "
            f"--retired --yes)"
        )
    if only_pinned:
        causes.append(
            f"{only_pinned} slots are pinned by SampleViews (or arrays over them) still alive, or were leaked by a "
            f"process that died holding views: release views sooner; reclaim_orphaned_slots() at quiescence"
        )
    if unpublished:
        causes.append(
            f"{unpublished} slots are allocated and not yet published (AllocatedSlot objects alive), being "
            f"published right now, or were lost by a publisher that crashed: publish or drop allocated slots"
        )
    if not causes:
        causes.append("slots came back meanwhile (a transient state): try again")
    return (
        f"slot pool of {region.name} exhausted: {report.free_slots} of {pool_size} slots free, {in_rings} held by "
        f"ring entries (each Live ring keeps its last sub_ring_capacity={capacity} messages), {only_pinned} only "
        f"pinned by views (or leaked), {unpublished} allocated or being written. "
        + " ".join(f"({number}) {cause}." for number, cause in enumerate(causes, 1))
    )
