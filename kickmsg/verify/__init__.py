"""Explore interleavings of the real publish, receive, join and drain code.

Like loom for Rust, over a real region: actors (publishers, subscribers that
join, leave and join again, optionally a repair pass) run this package's own
code against a region in private memory, one atomic operation at a time
(``kickmsg.verify.scheduler``), and the protocol's invariants are checked
between any two steps and at the end (``kickmsg.verify.invariants``).

- ``explore(scenario, preemptions=K)`` runs every schedule with at most K
  preemptions (CHESS): a preemption is switching away from an actor that
  could go on. Those with fewer preemptions first, stopping at the first
  violation.
- ``explore_random(scenario, runs=N, seed=S)`` runs N seeded random
  schedules, with few switches each.
- ``mutant=`` runs the same with one of the spec's rules broken
  (``kickmsg.verify.mutants``); the exploration should then find a violation.

A violation comes with its counter-example: the numbered steps of each actor,
which function of the package was at work, and where preemptions happened.
"""
import collections
import random
import time
from dataclasses import dataclass, field

from kickmsg import layout, region as region_module, shm
from kickmsg.atomics import HARDWARE
from kickmsg.config import ChannelType, Config
from kickmsg.publisher import Publisher
from kickmsg.subscriber import Subscriber
from kickmsg.verify import invariants, mutants
from kickmsg.verify.mutants import MUTANTS
from kickmsg.verify.scheduler import Actor, Execution, Outcome, ScheduledAtomics

__all__ = ["MUTANTS", "MUTANT_SCENARIOS", "Report", "Scenario", "explore", "explore_random"]


@dataclass(frozen=True)
class Scenario:
    """Who runs, on what region."""

    publishers: int = 2
    messages: int = 2  # each publisher's
    subscribers: int = 1  # each joins, reads one message, leaves, joins again, reads on
    rings: int = 0  # max_subscribers (0: one per subscriber)
    capacity: int = 2
    pool: int = 4
    payload: int = 8
    rejoin: bool = True  # subscribers leave after their first message and join again
    repairer: bool = False  # an actor that runs repair_locked_entries() once, concurrently

    def config(self) -> Config:
        return Config(
            max_subscribers=self.rings or self.subscribers,
            sub_ring_capacity=self.capacity,
            pool_size=self.pool,
            max_payload_size=self.payload,
            commit_timeout=3600.0,  # nobody crashes here: a waiting loop never times out
        )

    def describe(self) -> str:
        return (
            f"{self.publishers} publishers x {self.messages} messages, {self.subscribers} subscriber(s) "
            f"({'join, leave, join again' if self.rejoin else 'join, read, leave'}), "
            f"{self.config().max_subscribers} ring(s) of {self.capacity}, "
            f"pool {self.pool}" + (", a concurrent repair pass" if self.repairer else "")
        )


# The small configuration in which the explorer finds each mutant (the
# unmutated code passes all of them). A reference counted ring by ring
# differs from a pre-set one only with two rings or more.
MUTANT_SCENARIOS = {
    "write-pos-after-live": Scenario(),
    "release-before-lock": Scenario(),
    "refcount-per-ring": Scenario(subscribers=2),
    "no-seqlock-recheck": Scenario(),
}


@dataclass
class Report:
    """The result of an exploration."""

    scenario: Scenario
    mutant: str | None
    schedules: int
    complete: bool  # every schedule within the bound was run
    seconds: float
    violation: str | None = None
    trace: str | None = None  # the counter-example, numbered

    def summary(self) -> str:
        what = f"mutant {self.mutant}" if self.mutant else "the unmutated code"
        extent = "all of them" if self.complete else "not exhaustive"
        found = f"VIOLATION: {self.violation.splitlines()[0]}" if self.violation else "no violation"
        return f"{what}: {found} ({self.schedules} schedules in {self.seconds:.1f} s, {extent}; {self.scenario.describe()})"


@dataclass
class World:
    """One execution's region, actors and what the subscribers received."""

    region: object
    actors: list[Actor]
    ledger: invariants.Ledger
    received: dict[str, list] = field(default_factory=dict)  # subscriber -> [(ring, position, bytes)]
    checked_steps: int = 0


