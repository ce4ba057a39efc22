"""Mutants: the real flows with one of the spec's load-bearing rules broken.

A mutant is built from the current source of the functions it changes,
with a few lines edited, and installed only while an exploration runs; the
package's own code is untouched. If the original lines are no longer
there, the mutant refuses to build, so mutants cannot silently go stale.

The first four break rules that show under sequential consistency. The
others weaken memory orders (or move a write across one): under sequential
consistency they change nothing, and only the release/acquire model
(``memory_model="ra"``) catches them. The last, ``spec-seqlock-orders``,
gives back the spec's own orders where the code's are stronger.
"""
import contextlib
import inspect
import sys
import textwrap
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

from kickmsg.protocol.v4 import publish as publish4
from kickmsg.protocol.v4 import receive as receive4
from kickmsg.protocol.v4 import rings as rings4
from kickmsg.protocol.v9 import publish as publish9
from kickmsg.protocol.v9 import receive as receive9
from kickmsg.protocol.v9 import repair as repair9

__all__ = ["COMMIT", "COMMIT_COMMENT", "Edit", "MUTANTS", "MUTANTS9", "Mutant", "Patch", "build", "installed", "lookup"]


@dataclass(frozen=True)
class Edit:
    """Replace the lines ``old`` (compared without indentation) by ``new``
    (indented like the first old line; extra leading spaces are kept)."""

    old: tuple[str, ...]
    new: tuple[str, ...]


@dataclass(frozen=True)
class Patch:
    """Edits of one function: ``owner.attribute``, the owner being the class
    or module that holds it. ``source``, if given, is the function's whole
    new source (dedented, as many lines as the original's), edited in its
    place (``kickmsg.verify.mutations`` derives such patches)."""

    owner: object
    attribute: str
    edits: tuple[Edit, ...]
    source: str | None = None


@dataclass(frozen=True)
class Mutant:
    name: str
    rule: str  # the rule of the protocol that it breaks
    patches: tuple[Patch, ...]
    model: str = "sc"  # the memory model that catches it ("ra": only the weak one)


COMMIT = "ops.store_release_u64(entry + SEQUENCE_OFFSET, sequence)"
COMMIT_COMMENT = "# Phase 2: commit with a release store of the real sequence."

