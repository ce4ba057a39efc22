"""The explorer on layout 9 (kickmsg.verify.layout9): the real flows of
kickmsg.protocol.v9 pass at small bounds under both memory models, with
stalls, deaths and a blocking subscriber; every named mutant is caught with
a readable trace; the --orders table of layout 9 and its copy in docs/explanation/verification.md
it agree with the code; the seq_cst fence of the ra model orders a
store-buffering litmus exactly when both fences are there.

`make test` runs one quick case per behaviour (each a few seconds, the
steal mutant about a minute). The deep runs (larger scenarios, the docs'
bounds) are marked DEEP and skipped, with that reason in pytest's summary,
unless KICKMSG_VERIFY_DEEP=1 (docs/explanation/verification.md, Layout 9: "Bounds and cost").
"""
import ctypes
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from kickmsg import verify
from kickmsg.protocol import freestack
from kickmsg.protocol.v9 import publish as publish9
from kickmsg.protocol.v9 import repair as repair9
from kickmsg.verify import MUTANTS9, Scenario9, layout9, mutants, orders, traces
from kickmsg.verify.layout9 import MUTANT_SCENARIOS9
from kickmsg.verify.memory import WeakMemory

DEEP = pytest.mark.skipif(os.environ.get("KICKMSG_VERIFY_DEEP") != "1",
                          reason="deep run: KICKMSG_VERIFY_DEEP=1 pytest tests/verify (docs/explanation/verification.md, Tests and time)")


@pytest.mark.parametrize("scenario, model, stale", [
    (Scenario9(), "sc", 0),
    (Scenario9(publishers=1, messages=2), "ra", 1),
    (Scenario9(blocking=True), "sc", 0),
    (Scenario9(publishers=1, blocking=True), "ra", 1),
    (Scenario9(deaths=1), "sc", 0),
], ids=["polling-sc", "polling-ra", "blocking-sc", "blocking-ra", "deaths-sc"])
def test_the_flows_as_shipped_pass(scenario, model, stale):
    report = verify.explore(scenario, preemptions=1, memory_model=model, stale=stale)
    assert report.violation is None, report.trace
    assert report.complete and report.schedules > 25


@DEEP
@pytest.mark.parametrize("scenario, model, stale", [
    (Scenario9(), "ra", 1),
    (Scenario9(blocking=True), "ra", 1),
], ids=["polling-ra", "blocking-ra"])
def test_the_flows_as_shipped_pass_deep(scenario, model, stale):
    report = verify.explore(scenario, preemptions=1, memory_model=model, stale=stale)
    assert report.violation is None, report.trace
    assert report.complete


def test_steals_and_deaths_are_explored_and_repaired():
    """With a publisher that may die, some explored schedules kill it and
    some steal its lock once a whole timeout passed (a skip marker): both
    exercised, not only allowed, and the end (after the repairs) is whole."""
    stolen, died = [], []

    def observe(outcome):
        stolen.append(any(step.where == "steal_and_skip" and step.operation.startswith("store_")
                          for step in outcome.steps))
        died.append(any(choice.chosen == "pub0 dies" for choice in outcome.choices))

    report = verify.explore(Scenario9(subscribers=0, idle=1, deaths=1), preemptions=1, observe=observe)
    assert report.violation is None, report.trace
    assert report.complete
    assert any(stolen) and any(died)


def test_an_idle_ring_counts_in_max_subscribers_and_is_left_at_the_end():
    scenario = Scenario9(subscribers=0, idle=2)
    assert scenario.config().max_subscribers == 2
    report = verify.explore(scenario, preemptions=0)
    assert report.violation is None and report.complete  # the end check: every ring Free again


# The reclaim mutants' scenario (EVICTION: its joiner reclaims too) takes minutes to explore: deep runs;
# their planned schedules below show each violation at once.
@pytest.mark.parametrize("name", [pytest.param(name, marks=DEEP) if name.startswith("reclaim-") else name
                                  for name in sorted(MUTANTS9)])
def test_every_layout9_mutant_comes_with_a_trace(name):
    scenario, preemptions, stale = MUTANT_SCENARIOS9[name]
    mutant = MUTANTS9[name]
    report = verify.explore(scenario, name, preemptions=preemptions, memory_model=mutant.model, stale=stale)
    assert report.violation is not None, report.summary()
    assert report.trace is not None and report.trace.splitlines()[-1].startswith("violation: ")
    assert "MUTANT" not in report.trace  # the trace names the flows' functions, not the edits


