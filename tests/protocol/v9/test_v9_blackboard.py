"""The Blackboard (WIRE9.md section D) against the native kickmsg 0.9.2 wheel,
both ways, and against hostile bytes.

The wheel only ever runs in subprocesses (tests/nativepeer.py); our side runs
in the test process or in a subprocess of its own. Both implementations run
the same snippets (the API is 0.9.2's). Waits are on observable state (a
child's ``ready`` line, the board's waiters word, a value's update count),
never on sleeps; every board lives under the test's ``prefix`` namespace and
is removed whatever the outcome.
"""
import errno
import os
import signal
import struct
import time

import pytest

from kickmsg import Blackboard, BlackboardConfig
from kickmsg.atomics import HARDWARE, Atomics
from kickmsg.hash import fnv1a_64
from kickmsg.protocol.common import CorruptRegionError
from kickmsg.protocol.v9 import blackboard as bb
from kickmsg.protocol.v9.layout import VersionMismatchError, blackboard_identity
from nativepeer import run_native9, run_ours, start_native9, start_ours

DEADLINE_S = 20.0

# Prepended to every child's snippet (either implementation).
BOARD = r'''
import datetime, struct, time

def board(name="state", capacity=8, size=64, owner="child"):
    cfg = kickmsg.BlackboardConfig()
    cfg.capacity = capacity
    cfg.max_value_size = size
    return kickmsg.Blackboard.open_or_create(P["ns"], name, cfg, owner)

def outcome(o):
    return {"errno": o.errno, "data": o.data.hex(), "count": o.update_count, "stamp": o.updated_at_ns}
'''


def config(capacity: int = 8, size: int = 64) -> BlackboardConfig:
    return BlackboardConfig(capacity=capacity, max_value_size=size)


def until(condition, what: str) -> None:
    """Poll observable shared state until ``condition()`` holds (bounded)."""
    deadline = time.monotonic() + DEADLINE_S
    while not condition():
        if time.monotonic() > deadline:
            pytest.fail(f"timed out waiting for {what}")
        os.sched_yield()


def counted(k: int) -> bytes:
    """A value that names its own write number: a torn or stale read shows."""
    return struct.pack("<Q", k) * 3


# -- Layout facts -------------------------------------------------------------------------------


def test_identity_and_geometry_equal_the_wheels(prefix):
    """D.4/D.5: the header a native board stamps is the one ours computes."""
    run_native9(BOARD + 'board("robot/state", 4, 40); done(0)', ns=prefix)
    board = Blackboard.try_open(prefix, "robot/state")
    assert board is not None
    header = bytes(board.mapping.buffer[:64])
    magic, version, capacity, max_value, total, config_hash, identity = struct.unpack_from("<QIIQQQQ", header)
    assert (magic, version, capacity, max_value, total) == (bb.MAGIC, 2, 4, 40, 2240)
    assert config_hash == config(4, 40).config_hash()
    assert identity == blackboard_identity(prefix, "robot/state")
    assert board.name == Blackboard.shm_name(prefix, "robot/state") == f"/{prefix}_bb_robot.state"


def test_cells_alternate_and_publish_counts_writes(prefix):
    """D.4 as measured: write 1 in cell 1, write 2 in cell 0, publish 0 → 2 → 4,
    the last partial word zero-filled."""
    board = Blackboard.open_or_create(prefix, "cells", config(4, 40), "me")
    writer = board.declare("k")
    values = board.geometry.values_offset
    stride = board.geometry.stride
    publish = HARDWARE.load_relaxed_u64
    assert publish(board.entry_address(0) + bb.PUBLISH_OFFSET) == 0
    writer.write(b"ONE")
    assert bytes(board.mapping.buffer[values + stride + 16 : values + stride + 24]) == b"ONE" + bytes(5)
    writer.write(b"TWOTWO")
    assert bytes(board.mapping.buffer[values + 16 : values + 22]) == b"TWOTWO"
    assert publish(board.entry_address(0) + bb.PUBLISH_OFFSET) == 4


# -- Native writer, our reader; our writer, native reader (late readers) --------------------