MUTANTS = {
    mutant.name: mutant
    for mutant in (
        Mutant(
            "write-pos-after-live",
            "the subscriber captures write_pos before it CASes its ring to Live",
            (Patch(rings4, "join", (
                Edit(
                    ("start_pos = ops.load_acquire_u64(ring.write_pos)",
                     "if ops.cas_acq_rel_u32(ring.state_flight, RING_FREE, RING_LIVE) == RING_FREE:",
                     "return ring, start_pos"),
                    ("if ops.cas_acq_rel_u32(ring.state_flight, RING_FREE, RING_LIVE) == RING_FREE:",
                     "    start_pos = ops.load_acquire_u64(ring.write_pos)  # MUTANT: captured after going Live",
                     "    return ring, start_pos"),
                ),
            )),),
        ),
        Mutant(
            "release-before-lock",
            "a publisher releases the evicted slot only after it has locked the entry",
            (Patch(publish4.Publisher, "_deliver", (
                Edit(
                    ("evicted_slot = wait_and_capture_slot(ops, entry, previous_sequence, commit_timeout_ns)",),
                    ("evicted_slot = wait_and_capture_slot(ops, entry, previous_sequence, commit_timeout_ns)",
                     "if evicted_slot < pool_size:",
                     "    freestack.release_slot(region, evicted_slot)  # MUTANT: released before the lock",
                     "evicted_slot = INVALID_SLOT  # MUTANT: so that it is not released again below"),
                ),
            )),),
        ),
        Mutant(
            "refcount-per-ring",
            "the refcount is pre-set to max_subs before the first ring is touched",
            (Patch(publish4.Publisher, "_deliver", (
                Edit(
                    ("ops.store_release_u32(region.slot_addresses[slot] + REFCOUNT_OFFSET, geometry.max_subs)",),
                    ("ops.store_release_u32(region.slot_addresses[slot] + REFCOUNT_OFFSET, 0)  # MUTANT: no pre-set",),
                ),
                Edit(
                    ("if not admitted:", "excess += 1", "continue"),
                    ("if not admitted:", "    continue  # MUTANT: a ring never counted holds no reference"),
                ),
                Edit(
                    ("position = ops.fetch_add_acq_rel_u64(ring.write_pos, 1)",),
                    ("ops.fetch_add_acq_rel_u32(region.slot_addresses[slot] + REFCOUNT_OFFSET, 1)  # MUTANT: counted ring by ring",
                     "position = ops.fetch_add_acq_rel_u64(ring.write_pos, 1)"),
                ),
                Edit(
                    ("if excess:", "freestack.release_slot(region, slot, excess)"),
                    ("if excess:",
                     "    freestack.release_slot(region, slot, excess)",
                     "elif delivered == 0:",
                     "    freestack.push(region, slot)  # MUTANT: a slot no ring counted goes back"),
                ),
            )),),
        ),
        Mutant(
            "no-seqlock-recheck",
            "a subscriber pins the slot, then re-checks the entry's sequence before reading",
            (Patch(receive4, "pin_next", (
                Edit(
                    ("if ops.load_acquire_u64(entry + SEQUENCE_OFFSET) != sequence:",),
                    ("if False:  # MUTANT: the entry is not re-checked after the pin",),
                ),
            )),),
        ),
        Mutant(
            "commit-relaxed",
            "the commit store of the sequence releases the entry's fields and the payload written before it",
            (Patch(publish4.Publisher, "_deliver", (
                Edit(
                    (COMMIT_COMMENT, COMMIT),
                    (COMMIT_COMMENT, "ops.store_relaxed_u64(entry + SEQUENCE_OFFSET, sequence)  # MUTANT: relaxed commit"),
                ),
            )),),
            model="ra",
        ),
        Mutant(
            "seq-load-relaxed",
            "the subscriber reads the entry's sequence with acquire before it reads the entry's fields",
            (Patch(receive4, "pin_next", (
                Edit(
                    ("sequence = ops.load_acquire_u64(entry + SEQUENCE_OFFSET)",),
                    ("sequence = ops.load_relaxed_u64(entry + SEQUENCE_OFFSET)  # MUTANT: relaxed",),
                ),
            )),),
            model="ra",
        ),
        Mutant(
            "inflight-release-relaxed",
            "a publisher leaves a ring (in_flight - 1) with release, so that the drain sees what it wrote there",
            (Patch(publish4.Publisher, "_deliver", (
                Edit(
                    ("ops.fetch_sub_release_u32(ring.state_flight, IN_FLIGHT_ONE)",),
                    ("ops.fetch_sub_relaxed_u32(ring.state_flight, IN_FLIGHT_ONE)  # MUTANT: relaxed",),
                ),
            )),),
            model="ra",
        ),
        Mutant(
            "payload-after-commit",
            "the payload is written before the commit store that publishes it",
            (
                Patch(publish4.Publisher, "send", (
                    Edit(
                        ("region.mapping.buffer[start : start + length] = data", "self._deliver(slot, length)"),
                        ("self._deliver(slot, length, data)  # MUTANT: the payload is written after the commit",),
                    ),
                )),
                Patch(publish4.Publisher, "_deliver", (
                    Edit(
                        ("def _deliver(self, slot: int, payload_len: int) -> int:",),
                        ("def _deliver(self, slot: int, payload_len: int, late_payload=None) -> int:  # MUTANT",),
                    ),
                    Edit(
                        (COMMIT_COMMENT, COMMIT),
                        (COMMIT_COMMENT, COMMIT,
                         "if late_payload is not None:  # MUTANT: the payload, written after the commit",
                         "    start = region.payload_offsets[slot]",
                         "    region.mapping.buffer[start : start + payload_len] = late_payload"),
                    ),
                )),
            ),
            model="ra",
        ),
        Mutant(
            "spec-seqlock-orders",
            "a subscriber that reads an entry field or a refcount a newer writer stored sees that writer's lock at "
            "its re-check (the spec's orders: entry fields and the refcount pre-set stored relaxed, the fields "
            "loaded relaxed)",
            (
                Patch(publish4.Publisher, "_deliver", (
                    Edit(
                        ("ops.store_release_u32(region.slot_addresses[slot] + REFCOUNT_OFFSET, geometry.max_subs)",),
                        ("ops.store_relaxed_u32(region.slot_addresses[slot] + REFCOUNT_OFFSET, geometry.max_subs)"
                         "  # MUTANT: the spec's relaxed",),
                    ),
                    Edit(
                        ("ops.store_release_u32(entry + SLOT_IDX_OFFSET, slot)",),
                        ("ops.store_relaxed_u32(entry + SLOT_IDX_OFFSET, slot)  # MUTANT: the spec's relaxed",),
                    ),
                    Edit(
                        ("ops.store_release_u32(entry + PAYLOAD_LEN_OFFSET, payload_len)",),
                        ("ops.store_relaxed_u32(entry + PAYLOAD_LEN_OFFSET, payload_len)  # MUTANT: the spec's relaxed",),
                    ),
                )),
                Patch(receive4, "pin_next", (
                    Edit(
                        ("slot = ops.load_acquire_u32(entry + SLOT_IDX_OFFSET)",),
                        ("slot = ops.load_relaxed_u32(entry + SLOT_IDX_OFFSET)  # MUTANT: the spec's relaxed",),
                    ),
                    Edit(
                        ("length = ops.load_acquire_u32(entry + PAYLOAD_LEN_OFFSET)",),
                        ("length = ops.load_relaxed_u32(entry + PAYLOAD_LEN_OFFSET)  # MUTANT: the spec's relaxed",),
                    ),
                )),
            ),
            model="ra",
        ),
        Mutant(
            "park-without-waiter",
            "a subscriber sets has_waiter before it reads write_pos and sleeps on it, so that a publisher "
            "committing after that read wakes it",
            (Patch(receive4.Subscriber, "park", (
                Edit(
                    ("ops.store_relaxed_u32(ring.has_waiter, 1)",
                     "write_pos = ops.load_acquire_u64(ring.write_pos)"),
                    ("pass  # MUTANT: asleep without has_waiter, no publisher wakes it",
                     "write_pos = ops.load_acquire_u64(ring.write_pos)"),
                ),
            )),),
        ),
    )
}

