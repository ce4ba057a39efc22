"""Replacing a channel of the other layout warns, naming the live processes
that map it: ``Node.advertise`` on layout 9 over a layout-4 channel a native
0.1.0 publisher holds keeps 0.9.2's "advertise replaces", but the native
process, which cannot follow the name to a layout-9 region, is named (pid
and command), with the layouts, as a Python warning and on the CLI's
stderr. Real native 0.1.0 processes."""
import os
import warnings

import pytest

from kickmsg import ChannelType, Config, Node, SharedRegion, shm
from kickmsg import owners
from nativepeer import start_native
from test_cli import cli

pytestmark = pytest.mark.timeout(120)

SMALL = {"max_subscribers": 2, "sub_ring_capacity": 8, "pool_size": 16, "max_payload_size": 64}

# Creates (or opens, with P["open"]) a layout-4 channel under each name and
# publishes into each, then waits to be told to go.
NATIVE_PUBLISHERS = r"""
def region(name):
    if P.get("open"):
        return kickmsg.SharedRegion.open(name)
    return kickmsg.SharedRegion.create(name, kickmsg.ChannelType.PubSub, make_config(P["config"]), "native")

publishers = [kickmsg.Publisher(region(name)) for name in P["names"]]
for publisher in publishers:
    publisher.send(b"from 0.1.0")
ready()
wait_go()
done("ok")
"""


@pytest.fixture
def namespace():
    """A namespace of this module's own; every object under it (channels,
    sidecars, its registry) is removed after the test."""
    value = f"hrd_layouts_{os.getpid()}"
    yield value
    for entry in os.scandir(shm.SHM_DIRECTORY):
        if entry.name.startswith(value):
            os.unlink(entry.path)


def test_advertise_on_layout_9_over_a_layout_4_channel_a_native_publisher_holds_names_it(namespace):
    topic, by_cli = f"/{namespace}_imu", f"/{namespace}_odom"
    with start_native(NATIVE_PUBLISHERS, names=[topic, by_cli], config=SMALL) as native:
        native.wait_ready()
        with open(f"/proc/{native.proc.pid}/comm") as comm:
            command = comm.read().strip()
        said = (f"replacing a layout-4 channel that process {native.proc.pid} ({command}) still maps: they cannot follow "
                f"its name to the new layout-9 region and go on in the old one unseen (stop them first, or join the "
                f"channel with layout=4)")
        node = Node("replacer", namespace=namespace, layout=9)
        with pytest.warns(RuntimeWarning) as caught:
            publisher = node.advertise("imu", Config(**SMALL))
        [warning] = [w for w in caught if "replacing" in str(w.message)]
        assert str(warning.message) == f"{topic}: {said}"
        assert warning.filename == __file__  # it points at the advertise call
        assert SharedRegion.open(topic).layout == 9  # replaced all the same

        result = cli("create", by_cli, "--replace", "--layout", "9")
        assert result.code == 0 and f"kickmsg create: warning: {by_cli}: {said}" in result.error_lines
        native.tell()
        assert native.result() == "ok"
    del publisher

    SharedRegion.create(by_cli, ChannelType.PubSub, Config(**SMALL), layout=4)  # nobody else maps it now
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        SharedRegion.create(by_cli, ChannelType.PubSub, Config(**SMALL), layout=9)
    owners.unlink(by_cli)


def test_the_processes_mapping_an_object_are_found_and_never_this_one(namespace):
    """``shm.processes_mapping``: the other processes mapping the object the
    name leads to (found by its device and inode in /proc/PID/maps)."""
    name = f"/{namespace}_held"
    region = SharedRegion.create(name, ChannelType.PubSub, Config(**SMALL), layout=4)
    assert shm.processes_mapping(name) == []  # this process maps it, and does not count
    with start_native(NATIVE_PUBLISHERS, names=[name], open=True) as native:
        native.wait_ready()
        assert shm.processes_mapping(name) == [native.proc.pid]
        native.tell()
        native.result()
    assert shm.processes_mapping(name) == []
    assert shm.processes_mapping(f"/{namespace}_absent") == []
    del region
