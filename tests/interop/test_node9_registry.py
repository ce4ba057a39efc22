"""A layout-9 Node's rows in the participant registry (WIRE9.md C.4) and
``Node.blackboard``, against the native kickmsg 0.9.2 wheel both ways.

The wheel only runs in subprocesses (tests/nativepeer.py). Everything lives
under the test's ``prefix`` namespace (registry and boards included) and is
removed whatever the outcome; waits are on a child's ``ready`` line.
"""
import gc
import os
import pathlib

import pytest

from kickmsg import Blackboard, BlackboardConfig, Config, Kind, Node, Registry
from nativepeer import run_native9, run_ours, start_native9

SMALL = {"max_subscribers": 2, "sub_ring_capacity": 4, "pool_size": 8, "max_payload_size": 64}

VIEW = r'''
def rows(r):
    return sorted([p.shm_name, p.topic_name, p.node_name, int(p.role), int(p.kind), int(p.channel_type), p.pid]
                  for p in r.snapshot())

def topics(r):
    return [[t.topic_name, sorted(p.node_name for p in t.producers), sorted(p.node_name for p in t.consumers)]
            for t in r.list_topics()]
'''


def small() -> Config:
    return Config(**SMALL)


def our_rows(namespace: str) -> list:
    registry = Registry.try_open(namespace)
    assert registry is not None
    return sorted([p.shm_name, p.topic_name, p.node_name, int(p.role), int(p.kind), p.channel_type, p.pid]
                  for p in registry.snapshot())


def test_our_node_rows_seen_by_native_registry(prefix):
    """C.4: every Node call registers its row as 0.9.2's Node does; the
    native Registry lists them; they go when the node and its handles go."""
    node = Node("py node", namespace=prefix, layout=9)
    handles = [
        node.advertise("robot/arm", small()),
        node.subscribe("robot/arm"),  # the Both upgrade
        node.subscribe_or_create("cmd", small()),
        node.join_broadcast("all", small()),
        node.create_mailbox("in box", small()),
        node.open_mailbox("py node", "in box"),  # the Both upgrade on a mailbox
        node.blackboard("/x/y", BlackboardConfig(capacity=4, max_value_size=40)),
    ]
    me = os.getpid()
    expected = sorted([
        [f"/{prefix}_robot.arm", "/robot/arm", "py_node", 3, 1, 1, me],
        [f"/{prefix}_cmd", "/cmd", "py_node", 2, 1, 1, me],
        [f"/{prefix}_broadcast_all", "/all", "py_node", 3, 2, 2, me],
        [f"/{prefix}_py_node_mbx_in_box", "/py_node/in box", "py_node", 3, 3, 1, me],
        [f"/{prefix}_bb_x.y", "/x/y", "py_node", 3, 4, 0, me],
    ])
    got = run_native9(VIEW + 'r = kickmsg.Registry.try_open(P["ns"])\ndone({"rows": rows(r), "topics": topics(r)})', ns=prefix)
    assert got["rows"] == expected == our_rows(prefix)
    assert ["/robot/arm", ["py_node"], ["py_node"]] in got["topics"]
    del node
    gc.collect()
    assert our_rows(prefix) == expected  # the handles keep their node, and its rows
    del handles
    gc.collect()
    assert run_native9(VIEW + 'done(rows(kickmsg.Registry.try_open(P["ns"])))', ns=prefix) == []


def test_native_and_our_nodes_on_one_topic_listed_alike(prefix):
    """A native publisher node and our subscriber node: both registries'
    list_topics show the native producer and our consumer."""
    code = r'''
n = kickmsg.Node("nat", P["ns"])
pub = n.advertise("t")
ready()
wait_go()
done(0)
'''
    with start_native9(code, ns=prefix) as child:
        child.wait_ready()
        sub = Node("py", namespace=prefix, layout=9).subscribe("t")
        [ours] = Registry.try_open(prefix).list_topics()
        assert ([p.node_name for p in ours.producers], [p.node_name for p in ours.consumers]) == (["nat"], ["py"])
        assert run_native9(VIEW + 'done(topics(kickmsg.Registry.try_open(P["ns"])))', ns=prefix) == [["/t", ["nat"], ["py"]]]
        child.tell()
        child.result()
        del sub


