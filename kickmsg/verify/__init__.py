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
- ``reduction="por"`` (the default) runs one schedule per order of the
  dependent steps (``kickmsg.verify.reduction``); "none" runs every one.
- ``mutant=`` runs the same with one of the spec's rules broken
  (``kickmsg.verify.mutants``); the exploration should then find a violation.
- ``memory_model="ra"`` runs them under the C/C++ release/acquire/relaxed
  model (``kickmsg.verify.memory``) instead of sequential consistency: a load
  may also read an older store, at most ``stale`` times per schedule, and
  every access to a payload is checked for data races.

A violation comes with its counter-example (``kickmsg.verify.traces``, on
both layouts): the numbered steps of each actor, which function of the
package was at work, and where preemptions happened.

Beside the explorer are the other checks of the implementation itself:
``kickmsg.verify.crosscheck``, the differential cross-check against the
native library, over ``kickmsg.verify.crossdriver`` (the driver it runs in
both implementations), and ``kickmsg.verify.faults``, crash-point injection
(a publisher stopped at a point of the spec).
"""
import collections
import hashlib
import random
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from kickmsg import shm
from kickmsg.protocol.v4 import region as region4
from kickmsg.atomics import HARDWARE
from kickmsg.config import ChannelType, Config
from kickmsg.publisher import Publisher
from kickmsg.protocol.v4 import receive as receive4
from kickmsg.protocol.v4 import rings as rings4
from kickmsg.protocol.v4.region import RingAddresses
from kickmsg.subscriber import SampleView, Subscriber
from kickmsg.verify import invariants, layout9, mutants, traces
from kickmsg.verify.reduction import RaceWatch, reversals, time_matters
from kickmsg.verify.mutants import MUTANTS, MUTANTS9
from kickmsg.verify.memory import PayloadBuffer
from kickmsg.region import SharedRegion
from kickmsg.verify.scheduler import (
    MAX_STEPS, Actor, Checker, Choice, Chooser, Execution, Mishaps, ModelledClock, Outcome, ScheduledAtomics,
    TIME_PASSES, is_mishap,
)
from kickmsg.verify.layout9 import Scenario9

__all__ = [
    "BOUNDS", "MUTANTS", "MUTANTS9", "MUTANT_SCENARIOS", "Report", "SIZES", "Scenario", "Scenario9", "check_bounds",
    "check_scenario", "explore", "explore_random", "REDUCTIONS",
]

# The least and the most each number of a scenario may be (refused beyond,
# before anything runs): an actor is a greenlet and every step is checked
# against the whole region, so larger ones would only run for days, or grow
# to gigabytes of pending schedules. Rings 0 is one per subscriber.
SIZES = {
    "publishers": (0, 8), "messages": (1, 16), "subscribers": (0, 8), "idle": (0, 8), "rings": (0, 16),
    "capacity": (1, 64), "pool": (1, 256), "deaths": (0, 8), "subscriber_deaths": (0, 8), "reclaimers": (0, 4),
}
# The same for the bounds of an exploration (None: no budget).
BOUNDS = {
    "preemptions": (0, 8), "stale": (0, 8), "budget": (0, 16), "max_schedules": (1, 10_000_000),
    "runs": (1, 10_000_000),
}
REDUCTIONS = ("none", "por")  # every schedule within the bounds; one per order of the dependent steps


@dataclass(frozen=True)
class Scenario:
    """Who runs, on what region."""

    publishers: int = 2
    messages: int = 2  # each publisher's
    subscribers: int = 1  # each joins, reads one message (a view), leaves, joins again, reads on (copies)
    rings: int = 0  # max_subscribers (0: one per subscriber)
    capacity: int = 2
    pool: int = 4
    payload: int = max(invariants.MESSAGE_SIZES)
    rejoin: bool = True  # subscribers leave after their first message and join again
    repairer: bool = False  # an actor that runs repair_locked_entries() once, concurrently
    blocking: bool = False  # subscribers receive with the core's blocking receive (parked on the futex), not polling
    idle: int = 0  # rings joined before the run by subscribers that read nothing and leave after it

    def config(self) -> Config:
        return Config(
            max_subscribers=self.rings or self.subscribers + self.idle,
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
            + (", subscribers sleep on the futex" if self.blocking else "")
            + (f", {self.idle} idle subscriber(s) (joined before, left after)" if self.idle else "")
        )


# The small configuration in which the explorer finds each mutant (the
# unmutated code passes all of them under sequential consistency). A
# reference counted ring by ring differs from a pre-set one only with two
# rings or more.
MUTANT_SCENARIOS = {
    "write-pos-after-live": Scenario(),
    "release-before-lock": Scenario(),
    "refcount-per-ring": Scenario(subscribers=2),
    "no-seqlock-recheck": Scenario(),
    "commit-relaxed": Scenario(),
    "seq-load-relaxed": Scenario(),
    "inflight-release-relaxed": Scenario(),
    "payload-after-commit": Scenario(),
    "spec-seqlock-orders": Scenario(),
    "park-without-waiter": Scenario(publishers=1, messages=1, rejoin=False, blocking=True),
}
RECEIVE_TIMEOUT_NS = 1_000_000_000  # a blocking subscriber's receive timeout (modelled time)


@dataclass
class Report:
    """The result of an exploration."""

    scenario: "Scenario | Scenario9"
    mutant: str | None
    schedules: int
    complete: bool  # every schedule within the bound was run
    seconds: float
    violation: str | None = None
    trace: str | None = None  # the counter-example, numbered
    memory_model: str = "sc"
    stale: int = 0  # stale reads allowed per schedule (ra)
    budget: int | None = None  # preemptions and stale reads allowed together
    reduction: str = "none"

    @property
    def rate(self) -> float:
        """Schedules run a second."""
        return self.schedules / max(self.seconds, 1e-9)

    def summary(self) -> str:
        what = f"mutant {self.mutant}" if self.mutant else "the unmutated code"
        extent = "all of them" if self.complete else "not exhaustive"
        found = f"VIOLATION: {self.violation.splitlines()[0]}" if self.violation else "no violation"
        model = "" if self.memory_model == "sc" else f"; memory model ra, at most {self.stale} stale read(s)"
        model += "" if self.budget is None else f", {self.budget} preemptions and stale reads in all"
        return (f"{what}: {found} ({self.schedules} schedules in {self.seconds:.1f} s, "
                f"{self.rate:.0f} a second, {extent}, reduction {self.reduction}; {self.scenario.describe()}{model})")


@dataclass
class World:
    """One execution's region, actors and what the subscribers received."""

    region: SharedRegion
    core: region4.Region  # its core, which the invariants read
    actors: list[Actor]
    ledger: invariants.Ledger
    received: invariants.Received = field(default_factory=dict)  # subscription -> [(ring, position, bytes)]
    checked_steps: int = 0
    stopped: dict[str, tuple[int, int]] = field(default_factory=dict)  # subscriber -> (its read_pos, its ring's
    # write_pos) as its last session stopped reading
    clock: ModelledClock = field(default_factory=ModelledClock)  # what a blocking receive's deadline is in
    execution: Execution | None = None
    idle: list[tuple[RingAddresses, int]] = field(default_factory=list)  # rings joined before the run (and where
    # they started), left after it
    sent: int = 0  # messages that got a slot (published)
    dry: str | None = None  # under sc, a publisher that found the pool dry with slots on the free stack
    lost: dict[str, int] = field(default_factory=dict)  # subscription -> the losses it counted


