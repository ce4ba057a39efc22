"""Node: naming, the three channel patterns, region reuse, unlinking and
topic schemas, as native kickmsg 0.1.0's Node behaves.

Names are checked in /dev/shm and headers with the independent ``rawregion``
reader. Every test uses a prefix of its own under the session prefix, so
everything it creates is removed afterwards.
"""
import pathlib

import pytest

from kickmsg import BroadcastHandle, ChannelType, Config, Node, Publisher, SchemaInfo, Subscriber
import rawregion
from conftest import SESSION_PREFIX, layout4_only

SMALL = dict(max_subscribers=4, sub_ring_capacity=4, pool_size=16, max_payload_size=64)

# Every test on layout 4 and layout 9 (the ``layout`` fixture), but those marked layout4_only.
pytestmark = pytest.mark.usefixtures("layout")


def small(**fields) -> Config:
    return Config(**{**SMALL, **fields})


def exists(name: str) -> bool:
    return pathlib.Path(f"/dev/shm{name}").exists()


def header(name: str) -> dict:
    return rawregion.header(rawregion.read_bytes(name))


def drain(sub: Subscriber) -> list:
    return list(sub)


# -- the node itself -------------------------------------------------------------


def test_name_and_prefix():
    node = Node("driver", prefix="robot")
    assert (node.name, node.prefix) == ("driver", "robot")
    assert Node("driver").prefix == "kickmsg"


def test_name_and_prefix_must_be_strings():
    with pytest.raises(TypeError):
        Node(b"driver")
    with pytest.raises(TypeError):
        Node("driver", prefix=None)


def test_default_prefix_names_topics_kickmsg():
    """With no prefix, a topic is /kickmsg_{topic} (on layout 9 the node
    also makes /kickmsg_registry: removed after, unless it was there before)."""
    node = Node("default-prefix")
    topic = f"{SESSION_PREFIX}_default"
    registry_was_there = exists("/kickmsg_registry")
    try:
        node.advertise(topic, small())
        assert exists(f"/kickmsg_{topic}")
    finally:
        node.unlink_topic(topic)
        if not registry_was_there:
            pathlib.Path("/dev/shm/kickmsg_registry").unlink(missing_ok=True)
    assert not exists(f"/kickmsg_{topic}")


def test_repr(prefix):
    node = Node("driver", prefix=prefix)
    node.advertise("imu", small())
    text = repr(node)
    assert text.startswith("Node(")
    assert "'driver'" in text and repr(prefix) in text
    assert f"/{prefix}_imu" in text  # the regions it has mapped


# -- PubSub ------------------------------------------------------------------------


def test_advertise_creates_the_topic(prefix):
    """advertise creates /{prefix}_{topic}, with the node as creator."""
    pub = Node("driver", prefix=prefix).advertise("imu", small(pool_size=12))
    assert isinstance(pub, Publisher)
    name = f"/{prefix}_imu"
    assert exists(name)
    assert pub.region.name == name
    assert pub.region.channel_type == ChannelType.PubSub
    h = header(name)
    assert (h["creator_name"], h["channel_type"], h["pool_size"], h["max_subs"]) == ("driver", 1, 12, 4)


def test_advertise_default_config(prefix):
    Node("driver", prefix=prefix).advertise("imu")
    h = header(f"/{prefix}_imu")
    assert (h["max_subs"], h["sub_ring_capacity"], h["pool_size"], h["slot_data_size"]) == (16, 64, 256, 4096)
    assert h["commit_timeout_us"] == 10_000


def test_subscribe_opens_the_topic(prefix):
    """Another node's subscribe opens the region and receives."""
    pub = Node("driver", prefix=prefix).advertise("imu", small())
    sub = Node("logger", prefix=prefix).subscribe("imu")
    assert isinstance(sub, Subscriber)
    assert sub.region.name == f"/{prefix}_imu"
    assert pub.send(b"sample") == 6
    assert sub.try_receive() == b"sample"
    assert header(f"/{prefix}_imu")["creator_name"] == "driver"  # not re-created


def test_subscribe_to_a_missing_topic_raises(prefix):
    with pytest.raises(RuntimeError, match=f"/{prefix}_nothing"):
        Node("logger", prefix=prefix).subscribe("nothing")
    assert not exists(f"/{prefix}_nothing")


