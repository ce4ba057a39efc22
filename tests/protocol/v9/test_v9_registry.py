"""The participant registry (WIRE9.md section C) against the native kickmsg
0.9.2 wheel, both ways, and against hostile bytes.

The wheel only ever runs in subprocesses (tests/nativepeer.py). Our rows are
written by ``NodeRows``, the functions a layout-9 Node calls (C.4), called
here directly. Every registry lives under the test's ``prefix`` namespace and
is removed whatever the outcome; waits are on a child's ``ready`` line.
"""
import os
import signal
import struct

import pytest

from kickmsg import Config, Kind, Node, Registry, Role
from kickmsg.atomics import HARDWARE
from kickmsg.protocol.common import CorruptRegionError
from kickmsg.protocol.v9 import registry as reg
from kickmsg.protocol.v9.layout import VersionMismatchError
from kickmsg.protocol.v9.registry import NodeRows, Participant
from nativepeer import run_native9, start_native9, start_ours

# Either implementation: every row as a comparable list, and the topic view.
VIEW = r'''
def rows(r):
    return sorted([p.shm_name, p.topic_name, p.node_name, int(p.role), int(p.kind), int(p.channel_type), p.pid]
                  for p in r.snapshot())

def topics(r):
    return [[t.shm_name, t.topic_name, int(t.kind), int(t.channel_type),
             sorted(p.node_name for p in t.producers), sorted(p.node_name for p in t.consumers),
             sorted(p.node_name for p in t.stall_producers), sorted(p.node_name for p in t.stall_consumers)]
            for t in r.list_topics()]
'''


def generation(registry: Registry, row: int) -> int:
    return HARDWARE.load_relaxed_u32(registry.row_address(row) + reg.GENERATION_OFFSET)


def as_row(p: Participant) -> list:
    return [p.shm_name, p.topic_name, p.node_name, int(p.role), int(p.kind), p.channel_type, p.pid]


# -- Layout and the generation protocol ------------------------------------------------------


def test_region_as_the_wheel_creates_it(prefix):
    """C.1: the header the native side stamps; ours opens it with its capacity."""
    run_native9('kickmsg.Registry.open_or_create(P["ns"], 3); done(0)', ns=prefix)
    registry = Registry.try_open(prefix)
    assert registry is not None and registry.capacity == 3 and registry.name == f"/{prefix}_registry"
    assert struct.unpack_from("<QII", registry.mapping.buffer) == (reg.MAGIC, 4, 3)
    assert registry.mapping.size == 64 + 512 * 3
    assert Registry.open_or_create(prefix, 4096).capacity == 3  # an opener keeps the creator's capacity
    assert Registry.try_open(prefix + "_absent") is None
    with pytest.raises(ValueError, match="Registry capacity must be > 0"):
        Registry.open_or_create(prefix + "_x", 0)


def test_register_upgrade_deregister_generations(prefix):
    """C.3/C.4 as measured on the wheel: generation 0 → 2 on register, the
    Both upgrade re-registers the same row (→ 4 → 6, role 3), deregister
    keeps role and kind (→ 8, state Free, pid 0)."""
    rows = NodeRows(prefix, "node")
    rows.register(f"/{prefix}_t", "t", Kind.Pubsub, Role.Publisher)
    registry = rows.registry
    assert registry is not None
    assert generation(registry, 0) == 2
    rows.register(f"/{prefix}_t", "/t", Kind.Pubsub, Role.Publisher)  # already held: nothing changes
    assert generation(registry, 0) == 2
    rows.register(f"/{prefix}_t", "t", Kind.Pubsub, Role.Subscriber)
    assert generation(registry, 0) == 6
    [p] = registry.snapshot()
    assert (p.role, p.kind, p.topic_name, p.node_name, p.pid) == (Role.Both, Kind.Pubsub, "/t", "node", os.getpid())
    rows.deregister_all()
    assert registry.snapshot() == []
    address = registry.row_address(0)
    assert generation(registry, 0) == 8
    assert HARDWARE.load_relaxed_u32(address + reg.STATE_OFFSET) == reg.FREE
    assert HARDWARE.load_relaxed_u32(address + reg.ROLE_OFFSET) == Role.Both
    assert HARDWARE.load_relaxed_u64(address + reg.PID_OFFSET) == 0


