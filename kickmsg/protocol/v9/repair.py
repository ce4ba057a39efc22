"""Operator calls on a layout-9 region (WIRE9.md B.13, B.16, B.17): health
report, repair of locked entries, retired and dead rings, orphaned slots,
and the schema claim. All of them walk the validated geometry snapshot;
``kickmsg.SharedRegion`` refuses them on a read-only region, then runs them here.
"""
import os

from kickmsg.protocol import freestack
from kickmsg.protocol.v9.layout import (
    HAS_WAITER_OFFSET,
    INVALID_SLOT,
    META_OFFSET,
    META_SLOT_MASK,
    NEXT_FREE_OFFSET,
    OWNER_PID_OFFSET,
    OWNER_STARTTIME_OFFSET,
    REFCOUNT_OFFSET,
    RING_DRAINING,
    RING_FREE,
    RING_LIVE,
    RING_RECLAIMING,
    RING_STATE_MASK,
    SCHEMA_CLAIMING,
    SCHEMA_DATA_OFFSET,
    SCHEMA_SET,
    SCHEMA_STATE_OFFSET,
    SCHEMA_UNSET,
    SEQUENCE_OFFSET,
    STATE_FLIGHT_OFFSET,
    U32_MAX,
    WRITE_POS_OFFSET,
    SchemaInfoLayout,
)
from kickmsg.protocol.v9.publish import steal_and_skip
from kickmsg.protocol.v9.region import Region
from kickmsg.protocol.v9.words import (
    meta_slot_field,
    seq_locked,
    seq_pos,
)
from kickmsg.protocol.info import DrainedRing, HealthCounts
from kickmsg.schema import SchemaInfo

__all__ = [
    "SCHEMA_WAIT_YIELDS", "dead_subscriber_rings", "diagnose", "drain_free_rings", "drain_window", "held_slots",
    "reclaim_dead_ring", "reclaim_dead_rings", "reclaim_dead_subscribers", "reclaim_orphaned_slots", "repair_locked_entries", "reset_retired_rings",
    "reset_schema_claim", "try_claim_schema",
]

SCHEMA_WAIT_YIELDS = 1024  # B.17


def _clear_owner(region: Region, ring: int) -> None:
    ops = region.atomics
    ops.store_relaxed_u32(ring + HAS_WAITER_OFFSET, 0)
    ops.store_relaxed_u64(ring + OWNER_PID_OFFSET, 0)
    ops.store_relaxed_u64(ring + OWNER_STARTTIME_OFFSET, 0)


def _ring_is_dead(region: Region, ring: int) -> bool:
    ops = region.atomics
    pid = ops.load_acquire_u64(ring + OWNER_PID_OFFSET)
    start = ops.load_relaxed_u64(ring + OWNER_STARTTIME_OFFSET)
    return region.owner_is_dead(pid, start)


def _window(region: Region, index: int) -> range:
    write_pos = region.atomics.load_acquire_u64(region.ring_address(index) + WRITE_POS_OFFSET)
    return range(max(0, write_pos - region.geometry.capacity), write_pos)


def _entry_is_locked(seq: int, pos: int, capacity: int) -> bool:
    """Locked, or more than one wrap stale."""
    return seq_locked(seq) or seq_pos(seq) + capacity < pos + 1


def _claimed_slots(region: Region, index: int) -> list[int]:
    """The slot each entry of ring ``index`` claims (its valid claims)."""
    ops = region.atomics
    g = region.geometry
    fields = [
        meta_slot_field(ops.load_acquire_u64(region.entry_address(index, pos) + META_OFFSET)) for pos in range(g.capacity)
    ]
    return [field - 1 for field in fields if 0 < field <= g.pool_size]


# -- B.13 diagnose ---------------------------------------------------------------


