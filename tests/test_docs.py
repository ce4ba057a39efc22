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