def test_native_writer_our_late_reader(prefix):
    code = BOARD + r'''
b = board(owner="native-node")
r = b.observe("pose")
before = outcome(r.read())
w = b.declare("pose")
unwritten = outcome(r.read())
for k in (1, 2, 3):
    w.write(struct.pack("<Q", k) * 3)
ready()
wait_go()
done({"before": before, "unwritten": unwritten})
'''
    with start_native9(code, ns=prefix) as writer:
        writer.wait_ready()
        board = Blackboard.open_or_create(prefix, "state", config(), "ours")  # attaches after every write
        reader = board.observe("pose")
        got = reader.read()
        assert got and got.data == counted(3) and got.update_count == 3 and got.error == "Success"
        assert reader.owner_alive()
        [status] = board.snapshot()
        assert (status.key, status.owner_node, status.owner_pid, status.update_count, status.value_len) == (
            "pose", "native-node", writer.proc.pid, 3, 24)
        assert status.owner_alive
        assert board.keys() == ["pose"] and board.keys("x") == []
        assert board.read_all() == {"pose": counted(3)}
        writer.tell()
        got = writer.result()
    assert (got["before"]["errno"], got["unwritten"]["errno"]) == (errno.ENOENT, errno.ENOMSG)


def test_our_writer_native_late_reader(prefix):
    board = Blackboard.open_or_create(prefix, "state", config(), "our-node")
    reader = board.observe("pose")
    assert reader.read().errno == errno.ENOENT
    writer = board.declare("pose")
    assert reader.read().errno == errno.ENOMSG
    for k in (1, 2, 3):
        writer.write(counted(k))
    got = run_native9(BOARD + r'''
b = board()
r = b.observe("pose")
[s] = b.snapshot()
done({"read": outcome(r.read()), "alive": r.owner_alive(), "keys": b.keys("po"), "all": {k: v.hex() for k, v in b.read_all().items()},
      "status": [s.key, s.owner_node, s.owner_pid, s.update_count, s.value_len, s.owner_alive]})
''', ns=prefix)
    assert got["read"] == {"errno": 0, "data": counted(3).hex(), "count": 3, "stamp": reader.read().updated_at_ns}
    assert got["alive"] is True and got["keys"] == ["pose"] and got["all"] == {"pose": counted(3).hex()}
    assert got["status"] == ["pose", "our-node", os.getpid(), 3, 24, True]


def test_native_reads_what_ours_releases_and_redeclares(prefix):
    """D.12: a released key keeps its value; the native side takes it over
    (tenancy 1 → 2 → 3, value and count kept) and writes on."""
    board = Blackboard.open_or_create(prefix, "state", config(), "ours")
    writer = board.declare("k")
    writer.write(counted(1))
    writer.release()
    assert not writer.valid
    with pytest.raises(OSError) as refused:
        writer.write(b"x")
    assert refused.value.errno == errno.EBADF
    entry = board.entry_address(0)
    assert HARDWARE.load_relaxed_u64(entry + bb.OWNER_PID_OFFSET) == 0
    assert HARDWARE.load_relaxed_u64(entry + bb.TENANCY_OFFSET) == 2
    got = run_native9(BOARD + r'''
b = board()
before = outcome(b.observe("k").read())
w = b.declare("k", "native")
after = outcome(b.observe("k").read())
w.write(b"native")
done({"before": before, "after": after, "now": outcome(b.observe("k").read())})
''', ns=prefix)
    assert got["before"]["data"] == got["after"]["data"] == counted(1).hex()
    assert got["now"]["count"] == 2 and bytes.fromhex(got["now"]["data"]) == b"native"
    # declare 3; the native writer's destructor released it at exit: 4, owner 0, value kept
    assert HARDWARE.load_relaxed_u64(entry + bb.TENANCY_OFFSET) == 4
    assert HARDWARE.load_relaxed_u64(entry + bb.OWNER_PID_OFFSET) == 0
    assert board.observe("k").read().data == b"native"


def test_dropping_our_writer_releases_its_key(prefix):
    """As 0.9.2's destructor: the key stays with its value, owned by nobody."""
    board = Blackboard.open_or_create(prefix, "state", config())
    board.declare("k").write(b"kept")
    [status] = board.snapshot()
    assert (status.owner_pid, status.owner_alive, status.update_count) == (0, False, 1)
    assert board.observe("k").read().data == b"kept"


# -- wait across implementations -------------------------------------------------------------


