"""``kickmsg bridge``: channels across hosts over Zenoh.

Two bridges with different key prefixes stand for two hosts; they talk over
explicit tcp endpoints on 127.0.0.1 (free ports), multicast scouting off.
Bridges, publishers and subscribers are real processes; every wait is
bounded; the channels live under the test's ``prefix`` (removed afterwards).
No timing assertions: the accounting must be exact however the machine runs.
"""
import json
import os
import pathlib
import re
import select
import signal
import socket
import subprocess
import sys
import time

import pytest

from conftest import ROOT
from kickmsg import ChannelType, Config, Node, Publisher, SchemaInfo, SharedRegion, Subscriber, bridge, cli, typed
from kickmsg import description as describe
from kickmsg.bridge import forwarding, options as bridge_options
from kickmsg.cli import bridging
from kickmsg.atomics import Atomics
from kickmsg.ops import diagnostics
from kickmsg.protocol.v9 import receive as receive9, region as region9
from nativepeer import check_payload, make_payload, start_native, start_native9, start_ours
from test_exporter import exporter_for  # noqa: F401 (a fixture)

pytestmark = pytest.mark.timeout(180)

MESSAGES = 10_000
GEOMETRY = {"max_subscribers": 4, "sub_ring_capacity": 1024, "pool_size": 2048, "max_payload_size": 256}
WAIT_S = 60.0  # the longest any one wait may take before the test fails


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


class BridgeProcess:
    """``kickmsg bridge ARGS --json --stats-interval 0.2`` in a subprocess."""

    def __init__(self, *args: str, json_lines: bool = True):
        extra = ["--json", "--stats-interval", "0.2"] if json_lines else []
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "kickmsg", "bridge", *args, *extra],
            stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE, cwd=ROOT,
            env=dict(os.environ, PYTHONFAULTHANDLER="1"),  # SIGABRT prints where every thread is
        )
        self.buffer = b""

    def _fail(self, what: str) -> None:
        """Fail with what the bridge printed; one still running is aborted
        first, so that its stderr shows where each of its threads was."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGABRT)
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
        out, err = self.proc.communicate(timeout=10)
        pytest.fail(f"bridge {what}\n--- stdout ---\n{(self.buffer + out).decode()}\n--- stderr ---\n{err.decode()}")

    def next_figures(self, deadline: float) -> dict:
        """The next JSON figures line."""
        fd = self.proc.stdout.fileno()
        while b"\n" not in self.buffer:
            readable, _, _ = select.select([fd], [], [], max(0.0, deadline - time.monotonic()))
            if not readable:
                self._fail("printed no figures in time")
            chunk = os.read(fd, 65536)
            if not chunk:
                self._fail("exited")
            self.buffer += chunk
        line, self.buffer = self.buffer.split(b"\n", 1)
        return json.loads(line)

    def wait_for(self, what: str, predicate) -> list[dict]:
        """Figures lines until ``predicate(channels)`` holds; its channels."""
        deadline = time.monotonic() + WAIT_S
        while True:
            channels = self.next_figures(deadline)["channels"]
            if predicate(channels):
                return channels
            if time.monotonic() > deadline:
                self._fail(f"never showed {what}: {channels}")

    def stop(self, number: int = signal.SIGTERM) -> tuple[list[dict], str]:
        """Stop it with a signal; the final figures (or text) and stderr."""
        self.proc.send_signal(number)
        try:
            out, err = self.proc.communicate(timeout=WAIT_S)
        except subprocess.TimeoutExpired:
            out = None
        if out is None:
            self._fail("did not stop")
        assert self.proc.returncode == 0, err.decode()
        text = (self.buffer + out).decode()
        lines = [json.loads(line) for line in text.splitlines() if line.startswith("{")]
        finals = [line["channels"] for line in lines if line["final"]]
        return (finals[-1] if finals else []), (text if not lines else "") + err.decode()

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.communicate(timeout=10)


@pytest.fixture
def bridges():
    """Start bridges with ``bridges(*args)``; whatever still runs is killed."""
    started = []

    def start(*args: str, json_lines: bool = True) -> BridgeProcess:
        process = BridgeProcess(*args, json_lines=json_lines)
        started.append(process)
        return process

    yield start
    for process in started:
        process.kill()


def two_hosts(bridges, exported: str, imported: str, *, b_listens: bool = False, json_lines: bool = True, b_extra=()):
    """Host A exports ``exported``; host B imports it into ``imported``
    (``b_extra``: more arguments for bridge B). Returns (bridge A's
    arguments, bridge A, bridge B)."""
    endpoint = f"tcp/127.0.0.1:{free_port()}"
    key = f"hosta/{exported[1:]}"
    a_link, b_link = (["--connect", endpoint], ["--listen", endpoint]) if b_listens else (["--listen", endpoint], ["--connect", endpoint])
    a_args = ["--export", exported, "--key-prefix", "hosta", *a_link]
    b = bridges("--import", f"{key}={imported}", "--key-prefix", "hostb", *b_link, *b_extra, json_lines=json_lines)
    a = bridges(*a_args, json_lines=json_lines)
    return a_args, a, b


PACED_PUBLISHER = r"""
import time
region = open_region(P["region"])
pub = kickmsg.Publisher(region)
ready()
wait_go()
for first in range(0, P["count"], 50):   # bursts of 50, a short pause between them
    publish(pub, range(first, min(first + 50, P["count"])), how="send")
    time.sleep(P["pause"])
done({"published": P["count"]})
"""

SUBSCRIBER_UNTIL_TOLD = r"""
import select
region = open_region(P["region"])
sub = kickmsg.Subscriber(region)
ready()
seqs = []
while not select.select([sys.stdin], [], [], 0)[0]:
    data = sub.receive(0.1)
    if data is not None:
        seqs.append(check_payload(data))
while (data := sub.try_receive()) is not None:
    seqs.append(check_payload(data))
