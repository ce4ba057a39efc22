"""kickmsg.verify.mutations: mutants derived from the flows' source.

The derivation (stable ids, every operator, every mutant compiles at its
function's lines, the named mutants unchanged), a mutant that loops
forever stopped, the quick summary (every mutant of a slice killed or
listed with the survivors in the docs), the docs' tables current, and the
command.
"""
import ast
import gc
import importlib.util
import inspect
import json
import re
import sys
import textwrap
from pathlib import Path

import pytest

from kickmsg.verify import MUTANT_SCENARIOS, explore, mutations, mutants
from kickmsg.verify.layout9 import MUTANT_SCENARIOS9

ROOT = Path(__file__).resolve().parents[2]
PAGE = ROOT / "docs" / "explanation" / "verification.md"
SPEC = importlib.util.spec_from_file_location("mutations_table", ROOT / "scripts" / "mutations_table.py")
mutations_table = sys.modules["mutations_table"] = importlib.util.module_from_spec(SPEC)  # its processes find it
SPEC.loader.exec_module(mutations_table)
FREE_STACK = ("pop", "push", "release_slot")
ID = re.compile(r"^protocol/[a-z_0-9/]+\.py:\d+ (drop-condition|negate-condition|drop-operand|move-bound|"
                r"weaken-to-(relaxed|release|acquire|acq_rel)|remove-step|swap-steps)( #\d+)?$")


def listed_survivors() -> set[str]:
    """The ids of the survivors listed in the docs ("Survivors"), each
    argued for or marked not yet argued."""
    text = PAGE.read_text()
    section = text[text.index("### Survivors") :]
    section = section[: re.search(r"\n#{1,3} ", section).start()]
    return set(re.findall(r"^\| (\S+ [a-z_-]+(?: #\d+)?) \|", section, re.MULTILINE))


@pytest.mark.parametrize("layout", [4, 9])
def test_the_mutants_are_derived_stably_by_every_operator(layout):
    derived, skipped = mutations.derive(layout)
    again, _ = mutations.derive(layout)
    assert [mutant.id for mutant in derived] == [mutant.id for mutant in again]
    assert len({mutant.id for mutant in derived}) == len(derived) > 200
    assert all(ID.match(mutant.id) for mutant in derived), [m.id for m in derived if not ID.match(m.id)][:3]
    assert {mutant.operator for mutant in derived} == set(mutations.OPERATORS)
    assert set(skipped) == {"equivalent", "does not parse"}
    for mutant in derived:
        assert mutant.before != mutant.after, mutant.id
        (patch,) = mutant.mutant.patches
        built = mutants.build(patch, mutant.id)  # compiles, with its module's globals
        original = getattr(patch.owner, patch.attribute)
        assert built.__code__.co_firstlineno == original.__code__.co_firstlineno
        if patch.source is not None:  # same lines as the original, so traces name the real ones
            lines, _ = inspect.getsourcelines(original)
            assert patch.source.count("\n") == textwrap.dedent("".join(lines)).count("\n"), mutant.id


def test_a_derived_mutant_changes_only_its_line():
    derived, _ = mutations.derive(9)
    (negated,) = [mutant for mutant in derived if mutant.operator == "negate-condition"
                  and mutant.before == ("if meta_tag(meta) != meta_tag_of(self.read_pos) or field == 0 or "
                                        "field - 1 >= g.pool_size:",)]
    assert negated.id.startswith("protocol/v9/receive.py:")
    assert negated.after == ("if not (meta_tag(meta) != meta_tag_of(self.read_pos) or field == 0 or field - 1 >= "
                             "g.pool_size):",)
    line = int(negated.id.split(":")[1].split()[0])
    function = mutants.build(negated.mutant.patches[0], negated.id)
    assert any(instruction.positions.lineno == line for instruction in
               __import__("dis").get_instructions(function))


