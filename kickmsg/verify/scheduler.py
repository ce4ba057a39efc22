"""Running actors one atomic step at a time.

Every actor runs the package's real code in a greenlet of its own (a
coroutine with its own stack, so the real, ordinary functions can be stopped
in the middle), and only one runs at a time: each call through
``kickmsg.atomics`` is a scheduling point where the actor hands control back
and the scheduler picks who goes next. A step is one
atomic operation of one actor plus the plain Python that follows it up to
that actor's next atomic operation.

An actor that reads a word again and finds a value it already saw since its
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
from kickmsg.region import SharedRegion
from kickmsg.verify.memory import SequentialMemory, Stale, WeakMemory

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
    script: Callable[[SharedRegion], object]
    index: int = 0  # its place among the execution's actors (its component of the vector clocks)
    state: str = "new"  # new, waiting (at a scheduling point), running, done
    spinning: bool = False  # set aside until someone writes what it read
    reads: dict[int, int | None] = field(default_factory=dict)  # address -> value read since its own last write
    error: str | None = None  # the traceback, if its script raised


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

    @property
    def preempts(self) -> bool:
        """A turn that switches away from an actor that could go on."""
        return self.kind == "turn" and self.previous in self.options and self.chosen != self.previous

    @property
    def stale(self) -> bool:
        """A read of another store than the newest."""
        return self.kind == "read" and self.chosen != 0


@dataclass
class Outcome:
    """What one execution did: its steps, its choices, and the first
    violation (None if there was none)."""

    steps: list[Step] = field(default_factory=list)
    choices: list[Choice] = field(default_factory=list)
    violation: str | None = None


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
        self.execution = execution

    def _step(self, name: str, address: int, operands: tuple[int, ...], newest: bool = False) -> Any:
        execution = self.execution
        actor = execution.current_actor()
        if actor is None:
            return getattr(Atomics, name)(address, *operands)
        execution.wait_for_turn(actor)
        result, stale = execution.memory.perform(actor.index, name, address, operands, len(execution.outcome.steps), newest)
        execution.record(actor, name, address, operands, result, stale)
        return result

    def futex_wait(self, address: int, expected: int, timeout_ns: int) -> int:
        """A futex wait is a load of the newest store (the kernel reads the word
        itself): if the word changed, return at once; else return as if woken,
        the load having marked the actor as spinning."""
        if self._step("load_relaxed_u32", address, (), newest=True) != expected:
            return atomics.FUTEX_VALUE_CHANGED
        return atomics.FUTEX_WOKEN


def _scheduled(name: str) -> Callable[..., Any]:
    def operation(self: ScheduledAtomics, address: int, *operands: int) -> Any:
        return self._step(name, address, operands)

    operation.__name__ = name
    return operation


for _name in OPERATIONS:
    if _name != "futex_wait" and not _name.startswith("fence_"):  # a fence (layout 9) is not scheduled yet
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
        self, region: SharedRegion, actors: list[Actor], choose: Chooser, check: Checker, memory_model: str = "sc",
        max_steps: int = 20_000,
    ) -> None:
        self.region = region
        self.actors = actors
        self.choose = choose
        self.check = check
        self.max_steps = max_steps
        self.outcome = Outcome()
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

    def current_actor(self) -> Actor | None:
        return self._actor_of.get(greenlet.getcurrent())

    def wait_for_turn(self, actor: Actor) -> None:
        """A scheduling point: hand over to the scheduler, wait to be picked."""
        actor.state = "waiting"
        self._scheduler.switch()
        if self._aborting:
            raise Aborted
        actor.state = "running"

    def record(
        self, actor: Actor, operation: str, address: int, operands: tuple[int, ...], result: int | None,
        stale: Stale | None = None,
    ) -> None:
        """Note the step; notice spinning; wake spinners that a write concerns."""
        stack, line = _package_stack()
        self.outcome.steps.append(Step(actor.name, stack, operation, address, operands, result, stale, line))
        failed_cas = operation.startswith("cas_") and result != operands[0]
        if operation.startswith("load_") or failed_cas:  # a failed CAS only read
            if actor.reads.get(address) == result:
                actor.spinning = True
            actor.reads[address] = result
        elif operation in WRITES:
            actor.reads.clear()
            actor.spinning = False  # it made progress
            for other in self.actors:
                if address in other.reads:
                    other.spinning = False
                    other.reads.clear()

    def access_payload(self, kind: str, slot: int, address: int, length: int) -> None:
        """A plain read or write of a slot's payload by the running actor:
        a step of the trace (not a scheduling point), checked for races."""
        actor = self.current_actor()
        if actor is None:
            return  # the invariants reading what was committed
        if not isinstance(self.memory, WeakMemory):
            return  # sequential consistency watches no plain memory
        self.memory.access_payload(actor.index, slot, kind, len(self.outcome.steps))
        stack, line = _package_stack()
        self.outcome.steps.append(Step(actor.name, stack, f"{kind}_payload", address, (length,), None, None, line))

    def _choose_read(self, ages: int) -> int:
        """Which store a load reads, among ``ages`` (0: the newest)."""
        choice = Choice("read", list(range(ages)), 0, step=len(self.outcome.steps))
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
                ready = [a for a in waiting if not a.spinning]
                if not ready:  # all spinning: one may have been a retry, not a wait; all start afresh
                    for actor in waiting:
                        actor.spinning = False
                        actor.reads.clear()
                    ready = waiting
                default = previous if previous in ready else ready[0]
                choice = Choice("turn", [a.name for a in ready], default.name, previous.name if previous else None,
                                len(self.outcome.steps))
                choice.chosen = self.choose(len(self.outcome.choices), choice)
                self.outcome.choices.append(choice)
                self._turns += 1
                chosen = next(actor for actor in ready if actor.name == choice.chosen)
                previous = chosen
                coroutines[chosen.name].switch()  # back at its next scheduling point, or when done
        finally:
            self._aborting = True
            for coroutine in coroutines.values():  # unwind the unfinished, running their finally blocks
                while coroutine:  # started and not finished
                    coroutine.switch()
