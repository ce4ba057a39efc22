"""The documentation site builds in strict mode, and its generated page is
up to date.

`make docs` runs ``mkdocs build --strict``: a link to a missing page,
anchor or repository file, an API reference to a name that does not
exist, or a page left out of the navigation fails it. The build here is
the same, into a temporary directory, so `make test` proves `make docs`
works. The command-line options page is generated from the parser by
scripts/cli_reference.py and committed (so it also reads on a code host);
it must be what the script gives now.
"""
import os
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import ROOT

sys.path.insert(0, str(ROOT / "scripts"))
import cli_reference  # noqa: E402


@pytest.mark.timeout(300)
def test_the_site_builds_in_strict_mode(tmp_path):
    mkdocs = Path(sys.executable).with_name("mkdocs")
    assert mkdocs.exists(), "mkdocs is missing: `make test` installs the docs extra (pip install -e '.[docs]')"
    environment = dict(os.environ, NO_MKDOCS_2_WARNING="1", PYTHONPATH=str(ROOT))
    done = subprocess.run([str(mkdocs), "build", "--strict", "--site-dir", str(tmp_path / "site")], cwd=ROOT,
                          capture_output=True, text=True, timeout=240, env=environment, stdin=subprocess.DEVNULL)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-5000:]
    assert "WARNING" not in done.stderr, done.stderr[-5000:]
    site = tmp_path / "site"
    assert (site / "index.html").exists() and (site / "reference" / "api" / "index.html").exists()
    api = (site / "reference" / "api" / "index.html").read_text()
    assert 'id="kickmsg.Publisher.send"' in api and 'id="kickmsg.typed' in api  # docstrings made it in
    assert (site / "repo" / "examples" / "node_patterns.py").exists()  # a page's link to examples/


def test_the_command_line_page_is_up_to_date():
    page = ROOT / "docs" / "reference" / "cli-options.md"
    assert page.read_text() == cli_reference.markdown(), "stale: run scripts/cli_reference.py"


def test_every_page_is_in_the_navigation():
    """MkDocs warns of a page left out (mkdocs.yml: validation), so the build
    above catches it too; this says which, without building."""
    config = (ROOT / "mkdocs.yml").read_text()
    pages = sorted(path.relative_to(ROOT / "docs").as_posix() for path in (ROOT / "docs").rglob("*.md"))
    assert [page for page in pages if f": {page}" not in config] == []


def defined_names(path: Path) -> set[str]:
    """Qualified names of the functions and classes a module defines."""
    import ast

    names = set()

    def visit(node: ast.AST, prefix: str) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                names.add(prefix + child.name)
                visit(child, prefix + child.name + ".")

    visit(ast.parse(path.read_text()), "")
    return names


def test_the_protocol_map_names_functions_that_exist():
    """Each row of the map from spec steps to code names files, then the
    functions they define: renaming or moving a flow fails this until the
    page follows (docs/explanation/protocol.md)."""
    import re

    page = (ROOT / "docs" / "explanation" / "protocol.md").read_text()
    table = [line for line in page.splitlines() if line.startswith("| ") and "kickmsg/" in line]
    assert len(table) >= 10
    checked = 0
    for row in table:
        for cell in row.split(" | ")[1:]:
            current = None
            for path, name in re.findall(r"`(kickmsg/[\w/]+\.py)`|`([A-Za-z_][\w.]*)`", cell):
                if path:
                    current = path
                    assert (ROOT / path).is_file(), f"{path} does not exist"
                elif current is not None and re.fullmatch(r"[A-Za-z_][\w]*(\.[A-Za-z_]\w*)?", name):
                    assert name in defined_names(ROOT / current), f"{current} defines no {name}"
                    checked += 1
    assert checked >= 25


def test_the_architecture_page_names_files_that_exist():
    """Every path of the package the architecture page names exists
    (docs/explanation/architecture.md, the map of the code)."""
    import re

    page = (ROOT / "docs" / "explanation" / "architecture.md").read_text()
    paths = set(re.findall(r"`(kickmsg/[\w/]*\w(?:\.py|\.c)?/?)`", page))
    assert len(paths) >= 15
    assert sorted(path for path in paths if not (ROOT / path).exists()) == []


def test_the_readme_and_contributing_link_to_files_that_exist():
    """The site's build checks the pages' links; these two files are read on
    their own (a clone, a code host), so their relative links are checked
    here."""
    import re

    for name in ("README.md", "CONTRIBUTING.md"):
        text = (ROOT / name).read_text()
        targets = [target for target in re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", text) if "://" not in target]
        assert targets, name
        assert [target for target in targets if not (ROOT / target).exists()] == [], name


def test_every_page_has_one_title():
    """Each page opens with its one ``#`` title (outside code blocks): a
    page opening at ``##`` shows the theme's title and then its own, twice."""
    import re

    for path in sorted((ROOT / "docs").rglob("*.md")):
        fence = None
        titles, first_heading = [], None
        for line in path.read_text().splitlines():
            marker = re.match(r"(```+|~~~+)", line)
            if marker:
                fence = marker.group(1) if fence is None else None if line.startswith(fence) else fence
            elif fence is None and re.match(r"#{1,6} ", line):
                first_heading = first_heading or line
                titles += [line] if line.startswith("# ") else []
        page = path.relative_to(ROOT).as_posix()
        assert first_heading is not None and first_heading.startswith("# "), f"{page} opens with {first_heading!r}"
        assert len(titles) == 1, f"{page} has {len(titles)} titles: {titles}"
