"""Object lifetimes and the public surface.

Objects that point into a mapping keep it alive, whatever the user drops
(regions, nodes, temporary handles); pins and unpublished slots come back
when their Python objects are collected; a thread blocked in a receive never
holds up another thread; every public object has a telling repr; and every
name of the native binding's API (WIRE.md, last section) exists here.
"""
import datetime
import gc
import inspect
import threading
import time
import weakref

import numpy as np
import pytest

import kickmsg
from kickmsg import (
    AllocatedSlot,
    BroadcastHandle,
    ChannelType,
    Config,
    HealthReport,
    Node,
    Publisher,
    SampleView,
    SchemaInfo,
    SharedRegion,
    Subscriber,
)
import rawregion
from conftest import new_shm_name

SMALL = dict(max_subscribers=2, sub_ring_capacity=4, pool_size=8, max_payload_size=64)

# Every test on layout 4 and layout 9 (the ``layout`` fixture).
pytestmark = pytest.mark.usefixtures("layout")


def small(**fields) -> Config:
    return Config(**{**SMALL, **fields})


def refcounts(name: str) -> list:
    return rawregion.pool(rawregion.read_bytes(name)).refcounts


def ring_states(name: str) -> list:
    data = rawregion.read_bytes(name)
    return [rawregion.ring(data, index).state for index in range(rawregion.header(data)["max_subs"])]


def wait_for_waiter(name: str, ring: int) -> None:
    """Bounded: until the subscriber of ``ring`` announces it sleeps."""
    for _ in range(2000):
        if rawregion.ring(rawregion.read_bytes(name), ring).has_waiter:
            return
        time.sleep(0.005)
    pytest.fail(f"the subscriber of ring {ring} never set has_waiter")


# -- mappings outlive the references the user drops ---------------------------------


def test_publisher_and_subscriber_outlive_their_region(shm_name):
    region = SharedRegion.create(shm_name, ChannelType.PubSub, small())
    pub, sub = Publisher(region), Subscriber(region)
    del region
    gc.collect()
    assert pub.send(b"after the region") == 16
    assert sub.try_receive() == b"after the region"
    slot = pub.allocate(3)
    memoryview(slot)[:] = b"abc"
    assert slot.publish() == 1
    assert sub.try_receive() == b"abc"


def test_publisher_and_subscriber_outlive_their_node(prefix, layout):
    """The handles work once the program drops its Node. On layout 4 the
    Node is gone; on layout 9 each handle keeps it (and its registry rows)
    alive, as 0.9.2's handles do."""
    node = Node("gone", prefix=prefix)
    pub = node.advertise("t", small())
    sub = node.subscribe("t")
    inbox = node.create_mailbox("inbox", small())
    node_ref = weakref.ref(node)
    del node
    gc.collect()
    assert (node_ref() is None) == (layout == 4)
    pub.send(b"x")
    assert sub.try_receive() == b"x"
    Node("sender", prefix=prefix).open_mailbox("gone", "inbox").send(b"mail")
    assert inbox.try_receive() == b"mail"


def test_publisher_outlives_unlink_and_the_region(shm_name):
    region = SharedRegion.create(shm_name, ChannelType.PubSub, small())
    pub, sub = Publisher(region), Subscriber(region)
    region.unlink()
    del region
    gc.collect()
    pub.send(b"orphaned but mapped")
    assert sub.try_receive() == b"orphaned but mapped"


def test_pub_of_a_temporary_broadcast_handle(prefix):
    """``node.join_broadcast(...).pub``: the handle and its subscriber go
    away at once (the subscriber leaves its ring), the publisher keeps
    working."""
    pub = Node("a", prefix=prefix).join_broadcast("chat", small()).pub
    gc.collect()
    name = f"/{prefix}_broadcast_chat"
    assert ring_states(name) == [0, 0]  # the temporary subscriber left
    other = Node("b", prefix=prefix).join_broadcast("chat", small())
    assert pub.send(b"from the temporary") == 18
    assert other.sub.try_receive() == b"from the temporary"
    assert ring_states(name) == [1, 0]


def test_sub_of_a_temporary_broadcast_handle(prefix):
    sub = Node("a", prefix=prefix).join_broadcast("chat", small()).sub
    gc.collect()
    Node("b", prefix=prefix).join_broadcast("chat", small()).pub.send(b"x")
    assert sub.try_receive() == b"x"


