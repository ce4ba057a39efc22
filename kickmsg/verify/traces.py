"""The explorer's counter-examples, readable, on both layouts.

A trace numbers the atomic steps of an execution: the actor, the function
of the package at work, the operation on a region word named by its place
(``ring 0 entry 1.sequence``, ``slot 3.refcount``) with its operands and
result by their meaning (``LOCKED``, ``gen 2|slot 1``, ``Live+1``,
``publisher lock of pos 0``), the preemptions and stale reads marked, and
on layout 9 the mishaps (a death, time passing) and the repairs at the end.
"""
import collections
import ctypes
from typing import Protocol

from kickmsg.protocol.common import INVALID_SLOT, RING_STATE_MASK, U32_MAX
from kickmsg.protocol.v4 import layout as layout4
from kickmsg.protocol.v9 import layout as layout9
from kickmsg.protocol.v9 import words as words9
from kickmsg.protocol.v9.region import Region
from kickmsg.region import SharedRegion
from kickmsg.verify.scheduler import Actor, Outcome, Step

__all__ = [
    "COLUMNS", "Explored", "describe_address", "describe_meta", "describe_sequence", "describe_value", "format_step",
    "format_trace",
]

# Per layout, as its traces have always been laid out: the least width of
# the actor column, the width of the call column, and what follows the
# length a payload access reads or writes.
COLUMNS = {4: (6, 62, " bytes"), 9: (5, 70, "")}


class Explored(Protocol):
    """An execution's world, as its trace reads it (``kickmsg.verify.World``,
    ``kickmsg.verify.layout9.World9``)."""

    @property
    def region(self) -> SharedRegion | Region: ...

    @property
    def actors(self) -> list[Actor]: ...


def _layout_of(region: SharedRegion | Region) -> int:
    return 9 if isinstance(region, Region) else 4


def describe_sequence(value: int) -> str:
    """A layout-9 entry's sequence word: a lock, a skip marker or a commit."""
    if value & layout9.SEQ_LOCK_BIT:
        who = "repairer" if value & layout9.SEQ_REPAIR_BIT else "publisher"
        return f"{who} lock of pos {words9.seq_pos(value)}"
    if words9.seq_skip(value):
        return f"skip marker of pos {words9.seq_pos(value) - 1}"
    return f"commit of pos {value - 1}" if value else "0 (never written)"


def describe_meta(value: int) -> str:
    """A layout-9 entry's meta word: the position that claimed it, and its slot."""
    if value == 0:
        return "0 (never claimed)"
    field = words9.meta_slot_field(value)
    return f"claim of pos {words9.meta_tag(value) - 1}: {'no slot' if not field else f'slot {field - 1}'}"


def describe_address(region: SharedRegion | Region, address: int) -> str:
    """The region word at ``address``, by name: header.free_top, ring 0
    entry 1.sequence, slot 3.refcount, ..."""
    if not isinstance(region, Region):
        return layout4.field_at(region.geometry, address - region.mapping.address).label
    g = region.geometry
    if address == 0:
        return ""
    if address == region.free_top_address:
        return "header.free_top"
    if address == region.steal_count_address:
        return "header.steal_count"
    offset = address - region.base
    if g.sub_rings_offset <= offset < g.pool_offset:
        ring, in_ring = divmod(offset - g.sub_rings_offset, g.ring_stride)
        if in_ring >= layout9.RING_HEADER_SIZE:
            index, in_entry = divmod(in_ring - layout9.RING_HEADER_SIZE, layout9.ENTRY_SIZE)
            return f"ring {ring} entry {index}.{'sequence' if in_entry == layout9.SEQUENCE_OFFSET else 'meta'}"
        return f"ring {ring}.{_field_at(layout9.SubRingHeader, in_ring)}"
    if offset >= g.pool_offset:
        slot, in_slot = divmod(offset - g.pool_offset, g.slot_stride)
        if in_slot >= layout9.SLOT_HEADER_SIZE:
            return f"slot {slot}.payload"
        return f"slot {slot}.{_field_at(layout9.SlotHeader, in_slot)}"
    return f"header+{offset}"