done({"seqs": seqs, "lost": sub.lost})
"""


@pytest.mark.parametrize("publisher, ring, pause, b_layout", [
    ("ours", 1024, 0.002, 4),
    ("native", 1024, 0.002, 4),
    ("ours", 16, 0.0, 4),  # a flood into small rings: the bridge's subscriber and B's lose some, all counted
    ("ours", 1024, 0.002, 9),  # a layout-4 channel on A, a layout-9 one on B (bridge B --layout 9)
])
def test_ten_thousand_messages_cross_in_order_with_exact_accounting(bridges, prefix, publisher, ring, pause, b_layout):
    """A publisher on host A (ours, or the native 0.1.0; layout 4), a
    subscriber on host B (layout 4 or 9): what B receives is in order and
    intact, and received + every loss the subscriber and the two bridges
    count equals what was published."""
    a_name, b_name = f"/{prefix}_a", f"/{prefix}_b"
    start = start_native if publisher == "native" else start_ours
    spec = {"how": "create", "config": {**GEOMETRY, "sub_ring_capacity": ring}, "creator": "test"}
    a_spec = {**spec, "name": a_name} if publisher == "native" else {**spec, "name": a_name, "layout": 4}
    with start(PACED_PUBLISHER, region=a_spec, count=MESSAGES, pause=pause, timeout=150) as pub, \
            start_ours(SUBSCRIBER_UNTIL_TOLD, region={**spec, "name": b_name, "layout": b_layout}, timeout=150) as sub:
        pub.wait_ready()
        sub.wait_ready()  # B's channel exists (as the importer would make it) and has a subscriber
        assert SharedRegion.open(b_name).layout == b_layout
        _, a, b = two_hosts(bridges, a_name, b_name, b_extra=["--layout", str(b_layout)])
        a.wait_for("a matching subscriber", lambda channels: channels[0]["matched"])
        pub.tell()
        assert pub.result() == {"published": MESSAGES}
        exported = a.wait_for("every message received or lost",
                              lambda c: c[0]["messages_in"] + c[0]["lost_locally"] == MESSAGES)[0]
        b.wait_for("every forwarded message received or counted lost",
                   lambda c: c[0]["messages_in"] + c[0]["lost_on_way"] == exported["messages_out"]
                   and c[0]["messages_out"] + c[0]["lost_locally"] == c[0]["messages_in"])
        sub.tell()
        received = sub.result()
    (export,), _ = a.stop(signal.SIGINT)
    (imported,), _ = b.stop()
    seqs = received["seqs"]
    assert seqs and seqs == sorted(set(seqs)), "order kept, nothing twice"
    assert export["messages_in"] + export["lost_locally"] == MESSAGES
    assert export["messages_out"] == export["messages_in"]
    assert imported["messages_in"] + imported["lost_on_way"] == export["messages_out"]
    assert imported["epochs"] == 1 and imported["skipped"] == 0 and imported["error"] is None
    assert imported["lost_at_source"] <= export["lost_locally"]
    assert len(seqs) + received["lost"] == imported["messages_out"]
    assert (len(seqs) + received["lost"] + imported["lost_locally"] + imported["lost_on_way"]
            + export["lost_locally"]) == MESSAGES
    assert export["bytes_out"] == imported["bytes_out"] or imported["lost_locally"] or imported["lost_on_way"]


TYPED_PUBLISHER = r"""
import time
from kickmsg import typed
Imu = typed.RecordType("Imu", [("stamp_ns", "<u8"), ("accel", "<f4", (3,))])
pub = typed.advertise(kickmsg.Node("imu-driver", prefix=P["prefix"]), "imu", Imu)
ready()
for seq in range(P["count"]):
    pub.send((seq, (seq * 0.5, 1.0, 9.75)))
    time.sleep(0.005)
done("published")
"""


def test_a_typed_channel_arrives_typed(bridges, prefix):
    """The importer creates B's channel from the description that travels:
    a typed subscriber of the same record type joins and reads the records;
    another record type is refused, as on host A."""
    Imu = typed.RecordType("Imu", [("stamp_ns", "<u8"), ("accel", "<f4", (3,))])
    with start_ours(TYPED_PUBLISHER, prefix=prefix, count=6000, timeout=90) as pub:
        pub.wait_ready()
        a_name, b_name = f"/{prefix}_imu", f"/{prefix}_imub"
        _, a, b = two_hosts(bridges, a_name, b_name, json_lines=False)
        node = Node("planner", prefix=prefix)
        deadline = time.monotonic() + WAIT_S
        while True:
            try:
                sub = typed.subscribe(node, "imub", Imu)
                break
            except RuntimeError:  # not there yet (also a FileNotFoundError), or the importer is still writing its header
                assert time.monotonic() < deadline, "the importer never created the channel"
                time.sleep(0.05)
        records = [sub.receive(WAIT_S) for _ in range(5)]
        assert [p.node_name for p in diagnostics.stats(b_name).publishers] == ["kickmsg-bridge"]  # as kickmsg stats shows it
        for bridge_process in (a, b):  # Zenoh's shared memory is off: no /dev/shm/*.zenoh to leave behind
            assert ".zenoh" not in pathlib.Path(f"/proc/{bridge_process.proc.pid}/maps").read_text()
        with pytest.raises(typed.TypeMismatchError, match="gyro"):
            typed.subscribe(node, "imub", typed.RecordType("Imu", [("stamp_ns", "<u8"), ("gyro", "<f4", (3,))]))
        sub.close()
        pub.kill()
    for record in records:
        assert record is not None and record.dtype == Imu.dtype and record.shape == (1,)
        seq = int(record["stamp_ns"][0])
        assert record["accel"][0].tolist() == [seq * 0.5, 1.0, 9.75]
    assert [int(r["stamp_ns"][0]) for r in records] == sorted({int(r["stamp_ns"][0]) for r in records})
    a_region, b_region = SharedRegion.inspect(a_name), SharedRegion.inspect(b_name)
    assert b_region.schema() == a_region.schema() and typed.RecordType.from_schema(b_region.schema()) is not None
    assert b_region.geometry.config_hash == a_region.geometry.config_hash
    _, text = b.stop(signal.SIGINT)
    assert "lost_on_way" in text and b_name in text and "hosta/" in text  # the figures, as text


RESTART_PUBLISHER = r"""
import time
region = open_region(P["region"])
pub = kickmsg.Publisher(region)
ready()
wait_go()
for seq in range(P["count"]):
    publish(pub, [seq], how="send")
    time.sleep(0.002)
