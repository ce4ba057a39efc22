"""Operator calls on a layout-4 region (seed 000 "Crash recovery", "Garbage
collection", "Schema"): health report, repair of locked entries, retired
rings, rings of dead subscribers (beyond 0.1.0: ``kickmsg.owners``
records), orphaned slots, and the schema claim.

``kickmsg.SharedRegion`` refuses them on a read-only region, then runs
them here.
"""
import os
from collections.abc import Iterator

from kickmsg import owners
from kickmsg.protocol import freestack
from kickmsg.protocol.v4 import layout, rings
from kickmsg.protocol.v4.region import Region, RingAddresses
from kickmsg.protocol.info import DrainedRing, HealthCounts
from kickmsg.schema import SchemaInfo

__all__ = [
    "SCHEMA_CLAIM_YIELDS", "dead_subscriber_rings", "diagnose", "drain_free_rings", "free_ring", "held_slots", "live_window",
    "reclaim_dead_subscribers", "reclaim_orphaned_slots", "referenced_slots", "repair_locked_entries",
    "reset_retired_rings", "reset_schema_claim", "try_claim_schema",
]

SCHEMA_CLAIM_YIELDS = 1024  # how long a losing schema claimant waits for Set


# -- health ----------------------------------------------------------------------


def live_window(region: Region, ring: RingAddresses) -> Iterator[tuple[int, int, int]]:
    """(position, entry address, sequence) for every position of the ring's
    live window [max(0, write_pos - capacity), write_pos)."""
    ops = region.atomics
    write_pos = ops.load_acquire_u64(ring.write_pos)
    for position in range(max(0, write_pos - region.geometry.capacity), write_pos):
        entry = ring.entries[position & region.geometry.mask]
        yield position, entry, ops.load_acquire_u64(entry + layout.SEQUENCE_OFFSET)


def diagnose(region: Region) -> HealthCounts:
    """Read-only health scan; safe under live traffic. Idle rings (see
    ``rings_in_use``) have nothing to count."""
    locked = retired = draining = live = 0
    for ring in map(region.ring, region.rings_in_use()):
        state_flight = region.atomics.load_acquire_u32(ring.state_flight)
        state, in_flight = state_flight & layout.RING_STATE_MASK, state_flight >> 2
        live += state == layout.RING_LIVE
        retired += state == layout.RING_FREE and in_flight > 0
        draining += state == layout.RING_DRAINING and in_flight > 0
        capacity = region.geometry.capacity
        locked += sum(layout.entry_is_stuck(seq, pos, capacity) for pos, _, seq in live_window(region, ring))
    schema_stuck = region.atomics.load_acquire_u32(region.schema_state_address) == layout.SCHEMA_CLAIMING
    dead = len(dead_subscriber_rings(region))
    in_live, stranded = held_slots(region)
    return HealthCounts(locked, retired, draining, live, schema_stuck, dead, len(stranded), len(in_live))


def held_slots(region: Region) -> tuple[set[int], set[int]]:
    """The slots Live rings reference, and those only rings that are not
    Live reference (stranded; read-only, beyond 0.1.0): no publisher writes
    into those rings, so nothing gives the slots back until
    ``drain_free_rings`` (or a join and a wrap)."""
    in_live: set[int] = set()
    elsewhere: set[int] = set()
    for ring in map(region.ring, region.rings_in_use()):
        live = region.atomics.load_acquire_u32(ring.state_flight) & layout.RING_STATE_MASK == layout.RING_LIVE
        (in_live if live else elsewhere).update(_referenced_slots_of(region, ring))
    return in_live, elsewhere - in_live


def dead_subscriber_rings(region: Region) -> list[tuple[int, int]]:
    """(ring, pid) of each ring whose recorded owner died while it held
    it: Live, or Draining (died leaving). Read-only, beyond 0.1.0;
    ``reclaim_dead_subscribers`` frees them. Rings of subscribers that
    record no owner (native ones) are not counted."""
    if not region.mapping.shared:
        return []
    records = owners.read_owners(region.name, region.geometry.max_subs) or []
    dead = []
    for index, (record, held) in enumerate(records):
        if record is None or record.region_created_at_ns != region.created_at_ns:
            continue  # no record of a subscriber of this region
        state = region.atomics.load_acquire_u32(region.ring(index).state_flight) & layout.RING_STATE_MASK
        if state in (layout.RING_LIVE, layout.RING_DRAINING) and not held:
            dead.append((index, record.pid))
    return dead


# -- repairs ---------------------------------------------------------------------


