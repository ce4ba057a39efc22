"""Memory models of the explorer: what each load may read.

``SequentialMemory`` is sequential consistency: every operation acts on the
region's memory at once, so a load reads the newest store. Every memory
order behaves alike: the model cannot tell a release from a relaxed store.

``WeakMemory`` is the C/C++ memory model (C++20 [intro.races],
[atomics.order]) for the orders the door offers, made operational:

- every atomic word keeps its last ``HISTORY`` stores in modification order,
  oldest first; a new store always goes last;
- every actor keeps a vector clock and ticks it at each of its events; an
  event of actor A at tick t happens before actor B's next event iff
  ``B.clock[A] >= t`` (sequenced-before and synchronizes-with, transitively);
- a store with release order (or stronger) carries its writer's clock; a
  load with acquire order (or stronger) that reads it joins that clock: it
  synchronizes with the store. Relaxed operations carry and join nothing;
- a load may read any store of the word that is not older than one it
  already knows, a store written or read by an event that happens before
  the load (write-read and read-read coherence). Which one is a choice the
  explorer enumerates, the newest by default; reading an older one is a
  stale read, bounded per schedule like preemptions;
- a read-modify-write (CAS, fetch_add, fetch_sub), failed CASes included,
  reads the newest store (atomicity). Its store continues the release
  sequence of the store it read: it carries that store's clock, joined with
  its own if it releases (C++20: only read-modify-writes continue a release
  sequence);
- ``futex_wait`` compares the newest store, as the kernel reads the word
  itself;
- seq_cst acts as acq_rel for the door's seq_cst stores and CASes: the
  single total order S of seq_cst operations only constrains what seq_cst
  loads and fences may read, and a CAS reads the newest store anyway;
- a seq_cst fence (layout 9's wake pair) takes its place in S in the order
  the fences run. C++20 [atomics.order] p4.4: if fence X happens before A,
  B happens before fence Y and A is coherence-ordered before B, then X
  precedes Y in S. Made operational: a fence joins into the fence clock
  (every event that happens before some fence so far), and the actor's
  later loads may read no store older than one the fence clock knows of
  (written, or read, by an event before an earlier fence). This is no
  happens-before: the fence's own acquire and release parts are not
  modelled, which only allows more executions (a violation so found must
  be checked by hand; none relies on them in layout 9's flows);
- payload bytes are plain memory: each slot's payload keeps its last write
  and the reads since. A write not ordered after every earlier access, or a
  read not ordered after the last write, is a data race.

Stores are kept in the order they are made, so the region's memory always
holds the newest store of every word: the invariants read it as they do
under ``SequentialMemory``. The bounded history under-approximates: a load
never reads a store more than ``HISTORY - 1`` stores old.
"""
import sys
from collections.abc import Buffer, Callable
from dataclasses import dataclass, field
from typing import Protocol

from kickmsg.atomics import HARDWARE
from kickmsg.protocol.v4.region import Region

__all__ = [
    "ACQUIRING", "AccessReporter", "HARDWARE_OPERATIONS", "HISTORY", "MASKS", "OPERATIONS", "ORDERS", "Operation",
    "PayloadAccesses", "PayloadBuffer", "RELEASING", "SequentialMemory", "Stale", "Store", "WeakMemory",
]

ORDERS = ("relaxed", "acquire", "release", "acq_rel", "seq_cst")
ACQUIRING = frozenset(("acquire", "acq_rel", "seq_cst"))  # a read that synchronizes with a release it reads
RELEASING = frozenset(("release", "acq_rel", "seq_cst"))  # a store that carries its writer's clock
MASKS = {"u32": 0xFFFF_FFFF, "u64": 0xFFFF_FFFF_FFFF_FFFF}
HISTORY = 4  # stores kept per atomic word

Stale = tuple[int, int | None]  # a load of an older store: (value, step) of the newest store


@dataclass(frozen=True)
class Operation:
    """An atomic operation of the door, read from its name
    (``cas_acq_rel_u64``: kind cas, order acq_rel, width u64)."""

    kind: str  # load, store, cas, fetch_add, fetch_sub
    order: str
    width: str

    @classmethod
    def named(cls, name: str) -> "Operation":
        rest, width = name.rsplit("_", 1)
        order = next(order for order in ORDERS if rest.endswith("_" + order))
        return cls(rest[: -len(order) - 1], order, width)


HARDWARE_OPERATIONS = {name: getattr(HARDWARE, name) for name in dir(HARDWARE) if not name.startswith("_")}
# A fence touches no word: WeakMemory models it apart. A find is a run of
# relaxed loads: the scheduler performs each as a load_relaxed_u32.
OPERATIONS = {
    name: Operation.named(name) for name in HARDWARE_OPERATIONS if not name.startswith(("futex_", "fence_", "find_"))
}