def test_an_unproven_steal_takes_a_lock_first_seen_after_the_timeout():
    """steal-unproven: pub0 stopped between its claim and its lock, time
    passing while pub1 waits on the entry, pub0 locking and stopped again:
    pub1 first sees the lock only after its timeout, and steals it at once."""
    scenario, preemptions, _ = MUTANT_SCENARIOS9["steal-unproven"]
    assert preemptions == 3
    report = verify.explore(scenario, "steal-unproven", preemptions=preemptions)
    assert report.violation.startswith("pub1 steals publisher lock of pos 0 on ring 0 entry 0, which it first saw 0 ns")
    lines = report.trace.splitlines()
    assert "      (time passes)" in lines
    passed = lines.index("      (time passes)")
    assert "pub0  Publisher.publish" in lines[passed + 1] and "publisher lock of pos 0" in lines[passed + 1]
    assert "steal_and_skip" in lines[-2] and "cas_acquire_u64" in lines[-2]
    # The code as shipped passes the same bound.
    assert verify.explore(scenario, preemptions=preemptions).violation is None


def test_a_takeover_of_any_claim_replaces_a_newer_one():
    """meta-takeover-any: pub0 stopped between its early check and its
    takeover; pub1 steals pub0's lock after a timeout (skip), publishes
    position 2 into the entry; pub0's takeover then replaces that claim."""
    scenario, preemptions, _ = MUTANT_SCENARIOS9["meta-takeover-any"]
    report = verify.explore(scenario, "meta-takeover-any", preemptions=preemptions)
    assert re.fullmatch(r"pub0 replaces the claim of pos 2: slot \d on ring 0 entry 0 by claim of pos 0: slot \d: "
                        r"not an older position's", report.violation), report.violation
    assert "skip marker of pos 1" in report.trace and "(time passes)" in report.trace
    assert verify.explore(scenario, preemptions=preemptions).violation is None


# -- the repairs racing live traffic -----------------------------------------------------------


def _ran(outcome, actor, where, operation):
    return any(step.actor == actor and step.where == where and step.operation.startswith(operation)
               for step in outcome.steps)


def test_a_repair_pass_racing_a_publisher_steals_only_stable_locks():
    """repair_locked_entries as an actor: some schedules steal the
    publisher's lock (it stalled while a whole timeout passed in the
    repairer's modelled sleep) and the publisher's commit then fails; the
    invariants hold at every step."""
    stolen, failed_commits = [], []

    def observe(outcome):
        stolen.append(_ran(outcome, "repair", "steal_and_skip", "store_"))
        failed_commits.append(any(step.where == "Publisher.publish" and step.operation == "cas_release_u64"
                                  and step.result != step.operands[0] for step in outcome.steps))

    report = verify.explore(Scenario9(publishers=1, subscribers=0, idle=1, repairer=True), preemptions=2,
                            observe=observe)
    assert report.violation is None, report.trace
    assert report.complete and any(stolen) and any(failed_commits)


@DEEP
def test_a_repair_pass_racing_a_publisher_and_a_reader():
    """The same with a polling subscriber: skip markers are lost, never read."""
    report = verify.explore(Scenario9(publishers=1, repairer=True), preemptions=2)
    assert report.violation is None, report.trace
    assert report.complete


def test_dying_subscribers_and_a_reclaimer_racing_a_publisher():
    """A subscriber may die at any step; reclaim_dead_rings runs
    concurrently (and at the end): in_flight stays within the publishers,
    no live owner is evicted, the end is whole."""
    reclaimed, died = [], []

    def observe(outcome):
        reclaimed.append(any(step.actor == "reclaim0" and step.operation == "cas_acq_rel_u64" and step.result == step.operands[0]
                             for step in outcome.steps))  # it took the dead owner's ring
        died.append(any(choice.chosen == "sub0 dies" for choice in outcome.choices))

    report = verify.explore(Scenario9(publishers=1, subscriber_deaths=1, reclaimers=1), preemptions=1, observe=observe)
    assert report.violation is None, report.trace
    assert report.complete and any(reclaimed) and any(died)