def test_view_outlives_subscriber_region_and_node(prefix):
    node = Node("n", prefix=prefix)
    pub = node.advertise("t", small())
    sub = node.subscribe("t")
    pub.send(b"kept")
    view = sub.try_receive_view()
    del node, sub, pub
    gc.collect()
    assert bytes(view) == b"kept"
    assert view.valid
    view.release()
    rawregion.assert_pool_whole(f"/{prefix}_t")


# -- pins and slots come back when collected ------------------------------------------


def test_view_dropped_without_release_gives_its_pin_back(shm_name):
    region = SharedRegion.create(shm_name, ChannelType.PubSub, small(max_subscribers=1))
    pub, sub = Publisher(region), Subscriber(region)
    pub.send(b"pinned")
    view = sub.try_receive_view()
    assert sorted(refcounts(shm_name), reverse=True)[:2] == [2, 0]  # the ring's reference + our pin
    del view
    gc.collect()
    assert sorted(refcounts(shm_name), reverse=True)[:2] == [1, 0]  # only the ring's reference
    sub.close()
    rawregion.assert_pool_whole(shm_name)


def test_view_in_a_reference_cycle_is_unpinned_by_the_collector(shm_name):
    region = SharedRegion.create(shm_name, ChannelType.PubSub, small(max_subscribers=1))
    pub, sub = Publisher(region), Subscriber(region)
    pub.send(b"cycle")
    gc.disable()  # no automatic collection before we look
    try:
        holder = [sub.try_receive_view()]
        holder.append(holder)
        del holder
        assert max(refcounts(shm_name)) == 2  # the cycle keeps it until collected
    finally:
        gc.enable()
    gc.collect()
    assert max(refcounts(shm_name)) == 1
    sub.close()
    rawregion.assert_pool_whole(shm_name)


def test_buffers_of_a_dropped_view_keep_the_pin(shm_name):
    """A memoryview or a numpy array over a view keeps the slot pinned
    after the view object itself is gone."""
    region = SharedRegion.create(shm_name, ChannelType.PubSub, small(max_subscribers=1))
    pub, sub = Publisher(region), Subscriber(region)
    pub.send(b"abcd")
    pub.send(b"efgh")
    memory = memoryview(sub.try_receive_view())
    array = np.frombuffer(sub.try_receive_view(), dtype=np.uint8)
    gc.collect()
    assert sorted(refcounts(shm_name), reverse=True)[:3] == [2, 2, 0]
    assert bytes(memory) == b"abcd" and array.tobytes() == b"efgh"
    assert memory.readonly and not array.flags.writeable
    memory.release()
    del array
    gc.collect()
    assert sorted(refcounts(shm_name), reverse=True)[:3] == [1, 1, 0]
    sub.close()
    rawregion.assert_pool_whole(shm_name)


def test_unpublished_slot_dropped_goes_back_to_the_pool(shm_name):
    region = SharedRegion.create(shm_name, ChannelType.PubSub, small())
    pub = Publisher(region)
    slot = pub.allocate(10)
    assert len(rawregion.pool(rawregion.read_bytes(shm_name)).free_slots) == 7
    del slot
    gc.collect()
    rawregion.assert_pool_whole(shm_name)


def test_dropped_subscriber_leaves_its_ring_and_drains(shm_name):
    region = SharedRegion.create(shm_name, ChannelType.PubSub, small())
    pub, sub = Publisher(region), Subscriber(region)
    for index in range(3):
        pub.send(b"%d" % index)
    assert ring_states(shm_name) == [1, 0]
    del sub
    gc.collect()
    assert ring_states(shm_name) == [0, 0]
    rawregion.assert_pool_whole(shm_name)


# -- blocking receives do not hold up other threads --------------------------------------

BLOCKING = {
    "receive": lambda sub: sub.receive(30.0),
    "receive_view": lambda sub: sub.receive_view(datetime.timedelta(seconds=30)),
    "receive_latest": lambda sub: sub.receive_latest(30.0),
}