done({"published": P["count"]})
"""


def test_a_bridge_killed_and_restarted_resumes_without_a_phantom_loss(bridges, prefix):
    """Host A's bridge is killed (SIGKILL) and started again: it starts a new
    epoch, B goes on writing the same channel, and counts no loss for it."""
    a_name, b_name = f"/{prefix}_a", f"/{prefix}_b"
    spec = {"how": "create", "config": GEOMETRY, "creator": "test", "name": a_name}
    with start_ours(RESTART_PUBLISHER, region=spec, count=100_000, timeout=150) as pub:
        pub.wait_ready()
        a_args, a, b = two_hosts(bridges, a_name, b_name, b_listens=True)
        a.wait_for("a matching subscriber", lambda channels: channels[0]["matched"])
        pub.tell()
        before = b.wait_for("messages arriving", lambda c: c[0]["messages_out"] >= 200)[0]
        sub = Subscriber(SharedRegion.open(b_name))
        a.proc.kill()
        a.proc.wait(timeout=10)
        again = bridges(*a_args)
        again.wait_for("a matching subscriber", lambda channels: channels[0]["matched"])
        after = b.wait_for("messages of the new run", lambda c: c[0]["epochs"] == 2
                           and c[0]["messages_out"] >= before["messages_out"] + 400)[0]
        seqs = []
        while len(seqs) < 300:
            data = sub.receive(WAIT_S)
            assert data is not None, "nothing arrived after the restart"
            seqs.append(check_payload(data))
        pub.kill()
    sub.close()
    (imported,), _ = b.stop()
    assert seqs == sorted(set(seqs))
    assert after["lost_on_way"] == 0 and imported["lost_on_way"] == 0
    assert imported["epochs"] == 2 and imported["error"] is None


def test_an_existing_channel_of_another_geometry_is_a_clear_error(bridges, prefix):
    """B already has the channel with another pool size: the import names the
    field, counts what it could not write, and the bridge keeps running."""
    a_name, b_name = f"/{prefix}_a", f"/{prefix}_b"
    a_region = SharedRegion.create(a_name, ChannelType.PubSub, Config(**GEOMETRY), "test")
    SharedRegion.create(b_name, ChannelType.PubSub, Config(**{**GEOMETRY, "pool_size": 4096}), "test")
    _, a, b = two_hosts(bridges, a_name, b_name)
    a.wait_for("a matching subscriber", lambda channels: channels[0]["matched"])
    pub = Publisher(a_region)
    deadline = time.monotonic() + WAIT_S
    while True:
        pub.send(b"x" * 8)
        channels = b.next_figures(deadline)["channels"]
        if channels[0]["error"]:
            break
    assert "pool_size is 4096 there, 2048 here" in channels[0]["error"]
    (imported,), err = b.stop()
    assert imported["messages_out"] == 0 and imported["lost_locally"] == imported["messages_in"] > 0
    assert "pool_size is 4096 there" in err and err.count("error:") == 1


def open_if_made(name):
    """The region once its creator has initialised it, else None: the name
    exists before the creator stores magic, and an open in between is
    refused (bad magic), as native 0.9.2's is."""
    try:
        return SharedRegion.open(name)
    except FileNotFoundError:
        return None
    except RuntimeError as error:
        if "bad magic" in str(error):
            return None
        raise


def test_an_imported_channel_removed_under_the_bridge_is_made_again(bridges, prefix):
    """`kickmsg rm` of the channel B imports into: the next messages create
    it again (as the description says), rather than going unseen into the
    unlinked memory."""
    a_name, b_name = f"/{prefix}_a", f"/{prefix}_b"
    a_region = SharedRegion.create(a_name, ChannelType.PubSub, Config(**GEOMETRY), "test")
    _, a, b = two_hosts(bridges, a_name, b_name)
    a.wait_for("a matching subscriber", lambda channels: channels[0]["matched"])
    pub = Publisher(a_region)
    for payload in (b"first", b"after rm"):
        deadline = time.monotonic() + WAIT_S
        while (b_region := open_if_made(b_name)) is None:
            assert time.monotonic() < deadline, f"B never made {b_name}"
            pub.send(payload)
            time.sleep(0.01)
        sub = Subscriber(b_region)
        while (data := sub.receive(0.05)) is None:
            assert time.monotonic() < deadline, f"nothing arrived in {b_name}"
            pub.send(payload)
        assert data == payload
        sub.close()
        assert cli.main(["rm", b_name]) == 0
    b.stop()


SUBSCRIBER_FOLLOWING = r"""
import select
sub = kickmsg.Subscriber(kickmsg.SharedRegion.open(P["name"]))
ready()
seqs = []
while not select.select([sys.stdin], [], [], 0)[0]:
    data = sub.receive(0.1)
    if data is not None:
        seqs.append(check_payload(data))
while (data := sub.try_receive()) is not None:
    seqs.append(check_payload(data))
done({"seqs": seqs, "lost": sub.lost, "rejoined": sub.rejoined, "pool_size": sub.region.geometry.pool_size})
"""


@pytest.mark.parametrize("layout", [4, 9])
def test_an_export_recreated_with_another_geometry_is_followed_by_the_importer(bridges, prefix, layout):
    """Host A's channel is re-created with a larger pool while both bridges
    run: B re-creates the channel it made (says so, counts it) rather than
    refusing it as a mismatch, and waits for B's subscriber to follow, which
    then misses nothing of what comes next. On layout 9 both channels are
    layout 9's (B's as described): the exporter reads and follows a
    layout-9 channel, the importer re-creates one."""
    a_name, b_name = f"/{prefix}_a", f"/{prefix}_b"
    a_region = SharedRegion.create(a_name, ChannelType.PubSub, Config(**GEOMETRY), "test", layout=layout)
    _, a, b = two_hosts(bridges, a_name, b_name)
    a.wait_for("a matching subscriber", lambda channels: channels[0]["matched"])
    pub, seq = Publisher(a_region), 0
    deadline = time.monotonic() + WAIT_S
    while not b.next_figures(deadline)["channels"][0]["messages_out"]:
        pub.send(make_payload(seq))
        seq += 1
    with start_ours(SUBSCRIBER_FOLLOWING, name=b_name, timeout=150) as sub:
        sub.wait_ready()
        bigger = SharedRegion.create(a_name, ChannelType.PubSub, Config(**{**GEOMETRY, "pool_size": 4096}), "test", layout=layout)
        a.wait_for("the new epoch", lambda channels: channels[0]["epochs"] == 2)
        pub, first_new = Publisher(bigger), seq
        for seq in range(first_new, first_new + 200):
            pub.send(make_payload(seq))
        exported = a.wait_for("every message forwarded", lambda c: c[0]["messages_in"] == seq + 1)[0]
        b.wait_for("every forwarded message received",
                   lambda c: c[0]["messages_in"] + c[0]["lost_on_way"] == exported["messages_out"]
                   and c[0]["messages_out"] + c[0]["lost_locally"] == c[0]["messages_in"])
        sub.tell()
        received = sub.result()
    wait_recorded(b_name, "the re-create in the bridge's record", lambda found: [f.recreated for f in found] == [1])
    (imported,), err = b.stop()
    assert imported["recreated"] == 1 and imported["error"] is None and imported["epochs"] == 2
    assert imported["lost_locally"] == 0 and exported["lost_locally"] == 0
    assert f"re-created {b_name} (pool_size 2048 -> 4096)" in err and "error" not in err
    assert (SharedRegion.inspect(b_name).layout, SharedRegion.inspect(b_name).geometry.pool_size) == (layout, 4096)
    assert received["rejoined"] == 1 and received["pool_size"] == 4096
    assert set(range(first_new, seq + 1)) <= set(received["seqs"]), "it missed nothing published after the re-create"
    assert received["seqs"] == sorted(set(received["seqs"]))


RECREATE_AND_PUBLISH = r"""
ready()
wait_go()
region = kickmsg.SharedRegion.create(P["staging"], kickmsg.ChannelType.PubSub, make_config(P["config"]), "recreator")
watcher, publisher = kickmsg.Subscriber(region), kickmsg.Publisher(region)  # its ring shows what goes before the rejoin
for seq in range(P["first"], P["first"] + P["before"]):
    publisher.send(make_payload(seq))
os.rename("/dev/shm" + P["staging"], "/dev/shm" + P["name"])  # the channel re-created: a new object, 300 in its rings
ready()
wait_go()
for seq in range(P["first"] + P["before"], P["first"] + P["before"] + P["after"]):
    publisher.send(make_payload(seq))
done(None)
"""


