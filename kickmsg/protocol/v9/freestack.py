"""The slot pool's free stack in layout 9 (WIRE9.md B.14).

The same Treiber stack as layout 4 (``kickmsg.treiber``: ``free_top`` packs
``generation << 32 | slot index``, links in ``next_free`` at slot + 4, the
same orders), with one difference of behaviour: a corrupt head index
(>= pool_size) reads as an empty pool, as 0.9.2 does, where layout 4 raises.
It is written against ``Region`` and its validated geometry.
"""
from typing import TYPE_CHECKING

from kickmsg.protocol.v9.layout import INVALID_SLOT, NEXT_FREE_OFFSET, REFCOUNT_OFFSET, U32_MAX

if TYPE_CHECKING:  # region.py imports this module
    from kickmsg.protocol.v9.region import Region


def _next_top(top: int, slot: int) -> int:
    """``top`` with its generation bumped and ``slot`` as the new head."""
    return (((top >> 32) + 1) & U32_MAX) << 32 | slot


def pop(region: "Region") -> int:
    """Take a free slot: its index, or ``INVALID_SLOT`` when the pool is
    empty or its head is out of range."""
    ops = region.atomics
    top = ops.load_acquire_u64(region.free_top_address)
    while True:
        head = top & U32_MAX
        if head == INVALID_SLOT or head >= region.geometry.pool_size:
            return INVALID_SLOT
        next_slot = ops.load_relaxed_u32(region.slot_address(head) + NEXT_FREE_OFFSET)
        found = ops.cas_acq_rel_u64(region.free_top_address, top, _next_top(top, next_slot))
        if found == top:
            return head
        top = found


def push(region: "Region", slot: int) -> None:
    """Give ``slot`` back to the pool (its refcount is already 0)."""
    ops = region.atomics
    next_free_address = region.slot_address(slot) + NEXT_FREE_OFFSET
    top = ops.load_relaxed_u64(region.free_top_address)
    while True:
        ops.store_relaxed_u32(next_free_address, top & U32_MAX)
        found = ops.cas_release_u64(region.free_top_address, top, _next_top(top, slot))
        if found == top:
            return
        top = found


def release(region: "Region", slot: int, references: int = 1) -> None:
    """Drop ``references`` of ``slot``'s refcount (acq_rel); whoever drops
    it to zero pushes the slot."""
    previous = region.atomics.fetch_sub_acq_rel_u32(region.slot_address(slot) + REFCOUNT_OFFSET, references)
    if previous == references:
        push(region, slot)


def count_free(region: "Region") -> int:
    """Slots on the stack now (racy), walking at most pool_size links."""
    ops = region.atomics
    pool_size = region.geometry.pool_size
    slot = ops.load_acquire_u64(region.free_top_address) & U32_MAX
    count = 0
    while slot != INVALID_SLOT and slot < pool_size and count < pool_size:
        count += 1
        slot = ops.load_relaxed_u32(region.slot_address(slot) + NEXT_FREE_OFFSET)
    return count