def diagnose(region: Region) -> HealthCounts:
    ops = region.atomics
    g = region.geometry
    locked = retired = draining = live = dead = 0
    for index in range(g.max_subs):
        ring = region.ring_address(index)
        for pos in _window(region, index):
            if _entry_is_locked(ops.load_acquire_u64(region.entry_address(index, pos) + SEQUENCE_OFFSET), pos, g.capacity):
                locked += 1
        state_flight = ops.load_acquire_u32(ring + STATE_FLIGHT_OFFSET)
        state, in_flight = state_flight & RING_STATE_MASK, state_flight >> 2
        if state == RING_LIVE:
            live += 1
        elif state == RING_FREE and in_flight:
            retired += 1
        elif state == RING_DRAINING and in_flight:
            draining += 1
        if state in (RING_LIVE, RING_DRAINING, RING_RECLAIMING) and _ring_is_dead(region, ring):
            dead += 1
    schema_stuck = ops.load_acquire_u32(region.base + SCHEMA_STATE_OFFSET) == SCHEMA_CLAIMING
    in_live, stranded = held_slots(region)
    return HealthCounts(locked, retired, draining, live, schema_stuck, dead, len(stranded), len(in_live))


def held_slots(region: Region) -> tuple[set[int], set[int]]:
    """The slots Live rings claim, and those only rings that are not Live
    claim (stranded; read-only, our extension): no publisher replaces
    those claims, so nothing gives the slots back until ``drain_free_rings``
    (or a join and a wrap)."""
    in_live: set[int] = set()
    elsewhere: set[int] = set()
    for index in range(region.geometry.max_subs):
        state = region.atomics.load_acquire_u32(region.ring_address(index) + STATE_FLIGHT_OFFSET) & RING_STATE_MASK
        (in_live if state == RING_LIVE else elsewhere).update(_claimed_slots(region, index))
    return in_live, elsewhere - in_live


def dead_subscriber_rings(region: Region) -> list[tuple[int, int]]:
    """(ring, pid) of each Live, Draining or Reclaiming ring whose recorded
    owner (the ring header's pid and start time, B.16) is dead."""
    ops = region.atomics
    dead = []
    for index, ring in enumerate(region.ring_addresses):
        state = ops.load_acquire_u32(ring + STATE_FLIGHT_OFFSET) & RING_STATE_MASK
        if state in (RING_LIVE, RING_DRAINING, RING_RECLAIMING) and _ring_is_dead(region, ring):
            dead.append((index, ops.load_acquire_u64(ring + OWNER_PID_OFFSET)))
    return dead


# -- B.13 repair_locked_entries -------------------------------------------------------


def repair_locked_entries(region: Region) -> int:
    """Steal every lock that stays the same for a whole commit timeout, and
    every entry more than one wrap stale, into skip markers. Returns how
    many entries were repaired."""
    ops = region.atomics
    g = region.geometry
    repaired = 0
    candidates: list[tuple[int, int, int]] = []  # (entry, pos, sequence seen)
    for index in range(g.max_subs):
        for pos in _window(region, index):
            entry = region.entry_address(index, pos)
            seq = ops.load_acquire_u64(entry + SEQUENCE_OFFSET)
            if seq_locked(seq):
                candidates.append((entry, pos, seq))
            elif seq_pos(seq) + g.capacity < pos + 1:  # stale: at once
                repaired += int(steal_and_skip(region, entry, seq, pos))
    if candidates:
        region.sleep_ns(g.commit_timeout_us * 1000)  # B.13: one commit timeout, then only unchanged locks
        for entry, pos, seq in candidates:
            if ops.load_acquire_u64(entry + SEQUENCE_OFFSET) == seq:
                repaired += int(steal_and_skip(region, entry, seq, pos))
    return repaired


# -- B.13 reset_retired_rings ---------------------------------------------------------