@pytest.mark.parametrize("recreator", ["ours", "native9"])
def test_what_an_export_lost_at_a_re_create_is_counted_by_the_importer(bridges, prefix, recreator):
    """Host A's layout-9 channel is re-created as a new object (by ours or
    by a native 0.9.2 process) while both bridges run, and messages go into
    it before the exporter rejoins (the re-creator's subscriber is there
    from the start, so they are known): the exporter counts them lost, and
    so does the importer, at source (before, it took the new epoch's first
    figure as its baseline): B's received + lost (at source and on the way)
    = everything published. The new object is filled under another name,
    then renamed over the channel's, so that the exporter's rejoin never
    races the publisher (messages published while a subscriber joins are
    neither seen nor counted: see *Re-created regions*)."""
    a_name, b_name = f"/{prefix}_hb2_a", f"/{prefix}_hb2_b"
    first, before, after = 100, 300, 100
    old = SharedRegion.create(a_name, ChannelType.PubSub, Config(**GEOMETRY), "test")
    _, a, b = two_hosts(bridges, a_name, b_name)
    a.wait_for("a matching subscriber", lambda channels: channels[0]["matched"])
    pub = Publisher(old)
    for seq in range(first):
        pub.send(make_payload(seq))
    b.wait_for("the first run forwarded", lambda c: c[0]["messages_in"] + c[0]["lost_on_way"] == first)
    start = start_native9 if recreator == "native9" else start_ours
    with start(RECREATE_AND_PUBLISH, name=a_name, staging=f"/{prefix}_hb2_staging", config=GEOMETRY, first=first,
               before=before, after=after) as other:
        other.wait_ready()
        other.tell()
        other.wait_ready()  # re-created, and the 300 published into it
        a.wait_for("the new epoch", lambda channels: channels[0]["epochs"] == 2)
        other.tell()
        other.result()
    total = first + before + after
    exported = a.wait_for("every message received or lost", lambda c: c[0]["messages_in"] + c[0]["lost_locally"] == total)[0]
    b.wait_for("every message received or lost",
               lambda c: c[0]["messages_in"] + c[0]["lost_on_way"] + c[0]["lost_at_source"] == total)
    (imported,), _ = b.stop()
    assert imported["epochs"] == 2 and imported["skipped"] == 0 and imported["error"] is None
    assert imported["messages_in"] + imported["lost_on_way"] + imported["lost_at_source"] == total
    assert imported["lost_at_source"] == exported["lost_locally"] and imported["lost_on_way"] == 0


def test_an_export_re_created_with_no_ring_to_spare_is_retried_while_the_others_go_on(bridges, prefix):
    """A 1-ring exported channel is re-created and its ring taken by another
    subscriber first: the bridge warns once naming it and why, goes on
    exporting the other channel, and joins it once the ring is free (says
    so), exporting it again."""
    x_name, y_name = f"/{prefix}_hb2_x", f"/{prefix}_hb2_y"
    one_ring = Config(**{**GEOMETRY, "max_subscribers": 1})
    SharedRegion.create(x_name, ChannelType.PubSub, one_ring, "test")
    y_pub = Publisher(SharedRegion.create(y_name, ChannelType.PubSub, Config(**GEOMETRY), "test"))
    bridge_x = bridges("--export", x_name, "--export", y_name, "--key-prefix", "hosta", "--listen",
                       f"tcp/127.0.0.1:{free_port()}")
    bridge_x.wait_for("both exports", lambda channels: len(channels) == 2)
    new_x = SharedRegion.create(x_name, ChannelType.PubSub, one_ring, "test")
    taker = Subscriber(new_x)
    try:
        bridge_x.wait_for("the export that cannot join", lambda c: "No free subscriber slots" in (c[0]["error"] or ""))
        for seq in range(10):
            y_pub.send(make_payload(seq))
        bridge_x.wait_for("the other export going on", lambda c: c[1]["messages_in"] == 10)
    finally:
        taker.close()
    bridge_x.wait_for("the export joined at last", lambda c: c[0]["epochs"] == 2 and c[0]["error"] is None)
    x_pub = Publisher(new_x)
    for seq in range(5):
        x_pub.send(make_payload(seq))
    bridge_x.wait_for("the export going on", lambda c: c[0]["messages_in"] == 5)
    (x, y), err = bridge_x.stop()
    assert (x["messages_in"], y["messages_in"], x["error"]) == (5, 10, None)
    assert err.count(f"warning: not exporting {x_name} for now (No free subscriber slots in {x_name}") == 1, err
    assert "bridging the others, trying it again every 1 s" in err
    assert err.count(f"{x_name} could be joined at last; exporting it again") == 1, err


def test_a_bridge_with_nobody_to_talk_to_says_so(bridges, prefix):
    """Nothing listens where it connects: the bridge warns once, its figures
    show no peer and no match, and it says nothing more while it waits."""
    name = f"/{prefix}_a"
    SharedRegion.create(name, ChannelType.PubSub, Config(**GEOMETRY), "test")
    endpoint = f"tcp/127.0.0.1:{free_port()}"  # free: nothing listens there
    alone = bridges("--export", name, "--key-prefix", "hosta", "--connect", endpoint)
    deadline = time.monotonic() + WAIT_S
    figures = [alone.next_figures(deadline) for _ in range(3)]
    assert [(f["peers"], f["channels"][0]["matched"]) for f in figures] == [(0, False)] * 3
    _, err = alone.stop()
    assert err == f"kickmsg bridge: warning: no Zenoh peer connected yet (connecting to {endpoint}): " \
                  "nothing crosses until one connects\n"


def test_a_bridge_says_when_a_peer_arrives_and_when_the_last_one_leaves(bridges, prefix):
    """A bridge listening alone warns; the other bridge connecting is
    announced on both sides, and both show one peer and their channel
    matched (printed and recorded); the exporting bridge stopped, the
    importing one warns again and shows neither."""
    a_name, b_name = f"/{prefix}_a", f"/{prefix}_b"
    SharedRegion.create(a_name, ChannelType.PubSub, Config(**GEOMETRY), "test")
    _, a, b = two_hosts(bridges, a_name, b_name, b_listens=True)
    a.wait_for("a matching subscriber", lambda channels: channels[0]["matched"])
    b.wait_for("a matching exporter", lambda channels: channels[0]["matched"])
    assert a.next_figures(time.monotonic() + WAIT_S)["peers"] == 1
    assert b.next_figures(time.monotonic() + WAIT_S)["peers"] == 1
    wait_recorded(a_name, "one peer, matched", lambda found: [(f.peers, f.matched) for f in found] == [(1, True)])
    _, a_err = a.stop()
    b.wait_for("no exporter any more", lambda channels: not channels[0]["matched"])
    assert b.next_figures(time.monotonic() + WAIT_S)["peers"] == 0
    _, b_err = b.stop()
    assert re.fullmatch(r"(kickmsg bridge: warning: no Zenoh peer connected yet \(connecting to \S+\): "  # before its link is up
                        r"nothing crosses until one connects\n)?kickmsg bridge: peer \w+ connected \(1 connected\)\n", a_err), a_err
    listening = b_err.index("kickmsg bridge: warning: no Zenoh peer connected yet (listening on tcp/127.0.0.1:")
    arrived = b_err.index("kickmsg bridge: peer ", listening)
    left = b_err.index("kickmsg bridge: warning: peer ", arrived)
    assert " connected (1 connected)\n" in b_err[arrived:left]
    assert re.fullmatch(r"kickmsg bridge: warning: peer \w+ left, no Zenoh peer connected \(listening on \S+\): "
                        r"nothing crosses until one connects\n", b_err[left:]), b_err
    assert b_err.count("\n") == 3