@layout4_only
def test_topic_with_a_slash_is_refused(prefix):
    """Names are not sanitised: a '/' makes an invalid shm name."""
    node = Node("driver", prefix=prefix)
    calls = [
        lambda: node.advertise("a/b", small()),
        lambda: node.subscribe("a/b"),
        lambda: node.advertise_or_join("a/b", small()),
        lambda: node.subscribe_or_create("a/b", small()),
        lambda: node.join_broadcast("a/b", small()),
        lambda: node.create_mailbox("a/b", small()),
        lambda: node.open_mailbox("other", "a/b"),
        lambda: node.unlink_topic("a/b"),
    ]
    for call in calls:
        with pytest.raises(ValueError, match="invalid shared-memory name"):
            call()
    with pytest.raises(ValueError, match="invalid shared-memory name"):
        Node("a/b", prefix=prefix).create_mailbox("inbox", small())
    assert not list(pathlib.Path("/dev/shm").glob(f"{prefix}_*"))


def test_advertise_replaces_an_existing_topic(prefix):
    """advertise always creates: a second advertise replaces the region and
    the node maps the new one."""
    driver, logger = Node("driver", prefix=prefix), Node("logger", prefix=prefix)
    name = f"/{prefix}_imu"
    first = driver.advertise("imu", small(pool_size=8))
    old_sub = logger.subscribe("imu")
    second = driver.advertise("imu", small(pool_size=12))
    assert second.region is not first.region
    assert header(name)["pool_size"] == 12
    new_sub = driver.subscribe("imu")
    assert new_sub.region is second.region
    second.send(b"new")
    assert new_sub.try_receive() == b"new"
    old_sub.try_receive()  # still safe to use

    third = logger.advertise("imu", small(pool_size=8))  # another node replaces it too
    assert header(name)["creator_name"] == "logger"
    assert logger.subscribe("imu").region is third.region


def test_resubscribe_after_another_node_re_advertised(prefix):
    """A publisher restarts (re-advertises); a node that had subscribed
    subscribes again and receives the new publisher's messages, as with
    native 0.1.0."""
    cfg = small()
    Node("first-run", prefix=prefix).advertise("t", cfg)
    reader = Node("reader", prefix=prefix)
    reader.subscribe("t").close()
    restarted = Node("second-run", prefix=prefix).advertise("t", cfg)
    sub = reader.subscribe("t")
    restarted.send(b"after restart")
    assert sub.try_receive() == b"after restart"


def test_node_reuses_the_region_it_mapped(prefix):
    """subscribe on the node that advertised uses that very region; another
    node maps its own."""
    driver = Node("driver", prefix=prefix)
    pub = driver.advertise("imu", small())
    first, second = driver.subscribe("imu"), driver.subscribe("imu")
    assert first.region is pub.region and second.region is pub.region
    other = Node("logger", prefix=prefix).subscribe("imu")
    assert other.region is not pub.region
    assert other.region.name == pub.region.name
    pub.send(b"x")
    assert [first.try_receive(), second.try_receive(), other.try_receive()] == [b"x"] * 3


def test_advertise_or_join_creates_then_joins(prefix):
    """The first advertise_or_join creates the topic, later ones (other
    nodes, same config) join it; both publishers reach one subscriber."""
    a, b = Node("a", prefix=prefix), Node("b", prefix=prefix)
    pub_a = a.advertise_or_join("t", small())
    assert header(f"/{prefix}_t")["creator_name"] == "a"
    pub_b = b.advertise_or_join("t", small())
    assert header(f"/{prefix}_t")["creator_name"] == "a"
    sub = Node("c", prefix=prefix).subscribe("t")
    pub_a.send(b"from a")
    pub_b.send(b"from b")
    assert drain(sub) == [b"from a", b"from b"]


def test_advertise_or_join_with_another_config(prefix):
    """Another node with a different config is refused; the node that
    mapped the region reuses it whatever config it passes."""
    a = Node("a", prefix=prefix)
    pub = a.advertise_or_join("t", small())
    with pytest.raises(RuntimeError, match=f"Config mismatch on existing region: /{prefix}_t"):
        Node("b", prefix=prefix).advertise_or_join("t", small(pool_size=8))
    again = a.advertise_or_join("t", small(pool_size=8))
    assert again.region is pub.region
    assert again.region.geometry.pool_size == 16


