"""kickmsg.verify: the real flows under a controlled scheduler.

The unmutated code passes a bounded exhaustive exploration; each mutant (one
rule of the spec broken) is caught with a readable counter-example; the
invariants themselves fire on a damaged region; `kickmsg verify` exits 0/1.
"""
import functools
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from kickmsg.protocol.v4 import layout
from kickmsg.protocol import freestack
from kickmsg.atomics import HARDWARE as ops
from kickmsg.verify import MUTANT_SCENARIOS, MUTANTS, Scenario, _private_region, explore, explore_random, invariants
from kickmsg.verify.mutants import Edit, Patch, build
from kickmsg.verify.traces import describe_value

SC_MUTANTS = sorted(name for name, mutant in MUTANTS.items() if mutant.model == "sc")  # the others: test_verify_weak
# Deep runs (minutes each): skipped, with this reason in pytest's summary,
# unless asked for (docs/explanation/verification.md, "Tests and time").
DEEP = pytest.mark.skipif(os.environ.get("KICKMSG_VERIFY_DEEP") != "1",
                          reason="deep run: KICKMSG_VERIFY_DEEP=1 pytest tests/verify (docs/explanation/verification.md, Tests and time)")


def test_unmutated_code_passes_every_schedule_with_one_preemption():
    report = explore(Scenario(), preemptions=1)
    assert report.violation is None, report.trace
    assert report.complete
    assert report.schedules > 300  # a real exploration, not one run


@DEEP
@pytest.mark.timeout(900)
def test_unmutated_code_passes_every_schedule_with_two_preemptions():
    report = explore(Scenario(), preemptions=2)
    assert report.violation is None, report.trace
    assert report.complete
    assert report.schedules > 10_000


@pytest.mark.parametrize("preemptions", [0, pytest.param(1, marks=DEEP)])
def test_unmutated_code_passes_three_publishers_on_a_ring_of_one(preemptions):
    report = explore(Scenario(publishers=3, messages=1, rejoin=False, capacity=1), preemptions=preemptions)
    assert report.violation is None, report.trace
    assert report.complete


def test_the_blocking_receive_is_explored_a_parked_subscriber_woken_by_a_publisher():
    """Layout 4's blocking receive, the core's that ``Subscriber.receive``
    runs: in some schedule the subscriber sleeps on the futex (modelled) and
    the publisher's wake-up ends that sleep; no schedule loses a wake-up."""
    woken = []

    def observe(outcome):
        steps = outcome.steps
        parked = [i for i, step in enumerate(steps)
                  if step.where == "Subscriber.park" and step.operation == "load_relaxed_u32"]
        wakes = [i for i, step in enumerate(steps) if step.operation == "futex_wake_all"]
        if parked and wakes and parked[0] < wakes[-1]:
            woken.append(outcome)

    report = explore(Scenario(publishers=1, messages=1, blocking=True), preemptions=2, observe=observe)
    assert report.violation is None, report.trace
    assert report.complete
    assert woken


@pytest.mark.parametrize("mutant", SC_MUTANTS)
def test_unmutated_code_passes_random_schedules_of_each_mutant_scenario(mutant):
    for switch in (0.05, 0.5):
        report = explore_random(MUTANT_SCENARIOS[mutant], runs=300, seed=11, switch=switch)
        assert report.violation is None, report.trace
        assert report.schedules == 300


@functools.cache
def exploration_of(mutant: str):
    return explore(MUTANT_SCENARIOS[mutant], mutant=mutant, preemptions=2)


@pytest.mark.parametrize("mutant", SC_MUTANTS)
def test_each_mutant_is_caught_with_a_readable_trace(mutant):
    report = exploration_of(mutant)
    assert report.violation is not None, report.summary()
    lines = report.trace.splitlines()
    assert lines[0].lstrip().startswith("1. ")
    assert lines[-1] == f"violation: {report.violation}"
    assert " ? " not in report.trace  # every step names the function of the package at work
    assert MUTANTS[mutant].rule  # each mutant says which rule of the spec it breaks


