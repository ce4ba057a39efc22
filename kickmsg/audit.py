"""Audit: a read-only check of a region's invariants (beyond 0.1.0).

Every slot should be in exactly one of these states:

- free: on the free stack, refcount 0;
- being written: off the stack, refcount 0, no ring entry names it (a
  publisher between pop and publish; also the slot lost by a publisher that
  died there, which the spec counts as its one unrecoverable leak);
- referenced: its refcount equals the ring entries that hold it, plus one
  per live ``SampleView`` pin and per publisher in the middle of publishing.

The audit walks the free stack and every ring's live window (idle rings,
never written, have none: only their two header words are read) and reports what
breaks that: free-stack cycles or links out of the pool, slots whose refcount
exceeds what can release it (leaked) or falls short of the ring references
(a later release would free it twice), slots on the free stack that are still
referenced (double-free candidates), stuck entries, rings by state (a ring stays Draining only while its
subscriber leaves; one left Draining lost its subscriber mid-teardown), Live
rings whose recorded owner died (``kickmsg.owners``), and a geometry that
cannot work (``Geometry.hazards``: a pool no larger than a ring). On a
region with traffic the counts can include transient states; at quiescence
with no views alive a healthy region audits clean. It works on any v4 region,
including those made by the native library, and never writes.
"""
from dataclasses import dataclass, field

from kickmsg import layout, owners
from kickmsg.region import SharedRegion

SCHEMA_STATE_NAMES = {layout.SCHEMA_UNSET: "Unset", layout.SCHEMA_CLAIMING: "Claiming", layout.SCHEMA_SET: "Set"}


@dataclass
class RingAudit:
    index: int
    state: str  # Free, Live, Draining, or "invalid (3)"
    in_flight: int
    write_pos: int
    references: int  # committed entries of the live window that hold a slot
    locked_entries: list[int] = field(default_factory=list)  # positions stuck at LOCKED
    stale_entries: list[int] = field(default_factory=list)  # positions more than one wrap behind
    bad_entries: list[int] = field(default_factory=list)  # positions naming a slot outside the pool
    owner_pid: int | None = None  # a Live or Draining ring's recorded owner, if it records itself (kickmsg.owners)
    owner_alive: bool | None = None  # whether that owner still holds its record's lock

    @property
    def retired(self) -> bool:
        """Free with in_flight > 0: unusable until reset_retired_rings()."""
        return self.state == "Free" and self.in_flight > 0

    @property
    def owner_dead(self) -> bool:
        """Its recorded owner died holding it: reclaim_dead_subscribers() frees it."""
        return self.owner_pid is not None and self.owner_alive is False


@dataclass
class AuditReport:
    region: str
    pool_size: int
    free_slots: int  # distinct slots reached on the free stack
    free_stack_problems: list[str]
    being_written: list[int]
    leaked_slots: list[int]  # refcount above ring references (pins of dead views, crashed publishers)
    under_referenced_slots: list[int]  # refcount below ring references
    double_free_candidates: list[int]  # on the free stack yet with a refcount or a ring reference
    rings: list[RingAudit]  # every ring but the idle ones (SharedRegion.rings_in_use), in index order
    idle_rings: int  # Free, nothing in flight, never written: nothing to check
    schema_state: str
    hazards: list[str]  # why this geometry cannot work (Geometry.hazards)
    ring_references: list[int]  # per slot: committed entries of the rings' live windows naming it
    refcounts: list[int]  # per slot, as read

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
            "retired rings": sum(r.retired for r in self.rings),
            "rings left Draining": sum(r.state == "Draining" for r in self.rings),
            "rings in an invalid state": sum(r.state.startswith("invalid") for r in self.rings),
            "rings held by dead subscribers": sum(r.owner_dead for r in self.rings),
            "schema claims stuck at Claiming": int(self.schema_state == "Claiming"),
            "pools too small for their rings": len(self.hazards),
        }

    @property
    def clean(self) -> bool:
        return not any(self.damage().values())

    @property
    def verdict(self) -> str:
        """One line: ``clean: ...`` or ``DAMAGED: ...``."""
        live = sum(r.state == "Live" for r in self.rings)
        summary = f"{self.free_slots} of {self.pool_size} slots free, {live} live rings"
        if self.being_written:
            summary += f", {len(self.being_written)} slot(s) being written"
        found = ", ".join(f"{what}: {count}" for what, count in self.damage().items() if count)
        return f"DAMAGED: {found}; {summary}" if found else f"clean: {summary}"


