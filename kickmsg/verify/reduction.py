"""Partial-order reduction: one schedule per order of the dependent turns.

Two schedules that differ only in the order of independent turns (turns of
different actors that touch different words, or only read the same one)
end in the same state and check the same invariants on the way; the
explorer needs to run one of them. ``explore(..., reduction="por")`` runs
each schedule to its end with the default choices, then looks at the
*races* in it (two dependent turns of different actors that no other turn
orders) and branches only where a race can be reversed: at the earlier
turn's choice, the actor that may go first instead (source-set DPOR,
Abdulla et al., 2014). Under a preemption bound, it branches at the start
of the earlier actor's run of turns too, where the switch may cost one
preemption less (bounded POR, Coons et al., 2013). Everything else a
choice may be is branched as before: a load's older stores (weak model),
a death (at every choice: placing it only where it is looked at lost
end states, measured); time passing, where it can change anything
(``time_matters``).

A turn is one actor's atomic operation and the plain Python after it, up to
its next atomic operation; its ``Footprint`` is what it touched: the words
its atomics read and wrote, the payloads it read and wrote, the modelled
clock, the actors' states (an actor's end writes them; the scripts' "are
the publishers over?" and the repairs' "is this owner dead?" read them).
Two turns are *dependent* when one writes what the other reads or writes.
A seq_cst fence writes one shared word under the weak model (fences are
ordered among themselves) and nothing under sequential consistency. A
modelled sleep is dependent with every turn.

Not part of the dependence: the scheduler's spin watch (an actor that
re-reads what it saw is set aside until someone writes what it read). Nor
are sleep sets used: measured on the small scenarios of
``tests/verify/test_reduction.py``, they lose end states under a
preemption bound (the schedule kept for an order needs more preemptions
than the one pruned), where the races alone reach every end state that
``none`` reaches, on each of them.
"""
from dataclasses import dataclass
from typing import Any

from kickmsg.verify.scheduler import WRITES, Choice, Execution, Step, is_mishap

__all__ = ["CLOCK", "FENCE", "Footprint", "RaceWatch", "STATES", "Turn", "footprint", "races", "reversals",
           "time_matters"]

FENCE = 0  # the address a seq_cst fence's step names: fences are ordered among themselves (weak model)
CLOCK = -(1 << 62)  # the modelled clock, as an address: read by the flows, written by time passing
STATES = CLOCK + 1  # the actors' states, as an address: looked at by plain code, written by an actor's end


@dataclass(frozen=True)
class Footprint:
    """What one turn touched: word addresses it read and wrote, payloads
    (as ``-1 - slot``), ``CLOCK``, ``STATES``; ``everything``: dependent
    with every turn."""

    reads: frozenset[int] = frozenset()
    writes: frozenset[int] = frozenset()
    everything: bool = False

    def conflicts(self, other: "Footprint") -> bool:
        """Whether the two turns are dependent by what they touch."""
        if self.everything or other.everything:
            return True
        return bool(self.writes & (other.reads | other.writes) or other.writes & self.reads)


EVERYTHING = Footprint(everything=True)


def footprint(steps: list[Step], payloads: list[tuple[int, str]], weak: bool) -> Footprint:
    """The footprint of a turn made of ``steps`` and payload accesses
    ``payloads`` ((slot, "read" or "write"))."""
    reads: set[int] = set()
    writes: set[int] = set()
    for step in steps:
        operation = step.operation
        failed_cas = operation.startswith("cas_") and step.result != step.operands[0]
        if operation.startswith("load_") or failed_cas:  # a failed CAS only read
            reads.add(step.address)
        elif operation in WRITES or operation == "futex_wake_all":  # a wake-up: the sleepers' word
            writes.add(step.address)
        elif operation == "fence_seq_cst":
            if weak:  # sequential consistency: a fence does nothing
                writes.add(FENCE)
        elif operation == "sleep_ns":
            return EVERYTHING  # a modelled sleep reads the clock
    for slot, kind in payloads:
        (writes if kind == "write" else reads).add(-1 - slot)
    return Footprint(frozenset(reads), frozenset(writes))


@dataclass
class Turn:
    """One turn of a run: the index of the choice that gave it, its actor, its footprint."""

    choice: int
    actor: str
    made: Footprint


def races(turns: list[Turn], since: int) -> list[tuple[int, int, set[str]]]:
    """The races of a run whose later turn's choice is at ``since`` or after:
    (the earlier turn, the later one, the actors that may go first to
    reverse it). Two turns race when they are of different actors, the
    later one depends on the earlier one directly (it reads or writes what
    that one wrote, or writes what it read), and on no other turn that the
    earlier one happens before. Happens-before is tracked with a vector
    clock per turn (actor -> its latest turn known)."""
    clocks: list[dict[str, int]] = []
    latest: dict[str, int] = {}  # actor -> its latest turn
    last_write: dict[int, int] = {}  # address -> the latest turn that wrote it
    reads_since: dict[int, list[int]] = {}  # address -> the turns that read it since
    last_everything = -1
    found = []
    for j, turn in enumerate(turns):
        made = turn.made
        direct = {latest[turn.actor]} if turn.actor in latest else set()
        if made.everything:
            direct.update(latest.values())
        else:
            if last_everything >= 0:
                direct.add(last_everything)
            direct.update(last_write[address] for address in made.reads | made.writes if address in last_write)
            for address in made.writes:
                direct.update(reads_since.get(address, ()))
        clock: dict[str, int] = {}
        for i in direct:
            for actor, tick in clocks[i].items():
                if tick > clock.get(actor, -1):
                    clock[actor] = tick
        clock[turn.actor] = j
        clocks.append(clock)
        if turn.choice >= since:
            racing = [i for i in direct if turns[i].actor != turn.actor and not any(
                k != i and clocks[k].get(turns[i].actor, -1) >= i for k in direct)]
            if racing:
                i = max(racing)
                found.append((i, j, _initials(turns, clocks, i, j)))
        latest[turn.actor] = j
        if made.everything:
            last_everything = j
        for address in made.writes:
            last_write[address] = j
            reads_since[address] = []
        for address in made.reads:
            reads_since.setdefault(address, []).append(j)
    return found