def reset_retired_rings(region: Region, drain: bool = False) -> int:
    """Free rings still counting admitted publishers become claimable again.
    Only safe once those publishers are known to have stopped.

    ``drain`` (our extension, as on layout 4) also does the drain the
    timed-out leave skipped (B.12), over the ring's whole window: the
    references its entries still hold go back to the pool instead of
    waiting for publishers to replace them. The ring is Draining meanwhile,
    so nobody joins it; each claim is given back by the one CAS that zeroes
    its slot field, so a publisher's takeover never releases it twice."""
    ops = region.atomics
    reset = 0
    for index in range(region.geometry.max_subs):
        ring = region.ring_address(index)
        address = ring + STATE_FLIGHT_OFFSET
        state_flight = ops.load_acquire_u32(address)
        if state_flight & RING_STATE_MASK != RING_FREE or not state_flight >> 2:
            continue
        if not drain:
            _clear_owner(region, ring)
            ops.store_release_u32(address, RING_FREE)
            reset += 1
            continue
        if _drain_free_ring(region, index, state_flight) is not None:
            reset += 1
    return reset


def _drain_free_ring(region: Region, index: int, state_flight: int) -> list[int] | None:
    """Drain Free ring ``index``, seen as ``state_flight``: Draining with
    in_flight 0 (nobody joins while we drain), its owner cleared, every
    claim of its window given back, then Free: the bytes of a leave.
    Returns the slots its claims held; None if the ring changed meanwhile
    (left for the next call)."""
    ops = region.atomics
    ring = region.ring_address(index)
    address = ring + STATE_FLIGHT_OFFSET
    # CAS(strong, acq_rel) to Draining with in_flight 0
    if ops.cas_acq_rel_u32(address, state_flight, RING_DRAINING) != state_flight:
        return None
    _clear_owner(region, ring)
    claimed = _claimed_slots(region, index)  # what the drain gives back: nobody else changes them now
    drain_window(region, index)
    ops.store_release_u32(address, RING_FREE)
    return claimed


def drain_window(region: Region, index: int, start_pos: int = 0) -> int:
    """B.12's drain of ring ``index``: give back every valid claim in
    [max(wp - capacity, start_pos), wp), whatever the sequence or tag
    says; the tag stays. ``start_pos``: the leaving owner's (0: the whole
    window, for a ring left on another's behalf). Returns how many claims
    it gave back."""
    ops = region.atomics
    released = 0
    g = region.geometry
    # wp = write_pos (acq) (0: an empty window)
    write_pos = ops.load_acquire_u64(region.ring_address(index) + WRITE_POS_OFFSET)
    for pos in range(max(write_pos - g.capacity, start_pos), write_pos):
        entry = region.entry_address(index, pos)
        # m = meta (acq); skip if the slot field is 0 or out of range
        meta = ops.load_acquire_u64(entry + META_OFFSET)
        field = meta_slot_field(meta)
        if field == 0 or field - 1 >= g.pool_size:
            continue
        # CAS(strong, acq_rel) m -> m with the slot field zeroed; on success release the slot
        if ops.cas_acq_rel_u64(entry + META_OFFSET, meta, meta & ~META_SLOT_MASK) == meta:
            freestack.release_slot(region, field - 1)
            released += 1
    return released


# -- drain_free_rings (our extension) -----------------------------------------------------


def drain_free_rings(region: Region, retired: bool = False) -> list[DrainedRing]:
    """Give back the claims that Free rings still hold (left by 0.9.2's
    reclaim_dead_rings and reset_retired_rings, which do not drain): no
    publisher replaces a Free ring's claims, so they would keep their slots
    for good. Safe under traffic: only rings with no publisher admitted
    (in_flight 0) are taken, unless ``retired`` (then Free rings with
    publishers in flight too, as reset_retired_rings(drain=True): only once
    those publishers are known to have stopped). Each ring is Draining with
    in_flight 0 while drained (nobody joins it), then Free: the bytes of a
    leave. Returns each ring drained."""
    ops = region.atomics
    drained = []
    for index in range(region.geometry.max_subs):
        ring = region.ring_address(index)
        address = ring + STATE_FLIGHT_OFFSET
        state_flight = ops.load_acquire_u32(address)
        if state_flight & RING_STATE_MASK != RING_FREE or (state_flight >> 2 and not retired):
            continue
        if not state_flight >> 2 and not _claimed_slots(region, index):
            continue  # nothing held: left as it is
        claimed = _drain_free_ring(region, index, state_flight)
        if claimed is not None:  # (None: joined meanwhile, or a publisher's admission attempt)
            drained.append(DrainedRing(index, state_flight >> 2, claimed))
    return drained


