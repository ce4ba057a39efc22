"""Publishers you can see: each Publisher of this package records itself in
``/dev/shm/<name>.kickmsg-publishers`` (kickmsg.owners) without touching the
region's bytes; tools show live ones, dead ones as "stall", and dead
records are reclaimed. Real publisher processes, killed for real."""
import os
import signal
import time

import pytest

from conftest import on_layout4
from kickmsg import ChannelType, Config, Node, Publisher, SharedRegion, unlink_shm
from kickmsg import owners
from kickmsg.ops import diagnostics
from nativepeer import start_native, start_ours
from test_cli import cli, cli_json

# These tests check layout 4's own: publisher records in sidecar files.
pytestmark = [pytest.mark.timeout(120), on_layout4]

SMALL = Config(max_subscribers=3, sub_ring_capacity=8, pool_size=16, max_payload_size=64)

# Sends P["count"] messages, then (past the 0.1 s check-in interval) one
# more, whose check-in records the first P["count"]; then waits to be told.
PUBLISHER = r"""
region = kickmsg.SharedRegion.open(P["name"])
publisher = kickmsg.Publisher(region, name=P["node"])
for _ in range(P["count"]):
    publisher.send(b"m")
time.sleep(0.15)
publisher.send(b"last")
ready()
wait_go()
del publisher
ready()
wait_go()
done("ok")
"""

NATIVE_PUBLISHER = r"""
region = kickmsg.SharedRegion.open(P["name"])
publisher = kickmsg.Publisher(region)
publisher.send(b"native")
ready()
wait_go()
done("ok")
"""


@pytest.fixture
def shm_name(shm_name):
    """A fresh region name; the region and its sidecars are removed after."""
    yield shm_name
    owners.unlink(shm_name)


def make(name: str) -> SharedRegion:
    return SharedRegion.create(name, ChannelType.PubSub, SMALL, "records-test")


def region_bytes(name: str) -> bytes:
    with open(f"/dev/shm{name}", "rb") as file:
        return file.read()


def test_a_publisher_process_is_seen_with_its_counts_and_goes_when_it_is_dropped(shm_name):
    make(shm_name)
    with start_ours("import time\n" + PUBLISHER, name=shm_name, node="imu-node", count=5) as child:
        child.wait_ready()
        [seen] = diagnostics.stats(shm_name).publishers
        assert (seen.pid, seen.node_name, seen.role, seen.alive) == (child.proc.pid, "imu-node", "publisher", True)
        assert (seen.sent, seen.dropped) == (5, 0)  # as of its last check-in, before the 6th message
        assert seen.pid_starttime == owners.process_start_time(child.proc.pid) > 0
        assert seen.started_at_ns <= seen.checked_in_at_ns <= time.time_ns()

        [row] = cli_json("list", "--prefix", shm_name[1:], "-o", "name,pubs,subs")
        assert row == {"name": shm_name, "pubs_live": 1, "pubs_stall": 0, "subs_live": 0, "subs_max": 3}
        text = cli("stats", shm_name).text.splitlines()
        assert text[-2].split() == ["PID", "NODE_NAME", "STATE", "SENT", "DROPPED"]
        assert text[-1].split() == [str(child.proc.pid), "imu-node", "live", "5", "0"]
        assert "+ unrecorded: native publishers cannot be seen" in text[-3]

        child.tell()  # drops its Publisher: the record goes
        child.wait_ready()
        assert diagnostics.stats(shm_name).publishers == []
        child.tell()
        child.result()


def test_a_nodes_publishers_carry_its_name(prefix):
    """Every publisher a Node makes (topic, joined topic, broadcast, another
    node's mailbox) records the node's name, as kickmsg stats shows it."""
    node, owner = Node("imu-driver", prefix=prefix), Node("planner", prefix=prefix)
    inbox = owner.create_mailbox("inbox", SMALL)
    made = {
        f"/{prefix}_imu": node.advertise("imu", SMALL),
        f"/{prefix}_odom": node.advertise_or_join("odom", SMALL),
        f"/{prefix}_broadcast_chat": node.join_broadcast("chat", SMALL),
        f"/{prefix}_planner_mbx_inbox": node.open_mailbox("planner", "inbox"),
    }
    for name in made:
        assert [p.node_name for p in diagnostics.stats(name).publishers] == ["imu-driver"], name
    assert cli("stats", f"/{prefix}_imu").text.splitlines()[-1].split()[1] == "imu-driver"
    inbox.close()


def test_recording_leaves_the_region_bytes_alone(shm_name):
    make(shm_name)
    before = region_bytes(shm_name)
    publisher = Publisher(SharedRegion.open(shm_name))
    assert region_bytes(shm_name) == before
    assert os.path.exists(owners.publishers_path(shm_name))
    assert [p.pid for p in diagnostics.stats(shm_name).publishers] == [os.getpid()]
    del publisher


