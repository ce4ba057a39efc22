"""Point the `kickmsg verify --orders` tables of a markdown file at the code as it is.

    .venv/bin/python scripts/orders_table.py README.md [docs/OTHER.md ...]

Each table row names a site (a call of the atomics door) by `file:line`
and function; code moved above a site, or a flow moved to another module,
leaves those cells stale (the tests compare them with
``kickmsg.verify.orders.sites()``). This rewrites, in place:

- every row of a layout-4 or layout-9 ``--orders`` table: its site and
  function cells from the site the row is about, the rows in the order
  ``sites()`` gives (each row's other cells move with it);
- every backticked reference elsewhere in the file to a site of those
  tables (`kickmsg/publisher.py:231`, `region.py:483`, `:216` after one of
  them), in the same style (full path, path below kickmsg/, bare line).

A row is matched to its site by function, operation and rank among that
function's calls of that operation, so explorer results stay with their
site. Functions that moved to other names (``RENAMED``) are followed. A
table whose sites no longer match a layout's is refused, naming the sites
missing or new: its rows need writing by hand (run ``kickmsg verify
--orders``). A reference to a line no site of the tables had is left as
it is and reported.
"""
import argparse
import collections
import os
import pathlib
import re
import sys
from collections.abc import Iterable

ROOT = pathlib.Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))  # this checkout's kickmsg
os.environ["KICKMSG_PURE"] = "1"  # the explorer schedules the flows' source (kickmsg/build.py)

from kickmsg.verify import orders  # noqa: E402

# Flows that moved: layout 4's into kickmsg/protocol/v4 (issue 25), and as noted.
RENAMED = {
    "Publisher._publish": "Publisher._deliver",
    "publish": "Publisher._deliver",  # into the layout-4 core's Publisher (issue 35)
    "_wait_and_capture_slot": "wait_and_capture_slot",
    "Subscriber._pin_next": "pin_next",
    "_join_ring": "join",
    "SharedRegion.leave_ring": "leave",
    "SharedRegion.set_ring_state": "set_state",
    "SharedRegion.drain_ring": "drain",
    "SharedRegion._live_window": "live_window",
    "SharedRegion.repair_locked_entries": "repair_locked_entries",
    # Layout 9's blocking receive and drain, once each (issue 35).
    "Subscriber.receive_view": "Subscriber.park",
    "Subscriber._drain": "drain_window",
    "Subscriber.try_receive_view": "Subscriber.pin_next",
}

ROW = re.compile(r"^\| `(kickmsg/[a-z_0-9/]+\.py):(\d+)` \| `([^`]+)` \| `([a-z_0-9]+)` \|(.*)$")
REFERENCE = re.compile(r"`((?:[a-z_0-9]+/)*[a-z_0-9]+\.py)?:(\d+)`")

Key = tuple[str, str, int]  # (function, operation, rank among that function's calls of that operation)
Location = tuple[str, int]  # (path from the repository root, line)


class TableError(Exception):
    """A table whose rows cannot be matched to the sites of either layout."""


def expected(flows: tuple[tuple[str, object, str], ...]) -> list[tuple[Key, orders.Site, int]]:
    """(key, site, rows) of every site the table of ``flows`` shows: an
    acq_rel one in two rows, a relaxed one in none."""
    found = []
    ranks: collections.Counter[tuple[str, str]] = collections.Counter()
    for site in orders.sites(flows):
        order = orders.OPERATIONS[site.operation].order
        if order == "relaxed":
            continue
        ranks[site.function, site.operation] += 1
        found.append(((site.function, site.operation, ranks[site.function, site.operation]), site,
                      2 if order == "acq_rel" else 1))
    return found


def read_table(rows: list[tuple[int, re.Match[str]]]) -> dict[Key, tuple[Location, list[tuple[int, str]]]]:
    """The table's sites: key -> (where the table says it is, the line
    number and text after the operation cell of each of its rows)."""
    sites: dict[Key, tuple[Location, list[tuple[int, str]]]] = {}
    ranks: collections.Counter[tuple[str, str]] = collections.Counter()
    previous = None
    for number, row in rows:
        location, function, operation = (row[1], int(row[2])), RENAMED.get(row[3], row[3]), row[4]
        if (location, function, operation) != previous:
            ranks[function, operation] += 1
            sites[function, operation, ranks[function, operation]] = (location, [])
            previous = (location, function, operation)
        sites[function, operation, ranks[function, operation]][1].append((number, row[5]))
    return sites