def _initials(turns: list[Turn], clocks: list[dict[str, int]], i: int, j: int) -> set[str]:
    """The actors that may go first in the turns after i, up to j, that i
    does not happen before (source-set DPOR's initials, Abdulla et al.
    2014): those whose first such turn no other such turn happens before."""
    first_actor = turns[i].actor
    chosen = [t for t in range(i + 1, j) if clocks[t].get(first_actor, -1) < i] + [j]
    first_of: dict[str, int] = {}  # actor -> its first turn among them
    initials: set[str] = set()
    for t in chosen:
        actor = turns[t].actor
        if actor in first_of:
            continue
        if not any(clocks[t].get(other, -1) >= first for other, first in first_of.items()):
            initials.add(actor)
        first_of[actor] = t
    return initials


def time_matters(watch: "RaceWatch", index: int) -> bool:
    """Whether time passing at turn choice ``index`` of the run may change
    anything: the turn run there reads the clock, someone sleeps until a
    time, or a spinning actor (set aside) watches the clock. Elsewhere it
    is the same as passing just before the next turn that reads the clock."""
    if index in watch.waiting_for_time:
        return True
    return any(turn.choice == index and CLOCK in turn.made.reads for turn in watch.turns)


def reversals(turns: list[Turn], choices: list[Choice], since: int) -> list[tuple[int, str]]:
    """(choice index, actor) to run instead, for each race of the run whose
    later turn is at choice ``since`` or after: an actor that may go first
    to reverse it, at the earlier turn's choice and at the choice that began
    that actor's run of turns (a switch there may cost one preemption less:
    Coons et al., 2013). An actor of the initials not ready there: every
    ready actor is tried instead."""
    wanted = []
    for i, j, initials in races(turns, since):
        start = i
        while start > 0 and turns[start - 1].actor == turns[i].actor:
            start -= 1
        for turn in sorted({start, i}):
            index = turns[turn].choice
            ready = [option for option in choices[index].options if not is_mishap(option)]
            later = turns[j].actor
            pick = [later] if later in initials and later in ready else sorted(initials.intersection(ready))[:1]
            # the default there was run by the run that first got there
            wanted += [(index, actor) for actor in (pick or ready) if actor not in (choices[index].chosen,
                                                                                    choices[index].default)]
    return wanted


class RaceWatch:
    """The chooser of one run of a ``por`` search: replays ``prefix``, then
    takes the default choices, noting each turn's footprint (``turns``)
    and the turn choices at which time passing matters."""

    def __init__(self, prefix: list[Any]) -> None:
        self.prefix = prefix
        self.execution: Execution | None = None  # the run's, once it made a choice
        self.turn: tuple[str, int, int, int, int, int] | None = None
        # the turn under way: (actor, its first step, its first payload access, the index of its choice, the
        # clock's reads and the looks at the actors' states before it)
        self.clock_since_write: dict[str, bool] = {}  # actor -> it read the clock since its last write
        self.waiting_for_time: set[int] = set()  # turn choices at which someone sleeps or watches the clock
        self.turns: list[Turn] = []  # the run's turns so far, in order

    def __call__(self, index: int, choice: Choice) -> Any:
        execution = choice.execution
        assert execution is not None
        self.execution = execution
        chosen = self.prefix[index] if index < len(self.prefix) else choice.default
        if choice.kind == "read":
            return chosen
        self.end_turn()
        if any(actor.asleep_until is not None or actor.spinning and self.clock_since_write.get(actor.name)
               for actor in execution.actors):
            self.waiting_for_time.add(index)
        if not is_mishap(chosen):
            self.turn = (str(chosen), len(execution.outcome.steps), len(execution.payloads), index,
                         execution.mishaps.clock.reads if execution.mishaps else 0, execution.state_reads)
        return chosen

    def end_turn(self) -> None:
        """Note the turn under way (if any) as over: its footprint."""
        if self.turn is None or self.execution is None:
            return
        execution = self.execution
        name, first_step, first_payload, chosen_at, clock_reads, state_reads = self.turn
        self.turn = None
        actor = next(actor for actor in execution.actors if actor.name == name)
        made = footprint(execution.outcome.steps[first_step:], execution.payloads[first_payload:],
                         execution.memory_model == "ra")
        reads, writes = set(made.reads), set(made.writes)
        if execution.mishaps and execution.mishaps.clock.reads != clock_reads:
            reads.add(CLOCK)
        if execution.state_reads != state_reads:
            reads.add(STATES)
        if actor.state in ("done", "dead"):
            writes.add(STATES)  # others wait for it to be over
        if reads != made.reads or writes != made.writes:
            made = Footprint(frozenset(reads), frozenset(writes), made.everything)
        if made.writes:
            self.clock_since_write[name] = False
        if CLOCK in made.reads:
            self.clock_since_write[name] = True
        self.turns.append(Turn(chosen_at, name, made))
