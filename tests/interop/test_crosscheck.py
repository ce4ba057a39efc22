"""The differential cross-check (``kickmsg.verify.crosscheck``, ``kickmsg crosscheck``).

Against the native kickmsg 0.1.0 (in a child, see ``nativepeer``) it must
agree over a few thousand random operations on layout 4, and against the
native 0.9.2 on layout 9, forged crashes and their repairs included.
Against deliberately altered copies of this package (copied into tmp_path,
one behaviour patched) it must stop at the first diverging operation: every
operation before it agrees when replayed, the named one does not.
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
from kickmsg.protocol import v9
from kickmsg.protocol.v4 import layout
from kickmsg.verify import crosscheck, crossdriver
from nativepeer import NATIVE9_DIR, NATIVE_DIR, native_dir

KICKMSG = pathlib.Path(sys.executable).with_name("kickmsg")
PACKAGE = pathlib.Path(kickmsg.__file__).parent

# One behaviour each, patched in a copy: (file, original text, replacement).
LOST_PATCH = (  # a lapped subscriber counts one loss instead of the excess
    "protocol/v4/receive.py",
    (
        "        if write_pos - cursor.read_pos > capacity:\n"
        "            cursor.lost += write_pos - capacity - cursor.read_pos\n"
    ),
    "        if write_pos - cursor.read_pos > capacity:\n            cursor.lost += 1\n",
)
DRAIN_PATCH = (  # the drain releases entries but leaves their slot index
    "protocol/v4/rings.py",
    "            ops.store_seq_cst_u32(entry + layout.SLOT_IDX_OFFSET, layout.INVALID_SLOT)\n",
    "            pass\n",
)

# Layout 9 (our reclaim runs on both regions, so it is not in question here):
# a steal whose skip marker names the next position.
SKIP_PATCH = (
    "protocol/v9/publish.py",
    "    ops.store_release_u64(entry + SEQUENCE_OFFSET, skip_marker(pos))\n",
    "    ops.store_release_u64(entry + SEQUENCE_OFFSET, skip_marker(pos + 1))\n",
)

pytestmark = pytest.mark.timeout(120)


def native() -> str:
    return str(native_dir())


def native9() -> str:
    return str(native_dir("0.9.2"))


def altered_copy(tmp_path, patch) -> str:
    """A copy of this package with one patch applied, as an --other-path
    (with this venv's site-packages after it, for numpy and posix_ipc). The
    copy leaves out the compiled modules, so that it runs its patched
    source (the pure build; the cffi shim is kept)."""
    root = tmp_path / "altered"
    shutil.copytree(PACKAGE, root / "kickmsg", ignore=shutil.ignore_patterns("__pycache__", "*.cpython-*.so"))
    target = root / "kickmsg" / patch[0]
    source = target.read_text()
    assert source.count(patch[1]) == 1, f"the patch no longer applies to {patch[0]}"
    target.write_text(source.replace(patch[1], patch[2]))
    return f"{root}{os.pathsep}{sysconfig.get_paths()['purelib']}"


def assert_first_divergence(result, other_path, layout=4):
    """The divergence's reproducer replays to the same divergence at its last
    operation, and everything before that operation agrees."""
    assert not result.agreed
    divergence = result.divergence
    assert divergence.reproducer[0][0] == "create"
    assert divergence.reproducer[-1] == divergence.operation
    assert result.compared == divergence.index + 1
    again = crosscheck.replay(sys.executable, divergence.reproducer, other_path, layout=layout)
    assert not again.agreed
    assert again.divergence.index == len(divergence.reproducer) - 1
    assert (again.divergence.ours, again.divergence.other) == (divergence.ours, divergence.other)
    assert again.divergence.differences == divergence.differences
    before = crosscheck.replay(sys.executable, divergence.reproducer[:-1], other_path, layout=layout)
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


def generate(seed: int, count: int, layout: int = 4) -> tuple[list, set]:
    """The sequence the generator makes for ``seed`` against this package
    alone (as the cross-check runs it), and the kinds of operations and
    errors it reached; on layout 9 also the repairs and crashes that did
    something ("repair_locked_entries>0", "crash_send:crashed", ...)."""
    generator = crosscheck.Generator(seed, count, layout)
    driver = crossdriver.Driver(kickmsg, layout)
    operations, seen, name = [], set(), None
    for index, op in enumerate(generator):
        if op[0] == "create":
            if name:
                kickmsg.unlink_shm(name)
            name = f"/kmcc_{os.getpid()}_gen_{seed}_{index}"
        if op[0] in crosscheck.POKES:
            result = crosscheck.poke(op, name, driver.region.geometry)
        elif op[0] in crosscheck.CRASHES:
            result = crosscheck.crash(op, name)
            seen.add(f"{op[0]}:{result}")
        else:
            killed = driver.subscribers.get(op[1]) if op[0] == "kill_subscriber" else None
            result = json.loads(json.dumps(driver.run(op, name)))
            if killed is not None:
                crosscheck.bury(name, killed._core.ring_index)
        if op[0] in ("repair_locked_entries", "reset_retired_rings", "reclaim_orphaned_slots", "reclaim_dead_rings",
                     "reset_schema_claim"):
            seen.add(f"{op[0]}>0" if result else op[0])
        generator.observe(op, result)
        operations.append(op)
        seen.add(op[0] if not isinstance(result, dict) else f"{op[0]}:{result['error']}")
    driver.drop_all()
    kickmsg.unlink_shm(name)
    return operations, seen


def test_the_sequence_is_reproducible_and_exercises_every_operation():
    """The same seed gives the same operations (the count only cuts the
    sequence short); a thousand of them reach every kind, including
    refusals (dry pool, too long, full rings)."""
    operations, seen = generate(0, 1000)
    assert generate(0, 300)[0] == operations[:300]
    assert generate(1, 300)[0] != operations[:300]
    assert set(crosscheck.WEIGHTS) <= seen
    assert {"send:BlockingIOError", "send:ValueError", "join:RuntimeError", "publish:ValueError"} <= seen
    assert no_regions_left()


# -- agreement with the native 0.9.2, on layout 9 ------------------------------------------------

LAYOUT9_SEED, LAYOUT9_OPS = 3, 2500


def test_agrees_with_native_0_9_2_on_layout_9():
    """2500 random operations on layout 9 (crashes and repairs included, see
    the next test): identical results and region bytes."""
    result = crosscheck.crosscheck(sys.executable, native9(), ops=LAYOUT9_OPS, seed=LAYOUT9_SEED, layout=9)
    assert result.agreed, result.report()
    assert (result.compared, result.layout) == (LAYOUT9_OPS, 9)
    assert result.other.startswith(str(native_dir("0.9.2") / "kickmsg"))
    assert no_regions_left()


def test_the_layout_9_sequence_crashes_and_repairs():
    """The sequence of the agreement test reaches every layout-9 kind, the
    refusals of 0.9.2's API (superseded and published slots), publishers
    dying mid-send, subscribers dying mid-join and mid-leave, a schema
    claimer and a reclaimer dying, killed subscribers, and each repair doing
    something."""
    operations, seen = generate(LAYOUT9_SEED, LAYOUT9_OPS, layout=9)
    assert set(crosscheck.WEIGHTS9) <= seen
    assert {"fill:BufferError", "publish_len:ValueError", "send:BlockingIOError", "join:RuntimeError"} <= seen
    assert {"crash_send:crashed", "crash_send:completed", "crash_claim_schema:crashed", "crash_subscriber:crashed joining",
            "crash_subscriber:crashed leaving", "crash_reclaim_dead_rings:crashed"} <= seen
    assert {"repair_locked_entries>0", "reset_retired_rings>0", "reclaim_orphaned_slots>0", "reclaim_dead_rings>0",
            "reset_schema_claim>0"} <= seen
    assert not seen & ({"allocate", "publish"} | crosscheck.POKES)  # layout 4's forms
    assert no_regions_left()


# WIRE9.md H.3: a publisher dies holding the lock of position 0, two more
# die after claiming positions 1 and 2 (entry 0 is position 2's window
# entry, still locked for 0), then the repair, a live publisher's wrap onto
# the never-written entry 1, and the ring's leave and reset.
EARLIER_LAP_LOCK = [
    ["create", "PubSub", 1, 2, 5, 8, 1000],
    ["join", 0],
    ["crash_send", 6, 4, 1],
    ["crash_send", 5, 4, 2],
    ["crash_send", 5, 4, 3],
    ["diagnose"],
    ["repair_locked_entries"],
    ["recv", 0],
    ["lost", 0],
    ["publisher", 1],
    ["send", 1, 4, 9],
    ["dropped", 1],
    ["recv", 0],
    ["lost", 0],
    ["leave", 0],
    ["reset_retired_rings"],
    ["reclaim_orphaned_slots"],
]


def test_an_earlier_laps_lock_is_repaired_alike():
    """0.9.2 and we steal a lock older than its window position into that
    position's skip marker, and the reader counts each of the four
    positions lost once (H.3: no double count)."""
    result = crosscheck.replay(sys.executable, EARLIER_LAP_LOCK, native9(), layout=9)
    assert result.agreed, result.report()
    assert results_here(EARLIER_LAP_LOCK) == [None, None, "crashed", "crashed", "crashed", [1, 0, 0, 1, False], 1, None, 1, None, 4, 1, None, 4,
                    None, 1, 3]


def results_here(operations: list) -> list:
    """The results of ``operations`` (layout 9) run on this package alone."""
    driver = crossdriver.Driver(kickmsg, 9)
    name = f"/kmcc_{os.getpid()}_replay"
    results = [crosscheck.crash(op, name) if op[0] in crosscheck.CRASHES else driver.run(op, name) for op in operations]
    driver.drop_all()
    kickmsg.unlink_shm(name)
    return results


def test_field_names_and_values_of_layout_9():
    """Layout-9 offsets decode to WIRE9.md's fields (A.2-A.5), the tagged words to their meaning."""
    geometry = v9.Geometry.for_config(1, 2, 4, 3, 20, 10_000, len("crosscheck"))
    assert (geometry.sub_rings_offset, geometry.ring_stride, geometry.slot_stride) == (896, 192, 64)
    names = {
        776: "header.steal_count",
        784: "header.identity_hash",
        896 + 8: "ring 0.owner_pid",
        896 + 192 + 88: "ring 1.lost_count",
        896 + 192 + 128 + 16 * 3 + 8: "ring 1 entry 3.meta",
        896 + 384 + 8: "slot 0.payload_len",
        896 + 384 + 64 + 16: "slot 1 payload",
    }
    assert {offset: crosscheck.field_at9(geometry, offset).label for offset in names} == names
    describe = crosscheck.describe_value
    assert describe("ring 0 entry 1.sequence", 0x8000000000000004, 9) == "0x8000000000000004 (publisher lock of position 4)"
    assert describe("ring 0 entry 1.sequence", 0x400000000000000B, 9) == "0x400000000000000b (skip marker of position 10)"
    assert describe("ring 0 entry 0.meta", 0x6000004, 9) == "0x0000000006000004 (tag 6, slot 3)"
    assert describe("ring 0.state_flight", 7, 9) == "7 (Reclaiming, in_flight 1)"
    assert describe("ring 0.owner_pid", crosscheck.DRIVER_MARK, 9) == "its driver process's"


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


@pytest.mark.parametrize("seed, operation", [(3, "repair_locked_entries"), (4, "send")])
def test_detects_a_wrong_skip_marker(tmp_path, seed, operation):
    """Layout 9: a copy whose steal writes the skip marker of the next
    position diverges when a forged crash's lock is stolen, by the repair
    or by a publisher's self-repair."""
    other_path = altered_copy(tmp_path, SKIP_PATCH)
    result = crosscheck.crosscheck(sys.executable, other_path, ops=500, seed=seed, layout=9)
    divergence = result.divergence
    assert divergence is not None and divergence.operation[0] == operation
    assert any(op[0] == "crash_send" for op in divergence.reproducer)
    sequence = [d for d in divergence.differences if d["field"].endswith(".sequence")]
    assert sequence and all("skip marker of position" in d["ours"] for d in sequence), divergence.differences
    assert_first_divergence(result, other_path, layout=9)
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
    assert text.returncode == 0 and "agreed: 50 operations (seed 0, layout 4)" in text.stdout
    nine = cli("--other-python", sys.executable, "--other-path", native9(), "--layout", 9, "--ops", 100, "--json")
    assert nine.returncode == 0, nine.stderr
    assert (json.loads(nine.stdout)["agreed"], json.loads(nine.stdout)["layout"]) == (True, 9)


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
        (["--other-python", sys.executable, "--ops", "0"], "from 1 to 1000000, got 0"),
        (["--other-python", sys.executable, "--ops", "100000000"], "from 1 to 1000000, got 100000000"),
        (["--other-python", sys.executable, "--replay", "/nonexistent/ops.jsonl"], "cannot read"),
        (["--other-python", sys.executable, "--other-path", str(NATIVE9_DIR), "--ops", "3"], "choose --layout 9"),
        (["--other-python", sys.executable, "--other-path", str(NATIVE_DIR), "--ops", "3", "--layout", "9"],
         "choose --layout 4"),
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