# Layout 9's (kickmsg.protocol.v9), explored by kickmsg.verify.layout9.
MUTANTS9 = {
    mutant.name: mutant
    for mutant in (
        Mutant(
            "no-meta-tag-check",
            "a subscriber rejects a claim tagged for another position (0.9.2's fix; the 0.9 sources before it "
            "read whatever claim the entry holds)",
            (Patch(receive9.Subscriber, "pin_next", (
                Edit(
                    ("if meta_tag(meta) != meta_tag_of(self.read_pos) or field == 0 or field - 1 >= g.pool_size:",),
                    ("if field == 0 or field - 1 >= g.pool_size:  # MUTANT: 0.9's receive, no tag check",),
                ),
            )),),
            model="ra",
        ),
        Mutant(
            "steal-unproven",
            "a publisher steals a lock only when one lock value stayed through its whole commit timeout",
            (Patch(publish9.Publisher, "_self_repair", (
                Edit(
                    ("if not (stable and seq == last_seq):",),
                    ("if False:  # MUTANT: no stable-lock proof",),
                ),
            )),),
        ),
        Mutant(
            "meta-takeover-any",
            "a publisher's claim replaces only an older position's claim",
            (Patch(publish9.Publisher, "publish", (
                Edit(
                    ("while meta_precedes(old, pos):",),
                    ("while old != my_meta:  # MUTANT: replaces any claim, a newer one too",),
                ),
            )),),
        ),
        Mutant(
            "commit-plain-store",
            "a publisher commits by CAS from its own lock, so that a commit after a steal fails",
            (Patch(publish9.Publisher, "publish", (
                Edit(
                    ("if ops.cas_release_u64(entry + SEQUENCE_OFFSET, lock_value, pos + 1) != lock_value:",),
                    ("if ops.store_release_u64(entry + SEQUENCE_OFFSET, pos + 1):  # MUTANT: a plain store",),
                ),
            )),),
        ),
        Mutant(
            "no-publisher-fence",
            "a publisher fences (seq_cst) between its commit and its has_waiter load",
            (Patch(publish9.Publisher, "publish", (
                Edit(
                    ("ops.fetch_sub_release_u32(state_flight_address, IN_FLIGHT_ONE)", "ops.fence_seq_cst()"),
                    ("ops.fetch_sub_release_u32(state_flight_address, IN_FLIGHT_ONE)",
                     "pass  # MUTANT: no sc fence before the waiter check"),
                ),
            )),),
            model="ra",
        ),
        Mutant(
            "no-subscriber-fence",
            "a subscriber fences (seq_cst) between its has_waiter store and the futex's compare of write_pos",
            (Patch(receive9.Subscriber, "park", (
                Edit(
                    ("ops.store_relaxed_u32(ring + HAS_WAITER_OFFSET, WAITER_FUTEX)", "ops.fence_seq_cst()"),
                    ("ops.store_relaxed_u32(ring + HAS_WAITER_OFFSET, WAITER_FUTEX)",
                     "pass  # MUTANT: no sc fence before the futex compares write_pos"),
                ),
            )),),
            model="ra",
        ),
        Mutant(
            "pin-fetch-add",
            "a subscriber pins by CAS, never from refcount 0 (a slot already freed)",
            (Patch(receive9.Subscriber, "pin_next", (
                Edit(
                    ("refcount = ops.load_acquire_u32(slot_address + REFCOUNT_OFFSET)",
                     "pinned = False",
                     "while refcount not in (0, U32_MAX):",
                     "found = ops.cas_acq_rel_u32(slot_address + REFCOUNT_OFFSET, refcount, refcount + 1)",
                     "if found == refcount:",
                     "pinned = True",
                     "break",
                     "refcount = found"),
                    ("ops.fetch_add_acq_rel_u32(slot_address + REFCOUNT_OFFSET, 1)  # MUTANT: pinned by fetch_add",
                     "pinned = True"),
                ),
            )),),
        ),
        Mutant(
            "repair-unproven",
            "repair_locked_entries steals a lock only if it stayed the same through a whole commit timeout",
            (Patch(repair9, "repair_locked_entries", (
                Edit(
                    ("region.sleep_ns(g.commit_timeout_us * 1000)  # B.13: one commit timeout, then only unchanged locks",),
                    ("pass  # MUTANT: no wait of a commit timeout before the steals",),
                ),
            )),),
        ),
        Mutant(
            "reclaim-no-recheck",
            "reclaim_dead_ring takes a ring by a CAS of its owner_pid from the dead pid (it may have changed hands)",
            (Patch(repair9, "reclaim_dead_ring", (
                Edit(
                    ("if ops.cas_acq_rel_u64(ring + OWNER_PID_OFFSET, pid, 0) != pid:",
                     "return None"),
                    ("ops.store_relaxed_u64(ring + OWNER_PID_OFFSET, 0)  # MUTANT: no look at whose pid it is now",
                     "pass"),
                ),
            )),),
        ),
        Mutant(
            "reclaim-0.9.2",
            "0.9.2's shipped reclaim_dead_rings: a Reclaiming ring (another reclaimer's) is taken at once, and the "
            "owner is cleared by plain stores after a second look at it",
            (Patch(repair9, "reclaim_dead_rings", (
                Edit(
                    ("reclaimed += reclaim_dead_ring(region, index) is not None",),
                    ("# MUTANT: 0.9.2's flow (WIRE9.md B.13), no drain",
                     "ops = region.atomics",
                     "ring = region.ring_address(index)",
                     "address = ring + STATE_FLIGHT_OFFSET",
                     "seen = ops.load_acquire_u32(address)",
                     "if seen & RING_STATE_MASK not in (RING_LIVE, RING_DRAINING, RING_RECLAIMING) or not _ring_is_dead(region, ring):",
                     "    continue",
                     "state_flight = ops.load_acquire_u32(address)",
                     "if state_flight & RING_STATE_MASK != seen & RING_STATE_MASK:",
                     "    continue",
                     "original_state = state_flight & RING_STATE_MASK",
                     "if ops.cas_acq_rel_u32(address, state_flight, (state_flight & ~RING_STATE_MASK) | RING_RECLAIMING) != state_flight:",
                     "    continue",
                     "if _ring_is_dead(region, ring):",
                     "    _clear_owner(region, ring)",
                     "    target = RING_FREE",
                     "    reclaimed += 1",
                     "else:",
                     "    target = original_state",
                     "current = ops.load_acquire_u32(address)",
                     "while current & RING_STATE_MASK == RING_RECLAIMING:",
                     "    found = ops.cas_acq_rel_u32(address, current, (current & ~RING_STATE_MASK) | target)",
                     "    if found == current:",
                     "        break",
                     "    current = found"),
                ),
            )),),
        ),
    )
}