def test_the_wheel_upgrades_to_both_the_same_way(prefix):
    got = run_native9(r'''
n = kickmsg.Node("nat", P["ns"])
pub = n.advertise("t")
sub = n.subscribe("t")
import struct
data = open("/dev/shm/" + P["ns"] + "_registry", "rb").read(64 + 512)
done(struct.unpack_from("<IIIII", data, 64))
''', ns=prefix)
    assert got == [reg.ACTIVE, 1, Role.Both, Kind.Pubsub, 6]


# -- Our rows seen by the wheel, its rows seen by ours ----------------------------------------


def test_our_rows_seen_by_native_list_topics(prefix):
    rows = NodeRows(prefix, "py-node")
    rows.register(f"/{prefix}_robot.arm", "robot/arm", Kind.Pubsub, Role.Publisher)
    rows.register(f"/{prefix}_broadcast_all", "/all", Kind.Broadcast, Role.Both)
    rows.register(f"/{prefix}_py-node_mbx_in", "/py-node/in", Kind.Mailbox, Role.Subscriber)
    rows.register(f"/{prefix}_bb_state", "/state", Kind.Blackboard, Role.Both)
    got = run_native9(VIEW + 'r = kickmsg.Registry.try_open(P["ns"])\ndone({"rows": rows(r), "topics": topics(r)})', ns=prefix)
    me = os.getpid()
    assert got["rows"] == sorted([
        [f"/{prefix}_robot.arm", "/robot/arm", "py-node", 1, 1, 1, me],
        [f"/{prefix}_broadcast_all", "/all", "py-node", 3, 2, 2, me],
        [f"/{prefix}_py-node_mbx_in", "/py-node/in", "py-node", 2, 3, 1, me],
        [f"/{prefix}_bb_state", "/state", "py-node", 3, 4, 0, me],
    ])
    assert [t[0] for t in got["topics"]] == sorted(t[0] for t in got["rows"])
    arm = next(t for t in got["topics"] if t[1] == "/robot/arm")
    assert arm[4:] == [["py-node"], [], [], []]
    rows.deregister_all()
    assert run_native9(VIEW + 'done(rows(kickmsg.Registry.try_open(P["ns"])))', ns=prefix) == []


def test_native_node_rows_seen_by_ours(prefix):
    code = r'''
n = kickmsg.Node("nat-node", P["ns"])
pub = n.advertise("robot/arm")
sub = n.subscribe("robot/arm")
other = n.subscribe_or_create("cmd", kickmsg.Config())
bc = n.join_broadcast("all")
mbx = n.create_mailbox("in")
board = n.blackboard("state", kickmsg.BlackboardConfig())
ready()
wait_go()
done(0)
'''
    with start_native9(code, ns=prefix) as child:
        child.wait_ready()
        registry = Registry.try_open(prefix)
        assert registry is not None
        pid = child.proc.pid
        assert sorted(as_row(p) for p in registry.snapshot()) == sorted([
            [f"/{prefix}_robot.arm", "/robot/arm", "nat-node", 3, 1, 1, pid],
            [f"/{prefix}_cmd", "/cmd", "nat-node", 2, 1, 1, pid],
            [f"/{prefix}_broadcast_all", "/all", "nat-node", 3, 2, 2, pid],
            [f"/{prefix}_nat-node_mbx_in", "/nat-node/in", "nat-node", 2, 3, 1, pid],
            [f"/{prefix}_bb_state", "/state", "nat-node", 3, 4, 0, pid],
        ])
        topics = {t.topic_name: t for t in registry.list_topics()}
        assert [t.shm_name for t in registry.list_topics()] == sorted(t.shm_name for t in topics.values())
        arm = topics["/robot/arm"]
        assert [p.node_name for p in arm.producers] == [p.node_name for p in arm.consumers] == ["nat-node"]
        assert topics["/cmd"].producers == [] and arm.stall_producers == []
        assert registry.sweep_stale() == 0  # live rows stay
        child.tell()
        child.result()
    assert Registry.try_open(prefix).snapshot() == []  # the native Node deregistered on exit


