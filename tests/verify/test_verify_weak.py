"""kickmsg.verify under the release/acquire model (memory_model="ra").

With no stale read it explores exactly the schedules of sequential
consistency; each memory-order mutant is caught under ra and passes under
sc; the data-race check fires on a payload written after its commit; the
spec's own orders (the mutant spec-seqlock-orders) let a seqlock re-check
read a stale sequence (the finding in docs/explanation/verification.md), the code's stronger orders
pass the bounded run; weak behaviours the spec accepts are not violations.
"""
import functools
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from kickmsg.protocol import freestack
from kickmsg.verify import MUTANT_SCENARIOS, MUTANTS, Scenario, explore, orders, run_schedule
from kickmsg.verify.traces import format_trace

RA_MUTANTS = sorted(name for name, mutant in MUTANTS.items() if mutant.model == "ra")
SC_MUTANTS = sorted(name for name, mutant in MUTANTS.items() if mutant.model == "sc")
# Each is caught with no preemption and at most two stale reads, but the spec's
# orders, which need one preemption and one stale read. The unmutated code
# passes both bounds (K + W <= 2, below).
RA_BOUNDS = {"spec-seqlock-orders": {"preemptions": 1, "stale": 1}}
NO_PREEMPTION = {"preemptions": 0, "stale": 2}
# Deep runs (minutes each): skipped, with this reason in pytest's summary,
# unless asked for (docs/explanation/verification.md, "Tests and time").
DEEP = pytest.mark.skipif(os.environ.get("KICKMSG_VERIFY_DEEP") != "1",
                          reason="deep run: KICKMSG_VERIFY_DEEP=1 pytest tests/verify (docs/explanation/verification.md, Tests and time)")


@functools.cache
def caught_under_ra(mutant: str):
    return explore(MUTANT_SCENARIOS[mutant], mutant=mutant, memory_model="ra", **RA_BOUNDS.get(mutant, NO_PREEMPTION))


def test_with_no_stale_read_ra_explores_exactly_the_schedules_of_sc():
    sc = explore(Scenario(), preemptions=1, reduction="none")
    ra = explore(Scenario(), preemptions=1, memory_model="ra", stale=0, reduction="none")
    assert sc.violation is None and ra.violation is None, ra.trace  # and no data race either
    assert (ra.schedules, ra.complete) == (sc.schedules, sc.complete) == (812, True)


@pytest.mark.parametrize("mutant", SC_MUTANTS)
def test_with_no_stale_read_ra_finds_each_sc_mutant_at_the_same_schedule(mutant):
    sc = explore(MUTANT_SCENARIOS[mutant], mutant=mutant, preemptions=2)
    ra = explore(MUTANT_SCENARIOS[mutant], mutant=mutant, preemptions=2, memory_model="ra")
    assert ra.schedules == sc.schedules
    # The same violation, or (reading a slot being rewritten) the data race that comes first.
    assert ra.violation == sc.violation or ra.violation.startswith("data race on slot")


@pytest.mark.parametrize("mutant", RA_MUTANTS)
def test_each_memory_order_mutant_is_caught_under_ra_only(mutant):
    caught = caught_under_ra(mutant)
    assert caught.violation is not None, caught.summary()
    lines = caught.trace.splitlines()
    assert lines[-1] == f"violation: {caught.violation}"
    assert " ? " not in caught.trace
    assert "STALE: the newest is" in caught.trace or caught.violation.startswith("data race on slot")
    assert explore(MUTANT_SCENARIOS[mutant], mutant=mutant, preemptions=1).violation is None  # sequential consistency


def test_the_unmutated_code_passes_the_bounds_that_catch_the_mutants():
    report = explore(Scenario(), preemptions=0, memory_model="ra", stale=2)
    assert report.violation is None and report.complete, report.trace


def test_a_payload_written_after_its_commit_is_a_data_race_with_both_accesses_in_the_trace():
    report = explore(Scenario(), mutant="payload-after-commit", preemptions=0, memory_model="ra")
    match = re.fullmatch(r"data race on slot (\d)'s payload: (sub\d) reads it at step (\d+), "
                         r"but (pub\d)'s write at step (\d+) does not happen before", report.violation)
    assert match, report.violation
    slot, reader, read_at, writer, written_at = match.groups()
    steps = {line.split(".")[0].strip(): line for line in report.trace.splitlines()[:-1]}
    assert f"{reader}   " in steps[read_at] and f"read_payload(slot {slot} payload" in steps[read_at]
    assert f"{writer}   " in steps[written_at] and f"write_payload(slot {slot} payload" in steps[written_at]
    # The write came right after the writer's commit of that slot.
    assert writer in steps[str(int(written_at) - 1)] and "store_release_u64" in steps[str(int(written_at) - 1)]