def waiters(board: Blackboard) -> int:
    return HARDWARE.load_relaxed_u64(board.base + bb.WAITERS_OFFSET)


def test_native_waiter_woken_by_our_write(prefix):
    board = Blackboard.open_or_create(prefix, "state", config(), "ours")
    writer = board.declare("k")
    code = BOARD + r'''
b = board()
seen = b.change_seq
ready()
woken = b.wait(seen, datetime.timedelta(hours=1))  # only a wake ends it (the Peer timeout bounds the test)
done({"woken": woken, "seen": seen, "read": outcome(b.observe("k").read())})
'''
    with start_native9(code, ns=prefix) as child:
        child.wait_ready()
        until(lambda: waiters(board) == 1, "the native reader to park on change_seq")
        writer.write(b"wake up")
        got = child.result()
    assert got["woken"] is True and bytes.fromhex(got["read"]["data"]) == b"wake up"
    assert waiters(board) == 0


def test_our_waiter_woken_by_native_write(prefix):
    code = BOARD + r'''
b = board()
w = b.declare("k")
ready()
wait_go()
w.write(b"wake up")
done(0)
'''
    waiter_code = BOARD + r'''
b = board()
seen = b.change_seq
ready()
woken = b.wait(seen, datetime.timedelta(hours=1))  # only a wake ends it (the Peer timeout bounds the test)
done({"woken": woken, "read": outcome(b.observe("k").read())})
'''
    with start_native9(code, ns=prefix) as native:
        native.wait_ready()  # declared: our reader's change_seq comes after it
        with start_ours(waiter_code, ns=prefix) as ours:
            ours.wait_ready()
            board = Blackboard.open_or_create(prefix, "state", config())
            until(lambda: waiters(board) == 1, "our reader to park on change_seq")
            native.tell()
            native.result()
            got = ours.result()
    assert got["woken"] is True and bytes.fromhex(got["read"]["data"]) == b"wake up"


def test_wait_times_out_without_a_change(prefix):
    board = Blackboard.open_or_create(prefix, "state", config())
    seen = board.change_seq
    assert board.wait(seen, 0.01) is False
    assert board.wait(seen - 1, 0.0) is True
    assert waiters(board) == 0


# -- A writer killed mid-stream; the other implementation takes its key over -----------------

STREAM = BOARD + r'''
b = board()
w = b.declare("k", "streamer")
ready()
k = 0
deadline = time.monotonic() + 20
while time.monotonic() < deadline:
    k += 1
    w.write(struct.pack("<Q", k) * 3)
done("not killed")
'''


def kill_mid_stream(child, reader) -> None:
    child.wait_ready()
    until(lambda: reader.read().update_count >= 200, "200 writes")
    os.kill(child.proc.pid, signal.SIGKILL)
    child.proc.wait(timeout=10)


def test_native_writer_killed_ours_takes_over(prefix):
    board = Blackboard.open_or_create(prefix, "state", config(), "ours")
    reader = board.observe("k")
    with start_native9(STREAM, ns=prefix) as child:
        kill_mid_stream(child, reader)
    last = reader.read()
    assert last and last.data == counted(last.update_count)  # the last good value, intact
    assert not reader.owner_alive()
    writer = board.declare("k")  # the dead owner's key, taken over
    taken = reader.read()
    assert (taken.data, taken.update_count) == (last.data, last.update_count)
    [status] = board.snapshot()
    assert (status.owner_pid, status.owner_node, status.owner_alive) == (os.getpid(), "ours", True)
    writer.write(b"mine")
    assert reader.read().update_count == last.update_count + 1


def test_our_writer_killed_native_takes_over(prefix):
    board = Blackboard.open_or_create(prefix, "state", config(), "observer")
    reader = board.observe("k")
    with start_ours(STREAM, ns=prefix) as child:
        kill_mid_stream(child, reader)
    last = reader.read()
    assert last and last.data == counted(last.update_count)
    got = run_native9(BOARD + r'''
b = board()
r = b.observe("k")
before = outcome(r.read())
alive_before = r.owner_alive()
w = b.declare("k", "heir")
taken = outcome(r.read())
w.write(b"heir")
done({"before": before, "alive_before": alive_before, "taken": taken, "after": outcome(r.read())})
''', ns=prefix)
    assert got["alive_before"] is False
    assert got["before"]["data"] == got["taken"]["data"] == last.data.hex()
    assert got["before"]["count"] == got["taken"]["count"] == last.update_count
    assert got["after"]["count"] == last.update_count + 1
    assert reader.read().data == b"heir"