# -- Stale rows of killed processes, swept by either --------------------------------------------

HOLD_ROWS = r'''
from kickmsg.protocol.v9.registry import NodeRows, Kind, Role
rows = NodeRows(P["ns"], "doomed")
rows.register("/" + P["ns"] + "_t", "t", Kind.Pubsub, Role.Publisher)
rows.register("/" + P["ns"] + "_u", "u", Kind.Pubsub, Role.Subscriber)
ready()
wait_go()
'''


def test_killed_native_rows_stall_and_ours_sweeps_them(prefix):
    code = 'n = kickmsg.Node("doomed", P["ns"])\npub = n.advertise("t")\nsub = n.subscribe_or_create("u", kickmsg.Config())\nready()\nwait_go()\n'
    with start_native9(code, ns=prefix) as child:
        child.wait_ready()
        os.kill(child.proc.pid, signal.SIGKILL)
        child.proc.wait(timeout=10)
    registry = Registry.try_open(prefix)
    assert registry is not None
    topics = {t.topic_name: t for t in registry.list_topics()}
    assert [p.node_name for p in topics["/t"].stall_producers] == ["doomed"] and topics["/t"].producers == []
    assert [p.node_name for p in topics["/u"].stall_consumers] == ["doomed"]
    assert registry.sweep_stale() == 2
    assert registry.snapshot() == [] and registry.sweep_stale() == 0


def test_killed_rows_of_ours_swept_by_native(prefix):
    with start_ours(HOLD_ROWS, ns=prefix) as child:
        child.wait_ready()
        os.kill(child.proc.pid, signal.SIGKILL)
        child.proc.wait(timeout=10)
    got = run_native9(VIEW + r'''
r = kickmsg.Registry.try_open(P["ns"])
before = topics(r)
swept = r.sweep_stale()
done({"before": before, "swept": swept, "after": rows(r)})
''', ns=prefix)
    assert [t[6:] for t in got["before"]] == [[["doomed"], []], [[], ["doomed"]]]
    assert got["swept"] == 2 and got["after"] == []


# -- A full registry, as 0.9.2 handles it --------------------------------------------------------


def test_a_full_registry_warns_once_and_sweeps_before_giving_up(prefix, capfd):
    Registry.open_or_create(prefix, capacity=2)
    rows = NodeRows(prefix, "py")
    for topic in ("a", "b", "c", "d"):
        rows.register(f"/{prefix}_{topic}", topic, Kind.Pubsub, Role.Publisher)
    err = capfd.readouterr().err
    assert err.count("participant registry") == 1 and "is full (2 rows)" in err
    assert sorted(rows.rows) == [f"/{prefix}_a", f"/{prefix}_b"]
    # the upgrade re-registers into the row it gave back
    rows.register(f"/{prefix}_a", "a", Kind.Pubsub, Role.Subscriber)
    assert rows.rows[f"/{prefix}_a"][1] == Role.Both
    rows.deregister_all()
    # a dead process's rows are swept to make room (C.3: full → sweep → retry)
    with start_ours(HOLD_ROWS, ns=prefix) as child:
        child.wait_ready()
        os.kill(child.proc.pid, signal.SIGKILL)
        child.proc.wait(timeout=10)
    registry = Registry.try_open(prefix)
    assert registry is not None and len(registry.snapshot()) == 2
    assert registry.register(1, Role.Publisher, Kind.Pubsub, "/x", "/x", "py") is not None
    assert [p.node_name for p in registry.snapshot()] == ["py"]


