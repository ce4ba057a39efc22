"""Write the `kickmsg verify --mutations` tables of a markdown file.

    .venv/bin/python scripts/mutations_table.py docs/explanation/verification.md [--preemptions K]
        [--layout 4|9] [--jobs N] [--journal PATH]
    .venv/bin/python scripts/mutations_table.py docs/explanation/verification.md --check

Each layout's table sits between the lines ``<!-- mutations layout N -->``
and ``<!-- /mutations layout N -->``: one row per mutant that
``kickmsg.verify.mutations.derive`` gives, with the result of exploring it
(``mutations.run``, at the bounds given), and a summary line after it.
This runs every mutant of both layouts and rewrites the tables in place.
Each layout's survivors table, between ``<!-- survivors layout N -->`` and
``<!-- /survivors layout N -->``, is rewritten with them: one row per
survivor, with the argument its row had (by id), or **not yet argued**.

``--jobs N`` shares the mutants among N processes (each explores every
trial's unmutated flows once more); the time in the summary is then the
wall time of all of them.

Each mutant's result is recorded as it is done, one JSON line in the
journal (``--journal``, by default ``.mutations/layoutN.jsonl`` in this
checkout), with a fingerprint of the package's sources and the bounds. A
run stopped (Ctrl-C) goes on where it stopped when started again: the
results recorded for the same code and bounds are taken, the rest
explored; the time in the summary is then that of the last run only.

``--check`` runs nothing: it exits 1, naming the first difference, if a
table's mutants (their ids, functions and changes) are not those the code
gives now; the results are then stale too, rewrite the tables.
"""
import argparse
import hashlib
import json
import multiprocessing
import os
import pathlib
import re
import signal
import sys
import time
from collections.abc import Callable, Iterable
from typing import Any

ROOT = pathlib.Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))  # this checkout's kickmsg
os.environ["KICKMSG_PURE"] = "1"  # the explorer schedules the flows' source (kickmsg/build.py)

from kickmsg.verify import mutations  # noqa: E402

HEADER = ("| mutant | function | change | result |", "|---|---|---|---|")
START, END = "<!-- mutations layout {} -->", "<!-- /mutations layout {} -->"
SURVIVORS_START, SURVIVORS_END = "<!-- survivors layout {} -->", "<!-- /survivors layout {} -->"
SURVIVORS_HEADER = ("| mutant | function | why it survives |", "|---|---|---|")
NOT_ARGUED = "**not yet argued**"
ROW = re.compile(r"^\| (\S+ [a-z_-]+(?: #\d+)?) \| `([^`]+)` \| (.*) \| ([^|]*) \|$")
SURVIVOR_ROW = re.compile(r"^\| (\S+ [a-z_-]+(?: #\d+)?) \| `[^`]+` \| (.*) \|$")


def change(derived: mutations.Derived) -> str:
    """The change cell: the lines before and after, in code spans."""
    def code(lines: tuple[str, ...]) -> str:
        return "<br>".join(f"`{line}`" for line in lines) or "(nothing)"
    return f"{code(derived.before)} → {code(derived.after)}"


def row(result: mutations.Result) -> str:
    derived = result.derived
    if result.killed:
        verdict = f"killed: {result.violation} ({result.scenario})"
    else:
        verdict = f"**survived** ({result.schedules} schedules)"
    return f"| {derived.id} | `{derived.function}` | {change(derived)} | {verdict.replace('|', '/')} |"


def table(analysis: mutations.Analysis, bounds: str, seconds: float) -> list[str]:
    """The rows and the summary line: ``seconds`` is this run's wall time."""
    explored = sum(result.seconds for result in analysis.results)
    return [*HEADER, *(row(result) for result in analysis.results), "",
            f"{analysis.summary()}; {explored:.0f} s exploring them (summed over the runs and processes; this "
            f"run's wall time {seconds:.0f} s, {bounds})."]


def survivors(lines: list[str], analysis: mutations.Analysis, layout: int) -> list[str]:
    """The layout's survivors table for ``analysis``, each row with the
    argument the table in ``lines`` gave it."""
    start, end = section(lines, layout, SURVIVORS_START, SURVIVORS_END)
    arguments = {found[1]: found[2] for line in lines[start + 1 : end] if (found := SURVIVOR_ROW.match(line))}
    return [*SURVIVORS_HEADER, *(f"| {result.derived.id} | `{result.derived.function}` | "
                                 f"{arguments.get(result.derived.id, NOT_ARGUED)} |"
                                 for result in analysis.results if not result.killed)]


def section(lines: list[str], layout: int, start_marker: str = START, end_marker: str = END) -> tuple[int, int]:
    """The indices of a layout's start and end markers."""
    start, end = start_marker.format(layout), end_marker.format(layout)
    if lines.count(start) != 1 or lines.count(end) != 1 or lines.index(start) > lines.index(end):
        raise SystemExit(f"the file needs one {start} line, then one {end} line")
    return lines.index(start), lines.index(end)


def stale(text: str, layout: int) -> str | None:
    """The first difference between the layout's table in ``text`` and the
    mutants the code gives now (None: none)."""
    lines = text.split("\n")
    start, end = section(lines, layout)
    rows = [found for line in lines[start + 1 : end] if (found := ROW.match(line))]
    derived, _ = mutations.derive(layout)
    for found, mutant in zip(rows, derived):
        expected = (mutant.id, mutant.function, change(mutant))
        if (found[1], found[2], found[3]) != expected:
            return f"layout {layout}: the table has {found[1]} ({found[3]}), the code {mutant.id} ({expected[2]})"
    if len(rows) != len(derived):
        return f"layout {layout}: the table has {len(rows)} mutants, the code {len(derived)}"
    return None


