"""Crash points on layout 9 (``kickmsg verify --layout 9 --crash-points``).

For each flow an actor can die in (``FLOWS``: a publisher's allocate and
publish, to a polling and to a sleeping reader; a subscriber's join,
receive and leave, polling and blocking; a join that finds no Free ring
and heals it by reclaiming a dead subscriber's; the reclaimers of
``layout9.EVICTION``), the flow's default schedule runs once
(``kickmsg.verify.layout9``: every actor goes on until it waits or ends;
the others' traffic, a ``repair_locked_entries`` pass and a
``reclaim_dead_rings`` actor around it). Then, for every atomic step of
the victim in that schedule, a run replays the schedule up to the step and
makes the victim die there instead; with ``preemptions`` K, every schedule
that goes on from that death with at most K preemptions runs too. The
others go on, the repairs for a quiet region run at the end, and every
invariant of ``layout9`` is checked at every step and at the end. Each
death is a row: the step the victim never made, the first violation (if
any), and what the death lost for good (``layout9.lost``: a ring no
repair reclaims, and the slots its entries claim).
"""
import collections
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from kickmsg.verify import layout9, mutants
from kickmsg.verify.layout9 import Scenario9
from kickmsg.verify.scheduler import DIES, Choice, Outcome

__all__ = ["CrashFlow", "CrashRow", "FLOWS", "crash_points", "format_table", "plan"]


@dataclass(frozen=True)
class CrashFlow:
    """A flow to crash (``key``: its name on the command line): its
    scenario, the actor that dies, and deaths made before (actor, the
    steps it makes first) in every run of it."""

    key: str
    name: str
    scenario: Scenario9
    victim: str
    before: tuple[tuple[str, int], ...] = ()


# Around every victim: traffic, a repair_locked_entries pass and a reclaim_dead_rings actor.
FLOWS = (
    CrashFlow("publish", "publish (allocate, admission, lock, claim, commit), polling reader",
              Scenario9(deaths=1, repairer=True, reclaimers=1), "pub0"),
    # One publisher: its death before the wake leaves the reader asleep until its timeout.
    CrashFlow("publish-wake", "publish to a sleeping reader (the wake)",
              Scenario9(publishers=1, deaths=1, blocking=True, repairer=True, reclaimers=1), "pub0"),
    CrashFlow("subscribe", "subscribe: join, polling receive, leave/drain",
              Scenario9(subscriber_deaths=1, repairer=True, reclaimers=1), "sub0"),
    CrashFlow("subscribe-blocking", "subscribe: join, blocking receive, leave/drain",
              Scenario9(subscriber_deaths=1, blocking=True, repairer=True, reclaimers=1), "sub0"),
    # One ring: sub0 joins and dies (after its 5 join steps); sub1's join finds no Free ring, reclaims sub0's.
    CrashFlow("join-heals", "a join that heals (reclaims a dead subscriber's ring), receive, leave",
              Scenario9(publishers=1, subscribers=2, rings=1, subscriber_deaths=2, repairer=True, reclaimers=1), "sub1",
              before=(("sub0", 5),)),
    # Two reclaimers and sub1's join (a third) race for the dead sub0's ring: 0.9.2's evict sub1 (one preemption).
    CrashFlow("eviction", "EVICTION: two reclaimers and a joiner racing for the ring of a subscriber that dies",
              layout9.EVICTION, "sub0"),
)


@dataclass
class CrashRow:
    """``victim`` died before its step ``step`` of ``steps``: what that run
    (and those going on from it with preemptions) found."""

    flow: str
    victim: str
    step: int
    steps: int
    where: str  # function:line of the step it never made
    operation: str
    schedules: int  # the death's runs: 1, more with preemptions
    violation: str | None  # the first found
    rings_lost: int  # in the run with no preemption
    slots_lost: int
    repaired: str

    @property
    def outcome(self) -> str:
        return "ok" if self.violation is None else self.violation.splitlines()[0]

    def to_dict(self) -> dict[str, Any]:
        return {"flow": self.flow, "victim": self.victim, "step": self.step, "steps": self.steps, "where": self.where,
                "operation": self.operation, "schedules": self.schedules, "outcome": self.outcome,
                "violation": self.violation, "rings_lost": self.rings_lost, "slots_lost": self.slots_lost,
                "repaired": self.repaired}


def _replaying(choices: list[Any]) -> Callable[[int, Choice], Any]:
    """A chooser: ``choices`` in turn, then the defaults."""
    def choose(index: int, choice: Choice) -> Any:
        if index < len(choices):
            if choices[index] not in choice.options:
                raise RuntimeError(f"the replay diverged at choice {index}: {choices[index]!r} is not one of "
                                   f"{choice.options}")
            return choices[index]
        return choice.default
    return choose


def plan(outcome: Outcome, actor: str, steps: int) -> list[Any] | None:
    """The choices of ``outcome`` up to the last turn before ``actor``'s
    step ``steps + 1``, then its death there; None if it was never offered
    (the actor had not begun, or had ended)."""
    made = 0  # the actor's steps before the choice looked at
    counted = 0  # steps of the outcome counted so far
    last = None
    for index, choice in enumerate(outcome.choices):
        while counted < choice.step:
            made += outcome.steps[counted].actor == actor
            counted += 1
        if made > steps:
            break
        if made == steps and actor + DIES in choice.options:
            last = index
    if last is None:
        return None
    return [choice.chosen for choice in outcome.choices[:last]] + [actor + DIES]