def test_native_node_carries_on_when_ours_filled_the_registry(prefix):
    Registry.open_or_create(prefix, capacity=1)
    rows = NodeRows(prefix, "py")
    rows.register(f"/{prefix}_a", "a", Kind.Pubsub, Role.Publisher)
    got = run_native9(VIEW + r'''
n = kickmsg.Node("nat", P["ns"])
pub = n.advertise("b")
done(rows(kickmsg.Registry.try_open(P["ns"])))
''', ns=prefix)
    assert [row[2] for row in got] == ["py"]
    rows.deregister_all()


def test_our_node_carries_on_when_a_native_node_filled_the_registry(prefix, capfd):
    """The other way round: a native Node holds the only row; our Node's
    advertise finds nothing to sweep, warns once and its channel works."""
    Registry.open_or_create(prefix, capacity=1)
    code = 'n = kickmsg.Node("nat", P["ns"])\npub = n.advertise("a")\nready()\nwait_go()\ndone(0)'
    with start_native9(code, ns=prefix) as child:
        child.wait_ready()
        node = Node("py", namespace=prefix, layout=9)
        pub = node.advertise("b", Config(max_subscribers=2, sub_ring_capacity=8, pool_size=16))
        sub = node.subscribe("b")  # the Both upgrade finds no row either: no second warning
        pub.send(b"still")
        assert sub.try_receive() == b"still"
        err = capfd.readouterr().err
        assert err.count("\n") == 1 and f"participant registry /{prefix}_registry is full (1 rows); node 'py'" in err
        assert [p.node_name for p in Registry.try_open(prefix).snapshot()] == ["nat"]
        child.tell()
        child.result()
        del pub, sub, node


# -- Hostile bytes ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    "offset, fmt, value, error, message",
    [
        (reg.VERSION_OFFSET, "<I", 3, VersionMismatchError, "Registry version mismatch"),
        (reg.MAGIC_OFFSET, "<Q", 0xBAD, CorruptRegionError, "bad magic 0x0000000000000bad"),
        (reg.CAPACITY_OFFSET, "<I", 0, CorruptRegionError, r"capacity exceeds segment .*capacity 0"),
        (reg.CAPACITY_OFFSET, "<I", 3, CorruptRegionError, r"capacity exceeds segment .*capacity 3, 1088 bytes"),
        (reg.CAPACITY_OFFSET, "<I", 0xFFFFFFFF, CorruptRegionError, "capacity 4294967295"),
    ],
)
def test_a_corrupt_header_is_a_clear_error(prefix, offset, fmt, value, error, message):
    registry = Registry.open_or_create(prefix, capacity=2)
    struct.pack_into(fmt, registry.mapping.buffer, offset, value)
    with pytest.raises(error, match=message):
        Registry.try_open(prefix)


def test_a_segment_too_small_is_a_clear_error(prefix):
    with open(f"/dev/shm/{prefix}_registry", "wb") as file:
        file.write(bytes(10))
    with pytest.raises(CorruptRegionError, match="10 bytes, smaller than its 64-byte header"):
        Registry.try_open(prefix)


def test_hostile_rows_never_crash(prefix):
    registry = Registry.open_or_create(prefix, capacity=4)
    for _ in range(4):
        registry.register(1, Role.Publisher, Kind.Pubsub, "/s", "/t", "n")
    buffer = registry.mapping.buffer
    row = [reg.HEADER_SIZE + reg.ROW_SIZE * i for i in range(4)]
    # 0: unknown role and kind, names without NUL and not UTF-8
    struct.pack_into("<II", buffer, row[0] + reg.ROLE_OFFSET, 99, 77)
    buffer[row[0] + reg.SHM_NAME_OFFSET : row[0] + reg.SHM_NAME_OFFSET + 128] = b"\xff" * 128
    buffer[row[0] + reg.NODE_NAME_OFFSET : row[0] + reg.NODE_NAME_OFFSET + 64] = b"\xfe" * 64
    # 1: odd generation (being written): skipped by snapshot and sweep
    struct.pack_into("<I", buffer, row[1] + reg.GENERATION_OFFSET, 3)
    # 2: a pid no process can have: a stall, swept, never an OverflowError
    struct.pack_into("<Q", buffer, row[2] + reg.PID_OFFSET, 1 << 63)
    # 3: an unknown state
    struct.pack_into("<I", buffer, row[3] + reg.STATE_OFFSET, 9)
    snapshot = registry.snapshot()
    assert len(snapshot) == 2
    odd = next(p for p in snapshot if p.role == 99)
    assert (odd.kind, odd.shm_name, odd.node_name) == (77, "\ufffd" * 128, "\ufffd" * 64)
    [t] = [t for t in registry.list_topics() if t.shm_name == "/s"]
    assert [p.pid for p in t.stall_producers] == [1 << 63]
    assert registry.list_topics()[0].producers == []  # role 99 is neither producer nor consumer
    assert registry.sweep_stale() == 1
    with pytest.raises(IndexError, match="registry row 4 out of range"):
        registry.deregister(4)
    got = run_native9(VIEW + 'done(len(kickmsg.Registry.try_open(P["ns"]).snapshot()))', ns=prefix)
    assert got == 1  # the wheel reads the same hostile rows