# -- A key declared twice by live owners -------------------------------------------------------


def test_a_live_native_owner_refuses_our_declare(prefix):
    with start_native9(BOARD + 'b = board()\nw = b.declare("k")\nready()\nwait_go()\ndone(0)', ns=prefix) as child:
        child.wait_ready()
        board = Blackboard.open_or_create(prefix, "state", config())
        with pytest.raises(RuntimeError, match=f"Blackboard key already owned by a live process: k .pid {child.proc.pid}"):
            board.declare("k")
        child.tell()
        child.result()


def test_a_live_owner_of_ours_refuses_the_natives_declare(prefix):
    board = Blackboard.open_or_create(prefix, "state", config())
    writer = board.declare("k")
    got = run_native9(BOARD + r'''
b = board()
try:
    b.declare("k")
    done("declared")
except RuntimeError as error:
    done(str(error))
''', ns=prefix)
    assert got == "Blackboard key already owned by a live process: k"
    with pytest.raises(RuntimeError, match="already owned by a live process: k"):
        board.declare("k")  # ours refuses itself too
    assert writer.valid


# -- A full board ------------------------------------------------------------------------------


# A child that ends without destructors: its keys are left owned by a dead pid.
DIE = '\nsys.stdout.flush()\nos._exit(0)\n'


def test_a_full_board_refuses_either_way(prefix):
    run_native9(BOARD + 'b = board(capacity=2)\nws = [b.declare("a"), b.declare("b")]\ndone(0)' + DIE, ns=prefix)
    # the native declarer has exited: its keys are stale, so a sweep under the lock frees them
    board = Blackboard.open_or_create(prefix, "state", config(capacity=2))
    writers = [board.declare("c"), board.declare("d")]
    assert board.keys() == ["c", "d"] and all(w.valid for w in writers)
    with pytest.raises(RuntimeError, match="Blackboard is at capacity"):
        board.declare("e")
    got = run_native9(BOARD + r'''
b = board(capacity=2)
try:
    b.declare("e")
    done("declared")
except RuntimeError as error:
    done(str(error))
''', ns=prefix)
    assert got == "Blackboard is at capacity"


def test_a_board_full_of_live_native_keys_refuses_ours(prefix):
    """The other way round: the keys of a live native process are no residue,
    so our declare's sweep frees nothing and the board stays full."""
    holder = BOARD + 'b = board(capacity=2)\nws = [b.declare("a"), b.declare("b")]\nready()\nwait_go()\ndone(0)'
    with start_native9(holder, ns=prefix) as child:
        child.wait_ready()
        board = Blackboard.open_or_create(prefix, "state", config(capacity=2))
        with pytest.raises(RuntimeError, match="Blackboard is at capacity"):
            board.declare("c")
        assert board.keys() == ["a", "b"] and board.sweep_stale() == 0
        child.tell()
        child.result()


def test_sweep_frees_dead_owners_keys_only(prefix):
    board = Blackboard.open_or_create(prefix, "state", config())
    mine = board.declare("mine")
    mine.write(b"1")
    run_native9(BOARD + 'b = board()\nw = b.declare("gone")\nw.write(b"x")\nr = b.declare("released")\nr.release()\ndone(0)' + DIE, ns=prefix)
    assert sorted(board.keys()) == ["gone", "mine", "released"]
    assert board.sweep_stale() == 1
    assert sorted(board.keys()) == ["mine", "released"]
    assert board.observe("gone").read().errno == errno.ENOENT
    assert run_native9(BOARD + 'done(board().sweep_stale())', ns=prefix) == 0


def test_keys_of_our_killed_writer_swept_by_native(prefix):
    """D.13 the other way: the wheel's sweep frees the key of a process of
    ours killed mid-stream (its value destroyed) and leaves our live key."""
    board = Blackboard.open_or_create(prefix, "state", config(), "ours")
    mine = board.declare("mine")
    mine.write(b"1")
    reader = board.observe("k")
    with start_ours(STREAM, ns=prefix) as child:
        kill_mid_stream(child, reader)
    got = run_native9(BOARD + 'b = board()\nswept = b.sweep_stale()\ndone({"swept": swept, "keys": sorted(b.keys())})', ns=prefix)
    assert got == {"swept": 1, "keys": ["mine"]}
    assert reader.read().errno == errno.ENOENT and board.observe("mine").read().data == b"1"