@pytest.mark.parametrize("how", BLOCKING)
def test_thread_blocked_in_receive_does_not_stop_publishing(how):
    """One thread sleeps in a receive on a quiet channel; meanwhile this
    thread publishes and reads 200 messages on another channel, then wakes
    the sleeper with a message. Had the sleeper held the GIL, nothing here
    could run before its 30 s timeout and it would return None."""
    quiet, busy = new_shm_name("quiet"), new_shm_name("busy")
    try:
        quiet_region = SharedRegion.create(quiet, ChannelType.PubSub, small())
        busy_region = SharedRegion.create(busy, ChannelType.PubSub, small(sub_ring_capacity=256, pool_size=512))
        sleeper_sub = Subscriber(quiet_region)
        results = []

        def sleeper():
            received = BLOCKING[how](sleeper_sub)
            results.append(bytes(received) if received is not None else None)

        thread = threading.Thread(target=sleeper, daemon=True)
        thread.start()
        wait_for_waiter(quiet, 0)

        busy_pub, busy_sub = Publisher(busy_region), Subscriber(busy_region)
        for index in range(200):
            busy_pub.send(index.to_bytes(4, "little"))
        assert [int.from_bytes(data, "little") for data in busy_sub] == list(range(200))
        assert thread.is_alive()  # still asleep: nothing was sent to it

        Publisher(quiet_region).send(b"wake up")
        thread.join(30)
        assert not thread.is_alive()
        assert results == [b"wake up"]
        busy_sub.close()
        rawregion.assert_pool_whole(busy)
    finally:
        kickmsg.unlink_shm(quiet)
        kickmsg.unlink_shm(busy)


def test_several_threads_blocked_while_another_publishes(shm_name):
    """Three subscribers sleep in receive() in three threads; a fourth
    thread publishes; every sleeper gets the message."""
    region = SharedRegion.create(shm_name, ChannelType.PubSub, small(max_subscribers=3))
    subs = [Subscriber(region) for _ in range(3)]
    results = [None] * 3

    def sleeper(index):
        results[index] = subs[index].receive(30.0)

    threads = [threading.Thread(target=sleeper, args=(index,), daemon=True) for index in range(3)]
    for thread in threads:
        thread.start()
    for index in range(3):
        wait_for_waiter(shm_name, index)
    publisher = threading.Thread(target=lambda: Publisher(region).send(b"all of you"), daemon=True)
    publisher.start()
    publisher.join(30)
    for thread in threads:
        thread.join(30)
    assert not any(thread.is_alive() for thread in threads + [publisher])
    assert results == [b"all of you"] * 3


# -- reprs ----------------------------------------------------------------------------------


def test_repr_of_every_public_object(prefix):
    """Each repr names its class and the key facts."""
    node = Node("reprs", prefix=prefix)
    pub = node.advertise("t", small(pool_size=6))
    region = pub.region
    sub = node.subscribe("t")
    pub.send(b"hello")
    view = sub.try_receive_view()
    slot = pub.allocate(5)
    handle = node.join_broadcast("b", small())
    name = f"/{prefix}_t"
    expected = [
        (Config(pool_size=6), ["Config(", "pool_size=6", "max_subscribers=16"]),
        (SchemaInfo(name="demo.Pose", version=3), ["SchemaInfo(", "demo.Pose", "version=3"]),
        (region, ["SharedRegion(", name, "PubSub", "pool_size=6"]),
        (pub, ["Publisher(", name, "dropped=0"]),
        (slot, ["AllocatedSlot(", "len=5", "published=False"]),
        (sub, ["Subscriber(", name, "lost=0"]),
        (view, ["SampleView(", "len=5", "ring_pos=0", "valid=True"]),
        (node, ["Node(", "'reprs'", prefix]),
        (handle, ["BroadcastHandle(", "Publisher(", "Subscriber(", f"/{prefix}_broadcast_b"]),
        (region.diagnose(), ["HealthReport(", "live=1", "schema_stuck=False"]),
        (ChannelType.Broadcast, ["ChannelType", "Broadcast"]),
    ]
    for obj, parts in expected:
        text = repr(obj)
        for part in parts:
            assert part in text, f"{part!r} not in {text!r}"
    assert str(ChannelType.PubSub) == "ChannelType.PubSub"
    view.release()
    assert "valid=False" in repr(view)
    slot.publish()
    assert "published=True" in repr(slot)
    sub.close()
    assert "closed" in repr(sub)


# -- the native binding's API (WIRE.md) ---------------------------------------------------

