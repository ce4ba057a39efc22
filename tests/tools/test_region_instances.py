"""A record belongs to one instance of its region (kickmsg.owners): a
record file can outlive its region (a native process removes a region
without its sidecars, a publisher may be made on a region whose name was
unlinked), and a region made later under the same name never shows the
processes of the earlier one as its own; ``kickmsg rm NAME`` removes NAME's
record files whether or not the region is still there. Real processes,
killed for real; native 0.9.2 ones remove and re-create the region."""
import ctypes
import itertools
import os
import signal
import time

import pytest

from kickmsg import ChannelType, Config, Publisher, SharedRegion, Subscriber, shm
from kickmsg import owners
from kickmsg.ops import diagnostics
from nativepeer import run_native9, start_ours
from test_cli import cli, cli_json

pytestmark = pytest.mark.timeout(120)

SMALL = {"max_subscribers": 2, "sub_ring_capacity": 8, "pool_size": 16, "max_payload_size": 64}
_numbers = itertools.count()

# Opens the region, lets the test unlink its name (or not), then records a
# publisher in it and waits to be killed.
PUBLISHER = r"""
region = kickmsg.SharedRegion.open(P["name"])
ready()
wait_go()
publisher = kickmsg.Publisher(region, name="earlier")
publisher.send(b"m")
ready()
wait_go()
"""


@pytest.fixture
def name():
    """A fresh name of this module's own; the region and its record files
    are removed after the test, whatever its outcome."""
    value = f"/hrd_inst_{os.getpid()}_{next(_numbers)}"
    yield value
    shm.unlink(value)
    owners.unlink(value)


def make(name: str, layout: int) -> SharedRegion:
    return SharedRegion.create(name, ChannelType.PubSub, Config(**SMALL), "instances-test", layout=layout)


def record_files(name: str) -> list[str]:
    return [path for path in owners.sidecar_paths(name) if os.path.exists(path)]


def kill(child) -> None:
    os.kill(child.proc.pid, signal.SIGKILL)
    child.proc.wait(timeout=10)


@pytest.mark.parametrize("layout", [4, 9])
def test_a_publisher_on_an_unlinked_name_records_nothing_and_the_next_region_of_the_name_shows_no_stall(name, layout):
    make(name, layout)
    with start_ours(PUBLISHER, name=name) as child:
        child.wait_ready()
        os.unlink("/dev/shm" + name)  # the name goes; the child keeps its mapping
        child.tell()
        child.wait_ready()  # it made a Publisher on the unlinked region, and sent
        assert record_files(name) == []
        kill(child)
    region = make(name, layout)
    assert diagnostics.stats(name).publishers == []
    assert cli_json("list", "--prefix", name[1:], "-o", "pubs") == [{"pubs_live": 0, "pubs_stall": 0}]
    assert "died without leaving" not in cli("stats", name).text
    del region


def test_a_subscriber_on_an_unlinked_name_records_nothing(name):
    """Layout 4's ring-owner records: none for a region whose name was
    unlinked (nobody could reclaim its ring by name)."""
    region = make(name, 4)
    os.unlink("/dev/shm" + name)
    subscriber = Subscriber(region)
    assert record_files(name) == []
    del subscriber, region


def test_records_of_a_region_a_native_process_removed_are_not_those_of_the_next_one_and_rm_removes_them(name):
    """A publisher of ours records itself and is killed; a native 0.9.2
    process removes the region (its sidecars stay) and another makes a new
    one under the name: no stall there, and repair reclaims nothing of the
    earlier one. Once a native process removed that one too, rm removes its
    record files."""
    make(name, 9)
    with start_ours(PUBLISHER, name=name) as child:
        child.wait_ready()
        child.tell()
        child.wait_ready()
        [earlier] = diagnostics.stats(name).publishers
        assert (earlier.pid, earlier.alive) == (child.proc.pid, True)
        kill(child)
    assert [(p.pid, p.alive) for p in diagnostics.stats(name).publishers] == [(child.proc.pid, False)]

    run_native9('kickmsg.unlink_shm(P["name"]); done("removed")', name=name)
    assert record_files(name) == [owners.publishers_path(name)]  # left behind
    run_native9('open_region(P); done("made")', name=name, how="create", config=SMALL)
    assert diagnostics.stats(name).publishers == []
    assert cli_json("list", "--prefix", name[1:], "-o", "pubs") == [{"pubs_live": 0, "pubs_stall": 0}]
    assert cli_json("repair", name)["dead_publishers_reclaimed"] == []

    run_native9('kickmsg.unlink_shm(P["name"]); done("removed")', name=name)
    removed = cli("rm", name)
    assert (removed.code, removed.text) == (0, f"removed the record files of {name} (the region was gone already)\n")
    assert record_files(name) == []
    again = cli("rm", name)
    assert (again.code, again.error_lines) == (2, [f"kickmsg rm: error: no such region: {name}"])