class PublishMovesBetweenLooks(Atomics):
    """Hardware atomics, except that the acquire loads of one entry's
    publish word see it move on by ``step`` at every look after the first
    of each read try (what a writer racing the reader does)."""

    def __init__(self, publish_address: int, step: int):
        self.publish_address = publish_address
        self.step = step
        self.looks = 0

    def load_acquire_u64(self, address: int) -> int:
        value = super().load_acquire_u64(address)
        if address != self.publish_address:
            return value
        self.looks += 1
        return value + self.step * (self.looks % 2 == 0)  # v1 as stored, v2 moved on


@pytest.mark.parametrize("step, outcome", [(2, 0), (3, errno.EAGAIN), (4, errno.EAGAIN)])
def test_the_read_retry_budget(prefix, step, outcome):
    """D.10: a copy overtaken by one completed write (v2 = v1 + 2: that write
    went into the other cell) stands; one that a second write may have
    rewritten (v2 − v1 ≥ 3) is retried, and after READ_RETRY_BUDGET tries in
    a row the read gives EAGAIN, having looked at the publish word twice a try."""
    board = Blackboard.open_or_create(prefix, "state", config())
    writer = board.declare("k")
    writer.write(counted(1))
    reader = Blackboard.open_or_create(prefix, "state", config())
    looks = PublishMovesBetweenLooks(reader.entry_address(0) + bb.PUBLISH_OFFSET, step)
    reader.atomics = looks
    got = reader.observe("k").read()
    assert got.errno == outcome
    if outcome == 0:
        assert (got.data, got.update_count, looks.looks) == (counted(1), 1, 2)
    else:
        assert (got.data, looks.looks) == (b"", 2 * 64)  # D.1: READ_RETRY_BUDGET 64


# -- Errors as 0.9.2 gives them ----------------------------------------------------------------


def test_errors_and_errnos(prefix):
    board = Blackboard.open_or_create(prefix, "state", config(size=8))
    with pytest.raises(ValueError, match="must not be empty"):
        board.declare("")
    with pytest.raises(ValueError, match="exceeds KEY_MAX"):
        board.observe("k" * 128)
    writer = board.declare("k" * 127)
    with pytest.raises(OSError) as too_long:
        writer.write(bytes(9))
    assert too_long.value.errno == errno.EMSGSIZE
    with pytest.raises(ValueError, match="capacity out of range"):
        Blackboard.open_or_create(prefix, "other", config(capacity=0))
    with pytest.raises(ValueError, match="max_value_size out of range"):
        Blackboard.open_or_create(prefix, "other", config(size=(1 << 20) + 1))
    for field, value in (("capacity", "8"), ("capacity", True), ("max_value_size", 64.0), ("identity", "1")):
        wrong = BlackboardConfig()
        setattr(wrong, field, value)
        with pytest.raises(TypeError, match=f"BlackboardConfig.{field} must be an int, got {value!r}"):
            Blackboard.open_or_create(prefix, "other", wrong)  # capacity True made a board that never initialised
    assert Blackboard.try_open(prefix, "other") is None
    with pytest.raises(RuntimeError, match="Blackboard config mismatch"):
        Blackboard.open_or_create(prefix, "state", config(size=16))
    with pytest.raises(RuntimeError, match="Blackboard identity mismatch"):
        Blackboard.open_or_create(prefix, "state", BlackboardConfig(8, 8, identity=12345))
    assert Blackboard.try_open(prefix, "absent") is None
    board.sweep_stale()
    # a takeover by a sweep makes the old writer's handle unrecoverable
    entry = board.entry_address(0)
    HARDWARE.fetch_add_relaxed_u64(entry + bb.TENANCY_OFFSET, 1)
    with pytest.raises(OSError) as moved:
        writer.write(b"1")
    assert moved.value.errno == errno.ENOTRECOVERABLE
    got = run_native9(r'''
cfg = kickmsg.BlackboardConfig()
cfg.max_value_size = 16
try:
    kickmsg.Blackboard.open_or_create(P["ns"], "state", cfg, "")
except RuntimeError as error:
    done(str(error))
''', ns=prefix)
    assert got.startswith("Blackboard config mismatch")