def repair_locked_entries(region: Region) -> int:
    """Commit every stuck entry as empty (INVALID_SLOT, length 0, sequence
    position + 1) so publishers wrapping onto it succeed again (seed 000
    "repair_locked_entries"; ``SharedRegion.repair_locked_entries`` says
    what a race with a live writer costs). Returns the number of entries
    repaired."""
    ops = region.atomics
    repaired = 0
    for ring in region.rings:
        for position, entry, sequence in live_window(region, ring):
            if layout.entry_is_stuck(sequence, position, region.geometry.capacity):
                ops.store_relaxed_u32(entry + layout.SLOT_IDX_OFFSET, layout.INVALID_SLOT)
                ops.store_relaxed_u32(entry + layout.PAYLOAD_LEN_OFFSET, 0)
                ops.store_release_u64(entry + layout.SEQUENCE_OFFSET, position + 1)
                repaired += 1
    return repaired


def reset_retired_rings(region: Region, drain: bool = False) -> int:
    """Free | in_flight > 0 -> Free | 0, so new subscribers can claim those
    rings again; with ``drain`` (beyond 0.1.0), first the drain the
    timed-out teardown skipped. Returns the number of rings reset."""
    reset = 0
    for ring in region.rings:
        state_flight = region.atomics.load_acquire_u32(ring.state_flight)
        if state_flight & layout.RING_STATE_MASK != layout.RING_FREE or not state_flight >> 2:
            continue
        if drain:
            reset += _drain_free_ring(region, ring, state_flight) is not None
        elif region.atomics.cas_acq_rel_u32(ring.state_flight, state_flight, layout.RING_FREE) == state_flight:
            reset += 1
    return reset


def _drain_free_ring(region: Region, ring: RingAddresses, state_flight: int) -> list[int] | None:
    """Drain a Free ring seen as ``state_flight``: Draining with in_flight
    0 (nobody joins meanwhile), the teardown's drain over its whole window,
    then Free. Returns the slots its entries referenced; None if the ring
    changed meanwhile (left for the next call)."""
    ops = region.atomics
    if ops.cas_acq_rel_u32(ring.state_flight, state_flight, layout.RING_DRAINING) != state_flight:
        return None
    referenced = _referenced_slots_of(region, ring)  # what the drain gives back: nobody else changes them now
    rings.drain(region, ring, 0)
    ops.store_seq_cst_u32(ring.state_flight, layout.RING_FREE)
    return referenced


def drain_free_rings(region: Region, retired: bool = False) -> list[DrainedRing]:
    """Release the references that Free rings' entries still hold (beyond
    0.1.0; left by 0.1.0's reset_retired_rings, which does not drain): no
    publisher writes into a Free ring, so they would keep their slots until
    a subscriber joins it and publishers wrap over them. Safe under
    traffic: only rings with no publisher admitted (in_flight 0) are taken,
    unless ``retired`` (then Free rings with publishers in flight too, as
    reset_retired_rings(drain=True): only once those publishers are known
    to have stopped). Each ring is Draining with in_flight 0 while drained
    (nobody joins it), then Free. Returns each ring drained."""
    ops = region.atomics
    drained = []
    for ring in region.rings:
        state_flight = ops.load_acquire_u32(ring.state_flight)
        if state_flight & layout.RING_STATE_MASK != layout.RING_FREE or (state_flight >> 2 and not retired):
            continue
        if not state_flight >> 2 and not _referenced_slots_of(region, ring):
            continue  # nothing held: left as it is
        referenced = _drain_free_ring(region, ring, state_flight)
        if referenced is not None:
            drained.append(DrainedRing(ring.index, state_flight >> 2, referenced))
    return drained


def _referenced_slots_of(region: Region, ring: RingAddresses) -> list[int]:
    """The slot each committed entry of the ring's live window references."""
    ops = region.atomics
    slots = [
        ops.load_relaxed_u32(entry + layout.SLOT_IDX_OFFSET)
        for position, entry, sequence in live_window(region, ring) if sequence == position + 1
    ]
    return [slot for slot in slots if slot < region.geometry.pool_size]


def reclaim_dead_subscribers(region: Region) -> tuple[list[tuple[int, int]], list[int], list[int]]:
    """Leave, on their behalf, the rings whose subscriber died (beyond
    0.1.0): (ring, pid) of those reclaimed, the rings with no owner record,
    and those whose publishers stayed in flight (``SharedRegion.
    reclaim_dead_subscribers`` says more)."""
    reclaimed, unrecorded, timed_out = [], [], []
    sidecar = owners.Sidecar.open(region.name)
    for ring in region.rings:
        state = region.atomics.load_acquire_u32(ring.state_flight) & layout.RING_STATE_MASK
        if state not in (layout.RING_LIVE, layout.RING_DRAINING):  # Draining: its owner died leaving
            continue
        owner = sidecar.owner_if_dead(ring.index, region.header.created_at_ns) if sidecar else "unrecorded"
        if owner == "unrecorded":
            unrecorded.append(ring.index)
        elif isinstance(owner, owners.OwnerRecord):  # dead (else "alive")
            if rings.leave(region, ring, owner.start_pos, sidecar):
                reclaimed.append((ring.index, owner.pid))
            else:
                timed_out.append(ring.index)
    if sidecar:
        sidecar.close()
    return reclaimed, unrecorded, timed_out