def test_an_in_flight_underflow_is_caught():
    """A deliberate break: the admission released twice over. in_flight
    wraps below 0 into huge values (the borrow runs through the word)."""
    broken = mutants.Mutant("release-admission-twice", "in_flight never underflows", (mutants.Patch(
        publish9.Publisher, "publish", (mutants.Edit(
            ("ops.fetch_sub_release_u32(state_flight_address, IN_FLIGHT_ONE)",),
            ("ops.fetch_sub_release_u32(state_flight_address, 2 * IN_FLIGHT_ONE)  # BROKEN",)),)),))
    report = verify.explore(Scenario9(publishers=1, subscribers=0, idle=1), broken, preemptions=0)
    assert re.fullmatch(r"ring 0 has \d+ publishers in flight, of 1 \(an underflow\?\)", report.violation), report.trace
    assert "fetch_sub_release_u32(ring 0.state_flight, 8)" in report.trace.splitlines()[-2]


def _planned(plan):
    """A chooser: (steps run, choice) in turn, then the defaults."""
    plan = list(plan)

    def choose(index, choice):
        if plan and choice.step == plan[0][0] and plan[0][1] in choice.options:
            return plan.pop(0)[1]
        return choice.default
    return choose


@pytest.mark.parametrize("dies_after", [2, 3], ids=["after-its-claim", "after-its-start-time"])
def test_a_subscriber_dying_before_it_records_its_pid_leaves_its_ring_for_good(dies_after):
    """B.4: between the Free -> Live CAS and the owner_pid store the ring is
    Live with owner_pid 0, which B.16 never calls dead: nothing reclaims it."""
    world, outcome = layout9.run_schedule(Scenario9(publishers=1, subscriber_deaths=1, reclaimers=1),
                                          _planned([(dies_after, "sub0 dies")]))
    assert outcome.violation is None, traces.format_trace(world, outcome, world.repaired)
    assert world.unowned == [0] and "ring 0 stays Live+0 with no owner recorded" in world.repaired


def test_a_join_with_no_free_ring_reclaims_a_dead_owners_ring():
    """One ring: sub0 joins and dies; sub1's join finds no Free ring, takes
    sub0's (B.16: dead) by its owner_pid CAS, leaves it for sub0 (Draining,
    drain, Free), joins it and receives what pub0 sends after."""
    world, outcome = layout9.run_schedule(Scenario9(publishers=1, messages=3, subscribers=2, rings=1, capacity=2,
                                                    subscriber_deaths=1), _planned([(6, "sub0 dies")]))
    trace = traces.format_trace(world, outcome, world.repaired)
    assert outcome.violation is None, trace
    took = [step.actor for step in outcome.steps if step.where == "reclaim_dead_ring"
            and step.operation == "cas_acq_rel_u64" and step.result == step.operands[0]]
    assert took == ["sub1"] and world.rings["sub1"] == 0, trace
    assert world.received["sub1"], trace


RECLAIM_092 = mutants.lookup("reclaim-0.9.2")
EVICTION_PLAN = [(4, "sub0 dies"), (4, "reclaim0"), (10, "reclaim1")]


def test_two_0_9_2_reclaimers_evict_a_live_owner():
    """0.9.2's reclaim_dead_rings (the reclaim-0.9.2 mutant): reclaim0 takes
    the dead sub0's ring to Reclaiming and stops inside its second death
    check; reclaim1 takes the Reclaiming ring too (Reclaiming is accepted,
    for a crashed reclaimer), frees it; sub1 joins it and sleeps on the
    futex; reclaim0 goes on with the pid it read (sub0's, dead) and clears
    sub1's owner and has_waiter."""
    with mutants.installed(RECLAIM_092):
        world, outcome = layout9.run_schedule(layout9.EVICTION, _planned(EVICTION_PLAN))
    trace = traces.format_trace(world, outcome, world.repaired)
    assert outcome.violation == "reclaim0 clears the owner of ring 0: sub1, alive (a live owner is never evicted)"
    lines = trace.splitlines()
    assert "cas_acq_rel_u32(ring 0.state_flight, Reclaiming+0, Reclaiming+0)" in lines[15], trace
    assert lines[24].startswith("  24. sub1 ") and "Free+0, Live+0" in lines[24], trace
    assert "store_relaxed_u32(ring 0.has_waiter, 0)" in lines[-3] and lines[-3].split()[1] == "reclaim0", trace


