"""Config, shm names, and SharedRegion create/open/create_or_open/unlink."""
import datetime
import mmap
import os
import struct
import time

import pytest

import rawregion
from conftest import on_layout4
from kickmsg import ChannelType, Config, Publisher, SchemaInfo, SharedRegion, Subscriber, unlink_shm
from kickmsg.region import CHECK_IN_INTERVAL_NS

CHECK_IN_INTERVAL_S = CHECK_IN_INTERVAL_NS / 1e9

SMALL = dict(max_subscribers=2, sub_ring_capacity=8, pool_size=16, max_payload_size=64)


def poke(name, offset, fmt, value):
    """Write ``value`` into the shm object ``name`` at ``offset``."""
    with open(f"/dev/shm{name}", "r+b") as file, mmap.mmap(file.fileno(), 0) as memory:
        struct.pack_into(fmt, memory, offset, value)


# -- Config -------------------------------------------------------------------------


def test_config_defaults():
    cfg = Config()
    assert cfg.max_subscribers == 16
    assert cfg.sub_ring_capacity == 64
    assert cfg.pool_size == 256
    assert cfg.max_payload_size == 4096
    assert cfg.commit_timeout == datetime.timedelta(milliseconds=10)
    assert cfg.schema is None


def test_config_attribute_assignment():
    cfg = Config()
    cfg.pool_size = 8
    cfg.max_subscribers = 1
    assert (cfg.pool_size, cfg.max_subscribers) == (8, 1)


def test_config_commit_timeout_accepts_timedelta_and_float():
    cfg = Config(commit_timeout=datetime.timedelta(milliseconds=3))
    assert cfg.commit_timeout == datetime.timedelta(milliseconds=3)
    cfg.commit_timeout = 0.25
    assert isinstance(cfg.commit_timeout, datetime.timedelta)
    assert cfg.commit_timeout == datetime.timedelta(milliseconds=250)
    cfg.commit_timeout = 1
    assert cfg.commit_timeout == datetime.timedelta(seconds=1)


@pytest.mark.parametrize("bad", ["10ms", None, True])
def test_config_commit_timeout_type(bad):
    with pytest.raises(TypeError, match="commit_timeout"):
        Config(commit_timeout=bad)


def test_config_commit_timeout_negative():
    with pytest.raises(ValueError, match="commit_timeout"):
        Config(commit_timeout=-0.1)
    with pytest.raises(ValueError, match="commit_timeout"):
        Config(commit_timeout=datetime.timedelta(seconds=-1))


@pytest.mark.parametrize("bad", [float("inf"), float("-inf"), float("nan")])
def test_config_commit_timeout_not_finite(bad):
    with pytest.raises(ValueError, match=f"commit_timeout must be a finite number of seconds, got {bad!r}"):
        Config(commit_timeout=bad)


@pytest.mark.parametrize("field", ["max_subscribers", "sub_ring_capacity", "pool_size", "max_payload_size"])
def test_config_negative_count(field):
    with pytest.raises(ValueError, match=field):
        Config(**{field: -1})
    cfg = Config()
    with pytest.raises(ValueError, match=field):
        setattr(cfg, field, -5)


@pytest.mark.parametrize("field", ["max_subscribers", "sub_ring_capacity", "pool_size", "max_payload_size"])
@pytest.mark.parametrize("bad", [1.5, "8", None, True])
def test_config_non_int_count(field, bad):
    with pytest.raises(TypeError, match=field):
        Config(**{field: bad})


def test_config_schema_type():
    with pytest.raises(TypeError, match="schema"):
        Config(schema="not a schema")
    assert Config(schema=SchemaInfo(name="x")).schema == SchemaInfo(name="x")


def test_config_unknown_field():
    with pytest.raises(AttributeError):
        Config().pool = 3