def _private_region(scenario: Scenario):
    """A region laid out exactly as in shared memory, in private memory."""
    geometry, creator = region_module._new_geometry("/kickmsg_verify", ChannelType.PubSub, scenario.config(), "verify")
    mapping = shm.Mapping.private("/kickmsg_verify", geometry.total_size)
    return region_module._initialise(mapping, geometry, creator, None, in_place=False)


def _world(scenario: Scenario) -> World:
    region = _private_region(scenario)
    world = World(region, [], invariants.Ledger(region))
    publishers = []

    def publishers_done() -> bool:
        return all(actor.state == "done" for actor in publishers)

    def publisher(index: int):
        def publish(region):
            sender = Publisher(region)
            for sequence in range(scenario.messages):
                try:
                    sender.send(invariants.message(index, sequence, scenario.payload))
                except BlockingIOError:
                    pass  # the pool was dry: this message is not published
        return publish

    def subscriber(name: str):
        def subscribe(region):
            for session in ("first", "second") if scenario.rejoin else ("only",):
                with Subscriber(region) as receiver:
                    while True:
                        view = receiver.try_receive_view()
                        if view is not None:
                            with view:
                                world.received[name].append((receiver._ring.index, view.ring_pos, bytes(view)))
                            if session == "first":
                                break  # leave after one message, then join again
                        elif publishers_done():
                            break
        return subscribe

    def repair(region):
        region.repair_locked_entries()

    for index in range(scenario.subscribers):
        world.received[f"sub{index}"] = []
        world.actors.append(Actor(f"sub{index}", subscriber(f"sub{index}")))
    publishers.extend(Actor(f"pub{index}", publisher(index)) for index in range(scenario.publishers))
    world.actors.extend(publishers)
    if scenario.repairer:
        world.actors.append(Actor("repair", repair))
    return world


def _check(world: World, scenario: Scenario):
    def check(execution: Execution) -> str | None:
        for step in execution.outcome.steps[world.checked_steps :]:
            world.ledger.follow(step)
        world.checked_steps = len(execution.outcome.steps)
        for actor in world.actors:
            if actor.state == "done":
                world.ledger.finished(actor.name)
        found = invariants.memory_violation(world.region, world.ledger) or invariants.delivery_violation(
            world.received, world.ledger.committed, scenario.payload)
        if found is None and all(actor.state == "done" for actor in world.actors):
            found = invariants.end_violation(world.region)
        return found
    return check


def run_schedule(scenario: Scenario, choose) -> tuple[World, Outcome]:
    """Run every actor once, under the schedule ``choose`` makes."""
    world = _world(scenario)
    execution = Execution(world.region, world.actors, choose, _check(world, scenario))
    world.region.atomics = ScheduledAtomics(execution)
    try:
        return world, execution.run()
    finally:
        world.region.atomics = HARDWARE  # for finalizers that run later, outside any schedule


def _follow(prefix: list[str]):
    """A chooser that replays ``prefix``, then keeps the running actor."""
    def choose(index: int, ready: list[Actor], previous: Actor | None) -> Actor:
        if index < len(prefix):
            return next(actor for actor in ready if actor.name == prefix[index])
        return previous if previous in ready else ready[0]
    return choose


def _preemptions(decisions) -> list[int]:
    """Preemptions used before each decision."""
    used, counts = 0, []
    for chosen, ready, previous in decisions:
        counts.append(used)
        used += previous in ready and chosen != previous
    return counts