def free_ring(region: Region, index: int) -> bool:
    """Free ring ``index`` although no record shows its owner dead (beyond
    0.1.0; ``SharedRegion.free_ring`` says when that is safe). Returns False
    if the ring was Free already."""
    if isinstance(index, bool) or not isinstance(index, int) or not 0 <= index < region.geometry.max_subs:
        raise ValueError(f"{region.name} has rings 0 to {region.geometry.max_subs - 1}, not {index!r}")
    ring = region.rings[index]
    state_flight = region.atomics.load_acquire_u32(ring.state_flight)
    if state_flight & layout.RING_STATE_MASK == layout.RING_FREE:
        if state_flight >> 2:
            raise RuntimeError(
                f"ring {index} of {region.name} is retired (Free, {state_flight >> 2} publisher(s) in flight): "
                f"reset_retired_rings (kickmsg repair --retired) resets it once the crashed publisher is gone"
            )
        return False
    sidecar = owners.Sidecar.open(region.name)
    try:
        owner = sidecar.owner_if_dead(index, region.header.created_at_ns) if sidecar else "unrecorded"
        if sidecar and owner == "alive":
            record = sidecar.record(index)  # None: its owner is writing it
            holder = f"live process {record.pid}" if record is not None else "a live process"
            raise RuntimeError(f"ring {index} of {region.name} is held by {holder} (its owner record is locked): not freed")
        if isinstance(owner, owners.OwnerRecord):
            freed = rings.leave(region, ring, owner.start_pos, sidecar)
        else:
            freed = rings.leave(region, ring, 0)
    finally:
        if sidecar:
            sidecar.close()
    if not freed:
        raise RuntimeError(
            f"ring {index} of {region.name}: publishers stayed in flight past commit_timeout, so it is left retired "
            f"(reset_retired_rings, kickmsg repair --retired, resets it once the crashed publisher is gone)"
        )
    return True


def referenced_slots(region: Region) -> set[int]:
    """The slot indices that committed entries in the rings' live windows
    name (read-only; the set ``reclaim_orphaned_slots`` keeps)."""
    ops = region.atomics
    referenced = set()
    for ring in region.rings:
        for position, entry, sequence in live_window(region, ring):
            if sequence >= position + 1 and sequence != layout.LOCKED_SEQUENCE:
                referenced.add(ops.load_relaxed_u32(entry + layout.SLOT_IDX_OFFSET))
    return referenced


def reclaim_orphaned_slots(region: Region) -> int:
    """Give back every slot with a refcount that no ring entry references
    (NOT safe under live traffic: ``SharedRegion.reclaim_orphaned_slots``
    says why). Returns the number of slots reclaimed."""
    ops = region.atomics
    referenced = referenced_slots(region)  # the slots committed entries of the live windows name
    reclaimed = 0
    for slot in range(region.geometry.pool_size):  # refcount > 0, not referenced: refcount = 0, treiber_push
        refcount_address = region.slot_addresses[slot] + layout.REFCOUNT_OFFSET
        if slot not in referenced and ops.load_acquire_u32(refcount_address) > 0:
            ops.store_release_u32(refcount_address, 0)
            freestack.push(region, slot)
            reclaimed += 1
    return reclaimed


# -- the schema descriptor -------------------------------------------------------------


def try_claim_schema(region: Region, info: SchemaInfo) -> bool:
    """Unset -> Claiming (CAS acq_rel), copy, Set (release). False when
    another claimant got there first; a loser that sees Claiming waits a
    bounded while for it to finish."""
    ops = region.atomics
    found = ops.cas_acq_rel_u32(region.schema_state_address, layout.SCHEMA_UNSET, layout.SCHEMA_CLAIMING)
    if found == layout.SCHEMA_UNSET:
        info.write_to(region.header.schema_data)
        ops.store_release_u32(region.schema_state_address, layout.SCHEMA_SET)
        return True
    for _ in range(SCHEMA_CLAIM_YIELDS):
        if ops.load_acquire_u32(region.schema_state_address) != layout.SCHEMA_CLAIMING:
            break
        os.sched_yield()
    return False


def reset_schema_claim(region: Region) -> bool:
    """Claiming -> Unset, to recover from a claimant that died mid-claim
    (only once the claimant is known to be gone)."""
    found = region.atomics.cas_acq_rel_u32(region.schema_state_address, layout.SCHEMA_CLAIMING, layout.SCHEMA_UNSET)
    return found == layout.SCHEMA_CLAIMING