def test_no_seqlock_recheck_lets_a_subscriber_read_a_reused_slot():
    report = exploration_of("no-seqlock-recheck")
    assert re.fullmatch(r"sub0 received message \d of publisher 1 at ring 0 position 0, "
                        r"where message 0 of publisher 0 was committed", report.violation)
    assert report.trace.count("<< preempts") == 1  # one unlucky switch is enough


def test_release_before_lock_is_caught_when_the_reference_goes():
    report = exploration_of("release-before-lock")
    assert "has refcount 0 but 1 committed entries of Live rings name it" in report.violation
    # The publisher released the evicted slot before it locked the entry.
    steps = [line.split() for line in report.trace.splitlines()[:-1]]
    actor = next(step[1] for step in steps if step[1].startswith("pub") and step[2] == "release_slot")
    of_actor = [" ".join(step) for step in steps if step[1] == actor]
    release = next(i for i, line in enumerate(of_actor) if "release_slot" in line)
    assert not any("LOCKED)" in line for line in of_actor[:release])


@pytest.mark.parametrize("mutant", SC_MUTANTS)
def test_random_schedules_find_mutants_too(mutant):
    report = explore_random(MUTANT_SCENARIOS[mutant], mutant=mutant, runs=3000, seed=1)
    assert report.violation is not None


def test_exploration_is_deterministic():
    first = explore(MUTANT_SCENARIOS["no-seqlock-recheck"], mutant="no-seqlock-recheck", preemptions=2)
    second = explore(MUTANT_SCENARIOS["no-seqlock-recheck"], mutant="no-seqlock-recheck", preemptions=2)
    assert (first.schedules, first.trace) == (second.schedules, second.trace)


def test_mutants_leave_the_package_untouched():
    from kickmsg.protocol.v4 import publish

    original, send = publish.Publisher._deliver, publish.Publisher.send
    with pytest.raises(ValueError, match="unknown mutant 'no-such-rule'"):
        explore(Scenario(), mutant="no-such-rule")  # unknown: refused before anything is installed
    explore(MUTANT_SCENARIOS["refcount-per-ring"], mutant="refcount-per-ring", preemptions=1)
    explore(MUTANT_SCENARIOS["payload-after-commit"], mutant="payload-after-commit", preemptions=0, memory_model="ra")
    assert publish.Publisher._deliver is original and publish.Publisher.send is send


def test_a_mutant_calls_the_functions_of_its_module_that_a_mutant_installed():
    """Compiled in a copy of its module's namespace, the mutated publish
    would call the original wait_and_capture_slot, and a weakening of the
    capture would never run (it hid one in an earlier --orders table)."""
    from kickmsg.protocol.v4 import publish
    from kickmsg.verify.mutants import Mutant, installed

    original, flow = publish.wait_and_capture_slot, publish.Publisher._deliver
    both = Mutant("both", "-", (
        Patch(publish.Publisher, "_deliver", (Edit(("delivered = 0",), ("delivered = 0  # edited",)),)),
        Patch(publish, "wait_and_capture_slot", (Edit(("spins = 0",), ("spins = 0  # edited",)),)),
    ))
    with installed(both):
        assert publish.wait_and_capture_slot is not original and publish.Publisher._deliver is not flow
        assert publish.Publisher._deliver.__globals__["wait_and_capture_slot"] is publish.wait_and_capture_slot
    assert publish.wait_and_capture_slot is original and publish.Publisher._deliver is flow


def test_a_stale_mutant_refuses_to_build():
    from kickmsg.protocol.v4 import publish

    stale = Patch(publish.Publisher, "_deliver", (Edit(("no such line",), ("pass",)),))
    with pytest.raises(RuntimeError, match="found 0 times"):
        build(stale, "stale")


