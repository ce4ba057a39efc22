"""scripts/orders_table.py: the --orders tables of a markdown file follow the code.

A table made stale (lines shifted, a function under its old name, rows out
of order) and the references to its sites are put back as they were; a
reference to no site is reported; a table with a site too many is refused.
"""
import importlib.util
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "scripts" / "orders_table.py"
SPEC = importlib.util.spec_from_file_location("orders_table", SCRIPT)
orders_table = importlib.util.module_from_spec(SPEC)
SPEC.loader.exec_module(orders_table)

REFERENCE = re.compile(r"`((?:kickmsg/)?protocol/[a-z_0-9/]+\.py):(\d+)`")  # every site is in kickmsg/protocol/


def site_of(rows: list[str], function: str, operation: str, rank: int = 0) -> str:
    """The ``file:line`` cell of the rank-th row about ``function``'s ``operation``."""
    cells = [row.split("`")[1] for row in rows if f"| `{function}` | `{operation}` |" in row]
    return sorted(set(cells), key=cells.index)[rank]


def tables_of_the_docs() -> str:
    """The two --orders tables of docs/explanation/verification.md, with a
    line of prose after each that points at sites in the three styles."""
    tables: list[list[str]] = [[]]
    for line in (ROOT / "docs" / "explanation" / "verification.md").read_text().split("\n"):
        if orders_table.ROW.match(line):
            tables[-1].append(line)
        elif tables[-1]:
            tables.append([])
    layout4, layout9 = tables[:2]
    pre_set = site_of(layout4, "Publisher._deliver", "store_release_u32")
    slot_idx_line = site_of(layout4, "Publisher._deliver", "store_release_u32", 1).rpartition(":")[2]
    pin = site_of(layout4, "pin_next", "cas_acq_rel_u32").removeprefix("kickmsg/")
    return "\n".join([
        "| site | function | operation | order → weakened | result | why |",
        "|---|---|---|---|---|---|",
        *layout4,
        "",
        f"The pre-set (`{pre_set}`, `:{slot_idx_line}`) and the pin (`{pin}`).",
        "",
        *layout9,
        "",
    ])


def stale(text: str) -> str:
    """``text`` as an older checkout had it: every site 7 lines lower, the
    publish flow under its old name, the last two rows of each table swapped."""
    shifted = REFERENCE.sub(lambda found: f"`{found[1]}:{int(found[2]) + 7}`", text)
    shifted = re.sub(r"`:(\d+)`", lambda found: f"`:{int(found[1]) + 7}`", shifted)
    shifted = shifted.replace("| `Publisher._deliver` |", "| `publish` |")
    lines = shifted.split("\n")
    for index in range(1, len(lines) - 1):
        if lines[index] == "" and orders_table.ROW.match(lines[index - 1]) and orders_table.ROW.match(lines[index - 2]):
            lines[index - 2], lines[index - 1] = lines[index - 1], lines[index - 2]
    return "\n".join(lines)


def test_a_stale_table_and_its_references_are_put_back():
    text = tables_of_the_docs()
    assert orders_table.relocate(text) == (text, [])
    old = stale(text)
    assert old != text
    assert orders_table.relocate(old) == (text, [])


def test_a_reference_to_no_site_is_left_and_reported():
    text = tables_of_the_docs() + "A line that is no site: `kickmsg/protocol/v4/publish.py:1`, `:2`.\n"
    new, unresolved = orders_table.relocate(text)
    assert new == text
    assert unresolved == [f"line {text.count(chr(10))}: `kickmsg/protocol/v4/publish.py:1` is no site of the tables"]


def test_a_table_of_other_sites_is_refused():
    text = tables_of_the_docs()
    extra = next(line for line in text.split("\n") if "`pin_next`" in line).replace("`pin_next`", "`pin_later`")
    with pytest.raises(orders_table.TableError, match="pin_later"):
        orders_table.relocate(text.replace("\n\n", f"\n{extra}\n\n", 1))


def test_the_command_rewrites_in_place(tmp_path):
    page = tmp_path / "page.md"
    page.write_text(stale(tables_of_the_docs()))
    check = subprocess.run([sys.executable, str(SCRIPT), "--check", str(page)], capture_output=True, text=True)
    assert check.returncode == 1 and "do not point at the code" in check.stderr
    done = subprocess.run([sys.executable, str(SCRIPT), str(page)], capture_output=True, text=True)
    assert done.returncode == 0 and done.stdout == f"{page}: rewritten\n", done.stderr
    assert page.read_text() == tables_of_the_docs()