def test_a_process_of_ours_gives_its_rows_back_at_exit(prefix):
    """A child's Node, still referenced when the interpreter ends, deregisters."""
    run_ours(r'''
node = kickmsg.Node("leaver", namespace=P["ns"], layout=9)
pub = node.advertise("t")
done(0)
''', ns=prefix)
    assert our_rows(prefix) == []


def test_our_node_blackboard_read_natively(prefix):
    """Node.blackboard: the node's name is the key owner; the native side
    reads the value and sees the owner."""
    board = Node("writer", namespace=prefix, layout=9).blackboard("state")
    assert board.name == Blackboard.shm_name(prefix, "state")
    writer = board.declare("pose")
    writer.write(b"x=1")
    got = run_native9(r'''
b = kickmsg.Blackboard.try_open(P["ns"], "state")
[k] = b.snapshot()
done([k.key, k.owner_node, k.owner_alive, bytes(b.observe("pose").read().data).decode()])
''', ns=prefix)
    assert got == ["pose", "writer", True, "x=1"]


def test_a_native_node_blackboard_opened_by_ours(prefix):
    """Both Nodes register the same board; ours opens the native one."""
    code = r'''
b = kickmsg.Node("nat", P["ns"]).blackboard("state", kickmsg.BlackboardConfig())
b.declare("k").write(b"v")
ready()
wait_go()
done(0)
'''
    with start_native9(code, ns=prefix) as child:
        child.wait_ready()
        board = Node("py", namespace=prefix, layout=9).blackboard("state")
        assert bytes(board.observe("k").read().data) == b"v"
        [summary] = Registry.try_open(prefix).list_topics()
        assert (summary.kind, sorted(p.node_name for p in summary.consumers)) == (Kind.Blackboard, ["nat", "py"])
        child.tell()
        child.result()
        del board


def test_a_layout4_node_registers_nothing_and_has_no_blackboard(prefix):
    node = Node("old", namespace=prefix, layout=4)
    pub = node.advertise("t", small())
    assert Registry.try_open(prefix) is None
    with pytest.raises(RuntimeError, match="Node 'old' is on layout 4: a Blackboard needs a layout-9 node"):
        node.blackboard("state")
    assert not pathlib.Path(f"/dev/shm/{prefix}_bb_state").exists()
    del pub


def test_unlink_blackboard(prefix):
    node = Node("n", namespace=prefix, layout=9)
    node.blackboard("state")
    node.unlink_blackboard("state")
    assert Blackboard.try_open(prefix, "state") is None


def test_a_registry_failure_leaves_the_node_working(prefix, capfd):
    """C.4: a registry of another version latches registration off with one
    stderr line; the node's channels still work."""
    Registry.open_or_create(prefix, 2)
    path = pathlib.Path(f"/dev/shm/{prefix}_registry")
    data = bytearray(path.read_bytes())
    data[8:12] = (3).to_bytes(4, "little")
    path.write_bytes(bytes(data))
    node = Node("py", namespace=prefix, layout=9)
    pub = node.advertise("a", small())
    sub = node.subscribe("a")
    pub.send(b"still")
    assert sub.try_receive() == b"still"
    err = capfd.readouterr().err
    assert err.count("participant registry disabled for node 'py'") == 1 and "version 3" in err


def test_a_fork_child_dropping_its_copy_of_the_node_keeps_the_parents_rows(prefix):
    node = Node("parent", namespace=prefix, layout=9)
    pub = node.advertise("t", small())
    before = our_rows(prefix)
    pid = os.fork()
    if pid == 0:  # the child: its copies of the node and handle go, its finalizers run
        status = 1
        try:
            del node, pub
            gc.collect()
            status = 0
        finally:
            os._exit(status)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    assert our_rows(prefix) == before and len(before) == 1
    del pub


def test_native_kickmsg_list_shows_our_node(prefix):
    node = Node("py-node", namespace=prefix, layout=9)
    pub = node.advertise("robot/arm", small())
    got = run_native9(r'''
import contextlib, io
from kickmsg import cli
out = io.StringIO()
with contextlib.redirect_stdout(out):
    status = cli.main(P["argv"])
done({"status": status, "json": json.loads(out.getvalue())})
''', argv=["list", "-n", prefix, "--json"])
    assert got["status"] == 0
    [listed] = got["json"]
    assert listed["topic_name"] == "/robot/arm"
    assert [(p["node_name"], p["pid"], p["role"]) for p in listed["producers"]] == [("py-node", os.getpid(), "publisher")]
    del pub