def test_subscribe_or_create_creates_then_opens(prefix):
    a, b = Node("a", prefix=prefix), Node("b", prefix=prefix)
    sub = a.subscribe_or_create("t", small())
    assert isinstance(sub, Subscriber)
    assert exists(f"/{prefix}_t")
    assert header(f"/{prefix}_t")["creator_name"] == "a"
    pub = b.advertise_or_join("t", small())
    other = b.subscribe_or_create("t", small())
    pub.send(b"m")
    assert sub.try_receive() == b"m"
    assert other.try_receive() == b"m"


def test_subscribe_or_create_with_another_config(prefix):
    """Same node: no error (its mapping is reused). Another node: the
    native error message."""
    a = Node("a", prefix=prefix)
    first = a.subscribe_or_create("t", small())
    second = a.subscribe_or_create("t", small(max_payload_size=32, sub_ring_capacity=16))
    assert second.region is first.region
    with pytest.raises(RuntimeError, match=f"^Config mismatch on existing region: /{prefix}_t"):
        Node("b", prefix=prefix).subscribe_or_create("t", small(max_payload_size=32))


def test_subscribe_after_subscribe_or_create_reuses(prefix):
    a = Node("a", prefix=prefix)
    created = a.subscribe_or_create("t", small())
    assert a.subscribe("t").region is created.region
    assert a.advertise_or_join("t", small()).region is created.region


# -- Broadcast --------------------------------------------------------------------


def test_join_broadcast_names_and_type(prefix):
    handle = Node("a", prefix=prefix).join_broadcast("chat", small())
    assert isinstance(handle, BroadcastHandle)
    assert isinstance(handle.pub, Publisher) and isinstance(handle.sub, Subscriber)
    name = f"/{prefix}_broadcast_chat"
    assert exists(name)
    assert handle.pub.region is handle.sub.region
    assert handle.pub.region.name == name
    assert handle.pub.region.channel_type == ChannelType.Broadcast
    h = header(name)
    assert (h["channel_type"], h["creator_name"]) == (2, "a")


def test_broadcast_members_receive_their_own_and_the_others_messages(prefix):
    a = Node("a", prefix=prefix).join_broadcast("chat", small())
    b = Node("b", prefix=prefix).join_broadcast("chat", small())
    assert header(f"/{prefix}_broadcast_chat")["creator_name"] == "a"
    a.pub.send(b"hello from a")
    b.pub.send(b"hello from b")
    assert drain(a.sub) == [b"hello from a", b"hello from b"]
    assert drain(b.sub) == [b"hello from a", b"hello from b"]


def test_join_broadcast_default_config(prefix):
    Node("a", prefix=prefix).join_broadcast("chat")
    h = header(f"/{prefix}_broadcast_chat")
    assert (h["max_subs"], h["pool_size"], h["slot_data_size"], h["channel_type"]) == (16, 256, 4096, 2)


def test_join_broadcast_twice_on_one_node(prefix):
    """The node reuses its region; each handle has a subscriber of its own."""
    node = Node("a", prefix=prefix)
    first, second = node.join_broadcast("chat", small()), node.join_broadcast("chat", small())
    assert first.pub.region is second.pub.region
    first.pub.send(b"x")
    assert (first.sub.try_receive(), second.sub.try_receive()) == (b"x", b"x")


def test_join_broadcast_config_mismatch(prefix):
    Node("a", prefix=prefix).join_broadcast("chat", small())
    with pytest.raises(RuntimeError, match=f"Config mismatch on existing region: /{prefix}_broadcast_chat"):
        Node("b", prefix=prefix).join_broadcast("chat", small(pool_size=8))


def test_join_broadcast_on_a_pubsub_region_of_that_name_is_refused(prefix):
    """The channel type is part of the config hash."""
    Node("a", prefix=prefix).advertise("broadcast_chat", small())  # same shm name, PubSub
    with pytest.raises(RuntimeError, match="Config mismatch"):
        Node("b", prefix=prefix).join_broadcast("chat", small())