# -- B.13 reclaim_dead_rings (ours: a leave on the dead owner's behalf) -------------------------


def reclaim_dead_rings(region: Region) -> int:
    """Leave, on their behalf, the rings whose owner is provably dead
    (B.16): ``reclaim_dead_ring`` on each ring. Returns how many rings
    were taken from dead owners."""
    reclaimed = 0
    for index in range(region.geometry.max_subs):
        reclaimed += reclaim_dead_ring(region, index) is not None
    return reclaimed


def reclaim_dead_subscribers(
    region: Region,
) -> tuple[list[tuple[int, int]], list[int], list[int], dict[int, int]]:
    """``reclaim_dead_ring`` on each ring ``dead_subscriber_rings`` names:
    (ring, pid) of those reclaimed, the unrecorded rings (none: every
    subscriber records itself in its ring's header), those whose publishers
    stayed in flight (left retired), and the claims each ring gave back."""
    reclaimed: list[tuple[int, int]] = []
    timed_out: list[int] = []
    claims_given_back: dict[int, int] = {}
    for index, pid in dead_subscriber_rings(region):
        left = reclaim_dead_ring(region, index)
        if left is None:
            continue  # taken by another reclaimer meanwhile
        quiesced, claims_given_back[index] = left
        if quiesced:
            reclaimed.append((index, pid))
        else:
            timed_out.append(index)
    return reclaimed, [], timed_out, claims_given_back


def reclaim_dead_ring(region: Region, index: int) -> tuple[bool, int] | None:
    """Leave ring ``index`` on its dead owner's behalf, with the bytes of
    its own leave (B.12): Draining, wait for admitted publishers, drain
    every claim in the window, Free (retired if publishers stayed in
    flight). Returns whether it quiesced (else it is retired) and how many
    claims went back to the pool; None if the ring was not taken (not a
    dead owner's, or taken by someone else).

    0.9.2 takes Reclaiming rings at once, so two reclaimers can evict a
    live owner (docs/WIRE9-NOTES.md note 17). Here the ring is taken by
    one CAS of its owner_pid from the dead pid to 0: only one reclaimer
    wins it, none can take it from a ring that changed hands, and nobody
    takes it after (pid 0 is never dead). A Reclaiming ring (a native
    reclaimer's) is taken only once it stayed Reclaiming, with the same
    dead owner, for a whole commit timeout (its reclaimer crashed)."""
    ops = region.atomics
    ring = region.ring_address(index)
    address = ring + STATE_FLIGHT_OFFSET
    # 1. a Live, Draining or Reclaiming ring with a provably dead owner
    state = ops.load_acquire_u32(address) & RING_STATE_MASK
    if state not in (RING_LIVE, RING_DRAINING, RING_RECLAIMING):
        return None
    pid = ops.load_acquire_u64(ring + OWNER_PID_OFFSET)
    start = ops.load_relaxed_u64(ring + OWNER_STARTTIME_OFFSET)
    if not region.owner_is_dead(pid, start):
        return None
    # 2. Reclaiming: another reclaimer's, unless it stays so for a whole commit timeout
    if state == RING_RECLAIMING:
        region.sleep_ns(region.geometry.commit_timeout_us * 1000)
        if (ops.load_acquire_u32(address) & RING_STATE_MASK != RING_RECLAIMING
                or ops.load_relaxed_u64(ring + OWNER_STARTTIME_OFFSET) != start):
            return None
    # 3. take it: CAS(strong, acq_rel) owner_pid from the dead pid to 0
    if ops.cas_acq_rel_u64(ring + OWNER_PID_OFFSET, pid, 0) != pid:
        return None
    # 4. Draining, keeping in_flight (CAS loop, acq_rel): nobody is admitted or joins
    state_flight = ops.load_relaxed_u32(address)
    while True:
        if state_flight & RING_STATE_MASK == RING_FREE:
            return None  # freed meanwhile: only a native reclaimer does that (docs: crash model)
        found = ops.cas_acq_rel_u32(address, state_flight, (state_flight & ~RING_STATE_MASK) | RING_DRAINING)
        if found == state_flight:
            break
        state_flight = found
    # 5. wait for in_flight = 0, at most one commit timeout (B.12 2)
    deadline = region.monotonic_ns() + region.geometry.commit_timeout_us * 1000
    quiesced = True
    while ops.load_acquire_u32(address) >> 2:
        if region.monotonic_ns() >= deadline:
            quiesced = False
            break
        os.sched_yield()
    # 6. clear the rest of the owner (B.12 3)
    ops.store_relaxed_u32(ring + HAS_WAITER_OFFSET, 0)
    ops.store_relaxed_u64(ring + OWNER_STARTTIME_OFFSET, 0)
    # 7. drain and free (release), or leave it retired (B.12 4)
    if not quiesced:
        state_flight = ops.load_acquire_u32(address)
        while True:
            found = ops.cas_acq_rel_u32(address, state_flight, (state_flight & ~RING_STATE_MASK) | RING_FREE)
            if found == state_flight:
                return False, 0
            state_flight = found
    released = drain_window(region, index)
    ops.store_release_u32(address, RING_FREE)
    return True, released