def test_rm_json_says_only_record_files_were_left(name):
    make(name, 4)
    open(owners.publishers_path(name), "wb").close()
    os.unlink("/dev/shm" + name)
    assert cli_json("rm", name) == {"removed": [name], "errors": {}, "types": {name: "sidecars"}}
    assert record_files(name) == []


def write_record(path: str, index: int, record: ctypes.Structure) -> None:
    """A record as a writer that then died would leave it (no lock held)."""
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
    try:
        os.pwrite(fd, bytes(record), index * ctypes.sizeof(record))
    finally:
        os.close(fd)


@pytest.mark.parametrize("layout", [4, 9])
def test_a_record_is_shown_beside_the_instance_it_names_and_an_older_versions_by_when_it_started(name, layout):
    """Stamped records: shown beside the instance whose creation stamp they
    carry only. Unstamped ones (an older version of ours wrote them, records
    of the same size): shown if their writer started after the region was
    created."""
    assert (owners.PUBLISHER_RECORD_SIZE, owners.BRIDGE_RECORD_SIZE) == (80, 256)  # an older version's files read the same
    region = make(name, layout)
    stamp = region.created_at_ns
    now = time.time_ns()
    publishers = owners.publishers_path(name)
    write_record(publishers, 0, owners.PublisherRecord(pid=101, started_at_ns=now, name=b"this", region_created_at_ns=stamp))
    write_record(publishers, 1, owners.PublisherRecord(pid=102, started_at_ns=now, name=b"earlier", region_created_at_ns=stamp - 1))
    write_record(publishers, 2, owners.PublisherRecord(pid=103, started_at_ns=now, name=b"old-after"))
    write_record(publishers, 3, owners.PublisherRecord(pid=104, started_at_ns=now - 3_600 * 10**9, name=b"old-before"))
    bridges = owners.bridges_path(name)
    write_record(bridges, 0, owners.BridgeRecord(pid=201, started_at_ns=now, direction=1, key=b"k", region_created_at_ns=stamp))
    write_record(bridges, 1, owners.BridgeRecord(pid=202, started_at_ns=now, direction=1, key=b"k", region_created_at_ns=stamp + 1))
    found = diagnostics.stats(name)
    assert [(p.pid, p.node_name, p.alive) for p in found.publishers] == [(101, "this", False), (103, "old-after", False)]
    assert [b.pid for b in found.bridges] == [201]
    assert cli_json("repair", name)["dead_publishers_reclaimed"] == [101, 103]
    assert [record.pid for record, _ in owners._read_records(publishers, owners.PublisherRecord, 8)] == [102, 104]
    del region


def test_a_publisher_that_follows_a_re_created_region_records_itself_for_the_new_one(name):
    """Layout 4, re-created in place by another process of ours: the same
    object and record file, a new creation stamp; the publisher's record
    follows it (and is not left behind as the earlier instance's)."""
    region = make(name, 4)
    publisher = Publisher(region, name="follower")
    [before] = owners._read_records(owners.publishers_path(name), owners.PublisherRecord, 8)
    assert before[0].region_created_at_ns == region.created_at_ns
    with start_ours('open_region(P); done("re-created")', name=name, how="create", config=SMALL, layout=4) as child:
        assert child.result() == "re-created"
    newer = SharedRegion.open(name)
    assert newer.created_at_ns != region.created_at_ns
    time.sleep(0.15)  # past the check-in interval: its next send follows the region
    publisher.send(b"x")
    assert publisher.rejoined == 1
    assert [(p.node_name, p.alive) for p in diagnostics.stats(name).publishers] == [("follower", True)]
    [(record, held)] = owners._read_records(owners.publishers_path(name), owners.PublisherRecord, 8)
    assert (record.region_created_at_ns, held) == (newer.created_at_ns, True)
    publisher.close()
