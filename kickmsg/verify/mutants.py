"""Mutants: the real flows with one of the spec's load-bearing rules broken.

A mutant is built from the current source of the function it changes,
with a few lines edited, and installed only while an exploration runs; the
package's own code is untouched. If the original lines are no longer
there, the mutant refuses to build, so mutants cannot silently go stale.
"""
import contextlib
import inspect
import textwrap
from dataclasses import dataclass

from kickmsg import publisher, subscriber


@dataclass(frozen=True)
class Edit:
    """Replace the lines ``old`` (compared without indentation) by ``new``
    (indented like the first old line; extra leading spaces are kept)."""

    old: tuple[str, ...]
    new: tuple[str, ...]


@dataclass(frozen=True)
class Mutant:
    name: str
    rule: str  # the rule of the spec that it breaks
    owner: object  # the class or module holding the function
    attribute: str
    edits: tuple[Edit, ...]


MUTANTS = {
    mutant.name: mutant
    for mutant in (
        Mutant(
            "write-pos-after-live",
            "the subscriber captures write_pos before it CASes its ring to Live",
            subscriber,
            "_join_ring",
            (
                Edit(
                    ("start_pos = ops.load_acquire_u64(ring.write_pos)",
                     "if ops.cas_acq_rel_u32(ring.state_flight, RING_FREE, RING_LIVE) == RING_FREE:",
                     "return ring, start_pos"),
                    ("if ops.cas_acq_rel_u32(ring.state_flight, RING_FREE, RING_LIVE) == RING_FREE:",
                     "    start_pos = ops.load_acquire_u64(ring.write_pos)  # MUTANT: captured after going Live",
                     "    return ring, start_pos"),
                ),
            ),
        ),
        Mutant(
            "release-before-lock",
            "a publisher releases the evicted slot only after it has locked the entry",
            publisher.Publisher,
            "_publish",
            (
                Edit(
                    ("evicted_slot = _wait_and_capture_slot(ops, entry, previous_sequence, commit_timeout_ns)",),
                    ("evicted_slot = _wait_and_capture_slot(ops, entry, previous_sequence, commit_timeout_ns)",
                     "if evicted_slot < pool_size:",
                     "    treiber.release_slot(region, evicted_slot)  # MUTANT: released before the lock",
                     "evicted_slot = INVALID_SLOT  # MUTANT: so that it is not released again below"),
                ),
            ),
        ),
        Mutant(
            "refcount-per-ring",
            "the refcount is pre-set to max_subs before the first ring is touched",
            publisher.Publisher,
            "_publish",
            (
                Edit(
                    ("ops.store_relaxed_u32(region.slot_addresses[slot] + REFCOUNT_OFFSET, geometry.max_subs)",),
                    ("ops.store_relaxed_u32(region.slot_addresses[slot] + REFCOUNT_OFFSET, 0)  # MUTANT: no pre-set",),
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
                    ("if excess:", "treiber.release_slot(region, slot, excess)"),
                    ("if excess:",
                     "    treiber.release_slot(region, slot, excess)",
                     "elif delivered == 0:",
                     "    treiber.push(region, slot)  # MUTANT: a slot no ring counted goes back"),
                ),
            ),
        ),
        Mutant(
            "no-seqlock-recheck",
            "a subscriber pins the slot, then re-checks the entry's sequence before reading",
            subscriber.Subscriber,
            "_pin_next",
            (
                Edit(
                    ("if ops.load_acquire_u64(entry + SEQUENCE_OFFSET) != sequence:",),
                    ("if False:  # MUTANT: the entry is not re-checked after the pin",),
                ),
            ),
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


def build(mutant: Mutant):
    """The mutated function, compiled in the namespace of its module."""
    original = getattr(mutant.owner, mutant.attribute)
    source = textwrap.dedent(inspect.getsource(original))
    for edit in mutant.edits:
        source = _apply(source, edit, mutant.name)
    module = inspect.getmodule(original)
    namespace = dict(vars(module))
    exec(compile(source, f"<mutant {mutant.name} of {module.__name__}>", "exec"), namespace)
    mutated = namespace[original.__name__]
    mutated.__code__ = mutated.__code__.replace(co_qualname=original.__qualname__)  # named as the original in traces
    return mutated


@contextlib.contextmanager
def installed(name: str | None):
    """Run the enclosed code with mutant ``name`` in place (None: none)."""
    if name is None:
        yield
        return
    if name not in MUTANTS:
        raise ValueError(f"unknown mutant {name!r}; choose one of {', '.join(MUTANTS)}")
    mutant = MUTANTS[name]
    original = vars(mutant.owner)[mutant.attribute]
    setattr(mutant.owner, mutant.attribute, build(mutant))
    try:
        yield
    finally:
        setattr(mutant.owner, mutant.attribute, original)