@pytest.mark.parametrize(
    "field, value, message",
    [
        ("sub_ring_capacity", 3, "sub_ring_capacity must be a power of 2"),
        ("sub_ring_capacity", 0, "sub_ring_capacity must be a power of 2"),
        ("sub_ring_capacity", 12, "sub_ring_capacity must be a power of 2"),
        ("pool_size", 0, "pool_size must be > 0"),
        ("max_subscribers", 0, "max_subscribers must be > 0"),
        ("max_payload_size", 0, "max_payload_size must be > 0"),
    ],
)
@pytest.mark.parametrize("constructor", ["create", "create_or_open"])
def test_invalid_config_rejected_on_create(shm_name, constructor, field, value, message):
    cfg = Config(**SMALL)
    setattr(cfg, field, value)
    with pytest.raises(RuntimeError, match=message):
        getattr(SharedRegion, constructor)(shm_name, ChannelType.PubSub, cfg)
    assert not os.path.exists(f"/dev/shm{shm_name}")


def test_invalid_channel_type(shm_name):
    with pytest.raises(ValueError, match="channel type"):
        SharedRegion.create(shm_name, 3, Config(**SMALL))


# -- names -------------------------------------------------------------------------

BAD_NAMES = ["noslash", "/a/b", "/", "", "/" + "x" * 299, "/a\0b", "/" + "é" * 200]  # the last: 400 bytes


@pytest.mark.parametrize("name", BAD_NAMES)
@pytest.mark.parametrize(
    "call",
    [
        lambda n: SharedRegion.create(n, ChannelType.PubSub, Config(**SMALL)),
        lambda n: SharedRegion.create_or_open(n, ChannelType.PubSub, Config(**SMALL)),
        SharedRegion.open,
        unlink_shm,
    ],
    ids=["create", "create_or_open", "open", "unlink_shm"],
)
def test_invalid_names(name, call):
    with pytest.raises(ValueError, match="followed by 1 to 254 bytes"):
        call(name)


def test_name_of_254_characters_is_valid():
    name = "/" + "k" * 254
    try:
        region = SharedRegion.create(name, ChannelType.PubSub, Config(**SMALL))
        assert region.name == name
    finally:
        unlink_shm(name)


def test_name_not_str():
    with pytest.raises(TypeError):
        SharedRegion.open(b"/bytes")


# -- create / open -------------------------------------------------------------------------


def test_create_and_describe(shm_name):
    region = SharedRegion.create(shm_name, ChannelType.PubSub, Config(**SMALL), "me")
    assert region.name == shm_name
    assert region.channel_type is ChannelType.PubSub
    text = repr(region)
    assert shm_name in text and "PubSub" in text and "pool_size=16" in text


def test_broadcast_channel_type(shm_name):
    SharedRegion.create(shm_name, ChannelType.Broadcast, Config(**SMALL))
    assert SharedRegion.open(shm_name).channel_type is ChannelType.Broadcast


def test_open_sees_created_geometry(shm_name):
    SharedRegion.create(shm_name, ChannelType.PubSub, Config(**SMALL))
    opened = SharedRegion.open(shm_name)
    g = opened.geometry
    assert (g.max_subs, g.capacity, g.pool_size, g.slot_data_size) == (2, 8, 16, 64)


def test_open_shares_messages(shm_name):
    created = SharedRegion.create(shm_name, ChannelType.PubSub, Config(**SMALL))
    subscriber = Subscriber(SharedRegion.open(shm_name))
    Publisher(created).send(b"across mappings")
    assert subscriber.try_receive() == b"across mappings"
    subscriber.close()


def test_create_replaces_existing_of_another_size(shm_name):
    """Another size: a new object; the old mapping stays valid but orphaned."""
    old = SharedRegion.create(shm_name, ChannelType.PubSub, Config(**SMALL))
    old_publisher = Publisher(old)
    SharedRegion.create(shm_name, ChannelType.Broadcast, Config(**dict(SMALL, pool_size=32)))
    reopened = SharedRegion.open(shm_name)
    assert reopened.channel_type is ChannelType.Broadcast
    assert reopened.geometry.pool_size == 32
    assert rawregion.header(rawregion.read_bytes(shm_name))["pool_size"] == 32
    # The old mapping stays usable (orphaned), and is not the new region.
    subscriber = Subscriber(reopened)
    assert old_publisher.send(b"old") == 3
    assert subscriber.try_receive() is None
    subscriber.close()
    assert old.mapping.is_replaced() and not reopened.mapping.is_replaced()


