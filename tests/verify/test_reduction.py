"""The partial-order reduction (``reduction="por"``) against every schedule
(``"none"``): the same outcomes on small scenarios, fewer schedules, the
same verdicts on mutants."""
import json
import subprocess
import sys
from pathlib import Path

import pytest

from kickmsg import verify
from kickmsg.verify import reduction
from kickmsg.verify.scheduler import Outcome

KICKMSG = Path(sys.executable).with_name("kickmsg")  # the console script


def run_verify(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(KICKMSG), "verify", *args], capture_output=True, text=True, timeout=300,
                          stdin=subprocess.DEVNULL)


SMALL = [  # (scenario, preemptions, the exploration's other bounds)
    (verify.Scenario(publishers=1, messages=1, subscribers=1, rejoin=False), 2, {}),
    (verify.Scenario(publishers=2, messages=1, subscribers=1, rejoin=False, capacity=1, pool=2), 1, {}),
    (verify.Scenario(publishers=1, messages=1, subscribers=1, rejoin=False, blocking=True), 2, {}),
    (verify.Scenario(publishers=1, messages=1, subscribers=1, rejoin=False), 1, {"memory_model": "ra", "stale": 1}),
    (verify.Scenario9(publishers=1, subscribers=1), 2, {}),
    (verify.Scenario9(publishers=2, subscribers=1), 1, {}),
    (verify.Scenario9(publishers=1, subscribers=1, blocking=True), 2, {}),
    (verify.Scenario9(publishers=1, subscribers=1), 1, {"memory_model": "ra", "stale": 1}),
    (verify.Scenario9(publishers=2, subscribers=1, deaths=1), 1, {}),
    (verify.Scenario9(publishers=1, subscribers=1, repairer=True), 1, {}),
]


def outcomes(scenario: "verify.Scenario | verify.Scenario9", preemptions: int, how: str,
             bounds: dict[str, object]) -> tuple[set[str], int]:
    """The end states (digests) and violations every run reached, and the runs."""
    reached: set[str] = set()

    def observe(outcome: Outcome) -> None:
        if outcome.violation:
            reached.add("violation: " + outcome.violation.splitlines()[0])
        elif outcome.final_state:
            reached.add(outcome.final_state)

    report = verify.explore(scenario, preemptions=preemptions, reduction=how, observe=observe, **bounds)
    assert report.complete and report.violation is None
    return reached, report.schedules


@pytest.mark.parametrize(("scenario", "preemptions", "bounds"), SMALL,
                         ids=[f"{s.describe()[:40]}-K{k}-{b.get('memory_model', 'sc')}" for s, k, b in SMALL])
def test_por_reaches_every_end_state_that_every_schedule_reaches(scenario, preemptions, bounds):
    every, runs_none = outcomes(scenario, preemptions, "none", bounds)
    reduced, runs_por = outcomes(scenario, preemptions, "por", bounds)
    assert len(every) > 1  # the scenario has more than one end: the comparison means something
    assert reduced == every
    assert runs_por < runs_none


@pytest.mark.parametrize("name", [name for name, scenario in verify.MUTANT_SCENARIOS.items()
                                  if verify.MUTANTS[name].model == "sc"])
def test_por_catches_the_layout4_mutants_that_none_catches(name):
    scenario = verify.MUTANT_SCENARIOS[name]
    none = verify.explore(scenario, name, preemptions=2, reduction="none")
    por = verify.explore(scenario, name, preemptions=2, reduction="por")
    assert none.violation and por.violation


def test_a_turns_footprint_is_what_it_read_and_wrote():
    from kickmsg.verify.scheduler import Step

    steps = [Step("pub0", (), "load_acquire_u64", 64, (), 0), Step("pub0", (), "cas_acq_rel_u32", 72, (0, 1), 0),
             Step("pub0", (), "cas_acq_rel_u32", 80, (5, 6), 4), Step("pub0", (), "fence_seq_cst", 0, (), None)]
    made = reduction.footprint(steps, [(3, "write")], weak=False)
    assert made.reads == {64, 80}  # the CAS at 80 failed: it only read
    assert made.writes == {72, -4}  # slot 3's payload
    assert reduction.footprint(steps, [], weak=True).writes == {72, reduction.FENCE}
    assert made.conflicts(reduction.Footprint(reads=frozenset({72})))
    assert not made.conflicts(reduction.Footprint(reads=frozenset({64, 80})))


def test_an_unknown_reduction_is_refused():
    with pytest.raises(ValueError, match="'dpor'"):
        verify.explore(verify.Scenario(), reduction="dpor")


def test_the_command_compares_both_reductions():
    done = run_verify("--layout", "9", "--preemptions", "1", "--publishers", "1", "--reduction", "both", "--json")
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout)
    assert result["reduction"] == "por" and result["verdicts_agree"] is True
    assert result["none"]["schedules"] > result["schedules"] > 0
    assert result["reduction_factor"] == round(result["none"]["schedules"] / result["schedules"], 2)
    assert result["schedules_per_second"] > 0
    text = run_verify("--layout", "9", "--preemptions", "1", "--publishers", "1", "--reduction", "both").stdout
    assert "reduction none" in text and "reduction por" in text and "verdicts agree" in text


def test_the_command_refuses_a_wrong_reduction():
    wrong = run_verify("--reduction", "dpor")
    assert wrong.returncode == 2 and "dpor" in wrong.stderr
    both = run_verify("--orders", "--reduction", "both")
    assert both.returncode == 2 and "--reduction none or por" in both.stderr