# -- Hostile bytes ------------------------------------------------------------------------------


def corrupt(board: Blackboard, offset: int, fmt: str, value: int) -> None:
    struct.pack_into(fmt, board.mapping.buffer, offset, value)


@pytest.mark.parametrize(
    "offset, fmt, value, error, message",
    [
        (bb.VERSION_OFFSET, "<I", 1, VersionMismatchError, "Blackboard version mismatch"),
        (bb.MAGIC_OFFSET, "<Q", 0xDEAD, CorruptRegionError, "bad magic 0x000000000000dead"),
        (bb.CAPACITY_OFFSET, "<I", 0, CorruptRegionError, "capacity 0 out of range"),
        (bb.CAPACITY_OFFSET, "<I", 0xFFFFFFFF, CorruptRegionError, "capacity 4294967295 out of range"),
        (bb.CAPACITY_OFFSET, "<I", 4096, CorruptRegionError, "value area does not fit"),
        (bb.MAX_VALUE_SIZE_OFFSET, "<Q", 1 << 63, CorruptRegionError, "max_value_size 9223372036854775808 out of range"),
        (bb.TOTAL_SIZE_OFFSET, "<Q", 1 << 40, CorruptRegionError, "total_size 1099511627776 does not fit"),
        (bb.TOTAL_SIZE_OFFSET, "<Q", 100, CorruptRegionError, "total_size 100 does not fit"),
    ],
)
def test_a_corrupt_header_is_a_clear_error(prefix, offset, fmt, value, error, message):
    board = Blackboard.open_or_create(prefix, "state", config())
    corrupt(board, offset, fmt, value)
    with pytest.raises(error, match=message):
        Blackboard.try_open(prefix, "state")


def test_a_segment_too_small_is_a_clear_error(prefix):
    with open(f"/dev/shm/{prefix}_bb_tiny", "wb") as file:
        file.write(bytes(100))
    with pytest.raises(CorruptRegionError, match="Blackboard segment too small"):
        Blackboard.try_open(prefix, "tiny")


def test_hostile_entries_and_cells_never_crash(prefix):
    board = Blackboard.open_or_create(prefix, "state", config(capacity=4, size=16))
    writer = board.declare("k")
    writer.write(b"good")
    entry = board.entry_address(0)
    start = bb.HEADER_SIZE
    # a value_len far beyond max_value_size is bounded by it
    cell = board.cell_offset(0, 1)
    corrupt(board, cell + bb.CELL_VALUE_LEN_OFFSET, "<I", 0xFFFFFFFF)
    assert len(board.observe("k").read().data) == 16
    # key and owner bytes that are not UTF-8, unterminated
    board.mapping.buffer[start + bb.KEY_OFFSET : start + bb.KEY_OFFSET + 128] = b"\xff" * 128
    board.mapping.buffer[start + bb.OWNER_NODE_OFFSET : start + bb.OWNER_NODE_OFFSET + 64] = b"\xfe" * 64
    corrupt(board, start + bb.KEY_HASH_OFFSET, "<Q", 7)
    assert board.keys() == ["\ufffd" * 128]
    assert board.read_all() == {}  # its hash no longer matches: dropped, not fatal
    corrupt(board, start + bb.KEY_HASH_OFFSET, "<Q", fnv1a_64(b"\xff" * 128))
    assert board.read_all() == {"\ufffd" * 128: b"good" + bytes(12)}  # the raw key still reads (value_len bounded)
    [status] = board.snapshot()
    assert status.owner_node == "\ufffd" * 64
    # an owner pid no process can have is dead: swept, never an OverflowError
    corrupt(board, start + bb.OWNER_PID_OFFSET, "<Q", 1 << 63)
    assert board.sweep_stale() == 1
    # unknown states and a lock held by a pid that cannot exist
    corrupt(board, entry + bb.STATE_OFFSET - board.base, "<I", 77)
    corrupt(board, bb.LOCK_TOKEN_OFFSET, "<Q", 0xFFFFFFFF_7FFFFFFF)
    assert board.keys() == []
    assert board.declare("fresh") is not None  # the dead holder's lock taken over
    assert HARDWARE.load_relaxed_u64(board.base + bb.LOCK_TOKEN_OFFSET) == 0