def fingerprint(layout: int, preemptions: int, stale: int) -> str:
    """What a recorded result depends on: the package's sources, the layout and the bounds."""
    digest = hashlib.sha256(f"layout {layout}, {preemptions} preemption(s), {stale} stale".encode())
    for path in sorted((ROOT / "kickmsg").rglob("*.py")):
        digest.update(path.relative_to(ROOT).as_posix().encode() + b"\0" + path.read_bytes())
    return digest.hexdigest()[:16]


def recorded(journal: pathlib.Path, code: str) -> dict[str, dict[str, Any]]:
    """The results the journal holds for ``code`` (a fingerprint), by mutant id."""
    found = {}
    for line in journal.read_text().splitlines() if journal.exists() else ():
        try:
            entry = json.loads(line)
        except json.JSONDecodeError:  # a line cut short by a stop
            continue
        if entry.get("code") == code:
            found[entry["id"]] = entry
    return found


def _share(layout: int, preemptions: int, stale: int, journal: pathlib.Path, code: str, ids: set[str]) -> list[str]:
    """Explore the mutants ``ids``, appending each result to the journal as it
    is done (one line, one write); the scenarios left out."""
    def record(result: mutations.Result) -> None:
        with journal.open("a") as file:
            file.write(json.dumps({"code": code, **result.to_dict()}) + "\n")
        verdict = "killed" if result.killed else "survived"
        print(f"{result.derived.id}: {verdict}, {result.schedules} schedules in {result.seconds:.1f} s", file=sys.stderr)
    return mutations.run(layout, preemptions, stale, only=lambda derived: derived.id in ids, progress=record).left_out


def analysed(layout: int, preemptions: int, stale: int, jobs: int, journal: pathlib.Path,
             only: Callable[[mutations.Derived], bool] = lambda derived: True) -> mutations.Analysis:
    """``mutations.run`` of the layout's mutants (those ``only`` accepts), in
    ``jobs`` processes, taking the results the journal holds for this code
    and these bounds, and recording the others there."""
    code = fingerprint(layout, preemptions, stale)
    derived, skipped = mutations.derive(layout)
    derived = [mutant for mutant in derived if only(mutant)]
    done = recorded(journal, code)
    journal.parent.mkdir(parents=True, exist_ok=True)
    journal.write_text("".join(json.dumps(entry) + "\n" for entry in done.values()))  # drops older code's
    missing = [mutant.id for mutant in derived if mutant.id not in done]
    shares = [set(missing[share::jobs]) for share in range(jobs)]
    # The workers ignore Ctrl-C (else one caught in a finalizer is lost and the worker runs on); the pool is
    # terminated when the parent stops.
    with multiprocessing.Pool(jobs, initializer=signal.signal, initargs=(signal.SIGINT, signal.SIG_IGN)) as pool:
        left_out = pool.starmap(_share, [(layout, preemptions, stale, journal, code, ids) for ids in shares])
    done = recorded(journal, code)
    return mutations.Analysis(
        [mutations.Result(mutant, done[mutant.id]["result"] == "killed", done[mutant.id]["schedules"],
                          done[mutant.id]["seconds"], done[mutant.id]["scenario"], done[mutant.id]["violation"])
         for mutant in derived], skipped, left_out[0])


def main(argv: Iterable[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("file", type=pathlib.Path, help="the markdown file to rewrite in place")
    parser.add_argument("--check", action="store_true", help="run nothing; exit 1 if a table's mutants are stale")
    parser.add_argument("--preemptions", type=int, default=0, help="the bound of every exploration (default 0)")
    parser.add_argument("--stale", type=int, default=1, help="stale reads under ra (default 1)")
    parser.add_argument("--layout", type=int, choices=(4, 9), action="append",
                        help="rewrite this layout's tables only (default: both)")
    parser.add_argument("--jobs", type=int, default=1, choices=range(1, 9), metavar="N",
                        help="processes sharing the mutants (1 to 8, default 1)")
    parser.add_argument("--journal", type=pathlib.Path, metavar="PATH",
                        help="the results recorded as they are done (default: .mutations/layoutN.jsonl here)")
    args = parser.parse_args(None if argv is None else list(argv))
    if not args.file.is_file():
        parser.error(f"{args.file}: no such file")
    text = args.file.read_text()
    if args.check:
        problems = [problem for layout in (4, 9) if (problem := stale(text, layout))]
        for problem in problems:
            print(f"{args.file}: {problem}", file=sys.stderr)
        return 1 if problems else 0
    for layout in args.layout or (4, 9):
        began = time.monotonic()
        journal = args.journal or ROOT / ".mutations" / f"layout{layout}.jsonl"
        try:
            analysis = analysed(layout, args.preemptions, args.stale, args.jobs, journal)
        except KeyboardInterrupt:
            code = fingerprint(layout, args.preemptions, args.stale)
            print(f"stopped: {len(recorded(journal, code))} of layout {layout}'s mutants recorded in {journal}; "
                  "the same command goes on from there", file=sys.stderr)
            return 130
        lines = args.file.read_text().split("\n")  # as it is now: a run of the other layout may have rewritten it
        bounds = f"at most {args.preemptions} preemption(s), under ra {args.stale} stale read(s)"
        start, end = section(lines, layout)
        lines[start + 1 : end] = table(analysis, bounds, time.monotonic() - began)
        start, end = section(lines, layout, SURVIVORS_START, SURVIVORS_END)
        lines[start + 1 : end] = survivors(lines, analysis, layout)
        args.file.write_text("\n".join(lines))
        print(f"layout {layout}: {analysis.summary()}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