@on_layout4
def test_create_of_the_same_size_reinitialises_in_place(shm_name):
    """The same layout: the same object is re-initialised, as 0.1.0 does, so
    a process still attached sees the new region: its rings, free stack and
    creator, and can subscribe and publish on it. Beyond 0.1.0, the ring of
    a live subscriber of this package stays Live for it: it reads on in the
    new region from position 0."""
    old = SharedRegion.create(shm_name, ChannelType.PubSub, Config(**SMALL), "first")
    kept_subscriber = Subscriber(old)
    Publisher(old).send(b"before")
    SharedRegion.create(shm_name, ChannelType.PubSub, Config(**SMALL), "second")
    assert not old.mapping.is_replaced() and old.replaced()
    h = rawregion.header(rawregion.read_bytes(shm_name))
    assert h["creator_name"] == "second"
    rings = [rawregion.ring(rawregion.read_bytes(shm_name), index) for index in range(2)]
    # Ring 0 kept Live at its position, its one entry committed empty; ring 1 Free.
    assert [(ring.state, ring.write_pos) for ring in rings] == [(1, 1), (0, 0)]
    assert rings[0].entries[0] == (1, 0xFFFFFFFF, 0)
    rawregion.assert_pool_whole(shm_name)
    fresh = Subscriber(old)  # through the stale object: it opens what the name leads to
    assert fresh.region is not old and not fresh.region.replaced()
    Publisher(SharedRegion.open(shm_name)).send(b"after")
    assert fresh.try_receive() == b"after"
    assert kept_subscriber.try_receive() == b"after"  # its unread b"before" went with the old region: lost
    assert kept_subscriber.lost == 1
    Publisher(old).send(b"still mine")  # a publisher made from the stale object follows the name too
    assert fresh.try_receive() == b"still mine"
    time.sleep(CHECK_IN_INTERVAL_S)  # the kept subscriber notices at its next check-in
    assert kept_subscriber.try_receive() == b"still mine"
    assert (kept_subscriber.rejoined, kept_subscriber.lost, kept_subscriber.try_receive()) == (1, 1, None)
    kept_subscriber.close()
    fresh.close()
    assert [rawregion.ring(rawregion.read_bytes(shm_name), index).state for index in range(2)] == [0, 0]
    rawregion.assert_pool_whole(shm_name)


def test_create_of_another_layout_makes_a_new_object_even_of_the_same_size(shm_name):
    """Four rings and 12 slots take exactly as many bytes as two rings and
    16 slots, but lie elsewhere: such a region is not re-initialised in
    place (a process attached to the old object would run its flows at
    offsets that mean something else now) but made as a new object."""
    old = SharedRegion.create(shm_name, ChannelType.PubSub, Config(**SMALL))
    other = SharedRegion.create(shm_name, ChannelType.PubSub, Config(**dict(SMALL, max_subscribers=4, pool_size=12)))
    assert other.geometry.total_size == old.geometry.total_size
    assert other.geometry.pool_offset != old.geometry.pool_offset
    assert old.mapping.is_replaced() and old.replaced()


def test_open_missing(shm_name):
    with pytest.raises(RuntimeError) as info:
        SharedRegion.open(shm_name)
    assert isinstance(info.value, FileNotFoundError)
    assert shm_name in str(info.value)


def test_open_bad_magic(shm_name):
    SharedRegion.create(shm_name, ChannelType.PubSub, Config(**SMALL))
    poke(shm_name, 0, "<Q", 0x1234)
    with pytest.raises(RuntimeError, match="bad magic") as info:
        SharedRegion.open(shm_name)
    assert shm_name in str(info.value)


def test_open_not_a_region(shm_name):
    with open(f"/dev/shm{shm_name}", "wb") as file:
        file.write(b"hello, not kickmsg" * 100)
    with pytest.raises(RuntimeError, match="bad magic"):
        SharedRegion.open(shm_name)