def test_a_repair_pass_racing_a_live_writer_orphans_its_slot():
    """The spec calls the race of repair_locked_entries() with a live writer
    a benign double store; the explorer shows the writer's message lost and
    one reference to its slot leaked (until reclaim_orphaned_slots)."""
    report = explore(Scenario(repairer=True), preemptions=1)
    assert "has refcount 1 but 0 committed entries of Live rings and 0 pins reference it" in report.violation
    steps = report.trace.splitlines()
    repair_store = next(i for i, line in enumerate(steps) if "repair" in line and "slot_idx, INVALID" in line)
    writer_store = next(i for i, line in enumerate(steps) if line.split()[1].startswith("pub") and "slot_idx, " in line)
    assert writer_store < repair_store  # the live writer's slot index, overwritten by the repair


# -- the invariants fire on damage ---------------------------------------------------------


def test_invariants_hold_on_a_fresh_region():
    region = _private_region(Scenario())
    assert invariants.memory_violation(region, invariants.Ledger(region)) is None
    assert invariants.end_violation(region) is None


def test_a_cycle_in_the_free_stack_is_a_violation():
    region = _private_region(Scenario())
    top = ops.load_acquire_u64(region.free_top_address) & layout.U32_MAX
    ops.store_release_u32(region.slot_addresses[top] + layout.NEXT_FREE_OFFSET, top)
    assert "twice" in invariants.memory_violation(region, invariants.Ledger(region))


def test_a_free_slot_with_a_refcount_is_a_violation():
    region = _private_region(Scenario())
    ops.store_release_u32(region.slot_addresses[0] + layout.REFCOUNT_OFFSET, 1)
    assert invariants.memory_violation(region, invariants.Ledger(region)) == "slot 0 is on the free stack with refcount 1"


def test_a_refcount_that_matches_no_reference_is_a_violation():
    region = _private_region(Scenario())
    ledger = invariants.Ledger(region)
    slot = freestack.pop(region, empty_on_corrupt_head=False)
    ops.store_release_u32(region.slot_addresses[slot] + layout.REFCOUNT_OFFSET, 1)
    assert invariants.memory_violation(region, ledger) == (
        f"slot {slot} has refcount 1 but 0 committed entries of Live rings and 0 pins reference it")
    ledger.held["pub0"] = {slot}  # being written by a publisher: allowed
    assert invariants.memory_violation(region, ledger) is None
    ledger.held.clear()
    ledger.pins[slot] = 1  # or pinned once by a subscriber
    assert invariants.memory_violation(region, ledger) is None


def test_the_ledger_takes_the_captured_slot_from_the_slot_index_in_any_order():
    """A capturing publisher holds the slot it read from the entry's
    slot_idx, whatever that load's order; the sequence it waited on, even
    loaded relaxed (an --orders weakening), names no slot."""
    from kickmsg.verify.scheduler import Step

    region = _private_region(Scenario())
    ledger = invariants.Ledger(region)
    entry = region.rings[0].entries[0]
    wait = ("wait_and_capture_slot", "Publisher._deliver", "Publisher.send")
    ledger.follow(Step("pub1", wait, "load_relaxed_u64", entry + layout.SEQUENCE_OFFSET, (), 1))
    assert ledger.held == {}
    ledger.follow(Step("pub1", wait, "load_acquire_u32", entry + layout.SLOT_IDX_OFFSET, (), 3))
    assert ledger.held == {"pub1": {3}}


def test_a_slot_that_never_comes_back_is_a_violation_at_the_end():
    region = _private_region(Scenario())
    slot = freestack.pop(region, empty_on_corrupt_head=False)
    assert f"slot {slot} (refcount 0) never came back" in invariants.end_violation(region)


def test_a_wrong_or_repeated_delivery_is_a_violation():
    first, second = invariants.message(0, 0), invariants.message(0, 1)
    assert len(first) != len(second)  # a slot read with the other's length shows
    committed = {(0, 0): [first], (0, 1): [second]}
    assert invariants.delivery_violation({"sub0": [(0, 0, first), (0, 1, second)]}, committed) is None
    assert "where message 0 of publisher 0 was committed" in invariants.delivery_violation(
        {"sub0": [(0, 0, second)]}, committed)
    assert "received 8 bytes" in invariants.delivery_violation({"sub0": [(0, 1, second[:8])]}, committed)
    committed[(0, 2)] = [first]
    assert "twice" in invariants.delivery_violation({"sub0": [(0, 0, first), (0, 2, first)]}, committed)
    committed[(0, 3)] = [first]
    assert "after 1" in invariants.delivery_violation({"sub0": [(0, 1, second), (0, 3, first)]}, committed)
    committed[(0, 4)] = [None, second]  # a repair pass, then a writer, committed there
    assert invariants.delivery_violation({"sub0": [(0, 4, second)]}, committed) is None