@pytest.mark.parametrize("args, message", [
    (["--export", "/kmbridge_x", "--import", "k/x=/kmbridge_x", "--listen", "tcp/127.0.0.1:1"],
     "both exported and imported"),
    (["--export", "/kmbridge_x", "--import", "p/kmbridge_x=/kmbridge_y", "--key-prefix", "p", "--listen", "tcp/127.0.0.1:1"],
     "importing it would loop"),
    (["--import", "k/x", "--listen", "tcp/127.0.0.1:1"], "invalid --import 'k/x'"),
    (["--import", "k/*=/kmbridge_y", "--listen", "tcp/127.0.0.1:1"], "invalid import key 'k/*'"),
    (["--export", "/kmbridge_x"], "no way to reach another host"),
    ([], "nothing to bridge"),
    (["--export", "/kmbridge_x", "--listen", "tcp/127.0.0.1:1", "--stats-interval", "1e308"],
     "stats_interval must be greater than 0 and at most 1e+06, not 1e+308"),
    (["--import", "k/x=/kmbridge_y", "--listen", "tcp/127.0.0.1:99999"],
     "invalid endpoint 'tcp/127.0.0.1:99999': tcp/HOST:PORT with a port from 0 to 65535\n"),
    (["--import", "k/x=/kmbridge_y", "--connect", "tcp/127.0.0.1:99999"],
     "invalid endpoint 'tcp/127.0.0.1:99999': tcp/HOST:PORT with a port from 0 to 65535\n"),
    (["--import", "k/x=/kmbridge_y", "--connect", "udp/127.0.0.1"],
     "invalid endpoint 'udp/127.0.0.1': udp/HOST:PORT with a port from 0 to 65535\n"),
    (["--import", "k/x=/kmbridge_y", "--listen", "garbage"],
     "invalid Zenoh setting listen/endpoints = ['garbage']: "),
])
def test_bad_options_are_refused_naming_the_value(capsys, args, message):
    assert cli.main(["bridge", *args]) == 2
    err = capsys.readouterr().err
    assert message in err and err.count("\n") == 1
    assert ".rs:" not in err  # Zenoh's Rust source locations are left out


def test_exporting_a_channel_that_does_not_exist_is_refused(capsys, prefix):
    endpoint = f"tcp/127.0.0.1:{free_port()}"
    assert cli.main(["bridge", "--export", f"/{prefix}_none", "--listen", endpoint]) == 2
    assert f"cannot export /{prefix}_none: no such channel" in capsys.readouterr().err


def test_the_config_file_adds_to_the_command_line(tmp_path):
    path = tmp_path / "bridge.toml"
    path.write_text(
        'key_prefix = "robot"\nconnect = ["tcp/127.0.0.1:7447"]\nexport = ["/kmbridge_imu"]\n'
        '[[import]]\nkey = "base/kmbridge_cmd"\nname = "/kmbridge_cmd"\npool_size = 512\n'
        '[zenoh]\n"transport/link/tx/lease" = 5000\n'
    )
    parser = cli.build_parser()
    options = bridging.options_from_args(parser.parse_args(["bridge", "--config", str(path), "--export", "kmbridge_cam"]))
    assert options.exports == ["/kmbridge_imu", "/kmbridge_cam"] and options.key_prefix == "robot"
    assert options.imports[0].name == "/kmbridge_cmd" and options.imports[0].config.pool_size == 512
    bridge_options.check_options(options)
    bridge_options.zenoh_config(options)  # every setting accepted by Zenoh
    path.write_text('exports = ["/kmbridge_imu"]\n')
    with pytest.raises(ValueError, match="unknown key 'exports'"):
        bridging.options_from_args(parser.parse_args(["bridge", "--config", str(path)]))


def attachment(epoch: int, sequence: int, source_lost: int = 0) -> bytes:
    return forwarding.ATTACHMENT.pack(forwarding.MAGIC, forwarding.VERSION, epoch, sequence, sequence + 7, 0, source_lost)


def test_the_sequence_tracker_counts_gaps_per_epoch_and_no_loss_for_a_restart():
    """The importer's counting, fed attachments directly: gaps within an
    epoch are lost on the way; a new epoch starts afresh at whatever number
    arrives first; an old epoch still in flight is followed on its own; a
    passed number and a sample without (or with a damaged) attachment are
    skipped, never forwarded."""
    figures = bridge.ChannelFigures("import", "/kmbridge_x", "k/x")
    tracker = forwarding.SequenceTracker(figures)
    assert [tracker.admit(attachment(1, seq)) for seq in (0, 1, 2, 5, 6)] == [1] * 5
    assert figures.lost_on_way == 2 and figures.messages_in == 5
    assert tracker.admit(attachment(2, 4000, source_lost=3)) == 2  # restarted (or joined late): not a loss
    assert figures.lost_on_way == 2 and figures.epochs == 2
    assert tracker.admit(attachment(2, 4001, source_lost=10)) == 2
    assert figures.lost_at_source == 7  # what the exporter reported losing since we follow it
    assert tracker.admit(attachment(1, 7)) == 1 and figures.lost_on_way == 2  # the old run, on its own
    assert tracker.admit(attachment(2, 4001)) is None  # a duplicate
    assert tracker.admit(None) is None and tracker.admit(b"KMBR") is None
    assert tracker.admit(b"XXXX" + attachment(3, 0)[4:]) is None
    assert figures.skipped == 4 and figures.messages_in == 8


def test_the_sequence_tracker_counts_what_went_missing_between_an_epoch_and_the_one_it_follows():
    """An epoch that follows another (the exporter's channel was re-created)
    hands over: what the exporter lost in between (its rejoin) is lost at
    the source, the end of the old epoch and the start of the new one not
    received are lost on the way; counted once, and only when both epochs
    were followed."""
    figures = bridge.ChannelFigures("import", "/hb2_x", "k/x")
    tracker = forwarding.SequenceTracker(figures)
    assert [tracker.admit(attachment(1, seq, source_lost=2)) for seq in range(5)] == [1] * 5
    assert tracker.admit(attachment(2, 3, source_lost=50)) == 2  # 0..2 of epoch 2 went missing on the way
    tracker.link(2, 1, previous_sent=7)  # epoch 1 sent 5 and 6 as well
    tracker.link(2, 1, previous_sent=7)
    assert figures.lost_at_source == 48 and figures.lost_on_way == 2 + 3 and figures.messages_in == 6
    tracker.link(3, 1, previous_sent=7)  # an epoch not followed (yet): nothing
    tracker.link(2, 9, previous_sent=7)
    assert figures.lost_at_source == 48 and figures.lost_on_way == 5