class SequentialMemory:
    """Sequential consistency: the hardware operation on the region's memory."""

    race: str | None = None  # plain memory is not watched

    def perform(
        self, actor: int, name: str, address: int, operands: tuple[int, ...], step: int, newest: bool = False
    ) -> tuple[int | None, Stale | None]:
        """(result, None): nothing is ever read stale."""
        if name == "fence_seq_cst":
            return None, None  # every operation is sequentially consistent already
        return HARDWARE_OPERATIONS[name](address, *operands), None


@dataclass(eq=False)
class Store:
    """One store to an atomic word, as the word's history keeps it."""

    value: int
    writer: int  # actor index; -1 for the region's contents before any actor ran
    tick: int  # the writer's clock at the store
    step: int | None  # index of the step that stored it (None: before any actor ran)
    release: list[int] | None  # the clock an acquire load reading it joins
    loaded: dict[int, int] = field(default_factory=dict)  # actor -> tick of its first load of this store


@dataclass
class PayloadAccesses:
    """The accesses to one slot's payload that a later access must be ordered after."""

    write: tuple[int, int, int] | None = None  # (actor, tick, step) of the last write; None: zeroed at creation
    reads: dict[int, tuple[int, int]] = field(default_factory=dict)  # actor -> (tick, step) of its last read since


def _join(clock: list[int], other: list[int] | None) -> None:
    if other is not None:
        for index, tick in enumerate(other):
            if tick > clock[index]:
                clock[index] = tick


class WeakMemory:
    """The release/acquire/relaxed model (see the module's docstring).

    ``choose_read(ages)`` picks the store a load reads among the ``ages`` it
    may read (0: the newest); it is only asked when there is a choice.
    """

    def __init__(self, actors: list[str], choose_read: Callable[[int], int]) -> None:
        self.actors = actors
        self.choose_read = choose_read
        self.clocks = [[0] * len(actors) for _ in actors]
        self.words: dict[int, list[Store]] = {}  # address -> its stores, oldest first
        self.payloads: dict[int, PayloadAccesses] = {}  # slot -> accesses to its payload
        self.race: str | None = None  # the first data race, described
        self.fenced = [0] * len(actors)  # what happens before some seq_cst fence so far (the fence clock)
        self.floors = [[0] * len(actors) for _ in actors]  # per actor: the fence clock at its last fence

    def perform(
        self, actor: int, name: str, address: int, operands: tuple[int, ...], step: int, newest: bool = False
    ) -> tuple[int | None, Stale | None]:
        """Run operation ``name`` for ``actor``: (result, stale), where stale
        is (value, step) of the newest store when the load read an older one."""
        if name == "fence_seq_cst":
            self._fence(actor)
            return None, None
        if name not in OPERATIONS:  # futex_wake_all: reads and writes no memory
            return HARDWARE_OPERATIONS[name](address, *operands), None
        operation = OPERATIONS[name]
        clock = self.clocks[actor]
        clock[actor] += 1
        stores = self._stores(address, operation.width)
        if operation.kind == "load":
            return self._load(actor, clock, stores, operation, newest)
        if operation.kind == "store":
            HARDWARE_OPERATIONS[name](address, *operands)
            self._append(stores, operands[0], actor, clock, step, operation.order in RELEASING, None)
            return None, None
        return self._read_modify_write(actor, clock, stores, operation, name, address, operands, step), None

    def _stores(self, address: int, width: str) -> list[Store]:
        """The word's history, begun with its value before any actor ran
        (known to every actor: the region was laid out before they started)."""
        stores = self.words.get(address)
        if stores is None:
            initial = HARDWARE_OPERATIONS[f"load_relaxed_{width}"](address)
            stores = self.words[address] = [Store(initial, -1, 0, None, None)]
        return stores

    def _fence(self, actor: int) -> None:
        """A seq_cst fence, last in S so far: every earlier fence precedes it."""
        clock = self.clocks[actor]
        clock[actor] += 1
        _join(self.fenced, clock)
        _join(self.floors[actor], self.fenced)

    def _known(self, store: Store, clock: list[int], floor: list[int]) -> bool:
        """Whether the store, or a load of it, happens before the actor's
        next event, or before a fence that precedes the actor's last fence in S."""
        if store.writer < 0 or store.tick <= clock[store.writer] or store.tick <= floor[store.writer]:
            return True
        return any(tick <= clock[reader] or tick <= floor[reader] for reader, tick in store.loaded.items())

    def _load(
        self, actor: int, clock: list[int], stores: list[Store], operation: Operation, newest: bool
    ) -> tuple[int, Stale | None]:
        # Coherence: nothing older than the newest store the actor knows of.
        oldest = len(stores) - 1
        while oldest > 0 and not self._known(stores[oldest], clock, self.floors[actor]):
            oldest -= 1
        ages = len(stores) - oldest
        age = 0 if newest or ages == 1 else self.choose_read(ages)
        store = stores[-1 - age]
        store.loaded.setdefault(actor, clock[actor])
        if operation.order in ACQUIRING:
            _join(clock, store.release)  # synchronizes with a release store (or its release sequence)
        value = store.value & MASKS[operation.width]  # futex_wait reads the low half of write_pos
        stale = None if age == 0 else (stores[-1].value, stores[-1].step)
        return value, stale

    def _read_modify_write(
        self, actor: int, clock: list[int], stores: list[Store], operation: Operation, name: str, address: int,
        operands: tuple[int, ...], step: int,
    ) -> int:
        read = stores[-1]  # atomicity: a read-modify-write reads the newest store
        read.loaded.setdefault(actor, clock[actor])
        if operation.order in ACQUIRING:  # a failed CAS too: acq_rel and seq_cst fail acquire
            _join(clock, read.release)
        result = HARDWARE_OPERATIONS[name](address, *operands)
        failed_cas = operation.kind == "cas" and result != operands[0]
        if not failed_cas:
            value = HARDWARE_OPERATIONS[f"load_relaxed_{operation.width}"](address)
            self._append(stores, value, actor, clock, step, operation.order in RELEASING, read.release)
        return result

    def _append(
        self, stores: list[Store], value: int, actor: int, clock: list[int], step: int, releases: bool,
        continued: list[int] | None,
    ) -> None:
        """A new store, last in modification order. It carries the writer's
        clock if it releases, and the clock of the release sequence it
        continues (read-modify-writes only)."""
        release = list(clock) if releases else None
        if continued is not None:
            if release is None:
                release = list(continued)
            else:
                _join(release, continued)
        stores.append(Store(value, actor, clock[actor], step, release))
        if len(stores) > HISTORY:
            del stores[0]

    def access_payload(self, actor: int, slot: int, kind: str, step: int) -> None:
        """A plain read or write of slot ``slot``'s payload: note the first data race."""
        clock = self.clocks[actor]
        clock[actor] += 1
        accesses = self.payloads.setdefault(slot, PayloadAccesses())
        conflicting = [(accesses.write, "write")] if accesses.write else []
        if kind == "write":
            conflicting += [((reader, tick, at), "read") for reader, (tick, at) in accesses.reads.items()]
        for (other, tick, at), what in conflicting:
            if other != actor and tick > clock[other] and self.race is None:
                self.race = (f"data race on slot {slot}'s payload: {self.actors[actor]} {kind}s it at step {step + 1}, "
                             f"but {self.actors[other]}'s {what} at step {at + 1} does not happen before")
        if kind == "write":
            accesses.write = (actor, clock[actor], step)
            accesses.reads.clear()
        else:
            accesses.reads[actor] = (clock[actor], step)


