"""Typed Blackboard values (kickmsg.typed.declare/observe/snapshot_json)
against the native kickmsg 0.9.2 wheel, which sees plain bytes (run in
subprocesses, tests/nativepeer.py). Boards live under the test's ``prefix``
namespace and are removed whatever the outcome.
"""
import base64
import errno
import json

import numpy as np
import pytest

from kickmsg import Blackboard, BlackboardConfig, typed
from kickmsg.typed import RecordType, TypeMismatchError
from nativepeer import run_native9, start_native9

POSE = RecordType("Pose", [("x", "<f8"), ("y", "<f8"), ("label", "S4")])
CONFIG = BlackboardConfig(capacity=4, max_value_size=64)


def board(prefix: str) -> Blackboard:
    return Blackboard.open_or_create(prefix, "state", CONFIG, "py")


def test_our_typed_writer_read_natively_as_raw_bytes(prefix):
    writer = typed.declare(board(prefix), "pose", POSE)
    assert writer.write([(1.5, -2.0, b"home"), (3.0, 4.0, b"dock")]) == 2
    got = run_native9(r'''
b = kickmsg.Blackboard.try_open(P["ns"], "state")
o = b.observe("pose").read()
done([o.errno, bytes(o.data).hex(), o.update_count])
''', ns=prefix)
    expected = np.array([(1.5, -2.0, b"home"), (3.0, 4.0, b"dock")], dtype=POSE.dtype).tobytes()
    assert got == [0, expected.hex(), 1]


def test_a_native_writer_read_as_records(prefix):
    code = r'''
import struct
b = kickmsg.Blackboard.open_or_create(P["ns"], "state", kickmsg.BlackboardConfig(), "nat")
w = b.declare("pose")
w.write(struct.pack("<dd4s", 7.0, 8.0, b"nat!"))
ready()
wait_go()
done(0)
'''
    with start_native9(code, ns=prefix) as child:
        child.wait_ready()
        reader = typed.observe(Blackboard.try_open(prefix, "state"), "pose", POSE)
        outcome = reader.read()
        assert outcome and outcome.update_count == 1 and reader.owner_alive()
        assert outcome.records.tolist() == [(7.0, 8.0, b"nat!")]
        child.tell()
        child.result()


def test_lengths_are_checked(prefix):
    b = board(prefix)
    raw = b.declare("raw")
    raw.write(b"123")
    with pytest.raises(TypeMismatchError, match="blackboard key 'raw': a value of 3 bytes is not a whole number of 20-byte Pose records"):
        typed.observe(b, "raw", POSE).read()
    never = typed.observe(b, "never", POSE).read()
    assert (bool(never), never.errno, never.records) == (False, errno.ENOENT, None)
    with pytest.raises(ValueError, match=r"one Big record \(80 bytes\) exceeds max_value_size 64"):
        typed.declare(b, "big", RecordType("Big", [("v", "<f8", (10,))]))
    writer = typed.declare(b, "pose", POSE)
    with pytest.raises(OSError) as error:
        writer.write(np.zeros(4, dtype=POSE.dtype))  # 80 bytes > 64
    assert error.value.errno == errno.EMSGSIZE


def test_snapshot_json_is_strict_and_decodes_typed_values(prefix):
    b = board(prefix)
    typed.declare(b, "pose", POSE).write((float("nan"), float("inf"), b"ab"))
    raw = b.declare("raw")
    raw.write(b"\x00\xff")
    empty = b.declare("empty")
    text = typed.snapshot_json(b, {"pose": POSE, "empty": POSE})

    def refuse(word):
        raise AssertionError(f"not strict JSON: {word}")

    got = json.loads(text, parse_constant=refuse)
    assert (got["board"], got["capacity"], got["max_value_size"]) == (f"/{prefix}_bb_state", 4, 64)
    keys = {k["key"]: k for k in got["keys"]}
    assert keys["pose"]["fields"] == [{"x": "NaN", "y": "Infinity", "label": base64.b64encode(b"ab").decode()}]
    assert base64.b64decode(keys["raw"]["value"]) == b"\x00\xff" and "fields" not in keys["raw"]
    assert keys["empty"]["fields"] is None and keys["empty"]["update_count"] == 0
    assert (keys["raw"]["owner_node"], keys["raw"]["owner_alive"], keys["raw"]["value_len"]) == ("py", True, 2)
    del raw, empty
