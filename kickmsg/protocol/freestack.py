"""The slot pool's free stack, both layouts: a lock-free Treiber stack
(seed 000 "free stack", WIRE9.md B.14).

``free_top`` packs ``generation << 32 | slot index``. Every pop and push bumps
the generation, so a CAS on a top that went away and came back fails (ABA).
Free slots are linked through their ``next_free`` words (slot + 4 in both
layouts); ``INVALID_SLOT`` ends the list. The steps and orders are the same
in layouts 4 and 9; one rule differs, and ``pop`` takes it explicitly: a
head index outside the pool is corrupt, which 0.1.0 (layout 4) reports and
0.9.2 (layout 9) reads as an empty pool.
"""
import errno
from collections.abc import Sequence
from typing import Protocol

from kickmsg.atomics import Atomics
from kickmsg.errors import PoolEmptyError
from kickmsg.protocol.common import INVALID_SLOT, U32_MAX, CorruptRegionError

__all__ = [
    "NEXT_FREE_OFFSET", "Pool", "PoolGeometry", "REFCOUNT_OFFSET", "count_free", "empty_pool_error", "pop", "push",
    "refcounts", "release_slot", "walk",
]

# SlotHeader.next_free and .refcount: the same offsets in both layouts.
REFCOUNT_OFFSET = 0
NEXT_FREE_OFFSET = 4


class PoolGeometry(Protocol):
    @property
    def pool_size(self) -> int: ...


class Pool(Protocol):
    """What the stack needs of a region (``SharedRegion``, ``v9.Region``)."""

    @property
    def atomics(self) -> Atomics: ...

    @property
    def free_top_address(self) -> int: ...

    @property
    def geometry(self) -> PoolGeometry: ...

    @property
    def name(self) -> str: ...

    @property
    def slot_addresses(self) -> Sequence[int]: ...  # each slot's address, computed once


def _next_top(top: int, slot: int) -> int:
    """``top`` with its generation bumped and ``slot`` as the new head."""
    generation = ((top >> 32) + 1) & U32_MAX
    return generation << 32 | slot


def pop(region: Pool, empty_on_corrupt_head: bool) -> int:
    """Take a free slot: its index, or ``INVALID_SLOT`` when the pool is
    empty. A head outside the pool raises ``CorruptRegionError``, or reads
    as an empty pool with ``empty_on_corrupt_head`` (layout 9, as 0.9.2)."""
    ops = region.atomics
    top = ops.load_acquire_u64(region.free_top_address)
    while True:
        head = top & U32_MAX
        if head == INVALID_SLOT:
            return INVALID_SLOT
        pool_size = region.geometry.pool_size
        if head >= pool_size:
            if empty_on_corrupt_head:
                return INVALID_SLOT
            raise CorruptRegionError(
                f"{region.name}: free_top holds slot index {head}, but the pool has {pool_size} slots"
            )
        # A stale head may already be reused and its link garbage; the CAS
        # below then fails on the generation, so only a link we install counts.
        next_slot = ops.load_relaxed_u32(region.slot_addresses[head] + NEXT_FREE_OFFSET)
        found = ops.cas_acq_rel_u64(region.free_top_address, top, _next_top(top, next_slot))
        if found == top:
            return head
        top = found


def empty_pool_error(region: Pool) -> PoolEmptyError:
    """The error of a ``send`` that found the pool empty (EAGAIN, as the
    native bindings' BlockingIOError). Why it is empty takes a look at the
    whole region, which the tool showing the error makes
    (``kickmsg.ops.audit.explain_empty_pool``)."""
    return PoolEmptyError(
        errno.EAGAIN, f"slot pool of {region.name} exhausted: all {region.geometry.pool_size} slots in use; try "
        f"again after subscribers drain (kickmsg audit {region.name} shows who holds them)"
    )


def push(region: Pool, slot: int) -> None:
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


def release_slot(region: Pool, slot: int, references: int = 1) -> None:
    """Drop ``references`` of ``slot``'s refcount (acq_rel); whoever drops
    it to zero pushes the slot back on the free stack."""
    previous = region.atomics.fetch_sub_acq_rel_u32(region.slot_addresses[slot] + REFCOUNT_OFFSET, references)
    if previous == references:
        push(region, slot)


def count_free(region: Pool) -> int:
    """Slots on the stack now (racy), walking at most pool_size links."""
    ops = region.atomics
    pool_size = region.geometry.pool_size
    slot = ops.load_acquire_u64(region.free_top_address) & U32_MAX
    count = 0
    while slot != INVALID_SLOT and slot < pool_size and count < pool_size:
        count += 1
        slot = ops.load_relaxed_u32(region.slot_addresses[slot] + NEXT_FREE_OFFSET)
    return count


def walk(region: Pool) -> tuple[list[int], str | None]:
    """The slots on the stack now, top first (acquire, racy; for the tools),
    and what stopped the walk short: a link out of the pool, or a slot
    reached twice (a cycle); None when it reached INVALID_SLOT."""
    ops = region.atomics
    pool_size = region.geometry.pool_size
    free: list[int] = []
    seen: set[int] = set()
    slot = ops.load_acquire_u64(region.free_top_address) & U32_MAX
    while slot != INVALID_SLOT:
        if slot >= pool_size:
            return free, f"link to slot {slot}, outside the pool of {pool_size}"
        if slot in seen:
            return free, f"cycle: slot {slot} is reached twice"
        free.append(slot)
        seen.add(slot)
        slot = ops.load_acquire_u32(region.slot_addresses[slot] + NEXT_FREE_OFFSET)
    return free, None


def refcounts(region: Pool) -> list[int]:
    """Every slot's refcount (acquire, racy; for the tools), in slot order."""
    ops = region.atomics
    return [ops.load_acquire_u32(address + REFCOUNT_OFFSET) for address in region.slot_addresses]
