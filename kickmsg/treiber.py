"""The slot pool's free stack: a lock-free Treiber stack.

``free_top`` packs ``generation << 32 | slot index``. Every pop and push bumps
the generation, so a CAS on a top that went away and came back fails (ABA).
Free slots are linked through their ``next_free`` words; ``INVALID_SLOT``
ends the list.
"""
from typing import TYPE_CHECKING

from kickmsg.layout import INVALID_SLOT, NEXT_FREE_OFFSET, REFCOUNT_OFFSET, U32_MAX

if TYPE_CHECKING:  # region.py imports this module
    from kickmsg.region import SharedRegion


def _next_top(top: int, slot: int) -> int:
    """``top`` with its generation bumped and ``slot`` as the new head."""
    generation = ((top >> 32) + 1) & U32_MAX
    return generation << 32 | slot


def pop(region: "SharedRegion") -> int:
    """Take a free slot: its index, or ``INVALID_SLOT`` when the pool is empty."""
    ops = region.atomics
    top = ops.load_acquire_u64(region.free_top_address)
    while True:
        head = top & U32_MAX
        if head == INVALID_SLOT:
            return INVALID_SLOT
        region.check_slot_index(head, "free_top")
        # A stale head may already be reused and its link garbage; the CAS
        # below then fails on the generation, so only a link we install counts.
        next_slot = ops.load_relaxed_u32(region.slot_addresses[head] + NEXT_FREE_OFFSET)
        found = ops.cas_acq_rel_u64(region.free_top_address, top, _next_top(top, next_slot))
        if found == top:
            return head
        top = found


def push(region: "SharedRegion", slot: int) -> None:
    """Give ``slot`` back to the pool (its refcount is already 0)."""
    ops = region.atomics
    next_free_address = region.slot_addresses[slot] + NEXT_FREE_OFFSET
    top = ops.load_relaxed_u64(region.free_top_address)
    while True:
        ops.store_relaxed_u32(next_free_address, top & U32_MAX)
        found = ops.cas_release_u64(region.free_top_address, top, _next_top(top, slot))
        if found == top:
            return
        top = found


def release_slot(region: "SharedRegion", slot: int, references: int = 1) -> None:
    """Drop ``references`` of ``slot``'s refcount; whoever drops it to zero
    pushes the slot back on the free stack."""
    previous = region.atomics.fetch_sub_acq_rel_u32(region.slot_addresses[slot] + REFCOUNT_OFFSET, references)
    if previous == references:
        push(region, slot)


def count_free(region: "SharedRegion") -> int:
    """Slots on the stack now (racy), walking at most pool_size links."""
    ops = region.atomics
    pool_size = region.geometry.pool_size
    slot = ops.load_acquire_u64(region.free_top_address) & U32_MAX
    count = 0
    while slot != INVALID_SLOT and slot < pool_size and count < pool_size:
        count += 1
        slot = ops.load_relaxed_u32(region.slot_addresses[slot] + NEXT_FREE_OFFSET)
    return count