def _apply(source: str, edit: Edit, mutant: str) -> str:
    lines = source.split("\n")
    stripped = [line.strip() for line in lines]
    starts = [i for i in range(len(lines)) if stripped[i : i + len(edit.old)] == list(edit.old)]
    if len(starts) != 1:
        raise RuntimeError(f"mutant {mutant}: the lines to edit were found {len(starts)} times, not once: {edit.old[0]!r}")
    start = starts[0]
    indent = lines[start][: len(lines[start]) - len(lines[start].lstrip())]
    return "\n".join(lines[:start] + [indent + line for line in edit.new] + lines[start + len(edit.old) :])


def build(patch: Patch, name: str) -> Callable[..., Any]:
    """The function ``patch`` edits, edited and compiled with its module's
    globals (``name`` labels it in tracebacks and errors), at the lines of
    the original (exactly so while each edit keeps the number of lines).
    It looks up the module's other functions when it calls them, so it
    calls those a mutant has installed, not the originals."""
    original = getattr(patch.owner, patch.attribute)
    lines, first_line = inspect.getsourcelines(original)
    source = textwrap.dedent("".join(lines)) if patch.source is None else patch.source
    for edit in patch.edits:
        source = _apply(source, edit, name)
    module = sys.modules[original.__module__]
    defined: dict[str, Any] = {}  # the def binds its name here, not in the module
    exec(compile("\n" * (first_line - 1) + source, f"<mutant {name} of {module.__name__}>", "exec"), vars(module),
         defined)
    mutated = defined[original.__name__]
    mutated.__code__ = mutated.__code__.replace(co_qualname=original.__qualname__)  # named as the original in traces
    return mutated


def lookup(name: str | None) -> Mutant | None:
    """The mutant called ``name`` (None: none)."""
    if name is None:
        return None
    every = {**MUTANTS, **MUTANTS9}
    if name not in every:
        raise ValueError(f"unknown mutant {name!r}; choose one of {', '.join(every)}")
    return every[name]


@contextlib.contextmanager
def installed(mutant: Mutant | None) -> Iterator[None]:
    """Run the enclosed code with ``mutant`` in place (None: the code as it is)."""
    patches, name = (mutant.patches, mutant.name) if mutant else ((), "")
    built = {(patch.owner, patch.attribute): build(patch, name) for patch in patches}
    originals = {key: vars(key[0])[key[1]] for key in built}
    for (owner, attribute), function in built.items():
        setattr(owner, attribute, function)
    try:
        yield
    finally:
        for (owner, attribute), function in originals.items():
            setattr(owner, attribute, function)
