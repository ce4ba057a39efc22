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
"""
import os
import sys
import traceback
from dataclasses import dataclass, field

import greenlet

from kickmsg import atomics
from kickmsg.atomics import Atomics

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
    operands: tuple
    result: int | None

    @property
    def where(self) -> str:
        """The function of the package that made the call."""
        return self.stack[0] if self.stack else "?"


@dataclass
class Actor:
    """A named script ``script(region)`` run as one coroutine of an execution."""

    name: str
    script: object
    state: str = "new"  # new, waiting (at a scheduling point), running, done
    spinning: bool = False  # set aside until someone writes what it read
    reads: dict = field(default_factory=dict)  # address -> value read since its own last write
    error: str | None = None  # the traceback, if its script raised


@dataclass
class Outcome:
    """What one execution did: its steps, the scheduling decisions, and the
    first violation (None if there was none)."""

    steps: list[Step] = field(default_factory=list)
    decisions: list[tuple[str, list[str], str | None]] = field(default_factory=list)  # chosen, ready, previous
    turn_starts: list[int] = field(default_factory=list)  # index in steps where each decision's turn began
    violation: str | None = None


def _package_stack() -> tuple[str, ...]:
    """The functions of the package (outside kickmsg.verify, or mutants of
    them) on the stack, innermost first."""
    names = []
    frame = sys._getframe(2)
    while frame is not None:
        filename = frame.f_code.co_filename
        ours = f"{os.sep}kickmsg{os.sep}" in filename and f"{os.sep}verify{os.sep}" not in filename
        if ours or filename.startswith("<mutant "):
            names.append(frame.f_code.co_qualname)
        frame = frame.f_back
    return tuple(names)


class ScheduledAtomics(Atomics):
    """The hardware atomics, with a scheduling point before every call made
    by an actor (calls from anywhere else run directly)."""

    def __init__(self, execution: "Execution"):
        self.execution = execution


def _scheduled(name: str):
    hardware = getattr(Atomics, name)

    def operation(self, address, *operands):
        actor = self.execution.current_actor()
        if actor is None:
            return hardware(address, *operands)
        self.execution.wait_for_turn(actor)
        result = hardware(address, *operands)
        self.execution.record(actor, name, address, operands, result)
        return result

    operation.__name__ = name
    return operation


def _scheduled_futex_wait(self, address, expected, timeout_ns):
    """A futex wait is a load: if the word changed, return at once; else
    return as if woken, the load having marked the actor as spinning."""
    if self.load_relaxed_u32(address) != expected:
        return atomics.FUTEX_VALUE_CHANGED
    return atomics.FUTEX_WOKEN


for _name in OPERATIONS:
    if _name not in ("futex_wait", "futex_wake_all"):
        setattr(ScheduledAtomics, _name, _scheduled(_name))
ScheduledAtomics.futex_wait = _scheduled_futex_wait
ScheduledAtomics.futex_wake_all = _scheduled("futex_wake_all")


class Execution:
    """One run of the actors under one schedule.

    ``choose(index, ready, previous)`` picks the next actor among the ready
    ones; ``check(execution)`` returns a violation (text) or None and is
    called before every step and once all actors are done.
    """

    def __init__(self, region, actors: list[Actor], choose, check, max_steps: int = 20_000):
        self.region = region
        self.actors = actors
        self.choose = choose
        self.check = check
        self.max_steps = max_steps
        self.outcome = Outcome()
        self._scheduler = greenlet.getcurrent()
        self._actor_of = {}  # greenlet -> actor
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

    def record(self, actor: Actor, operation: str, address: int, operands: tuple, result) -> None:
        """Note the step; notice spinning; wake spinners that a write concerns."""
        self.outcome.steps.append(Step(actor.name, _package_stack(), operation, address, operands, result))
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
        coroutines = {}
        for actor in self.actors:
            coroutines[actor.name] = greenlet.greenlet(lambda actor=actor: self._run_actor(actor), parent=self._scheduler)
            self._actor_of[coroutines[actor.name]] = actor
        previous = None
        try:
            while True:
                failed = next((a for a in self.actors if a.error), None)
                if failed is not None:
                    self.outcome.violation = f"{failed.name} raised:\n{failed.error}"
                    return self.outcome
                self.outcome.violation = self.check(self)
                if self.outcome.violation:
                    return self.outcome
                waiting = [a for a in self.actors if a.state in ("new", "waiting")]
                if not waiting:
                    return self.outcome
                if len(self.outcome.decisions) >= self.max_steps:
                    spinning = ", ".join(a.name for a in waiting if a.spinning)
                    self.outcome.violation = f"no end after {self.max_steps} steps (livelock; spinning: {spinning})"
                    return self.outcome
                ready = [a for a in waiting if not a.spinning]
                if not ready:  # all spinning: one may have been a retry, not a wait; all start afresh
                    for actor in waiting:
                        actor.spinning = False
                        actor.reads.clear()
                    ready = waiting
                chosen = self.choose(len(self.outcome.decisions), ready, previous)
                self.outcome.decisions.append((chosen.name, [a.name for a in ready], previous and previous.name))
                self.outcome.turn_starts.append(len(self.outcome.steps))
                previous = chosen
                coroutines[chosen.name].switch()  # back at its next scheduling point, or when done
        finally:
            self._aborting = True
            for coroutine in coroutines.values():  # unwind the unfinished, running their finally blocks
                while coroutine:  # started and not finished
                    coroutine.switch()