def test_native_refuses_a_registry_of_another_version(prefix):
    registry = Registry.open_or_create(prefix, capacity=2)
    struct.pack_into("<I", registry.mapping.buffer, reg.VERSION_OFFSET, 5)
    got = run_native9(r'''
try:
    kickmsg.Registry.try_open(P["ns"])
except RuntimeError as error:
    done(str(error))
''', ns=prefix)
    assert got.startswith(f"Registry version mismatch on /{prefix}_registry")


def test_a_registry_failure_latches_registration_off(prefix, capfd):
    """C.4: one stderr line, then no more attempts for that Node."""
    registry = Registry.open_or_create(prefix, capacity=2)
    struct.pack_into("<I", registry.mapping.buffer, reg.VERSION_OFFSET, 7)
    rows = NodeRows(prefix, "py")
    rows.register(f"/{prefix}_a", "a", Kind.Pubsub, Role.Publisher)
    rows.register(f"/{prefix}_b", "b", Kind.Pubsub, Role.Publisher)
    err = capfd.readouterr().err
    assert err.count("\n") == 1 and "participant registry disabled for node 'py'" in err and "version 7" in err
    assert rows.disabled and rows.rows == {}
    rows.deregister_all()  # nothing to give back


# The wheel's own command line (kickmsg/cli.py of 0.9.2), its stdout as JSON.
NATIVE_CLI = r'''
import contextlib, io
from kickmsg import cli
out = io.StringIO()
with contextlib.redirect_stdout(out):
    status = cli.main(P["argv"])
done({"status": status, "json": json.loads(out.getvalue())})
'''


def test_native_kickmsg_list_shows_our_processes(prefix):
    rows = NodeRows(prefix, "py-node")
    rows.register(f"/{prefix}_robot.arm", "robot/arm", Kind.Pubsub, Role.Publisher)
    rows.register(f"/{prefix}_py-node_mbx_in", "/py-node/in", Kind.Mailbox, Role.Subscriber)
    got = run_native9(NATIVE_CLI, argv=["list", "-n", prefix, "--json"])
    assert got["status"] == 0
    listed = {t["topic_name"]: t for t in got["json"]}
    assert sorted(listed) == ["/py-node/in", "/robot/arm"]
    [producer] = listed["/robot/arm"]["producers"]
    assert (producer["node_name"], producer["pid"], producer["role"]) == ("py-node", os.getpid(), "publisher")
    assert [c["node_name"] for c in listed["/py-node/in"]["consumers"]] == ["py-node"]
    assert listed["/py-node/in"]["kind"] == "mailbox"
    rows.deregister_all()


def test_a_registry_never_initialised_times_out_clearly(prefix):
    """C.1: magic still 0 after 200 × 10 ms (a creator that died mid-create)."""
    with open(f"/dev/shm/{prefix}_registry", "wb") as file:
        file.write(bytes(64 + 512))
    with pytest.raises(RuntimeError, match=f"Timed out waiting for registry init: /{prefix}_registry"):
        Registry.open_or_create(prefix)