def _going_on(scenario: Scenario9, death: list[Any], preemptions: int) -> tuple[int, str | None]:
    """Every schedule that makes the choices ``death``, then at most
    ``preemptions`` preemptions (those with fewer first): how many ran, and
    the first violation."""
    pending: list[collections.deque[list[Any]]] = [collections.deque() for _ in range(preemptions + 1)]
    pending[0].append(death)
    runs = 0
    for level in pending:
        while level:
            prefix = level.popleft()
            _, outcome = layout9.run_schedule(scenario, _replaying(prefix))
            runs += 1
            if outcome.violation:
                return runs, outcome.violation
            spent = sum(choice.preempts for choice in outcome.choices[len(death):len(prefix)])
            made = [choice.chosen for choice in outcome.choices]
            for index in range(len(prefix), len(outcome.choices)):
                choice = outcome.choices[index]
                for alternative in choice.options:
                    cost = spent + choice.costs(alternative)
                    if alternative != choice.chosen and cost <= preemptions:
                        pending[cost].append(made[:index] + [alternative])
                spent += choice.preempts
    return runs, None


def crash_points(flows: tuple[CrashFlow, ...] = FLOWS, preemptions: int = 0, mutant: str | None = None,
                 progress: Callable[[CrashRow, int, int], object] | None = None) -> list[CrashRow]:
    """Every crash point of every flow (sequential consistency), with at
    most ``preemptions`` preemptions after each death, the flows broken by
    ``mutant`` (a name of ``MUTANTS9``) if given; ``progress(row, done,
    total)`` is called as each row is done."""
    with mutants.installed(mutants.lookup(mutant)):
        bases = []
        for flow in flows:
            world, outcome = layout9.run_schedule(flow.scenario, _replaying([]))
            for actor, steps in flow.before:
                deaths = plan(outcome, actor, steps)
                if deaths is None:
                    raise ValueError(f"{flow.name}: {actor} cannot die after {steps} steps")
                world, outcome = layout9.run_schedule(flow.scenario, _replaying(deaths))
            if outcome.violation:
                raise ValueError(f"{flow.name}: the run without the victim's death fails: {outcome.violation}")
            victim_steps = [step for step in outcome.steps if step.actor == flow.victim]
            bases.append((flow, outcome, victim_steps))
        total = sum(len(victim_steps) - 1 for _, _, victim_steps in bases)
        rows: list[CrashRow] = []
        for flow, outcome, victim_steps in bases:
            for made in range(1, len(victim_steps)):
                death = plan(outcome, flow.victim, made)
                if death is None:
                    raise ValueError(f"{flow.name}: {flow.victim} cannot die after {made} steps")
                world, crashed = layout9.run_schedule(flow.scenario, _replaying(death))
                rings_lost, slots_lost = layout9.lost(world)
                schedules, violation = 1, crashed.violation
                if preemptions and violation is None:
                    schedules, violation = _going_on(flow.scenario, death, preemptions)
                skipped = victim_steps[made]  # the step it never made
                row = CrashRow(flow.name, flow.victim, made + 1, len(victim_steps), f"{skipped.where}:{skipped.line}",
                               skipped.operation, schedules, violation, rings_lost, slots_lost, world.repaired)
                rows.append(row)
                if progress:
                    progress(row, len(rows), total)
    return rows


def format_table(rows: list[CrashRow]) -> str:
    """The rows, a table per flow, then a line per flow: deaths, schedules,
    violations, losses."""
    lines = []
    flows = list(dict.fromkeys(row.flow for row in rows))
    for flow in flows:
        ran = [row for row in rows if row.flow == flow]
        lines.append(f"{flow} ({ran[0].victim} dies):")
        lines.append(f"  {'step':>8}  {'where (the step never made)':<32} {'operation':<22} {'lost':<18} outcome")
        for row in ran:
            lost = f"1 ring, {row.slots_lost} slot(s)" if row.rings_lost == 1 else "-"
            lost = lost if row.rings_lost <= 1 else f"{row.rings_lost} rings, {row.slots_lost} slot(s)"
            runs = f" ({row.schedules} schedules)" if row.schedules > 1 else ""
            lines.append(f"  {row.step:>3} of {row.steps:<3} {row.where:<32} {row.operation:<22} {lost:<18} "
                         f"{row.outcome}{runs}")
    lines.append("summary:")
    for flow in flows:
        ran = [row for row in rows if row.flow == flow]
        failed = sum(row.violation is not None for row in ran)
        losing = [row for row in ran if row.rings_lost]
        lines.append(f"  {flow}: {len(ran)} deaths, {sum(row.schedules for row in ran)} schedules, {failed} with a "
                     f"violation; {len(losing)} lose a ring for good (at most {max([0] + [row.slots_lost for row in losing])} "
                     f"slot(s))")
    return "\n".join(lines)