# -- the command ---------------------------------------------------------------------------


KICKMSG = Path(sys.executable).with_name("kickmsg")  # the console script


def run_verify(*args):
    return subprocess.run([str(KICKMSG), "verify", *args], capture_output=True, text=True, timeout=300,
                          stdin=subprocess.DEVNULL)


def test_cli_exits_0_without_a_violation():
    result = run_verify("--preemptions", "1")
    assert result.returncode == 0, result.stderr
    assert "the unmutated code: no violation" in result.stdout
    assert "all of them" in result.stdout


def test_cli_exits_1_and_prints_the_trace_of_a_mutant():
    result = run_verify("--mutant", "write-pos-after-live", "--preemptions", "1")
    assert result.returncode == 1, result.stderr
    assert "   1. sub0" in result.stdout
    assert "violation:" in result.stdout
    assert "mutant write-pos-after-live: VIOLATION" in result.stdout.splitlines()[-1]


def test_cli_json_and_random_mode():
    result = run_verify("--mutant", "no-seqlock-recheck", "--seed", "1", "--runs", "3000", "--json")
    assert result.returncode == 1, result.stderr
    data = json.loads(result.stdout)
    assert data["mutant"] == "no-seqlock-recheck" and data["violation"] and not data["exhaustive"]
    assert data["scenario"]["publishers"] == 2


def test_cli_repair_pass():
    result = run_verify("--repair-pass", "--preemptions", "1")
    assert result.returncode == 1, result.stderr
    assert "repair repair_locked_entries" in result.stdout
    assert "a concurrent repair pass" in result.stdout.splitlines()[-1]


def test_cli_bad_scenario_is_one_line_error():
    result = run_verify("--capacity", "3")
    assert result.returncode == 2
    assert "power of 2" in result.stderr and "3" in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1
    result = run_verify("--preemptions", "-1")
    assert result.returncode == 2 and "--preemptions must be from 0 to 8, not -1" in result.stderr


@pytest.mark.parametrize("layout", ["4", "9"])
@pytest.mark.parametrize("args, message", [
    (["--publishers", "-1"], "--publishers must be from 0 to 8, not -1"),
    (["--publishers", "1000000"], "--publishers must be from 0 to 8, not 1000000"),
    (["--pool", "100000000"], "--pool must be from 1 to 256, not 100000000"),
    (["--messages", "0"], "--messages must be from 1 to 16, not 0"),
    (["--subscribers", "9"], "--subscribers must be from 0 to 8, not 9"),
    (["--capacity", "128"], "--capacity must be from 1 to 64, not 128"),
    (["--rings", "0"], "--rings must be from 1 to 16, not 0"),
    (["--preemptions", "9"], "--preemptions must be from 0 to 8, not 9"),
    (["--stale", "-2"], "--stale must be from 0 to 8, not -2"),
    (["--budget", "17"], "--budget must be from 0 to 16, not 17"),
    (["--max-schedules", "0"], "--max-schedules must be from 1 to 10000000, not 0"),
    (["--seed", "1", "--runs", "0"], "--runs must be from 1 to 10000000, not 0"),
    (["--seed", "1", "--runs", "20000000"], "--runs must be from 1 to 10000000, not 20000000"),
    (["--deaths", "99"], "--deaths must be from 0 to 8, not 99"),
    (["--subscriber-deaths", "-1"], "--subscriber-deaths must be from 0 to 8, not -1"),
    (["--reclaimers", "5"], "--reclaimers must be from 0 to 4, not 5"),
])
def test_cli_refuses_a_number_out_of_its_range_before_exploring(capsys, layout, args, message):
    """Nothing runs (nor grows): exit 2, one line naming the option, the value and the range."""
    from kickmsg import cli

    assert cli.main(["verify", "--layout", layout, *args, "--json"]) == 2
    assert capsys.readouterr() == ("", f"kickmsg verify: error: {message}\n")