@pytest.mark.parametrize("plan", [EVICTION_PLAN, [(4, "sub0 dies"), (4, "reclaim0"), (7, "reclaim1")]],
                         ids=["0.9.2s-plan", "stopped-before-its-claim"])
def test_our_reclaimers_keep_the_live_owner(plan):
    """Ours, under 0.9.2's losing plan and under the one that stops reclaim0
    between its death check and its claim (reclaim1 takes the ring, drains
    and frees it, sub1 joins): the ring is taken by one CAS of owner_pid
    from the dead pid, which fails on sub1's pid."""
    world, outcome = layout9.run_schedule(layout9.EVICTION, _planned(plan))
    trace = traces.format_trace(world, outcome, world.repaired)
    assert outcome.violation is None, trace
    claims = [step.actor for step in outcome.steps
              if step.where == "reclaim_dead_ring" and step.operation == "cas_acq_rel_u64" and step.result == step.operands[0]]
    assert len(claims) == 1, trace  # sub0's ring, taken once


def test_without_the_claim_by_cas_the_eviction_is_back():
    """The reclaim-no-recheck mutant (owner_pid cleared by a plain store)
    under the plan our claim survives."""
    with mutants.installed(mutants.lookup("reclaim-no-recheck")):
        world, outcome = layout9.run_schedule(layout9.EVICTION, _planned([(4, "sub0 dies"), (4, "reclaim0"),
                                                                           (7, "reclaim1")]))
    assert outcome.violation == "reclaim0 clears the owner of ring 0: sub1, alive (a live owner is never evicted)"


@pytest.mark.parametrize("mutant", ["reclaim-0.9.2", "reclaim-no-recheck"])
def test_random_schedules_of_eviction_find_the_reclaim_mutants(mutant):
    """Seeded random schedules of EVICTION (its joiner reclaims too): each
    mutant evicts a live owner within 300 runs (tens, in fact)."""
    report = verify.explore_random(layout9.EVICTION, mutant, runs=300, switch=0.1)
    assert report.violation is not None and report.violation.endswith("alive (a live owner is never evicted)"), \
        report.summary()


def test_random_schedules_of_eviction_with_our_reclaimers_run_clean():
    report = verify.explore_random(layout9.EVICTION, runs=300, switch=0.1)
    assert report.violation is None, report.trace


@DEEP
def test_the_explorer_finds_the_0_9_2_eviction():
    report = verify.explore(layout9.EVICTION, RECLAIM_092, preemptions=2)
    assert report.violation.endswith("alive (a live owner is never evicted)"), report.summary()


@DEEP
@pytest.mark.timeout(900)
def test_the_explorer_finds_no_eviction_by_our_reclaimers():
    report = verify.explore(layout9.EVICTION, preemptions=2)
    assert report.violation is None and report.complete, report.trace


def test_cli_layout9_repair_pass():
    result = subprocess.run([str(Path(sys.executable).with_name("kickmsg")), "verify", "--layout", "9", "--repair-pass",
                             "--publishers", "1", "--preemptions", "1"], capture_output=True, text=True, timeout=120,
                            stdin=subprocess.DEVNULL)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "a concurrent repair_locked_entries" in result.stdout and "no violation" in result.stdout


# -- the orders ------------------------------------------------------------------------------


def test_every_call_of_the_door_in_the_layout9_flows_is_a_site():
    sites = orders.sites(orders.FLOWS9)
    assert {(site.owner, site.attribute) for site in sites} == {(o, a) for _, o, a in orders.FLOWS9}
    layout9_code = ("kickmsg/protocol/v9/", "kickmsg/protocol/freestack.py")  # the free stack is both layouts'
    assert all(site.operation in site.source and site.path.startswith(layout9_code) for site in sites)
    assert all(orders.spec_order(site) is None for site in sites)  # spec-seqlock-orders is layout 4's


def test_the_layout9_orders_of_the_steal(monkeypatch):
    """steal_and_skip weakened: its acquire CAS and its release store of the
    skip marker, in the steal scenario (a publisher may die: one preemption
    at least, whatever the bound given)."""
    monkeypatch.setattr(orders, "FLOWS9", (("steal", publish9, "steal_and_skip"),))
    rows = orders.check_orders(preemptions=0, stale=2, budget=2, layout=9)
    assert [(row.site.operation, row.weakened) for row in rows] == [
        ("cas_acquire_u64", "relaxed"), ("store_release_u64", "relaxed"), ("fetch_add_relaxed_u64", None)]
    assert [row.result for row in rows] == ["none within bounds", "none within bounds", "-"]
    assert orders.format_table(rows).splitlines()[1].startswith("kickmsg/protocol/v9/publish.py:")