@pytest.mark.parametrize("version", [3, 5, 0])
def test_open_version_mismatch(shm_name, version):
    SharedRegion.create(shm_name, ChannelType.PubSub, Config(**SMALL))
    poke(shm_name, 8, "<I", version)
    with pytest.raises(RuntimeError, match="Version mismatch") as info:
        SharedRegion.open(shm_name)
    assert shm_name in str(info.value)


# -- create_or_open -----------------------------------------------------------------------------


def test_create_or_open_creates(shm_name):
    region = SharedRegion.create_or_open(shm_name, ChannelType.PubSub, Config(**SMALL), "first")
    h = rawregion.header(rawregion.read_bytes(shm_name))
    assert h["magic"] == 0x4B49434B4D534721
    assert h["creator_name"] == "first"
    assert region.geometry.pool_size == 16


def test_create_or_open_joins_same_config(shm_name):
    first = SharedRegion.create_or_open(shm_name, ChannelType.PubSub, Config(**SMALL), "first")
    second = SharedRegion.create_or_open(shm_name, ChannelType.PubSub, Config(**SMALL), "second")
    # The existing region is kept: creator name unchanged, messages shared.
    assert rawregion.header(rawregion.read_bytes(shm_name))["creator_name"] == "first"
    subscriber = Subscriber(second)
    Publisher(first).send(b"joined")
    assert subscriber.try_receive() == b"joined"
    subscriber.close()


def test_create_or_open_ignores_schema(shm_name):
    SharedRegion.create_or_open(shm_name, ChannelType.PubSub, Config(**SMALL, schema=SchemaInfo(name="a")))
    SharedRegion.create_or_open(shm_name, ChannelType.PubSub, Config(**SMALL, schema=SchemaInfo(name="b")))


@pytest.mark.parametrize(
    "type_, changes",
    [
        (ChannelType.PubSub, dict(pool_size=32)),
        (ChannelType.PubSub, dict(max_subscribers=3)),
        (ChannelType.PubSub, dict(sub_ring_capacity=4)),
        (ChannelType.PubSub, dict(max_payload_size=65)),
        (ChannelType.PubSub, dict(commit_timeout=0.5)),
        (ChannelType.Broadcast, dict()),
    ],
)
def test_create_or_open_config_mismatch(shm_name, type_, changes):
    SharedRegion.create(shm_name, ChannelType.PubSub, Config(**SMALL))
    with pytest.raises(RuntimeError, match=f"Config mismatch on existing region: {shm_name}"):
        SharedRegion.create_or_open(shm_name, type_, Config(**dict(SMALL, **changes)))


@pytest.mark.timeout(30)
def test_create_or_open_times_out_without_magic(shm_name):
    """An object whose creator never stores the magic: ~2 s of polling."""
    with open(f"/dev/shm{shm_name}", "wb") as file:
        file.write(bytes(4096))
    with pytest.raises(RuntimeError, match=f"Timed out waiting for region init: {shm_name}"):
        SharedRegion.create_or_open(shm_name, ChannelType.PubSub, Config(**SMALL))


# -- unlink ---------------------------------------------------------------------------------


def test_region_unlink(shm_name):
    region = SharedRegion.create(shm_name, ChannelType.PubSub, Config(**SMALL))
    subscriber = Subscriber(region)
    region.unlink()
    assert not os.path.exists(f"/dev/shm{shm_name}")
    with pytest.raises(FileNotFoundError):
        SharedRegion.open(shm_name)
    # The mapping outlives the name.
    Publisher(region).send(b"still mapped")
    assert subscriber.try_receive() == b"still mapped"
    subscriber.close()
    region.unlink()  # absent: no error


def test_unlink_shm(shm_name):
    SharedRegion.create(shm_name, ChannelType.PubSub, Config(**SMALL))
    unlink_shm(shm_name)
    assert not os.path.exists(f"/dev/shm{shm_name}")
    unlink_shm(shm_name)  # absent: no error