@pytest.mark.parametrize("args, message", [
    (["--deaths", "2", "--publishers", "1"], "deaths (at most one per publisher) must be a whole number from 0 to 1, not 2"),
    (["--subscriber-deaths", "2"], "subscriber_deaths (at most one per subscriber) must be a whole number from 0 to 1, not 2"),
])
def test_cli_refuses_more_deaths_than_actors_to_die(capsys, args, message):
    from kickmsg import cli

    assert cli.main(["verify", "--layout", "9", *args]) == 2
    assert capsys.readouterr() == ("", f"kickmsg verify: error: bad scenario: {message}\n")


@pytest.mark.parametrize("call", [
    lambda: explore(Scenario(publishers=-1)),
    lambda: explore(Scenario(pool=10**8)),
    lambda: explore(Scenario(), preemptions=99),
    lambda: explore(Scenario(), max_schedules=0),
    lambda: explore_random(Scenario(), runs=0),
    lambda: explore_random(Scenario(messages=True)),
])
def test_the_explorer_refuses_a_number_out_of_its_range(call):
    with pytest.raises(ValueError, match=r"must be a whole number from \d+ to \d+, not "):
        call()


@pytest.mark.parametrize("args", [["--preemptions", "0"], ["--seed", "3", "--runs", "20"]])
def test_cli_says_how_far_a_long_exploration_is_on_stderr(monkeypatch, capsys, args):
    """A progress line per PROGRESS_INTERVAL_S (0 here: one per schedule) on
    stderr; stdout holds the JSON result alone."""
    from kickmsg import cli
    from kickmsg.cli import checking

    monkeypatch.setattr(checking, "PROGRESS_INTERVAL_S", 0.0)
    assert cli.main(["verify", *args, "--json"]) == 0
    out, err = capsys.readouterr()
    schedules = json.loads(out)["schedules"]
    lines = err.splitlines()
    assert len(lines) == schedules > 1
    most = "at most 1000000" if "--runs" not in args else "20"
    assert all(line.startswith(f"kickmsg verify: {n} of {most} schedules run in ") and line.endswith(" a second)")
               for n, line in enumerate(lines, 1)), lines


def test_a_trace_reads_the_words_of_both_layouts_by_their_meaning():
    """One describe_value for both layouts: what the words share reads the
    same, each layout's own words (and ring states) read as that layout's."""
    for version in (4, 9):
        assert describe_value("header.free_top", 2 << 32 | 1, version) == "gen 2|slot 1"
        assert describe_value("header.free_top", 3 << 32 | 0xFFFFFFFF, version) == "gen 3|INVALID"
        assert describe_value("ring 0.state_flight", 1 << 2 | 1, version) == "Live+1"
        assert describe_value("slot 0.refcount", None, version) == "-"
    assert describe_value("ring 0.state_flight", 3, 4) == "?+0"  # no Reclaiming on layout 4
    assert describe_value("ring 0.state_flight", 3, 9) == "Reclaiming+0"
    assert describe_value("ring 0 entry 1.sequence", layout.LOCKED_SEQUENCE, 4) == "LOCKED"
    assert describe_value("ring 0 entry 1.slot_idx", 0xFFFFFFFF, 4) == "INVALID"
    assert describe_value("ring 0 entry 1.sequence", 0x8000000000000004, 9) == "publisher lock of pos 4"
    assert describe_value("ring 0 entry 1.sequence", 3, 9) == "commit of pos 2"
    assert describe_value("ring 0 entry 0.meta", 0, 9) == "0 (never claimed)"
    assert describe_value("slot 0.next_free", 0xFFFFFFFF, 9) == str(0xFFFFFFFF)
