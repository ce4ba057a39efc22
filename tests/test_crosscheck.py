"""The differential cross-check (``kickmsg.crosscheck``, ``kickmsg crosscheck``).

Against the native kickmsg 0.1.0 (in a child, see ``nativepeer``) it must
agree over a few thousand random operations. Against deliberately altered
copies of this package (copied into tmp_path, one behaviour patched) it must
stop at the first diverging operation: every operation before it agrees
when replayed, the named one does not.
"""
import json
import os
import pathlib
import shutil
import subprocess
import sys
import sysconfig

import pytest

import kickmsg
from kickmsg import crosscheck, crossdriver
from kickmsg.protocol.v4 import layout
from nativepeer import native_dir

KICKMSG = pathlib.Path(sys.executable).with_name("kickmsg")
PACKAGE = pathlib.Path(kickmsg.__file__).parent

# One behaviour each, patched in a copy: (file, original text, replacement).
LOST_PATCH = (  # a lapped subscriber counts one loss instead of the excess
    "subscriber.py",
    (
        "            if write_pos - self._read_pos > capacity:\n"
        "                self._lost += write_pos - capacity - self._read_pos\n"
    ),
    "            if write_pos - self._read_pos > capacity:\n                self._lost += 1\n",
)
DRAIN_PATCH = (  # the drain releases entries but leaves their slot index
    "region.py",
    "                ops.store_seq_cst_u32(entry + layout.SLOT_IDX_OFFSET, layout.INVALID_SLOT)\n",
    "                pass\n",
)

pytestmark = pytest.mark.timeout(120)


def native() -> str:
    return str(native_dir())


def altered_copy(tmp_path, patch) -> str:
    """A copy of this package with one patch applied, as an --other-path
    (with this venv's site-packages after it, for numpy and posix_ipc)."""
    root = tmp_path / "altered"
    shutil.copytree(PACKAGE, root / "kickmsg", ignore=shutil.ignore_patterns("__pycache__"))
    target = root / "kickmsg" / patch[0]
    source = target.read_text()
    assert source.count(patch[1]) == 1, f"the patch no longer applies to {patch[0]}"
    target.write_text(source.replace(patch[1], patch[2]))
    return f"{root}{os.pathsep}{sysconfig.get_paths()['purelib']}"


def assert_first_divergence(result, other_path):
    """The divergence's reproducer replays to the same divergence at its last
    operation, and everything before that operation agrees."""
    assert not result.agreed
    divergence = result.divergence
    assert divergence.reproducer[0][0] == "create"
    assert divergence.reproducer[-1] == divergence.operation
    assert result.compared == divergence.index + 1
    again = crosscheck.replay(sys.executable, divergence.reproducer, other_path)
    assert not again.agreed
    assert again.divergence.index == len(divergence.reproducer) - 1
    assert (again.divergence.ours, again.divergence.other) == (divergence.ours, divergence.other)
    assert again.divergence.differences == divergence.differences
    before = crosscheck.replay(sys.executable, divergence.reproducer[:-1], other_path)
    assert before.agreed, before.report()


def no_regions_left():
    return not list(pathlib.Path("/dev/shm").glob(f"kmcc_{os.getpid()}_*"))


# -- agreement with the native 0.1.0 -----------------------------------------------------------


@pytest.mark.parametrize("seed", range(4))
def test_agrees_with_native_0_1_0(seed):
    """1000 random operations per seed: identical results and region bytes."""
    result = crosscheck.crosscheck(sys.executable, native(), ops=1000, seed=seed)
    assert result.agreed, result.report()
    assert result.compared == 1000
    assert result.other.startswith(str(native_dir() / "kickmsg.abi3.so"))
    assert no_regions_left()


def generate(seed: int, count: int) -> tuple[list, set]:
    """The sequence the generator makes for ``seed`` against this package
    alone, and the kinds of operations and errors it reached."""
    generator = crosscheck.Generator(seed, count)
    driver = crossdriver.Driver(kickmsg)
    operations, seen, name = [], set(), None
    for index, op in enumerate(generator):
        if op[0] == "create":
            if name:
                kickmsg.unlink_shm(name)
            name = f"/kmcc_{os.getpid()}_gen_{seed}_{index}"
        if op[0] in crosscheck.POKES:
            result = crosscheck.poke(op, name, driver.region.geometry)
        else:
            result = json.loads(json.dumps(driver.run(op, name)))
        generator.observe(op, result)
        operations.append(op)
        seen.add(op[0] if not isinstance(result, dict) else f"{op[0]}:{result['error']}")
    driver.drop_all()
    kickmsg.unlink_shm(name)
    return operations, seen


def test_the_sequence_is_reproducible_and_exercises_every_operation():
    """The same seed gives the same operations; a thousand of them reach
    every kind, including refusals (dry pool, too long, full rings)."""
    operations, seen = generate(0, 1000)
    assert generate(0, 1000)[0] == operations
    assert generate(1, 1000)[0] != operations
    assert set(crosscheck.WEIGHTS) <= seen
    assert {"send:BlockingIOError", "send:ValueError", "join:RuntimeError", "publish:ValueError"} <= seen
    assert no_regions_left()


# -- detecting divergences ------------------------------------------------------------------