def _private_region(scenario: Scenario) -> region4.Region:
    """A region laid out exactly as in shared memory, in private memory."""
    geometry, creator = region4.new_geometry("/kickmsg_verify", ChannelType.PubSub, scenario.config(), "verify")
    mapping = shm.Mapping.private("/kickmsg_verify", geometry.total_size)
    return region4.initialise(mapping, geometry, creator, None, in_place=False)


def _world(scenario: Scenario) -> World:
    core = _private_region(scenario)
    world = World(SharedRegion(core), core, [], invariants.Ledger(core))
    publishers: list[Actor] = []

    def publishers_done() -> bool:
        assert world.execution is not None
        return all(state == "done" for state in world.execution.looks_at(publishers))

    def found_dry(name: str) -> None:
        """Under sc nothing ran since the pop's last look: the free stack must be empty."""
        assert world.execution is not None
        free = invariants.free_slots(world.core)
        if world.execution.memory_model == "sc" and free and world.dry is None:
            world.dry = f"{name} found the pool dry with slot(s) {free} on the free stack"

    def publisher(index: int) -> Callable[[SharedRegion], None]:
        # Even publishers copy their messages in (send), odd ones fill a slot
        # in place (allocate, publish): the same atomic steps, both paths.
        def publish(region: SharedRegion) -> None:
            sender = Publisher(region)
            for sequence in range(scenario.messages):
                data = invariants.message(index, sequence)
                if index % 2 == 0:
                    try:
                        sender.send(data)
                    except BlockingIOError:
                        found_dry(f"pub{index}")  # this message is not published
                        continue
                else:
                    slot = sender.allocate(len(data))
                    if slot is None:
                        found_dry(f"pub{index}")
                        continue
                    with memoryview(slot) as buffer:
                        buffer[:] = data
                    slot.publish()
                world.sent += 1
        return publish

    def subscriber(name: str) -> Callable[[SharedRegion], None]:
        # The first session receives a view, the others copies: the same
        # atomic steps, both paths.
        def subscribe(region: SharedRegion) -> None:
            for session in ("first", "second") if scenario.rejoin else ("only",):
                # Each subscription receives a message at most once: joined
                # again (maybe on another ring), it may receive one it had.
                received = world.received[name if session != "second" else f"{name} (joined again)"]
                with Subscriber(region) as receiver:
                    core = receiver.core
                    assert isinstance(core, receive4.Subscriber)  # a layout-4 region's
                    core.monotonic_ns = world.clock.monotonic_ns
                    while True:
                        if scenario.blocking:
                            # The core's blocking receive, which Subscriber.receive calls.
                            over = publishers_done()  # before the last look: nothing is published after it
                            core_view = core.receive_view_until(world.clock.monotonic_ns() + RECEIVE_TIMEOUT_NS)
                            if core_view is not None:
                                with SampleView(core_view) as received_view:
                                    received.append((core.ring_index, received_view.ring_pos, bytes(received_view)))
                                if session == "first":
                                    break  # leave after one message, then join again
                            elif over:
                                break
                            continue
                        if session == "first":
                            view = receiver.try_receive_view()
                            got = view is not None
                            if view is not None:
                                with view:
                                    received.append((receiver.core.ring_index, view.ring_pos, bytes(view)))
                                break  # leave after one message, then join again
                        else:
                            data = receiver.try_receive()
                            got = data is not None
                            if data is not None:
                                received.append((receiver.core.ring_index, receiver.core.read_pos - 1, data))
                        if not got and publishers_done():
                            break
                    world.lost[name if session != "second" else f"{name} (joined again)"] = core.lost
                    if session != "first":  # it stopped reading because the publishers had finished
                        world.stopped[name] = (core.read_pos, HARDWARE.load_relaxed_u64(core.ring.write_pos))
        return subscribe

    def repair(region: SharedRegion) -> None:
        region.repair_locked_entries()

    for index in range(scenario.subscribers):
        world.received[f"sub{index}"] = []
        world.received[f"sub{index} (joined again)"] = []
        world.actors.append(Actor(f"sub{index}", subscriber(f"sub{index}")))
    publishers.extend(Actor(f"pub{index}", publisher(index)) for index in range(scenario.publishers))
    world.actors.extend(publishers)
    if scenario.repairer:
        world.actors.append(Actor("repair", repair))
    for _ in range(scenario.idle):
        joined = rings4.join(core)
        assert joined is not None
        world.idle.append(joined)
    return world


