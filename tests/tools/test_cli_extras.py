"""record, play and analyze without the ``spark`` extra, and analyze's
checks of its paths before Spark starts.

A missing dependency is simulated honestly: a directory first on PYTHONPATH
holds a ``pyarrow.py`` (or ``pyspark.py``) that raises what Python raises for
a module that is not installed. The same shadowing proves that a refused
path never got as far as Spark: its error comes first.
"""
import os
import pathlib
import subprocess

import pytest

from test_cli import Result, assert_one_line_error, command_line, make
from test_cli import name  # noqa: F401  (fixture)

pytestmark = pytest.mark.timeout(120)

ROOT = pathlib.Path(__file__).resolve().parents[2]
EXTRA = "pip install 'kickmsg-py[spark]'"
PARQUET_LOOKALIKE = b"PAR1" + bytes(16) + b"PAR1"  # the magic at both ends


def without(tmp_path, *modules: str) -> dict:
    """An environment in which importing ``modules`` fails as if they were not installed."""
    shadows = tmp_path / "shadows"
    shadows.mkdir(exist_ok=True)
    for module in modules:
        (shadows / f"{module}.py").write_text(f"raise ModuleNotFoundError(\"No module named '{module}'\", name={module!r})\n")
    return dict(os.environ, PYTHONPATH=f"{shadows}{os.pathsep}{ROOT}")  # this tree's kickmsg, not an installed one


def cli_in(env: dict, *args) -> Result:
    done = subprocess.run(command_line(args), env=env, capture_output=True, timeout=60, stdin=subprocess.DEVNULL)
    return Result(done.returncode, done.stdout, done.stderr)


def test_record_and_play_without_pyarrow(name, tmp_path):
    """One line naming pyarrow and the extra to install, exit 2; nothing recorded."""
    make(name)
    env = without(tmp_path, "pyarrow")
    out = tmp_path / "rec"
    assert_one_line_error(cli_in(env, "record", name, "--out", out), "record", "pyarrow", EXTRA)
    assert not out.exists()
    assert_one_line_error(cli_in(env, "play", tmp_path), "play", "pyarrow", EXTRA)


def test_analyze_without_pyspark(tmp_path):
    recording = tmp_path / "a.parquet"
    recording.write_bytes(PARQUET_LOOKALIKE)
    env = without(tmp_path, "pyspark")
    assert_one_line_error(cli_in(env, "analyze", recording), "analyze", "pyspark", EXTRA)


@pytest.mark.parametrize("case", ["missing", "empty directory", "text file", "text named parquet", "glob of nothing"])
def test_analyze_refuses_paths_without_recordings_before_spark(tmp_path, case):
    """A missing path, a directory with no *.parquet or *.mcap, a file
    without the Parquet or MCAP magic, a glob that matches nothing: one line, exit 2, before
    pyspark is even imported (its absence would be the error otherwise)."""
    data = tmp_path / "data"
    data.mkdir()
    (data / "good.parquet").write_bytes(PARQUET_LOOKALIKE)
    empty = tmp_path / "empty"
    empty.mkdir()
    (empty / "notes.txt").write_text("no recording here")
    text = tmp_path / "notes.txt"
    text.write_text("PAR1 but not at both ends")
    mixed = tmp_path / "mixed"
    mixed.mkdir()
    (mixed / "good.parquet").write_bytes(PARQUET_LOOKALIKE)
    (mixed / "bad.parquet").write_bytes(b"PAR1 truncated")
    path, phrase = {
        "missing": (tmp_path / "absent", f"no such file or directory: {tmp_path / 'absent'}"),
        "empty directory": (empty, f"no .parquet or .mcap files in {empty}"),
        "text file": (text, f"not a Parquet or MCAP file: {text} (neither PAR1 at its start and end nor the MCAP magic)"),
        "text named parquet": (mixed, f"not a Parquet or MCAP file: {mixed / 'bad.parquet'}"),
        "glob of nothing": (tmp_path / "runs*" / "*.parquet", f"nothing matches {tmp_path / 'runs*' / '*.parquet'}"),
    }[case]
    result = cli_in(without(tmp_path, "pyspark"), "analyze", data, path)
    assert_one_line_error(result, "analyze", phrase)


@pytest.mark.parametrize("path", ["hdfs:///recordings/*/*.parquet", "s3a://bucket/rec/", "GLOB"])
def test_analyze_passes_uris_and_matching_globs_to_spark(tmp_path, path):
    """URIs are not checked locally, and a glob that matches is accepted:
    the command gets as far as importing pyspark (here absent)."""
    (tmp_path / "run1").mkdir()
    (tmp_path / "run1" / "x.parquet").write_bytes(PARQUET_LOOKALIKE)
    target = str(tmp_path / "run*" / "*.parquet") if path == "GLOB" else path
    assert_one_line_error(cli_in(without(tmp_path, "pyspark"), "analyze", target), "analyze", "pyspark", EXTRA)