def test_detects_a_different_lost_count(tmp_path):
    """A copy that counts losses differently diverges on a `lost` result,
    with identical region bytes."""
    other_path = altered_copy(tmp_path, LOST_PATCH)
    result = crosscheck.crosscheck(sys.executable, other_path, ops=3000, seed=1)
    assert not result.agreed
    assert result.other.startswith(str(tmp_path / "altered" / "kickmsg"))
    divergence = result.divergence
    assert divergence.operation[0] == "lost"
    assert divergence.ours > divergence.other  # the copy undercounts
    assert divergence.differences == []
    assert_first_divergence(result, other_path)
    assert f"DIVERGENCE at operation {divergence.index} " in result.report()
    assert no_regions_left()


def test_detects_different_region_bytes_and_names_the_fields(tmp_path):
    """A copy whose drain leaves slot indexes in place diverges in the ring
    entries' slot_idx when a subscriber leaves."""
    other_path = altered_copy(tmp_path, DRAIN_PATCH)
    result = crosscheck.crosscheck(sys.executable, other_path, ops=3000, seed=2)
    assert not result.agreed
    divergence = result.divergence
    assert divergence.operation[0] == "leave"
    assert divergence.ours == divergence.other is None
    assert divergence.differences
    for difference in divergence.differences:
        assert difference["field"].startswith("ring ") and difference["field"].endswith(".slot_idx"), difference
        assert difference["ours"] == "INVALID_SLOT" and difference["other"].isdigit()
    assert_first_divergence(result, other_path)
    assert no_regions_left()


def test_field_names_of_offsets():
    """Byte offsets decode to WIRE.md's fields (creator "crosscheck": rings at 896)."""
    geometry = layout.Geometry.for_config(1, 2, 4, 3, 20, 10_000, len("crosscheck"))
    assert (geometry.sub_rings_offset, geometry.ring_stride, geometry.slot_stride) == (896, 192, 64)
    names = {
        0: "header.magic",
        104: "header.config_hash",
        771: "header.free_top",
        330: "header.schema_data.layout",
        833: "creator name",
        896: "ring 0.state_flight",
        896 + 192 + 64: "ring 1.write_pos",
        896 + 192 + 128 + 16 * 3 + 8: "ring 1 entry 3.slot_idx",
        896 + 384 + 64 + 4: "slot 1.next_free",
        896 + 384 + 128 + 8 + 5: "slot 2 payload",
    }
    assert {offset: crosscheck.field_at(geometry, offset).label for offset in names} == names
    assert crosscheck.describe_value("header.free_top", 7 << 32 | 2) == "0x0000000700000002 (generation 7, top slot 2)"
    assert crosscheck.describe_value("ring 0.state_flight", 9) == "9 (Live, in_flight 2)"


# -- the command ----------------------------------------------------------------------------


def cli(*args, timeout: float = 60):
    return subprocess.run([str(KICKMSG), "crosscheck", *map(str, args)], capture_output=True, timeout=timeout, text=True)


def test_cli_exit_0_when_they_agree():
    done = cli("--other-python", sys.executable, "--other-path", native(), "--ops", 300, "--seed", 9, "--json")
    assert done.returncode == 0, done.stderr
    data = json.loads(done.stdout)
    assert (data["agreed"], data["compared"], data["seed"]) == (True, 300, 9)
    text = cli("--other-python", sys.executable, "--other-path", native(), "--ops", 50)
    assert text.returncode == 0 and "agreed: 50 operations (seed 0)" in text.stdout


def test_cli_exit_1_at_a_divergence_and_its_replay(tmp_path):
    other_path = altered_copy(tmp_path, LOST_PATCH)
    done = cli("--other-python", sys.executable, "--other-path", other_path, "--ops", 3000, "--seed", 1)
    assert done.returncode == 1, done.stderr
    head, reproducer = done.stdout.split("\nreproducer (", 1)
    assert "DIVERGENCE at operation" in head and '["lost", ' in head
    lines = reproducer.splitlines()[1:]
    assert json.loads(lines[0])[0] == "create"
    sequence = tmp_path / "repro.jsonl"
    sequence.write_text("\n".join(lines) + "\n")
    again = cli("--other-python", sys.executable, "--other-path", other_path, "--replay", sequence, "--json")
    assert again.returncode == 1
    divergence = json.loads(again.stdout)["divergence"]
    assert divergence["index"] == len(lines) - 1
    assert divergence["operation"] == json.loads(lines[-1])


@pytest.mark.parametrize(
    "args, message",
    [
        (["--other-python", "/nonexistent/python"], "cannot run the other Python"),
        (["--other-python", sys.executable, "--other-path", "/nonexistent"], "did not start"),
        (["--other-python", sys.executable, "--ops", "0"], "positive integer"),
        (["--other-python", sys.executable, "--replay", "/nonexistent/ops.jsonl"], "cannot read"),
    ],
)
def test_cli_exit_2_on_bad_input(args, message):
    done = cli(*args)
    assert done.returncode == 2
    assert len(done.stderr.splitlines()) == 1 and message in done.stderr, done.stderr


def test_cli_help_and_top_level_listing():
    done = cli("--help")
    assert done.returncode == 0 and "kickmsg crosscheck --other-python" in done.stdout.split("examples:", 1)[1]
    top = subprocess.run([str(KICKMSG), "--help"], capture_output=True, text=True, timeout=30)
    assert "crosscheck" in top.stdout