def _idle_violation(world: World, memory_model: str) -> str | None:
    """Once every actor is done: under sc, each idle ring (Live from before
    the first publish to after the last) was given every message sent; then
    the idle subscribers leave (drain), unless a publisher is still counted
    in flight (its leave would wait for it for the whole commit timeout)."""
    for ring, _ in world.idle:
        write_pos = HARDWARE.load_relaxed_u64(ring.write_pos)
        if memory_model == "sc" and write_pos != world.sent:
            return f"idle ring {ring.index} was given {write_pos} of the {world.sent} messages sent"
        in_flight = HARDWARE.load_relaxed_u32(ring.state_flight) >> 2
        if in_flight:
            return f"idle ring {ring.index} ends with {in_flight} publisher(s) in flight"
    for ring, start_pos in world.idle:
        rings4.leave(world.core, ring, start_pos)
    world.idle = []
    return None


def _unread(world: World) -> str | None:
    """Under sc, a subscriber whose last session stopped before its ring's
    write_pos: every position was committed by then, unread."""
    for name, (read_pos, write_pos) in world.stopped.items():
        if read_pos != write_pos:
            return f"{name} stopped at position {read_pos}, but its ring's write_pos is {write_pos}: unread"
    return None


def _lost_unwrapped(world: World, scenario: Scenario) -> str | None:
    """Under sc, a subscription that counted a loss on a ring that never
    wrapped (no more messages than its capacity): nothing was overwritten,
    every entry it read was well formed, so nothing may be lost."""
    if scenario.publishers * scenario.messages > scenario.capacity:
        return None
    for name, lost in world.lost.items():
        if lost:
            return f"{name} counted {lost} lost on a ring that never wrapped"
    return None


