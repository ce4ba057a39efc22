"""kickmsg.ops.diagnostics: a program gets every figure of ``kickmsg
list/info/stats/watch`` without the CLI, and the CLI's --json is exactly
those dataclasses. Expected values come from what the test did."""
import json
import os
import signal
import subprocess
import sys
import threading
import time

import pytest

from kickmsg import (
    Blackboard,
    BlackboardConfig,
    ChannelType,
    Config,
    Publisher,
    Registry,
    SharedRegion,
    Subscriber,
    unlink_shm,
)
from kickmsg import owners
from kickmsg.ops import diagnostics
from kickmsg.protocol.v9.registry import Kind, NodeRows, Role
from test_cli import assert_one_line_error, cli, cli_json, poke

pytestmark = pytest.mark.timeout(120)

SMALL = Config(max_subscribers=3, sub_ring_capacity=8, pool_size=16, max_payload_size=64)


def make(name: str) -> SharedRegion:
    return SharedRegion.create(name, ChannelType.PubSub, SMALL, "diag-test")


def test_stats_counts_what_was_sent_and_read(shm_name, layout):
    region = make(shm_name)
    reader = Subscriber(region)
    publisher = Publisher(region, name="writer")
    for i in range(5):
        publisher.send(b"m%d" % i)
    assert reader.try_receive() == b"m0"
    time.sleep(0.15)  # past the subscriber's and the publisher's check-in interval
    assert reader.try_receive() == b"m1"
    publisher.send(b"m5")

    found = diagnostics.stats(shm_name)
    assert (found.name, found.pool_size, found.live_rings) == (shm_name, 16, 1)
    ring = found.rings[0]
    assert (ring.ring, ring.state, ring.write_pos, ring.owner_pid, ring.owner_alive) == (0, "Live", 6, os.getpid(), True)
    if layout == 4:  # from the subscriber's record
        assert (ring.read_pos, ring.pending, ring.lost, ring.dropped) == (2, 4, 0, None)
    else:  # the ring's own counters; the read position is the subscriber's alone
        assert (ring.read_pos, ring.pending, ring.lost, ring.dropped) == (None, None, 0, 0)
    assert found.rings[1:] == [] and found.idle_rings == 2  # Free and never written: counted, not listed
    every = diagnostics.stats(shm_name, every_ring=True)
    assert [(r.ring, r.state, r.write_pos) for r in every.rings[1:]] == [(1, "Free", 0), (2, "Free", 0)]
    assert every.idle_rings == 0
    assert (found.pool_free, ring.held) == (16 - 6, 6)  # a Live ring keeps its last 8 messages, read or not
    [writer] = found.publishers
    assert (writer.pid, writer.node_name, writer.alive, writer.sent, writer.dropped) == (os.getpid(), "writer", True, 5, 0)
    assert cli_json("stats", shm_name) == diagnostics.to_json(found)
    reader.close()
    del publisher


def test_info_health_and_list_match_the_cli(shm_name, layout):
    region = make(shm_name)
    found = diagnostics.info(shm_name)
    assert (found.name, found.version, found.max_subs, found.pool_size, found.creator_name, found.creator_pid) == (
        shm_name, layout, 3, 16, "diag-test", os.getpid())
    assert 0 <= found.age_s < 600  # created_at_ns read with the layout's clock
    from_cli = cli_json("info", shm_name)
    assert {k: v for k, v in from_cli.items() if k != "age_s"} == {
        k: v for k, v in diagnostics.to_json(found).items() if k != "age_s"}

    health = diagnostics.health(shm_name)
    assert (health.status, health.stall_publishers, sum(health.problems.values())) == ("healthy", 0, 0)
    assert health.verdict == "clean: 16 of 16 slots free, 0 live rings"

    [summary] = diagnostics.list_regions(shm_name)
    assert (summary.type, summary.version, summary.subs_live, summary.pubs_live, summary.pool_free, summary.health) == (
        "PubSub", layout, 0, 0, 16, health.verdict)
    assert cli_json("list", "--prefix", shm_name[1:]) == diagnostics.to_json([summary])
    del region


