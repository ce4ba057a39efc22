"""Write the `kickmsg verify --mutations` tables of a markdown file.

    .venv/bin/python scripts/mutations_table.py docs/explanation/verification.md [--preemptions K] [--layout 4|9] [--jobs N]
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

``--check`` runs nothing: it exits 1, naming the first difference, if a
table's mutants (their ids, functions and changes) are not those the code
gives now; the results are then stale too, rewrite the tables.
"""
import argparse
import concurrent.futures
import pathlib
import re
import sys
import time
from collections.abc import Iterable

ROOT = pathlib.Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))  # this checkout's kickmsg

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
    return [*HEADER, *(row(result) for result in analysis.results), "",
            f"{analysis.summary()}, in {seconds:.0f} s ({bounds})."]


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


def _share(layout: int, preemptions: int, stale: int, jobs: int, share: int) -> dict[str, object]:
    """One process's share of the mutants (every jobs-th, from ``share``): ``Analysis.to_dict``."""
    ids = {derived.id for derived in mutations.derive(layout)[0][share::jobs]}
    return mutations.run(layout, preemptions, stale, only=lambda d: d.id in ids).to_dict()


def analysed(layout: int, preemptions: int, stale: int, jobs: int) -> mutations.Analysis:
    """``mutations.run`` of every mutant of the layout, in ``jobs`` processes."""
    if jobs == 1:
        return mutations.run(layout, preemptions, stale)
    with concurrent.futures.ProcessPoolExecutor(jobs) as pool:
        shares = list(pool.map(_share, *zip(*[(layout, preemptions, stale, jobs, share) for share in range(jobs)])))
    done = {found["id"]: found for share in shares for found in share["mutants"]}
    derived, skipped = mutations.derive(layout)
    return mutations.Analysis(
        [mutations.Result(mutant, done[mutant.id]["result"] == "killed", done[mutant.id]["schedules"],
                          done[mutant.id]["seconds"], done[mutant.id]["scenario"], done[mutant.id]["violation"])
         for mutant in derived], skipped, shares[0]["left_out"])


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
    args = parser.parse_args(None if argv is None else list(argv))
    text = args.file.read_text()
    if args.check:
        problems = [problem for layout in (4, 9) if (problem := stale(text, layout))]
        for problem in problems:
            print(f"{args.file}: {problem}", file=sys.stderr)
        return 1 if problems else 0
    for layout in args.layout or (4, 9):
        began = time.monotonic()
        analysis = analysed(layout, args.preemptions, args.stale, args.jobs)
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
