"""Audit: a read-only check of a region's invariants (beyond 0.1.0).

Every slot should be in exactly one of these states:

- free: on the free stack, refcount 0;
- being written: off the stack, refcount 0, no ring entry names it (a
  publisher between pop and publish; also the slot lost by a publisher that
  died there, which the spec counts as its one unrecoverable leak);
- referenced: its refcount equals the ring entries that hold it, plus one
  per live ``SampleView`` pin and per publisher in the middle of publishing.

The audit walks the free stack and every ring's live window and reports what
breaks that: free-stack cycles or links out of the pool, slots whose refcount
exceeds what can release it (leaked) or falls short of the ring references
(a later release would free it twice), slots on the free stack that are still
referenced (double-free candidates), stuck entries, and rings by state (a ring stays Draining only while its
subscriber leaves; one left Draining lost its subscriber mid-teardown). On a
region with traffic the counts can include transient states; at quiescence
with no views alive a healthy region audits clean. It works on any v4 region,
including those made by the native library, and never writes.
"""
from dataclasses import dataclass, field

from kickmsg import layout
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

    @property
    def retired(self) -> bool:
        """Free with in_flight > 0: unusable until reset_retired_rings()."""
        return self.state == "Free" and self.in_flight > 0


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
    rings: list[RingAudit]
    schema_state: str

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
            "schema claims stuck at Claiming": int(self.schema_state == "Claiming"),
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
    for ring in region.rings:
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
        rings.append(ring_audit)

    # Each slot against its state.
    being_written, leaked, under_referenced, double_free = [], [], [], []
    for slot in range(pool_size):
        refcount = ops.load_acquire_u32(region.slot_addresses[slot] + layout.REFCOUNT_OFFSET)
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
        schema_state=SCHEMA_STATE_NAMES.get(schema_state, f"invalid ({schema_state})"),
    )