def test_topic_and_broadcast_of_one_name_are_separate(prefix):
    node = Node("a", prefix=prefix)
    pub = node.advertise("x", small())
    handle = node.join_broadcast("x", small())
    assert pub.region.name == f"/{prefix}_x"
    assert handle.pub.region.name == f"/{prefix}_broadcast_x"
    pub.send(b"topic")
    assert handle.sub.try_receive() is None


def test_broadcast_handle_repr(prefix):
    handle = Node("a", prefix=prefix).join_broadcast("chat", small())
    text = repr(handle)
    assert text.startswith("BroadcastHandle(")
    assert "Publisher(" in text and "Subscriber(" in text
    assert f"/{prefix}_broadcast_chat" in text


# -- Mailbox ----------------------------------------------------------------------


def test_create_mailbox_has_one_subscriber_slot(prefix):
    """create_mailbox forces max_subscribers to 1 (the owner) and keeps the
    rest of the config; the caller's Config is not changed."""
    cfg = small(max_subscribers=8, pool_size=12)
    inbox = Node("owner", prefix=prefix).create_mailbox("inbox", cfg)
    assert isinstance(inbox, Subscriber)
    name = f"/{prefix}_owner_mbx_inbox"
    assert exists(name)
    assert inbox.region.name == name
    h = header(name)
    assert (h["max_subs"], h["pool_size"], h["channel_type"], h["creator_name"]) == (1, 12, 1, "owner")
    assert cfg.max_subscribers == 8
    with pytest.raises(RuntimeError, match="No free subscriber slots"):
        Subscriber(inbox.region)


def test_create_mailbox_default_config(prefix):
    Node("owner", prefix=prefix).create_mailbox("inbox")
    h = header(f"/{prefix}_owner_mbx_inbox")
    assert (h["max_subs"], h["pool_size"], h["slot_data_size"]) == (1, 256, 4096)


def test_mailbox_messages_reach_the_owner(prefix):
    owner = Node("owner", prefix=prefix)
    inbox = owner.create_mailbox("inbox", small())
    sender = Node("sender", prefix=prefix).open_mailbox("owner", "inbox")
    assert isinstance(sender, Publisher)
    assert sender.region.name == f"/{prefix}_owner_mbx_inbox"
    sender.send(b"request 1")
    Node("third", prefix=prefix).open_mailbox("owner", "inbox").send(b"request 2")
    assert drain(inbox) == [b"request 1", b"request 2"]


def test_a_second_subscriber_on_another_node_is_refused(prefix):
    """While the owner reads its mailbox, nobody else can subscribe to it."""
    inbox = Node("owner", prefix=prefix).create_mailbox("inbox", small())
    sender = Node("sender", prefix=prefix).open_mailbox("owner", "inbox")
    with pytest.raises(RuntimeError, match="No free subscriber slots"):
        Subscriber(sender.region)
    inbox.close()  # the owner leaves: its slot is free again
    Subscriber(sender.region).close()


def test_open_missing_mailbox_raises(prefix):
    with pytest.raises(RuntimeError, match=f"/{prefix}_nobody_mbx_inbox"):
        Node("sender", prefix=prefix).open_mailbox("nobody", "inbox")


def test_create_mailbox_replaces_an_existing_one(prefix):
    owner = Node("owner", prefix=prefix)
    first = owner.create_mailbox("inbox", small())
    second = owner.create_mailbox("inbox", small(pool_size=8))
    assert second.region is not first.region
    assert header(f"/{prefix}_owner_mbx_inbox")["pool_size"] == 8
    assert owner.open_mailbox("owner", "inbox").region is second.region  # reuses the newest


# -- unlinking --------------------------------------------------------------------


def test_unlink_topic_removes_only_the_name(prefix):
    """The node keeps its mapping (subscribe still works there); a node that
    never mapped the topic can no longer find it."""
    driver = Node("driver", prefix=prefix)
    pub = driver.advertise("imu", small())
    driver.unlink_topic("imu")
    assert not exists(f"/{prefix}_imu")
    sub = driver.subscribe("imu")
    assert sub.region is pub.region
    pub.send(b"still here")
    assert sub.try_receive() == b"still here"
    with pytest.raises(RuntimeError):
        Node("logger", prefix=prefix).subscribe("imu")