def test_the_named_mutants_are_unchanged():
    """A patch with no source edits the original, as before."""
    for mutant in {**mutants.MUTANTS, **mutants.MUTANTS9}.values():
        for patch in mutant.patches:
            assert patch.source is None
            mutants.build(patch, mutant.name)
    report = explore(MUTANT_SCENARIOS["no-seqlock-recheck"], mutant="no-seqlock-recheck", preemptions=1)
    assert report.violation
    scenario, preemptions, stale = MUTANT_SCENARIOS9["pin-fetch-add"]
    assert explore(scenario, mutant="pin-fetch-add", preemptions=preemptions, stale=stale).violation


def test_a_mutant_that_loops_forever_outside_the_actors_is_stopped():
    """push's CAS loop, never satisfied, runs in the region's setup too
    (no scheduler there): it raises instead of hanging."""
    target = "protocol/freestack.py:105 move-bound"
    analysis = mutations.run(9, only=lambda mutant: mutant.id == target)
    (result,) = analysis.results
    assert result.killed and "went round 100000 times in one call" in result.violation, result.violation


def test_a_mutants_failing_finalizer_is_not_reported(monkeypatch):
    """A mutated Subscriber.close whose loop never ends, run by __del__
    after the schedules (outside the explorer): nothing reaches the
    unraisable hook (which prints "Exception ignored ..." tracebacks)."""
    reported = []
    monkeypatch.setattr(sys, "unraisablehook", reported.append)
    target = "protocol/v9/receive.py:425 negate-condition"
    (result,) = mutations.run(9, only=lambda mutant: mutant.id == target).results
    gc.collect()
    assert result.derived.id == target
    assert reported == []


def test_the_table_scripts_journal_keeps_what_was_done_for_this_code(tmp_path):
    """Two processes share a slice of layout 4's mutants, each result
    recorded as it is done. A second run takes a recorded result as it is
    (forged here, so it shows it was not explored again), explores again
    one recorded for other code, and leaves only this code's lines."""
    journal = tmp_path / "layout4.jsonl"
    code = mutations_table.fingerprint(4, 0, 1)
    first = mutations_table.analysed(4, 0, 1, 2, journal, lambda mutant: mutant.function == "push")
    entries = [json.loads(line) for line in journal.read_text().splitlines()]
    assert sorted(entry["id"] for entry in entries) == sorted(result.derived.id for result in first.results)
    assert len(entries) > 5 and {entry["code"] for entry in entries} == {code}
    killed = next(entry for entry in entries if entry["result"] == "killed")
    forged, older = dict(killed, result="survived", schedules=12345), dict(entries[-1], code="0" * 16)
    rest = [entry for entry in entries if entry["id"] not in (forged["id"], older["id"])]
    journal.write_text("".join(json.dumps(entry) + "\n" for entry in [forged, older, *rest]) + '{"cut sh')
    second = {result.derived.id: result for result in
              mutations_table.analysed(4, 0, 1, 2, journal, lambda mutant: mutant.function == "push").results}
    assert not second[forged["id"]].killed and second[forged["id"]].schedules == 12345
    again = next(result for result in first.results if result.derived.id == older["id"])
    assert (second[older["id"]].killed, second[older["id"]].violation) == (again.killed, again.violation)
    assert len(second) == len(first.results)
    lines = [json.loads(line) for line in journal.read_text().splitlines()]
    assert {entry["code"] for entry in lines} == {code} and len(lines) == len(entries)


def test_every_mutant_of_the_quick_slice_is_killed_or_listed():
    """At the default bounds, the mutants of the free stack (both layouts):
    killed, or listed with the survivors in the docs."""
    listed = listed_survivors()
    for layout, functions in ((4, FREE_STACK), (9, FREE_STACK)):
        analysis = mutations.run(layout, only=lambda mutant: mutant.function in functions)
        assert analysis.results and not analysis.left_out
        unlisted = [result.derived.id for result in analysis.results
                    if not result.killed and result.derived.id not in listed]
        assert not unlisted, f"layout {layout}: survivors not listed in {PAGE.name}: {unlisted}"


def test_the_docs_tables_list_the_mutants_of_the_code():
    text = PAGE.read_text()
    for layout in (4, 9):
        assert mutations_table.stale(text, layout) is None, "stale: run scripts/mutations_table.py"
    survivors = {row.split(" | ")[0].removeprefix("| ") for row in text.split("\n") if "| **survived** (" in row}
    assert listed_survivors() == survivors, "the survivors listed are not those of the tables"


