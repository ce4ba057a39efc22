"""Running actors one atomic step at a time.

Every actor runs the package's real code in a greenlet of its own (a
coroutine with its own stack, so the real, ordinary functions can be stopped
in the middle), and only one runs at a time: each call through
``kickmsg.atomics`` is a scheduling point where the actor hands control back
and the scheduler picks who goes next. A step is one
atomic operation of one actor plus the plain Python that follows it up to
that actor's next atomic operation.

An actor that reads a word again (layout 9: at the same line) and finds a value it already saw since its
own last write is spinning (waiting for a commit, for in-flight publishers to
leave, for a message): it is set aside while other actors can run, until one
of them writes a word it read or finishes. Waiting loops thus neither run
forever nor cost preemptions. If every actor is set aside (a retry loop can
look like a wait), all start afresh; a run that never ends is reported as a
livelock.

What an operation does to memory is the memory model's business
(``kickmsg.verify.memory``): under sequential consistency the hardware
operation on the region; under the weak model a load may also read an older
store. Every decision of an execution is a ``Choice``: which ready actor
runs next, or which store a load reads when it may read more than one.
"""
import os
import sys
import traceback
from collections.abc import Callable
from dataclasses import dataclass, field
from types import FrameType
from typing import Any

import greenlet

from kickmsg import atomics
from kickmsg.atomics import Atomics
from kickmsg.verify.memory import SequentialMemory, Stale, WeakMemory

__all__ = [
    "Aborted", "Actor", "Checker", "Choice", "Chooser", "DIES", "Execution", "Mishaps", "ModelledClock",
    "OPERATIONS", "Outcome", "ScheduledAtomics", "Step", "TIME_PASSES", "WRITES", "is_mishap",
]

# Every operation of the atomics door, and those that may write memory.
OPERATIONS = [name for name in vars(Atomics) if not name.startswith("_")]
WRITES = {name for name in OPERATIONS if name.startswith(("store_", "cas_", "fetch_"))}


class Aborted(BaseException):
    """Raised inside an actor when its execution is abandoned."""


@dataclass
class Step:
    """One atomic operation, as the trace shows it."""

    actor: str
    stack: tuple[str, ...]  # the functions of the package at work, innermost first
    operation: str
    address: int
    operands: tuple[int, ...]
    result: int | None
    stale: Stale | None = None  # a load of an older store: (value, step) of the newest
    line: int = 0  # the line of the call, in the file of the innermost function of the package

    @property
    def where(self) -> str:
        """The function of the package that made the call."""
        return self.stack[0] if self.stack else "?"


@dataclass
class Actor:
    """A named script ``script(region)`` run as one coroutine of an execution."""

    name: str
    script: Callable[[Any], object]  # run on the execution's region (layout 4 or 9)
    index: int = 0  # its place among the execution's actors (its component of the vector clocks)
    state: str = "new"  # new, waiting (at a scheduling point), running, done
    spinning: bool = False  # set aside until someone writes what it read
    # (address, line) -> value read since its own last write; the line is 0
    # for layout 4, the reading line of the package for layout 9 (mishaps)
    reads: dict[tuple[int, int], int | None] = field(default_factory=dict)
    error: str | None = None  # the traceback, if its script raised
    parked: tuple[int, int, int] | None = None  # asleep in futex_wait: (address, expected, timeout_ns)
    woken: int = 0  # how its last futex_wait ended (FUTEX_WOKEN or FUTEX_TIMED_OUT)
    asleep_until: int | None = None  # in a modelled sleep until the clock reads this (ns)


@dataclass
class Choice:
    """A decision of an execution: which ready actor runs next (a turn), or
    which store a load reads (a read: the ages it may read, 0 the newest)."""

    kind: str  # "turn" or "read"
    options: list[Any]  # the ready actors' names, or the ages
    default: str | int  # chosen without a reason to differ: the actor that ran last, the newest store
    previous: str | None = None  # a turn: the actor that ran last
    step: int = 0  # index in the steps of the turn's first step, or of the load
    chosen: str | int | None = None
    execution: "Execution | None" = None  # the execution choosing (a chooser may look at its state)

    @property
    def preempts(self) -> bool:
        """A turn that switches away from an actor that could go on, or a
        mishap (an actor dies, time passes)."""
        return self.kind == "turn" and self.costs(self.chosen)

    def costs(self, option: Any) -> bool:
        """Whether choosing ``option`` at this turn is a preemption."""
        return is_mishap(option) or (self.previous in self.options and option != self.previous)

    @property
    def stale(self) -> bool:
        """A read of another store than the newest."""
        return self.kind == "read" and self.chosen != 0