def test_unlink_of_absent_names_is_no_error(prefix):
    node = Node("a", prefix=prefix)
    node.unlink_topic("never")
    node.unlink_broadcast("never")
    node.unlink_mailbox("never")
    node.unlink_mailbox("never", owner_node="someone")
    node.advertise("t", small())
    node.unlink_topic("t")
    node.unlink_topic("t")  # twice


def test_unlink_broadcast(prefix):
    node = Node("a", prefix=prefix)
    handle = node.join_broadcast("chat", small())
    node.unlink_broadcast("chat")
    assert not exists(f"/{prefix}_broadcast_chat")
    handle.pub.send(b"x")  # the mapping lives on
    assert handle.sub.try_receive() == b"x"


def test_unlink_mailbox_own_and_other(prefix):
    owner, other = Node("owner", prefix=prefix), Node("other", prefix=prefix)
    owner.create_mailbox("a", small())
    owner.create_mailbox("b", small())
    other.create_mailbox("a", small())
    owner.unlink_mailbox("a")  # owner_node defaults to this node
    assert not exists(f"/{prefix}_owner_mbx_a")
    assert exists(f"/{prefix}_other_mbx_a")
    other.unlink_mailbox("b", owner_node="owner")
    assert not exists(f"/{prefix}_owner_mbx_b")
    other.unlink_mailbox("a", None)
    assert not exists(f"/{prefix}_other_mbx_a")


def test_unlink_topic_leaves_broadcast_and_mailbox_alone(prefix):
    node = Node("n", prefix=prefix)
    node.advertise("x", small())
    node.join_broadcast("x", small())
    node.create_mailbox("x", small())
    node.unlink_topic("x")
    assert exists(f"/{prefix}_broadcast_x")
    assert exists(f"/{prefix}_n_mbx_x")


# -- topic schemas ------------------------------------------------------------------

POSE = SchemaInfo(name="demo.Pose", version=2, identity=b"\x01" * 64, layout=b"\x02" * 64)


def test_topic_schema_baked_in_by_advertise(prefix):
    driver = Node("driver", prefix=prefix)
    driver.advertise("pose", small(schema=POSE))
    assert driver.topic_schema("pose") == POSE
    assert header(f"/{prefix}_pose")["schema_state"] == 2


def test_topic_schema_is_none_for_a_topic_the_node_never_mapped(prefix):
    """Even when the topic exists and has a schema."""
    Node("driver", prefix=prefix).advertise("pose", small(schema=POSE))
    logger = Node("logger", prefix=prefix)
    assert logger.topic_schema("pose") is None
    assert logger.topic_schema("no-such-topic") is None
    logger.subscribe("pose")
    assert logger.topic_schema("pose") == POSE


def test_topic_schema_is_none_when_unset(prefix):
    node = Node("driver", prefix=prefix)
    node.advertise("pose", small())
    assert node.topic_schema("pose") is None


def test_try_claim_topic_schema(prefix):
    """A node claims the schema of a topic it mapped; the first claim wins
    and every node that maps the topic sees it."""
    driver, logger = Node("driver", prefix=prefix), Node("logger", prefix=prefix)
    driver.advertise("pose", small())
    logger.subscribe("pose")
    assert logger.try_claim_topic_schema("pose", POSE) is True
    assert driver.try_claim_topic_schema("pose", SchemaInfo(name="other")) is False
    assert driver.topic_schema("pose") == POSE
    assert logger.topic_schema("pose") == POSE
    late = Node("late", prefix=prefix)
    late.subscribe_or_create("pose", small())
    assert late.topic_schema("pose") == POSE


def test_try_claim_topic_schema_on_a_topic_never_mapped(prefix):
    """Returns False and does not touch the region."""
    Node("driver", prefix=prefix).advertise("pose", small())
    outsider = Node("outsider", prefix=prefix)
    assert outsider.try_claim_topic_schema("pose", POSE) is False
    assert outsider.try_claim_topic_schema("no-such-topic", POSE) is False
    assert header(f"/{prefix}_pose")["schema_state"] == 0
    assert not exists(f"/{prefix}_no-such-topic")


def test_topic_schema_after_advertise_replaced_the_topic(prefix):
    """The node follows its newest advertise: the new region's schema."""
    node = Node("driver", prefix=prefix)
    node.advertise("pose", small(schema=POSE))
    node.advertise("pose", small())
    assert node.topic_schema("pose") is None
