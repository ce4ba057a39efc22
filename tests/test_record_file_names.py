"""The record files beside a region are named for what they hold (issue 35):
``x.kickmsg-subscribers``, ``x.kickmsg-publishers``, ``x.kickmsg-bridges``.
For one release the previous release's names (``x.owners``,
``x.owners.owners``, ``x.owners.owners.owners``), which a process of that
release may still write, are read by the tools and removed with ours.

A process "of the previous release" is ours with its file renamed to the old
name while it runs: it keeps its lock and goes on writing through its open
file, as the old release's code does at that path."""
import os
import pathlib
import signal

import pytest

from conftest import on_layout4
from kickmsg import ChannelType, Config, Publisher, SharedRegion, Subscriber, owners, unlink_shm
from kickmsg.ops import diagnostics
from nativepeer import start_ours
from test_cli import cli_json

# Ring-owner records are layout 4's (layout 9 keeps a ring's owner in its header).
pytestmark = [pytest.mark.timeout(120), on_layout4]

SMALL = Config(max_subscribers=2, sub_ring_capacity=8, pool_size=16, max_payload_size=64)
OLD = {"subscribers": ".owners", "publishers": ".owners.owners", "bridges": ".owners.owners.owners"}
NEW = {"subscribers": ".kickmsg-subscribers", "publishers": ".kickmsg-publishers", "bridges": ".kickmsg-bridges"}

OLD_RELEASE_SUBSCRIBER = r'''
import os
sub = kickmsg.Subscriber(kickmsg.SharedRegion.open(P["name"]))
os.rename("/dev/shm" + P["name"] + ".kickmsg-subscribers", "/dev/shm" + P["name"] + ".owners")
ready()
wait_go()
done(0)
'''


@pytest.fixture
def name():
    """A region name of this test's own; every file under it is removed whatever the outcome."""
    value = f"/kp35err_{os.getpid()}_names"
    yield value
    for path in pathlib.Path("/dev/shm").glob(value[1:] + "*"):
        path.unlink(missing_ok=True)


def files_of(name: str) -> list[str]:
    return sorted(entry for entry in os.listdir("/dev/shm") if entry.startswith(name[1:]))


def as_old_release(name: str, *kinds: str) -> None:
    """Rename our record files of ``kinds`` to the previous release's names."""
    for kind in kinds:
        os.rename(f"/dev/shm{name}{NEW[kind]}", f"/dev/shm{name}{OLD[kind]}")


def test_the_files_are_named_for_what_they_hold(name):
    region = SharedRegion.create(name, ChannelType.PubSub, SMALL, layout=4)
    subscriber, publisher = Subscriber(region), Publisher(region)
    base = name[1:]
    assert files_of(name) == [base, base + ".kickmsg-publishers", base + ".kickmsg-subscribers"]
    assert [owners.sidecar_kind(file) for file in files_of(name)[1:]] == ["publisher", "ring-owner"]
    assert {owners.region_of_sidecar(base + suffix) for suffix in [*NEW.values(), *OLD.values()]} == {name}
    assert owners.sidecar_kind(base) is None
    with pytest.raises(ValueError, match=f"'{base}' is not the name of a record file"):
        owners.region_of_sidecar(base)
    publisher.close()
    subscriber.close()


def test_records_under_the_previous_names_are_seen_by_the_tools(name):
    region = SharedRegion.create(name, ChannelType.PubSub, SMALL, layout=4)
    subscriber, publisher = Subscriber(region), Publisher(region)
    as_old_release(name, "subscribers", "publishers")
    publisher.send(b"x")
    stats = diagnostics.stats(name)
    assert [(ring.owner_pid, ring.owner_alive) for ring in stats.rings] == [(os.getpid(), True)]
    assert [(found.pid, found.alive) for found in stats.publishers] == [(os.getpid(), True)]
    assert [row["name"] for row in cli_json("list", "--prefix", name[1:], "--all")] == [name]  # no orphan rows
    second = Subscriber(region)  # of this release: recorded in the new file, beside the old one
    assert [ring.owner_pid for ring in diagnostics.stats(name).rings] == [os.getpid(), os.getpid()]
    assert os.path.exists(owners.sidecar_path(name)) and os.path.exists(f"/dev/shm{name}.owners")
    for user in (second, subscriber, publisher):
        user.close()