TIME_PASSES = "time passes"  # a turn option: the clock moves on by one commit timeout
DIES = " dies"  # a turn option "pub0 dies": that actor stops for good at its next step


def is_mishap(option: Any) -> bool:
    return option == TIME_PASSES or (isinstance(option, str) and option.endswith(DIES))


MAX_STEPS = 20_000  # an execution with more steps is a livelock


class ModelledClock:
    """Monotonic time of an execution, in ns: it moves only when the
    scheduler says so (``Mishaps``), never by itself."""

    def __init__(self) -> None:
        self.now = 0
        self.reads = 0  # how many times it was read (the reduction: which turns read the clock)

    def monotonic_ns(self) -> int:
        self.reads += 1
        return self.now


@dataclass
class Mishaps:
    """Layout 9's: what may happen besides the actors' steps. At any turn
    an actor of ``mortal`` may die (at most ``deaths`` per execution), and,
    while an actor waits, time may pass by ``timeout_ns`` (each a preemption
    for the bounds). An actor in a modelled sleep (``Execution.sleep``) has
    no turn until the clock reaches its waking. When every actor waits,
    time passes by itself; a futex
    sleeper is then woken by its timeout, unless its word changed and
    nobody woke it: a lost wake-up."""

    clock: ModelledClock
    timeout_ns: int
    mortal: tuple[str, ...] = ()
    deaths: int = 0
    name_of: Callable[[int], str] = hex  # a word's name in the region, for the lost wake-up's message


@dataclass
class Outcome:
    """What one execution did: its steps, its choices, and the first
    violation (None if there was none)."""

    steps: list[Step] = field(default_factory=list)
    choices: list[Choice] = field(default_factory=list)
    violation: str | None = None
    final_state: str | None = None  # a digest of the region and what was received, once every actor is over


def _package_stack() -> tuple[tuple[str, ...], int]:
    """The functions of the package (outside kickmsg.verify, or mutants of
    them) on the stack, innermost first, and the line the innermost is at."""
    names = []
    line = 0
    frame: FrameType | None = sys._getframe(2)
    while frame is not None:
        filename = frame.f_code.co_filename
        ours = f"{os.sep}kickmsg{os.sep}" in filename and f"{os.sep}verify{os.sep}" not in filename
        if ours or filename.startswith("<mutant "):
            line = line or frame.f_lineno
            names.append(frame.f_code.co_qualname)
        frame = frame.f_back
    return tuple(names), line


class ScheduledAtomics(Atomics):
    """The atomics of the door, each call made by an actor a scheduling
    point, then performed by the execution's memory model (calls from
    anywhere else run directly on the hardware)."""

    def __init__(self, execution: "Execution") -> None:
        if atomics.COMPILED:  # the explorer checks the reference: every module run from its source
            raise RuntimeError("the explorer runs on the pure build, and this process runs the compiled one: "
                               "run it with KICKMSG_PURE=1 in the environment (kickmsg verify does so itself)")
        self.execution = execution

    def _step(self, name: str, address: int, operands: tuple[int, ...], newest: bool = False) -> Any:
        execution = self.execution
        actor = execution.current_actor()
        if actor is None:
            return getattr(atomics.HARDWARE, name)(address, *operands)
        execution.wait_for_turn(actor)
        result, stale = execution.memory.perform(actor.index, name, address, operands, len(execution.outcome.steps), newest)
        execution.record(actor, name, address, operands, result, stale)
        return result

    def futex_wait(self, address: int, expected: int, timeout_ns: int) -> int:
        """A futex wait is a load of the newest store (the kernel reads the word
        itself): if the word changed, return at once. Else, with mishaps
        (layout 9), sleep until a futex_wake_all of the word or the timeout;
        without, return as if woken, the load having marked the actor as
        spinning."""
        if self._step("load_relaxed_u32", address, (), newest=True) != expected:
            return atomics.FUTEX_VALUE_CHANGED
        if self.execution.mishaps is None:
            return atomics.FUTEX_WOKEN
        return self.execution.park(address, expected, timeout_ns)

    def fence_seq_cst(self) -> None:
        """A seq_cst fence: a step of its own, at no address."""
        self._step("fence_seq_cst", 0, ())

    def find_relaxed_u32(self, address: int, stride: int, start: int, count: int, mask: int, value: int) -> int:
        """A find is its loads: each word's relaxed load a step of its own,
        in order, as ``Atomics.find_relaxed_u32`` reads them."""
        for index in range(start, count):
            word = self.load_relaxed_u32(address + index * stride)
            if word & mask == value:
                return index << 32 | word
        return -1


