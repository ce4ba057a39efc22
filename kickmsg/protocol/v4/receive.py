"""Receiving on a layout-4 region (seed 000 "Subscriber").

Each subscriber reads its own ring. Its read position is private to the
process (a ``Cursor``); publishers write, the subscriber only reads
entries and pins or releases slot references. ``pin_next`` is receive
steps 1-3: it finds the next committed entry and pins its slot;
``kickmsg.Subscriber`` copies the payload and unpins it
(``try_receive``), or hands out a view that unpins it when released
(``try_receive_view``).
"""
from dataclasses import dataclass

from kickmsg.protocol import freestack
from kickmsg.protocol.v4.layout import (
    LOCKED_SEQUENCE,
    PAYLOAD_LEN_OFFSET,
    REFCOUNT_OFFSET,
    SEQUENCE_OFFSET,
    SLOT_IDX_OFFSET,
    U32_MAX,
)
from kickmsg.protocol.v4.region import Region, RingAddresses

__all__ = ["Cursor", "MAX_RECEIVE_ATTEMPTS", "pin_next"]

MAX_RECEIVE_ATTEMPTS = 64  # entries a single try_receive may skip as lost


@dataclass(slots=True)
class Cursor:
    """A subscriber's place in its ring, process-local (seed 000: read_pos_, lost_)."""

    read_pos: int = 0  # the next position to read
    lost: int = 0  # messages missed: overwritten before read, or unreadable
    write_pos_seen: int = 0  # the ring's write_pos when last looked at (what a re-create in place would take)


def pin_next(region: Region, ring: RingAddresses, cursor: Cursor) -> tuple[int, int, int] | None:
    """Receive flow, steps 1-3: find the next committed entry of ``ring``
    and pin its slot. Returns (slot, payload length, ring position)."""
    ops = region.atomics
    geometry = region.geometry
    capacity, mask = geometry.capacity, geometry.mask
    for _ in range(MAX_RECEIVE_ATTEMPTS):
        # 1. Anything new? If the ring lapped us, skip to its oldest entry.
        write_pos = ops.load_acquire_u64(ring.write_pos)
        if write_pos - cursor.read_pos > capacity:
            cursor.lost += write_pos - capacity - cursor.read_pos
            cursor.read_pos = write_pos - capacity
        if cursor.read_pos >= write_pos:
            return None
        cursor.write_pos_seen = write_pos  # what a re-create in place would take from us
        # 2. Read the entry's sequence (acquire); it must be read_pos + 1.
        entry = ring.entries[cursor.read_pos & mask]
        expected = cursor.read_pos + 1
        sequence = ops.load_acquire_u64(entry + SEQUENCE_OFFSET)
        if sequence == LOCKED_SEQUENCE or sequence < expected:
            return None  # claimed but not committed yet: come back later
        if sequence > expected:
            cursor.lost += 1  # overwritten before we got to it
            cursor.read_pos += 1
            continue
        # 3. Read slot index and length; an impossible entry counts as lost.
        #    Acquire, not the spec's relaxed: to see their writer's lock (docs/explanation/verification.md: "a seqlock re-check that reads the past").
        slot = ops.load_acquire_u32(entry + SLOT_IDX_OFFSET)
        length = ops.load_acquire_u32(entry + PAYLOAD_LEN_OFFSET)
        if slot >= geometry.pool_size or length > geometry.slot_data_size:
            cursor.lost += 1
            cursor.read_pos += 1
            continue
        # Pin: refcount rc -> rc + 1, only while rc > 0 (0: freed meanwhile;
        # a saturated count can only be corruption).
        refcount_address = region.slot_addresses[slot] + REFCOUNT_OFFSET
        refcount = ops.load_relaxed_u32(refcount_address)
        pinned = False
        while 0 < refcount < U32_MAX:
            found = ops.cas_acq_rel_u32(refcount_address, refcount, refcount + 1)
            if found == refcount:
                pinned = True
                break
            refcount = found
        if not pinned:
            cursor.lost += 1
            cursor.read_pos += 1
            continue
        # Seqlock re-check: if the entry changed after we pinned, the slot
        # may hold another message by now.
        if ops.load_acquire_u64(entry + SEQUENCE_OFFSET) != sequence:
            freestack.release_slot(region, slot)
            cursor.lost += 1
            cursor.read_pos += 1
            continue
        ring_pos = cursor.read_pos
        cursor.read_pos += 1
        return slot, length, ring_pos
    return None