class AccessReporter(Protocol):
    """Where a ``PayloadBuffer`` reports accesses: the scheduler's ``Execution``."""

    def access_payload(self, kind: str, slot: int, address: int, length: int) -> None: ...


class PayloadBuffer:
    """``mapping.buffer`` of a region under ``WeakMemory``: the region's
    bytes, reporting every access an actor makes to a slot's payload.

    Assigning to a payload slice is a write (``Publisher.send``). Taking a
    slice is a read made at once (``bytes(...)`` in ``try_receive``, a
    ``SampleView``'s buffer copied by its reader), except the slice that
    the publisher core's ``payload`` hands out (to ``AllocatedSlot``): its
    caller fills it in place, a write.
    """

    def __init__(self, region: Region, execution: AccessReporter) -> None:
        self.view = region.mapping.buffer
        self.base = region.mapping.address
        self.execution = execution
        self.slot_at = {offset: slot for slot, offset in enumerate(region.payload_offsets)}

    def __len__(self) -> int:
        return len(self.view)

    def __getitem__(self, key: int | slice) -> int | memoryview:
        caller = sys._getframe(1)
        if caller.f_code.co_qualname == "Region.payload_view" and caller.f_back is not None:
            caller = caller.f_back  # whoever asked the region for the slice
        filled_in_place = caller.f_code.co_qualname == "Publisher.payload"
        self._report(key, "write" if filled_in_place else "read")
        return self.view[key]

    def __setitem__(self, key: slice, value: Buffer) -> None:
        self._report(key, "write")
        self.view[key] = value

    def _report(self, key: int | slice, kind: str) -> None:
        if isinstance(key, slice) and key.start in self.slot_at and key.stop > key.start:
            self.execution.access_payload(kind, self.slot_at[key.start], self.base + key.start, key.stop - key.start)