def _check(world: World, scenario: Scenario, memory_model: str = "sc") -> Checker:
    def check(execution: Execution) -> str | None:
        for step in execution.outcome.steps[world.checked_steps :]:
            world.ledger.follow(step)
        world.checked_steps = len(execution.outcome.steps)
        for actor in world.actors:
            if actor.state == "done":
                world.ledger.finished(actor.name)
        found = world.dry or invariants.memory_violation(world.core, world.ledger) or invariants.delivery_violation(
            world.received, world.ledger.committed)
        if found is None and all(actor.state == "done" for actor in world.actors):
            found = (_idle_violation(world, memory_model) or invariants.end_violation(world.core)
                     or (_unread(world) or _lost_unwrapped(world, scenario) if memory_model == "sc" else None))
        return found
    return check


def run_schedule(scenario: Scenario, choose: Chooser, memory_model: str = "sc",
                 max_steps: int = MAX_STEPS) -> tuple[World, Outcome]:
    """Run every actor once, under the choices ``choose`` makes (a livelock
    after ``max_steps`` steps)."""
    world = _world(scenario)
    region = world.core
    mishaps = None
    if scenario.blocking:  # a futex sleep is modelled (no death: layout 4's actors do not die here)
        mishaps = Mishaps(world.clock, receive4.UNCOMMITTED_POLL_NS, (), 0,
                          lambda address: traces.describe_address(world.region, address) + " (low 32 bits)")
    execution = Execution(world.region, world.actors, choose, _check(world, scenario, memory_model), memory_model,
                          max_steps=max_steps, mishaps=mishaps)
    world.execution = execution
    region.atomics = ScheduledAtomics(execution)
    plain_bytes = region.mapping.buffer
    # every payload access reported: a data race under ra, a turn's footprint for the reduction
    region.mapping.buffer = PayloadBuffer(region, execution)  # type: ignore[assignment]  # a memoryview stand-in
    try:
        return world, execution.run()
    finally:
        region.atomics = HARDWARE  # for finalizers that run later, outside any schedule
        region.mapping.buffer = plain_bytes


