"""The protocol's invariants, checked between any two steps and at the end.

Read straight from the region's memory (with the hardware atomics, outside
the schedule), plus a ``Ledger`` of what memory cannot tell by itself,
followed from the steps as they happen: which slots publishers are writing
(popped, not yet published) or hold from an evicted entry, how many pins
subscribers hold on each slot, and what was committed at each ring position.

1. The free stack has no cycle or duplicate and links only to slots of the
   pool; every slot on it has refcount 0 and no committed entry of a Live
   ring names it.
2. Every other slot is either being written by one publisher (or held by
   one from an eviction, or named by a ring being drained), with a refcount
   at least the Live entries naming it, or referenced by exactly as many
   committed entries of Live rings and pins as its refcount says.
3. Every message a subscriber received is one committed at that ring
   position, and none came twice or out of one publisher's order. No
   message is required to arrive: besides the losses a subscriber counts,
   the spec lets a publisher's relaxed pre-check skip a ring that has just
   gone Live ("a newly joined subscriber may miss a small number of
   in-flight publishes"), which the weak model does with a stale read of
   ``state_flight``. That is tolerated by design, not a violation.
4. At the end, with every actor done, every ring is Free with nobody in
   flight, and the pool is whole: every slot on the free stack, refcount 0.

A reference released too early breaks 1, 2 or 3; one never released breaks
2 or 4.
"""
import collections
import struct

from kickmsg.protocol.v4 import layout
from kickmsg.atomics import HARDWARE as ops
from kickmsg.protocol.v4.region import Region
from kickmsg.verify.scheduler import Step

__all__ = [
    "Committed", "Ledger", "MESSAGE", "MESSAGE_SIZES", "Received", "committed_message", "delivery_violation",
    "end_violation", "free_slots", "memory_violation", "message",
]

MESSAGE = struct.Struct("<HHI")  # publisher, sequence, check
MESSAGE_SIZES = (MESSAGE.size, MESSAGE.size + 4)  # lengths differ, so that a slot read with another message's length shows

Received = dict[str, list[tuple[int, int, bytes]]]  # subscription -> (ring, position, bytes) of each message
Committed = dict[tuple[int, int], list[bytes | None]]  # (ring, position) -> the messages committed there, in turn


def message(publisher: int, sequence: int) -> bytes:
    """The payload publisher ``publisher`` sends as its ``sequence``-th message."""
    check = (publisher * 7919 + sequence * 104729 + 1) & 0xFFFFFFFF
    size = MESSAGE_SIZES[(publisher + sequence) % 2]
    return MESSAGE.pack(publisher, sequence, check).ljust(size, bytes([sequence & 0xFF]))


def _free_stack(region: Region) -> tuple[list[int], str | None]:
    slots: list[int] = []
    seen: set[int] = set()
    slot = ops.load_acquire_u64(region.free_top_address) & layout.U32_MAX
    while slot != layout.INVALID_SLOT:
        if slot >= region.geometry.pool_size:
            return slots, f"the free stack links to slot {slot}, outside the pool"
        if slot in seen:
            return slots, f"the free stack reaches slot {slot} twice (a cycle)"
        seen.add(slot)
        slots.append(slot)
        slot = ops.load_acquire_u32(region.slot_addresses[slot] + layout.NEXT_FREE_OFFSET)
    return slots, None


def free_slots(region: Region) -> list[int]:
    """The slots on the free stack now (up to a broken link)."""
    return _free_stack(region)[0]


def _refcount(region: Region, slot: int) -> int:
    return ops.load_acquire_u32(region.slot_addresses[slot] + layout.REFCOUNT_OFFSET)


class Ledger:
    """Pins, slots held by publishers and commits, followed step by step."""

    def __init__(self, region: Region) -> None:
        self.region = region
        self.pins: collections.Counter[int] = collections.Counter()  # slot -> pins subscribers hold
        self.held: dict[str, set[int]] = {}  # publisher -> slots it is writing or captured from an evicted entry
        self.committed: Committed = collections.defaultdict(list)

    def _slot_word(self, address: int) -> tuple[int, int] | None:
        """(slot, offset in its header) if ``address`` is in the pool."""
        g = self.region.geometry
        offset = address - self.region.pool_address
        if not 0 <= offset < g.pool_size * g.slot_stride:
            return None
        return divmod(offset, g.slot_stride)

    def follow(self, step: Step) -> None:
        slot_word = self._slot_word(step.address)
        refcount_of = slot_word[0] if slot_word is not None and slot_word[1] == layout.REFCOUNT_OFFSET else None  # its slot
        succeeded = step.operation.startswith("cas_") and step.result == step.operands[0]
        if step.where == "pop" and succeeded:  # a publisher took a slot: a new message
            self.held[step.actor] = {step.operands[0] & layout.U32_MAX}
        elif step.where == "wait_and_capture_slot" and step.operation.endswith("_u32"):  # slot_idx, not the sequence
            evicted = step.result  # the slot of the entry it evicts
            if evicted is not None and evicted < self.region.geometry.pool_size:
                self.held.setdefault(step.actor, set()).add(evicted)
        elif refcount_of is not None and step.where == "pin_next" and succeeded:
            self.pins[refcount_of] += 1
        elif refcount_of is not None and step.actor.startswith("sub") and step.operation.startswith("fetch_sub"):
            if "drain" not in step.stack:  # else the ring's reference, not a pin
                self.pins[refcount_of] -= step.operands[0]
        elif step.operation.startswith("store_") and step.operation.endswith("_u64"):  # in any order
            found = committed_message(self.region, step.address, step.operands[0])
            if found is not None:
                self.committed[found[0]].append(found[1])

    def finished(self, actor: str) -> None:
        self.held.pop(actor, None)