def test_the_sequence_tracker_keeps_a_bounded_number_of_epochs():
    figures = bridge.ChannelFigures("import", "/kmbridge_x", "k/x")
    tracker = forwarding.SequenceTracker(figures)
    for epoch in range(1, 100):
        tracker.admit(attachment(epoch, 0))
    assert len(tracker.epochs) == forwarding.EPOCHS_KEPT and figures.epochs == 99 and figures.lost_on_way == 0


def test_bench_bridge_reports_both_rows_and_leaves_nothing_behind(tmp_path):
    """benchmarks/bench_bridge.py (part of ``make bench``), smoke run: both
    rows printed, every latency sample crossed the bridges (its figures are
    not asserted: tests never assert on time)."""
    leftovers = lambda: sorted(pathlib.Path("/dev/shm").glob("kmbenchbridge_*"))  # noqa: E731
    before = leftovers()
    output = tmp_path / "bench_bridge.json"
    done = subprocess.run([sys.executable, "benchmarks/bench_bridge.py", "--quick", "--output", str(output)],
                          cwd=ROOT, capture_output=True, text=True, timeout=170)
    assert done.returncode == 0, done.stderr[-3000:]
    rows = re.findall(r"^\| (one-way latency|throughput)[^|]*\| [\d,]+", done.stdout, re.MULTILINE)
    assert rows == ["one-way latency", "throughput"], done.stdout
    results = json.loads(output.read_text())
    assert results["latency"]["kickmsg"]["received"] == results["latency"]["kickmsg"]["sent"]
    assert results["throughput"]["kickmsg"]["received"] > 0 and results["throughput"]["zmq"]["received"] > 0
    assert leftovers() == before


@pytest.mark.parametrize("description", [{}, {"schema": None, "channel_type": 7}, "not a dict",
                                         {"channel_type": 0, "max_subscribers": 4, "sub_ring_capacity": 3,
                                          "pool_size": 8, "max_payload_size": 64, "commit_timeout_us": 1000,
                                          "schema": None},
                                         {"layout": 5, "channel_type": 0, "max_subscribers": 4, "sub_ring_capacity": 4,
                                          "pool_size": 8, "max_payload_size": 64, "commit_timeout_us": 1000,
                                          "schema": None}])
def test_an_invalid_description_is_a_clear_error(prefix, description):
    """Whatever answers on the description key, the importer gets a
    BridgeError naming the key and creates nothing."""
    with pytest.raises(bridge.BridgeError, match=f"cannot import k/x into /{prefix}_x"):
        forwarding.open_local_channel(f"/{prefix}_x", "k/x", description, None, None)
    assert not os.path.exists(f"/dev/shm/{prefix}_x")


class StopBeforeTheOwner(Atomics):
    """A door that stops a join between B.4 step 2 (the ring Live) and
    step 3 (its owner recorded): the first 64-bit relaxed store raises."""

    def store_relaxed_u64(self, address: int, value: int) -> None:
        raise RuntimeError("stopped before the owner is recorded")


def test_a_layout_9_subscriber_counts_as_followed_once_its_owner_is_recorded(prefix):
    """The importer's wait after a re-create counts a layout-9 ring once its
    owner has recorded itself (B.4 step 3), not as soon as it is Live: in
    between, the subscriber has not read where it starts (step 4) and
    would never read what the importer published meanwhile."""
    name = f"/{prefix}_x"
    region = SharedRegion.create(name, ChannelType.PubSub, Config(**GEOMETRY), "test", layout=9)
    with pytest.raises(RuntimeError, match="stopped before the owner"):
        receive9.Subscriber(region9.Region.open(name, atomics=StopBeforeTheOwner()))
    assert [ring.state for ring in region.stats().rings].count("Live") == 1
    assert forwarding.recorded_subscribers(region) == 0
    subscriber = Subscriber(region)
    assert forwarding.recorded_subscribers(region) == 1
    subscriber.close()


def test_only_a_channel_made_for_the_key_is_recreated_for_a_new_description(prefix):
    """``open_local_channel`` re-creates the channel a bridge made for the
    key when the description changes its geometry or schema, says what
    changed, and refuses any other channel of another geometry."""
    name, key = f"/{prefix}_x", "k/x"
    Imu, Gyro = (SchemaInfo(name=n, identity=n.encode().ljust(64, b"\0"), layout=bytes(64)) for n in ("Imu", "Gyro"))
    description = {"channel_type": int(ChannelType.PubSub), "max_subscribers": 4, "sub_ring_capacity": 64, "pool_size": 128,
                   "max_payload_size": 64, "commit_timeout_us": 100_000}
    first, _ = forwarding.open_local_channel(name, key, {**description, "schema": describe.schema_to_json(Imu)}, None, None)
    assert forwarding.open_local_channel(name, key, {**description, "schema": describe.schema_to_json(Imu)}, None, None)[1] == []
    region, changes = forwarding.open_local_channel(name, key, {**description, "pool_size": 256, "schema": None}, None, None)
    assert changes == ["pool_size 128 -> 256"] and region.geometry.pool_size == 256 and region.schema() is None
    region, changes = forwarding.open_local_channel(name, key, {**description, "pool_size": 256,
                                                            "schema": describe.schema_to_json(Gyro)}, None, None)
    assert changes == [] and region.schema() == Gyro  # a channel without a schema takes the description's
    region, changes = forwarding.open_local_channel(name, key, {**description, "pool_size": 256,
                                                            "schema": describe.schema_to_json(Imu)}, None, None)
    assert changes == ["schema 'Gyro' -> 'Imu'"] and region.schema() == Imu and region.geometry.pool_size == 256
    assert region.layout == 4  # as described: a description without a layout is layout 4's
    subscriber = Subscriber(region)  # cannot follow it into another layout: the importer does not wait for it
    assert (forwarding.followers(region, 4), forwarding.followers(region, 9)) == (1, 0)
    region, changes = forwarding.open_local_channel(name, key, {**description, "layout": 9, "pool_size": 256,
                                                            "schema": describe.schema_to_json(Imu)}, None, None)
    assert changes == ["layout 4 -> 9"] and region.layout == 9 and region.schema() == Imu
    subscriber.close()
    subscriber = Subscriber(region)
    assert (forwarding.followers(region, 9), forwarding.followers(region, 4)) == (1, 0)
    region, changes = forwarding.open_local_channel(name, key, {**description, "layout": 9, "pool_size": 256,
                                                            "schema": describe.schema_to_json(Imu)}, None, 4)
    assert changes == ["layout 9 -> 4"] and region.layout == 4  # the importer's choice wins
    subscriber.close()
    SharedRegion.create(name, ChannelType.PubSub, Config(**GEOMETRY), "someone else", layout=4)  # a description without "layout" is layout 4's
    with pytest.raises(bridge.BridgeError, match=rf"cannot import k/x into {name}: Config mismatch .*pool_size is 2048 there, 256 here"):
        forwarding.open_local_channel(name, key, {**description, "pool_size": 256, "schema": None}, None, None)