API = {
    "ChannelType": ["PubSub", "Broadcast"],
    "Config": ["max_subscribers", "sub_ring_capacity", "pool_size", "max_payload_size", "commit_timeout", "schema"],
    "SchemaInfo": ["identity", "layout", "name", "version", "identity_algo", "layout_algo", "flags"],
    "HealthReport": ["locked_entries", "retired_rings", "draining_rings", "live_rings", "schema_stuck"],
    "SharedRegion": [
        "create", "open", "create_or_open", "name", "channel_type", "schema", "try_claim_schema",
        "reset_schema_claim", "diagnose", "repair_locked_entries", "reset_retired_rings",
        "reclaim_orphaned_slots", "unlink",
    ],
    "Publisher": ["send", "allocate", "dropped"],
    "AllocatedSlot": ["publish", "published", "__len__", "__buffer__"],
    "Subscriber": [
        "try_receive", "receive", "try_receive_view", "receive_view", "lost", "drain_timeouts", "__iter__",
    ],
    "SampleView": ["__len__", "__buffer__", "ring_pos", "valid", "release", "__enter__", "__exit__"],
    "BroadcastHandle": ["pub", "sub"],
    "Node": [
        "advertise", "subscribe", "advertise_or_join", "subscribe_or_create", "join_broadcast",
        "create_mailbox", "open_mailbox", "unlink_topic", "unlink_broadcast", "unlink_mailbox",
        "topic_schema", "try_claim_topic_schema", "name", "prefix",
    ],
}


def test_binding_names_exist():
    for name in list(API) + ["unlink_shm", "hash", "schema"]:
        assert hasattr(kickmsg, name), name
    assert callable(kickmsg.unlink_shm)
    assert callable(kickmsg.hash.fnv1a_64) and callable(kickmsg.hash.identity_from_fnv1a)
    assert kickmsg.hash.FNV1A_64_OFFSET_BASIS == 0xCBF29CE484222325
    assert callable(kickmsg.schema.diff)
    assert [flag.name for flag in kickmsg.schema.Diff] == [
        "Identity", "Layout", "Version", "Name", "IdentityAlgo", "LayoutAlgo",
    ]
    assert kickmsg.schema.Diff.Equal == 0


def test_binding_attributes_exist(prefix):
    """Each listed attribute is there, on instances too (properties and
    dataclass fields included)."""
    node = Node("api", prefix=prefix)
    pub = node.advertise("t", small())
    sub = node.subscribe("t")
    pub.send(b"x")
    instances = {
        "ChannelType": ChannelType,
        "Config": Config(),
        "SchemaInfo": SchemaInfo(),
        "HealthReport": pub.region.diagnose(),
        "SharedRegion": pub.region,
        "Publisher": pub,
        "AllocatedSlot": pub.allocate(1),
        "Subscriber": sub,
        "SampleView": sub.try_receive_view(),
        "BroadcastHandle": node.join_broadcast("b", small()),
        "Node": node,
    }
    for class_name, attributes in API.items():
        for attribute in attributes:
            assert hasattr(instances[class_name], attribute), f"{class_name}.{attribute}"
    assert isinstance(instances["HealthReport"], HealthReport)
    assert isinstance(instances["AllocatedSlot"], AllocatedSlot)
    assert isinstance(instances["SampleView"], SampleView)
    assert isinstance(instances["BroadcastHandle"], BroadcastHandle)


def test_binding_signatures():
    """Static constructors with creator='' and the Node/unlink_mailbox
    defaults, as in the native binding."""
    for constructor in ("create", "open", "create_or_open"):
        assert isinstance(inspect.getattr_static(SharedRegion, constructor), staticmethod), constructor
    for constructor in ("create", "create_or_open"):
        assert inspect.signature(getattr(SharedRegion, constructor)).parameters["creator"].default == ""
    assert inspect.signature(Node).parameters["prefix"].default == "kickmsg"
    assert inspect.signature(Node.unlink_mailbox).parameters["owner_node"].default is None
    assert list(inspect.signature(Node.open_mailbox).parameters) == ["self", "owner_node", "tag"]


def test_config_commit_timeout_reads_as_timedelta():
    cfg = Config()
    assert cfg.commit_timeout == datetime.timedelta(milliseconds=10)
    cfg.commit_timeout = 0.25
    assert cfg.commit_timeout == datetime.timedelta(milliseconds=250)
    cfg.commit_timeout = datetime.timedelta(seconds=2)
    assert cfg.commit_timeout == datetime.timedelta(seconds=2)