def explore(scenario: Scenario = Scenario(), mutant: str | None = None, preemptions: int = 2,
            max_schedules: int = 1_000_000) -> Report:
    """Every schedule with at most ``preemptions`` preemptions: all those
    with none first, then with one, ... (iterative context bounding), each
    level breadth first. The first violation found is thus one with the
    fewest preemptions."""
    began = time.monotonic()
    pending = [collections.deque() for _ in range(preemptions + 1)]  # schedule prefixes still to run, by preemptions used
    pending[0].append([])
    schedules = 0
    with mutants.installed(mutant):
        for level in pending:
            while level and schedules < max_schedules:
                prefix = level.popleft()
                world, outcome = run_schedule(scenario, _follow(prefix))
                schedules += 1
                if outcome.violation:
                    return _report(scenario, mutant, schedules, False, began, world, outcome)
                used = _preemptions(outcome.decisions)
                names = [chosen for chosen, _, _ in outcome.decisions]
                for index in range(len(prefix), len(outcome.decisions)):
                    chosen, ready, previous = outcome.decisions[index]
                    for alternative in ready:
                        cost = used[index] + (previous in ready and alternative != previous)
                        if alternative != chosen and cost <= preemptions:
                            pending[cost].append(names[:index] + [alternative])
    return _report(scenario, mutant, schedules, not any(pending), began, None, None)


def explore_random(scenario: Scenario = Scenario(), mutant: str | None = None, runs: int = 1000,
                   seed: int = 0, switch: float = 0.05) -> Report:
    """``runs`` seeded random schedules: at each step the running actor goes
    on, except with probability ``switch`` (or when it cannot), when a ready
    actor is picked uniformly. Few switches per run, like the bugs found."""
    began = time.monotonic()
    with mutants.installed(mutant):
        for run in range(runs):
            rng = random.Random(f"{seed}-{run}")

            def choose(index: int, ready: list[Actor], previous: Actor | None) -> Actor:
                if previous in ready and rng.random() >= switch:
                    return previous
                return rng.choice(ready)

            world, outcome = run_schedule(scenario, choose)
            if outcome.violation:
                return _report(scenario, mutant, run + 1, False, began, world, outcome)
    return _report(scenario, mutant, runs, False, began, None, None)


def _report(scenario, mutant, schedules, complete, began, world, outcome) -> Report:
    report = Report(scenario, mutant, schedules, complete, time.monotonic() - began)
    if outcome is not None:
        report.violation = outcome.violation
        report.trace = format_trace(world, outcome)
    return report


# -- the counter-example, readable -------------------------------------------------------------


def describe_address(region, address: int) -> str:
    """The region word at ``address``, by name: header.free_top, ring 0
    entry 1.sequence, slot 3.refcount, ..."""
    return layout.field_at(region.geometry, address - region.mapping.address).label


def describe_value(place: str, value) -> str:
    if value is None:
        return "-"
    if value == layout.LOCKED_SEQUENCE and place.endswith(".sequence"):
        return "LOCKED"
    if value == layout.INVALID_SLOT and place.endswith((".slot_idx", ".next_free")):
        return "INVALID"
    if place == "header.free_top":
        slot = value & layout.U32_MAX
        return f"gen {value >> 32}|{'INVALID' if slot == layout.INVALID_SLOT else f'slot {slot}'}"
    if place.endswith(".state_flight"):
        state = layout.RING_STATE_NAMES.get(value & layout.RING_STATE_MASK, "?")
        return f"{state}+{value >> 2}"
    return str(value)


def format_step(region, number: int, step, preempted: str | None) -> str:
    place = describe_address(region, step.address)
    if step.operation.startswith("fetch_"):
        operands = ", ".join(str(operand) for operand in step.operands)  # an amount, not a value of the word
    else:
        operands = ", ".join(describe_value(place, operand) for operand in step.operands)
    call = f"{step.operation}({place}{', ' + operands if operands else ''})"
    line = f"{number:>4}. {step.actor:<6} {step.where:<28} {call:<62} -> {describe_value(place, step.result)}"
    return line + (f"   << preempts {preempted}" if preempted else "")


def format_trace(world: World, outcome: Outcome) -> str:
    """Every step, numbered, with the preemptions marked."""
    preempting = {}  # step index -> the actor it preempted
    for (chosen, ready, previous), start in zip(outcome.decisions, outcome.turn_starts):
        if previous in ready and chosen != previous and start < len(outcome.steps):
            preempting[start] = previous
    lines = [format_step(world.region, index + 1, step, preempting.get(index)) for index, step in enumerate(outcome.steps)]
    lines.append(f"violation: {outcome.violation}")
    return "\n".join(lines)