def test_native_refuses_our_corrupted_header(prefix):
    board = Blackboard.open_or_create(prefix, "state", config())
    corrupt(board, bb.VERSION_OFFSET, "<I", 3)
    got = run_native9(r'''
try:
    kickmsg.Blackboard.try_open(P["ns"], "state")
except RuntimeError as error:
    done(str(error))
''', ns=prefix)
    assert got.startswith("Blackboard version mismatch on " + board.name)


def test_a_forked_child_declares_as_itself_and_cannot_write_for_its_parent(prefix):
    """D.9: EPERM for a writer used in a fork child; the child's own declare
    and lock token carry its own pid."""
    board = Blackboard.open_or_create(prefix, "state", config())
    writer = board.declare("parent")
    pid = os.fork()
    if pid == 0:  # the child: exit status says what it saw, no destructor runs
        code = 0
        try:
            writer.write(b"x")
        except OSError as error:
            code = 1 if error.errno == errno.EPERM else 2
        try:
            held = board.declare("child")  # held past os._exit: never released
            held.write(b"from child")
        except Exception:
            code = 3
        os._exit(code)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 1
    statuses = {s.key: s for s in board.snapshot()}
    assert statuses["child"].owner_pid == pid and not statuses["child"].owner_alive
    assert statuses["parent"].owner_pid == os.getpid() and writer.valid
    assert board.observe("child").read().data == b"from child"


# -- The board lock's liveness token ----------------------------------------------------------


def test_lock_token_names_its_holder(prefix):
    """D.5/D.7: a live holder's token is alive; the same pid with another
    start time (a reused pid) or a vanished pid is dead."""
    board = Blackboard.open_or_create(prefix, "state", config())
    pid, start_time = board.owner()
    mine = bb.lock_token(pid, start_time)
    assert mine & 0xFFFFFFFF == pid and mine >> 32 == (fnv1a_64(start_time.to_bytes(8, "little")) >> 32 or 1)
    assert not bb.lock_holder_is_dead(mine)
    assert bb.lock_holder_is_dead(bb.lock_token(pid, start_time + 1))
    with start_ours("ready()\nwait_go()\ndone(0)", ns=prefix) as child:
        child.wait_ready()
        other = child.proc.pid
        child.tell()
        child.result()
    assert bb.lock_holder_is_dead(bb.lock_token(other, 1))


def test_a_lock_held_by_a_live_process_makes_the_board_busy(prefix):
    board = Blackboard.open_or_create(prefix, "state", config())
    kept = board.declare("kept")
    lock = board.base + bb.LOCK_TOKEN_OFFSET
    HARDWARE.store_release_u64(lock, bb.lock_token(*board.owner()))  # held by a live process (this one)
    with pytest.raises(RuntimeError, match="Blackboard is busy: could not take the board lock"):
        board.declare("k")
    assert board.snapshot() == [] and board.sweep_stale() == 0
    got = run_native9(BOARD + r'''
b = board()
try:
    b.declare("k")
    done("declared")
except RuntimeError as error:
    done(str(error))
''', ns=prefix)
    assert got == "Blackboard is busy: could not take the board lock"
    HARDWARE.store_release_u64(lock, 0)
    assert [s.key for s in board.snapshot()] == ["kept"] and kept.valid


def test_the_wheel_takes_over_a_lock_left_by_a_dead_process_of_ours(prefix):
    """D.7: a lock token of a dead holder is replaced directly, entries
    normalised (a Claiming entry left mid-declare becomes Free)."""
    board = Blackboard.open_or_create(prefix, "state", config(capacity=1))
    with start_ours("ready()\nwait_go()\ndone(0)", ns=prefix) as child:
        child.wait_ready()
        dead = child.proc.pid
        child.tell()
        child.result()
    HARDWARE.store_release_u64(board.base + bb.LOCK_TOKEN_OFFSET, bb.lock_token(dead, 12345))
    HARDWARE.store_release_u32(board.entry_address(0) + bb.STATE_OFFSET, bb.CLAIMING)
    got = run_native9(BOARD + 'b = board(capacity=1)\nw = b.declare("k")\nw.write(b"v")\ndone(b.keys())' + DIE, ns=prefix)
    assert got == ["k"]
    assert HARDWARE.load_relaxed_u64(board.base + bb.LOCK_TOKEN_OFFSET) == 0
    assert board.observe("k").read().data == b"v"