def test_the_spec_orders_let_the_seqlock_recheck_read_a_stale_sequence():
    """The finding of verification.md, kept as the mutant spec-seqlock-orders: with one
    preemption and one stale read, a subscriber pins a slot a newer writer
    took, re-checks a sequence that writer already replaced, and reads the
    slot racing that writer's payload write. Under sc it passes (above)."""
    report = caught_under_ra("spec-seqlock-orders")
    race = re.fullmatch(r"data race on slot (\d)'s payload: sub0 reads it at step (\d+), "
                        r"but pub1's write at step (\d+) does not happen before", report.violation)
    # Or the same stale re-check seen one step later: the recycled slot's message delivered for this position.
    recycled = re.fullmatch(r"sub0 received message \d+ of publisher 1 at ring 0 position \d+, "
                            r"where message \d+ of publisher 0 was committed", report.violation)
    assert race or recycled, report.violation
    stale = [line for line in report.trace.splitlines() if "STALE" in line]
    assert len(stale) == 1 and "pin_next" in stale[0] and "load_acquire_u64(ring 0 entry 0.sequence)" in stale[0]
    assert report.trace.count("<< preempts") == 1
    if race:
        slot, read_at, written_at = race.groups()
        steps = {line.split(".")[0].strip(): line for line in report.trace.splitlines()[:-1]}
        assert f"read_payload(slot {slot} payload" in steps[read_at] and f"write_payload(slot {slot} payload" in steps[written_at]
        assert stale[0] == steps[str(int(read_at) - 1)]  # the re-check, right before the read


@DEEP
@pytest.mark.timeout(900)
def test_the_unmutated_flows_pass_the_bounded_ra_run():
    """The clean run: every schedule with at most two preemptions and stale
    reads together (K + W <= 2), among them the one above where the spec's
    orders fail."""
    report = explore(Scenario(), preemptions=2, memory_model="ra", stale=2, budget=2)
    assert report.violation is None and report.complete, report.trace
    assert report.schedules > 54_520  # more than sequential consistency's 54 520 with K <= 2


def test_a_repair_pass_acts_on_a_stale_lock_without_any_preemption():
    report = explore(Scenario(repairer=True), preemptions=0, memory_model="ra", stale=1)
    assert report.violation is not None
    stale = [line for line in report.trace.splitlines() if "STALE" in line]
    assert len(stale) == 1 and stale[0].split()[1] == "repair" and "-> LOCKED" in stale[0]
    assert "<< preempts" not in report.trace


def test_a_stale_pre_check_that_skips_a_live_ring_is_no_violation():
    """The spec accepts that a publisher's relaxed pre-check may still see a
    ring that just went Live as Free, and skip it: nothing the subscriber
    was promised is lost (the invariants ask no message to arrive). In the
    schedule without preemptions the first load with a choice is that
    pre-check: the subscriber has just joined, pub0 has not heard of it."""
    made = []

    def oldest_first(index, choice):
        if choice.kind == "read" and not made:
            made.append(index)
            return choice.options[-1]
        return choice.default

    world, outcome = run_schedule(Scenario(), oldest_first, "ra")
    trace = format_trace(world, outcome)
    assert outcome.violation is None, trace
    stale = [line for line in trace.splitlines() if "STALE" in line]
    assert len(stale) == 1 and stale[0].split()[1:3] == ["pub0", "Publisher._deliver"]
    assert "load_relaxed_u32(ring 0.state_flight)" in stale[0] and "-> Free+0" in stale[0]


def test_a_slot_filled_in_place_is_a_payload_write():
    """pub1 fills its slots in place (allocate, through the publisher
    core's payload): writes of the payload, as pub0's copies (send) are."""
    _, outcome = run_schedule(Scenario(), lambda index, choice: choice.default, "ra")
    writes = {(step.actor, step.operation) for step in outcome.steps if step.operation.endswith("_payload")
              and step.actor.startswith("pub")}
    assert writes == {("pub0", "write_payload"), ("pub1", "write_payload")}


# -- the orders ---------------------------------------------------------------------------


def test_every_call_of_the_door_in_the_flows_is_a_site():
    sites = orders.sites()
    assert {(site.owner, site.attribute) for site in sites} == {(owner, attribute) for _, owner, attribute in orders.FLOWS}
    pop = [site.operation for site in sites if site.function == "pop"]
    assert pop == ["load_acquire_u64", "load_relaxed_u32", "cas_acq_rel_u64"]
    for site in sites:
        assert site.operation in site.source


def test_a_weakening_edits_exactly_one_call():
    from kickmsg.protocol.v4 import publish
    from kickmsg.verify import mutants

    commit, self_repair = [site for site in orders.sites() if site.operation == "store_release_u64"
                           and site.function == "Publisher._deliver"]
    assert commit.source == self_repair.source  # the same text twice in one function
    with mutants.installed(orders.weakening(commit, "relaxed")):
        names = publish.Publisher._deliver.__code__.co_names
    assert "store_relaxed_u64" in names and "store_release_u64" in names  # the self-repair's is untouched