def match(sites: dict[Key, tuple[Location, list[tuple[int, str]]]]) -> list[tuple[Key, orders.Site, int]]:
    """The layout whose sites the table shows, as ``expected`` gives them."""
    misses = []
    for layout, flows in ((4, orders.FLOWS), (9, orders.FLOWS9)):
        wanted = expected(flows)
        if {key for key, _, _ in wanted} == set(sites):
            bad_rows = [f"{key}: {len(sites[key][1])} rows, not {count}" for key, _, count in wanted
                        if len(sites[key][1]) != count]
            if bad_rows:
                raise TableError(f"layout {layout}'s table has rows missing or extra: {'; '.join(bad_rows)}")
            return wanted
        missing = sorted({key for key, _, _ in wanted} - set(sites))
        new = sorted(set(sites) - {key for key, _, _ in wanted})
        misses.append(f"layout {layout}: the code has {missing or 'none'} that the table lacks, "
                      f"the table has {new or 'none'} that the code lacks")
    raise TableError("a table matches neither layout's sites (" + "; ".join(misses) + ")")


def relocate(text: str) -> tuple[str, list[str]]:
    """``text`` with its tables and references pointing at the code as it
    is, and what was left unresolved."""
    lines = text.split("\n")
    tables: list[list[int]] = []  # line indices of each table's rows
    for index, line in enumerate(lines):
        if ROW.match(line):
            if tables and tables[-1][-1] == index - 1:
                tables[-1].append(index)
            else:
                tables.append([index])
    moved: dict[Location, Location] = {}
    rebuilt: dict[int, tuple[list[tuple[orders.Site, int, str]], list[int]]] = {}  # first row -> (rows, all its lines)
    for table in tables:
        sites = read_table([(index + 1, row) for index in table if (row := ROW.match(lines[index]))])
        wanted = match(sites)
        new_rows = []
        for key, site, _ in wanted:
            location, rests = sites[key]
            new_location = (site.path, site.line)
            if moved.setdefault(location, new_location) != new_location:
                raise TableError(f"{location[0]}:{location[1]} names two sites")
            new_rows.extend((site, number, rest) for number, rest in rests)
        rebuilt[table[0]] = (new_rows, table)
    unresolved: list[str] = []

    def references(line: str, number: int) -> str:
        last: list[tuple[str, str]] = []  # the (old path, new path) of the previous reference on this line

        def replace(found: re.Match[str]) -> str:
            path, line_number = found[1], int(found[2])
            if path is None:
                if not last:
                    return found[0]
                old_path, new_previous = last[0]
                candidates = [old_path]
            else:
                candidates = sorted({old for old, _ in moved if old == path or old.endswith("/" + path)})
            targets = {moved[old, line_number] for old in candidates if (old, line_number) in moved}
            if len(targets) != 1:
                if path is not None:
                    last.clear()  # a bare line after it is not the previous reference's
                if candidates and path is not None:
                    unresolved.append(f"line {number}: {found[0]} is no site of the tables")
                elif candidates:
                    unresolved.append(f"line {number}: {found[0]} (in {candidates[0]}) is no site of the tables")
                return found[0]
            new_path, new_line = targets.pop()
            if path is None:
                last[0] = (candidates[0], new_path)
                if new_path == new_previous:
                    return f"`:{new_line}`"
                return f"`{new_path.removeprefix('kickmsg/')}:{new_line}`"
            last[:] = [(candidates[0], new_path)]
            return f"`{new_path if path.startswith('kickmsg/') else new_path.removeprefix('kickmsg/')}:{new_line}`"

        return REFERENCE.sub(replace, line)

    out: list[str] = []
    skip: set[int] = set()
    for index, line in enumerate(lines):
        if index in skip:
            continue
        if index in rebuilt:
            rows, table = rebuilt[index]
            skip.update(table)
            out.extend(f"| `{site.path}:{site.line}` | `{site.function}` | `{site.operation}` |"
                       f"{references(rest, number)}" for site, number, rest in rows)
        else:
            out.append(references(line, index + 1))
    return "\n".join(out), unresolved


def main(argv: Iterable[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("files", nargs="+", type=pathlib.Path, help="markdown files to rewrite in place")
    parser.add_argument("--check", action="store_true", help="change nothing; exit 1 if a file would change")
    args = parser.parse_args(None if argv is None else list(argv))
    status = 0
    for path in args.files:
        text = path.read_text()
        try:
            new, unresolved = relocate(text)
        except TableError as error:
            print(f"{path}: {error}", file=sys.stderr)
            status = 1
            continue
        for problem in unresolved:
            print(f"{path}: {problem}", file=sys.stderr)
        if new != text:
            if args.check:
                print(f"{path}: the --orders tables do not point at the code as it is", file=sys.stderr)
                status = 1
            else:
                path.write_text(new)
                print(f"{path}: rewritten")
        else:
            print(f"{path}: up to date")
    return status


if __name__ == "__main__":
    sys.exit(main())