# -- B.13 reclaim_orphaned_slots (0.9.2: claim counting) ----------------------------------


def reclaim_orphaned_slots(region: Region) -> int:
    """Give every slot that is neither on the free stack nor claimed by any
    entry back to the pool, and reset every claimed slot's refcount to its
    number of claims. Requires that no publisher runs and no view is held.
    Returns the number of slots pushed."""
    ops = region.atomics
    g = region.geometry
    claims = [0] * g.pool_size
    for index in range(g.max_subs):
        for slot in _claimed_slots(region, index):
            claims[slot] += 1
    on_stack = [False] * g.pool_size
    slot = ops.load_acquire_u64(region.free_top_address) & U32_MAX
    steps = 0
    while slot != INVALID_SLOT and slot < g.pool_size and steps < g.pool_size:
        on_stack[slot] = True
        steps += 1
        slot = ops.load_relaxed_u32(region.slot_address(slot) + NEXT_FREE_OFFSET)
    pushed = 0
    for slot in range(g.pool_size):
        if on_stack[slot]:
            continue
        refcount_address = region.slot_address(slot) + REFCOUNT_OFFSET
        if claims[slot] == 0:
            ops.store_release_u32(refcount_address, 0)
            freestack.push(region, slot)
            pushed += 1
        else:
            ops.store_release_u32(refcount_address, min(claims[slot], U32_MAX))
    return pushed


# -- B.17 Schema claim and reset ---------------------------------------------------------------


def try_claim_schema(region: Region, info: SchemaInfo) -> bool:
    """Unset -> Claiming -> copy -> Set (release). False if someone else
    holds or held the claim (after waiting a little while it is Claiming)."""
    ops = region.atomics
    address = region.base + SCHEMA_STATE_OFFSET
    found = ops.cas_acq_rel_u32(address, SCHEMA_UNSET, SCHEMA_CLAIMING)
    if found == SCHEMA_UNSET:
        info.write_to(SchemaInfoLayout.from_buffer(region.mapping.buffer, SCHEMA_DATA_OFFSET))
        ops.store_release_u32(address, SCHEMA_SET)
        return True
    for _ in range(SCHEMA_WAIT_YIELDS):
        if found != SCHEMA_CLAIMING:
            break
        os.sched_yield()
        found = ops.load_acquire_u32(address)
    return False


def reset_schema_claim(region: Region) -> bool:
    """Claiming -> Unset (a claimer died mid-copy); True only if it was Claiming."""
    address = region.base + SCHEMA_STATE_OFFSET
    return region.atomics.cas_acq_rel_u32(address, SCHEMA_CLAIMING, SCHEMA_UNSET) == SCHEMA_CLAIMING