def audit(region: SharedRegion) -> AuditReport:
    """Check ``region``'s invariants without writing anything."""
    ops = region.atomics
    pool_size = region.geometry.pool_size
    capacity = region.geometry.capacity

    # The free stack, bounded by the pool size, stopping at a cycle.
    free, problems = set(), []
    slot = ops.load_acquire_u64(region.free_top_address) & layout.U32_MAX
    while slot != layout.INVALID_SLOT:
        if slot >= pool_size:
            problems.append(f"link to slot {slot}, outside the pool of {pool_size}")
            break
        if slot in free:
            problems.append(f"cycle: slot {slot} is reached twice")
            break
        free.add(slot)
        slot = ops.load_acquire_u32(region.slot_addresses[slot] + layout.NEXT_FREE_OFFSET)

    # Ring references: committed entries of every ring's live window.
    references = [0] * pool_size
    rings = []
    records = (owners.read_owners(region.name, region.geometry.max_subs) if region.mapping.shared else None) or []
    in_use = region.rings_in_use()
    for ring in map(region.ring, in_use):
        state_flight = ops.load_acquire_u32(ring.state_flight)
        state = state_flight & layout.RING_STATE_MASK
        write_pos = ops.load_acquire_u64(ring.write_pos)
        ring_audit = RingAudit(
            index=ring.index,
            state=layout.RING_STATE_NAMES.get(state, f"invalid ({state})"),
            in_flight=state_flight >> 2,
            write_pos=write_pos,
            references=0,
        )
        for position in range(max(0, write_pos - capacity), write_pos):
            entry = ring.entries[position & region.geometry.mask]
            sequence = ops.load_acquire_u64(entry + layout.SEQUENCE_OFFSET)
            if sequence == layout.LOCKED_SEQUENCE:
                ring_audit.locked_entries.append(position)
            elif layout.entry_is_stuck(sequence, position, capacity):
                ring_audit.stale_entries.append(position)
            elif sequence == position + 1:
                held = ops.load_acquire_u32(entry + layout.SLOT_IDX_OFFSET)
                if held < pool_size:
                    references[held] += 1
                    ring_audit.references += 1
                elif held != layout.INVALID_SLOT:
                    ring_audit.bad_entries.append(position)
        record, record_held = records[ring.index] if ring.index < len(records) else (None, False)
        if ring_audit.state in ("Live", "Draining") and record is not None and record.region_created_at_ns == region.created_at_ns:
            ring_audit.owner_pid, ring_audit.owner_alive = record.pid, record_held
        rings.append(ring_audit)

    # Each slot against its state.
    being_written, leaked, under_referenced, double_free = [], [], [], []
    refcounts = []
    for slot in range(pool_size):
        refcount = ops.load_acquire_u32(region.slot_addresses[slot] + layout.REFCOUNT_OFFSET)
        refcounts.append(refcount)
        if slot in free:
            if refcount or references[slot]:
                double_free.append(slot)
        elif refcount == 0 and references[slot] == 0:
            being_written.append(slot)
        elif refcount > references[slot]:
            leaked.append(slot)
        elif refcount < references[slot]:
            under_referenced.append(slot)

    schema_state = ops.load_acquire_u32(region.schema_state_address)
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
    )


def explain_empty_pool(region: SharedRegion) -> str:
    """Why a region's slot pool is empty, for the error of a failed send:
    who holds the slots, and what to do about the cause that applies."""
    report = audit(region)
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
            f"{in_idle_rings} references are held by rings that are no longer Live (a subscriber's teardown timed "
            f"out): reset_retired_rings(drain=True), or kickmsg repair --retired"
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