def test_the_orders_table_of_the_free_stack_push(monkeypatch):
    monkeypatch.setattr(orders, "FLOWS", (("free stack", freestack, "push"),))
    rows = orders.check_orders(preemptions=0, stale=2, budget=2)
    assert [(row.site.operation, row.weakened) for row in rows] == [
        ("load_relaxed_u64", None), ("store_relaxed_u32", None), ("cas_release_u64", "relaxed")]
    assert [row.result for row in rows] == ["-", "-", "counter-example"]  # push must release the slot
    assert rows[2].report.violation.startswith("data race on slot")
    table = orders.format_table(rows).splitlines()
    assert table[0].split()[:3] == ["site", "function", "operation"]
    assert len(table) == 4 and table[3].startswith("kickmsg/protocol/freestack.py:")


def test_a_site_stronger_than_the_spec_says_so_in_the_orders_table(monkeypatch):
    stronger = [site for site in orders.sites() if orders.spec_order(site)]
    assert [(site.function, site.operation, orders.spec_order(site)) for site in stronger] == (
        [("Publisher._deliver", "store_release_u32", "relaxed")] * 3
        + [("pin_next", "load_acquire_u32", "relaxed")] * 2)  # the sites spec-seqlock-orders gives back
    pre_set = stronger[0]
    assert "REFCOUNT_OFFSET" in pre_set.source
    monkeypatch.setattr(orders, "sites", lambda: [pre_set])
    [row] = orders.check_orders(preemptions=0, stale=2, budget=2)
    assert (row.order, row.spec_order, row.weakened, row.result) == ("release", "relaxed", "relaxed", "none within bounds")
    assert row.to_dict()["spec_order"] == "relaxed"
    assert orders.format_table([row]).splitlines()[1].split("  ")[3] == "release (spec: relaxed)"


# -- the command ---------------------------------------------------------------------------


KICKMSG = Path(sys.executable).with_name("kickmsg")


def run_verify(*args):
    return subprocess.run([str(KICKMSG), "verify", *args], capture_output=True, text=True, timeout=600,
                          stdin=subprocess.DEVNULL)


def test_cli_ra_passes_and_prints_the_finding_of_the_spec_orders():
    clean = run_verify("--memory-model", "ra", "--preemptions", "0", "--stale", "2")
    assert clean.returncode == 0, clean.stdout
    assert clean.stdout.startswith("the unmutated code: no violation")
    found = run_verify("--mutant", "spec-seqlock-orders", "--preemptions", "1", "--stale", "1")
    assert found.returncode == 1, found.stderr
    assert "STALE: the newest is" in found.stdout
    last = found.stdout.splitlines()[-1]  # the stale re-check's race, or the recycled message it lets through
    assert ("mutant spec-seqlock-orders: VIOLATION: data race on slot" in last
            or "mutant spec-seqlock-orders: VIOLATION: sub0 received message" in last), last
    assert "memory model ra, at most 1 stale read(s)" in found.stdout.splitlines()[-1]


def test_cli_memory_order_mutant_is_explored_under_ra():
    result = run_verify("--mutant", "payload-after-commit", "--preemptions", "0", "--json")
    assert result.returncode == 1, result.stderr
    data = json.loads(result.stdout)
    assert data["memory_model"] == "ra" and data["violation"].startswith("data race on slot")


def test_cli_stale_needs_ra():
    result = run_verify("--stale", "1")
    assert result.returncode == 2
    assert "--stale needs --memory-model ra" in result.stderr


def test_the_readme_orders_table_points_at_the_code_as_it_is():
    """Each row of the --orders table in docs/explanation/verification.md names a site by file:line: the
    rows are the sites orders.sites() finds now (acq_rel ones twice, relaxed
    ones not at all), in order, and each line still holds that call. Code
    moved above a site makes this fail until the table follows it."""
    readme = (Path(__file__).resolve().parents[2] / "docs/explanation/verification.md").read_text()
    readme = readme[: readme.index("## Layout 9 (`kickmsg verify --layout 9`)")]  # layout 9's table comes after
    rows = re.findall(r"^\| `(kickmsg/[a-z_0-9/]+\.py):(\d+)` \| `([^`]+)` \| `([a-z_0-9]+)` \|", readme, re.M)
    expected = []
    for site in orders.sites():
        order = orders.OPERATIONS[site.operation].order
        if order != "relaxed":
            expected += [(site.path, str(site.line), site.function, site.operation)] * (2 if order == "acq_rel" else 1)
    assert rows == expected
