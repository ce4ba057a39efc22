"""Layout 9's publish survivors closed by rule 8 of ``kickmsg.verify.layout9``.

Each check is shown on the trial of ``mutations.TRIALS`` that kills a
mutant the default bounds left alive: the unmutated flows pass it, the
mutant fails it with the check's violation.
"""
import re

import pytest

from kickmsg.verify import explore, mutations, orders

MUTANTS = {derived.id: derived.mutant for derived in mutations.derive(9)[0]}
STEAL = orders.SCENARIOS9["steal"]  # a publisher may die holding its lock; the other steals it (one preemption)


@pytest.mark.parametrize("mutant, scenario, preemptions, violation", [
    # a publish delivering to no ring: every Live ring must get a position
    ("protocol/v9/publish.py:152 drop-condition", orders.SCENARIO9, 0,
     r"pub0's message 0 claimed no position on ring\(s\) 0, Live for the whole publish"),
    # a steal that keeps its repairer lock: only a dead actor leaves a lock
    ("protocol/v9/publish.py:65 remove-step", STEAL, 1,
     r"at the end ring 0 entry 0 is left repairer lock of pos 1 by pub[01], which did not die"),
    # a steal not counted: steal_count counts every steal
    ("protocol/v9/publish.py:66 remove-step", STEAL, 1,
     r"at the end steal_count is 0, but 1 steal\(s\) were made \(1 by live actors\)"),
])
def test_rule_8_kills_a_survivor(mutant: str, scenario: object, preemptions: int, violation: str) -> None:
    assert explore(scenario, preemptions=preemptions).violation is None
    report = explore(scenario, mutant=MUTANTS[mutant], preemptions=preemptions)
    assert report.violation is not None
    assert re.fullmatch(violation, report.violation.splitlines()[0])