# -- the bridges' figures for other processes (diagnostics, kickmsg stats/list/clean, the exporter) ------------

RECORDED = ("direction", "key", "messages_in", "messages_out", "bytes_out", "lost_locally", "lost_on_way",
            "lost_at_source", "skipped", "epochs", "recreated")


def recorded_figures(name: str, pid: int) -> dict | None:
    """The figures bridge ``pid`` recorded beside channel ``name`` (None if
    there is no record of it), as ``diagnostics.stats`` shows them."""
    found = [b for b in diagnostics.stats(name).bridges if b.pid == pid]
    assert len(found) <= 1, found
    return None if not found else {field: getattr(found[0], field) for field in RECORDED} | {"alive": found[0].alive}


def wait_recorded(name: str, what: str, predicate) -> dict:
    """Poll ``diagnostics.stats(name).bridges`` until ``predicate(bridges)``; those."""
    deadline = time.monotonic() + WAIT_S
    while True:
        bridges_now = diagnostics.stats(name).bridges
        if predicate(bridges_now):
            return bridges_now
        assert time.monotonic() < deadline, f"{name} never showed {what}: {bridges_now}"
        time.sleep(0.05)


def bridge_labels(name: str, direction: str, key: str) -> tuple[tuple[str, str], ...]:
    return (("channel", name), ("direction", direction), ("key", key))


def test_the_bridges_figures_show_in_diagnostics_stats_and_the_exporter(bridges, prefix, exporter_for):
    """While a publisher on host A sends, both channels show their bridge in
    ``diagnostics.stats`` (and ``kickmsg stats``, ``kickmsg list``); once all
    is forwarded, the records and the exporter's metrics hold exactly what
    the bridges print when they stop; stopped, they leave no record."""
    a_name, b_name = f"/{prefix}_a", f"/{prefix}_b"
    count = 3000
    spec = {"how": "create", "config": GEOMETRY, "creator": "test", "name": a_name}
    with start_ours(PACED_PUBLISHER, region=spec, count=count, pause=0.05, timeout=150) as pub:  # about 3 s
        pub.wait_ready()
        _, a, b = two_hosts(bridges, a_name, b_name)
        key = f"hosta/{a_name[1:]}"
        a.wait_for("a matching subscriber", lambda channels: channels[0]["matched"])
        exporter = exporter_for()
        pub.tell()
        # While it sends: both sides show a live bridge whose figures grow.
        wait_recorded(a_name, "the exporting bridge forwarding", lambda found: any(
            f.pid == a.proc.pid and f.alive and f.direction == "export" and f.key == key and f.messages_out > 0
            for f in found))
        wait_recorded(b_name, "the importing bridge forwarding", lambda found: any(
            f.pid == b.proc.pid and f.alive and f.direction == "import" and f.key == key and f.messages_out > 0
            for f in found))
        assert pub.result() == {"published": count}
    exported = a.wait_for("every message received or lost",
                          lambda c: c[0]["messages_in"] + c[0]["lost_locally"] == count)[0]
    b.wait_for("every forwarded message received or counted lost",
               lambda c: c[0]["messages_in"] + c[0]["lost_on_way"] == exported["messages_out"]
               and c[0]["messages_out"] + c[0]["lost_locally"] == c[0]["messages_in"])
    # All forwarded: the records catch up with the figures within their update interval.
    a_now = a.wait_for("steady figures", lambda c: True)[0]
    b_now = b.wait_for("steady figures", lambda c: True)[0]
    wait_recorded(a_name, "the export's final figures", lambda found: recorded_figures(a_name, a.proc.pid)
                  == {field: a_now[field] for field in RECORDED} | {"alive": True})
    wait_recorded(b_name, "the import's final figures", lambda found: recorded_figures(b_name, b.proc.pid)
                  == {field: b_now[field] for field in RECORDED} | {"alive": True})
    a_recorded, b_recorded = recorded_figures(a_name, a.proc.pid), recorded_figures(b_name, b.proc.pid)
    metrics = exporter.wait_for({
        ("kickmsg_bridge_messages_total", bridge_labels(a_name, "export", key)): a_now["messages_out"],
        ("kickmsg_bridge_messages_total", bridge_labels(b_name, "import", key)): b_now["messages_out"],
        ("kickmsg_bridge_up", bridge_labels(a_name, "export", key)): 1,
        ("kickmsg_bridge_up", bridge_labels(b_name, "import", key)): 1,
        ("kickmsg_bridge_peers", bridge_labels(a_name, "export", key)): 1,
        ("kickmsg_bridge_matched", bridge_labels(b_name, "import", key)): 1,
        ("kickmsg_bridge_lost_total", bridge_labels(a_name, "export", key) + (("where", "local"),)): a_now["lost_locally"],
        ("kickmsg_bridge_lost_total", bridge_labels(b_name, "import", key) + (("where", "local"),)): b_now["lost_locally"],
        ("kickmsg_bridge_lost_total", bridge_labels(b_name, "import", key) + (("where", "way"),)): b_now["lost_on_way"],
        ("kickmsg_bridge_lost_total", bridge_labels(b_name, "import", key) + (("where", "source"),)): b_now["lost_at_source"],
    })
    assert metrics[("kickmsg_bridge_bytes_total", bridge_labels(b_name, "import", key))] == b_now["bytes_out"]
    text = subprocess.run([sys.executable, "-m", "kickmsg", "stats", b_name], capture_output=True, text=True,
                          cwd=ROOT, timeout=60).stdout
    assert re.search(rf"^{b.proc.pid}\s+live\s+import\s+{re.escape(key)}\s+1\s+yes\s+{b_now['messages_in']}\s+{b_now['messages_out']}\s",
                     text, re.MULTILINE), text
    listed = {row["name"]: row for row in json.loads(subprocess.run(
        [sys.executable, "-m", "kickmsg", "list", "--prefix", prefix, "--json"], capture_output=True, text=True,
        cwd=ROOT, timeout=60).stdout)}
    assert (listed[a_name]["bridges_live"], listed[a_name]["bridges_dead"]) == (1, 0)
    assert (listed[b_name]["bridges_live"], listed[b_name]["bridges_dead"]) == (1, 0)
    # What they print when they stop is what was recorded.
    (a_final,), _ = a.stop(signal.SIGINT)
    (b_final,), _ = b.stop()
    assert {field: a_final[field] for field in RECORDED} | {"alive": True} == a_recorded
    assert {field: b_final[field] for field in RECORDED} | {"alive": True} == b_recorded
    assert a_final["messages_in"] + a_final["lost_locally"] == count
    assert diagnostics.stats(a_name).bridges == [] and diagnostics.stats(b_name).bridges == []


