"""Every Python block of the README runs as written.

Each ```python block is run on its own, in a fresh interpreter whose
``/dev/shm`` is a tmpfs of its own (a private mount namespace made with
``unshare``): the blocks use the names a user would (``/kickmsg_imu``), and
can neither meet a real channel of this machine nor leave anything behind.
A block must exit 0. When a ```text block follows a Python block directly,
it is that block's output, and must be exactly what the block printed.
"""
import os
import re
import subprocess
import sys

import pytest

from conftest import ROOT

FENCE = re.compile(r"^```(\w*)\n(.*?)^```\n", re.MULTILINE | re.DOTALL)


def readme_blocks() -> list[tuple[int, str, str | None]]:
    """(line, code, expected output or None) of each Python block."""
    text = (ROOT / "README.md").read_text()
    fences = list(FENCE.finditer(text))
    blocks = []
    for index, fence in enumerate(fences):
        if fence.group(1) != "python":
            continue
        following = fences[index + 1] if index + 1 < len(fences) else None
        output = None
        if following is not None and following.group(1) == "text" and not text[fence.end():following.start()].strip():
            output = following.group(2)
        blocks.append((text.count("\n", 0, fence.start()) + 1, fence.group(2), output))
    return blocks


BLOCKS = readme_blocks()


def test_the_readme_has_python_blocks():
    assert len(BLOCKS) >= 8 and sum(output is not None for _, _, output in BLOCKS) >= 3


@pytest.mark.timeout(600)
@pytest.mark.parametrize("line, code, output", BLOCKS, ids=[f"line{line}" for line, _, _ in BLOCKS])
def test_readme_block_runs_as_written(line, code, output, tmp_path):
    """Runs in a private /dev/shm, in an empty working directory."""
    script = tmp_path / "block.py"
    script.write_text(code)
    command = [
        "unshare", "--mount", "--propagation", "private", "sh", "-c",
        'mount -t tmpfs tmpfs /dev/shm && exec "$0" "$1"', sys.executable, str(script),
    ]
    timeout = 300 if "kickmsg.spark" in code else 60
    before = set(os.listdir("/dev/shm"))
    done = subprocess.run(command, capture_output=True, text=True, timeout=timeout, cwd=tmp_path)
    assert done.returncode == 0, f"README block at line {line} failed:\n{done.stderr[-4000:]}"
    if output is not None:
        assert done.stdout == output, f"README block at line {line} printed something else"
    appeared = set(os.listdir("/dev/shm")) - before
    assert not {entry for entry in appeared if entry.startswith(("kickmsg", "x"))}, "a block reached the real /dev/shm"