def test_errors_name_the_region(shm_name):
    with pytest.raises(diagnostics.RegionError, match=f"no such region: {shm_name}"):
        diagnostics.stats(shm_name)
    with open(f"/dev/shm{shm_name}", "wb") as file:
        file.write(b"garbage!" * 64)
    with pytest.raises(diagnostics.RegionError, match=f"not a Kickmsg region: {shm_name}"):
        diagnostics.health(shm_name)
    with pytest.raises(ValueError, match="interval"):
        next(diagnostics.watch(shm_name, 0))


def test_watch_follows_a_re_created_region_and_ends_when_it_is_removed(shm_name, layout):
    """Re-created under the watch (another geometry): the next snapshot is
    of the new region, its rates afresh; removed: RegionError naming it,
    rather than figures of a region nobody can reach any more. The command
    says so in one line, exit 2."""
    make(shm_name)
    watching = diagnostics.watch(shm_name, 0.01)
    assert next(watching).pool_size == 16
    unlink_shm(shm_name)
    SharedRegion.create(shm_name, ChannelType.PubSub, Config(max_subscribers=3, sub_ring_capacity=8, pool_size=32,
                                                             max_payload_size=64), "diag-test")
    again = next(watching)
    assert (again.pool_size, again.rings, again.idle_rings) == (32, [], 3)
    unlink_shm(shm_name)
    with pytest.raises(diagnostics.RegionError, match=f"^{shm_name} was removed$"):
        next(watching)

    make(shm_name)
    command = subprocess.Popen([sys.executable, "-m", "kickmsg", "watch", shm_name, "--interval", "0.05", "--json"],
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert json.loads(command.stdout.readline())["pool_size"] == 16  # it watches
        unlink_shm(shm_name)
        _, err = command.communicate(timeout=30)
    finally:
        command.kill()
    assert command.returncode == 2 and err == f"kickmsg watch: error: {shm_name} was removed\n"


def test_watch_yields_rates_until_stopped(shm_name, layout):
    region = make(shm_name)
    reader = Subscriber(region)
    stop_publishing, stop_watching = threading.Event(), threading.Event()

    def publish() -> None:
        publisher = Publisher(region)
        while not stop_publishing.is_set():
            publisher.send(b"tick")
            time.sleep(0.002)

    thread = threading.Thread(target=publish, daemon=True)
    thread.start()
    snapshots = []
    try:
        for snapshot in diagnostics.watch(shm_name, 0.2, stop_watching):
            snapshots.append(snapshot)
            if len(snapshots) == 3:
                stop_watching.set()
    finally:
        stop_publishing.set()
        thread.join(10)
    assert len(snapshots) == 3  # the generator ended by itself once stopped
    first, *later = snapshots
    assert first.rings[0].msgs_per_s is None
    for before, after in zip(snapshots, later):
        moved = after.rings[0].write_pos - before.rings[0].write_pos
        assert moved > 0 and after.rings[0].msgs_per_s > 0
        assert [r.ring for r in after.rings] == [0] and after.idle_rings == 2
    assert all(len(s.publishers) == 1 and s.publishers[0].alive for s in later)
    reader.close()


BRIDGE_CHILD = """
import os, sys, time
from kickmsg import SharedRegion
from kickmsg import owners
region = SharedRegion.open(sys.argv[1])
entry = owners.BridgeEntry(region, "export", "host/key")
entry.update(region, owners.BridgeRecord(messages_in=7, messages_out=6, bytes_out=60, lost_locally=1, epochs=1, matched=1))
print("recorded", flush=True)
time.sleep(60)
"""


def test_a_bridge_record_is_seen_then_dead_and_its_file_goes_with_the_region(shm_name):
    """A process holding a bridge record (as ``kickmsg bridge`` does) shows
    in ``stats`` with its figures; killed, as dead; the record file is a
    sidecar of its own kind, removed with its region, an orphan otherwise."""
    make(shm_name)
    child = subprocess.Popen([sys.executable, "-c", BRIDGE_CHILD, shm_name], stdout=subprocess.PIPE)
    try:
        assert child.stdout.readline() == b"recorded\n"
        [found] = diagnostics.stats(shm_name).bridges
        assert (found.pid, found.alive, found.direction, found.key) == (child.pid, True, "export", "host/key")
        assert (found.messages_in, found.messages_out, found.bytes_out, found.lost_locally, found.matched) == (7, 6, 60, 1, True)
        assert cli_json("list", "--prefix", shm_name[1:])[0]["bridges_live"] == 1
    finally:
        child.send_signal(signal.SIGKILL)
        child.wait(timeout=10)
    [dead] = diagnostics.stats(shm_name).bridges
    assert (dead.pid, dead.alive, dead.messages_out) == (child.pid, False, 6)
    path = owners.bridges_path(shm_name)
    file_name = os.path.basename(path)
    assert owners.sidecar_kind(file_name) == "bridge" and owners.region_of_sidecar(file_name) == shm_name
    os.unlink("/dev/shm" + shm_name)  # the region goes without its sidecars (as rm of the file would)
    [orphan] = [row for row in cli_json("list", "--prefix", file_name, "--all")]
    assert orphan["type"] == "orphan sidecar" and orphan["problem"].startswith(f"bridge records of {shm_name}")
    assert "/" + file_name in cli_json("clean", "--prefix", shm_name[1:])["sidecars"]
    assert not os.path.exists(path)


def test_hostile_registries_and_boards_are_clear_errors_and_damaged_rows(prefix):
    """Bytes no writer stores: each a RegionError naming the value, a
    ``damaged`` row of list (``busy`` for a board whose lock a holder that
    never dies keeps), a one-line error of the CLI; a row's hostile text
    and unknown role are shown, escaped, never trusted."""
    Registry.open_or_create(f"{prefix}_cap", capacity=2)
    poke(f"/{prefix}_cap_registry", 12, "<I", 10**6)  # capacity far beyond the object
    board = Blackboard.open_or_create(prefix, "size", BlackboardConfig(capacity=2, max_value_size=40))
    poke(board.name, 16, "<Q", 10**9)  # max_value_size out of range
    busy = Blackboard.open_or_create(prefix, "busy", BlackboardConfig(capacity=2, max_value_size=40))
    busy.declare("k").release()
    poke(busy.name, 128, "<Q", 0xFFFFFFFF00000000)  # a lock token of pid 0: a holder never provably dead
    rows = NodeRows(f"{prefix}_odd", "n\x1b[31m")
    rows.register(f"/{prefix}_odd_x\x07", "\x1b]0;title\x07", Kind.Pubsub, Role.Publisher)
    odd = f"/{prefix}_odd_registry"
    poke(odd, 64 + 8, "<I", 77)  # a role neither side takes

    problems = {
        f"/{prefix}_cap_registry": "Registry capacity exceeds segment on", board.name: "max_value_size 1000000000 out of range",
        busy.name: "its lock stayed busy",
    }
    for name, phrase in problems.items():
        with pytest.raises(diagnostics.RegionError, match=phrase):
            diagnostics.registry(name) if name.endswith("_registry") else diagnostics.blackboard(name)
        shown = cli("info", name)
        if name == busy.name:  # not damaged: its keys cannot be read now
            assert_one_line_error(shown, "info", phrase)
        else:  # damaged: what parses, and the fault (exit status 1)
            assert shown.code == 1 and phrase in shown.text and "\x1b" not in shown.text, (shown.code, shown.text)
    listed = {row["name"]: row for row in cli_json("list", "--prefix", prefix)}
    assert {name: (listed[name]["type"], phrase in listed[name]["problem"]) for name, phrase in problems.items()} == {
        f"/{prefix}_cap_registry": ("damaged", True), board.name: ("damaged", True), busy.name: ("busy", True)}
    [topic] = diagnostics.registry(odd).topics
    assert (topic.topic, topic.producers, topic.consumers) == ("/\x1b]0;title\x07", [], [])
    assert listed[odd]["health"] == "1 participant, 0 stalled"
    text = cli("list", "--prefix", prefix)
    assert text.code == 0 and "\x1b" not in text.text and "/\\x1b]0;title\\x07" in text.text
    rows.deregister_all()