def _entries_naming(region: Region, state: int) -> collections.Counter[int]:
    """Slot -> committed entries naming it, over the rings in ``state``."""
    named: collections.Counter[int] = collections.Counter()
    for ring in region.rings:
        if ops.load_acquire_u32(ring.state_flight) & layout.RING_STATE_MASK != state:
            continue
        for entry in ring.entries:
            sequence = ops.load_acquire_u64(entry + layout.SEQUENCE_OFFSET)
            slot = ops.load_acquire_u32(entry + layout.SLOT_IDX_OFFSET)
            if sequence not in (0, layout.LOCKED_SEQUENCE) and slot < region.geometry.pool_size:
                named[slot] += 1
    return named


def memory_violation(region: Region, ledger: Ledger) -> str | None:
    """Invariants 1 and 2, between any two steps."""
    free, problem = _free_stack(region)
    if problem:
        return problem
    live = _entries_naming(region, layout.RING_LIVE)
    for slot in free:
        if _refcount(region, slot):
            return f"slot {slot} is on the free stack with refcount {_refcount(region, slot)}"
        if live[slot]:
            return f"slot {slot} is on the free stack but {live[slot]} committed entries of Live rings name it"
    in_transit = set().union(*ledger.held.values(), _entries_naming(region, layout.RING_DRAINING))
    for slot in sorted(set(range(region.geometry.pool_size)) - set(free)):
        refcount = _refcount(region, slot)
        if slot in in_transit:
            if refcount < live[slot]:
                return f"slot {slot} has refcount {refcount} but {live[slot]} committed entries of Live rings name it"
        elif refcount != live[slot] + ledger.pins[slot]:
            return (f"slot {slot} has refcount {refcount} but {live[slot]} committed entries of Live rings "
                    f"and {ledger.pins[slot]} pins reference it")
    return None


def committed_message(region: Region, address: int, value: int) -> tuple[tuple[int, int], bytes | None] | None:
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
    start = region.payload_offsets[slot]
    length = ops.load_acquire_u32(entry + layout.PAYLOAD_LEN_OFFSET)
    return (ring, value - 1), bytes(region.mapping.buffer[start : start + length])


def _name(data: bytes | None) -> str:
    if data is None:
        return "nothing (an empty commit)"
    if len(data) >= MESSAGE.size:
        publisher, sequence, _ = MESSAGE.unpack_from(data)
        if data == message(publisher, sequence):
            return f"message {sequence} of publisher {publisher}"
    return f"{len(data)} bytes" + (f" ({data.hex()})" if data else "")


def delivery_violation(received: Received, committed: Committed) -> str | None:
    """Invariant 3: ``received`` maps each subscriber to (ring, position,
    bytes) it received; ``committed`` maps (ring, position) to the messages
    committed there, in turn (more than one when a repair pass commits over
    a writer)."""
    for subscriber, messages in received.items():
        last: dict[int, int] = {}  # publisher -> the last sequence received
        seen: set[tuple[int, int]] = set()
        for ring, position, data in messages:
            there = committed.get((ring, position), [])
            if data not in there:
                return (f"{subscriber} received {_name(data)} at ring {ring} position {position}, "
                        f"where {' then '.join(map(_name, there)) or 'nothing'} was committed")
            if len(data) < MESSAGE.size or data != message(*MESSAGE.unpack_from(data)[:2]):
                return f"{subscriber} received bytes no publisher wrote: {data.hex()}"
            publisher, sequence, _ = MESSAGE.unpack_from(data)
            if (publisher, sequence) in seen:
                return f"{subscriber} received message {sequence} of publisher {publisher} twice"
            if sequence < last.get(publisher, -1):
                return f"{subscriber} received message {sequence} of publisher {publisher} after {last[publisher]}"
            seen.add((publisher, sequence))
            last[publisher] = sequence
    return None


def end_violation(region: Region) -> str | None:
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