def _scheduled(name: str) -> Callable[..., Any]:
    def operation(self: ScheduledAtomics, address: int, *operands: int) -> Any:
        return self._step(name, address, operands)

    operation.__name__ = name
    return operation


for _name in OPERATIONS:
    if _name not in ("futex_wait", "fence_seq_cst", "find_relaxed_u32"):  # those three are methods above
        setattr(ScheduledAtomics, _name, _scheduled(_name))


Chooser = Callable[[int, Choice], Any]  # (index, choice) -> one of choice.options
Checker = Callable[["Execution"], str | None]  # a violation, described, or None


class Execution:
    """One run of the actors under one schedule.

    ``choose(index, choice)`` makes the ``index``-th choice of the execution
    (one of ``choice.options``); ``check(execution)`` returns a violation
    (text) or None and is called before every step and once all actors are
    done. ``memory_model`` is "sc" (sequential consistency) or "ra" (the
    release/acquire/relaxed model, ``kickmsg.verify.memory.WeakMemory``).
    """

    def __init__(
        self, region: Any, actors: list[Actor], choose: Chooser, check: Checker, memory_model: str = "sc",
        max_steps: int = MAX_STEPS, mishaps: Mishaps | None = None,
    ) -> None:
        self.region = region  # a layout-4 SharedRegion or a layout-9 Region
        self.mishaps = mishaps
        self.died: list[str] = []
        self.actors = actors
        self.choose = choose
        self.check = check
        self.max_steps = max_steps
        self.outcome = Outcome()
        self.payloads: list[tuple[int, str]] = []  # (slot, "read" or "write") of every payload access, in order
        self.state_reads = 0  # looks at the actors' states (``looks_at``)
        self.memory_model = memory_model
        for index, actor in enumerate(actors):
            actor.index = index
        self.memory: SequentialMemory | WeakMemory
        if memory_model == "sc":
            self.memory = SequentialMemory()
        elif memory_model == "ra":
            self.memory = WeakMemory([actor.name for actor in actors], self._choose_read)
        else:
            raise ValueError(f"unknown memory model {memory_model!r}; choose sc or ra")
        self._turns = 0
        self._scheduler = greenlet.getcurrent()
        self._actor_of: dict[greenlet.greenlet, Actor] = {}
        self._aborting = False

    # -- called from actors -------------------------------------------------------------------

    def looks_at(self, actors: list[Actor]) -> list[str]:
        """The states of ``actors`` (done? dead?), as the actors' plain code
        asks them; counted (``state_reads``): the order of such a look and an
        actor's end matters to the reduction."""
        self.state_reads += 1
        return [actor.state for actor in actors]

    def current_actor(self) -> Actor | None:
        return self._actor_of.get(greenlet.getcurrent())

    def wait_for_turn(self, actor: Actor) -> None:
        """A scheduling point: hand over to the scheduler, wait to be picked."""
        actor.state = "waiting"
        self._scheduler.switch()
        if self._aborting:
            raise Aborted
        actor.state = "running"

    def park(self, address: int, expected: int, timeout_ns: int) -> int:
        """The running actor sleeps in futex_wait until woken or timed out."""
        actor = self.current_actor()
        assert actor is not None
        actor.parked = (address, expected, timeout_ns)
        actor.spinning = False
        self.wait_for_turn(actor)
        return actor.woken

    def sleep(self, ns: int) -> None:
        """The running actor sleeps ``ns`` of modelled time: a step of the
        trace, then no turn until the clock has moved on that far (time
        passes as a mishap, or by itself once nobody else can go on)."""
        actor = self.current_actor()
        assert actor is not None and self.mishaps is not None
        self.wait_for_turn(actor)
        self.record(actor, "sleep_ns", 0, (ns,), None)
        actor.asleep_until = self.mishaps.clock.now + ns
        self.wait_for_turn(actor)
        actor.asleep_until = None

    def _asleep(self, actor: Actor) -> bool:
        return actor.asleep_until is not None and self.mishaps is not None and self.mishaps.clock.now < actor.asleep_until

    def record(
        self, actor: Actor, operation: str, address: int, operands: tuple[int, ...], result: int | None,
        stale: Stale | None = None,
    ) -> None:
        """Note the step; notice spinning; wake spinners that a write concerns."""
        stack, line = _package_stack()
        self.outcome.steps.append(Step(actor.name, stack, operation, address, operands, result, stale, line))
        failed_cas = operation.startswith("cas_") and result != operands[0]
        if operation.startswith("load_") or failed_cas:  # a failed CAS only read
            # Layout 9: only a read again at the same line is a spin (a wait
            # that timed out reads the lock once more in the lock loop: no spin).
            key = (address, line if self.mishaps is not None else 0)
            if actor.reads.get(key) == result:
                actor.spinning = True
            actor.reads[key] = result
        elif operation == "futex_wake_all":
            for other in self.actors:
                if other.parked is not None and other.parked[0] == address:
                    other.parked = None
                    other.woken = atomics.FUTEX_WOKEN
        elif operation in WRITES:
            actor.reads.clear()
            actor.spinning = False  # it made progress
            for other in self.actors:
                if any(read == address for read, _ in other.reads):
                    other.spinning = False
                    other.reads.clear()

    def access_payload(self, kind: str, slot: int, address: int, length: int) -> None:
        """A plain read or write of a slot's payload by the running actor:
        a step of the trace (not a scheduling point), checked for races."""
        actor = self.current_actor()
        if actor is None:
            return  # the invariants reading what was committed
        self.payloads.append((slot, kind))
        if not isinstance(self.memory, WeakMemory):
            return  # sequential consistency watches no plain memory
        self.memory.access_payload(actor.index, slot, kind, len(self.outcome.steps))
        stack, line = _package_stack()
        self.outcome.steps.append(Step(actor.name, stack, f"{kind}_payload", address, (length,), None, None, line))

    def _choose_read(self, ages: int) -> int:
        """Which store a load reads, among ``ages`` (0: the newest)."""
        choice = Choice("read", list(range(ages)), 0, step=len(self.outcome.steps), execution=self)
        age: int = self.choose(len(self.outcome.choices), choice)
        choice.chosen = age
        self.outcome.choices.append(choice)
        return age

    def _run_actor(self, actor: Actor) -> None:
        actor.state = "running"
        try:
            actor.script(self.region)
        except Aborted:
            pass
        except Exception:
            actor.error = traceback.format_exc()
        finally:
            actor.state = "done"
            for other in self.actors:  # what they wait for may depend on this one being done
                other.spinning = False
                other.reads.clear()

    # -- the scheduler ------------------------------------------------------------------------

    def run(self) -> Outcome:
        coroutines: dict[str, greenlet.greenlet] = {}
        for actor in self.actors:
            coroutines[actor.name] = greenlet.greenlet(lambda actor=actor: self._run_actor(actor), parent=self._scheduler)
            self._actor_of[coroutines[actor.name]] = actor
        previous: Actor | None = None
        try:
            while True:
                failed = next((a for a in self.actors if a.error), None)
                if failed is not None:
                    self.outcome.violation = f"{failed.name} raised:\n{failed.error}"
                    return self.outcome
                self.outcome.violation = self.memory.race or self.check(self)
                if self.outcome.violation:
                    return self.outcome
                waiting = [a for a in self.actors if a.state in ("new", "waiting")]
                if not waiting:
                    return self.outcome
                if self._turns >= self.max_steps:
                    spinning = ", ".join(a.name for a in waiting if a.spinning)
                    self.outcome.violation = f"no end after {self.max_steps} steps (livelock; spinning: {spinning})"
                    return self.outcome
                ready = [a for a in waiting if not a.spinning and a.parked is None and not self._asleep(a)]
                if not ready and any(a.spinning for a in waiting):
                    # all waiting: one may have been a retry, not a wait; all start afresh (and time passes)
                    if self.mishaps is not None:
                        self.mishaps.clock.now += self.mishaps.timeout_ns
                    for actor in waiting:
                        actor.spinning = False
                        actor.reads.clear()
                    ready = [a for a in waiting if a.parked is None and not self._asleep(a)]
                wakings = [a.asleep_until for a in waiting if a.asleep_until is not None and self._asleep(a)]
                if not ready and wakings:  # nobody else can go on: time passes to the first waking
                    assert self.mishaps is not None
                    self.mishaps.clock.now = min(wakings)
                    continue
                if not ready:  # every actor left sleeps on a futex
                    self.outcome.violation = self._time_out_sleepers(waiting)
                    if self.outcome.violation:
                        return self.outcome
                    continue
                default = previous if previous in ready else ready[0]
                options = [a.name for a in ready] + self._mishaps(waiting)
                choice = Choice("turn", options, default.name, previous.name if previous else None,
                                len(self.outcome.steps), execution=self)
                choice.chosen = self.choose(len(self.outcome.choices), choice)
                self.outcome.choices.append(choice)
                self._turns += 1
                if self._befall(choice.chosen, waiting):
                    previous = None  # the mishap was the preemption: anyone may go on
                    continue
                chosen = next(actor for actor in ready if actor.name == choice.chosen)
                previous = chosen
                coroutines[chosen.name].switch()  # back at its next scheduling point, or when done
        finally:
            self._aborting = True
            for actor in self.actors:
                actor.parked = None
            for coroutine in coroutines.values():  # unwind the unfinished, running their finally blocks
                while coroutine:  # started and not finished
                    coroutine.switch()

    # -- mishaps (layout 9) ---------------------------------------------------------------------

    def _mishaps(self, waiting: list[Actor]) -> list[str]:
        """The mishaps that may befall now: a mortal actor that has begun dies,
        time passes while someone waits."""
        mishaps = self.mishaps
        if mishaps is None:
            return []
        options = []
        if len(self.died) < mishaps.deaths:
            options += [a.name + DIES for a in waiting if a.name in mishaps.mortal and a.state == "waiting"]
        if any(a.spinning or a.parked is not None or self._asleep(a) for a in waiting):
            options.append(TIME_PASSES)
        return options

    def _befall(self, option: Any, waiting: list[Actor]) -> bool:
        """Make the mishap ``option`` happen; False if it is an actor's turn."""
        if not is_mishap(option):
            return False
        assert self.mishaps is not None
        if option == TIME_PASSES:
            self.mishaps.clock.now += self.mishaps.timeout_ns
            for actor in waiting:
                actor.spinning = False
                actor.reads.clear()
        else:
            dead = next(a for a in waiting if a.name + DIES == option)
            dead.state = "dead"
            self.died.append(dead.name)
        return True

    def _time_out_sleepers(self, sleepers: list[Actor]) -> str | None:
        """Every actor left sleeps on a futex. One whose word changed was
        owed a wake-up (unless the word's last writer died: it may have died
        before waking): a lost wake-up. Else time passes to the first
        timeout, which wakes that sleeper."""
        for actor in sleepers:
            assert actor.parked is not None
            address, expected, _ = actor.parked
            value = atomics.HARDWARE.load_relaxed_u32(address)
            last_writer = next((step.actor for step in reversed(self.outcome.steps)
                                if step.address == address and step.operation in WRITES), None)
            if value != expected and last_writer not in self.died:
                assert self.mishaps is not None
                return (f"lost wake-up: {actor.name} sleeps on {self.mishaps.name_of(address)} expecting {expected}, "
                        f"the word is now {value}, and nobody woke it")
        first = min(sleepers, key=lambda actor: actor.parked[2] if actor.parked else 0)
        assert first.parked is not None and self.mishaps is not None
        self.mishaps.clock.now += max(first.parked[2], 0)
        first.parked = None
        first.woken = atomics.FUTEX_TIMED_OUT
        return None