# -- Reads racing a writer: never torn, never backwards ------------------------------------------

READ_RACING = BOARD + r'''
b = board()
r = b.observe("k")
last, torn, backwards, again, good = 0, 0, 0, 0, 0
for _ in range(P["reads"]):
    o = r.read()
    if o.errno == 11:
        again += 1
        continue
    if o.errno:
        continue
    good += 1
    torn += o.data != struct.pack("<Q", o.update_count) * 3
    backwards += o.update_count < last
    last = o.update_count
done({"good": good, "torn": torn, "backwards": backwards, "again": again, "last": last})
'''


@pytest.mark.parametrize("writer_impl, reader_impl", [("native", "ours"), ("ours", "native")])
def test_reads_racing_a_writer_of_the_other_implementation(prefix, writer_impl, reader_impl):
    """D.9/D.10: a value is read whole (it names its own update count) or
    not at all, and counts never go back, while the other implementation
    writes as fast as it can."""
    start_writer = start_native9 if writer_impl == "native" else start_ours
    start_reader = start_ours if reader_impl == "ours" else start_native9
    board = Blackboard.open_or_create(prefix, "state", config())
    reader = board.observe("k")
    with start_writer(STREAM, ns=prefix) as writer:
        writer.wait_ready()
        until(lambda: reader.read().update_count >= 1, "the first write")
        with start_reader(READ_RACING, ns=prefix, reads=20_000) as racing:
            got = racing.result()
        writer.kill()
    assert got["torn"] == 0 and got["backwards"] == 0
    assert got["good"] > 0 and got["good"] + got["again"] <= 20_000


def test_native_kickmsg_bb_shows_our_board(prefix):
    """The wheel's own `kickmsg bb NAME --json` (kickmsg/cli.py of 0.9.2) on a board of ours."""
    board = Blackboard.open_or_create(prefix, "state", config(), "py-node")
    speed = board.declare("speed")
    speed.write(b"12")
    got = run_native9(r'''
import contextlib, io
from kickmsg import cli
out = io.StringIO()
with contextlib.redirect_stdout(out):
    status = cli.main(["bb", "state", "-n", P["ns"], "--json"])
done({"status": status, "json": json.loads(out.getvalue())})
''', ns=prefix)
    assert got["status"] == 0
    shown = got["json"]
    assert (shown["shm_name"], shown["capacity"], shown["max_value_size"], shown["status"]) == (board.name, 8, 64, "healthy")
    [key] = shown["keys"]
    assert (key["key"], key["value_len"], key["update_count"], key["owner_pid"], key["owner_node"], key["owner_alive"]) == (
        "speed", 2, 1, os.getpid(), "py-node", True)


def test_a_board_never_initialised_times_out_clearly(prefix):
    """D.6: magic still 0 after 200 × 10 ms, each way of opening with its text."""
    with open(f"/dev/shm/{prefix}_bb_state", "wb") as file:
        file.write(bytes(2240))
    with pytest.raises(RuntimeError, match=f"Blackboard region exists but was never initialized: /{prefix}_bb_state"):
        Blackboard.try_open(prefix, "state")
    with pytest.raises(RuntimeError, match=f"Timed out waiting for blackboard init: /{prefix}_bb_state"):
        Blackboard.open_or_create(prefix, "state", config(4, 40))


def test_our_process_ending_normally_releases_its_keys(prefix):
    """As the wheel's (note 8 of docs/WIRE9-NOTES.md): at interpreter exit the
    key is released, value kept, so the native side declares it without any
    sweep."""
    assert run_ours(BOARD + 'b = board()\nw = b.declare("k")\nw.write(b"left")\ndone(0)', ns=prefix) == 0
    got = run_native9(BOARD + r'''
b = board()
[s] = b.snapshot()
w = b.declare("k")
done({"owner": s.owner_pid, "read": outcome(b.observe("k").read())})
''', ns=prefix)
    assert got["owner"] == 0 and bytes.fromhex(got["read"]["data"]) == b"left"
