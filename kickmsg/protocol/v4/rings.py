"""A subscriber ring's lifecycle on a layout-4 region (seed 000: joining a
ring, "~Subscriber()" and drain_unconsumed).

``join`` claims a Free ring (Free -> Live); ``leave`` is the teardown
(Live -> Draining, wait for in_flight 0, ``drain``, -> Free). A ring left
while publishers stay in flight past commit_timeout is retired (Free with
in_flight > 0) until ``kickmsg.protocol.v4.repair.reset_retired_rings``.
``kickmsg.Subscriber`` joins and leaves through these; the repairs leave
rings on behalf of dead subscribers through ``leave`` too.
"""
import os
import time

from kickmsg import owners
from kickmsg.protocol import freestack
from kickmsg.protocol.v4 import layout
from kickmsg.protocol.v4.layout import RING_FREE, RING_LIVE
from kickmsg.protocol.v4.region import Region, RingAddresses

__all__ = ["drain", "join", "leave", "set_state"]


def join(region: Region) -> tuple[RingAddresses, int] | None:
    """Subscriber join: CAS the first Free ring to Live, expecting exactly
    Free | in_flight 0 (a retired ring stays retired). Returns the ring and
    the start position; None if no ring is Free."""
    ops = region.atomics
    for index in range(region.geometry.max_subs):  # not region.rings: no address of the rings after ours is needed
        ring = region.ring(index)
        # Ordering invariant: capture write_pos BEFORE going Live: once Live,
        # publishers claim positions at once, and the drain window
        # [start_pos, write_pos) must cover every one of them.
        start_pos = ops.load_acquire_u64(ring.write_pos)
        if ops.cas_acq_rel_u32(ring.state_flight, RING_FREE, RING_LIVE) == RING_FREE:
            return ring, start_pos
    return None


def leave(region: Region, ring: RingAddresses, start_pos: int, sidecar: owners.Sidecar | None = None) -> bool:
    """Subscriber teardown (~Subscriber()): stop admissions, wait for
    in-flight publishers, drain the ring's references, free the ring. Returns False if the
    publishers in flight did not finish within commit_timeout: the drain
    is then skipped and the ring left retired.

    ``sidecar`` (beyond 0.1.0) holds the ring's owner record; it is
    cleared before the ring is freed, so that it never outlives the
    ownership it records.
    """
    ops = region.atomics
    # 1. State -> Draining, keeping in_flight: publishers are no longer admitted.
    set_state(region, ring, layout.RING_DRAINING)
    # 2. Wait, yielding, up to commit_timeout for in_flight to reach 0.
    deadline = time.monotonic_ns() + region.geometry.commit_timeout_us * 1000
    while ops.load_acquire_u32(ring.state_flight) >> 2:
        if time.monotonic_ns() >= deadline:
            # A publisher likely died while admitted. Draining now could
            # race a slow but alive one, so skip it: state -> Free keeping
            # in_flight, which leaves the ring retired until an operator
            # calls reset_retired_rings().
            if sidecar:
                sidecar.release(ring.index)
            set_state(region, ring, layout.RING_FREE)
            return False
        os.sched_yield()
    # 3. Quiesced, write_pos is final: drain_unconsumed [max(wp - capacity, start_pos), wp).
    drain(region, ring, start_pos)
    if sidecar:
        sidecar.release(ring.index)
    # 4. Free | in_flight 0: the ring is ready for a new subscriber.
    ops.store_seq_cst_u32(ring.state_flight, layout.RING_FREE)
    return True


def set_state(region: Region, ring: RingAddresses, state: int) -> None:
    """Replace the state bits of ``state_flight``, keeping in_flight (CAS seq_cst)."""
    ops = region.atomics
    state_flight = ops.load_relaxed_u32(ring.state_flight)
    while True:
        desired = (state_flight & ~layout.RING_STATE_MASK) | state
        found = ops.cas_seq_cst_u32(ring.state_flight, state_flight, desired)
        if found == state_flight:
            return
        state_flight = found


def drain(region: Region, ring: RingAddresses, start_pos: int) -> None:
    """drain_unconsumed: release the ring's reference to every committed entry of
    [max(write_pos - capacity, start_pos), write_pos) and mark each
    INVALID_SLOT, so a later eviction does not release it again.

    Only while no publisher is admitted to the ring (its state is not Live
    and in_flight is 0): write_pos is then final.
    """
    ops = region.atomics
    write_pos = ops.load_acquire_u64(ring.write_pos)
    for position in range(max(write_pos - region.geometry.capacity, start_pos), write_pos):
        entry = ring.entries[position & region.geometry.mask]
        if ops.load_acquire_u64(entry + layout.SEQUENCE_OFFSET) != position + 1:
            continue  # evicted, uncommitted or locked: skip
        slot = ops.load_relaxed_u32(entry + layout.SLOT_IDX_OFFSET)
        if slot < region.geometry.pool_size:
            freestack.release_slot(region, slot)
            ops.store_seq_cst_u32(entry + layout.SLOT_IDX_OFFSET, layout.INVALID_SLOT)