def _within(name: str, value: object, least: int, most: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or not least <= value <= most:
        raise ValueError(f"{name} must be a whole number from {least} to {most}, not {value!r}")


def check_bounds(**bounds: int | None) -> None:
    """Raise ValueError naming the first bound of ``BOUNDS`` out of its
    range (``check_bounds(preemptions=-1)``); None is no bound."""
    for name, value in bounds.items():
        if value is not None:
            _within(name, value, *BOUNDS[name])


def check_scenario(scenario: "Scenario | Scenario9") -> None:
    """Raise ValueError naming the first number of the scenario out of its
    range (``SIZES``), or more deaths than there are publishers or
    subscribers to die."""
    for name, (least, most) in SIZES.items():
        if hasattr(scenario, name):
            _within(name, getattr(scenario, name), least, most)
    if isinstance(scenario, Scenario9):
        for index, count in enumerate(scenario.sends):
            _within(f"sends[{index}]", count, 0, SIZES["messages"][1])
        _within("deaths (at most one per publisher)", scenario.deaths, 0, scenario.publishers)
        _within("subscriber_deaths (at most one per subscriber)", scenario.subscriber_deaths, 0, scenario.subscribers)


def _run(scenario: "Scenario | Scenario9", choose: Chooser, memory_model: str,
         max_steps: int = MAX_STEPS) -> "tuple[World | layout9.World9, Outcome]":
    """One execution of a layout-4 or a layout-9 scenario; ``final_state``
    noted if every actor got to its end."""
    world: World | layout9.World9
    if isinstance(scenario, Scenario9):
        world, outcome = layout9.run_schedule(scenario, choose, memory_model, max_steps)
        mapping, first = world.region.mapping, world.region.geometry.sub_rings_offset
    else:
        world, outcome = run_schedule(scenario, choose, memory_model, max_steps)
        mapping, first = world.core.mapping, min(world.core.geometry.sub_rings_offset, world.core.geometry.pool_offset)
    if outcome.violation is None:  # the header (its creation stamp) left out
        digest = hashlib.blake2b(bytes(mapping.buffer[first:]), digest_size=16)
        digest.update(repr(sorted(world.received.items())).encode())
        outcome.final_state = digest.hexdigest()
    return world, outcome


def _follow(prefix: list[Any]) -> Chooser:
    """A chooser that replays ``prefix``, then makes the default choices:
    the running actor goes on, a load reads the newest store."""
    def choose(index: int, choice: Choice) -> Any:
        return prefix[index] if index < len(prefix) else choice.default
    return choose


def _spent(choices: list[Choice]) -> list[tuple[int, int]]:
    """(preemptions, stale reads) made before each choice."""
    preemptions = stale = 0
    spent = []
    for choice in choices:
        spent.append((preemptions, stale))
        preemptions += choice.preempts
        stale += choice.stale
    return spent


def explore(scenario: "Scenario | Scenario9" = Scenario(), mutant: str | mutants.Mutant | None = None, preemptions: int = 2,
            max_schedules: int = 1_000_000, memory_model: str = "sc", stale: int = 0, budget: int | None = None,
            observe: Callable[[Outcome], object] | None = None, reduction: str = "por",
            max_steps: int = MAX_STEPS) -> Report:
    """Every schedule with at most ``preemptions`` preemptions, (under the
    ra model) at most ``stale`` loads reading an older store than the
    newest, and at most ``budget`` of both together (None: no more bound):
    those with no such choice first, then with one, ... (iterative context
    bounding, a stale read counting as a preemption does), each level
    breadth first. The first violation found is thus one with the fewest
    unusual choices. With ``stale=0`` the schedules are exactly those of
    sequential consistency. ``reduction="por"`` runs one schedule per
    order of the dependent steps (``kickmsg.verify.reduction``), "none"
    every one. ``observe(outcome)``, if given, sees every execution; one
    with more than ``max_steps`` steps is a livelock."""
    check_scenario(scenario)
    check_bounds(preemptions=preemptions, max_schedules=max_schedules, stale=stale, budget=budget)
    if stale and memory_model != "ra":
        raise ValueError("stale reads need the ra memory model")
    if reduction not in REDUCTIONS:
        raise ValueError(f"unknown reduction {reduction!r}; choose none or por")
    began = time.monotonic()
    levels = preemptions + stale + 1 if budget is None else min(preemptions + stale, budget) + 1
    # The prefixes still to run, by choices spent.
    pending: list[collections.deque[list[Any]]] = [collections.deque() for _ in range(levels)]
    pending[0].append([])
    asked: set[tuple[Any, ...]] = set()  # the prefixes put in pending so far (por: a race found again)
    schedules = 0
    change = _resolve(mutant)
    with mutants.installed(change):
        while schedules < max_schedules and any(pending):
            prefix = next(level for level in pending if level).popleft()  # the fewest choices spent first
            watch = RaceWatch(prefix) if reduction == "por" else None
            world, outcome = _run(scenario, watch or _follow(prefix), memory_model, max_steps)
            schedules += 1
            if observe:
                observe(outcome)
            if outcome.violation:
                return _report(scenario, change, schedules, False, began, world, outcome, memory_model, stale, budget,
                               reduction)
            spent = _spent(outcome.choices)
            made = [choice.chosen for choice in outcome.choices]

            def branch(index: int, alternative: Any) -> None:
                """Run ``alternative`` at choice ``index`` later, if within the bounds and not yet asked for."""
                choice = outcome.choices[index]
                used_preemptions, used_stale = spent[index]
                if choice.kind == "turn":
                    used_preemptions += choice.costs(alternative)
                else:
                    used_stale += 1
                spent_in_all = used_preemptions + used_stale
                key = (*made[:index], alternative)
                if used_preemptions <= preemptions and used_stale <= stale and spent_in_all < levels and key not in asked:
                    asked.add(key)
                    pending[spent_in_all].append(made[:index] + [alternative])

            if watch is not None:
                watch.end_turn()  # the last one
            for index in range(len(prefix), len(outcome.choices)):
                choice = outcome.choices[index]
                for alternative in choice.options:
                    if alternative == choice.chosen:
                        continue
                    if watch is None or choice.kind == "read" or (
                            is_mishap(alternative) and (alternative != TIME_PASSES or time_matters(watch, index))):
                        branch(index, alternative)
            if watch is not None:  # the reduction: the other turns only where the run's own races say so
                for index, alternative in reversals(watch.turns, outcome.choices, len(prefix) - 1):
                    branch(index, alternative)
    return _report(scenario, change, schedules, not any(pending), began, None, None, memory_model, stale, budget,
                   reduction)


def explore_random(scenario: "Scenario | Scenario9" = Scenario(), mutant: str | mutants.Mutant | None = None, runs: int = 1000,
                   seed: int = 0, switch: float = 0.05, memory_model: str = "sc", stale: int = 0,
                   observe: Callable[[Outcome], object] | None = None) -> Report:
    """``runs`` seeded random schedules: at each step the running actor goes
    on, except with probability ``switch`` (or when it cannot), when a ready
    actor is picked uniformly. Few switches per run, like the bugs found.
    Under the ra model a load reads an older store with probability
    ``switch`` too, at most ``stale`` times per run. ``observe(outcome)``,
    if given, sees every execution."""
    check_scenario(scenario)
    check_bounds(runs=runs, stale=stale)
    if stale and memory_model != "ra":
        raise ValueError("stale reads need the ra memory model")
    began = time.monotonic()
    change = _resolve(mutant)
    with mutants.installed(change):
        for run in range(runs):
            rng = random.Random(f"{seed}-{run}")
            stale_reads: list[int] = []

            def choose(index: int, choice: Choice) -> Any:
                if choice.kind == "turn":
                    if choice.previous in choice.options and rng.random() >= switch:
                        return choice.previous
                    return rng.choice(choice.options)
                if len(stale_reads) < stale and rng.random() < switch:
                    stale_reads.append(index)
                    return rng.choice(choice.options[1:])
                return 0

            world, outcome = _run(scenario, choose, memory_model)
            if observe:
                observe(outcome)
            if outcome.violation:
                return _report(scenario, change, run + 1, False, began, world, outcome, memory_model, stale)
    return _report(scenario, change, runs, False, began, None, None, memory_model, stale)


def _resolve(mutant: str | mutants.Mutant | None) -> mutants.Mutant | None:
    """A mutant given by name (in ``MUTANTS``) or built by the caller."""
    return mutant if isinstance(mutant, mutants.Mutant) else mutants.lookup(mutant)


def _report(
    scenario: "Scenario | Scenario9", change: mutants.Mutant | None, schedules: int, complete: bool, began: float,
    world: "World | layout9.World9 | None",
    outcome: Outcome | None, memory_model: str, stale: int, budget: int | None = None, reduction: str = "none",
) -> Report:
    report = Report(scenario, change.name if change else None, schedules, complete, time.monotonic() - began,
                    memory_model=memory_model, stale=stale, budget=budget, reduction=reduction)
    if world is not None and outcome is not None:
        report.violation = outcome.violation
        report.trace = traces.format_trace(world, outcome, world.repaired if isinstance(world, layout9.World9) else "")
    return report