def test_every_survivor_is_argued():
    """Each survivor's row says why it survives: a scenario or test that
    kills it, or an argument why the rule is not needed (the issue's "no
    unexplained survivor")."""
    text = PAGE.read_text()
    for layout in (4, 9):
        start, end = mutations_table.section(text.split("\n"), layout, mutations_table.SURVIVORS_START,
                                             mutations_table.SURVIVORS_END)
        rows = text.split("\n")[start + 1 : end]
        unargued = [row.split(" | ")[0] for row in rows if mutations_table.NOT_ARGUED in row]
        assert not unargued, f"layout {layout}: survivors not argued: {unargued}"


def test_the_command_prints_the_table_and_its_summary(monkeypatch, capsys):
    from kickmsg import cli

    derived, skipped = mutations.derive(9)
    chosen = [mutant for mutant in derived if mutant.function == "release_slot"]
    monkeypatch.setattr(mutations, "derive", lambda layout: (chosen, skipped))
    assert cli.main(["verify", "--mutations", "--layout", "9"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].split() == ["mutant", "function", "change", "result"]
    assert lines[1].startswith(chosen[0].id + " ")
    assert re.match(rf"{len(chosen)} mutants: \d+ killed, \d+ survived, 0 skipped .* in \d+ s \(layout 9, at most 0 "
                    r"preemption\(s\), under ra 1 stale read\(s\)\)$", lines[len(chosen) + 1]), lines[len(chosen) + 1]
    assert cli.main(["verify", "--mutations", "--layout", "9", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert [row["id"] for row in data["mutants"]] == [mutant.id for mutant in chosen]
    assert {row["result"] for row in data["mutants"]} <= {"killed", "survived"}


def test_the_command_refuses_a_layout_it_has_not(capsys):
    from kickmsg import cli

    with pytest.raises(SystemExit) as exited:
        cli.main(["verify", "--mutations", "--layout", "5"])
    assert exited.value.code == 2
    assert "argument --layout: invalid choice: 5 (choose from 4, 9)" in capsys.readouterr().err


@pytest.mark.parametrize("args, dropped", [
    (["--mutant", "commit-relaxed"], "--mutant"),
    (["--publishers", "1", "--blocking"], "--publishers, --blocking"),
    (["--memory-model", "sc"], "--memory-model"),
])
def test_the_command_refuses_a_scenario_or_a_mutant_of_its_own(capsys, args, dropped):
    from kickmsg import cli

    assert cli.main(["verify", "--mutations", *args]) == 2
    assert capsys.readouterr() == ("", "kickmsg verify: error: --mutations explores its own scenario set, each "
                                       f"under the model its mutants need: drop {dropped}\n")


def test_the_guard_keeps_the_mutants_lines():
    source = "def f(x):\n    \"\"\"Doc.\"\"\"\n    while (x >\n           0):\n        x -= 1\n    return x\n"
    guarded = mutations._guarded(source, ast.parse(source))
    assert guarded.count("\n") == source.count("\n")
    namespace: dict[str, object] = {}
    exec(guarded, namespace)
    assert namespace["f"](3) == 0


def test_ctrl_c_during_the_mutations_says_how_many_were_done(monkeypatch, capsys):
    """An interrupt after the first mutant: exit 130, "1 of N mutants done"."""
    from kickmsg import cli

    derived, _ = mutations.derive(9)

    def interrupted_run(layout, preemptions, stale, budget, max_schedules, progress):
        progress(mutations.Result(derived[0], True, 1, 0.0))
        raise KeyboardInterrupt

    monkeypatch.setattr(mutations, "run", interrupted_run)
    assert cli.main(["verify", "--mutations", "--layout", "9"]) == 130
    assert re.fullmatch(rf"kickmsg verify: interrupted after \d+ s: 1 of {len(derived)} mutants done "
                        r"\(not exhaustive\)\n", capsys.readouterr().err)