def test_a_killed_bridge_shows_dead_until_clean_or_a_restarted_bridge_reclaims_its_record(bridges, prefix, exporter_for):
    """SIGKILL leaves the bridge's record: stats, list and the exporter show
    it dead; ``kickmsg clean`` clears it; killed again, the bridge started
    anew takes the dead record's place."""
    name = f"/{prefix}_a"
    SharedRegion.create(name, ChannelType.PubSub, Config(**GEOMETRY), "test")
    args = ["--export", name, "--key-prefix", "hosta", "--listen", f"tcp/127.0.0.1:{free_port()}"]
    key = f"hosta/{name[1:]}"
    exporter = exporter_for()
    first = bridges(*args)
    wait_recorded(name, "a live bridge", lambda found: [(f.pid, f.alive) for f in found] == [(first.proc.pid, True)])
    exporter.wait_for({("kickmsg_bridge_up", bridge_labels(name, "export", key)): 1})
    first.proc.kill()
    first.proc.wait(timeout=10)
    wait_recorded(name, "the bridge dead", lambda found: [(f.pid, f.alive) for f in found] == [(first.proc.pid, False)])
    exporter.wait_for({("kickmsg_bridge_up", bridge_labels(name, "export", key)): 0})
    text = subprocess.run([sys.executable, "-m", "kickmsg", "stats", name], capture_output=True, text=True,
                          cwd=ROOT, timeout=60).stdout
    assert f"bridge {first.proc.pid} died without leaving; kickmsg clean reclaims its record" in text, text
    assert re.search(rf"^{first.proc.pid}\s+dead\s+export\s", text, re.MULTILINE), text

    cleaned = subprocess.run([sys.executable, "-m", "kickmsg", "clean", "--prefix", prefix, "--json"],
                             capture_output=True, text=True, cwd=ROOT, timeout=60)
    assert json.loads(cleaned.stdout)["dead_bridges"] == [{"name": name, "pid": first.proc.pid}], cleaned
    assert diagnostics.stats(name).bridges == []
    exporter.wait_for({("kickmsg_bridge_up", bridge_labels(name, "export", key)): None})

    second = bridges(*args)
    wait_recorded(name, "the second bridge", lambda found: [(f.pid, f.alive) for f in found] == [(second.proc.pid, True)])
    second.proc.kill()
    second.proc.wait(timeout=10)
    third = bridges(*args)
    wait_recorded(name, "the restarted bridge in the dead one's place",
                  lambda found: [(f.pid, f.alive) for f in found] == [(third.proc.pid, True)])
    third.stop()
    assert diagnostics.stats(name).bridges == []


STOP_CYCLES = 10
STOPPING_AFTER_THE_PEER_LEFT = r"""
import faulthandler, sys, time
from kickmsg import ChannelType, Config, SharedRegion
from kickmsg.bridge import Bridge, BridgeOptions, ImportSpec

exported, imported, endpoints, wait_s = sys.argv[1], sys.argv[2], sys.argv[3].split(), float(sys.argv[4])
SharedRegion.create(exported, ChannelType.PubSub, Config(max_subscribers=2, sub_ring_capacity=8, pool_size=16,
                                                         max_payload_size=64), "test")

def until(what, predicate):
    deadline = time.monotonic() + wait_s
    while not predicate():
        if time.monotonic() > deadline:
            sys.exit(f"never {what}")
        time.sleep(0.01)

for cycle, endpoint in enumerate(endpoints):
    faulthandler.dump_traceback_later(wait_s, exit=True)  # a hang prints where every thread is, then exits 1
    b = Bridge(BridgeOptions(imports=[ImportSpec("hosta/" + exported[1:], imported)], key_prefix="hostb",
                             listen=[endpoint]))
    b.start()
    a = Bridge(BridgeOptions(exports=[exported], key_prefix="hosta", connect=[endpoint]))
    a.start()
    until("matched", lambda: a.figures()[0].matched and b.figures()[0].matched and b.peer_count() == 1)
    a.stop()
    until("saw its peer leave", lambda: b.peer_count() == 0)
    b.stop()
    print(cycle, flush=True)
faulthandler.dump_traceback_later(wait_s, exit=True)  # the interpreter's exit too
"""


def test_a_bridge_stops_every_time_after_its_peer_left(prefix):
    """Ten times in a row in one process: two bridges connect and match, the
    exporting one stops, the importing one sees it leave, then stops; both
    sessions close, and the process exits (a Zenoh session left open would
    hold its exit forever). A hang is aborted with every thread's stack
    shown."""
    endpoints = " ".join(f"tcp/127.0.0.1:{free_port()}" for _ in range(STOP_CYCLES))
    done = subprocess.run([sys.executable, "-c", STOPPING_AFTER_THE_PEER_LEFT, f"/{prefix}_hbv_a", f"/{prefix}_hbv_b",
                           endpoints, str(WAIT_S)], capture_output=True, text=True, cwd=ROOT, stdin=subprocess.DEVNULL,
                          timeout=STOP_CYCLES * 2 * WAIT_S)
    assert done.returncode == 0 and done.stdout.split() == [str(cycle) for cycle in range(STOP_CYCLES)], done


def test_a_bridges_session_is_closed_even_if_a_step_of_its_stop_fails(prefix, monkeypatch):
    """The records cannot be cleared: stop raises, its session closed all the same."""
    alone = bridge.Bridge(bridge.BridgeOptions(imports=[bridge.ImportSpec("hosta/x", f"/{prefix}_hbv_b")],
                                               key_prefix="hostb", listen=[f"tcp/127.0.0.1:{free_port()}"]))
    alone.start()
    session = alone.session

    def fail() -> None:
        raise OSError("no records here")

    monkeypatch.setattr(alone.records, "release", fail)
    try:
        with pytest.raises(OSError, match="no records here"):
            alone.stop()
        assert session.is_closed() and alone.session is None
    finally:
        if not session.is_closed():  # else this interpreter's exit would wait for it forever
            session.close()


SIGNAL_INSIDE_WAIT = r"""
import signal
from kickmsg.cli.common import stop_on_signals

stop = stop_on_signals()
with stop._cond:  # as inside stop.wait(): this thread holds the event's lock when the handler runs
    signal.getsignal(signal.SIGTERM)(signal.SIGTERM, None)
print(stop.wait(60), flush=True)
"""


def test_a_stop_signal_handled_inside_the_wait_for_it_stops_the_command():
    """The cause of a bridge that once did not stop (its stack: the SIGTERM
    handler inside ``stop.wait()``, waiting for the lock its own thread
    held): the handler sets the stop event from another thread, so a signal
    landing while the command holds the event's lock stops it all the same."""
    try:
        done = subprocess.run([sys.executable, "-c", SIGNAL_INSIDE_WAIT], capture_output=True, text=True, cwd=ROOT,
                              stdin=subprocess.DEVNULL, timeout=WAIT_S)
    except subprocess.TimeoutExpired:
        pytest.fail("the handler waited for the lock its own thread held")
    assert (done.returncode, done.stdout) == (0, "True\n"), done
