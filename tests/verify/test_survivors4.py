"""The trials and invariants added for the survivors of the free stack and
layout 4 (docs/explanation/verification.md, "Arguments: the free stack and
layout 4"): each trial's unmutated flows pass it, and it kills a mutant it
was made for; the new invariants catch the mutants they were made for.
"""
import pytest

from kickmsg.verify import Scenario, explore, mutations, orders

IDLE_RING, REJOIN, EVICTED_PIN = mutations.TRIALS4_SURVIVORS


def derived(layout: int, mutant_id: str) -> mutations.Derived:
    return next(mutant for mutant in mutations.derive(layout)[0] if mutant.id == mutant_id)


# Measured: 36, 149 and 137 schedules.
@pytest.mark.parametrize("trial, most_schedules", [(IDLE_RING, 100), (REJOIN, 300), (EVICTED_PIN, 300)])
def test_each_trial_is_in_layout_4s_set_and_its_baseline_passes(trial, most_schedules):
    assert trial in mutations.TRIALS[4]
    report = explore(trial.scenario, preemptions=trial.preemptions(0), memory_model="sc")
    assert report.violation is None and report.complete
    assert report.schedules <= most_schedules


@pytest.mark.parametrize("trial, mutant_id, violation", [
    (IDLE_RING, "protocol/freestack.py:68 move-bound", "pub1 raised"),  # the empty pool taken for a corrupt head
    (IDLE_RING, "protocol/v4/publish.py:129 drop-condition", "idle ring 0 was given 0 of the 4 messages sent"),
    (IDLE_RING, "protocol/freestack.py:81 drop-condition", "slot 1 is on the free stack but 1 committed entries"),
    (REJOIN, "protocol/v4/publish.py:140 negate-condition", "slot 2 has refcount 1 but 0 committed entries"),
    (REJOIN, "protocol/v4/receive.py:311 drop-operand", "sub0 counted 1 lost on a ring that never wrapped"),
    (EVICTED_PIN, "protocol/v4/receive.py:332 drop-condition", "slot 1 is on the free stack with refcount 4294967295"),
])
def test_each_trial_kills_its_mutants(trial, mutant_id, violation):
    report = explore(trial.scenario, mutant=derived(4, mutant_id).mutant, preemptions=trial.preemptions(0),
                     memory_model="sc")
    assert report.violation is not None and report.violation.startswith(violation)


@pytest.mark.parametrize("layout, scenario", [(4, Scenario()), (9, orders.SCENARIO9)])
def test_a_pool_reported_dry_with_free_slots_is_a_violation(layout, scenario):
    report = explore(scenario, mutant=derived(layout, "protocol/freestack.py:68 drop-condition").mutant,
                     preemptions=0, memory_model="sc")
    assert report.violation is not None
    assert report.violation.startswith("pub0 found the pool dry with slot(s) [")


def test_a_loss_on_a_ring_that_never_wrapped_is_a_violation():
    scenario = Scenario(publishers=1, messages=2, subscribers=1, rejoin=False)
    assert explore(scenario, preemptions=0, memory_model="sc").violation is None
    report = explore(scenario, mutant=derived(4, "protocol/v4/receive.py:342 drop-condition").mutant,
                     preemptions=0, memory_model="sc")
    assert report.violation is not None and "on a ring that never wrapped" in report.violation