def test_the_layout9_free_stack_push_must_release(monkeypatch):
    monkeypatch.setattr(orders, "FLOWS9", (("free stack", freestack, "push"),))
    rows = orders.check_orders(preemptions=0, stale=2, budget=2, layout=9)
    assert [(row.site.operation, row.weakened, row.result) for row in rows] == [
        ("load_relaxed_u64", None, "-"), ("store_relaxed_u32", None, "-"),
        ("cas_release_u64", "relaxed", "counter-example")]
    assert rows[2].report.violation.startswith("data race on slot")


@DEEP
def test_the_layout9_orders_table():
    """The whole table (docs/explanation/verification.md, Layout 9): every weakening explored."""
    rows = orders.check_orders(preemptions=0, stale=2, budget=2, layout=9)
    assert all(row.result != "undecided" for row in rows)


def test_cli_orders_of_layout9_explore_under_ra():
    result = subprocess.run([str(Path(sys.executable).with_name("kickmsg")), "verify", "--layout", "9", "--orders",
                             "--memory-model", "sc"], capture_output=True, text=True, timeout=60,
                            stdin=subprocess.DEVNULL)
    assert result.returncode == 2
    assert "--orders explores under --memory-model ra" in result.stderr


LAYOUT9_SECTION = "## Layout 9 (`kickmsg verify --layout 9`)"  # the section of layout 9's table in docs/explanation/verification.md


def test_the_readme_layout9_orders_table_points_at_the_code_as_it_is():
    """Each row of the layout-9 --orders table (verification.md) names a site by
    file:line: the rows are the sites orders.sites(FLOWS9) finds now
    (acq_rel ones twice, relaxed ones not at all), in order."""
    readme = (Path(__file__).resolve().parents[2] / "docs/explanation/verification.md").read_text()
    readme = readme[readme.index(LAYOUT9_SECTION):]  # the layout-4 table comes before
    rows = re.findall(r"^\| `(kickmsg/protocol/(?:v9/)?[a-z_]+\.py):(\d+)` \| `([^`]+)` \| `([a-z_0-9]+)` \|", readme, re.M)
    expected = []
    for site in orders.sites(orders.FLOWS9):
        order = orders.OPERATIONS[site.operation].order
        if order != "relaxed":
            expected += [(site.path, str(site.line), site.function, site.operation)] * (2 if order == "acq_rel" else 1)
    assert rows == expected


# -- the fences --------------------------------------------------------------------------------


class Litmus:
    """Two actors over two u32 words of ordinary memory, for the fences."""

    def __init__(self):
        self.words = (ctypes.c_uint32 * 2)()
        self.memory = WeakMemory(["a", "b"], lambda ages: ages - 1)  # always the oldest store it may read
        self.steps = 0

    def do(self, actor, operation, word=0, *operands):
        self.steps += 1
        address = ctypes.addressof(self.words) + 4 * word if operation != "fence_seq_cst" else 0
        return self.memory.perform(actor, operation, address, operands, self.steps)[0]


@pytest.mark.parametrize("fence_a, fence_b, both_zero", [
    (True, True, False), (True, False, True), (False, True, True), (False, False, True)])
def test_store_buffering_is_forbidden_only_with_both_fences(fence_a, fence_b, both_zero):
    """a: x = 1; fence; r1 = y.   b: y = 1; fence; r2 = x.   (all relaxed)
    r1 = r2 = 0 is allowed unless both fences are there (C++20 atomics.order
    p4.4): the wake pair of layout 9, has_waiter against write_pos."""
    litmus = Litmus()
    litmus.do(0, "store_relaxed_u32", 0, 1)
    if fence_a:
        litmus.do(0, "fence_seq_cst")
    litmus.do(1, "store_relaxed_u32", 1, 1)
    if fence_b:
        litmus.do(1, "fence_seq_cst")
    r2 = litmus.do(1, "load_relaxed_u32", 0)  # b reads x, the oldest it may
    r1 = litmus.do(0, "load_relaxed_u32", 1)  # a reads y, the oldest it may
    assert (r1 == 0 and r2 == 0) == both_zero