def _field_at(structure: type[ctypes.Structure], offset: int) -> str:
    """The name of the field of ``structure`` that begins at ``offset``."""
    return next(name for name, *_ in structure._fields_ if getattr(structure, name).offset == offset)


def describe_value(place: str, value: int | None, layout: int) -> str:
    """The value of the word named ``place`` by its meaning, on ``layout``."""
    if value is None:
        return "-"
    if layout == 9 and place.endswith(".sequence"):
        return describe_sequence(value)
    if layout == 9 and place.endswith(".meta"):
        return describe_meta(value)
    if layout == 4 and value == layout4.LOCKED_SEQUENCE and place.endswith(".sequence"):
        return "LOCKED"
    if layout == 4 and value == INVALID_SLOT and place.endswith((".slot_idx", ".next_free")):
        return "INVALID"
    if place == "header.free_top":
        slot = value & U32_MAX
        return f"gen {value >> 32}|{'INVALID' if slot == INVALID_SLOT else f'slot {slot}'}"
    if place.endswith(".state_flight"):
        names = layout9.RING_STATE_NAMES if layout == 9 else layout4.RING_STATE_NAMES
        return f"{names.get(value & RING_STATE_MASK, '?')}+{value >> 2}"
    return str(value)


def format_step(region: SharedRegion | Region, number: int, step: Step, preempted: str | None, width: int) -> str:
    """One numbered step, its actor's name ``width`` wide."""
    layout = _layout_of(region)
    _, call_width, length_unit = COLUMNS[layout]
    place = describe_address(region, step.address)
    if step.operation.startswith("fetch_"):
        operands = ", ".join(str(operand) for operand in step.operands)  # an amount, not a value of the word
    elif step.operation.endswith("_payload"):
        operands = f"{step.operands[0]}{length_unit}"  # plain memory, not an atomic word
    else:
        operands = ", ".join(describe_value(place, operand, layout) for operand in step.operands)
    call = f"{step.operation}({', '.join(part for part in (place, operands) if part)})"
    line = (f"{number:>4}. {step.actor:<{width}} {step.where:<28} {call:<{call_width}} -> "
            f"{describe_value(place, step.result, layout)}")
    if step.stale:
        value, stored_at = step.stale
        origin = "the initial value" if stored_at is None else f"stored at step {stored_at + 1}"
        line += f"   STALE: the newest is {describe_value(place, value, layout)}, {origin}"
    return line + (f"   << preempts {preempted}" if preempted else "")


def format_trace(world: Explored, outcome: Outcome, repaired: str = "") -> str:
    """Every step, numbered, with the mishaps (deaths, time passing),
    preemptions and stale reads marked; then ``repaired`` (what the repairs
    at the end did, on layout 9) and the violation."""
    names = [actor.name for actor in world.actors]
    events: dict[int, list[str]] = collections.defaultdict(list)  # step index -> the mishaps before it
    preempting: dict[int, str | None] = {}  # step index -> the actor it preempted
    for choice in outcome.choices:
        if choice.kind == "turn" and isinstance(choice.chosen, str) and choice.chosen not in names:
            events[choice.step].append(f"      ({choice.chosen})")
        elif choice.preempts and choice.step < len(outcome.steps):
            preempting[choice.step] = choice.previous
    least, _, _ = COLUMNS[_layout_of(world.region)]
    width = max([least] + [len(name) for name in names])  # the actors' names line up
    lines: list[str] = []
    for index, step in enumerate(outcome.steps):
        lines += events.get(index, [])
        lines.append(format_step(world.region, index + 1, step, preempting.get(index), width))
    lines += events.get(len(outcome.steps), [])
    if repaired:
        lines.append(repaired)
    lines.append(f"violation: {outcome.violation}")
    return "\n".join(lines)
