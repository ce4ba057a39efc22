"""Every code block of the README and of the documentation runs as written.

The blocks of README.md, CONTRIBUTING.md and every page under docs/ are
collected. Each ```python block is run on its own, in a fresh interpreter,
and each ```sh (or ```bash) block by ``bash -e -o pipefail`` with this
interpreter's ``bin`` directory first on PATH (so ``kickmsg`` is the command of the
package under test). Each runs in an empty working directory, whose
``native-kickmsg`` entry leads to the native kickmsg 0.9.2 that `make test`
installs (the tutorial's second process uses it), and with a ``/dev/shm``
of its own (a tmpfs in a private mount namespace made with ``unshare``):
the blocks use the names a user would (``/kickmsg_imu``), and can neither
meet a real channel of this machine nor leave anything behind. A block
must exit 0, and leave that ``/dev/shm`` empty: what an example creates, it
removes, as a reader running it on their machine would want. When a ```text block follows a run block directly, it is that
block's output, and must be exactly what the block printed.

A block that cannot run here (``make test`` itself, two hosts, a command
synopsis with optional parts in brackets) is preceded by an HTML comment
``<!-- not run: WHY -->``, which the reader of the page does not see. A
fence without a language, or ```text, is a transcript or an output, never
run.
"""
import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import ROOT

FENCE = re.compile(r"^```(\w*)\n(.*?)^```\n", re.MULTILINE | re.DOTALL)
NOT_RUN = re.compile(r"<!-- not run: [^>]+ -->\s*$")
RUN_LANGUAGES = {"python": "python", "sh": "shell", "bash": "shell"}
NATIVE9 = ROOT / ".native" / "kickmsg-0.9.2"


def documents() -> list[Path]:
    """README.md, CONTRIBUTING.md, then every page of docs/, in a stable order."""
    return [ROOT / "README.md", ROOT / "CONTRIBUTING.md", *sorted((ROOT / "docs").rglob("*.md"))]


def code_blocks(path: Path) -> list[tuple[str, int, str, str | None]]:
    """(kind, line, code, expected output or None) of each block to run."""
    text = path.read_text()
    fences = list(FENCE.finditer(text))
    blocks = []
    for index, fence in enumerate(fences):
        kind = RUN_LANGUAGES.get(fence.group(1))
        if kind is None or NOT_RUN.search(text[:fence.start()]):
            continue
        following = fences[index + 1] if index + 1 < len(fences) else None
        output = None
        if following is not None and following.group(1) == "text" and not text[fence.end():following.start()].strip():
            output = following.group(2)
        blocks.append((kind, text.count("\n", 0, fence.start()) + 1, fence.group(2), output))
    return blocks


BLOCKS = [(path.relative_to(ROOT).as_posix(), *block) for path in documents() for block in code_blocks(path)]


def test_the_docs_have_code_blocks():
    assert sum(where == "README.md" for where, *_ in BLOCKS) >= 1
    assert len(BLOCKS) >= 25 and sum(output is not None for *_, output in BLOCKS) >= 10
    assert any(kind == "shell" for _, kind, *_ in BLOCKS)


def test_every_block_left_out_says_why():
    """A `not run` comment stands right before a block of a language that
    would otherwise run, and gives a reason."""
    for path in documents():
        text = path.read_text()
        for comment in re.finditer(r"<!-- not run:(.*?)-->", text):
            assert comment.group(1).strip(), f"{path.name}: a `not run` comment without a reason"
            after = text[comment.end():].lstrip()
            language = re.match(r"```(\w*)\n", after)
            assert language and language.group(1) in RUN_LANGUAGES, \
                f"{path.name}: a `not run` comment that is not right before a python or shell block"


@pytest.mark.timeout(600)
@pytest.mark.parametrize("where, kind, line, code, output", BLOCKS,
                         ids=[f"{where}:{line}" for where, _, line, _, _ in BLOCKS])
def test_block_runs_as_written(where, kind, line, code, output, tmp_path):
    """Runs in a private /dev/shm, in an empty working directory."""
    work = tmp_path / "work"
    work.mkdir()
    if NATIVE9.is_dir():
        (work / "native-kickmsg").symlink_to(NATIVE9)
    if kind == "python":
        script = tmp_path / "block.py"
        program = [sys.executable, str(script)]
    else:
        script = tmp_path / "block.sh"
        program = ["bash", "-e", "-o", "pipefail", str(script)]
    script.write_text(code)
    left = tmp_path / "left-in-dev-shm"  # what the block left in its /dev/shm, listed once it has ended
    command = [
        "unshare", "--mount", "--propagation", "private", "sh", "-c",
        'mount -t tmpfs tmpfs /dev/shm || exit 1; left=$1; shift; "$@"; status=$?; ls -A /dev/shm > "$left"; exit $status',
        "sh", str(left), *program,
    ]
    environment = dict(os.environ, PATH=f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}")
    timeout = 300 if "kickmsg.spark" in code else 60
    before = set(os.listdir("/dev/shm"))
    with subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=work,
                          env=environment, stdin=subprocess.DEVNULL, start_new_session=True) as block:
        try:
            stdout, stderr = block.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            os.killpg(block.pid, signal.SIGKILL)  # the shell and the block under it
            stdout, stderr = block.communicate()
            pytest.fail(f"the block at {where}:{line} did not end within {timeout} s:\n{stdout[-2000:]}\n{stderr[-4000:]}")
    assert block.returncode == 0, f"the block at {where}:{line} failed:\n{stdout[-2000:]}\n{stderr[-4000:]}"
    if output is not None:
        assert stdout == output, f"the block at {where}:{line} printed something else:\n{stdout}"
    assert left.read_text().split() == [], f"the block at {where}:{line} left these in /dev/shm: {left.read_text().split()}"
    appeared = set(os.listdir("/dev/shm")) - before
    assert not {entry for entry in appeared if entry.startswith(("kickmsg", "x"))}, "a block reached the real /dev/shm"
