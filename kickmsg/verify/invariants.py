"""The protocol's invariants, checked between any two steps and at the end.

Read straight from the region's memory (with the hardware atomics, outside
the schedule):

1. The free stack has no cycle or duplicate and links only to slots of the
   pool; every slot on it has refcount 0.
2. Every slot named by a committed entry of a Live ring (the entry holds
   that ring's reference) is off the free stack, and its refcount is at
   least the number of such entries naming it. (Pins and publishers in the
   middle of publishing only add to it.)
3. Every message a subscriber received is the one committed at that ring
   position (the explorer notes each commit as it happens), and none came
   twice or out of one publisher's order.
4. At the end, with every actor done, every ring is Free with nobody in
   flight, and the pool is whole: every slot on the free stack, refcount 0.

Together: a slot is free, or being written by one publisher, or referenced
by as many entries and pins as its refcount allows; no reference is lost
(4) and none is released early (1, 2, 3).
"""
import struct

from kickmsg import layout
from kickmsg.atomics import HARDWARE as ops

MESSAGE = struct.Struct("<HHI")  # publisher, sequence, check


def message(publisher: int, sequence: int, size: int) -> bytes:
    """The payload publisher ``publisher`` sends as its ``sequence``-th message."""
    check = (publisher * 7919 + sequence * 104729 + 1) & 0xFFFFFFFF
    return MESSAGE.pack(publisher, sequence, check).ljust(size, bytes([sequence & 0xFF]))


def _free_stack(region) -> tuple[list[int], str | None]:
    slots, seen = [], set()
    slot = ops.load_acquire_u64(region.free_top_address) & layout.U32_MAX
    while slot != layout.INVALID_SLOT:
        if slot >= region.geometry.pool_size:
            return slots, f"the free stack links to slot {slot}, outside the pool"
        if slot in seen:
            return slots, f"the free stack reaches slot {slot} twice (a cycle)"
        seen.add(slot)
        slots.append(slot)
        slot = ops.load_acquire_u32(region.slot_address(slot) + layout.NEXT_FREE_OFFSET)
    return slots, None


def _refcount(region, slot: int) -> int:
    return ops.load_acquire_u32(region.slot_address(slot) + layout.REFCOUNT_OFFSET)


def memory_violation(region) -> str | None:
    """Invariants 1 and 2, between any two steps."""
    free, problem = _free_stack(region)
    if problem:
        return problem
    for slot in free:
        if _refcount(region, slot):
            return f"slot {slot} is on the free stack with refcount {_refcount(region, slot)}"
    free = set(free)
    held = {}
    for ring in region.rings:
        if ops.load_acquire_u32(ring.state_flight) & layout.RING_STATE_MASK != layout.RING_LIVE:
            continue
        write_pos = ops.load_acquire_u64(ring.write_pos)
        for position in range(max(0, write_pos - region.geometry.capacity), write_pos):
            entry = region.entry_address(ring, position)
            if ops.load_acquire_u64(entry + layout.SEQUENCE_OFFSET) != position + 1:
                continue
            slot = ops.load_acquire_u32(entry + layout.SLOT_IDX_OFFSET)
            if slot < region.geometry.pool_size:
                held[slot] = held.get(slot, 0) + 1
                if slot in free:
                    return f"slot {slot} is on the free stack but ring {ring.index} position {position} still holds it"
    for slot, entries in held.items():
        if _refcount(region, slot) < entries:
            return f"slot {slot} has refcount {_refcount(region, slot)} but {entries} committed entries hold it"
    return None


def committed_message(region, address: int, value: int) -> tuple[tuple[int, int], bytes | None] | None:
    """If a store of ``value`` at ``address`` committed an entry, its (ring,
    position) and the message then in its slot (None for an empty commit)."""
    g = region.geometry
    offset = address - region.mapping.address - g.sub_rings_offset
    if not 0 <= offset < g.max_subs * g.ring_stride or value == layout.LOCKED_SEQUENCE:
        return None
    ring, within = divmod(offset, g.ring_stride)
    if within < layout.RING_HEADER_SIZE or (within - layout.RING_HEADER_SIZE) % layout.ENTRY_SIZE != layout.SEQUENCE_OFFSET:
        return None
    entry = address - layout.SEQUENCE_OFFSET
    slot = ops.load_acquire_u32(entry + layout.SLOT_IDX_OFFSET)
    if slot >= g.pool_size:
        return (ring, value - 1), None
    start = region.payload_offset(slot)
    length = ops.load_acquire_u32(entry + layout.PAYLOAD_LEN_OFFSET)
    return (ring, value - 1), bytes(region.mapping.buffer[start : start + length])


def _name(data: bytes | None) -> str:
    if data is None:
        return "nothing (an empty commit)"
    publisher, sequence, _ = MESSAGE.unpack_from(data)
    return f"message {sequence} of publisher {publisher}"


def delivery_violation(received: dict[str, list], committed: dict, size: int) -> str | None:
    """Invariant 3: ``received`` maps each subscriber to (ring, position,
    bytes) it received; ``committed`` maps (ring, position) to the message
    committed there."""
    for subscriber, messages in received.items():
        last, seen = {}, set()
        for ring, position, data in messages:
            if committed.get((ring, position)) != data:
                return (f"{subscriber} received {_name(data)} at ring {ring} position {position}, "
                        f"where {_name(committed.get((ring, position)))} was committed")
            publisher, sequence, _ = MESSAGE.unpack_from(data)
            if data != message(publisher, sequence, size):
                return f"{subscriber} received bytes no publisher wrote: {data.hex()}"
            if (publisher, sequence) in seen:
                return f"{subscriber} received message {sequence} of publisher {publisher} twice"
            if sequence < last.get(publisher, -1):
                return f"{subscriber} received message {sequence} of publisher {publisher} after {last[publisher]}"
            seen.add((publisher, sequence))
            last[publisher] = sequence
    return None


def end_violation(region) -> str | None:
    """Invariant 4, once every actor is done."""
    for ring in region.rings:
        state_flight = ops.load_acquire_u32(ring.state_flight)
        if state_flight != layout.RING_FREE:
            return f"ring {ring.index} ends with state_flight 0x{state_flight:x}, not Free with nobody in flight"
    free, problem = _free_stack(region)
    if problem:
        return problem
    missing = sorted(set(range(region.geometry.pool_size)) - set(free))
    if missing:
        described = ", ".join(f"slot {slot} (refcount {_refcount(region, slot)})" for slot in missing)
        return f"the pool is not whole at the end: {described} never came back"
    return None