def test_rm_and_unlink_remove_the_previous_names_too(name):
    for remove in (lambda: cli_json("rm", name), lambda: unlink_shm(name)):
        region = SharedRegion.create(name, ChannelType.PubSub, SMALL, layout=4)
        Subscriber(region).close()
        Publisher(region).close()
        as_old_release(name, "subscribers", "publishers")
        pathlib.Path(f"/dev/shm{name}{OLD['bridges']}").write_bytes(bytes(owners.BRIDGE_RECORD_SIZE))
        remove()
        assert files_of(name) == []


def test_clean_removes_orphans_of_either_name_and_create_discards_them(name):
    for suffix in [*NEW.values(), *OLD.values()]:
        pathlib.Path(f"/dev/shm{name}{suffix}").write_bytes(bytes(48))
    rows = cli_json("list", "--prefix", name[1:], "--all", "-o", "name,type,problem")
    assert {(row["name"], row["type"], row["problem"].split(" records")[0]) for row in rows} == {
        (name + NEW["subscribers"], "orphan sidecar", "ring-owner"), (name + OLD["subscribers"], "orphan sidecar", "ring-owner"),
        (name + NEW["publishers"], "orphan sidecar", "publisher"), (name + OLD["publishers"], "orphan sidecar", "publisher"),
        (name + NEW["bridges"], "orphan sidecar", "bridge"), (name + OLD["bridges"], "orphan sidecar", "bridge")}
    assert sorted(cli_json("clean", "--prefix", name[1:])["sidecars"]) == sorted(name + suffix for suffix in [*NEW.values(), *OLD.values()])
    assert files_of(name) == []
    for suffix in OLD.values():
        pathlib.Path(f"/dev/shm{name}{suffix}").write_bytes(bytes(48))
    SharedRegion.create(name, ChannelType.PubSub, SMALL, layout=4)
    assert files_of(name) == [name[1:]]


def test_a_dead_subscriber_recorded_under_the_previous_name_gives_its_ring_back(name):
    region = SharedRegion.create(name, ChannelType.PubSub, SMALL, layout=4)
    with start_ours(OLD_RELEASE_SUBSCRIBER, name=name) as child:
        child.wait_ready()
        pid = child.proc.pid
        assert [(ring.owner_pid, ring.owner_alive) for ring in diagnostics.stats(name).rings] == [(pid, True)]
        child.proc.send_signal(signal.SIGKILL)
        child.proc.wait(timeout=30)
    assert [ring.owner_alive for ring in diagnostics.stats(name).rings] == [False]
    assert region.reclaim_dead_subscribers().reclaimed == [(0, pid)]
    assert diagnostics.stats(name).live_rings == 0


def test_clean_clears_dead_bridge_records_of_either_name_once(name):
    SharedRegion.create(name, ChannelType.PubSub, SMALL, layout=4)
    for suffix, pid in ((NEW["bridges"], 0x7FFFFFF0), (OLD["bridges"], 0x7FFFFFF1)):  # dead: nobody holds the record's lock
        record = owners.BridgeRecord(pid=pid, started_at_ns=1, direction=1, key=b"kickmsg/k")
        pathlib.Path(f"/dev/shm{name}{suffix}").write_bytes(bytes(record))
    expected = [{"name": name, "pid": 0x7FFFFFF0}, {"name": name, "pid": 0x7FFFFFF1}]
    assert cli_json("clean", "--prefix", name[1:], "--dry-run")["dead_bridges"] == expected
    assert cli_json("clean", "--prefix", name[1:])["dead_bridges"] == expected
    assert cli_json("clean", "--prefix", name[1:])["dead_bridges"] == []