def test_a_killed_publisher_shows_as_stall_and_its_record_is_reclaimed(shm_name):
    make(shm_name)
    with start_ours("import time\n" + PUBLISHER, name=shm_name, node="doomed", count=3) as child:
        child.wait_ready()
        pid = child.proc.pid
        os.kill(pid, signal.SIGKILL)
        child.proc.wait(timeout=10)
    [dead] = diagnostics.stats(shm_name).publishers
    assert (dead.pid, dead.alive, dead.sent) == (pid, False, 3)
    assert diagnostics.health(shm_name).stall_publishers == 1
    text = cli("stats", shm_name).text
    assert f"publisher {pid} died without leaving (stall)" in text
    assert cli_json("list", "--prefix", shm_name[1:], "-o", "pubs") == [{"pubs_live": 0, "pubs_stall": 1}]

    # A new publisher takes the dead one's record.
    publisher = Publisher(SharedRegion.open(shm_name), name="heir")
    assert [(p.pid, p.node_name, p.alive) for p in diagnostics.stats(shm_name).publishers] == [(os.getpid(), "heir", True)]
    del publisher

    # Or repair clears it.
    with start_ours("import time\n" + PUBLISHER, name=shm_name, node="doomed-again", count=1) as child:
        child.wait_ready()
        pid = child.proc.pid
        os.kill(pid, signal.SIGKILL)
        child.proc.wait(timeout=10)
    assert cli_json("repair", shm_name)["dead_publishers_reclaimed"] == [pid]
    assert diagnostics.stats(shm_name).publishers == []


def test_a_publisher_records_itself_anew_in_a_re_created_region(shm_name):
    make(shm_name)
    publisher = Publisher(SharedRegion.open(shm_name), name="follower")
    unlink_shm(shm_name)  # removes the records too
    make(shm_name)
    assert diagnostics.stats(shm_name).publishers == []
    for _ in range(3):
        publisher.send(b"x")
    time.sleep(0.15)
    publisher.send(b"x")  # its check-in follows the new region and records itself there
    [seen] = diagnostics.stats(shm_name).publishers
    assert (seen.node_name, seen.sent, publisher.rejoined) == ("follower", 3, 1)
    del publisher


def test_a_publisher_whose_region_is_removed_leaves_no_record_file_then_records_itself_when_it_is_back(shm_name):
    make(shm_name)
    publisher = Publisher(SharedRegion.open(shm_name), name="stayer")
    unlink_shm(shm_name)  # removes the records too
    time.sleep(0.15)
    publisher.send(b"x")  # its check-in finds the file gone, and the region with it
    assert not os.path.exists(owners.publishers_path(shm_name))
    make(shm_name)
    time.sleep(0.15)
    publisher.send(b"x")  # follows the region made again, and records itself there
    [seen] = diagnostics.stats(shm_name).publishers
    assert (seen.node_name, publisher.rejoined) == ("stayer", 1)
    del publisher


def test_native_publishers_are_unrecorded(shm_name):
    make(shm_name)
    with start_native(NATIVE_PUBLISHER, name=shm_name) as native:
        native.wait_ready()
        found = diagnostics.stats(shm_name)
        assert found.publishers == [] and found.unrecorded == "+ unrecorded: native publishers cannot be seen"
        native.tell()
        native.result()


def test_clean_removes_publisher_records_whose_region_is_gone(prefix):
    name = f"/{prefix}_gone"
    make(name)
    publisher = Publisher(SharedRegion.open(name))
    os.unlink(f"/dev/shm{name}")  # as a native unlink_shm would: the sidecars stay
    assert os.path.exists(owners.publishers_path(name))
    rows = cli_json("list", "--prefix", prefix, "--all", "-o", "name,type,problem")
    assert {"name": name + ".kickmsg-publishers", "type": "orphan sidecar",
            "problem": f"publisher records of {name}, which is gone (kickmsg clean removes it)"} in rows
    del publisher  # its record is cleared; the file stays
    assert name + ".kickmsg-publishers" in cli_json("clean", "--prefix", prefix)["sidecars"]
    assert not os.path.exists(owners.publishers_path(name))


FORKING_PUBLISHER = r"""
import os
import time
publisher = kickmsg.Publisher(kickmsg.SharedRegion.open(P["name"]), name="parent")
ready_read, ready_write = os.pipe()
go_read, go_write = os.pipe()
child = os.fork()
if child == 0:  # publish past a check-in, say so, drop the publisher when told, leave without cleanup handlers
    try:
        publisher.send(b"a")
        time.sleep(0.15)
        publisher.send(b"b")
        os.write(ready_write, b"r")
        os.read(go_read, 1)
        del publisher
        os.write(ready_write, b"d")
        os.read(go_read, 1)
    finally:
        os._exit(0)
os.read(ready_read, 1)
ready()
wait_go()
os.write(go_write, b"g")
os.read(ready_read, 1)
ready()
wait_go()
os.write(go_write, b"g")
os.waitpid(child, 0)
done("ok")
"""


def test_a_forked_child_that_publishes_records_itself_and_leaves_the_parents_record(shm_name):
    make(shm_name)
    with start_ours(FORKING_PUBLISHER, name=shm_name) as parent:
        parent.wait_ready()  # its forked child has sent past a check-in
        seen = sorted((p.pid == parent.proc.pid, p.node_name, p.alive, p.sent)
                      for p in diagnostics.stats(shm_name).publishers)
        assert seen == [(False, "parent", True, 1), (True, "parent", True, 0)]
        parent.tell()
        parent.wait_ready()  # the child dropped its publisher: its copy of the parent's record stays
        assert [(p.pid, p.alive) for p in diagnostics.stats(shm_name).publishers] == [(parent.proc.pid, True)]
        parent.tell()
        assert parent.result() == "ok"


def test_a_fifo_planted_as_the_records_file_does_not_hang_the_tools(shm_name):
    make(shm_name)
    os.mkfifo(owners.publishers_path(shm_name))
    os.mkfifo(owners.sidecar_path(shm_name))
    found = diagnostics.stats(shm_name, every_ring=True)
    assert found.publishers == [] and found.rings[0].owner_pid is None
