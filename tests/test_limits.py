"""Configs that would hurt the machine or cannot work, refused before
anything is created; the memory of a new region reserved at once; the
reason of an empty pool; names that would clash with sidecars.

The real out-of-space paths run in a child process with a private 1 MiB
``/dev/shm`` (a tmpfs mounted in its own mount namespace: ``unshare``), so
that the kernel itself says ENOSPC.
"""
import os
import re
import subprocess
import sys
import warnings

import pytest

import nativepeer
import rawregion
import kickmsg
from conftest import on_layout4
from kickmsg import ChannelType, Config, ConfigError, Node, Publisher, SharedRegion, Subscriber, audit, shm, typed, unlink_shm
from kickmsg.config import MAX_POOL_SIZE, MAX_SUBSCRIBERS
from tinyshm import run_on_a_tiny_dev_shm

# These tests check layout 4's own: its bounds and sidecars, and 0.1.0's config checks.
pytestmark = on_layout4

SMALL = dict(max_subscribers=2, sub_ring_capacity=8, pool_size=16, max_payload_size=64)
HUGE = dict(pool_size=10**7, max_payload_size=10**6)  # 9.1 TiB: the config that took a machine down


def shm_entries(name: str) -> list[str]:
    """What /dev/shm holds under this name (the region and its sidecar)."""
    base = name.lstrip("/")
    return sorted(entry for entry in os.listdir("/dev/shm") if entry in (base, base + ".kickmsg-subscribers"))


# -- 1. a region larger than the machine can give it ---------------------------------------


@pytest.mark.parametrize("how", ["create", "create_or_open", "advertise", "typed.advertise"])
def test_a_region_larger_than_the_room_is_refused_before_anything_exists(shm_name, how):
    """9.1 TiB is refused with a ValueError naming the fields, the size and
    the room, whichever way the region would be created; nothing is left
    in /dev/shm (no object, no sidecar)."""
    cfg = Config(**HUGE)
    with pytest.raises(ValueError) as info:
        if how == "create":
            SharedRegion.create(shm_name, ChannelType.PubSub, cfg)
        elif how == "create_or_open":
            SharedRegion.create_or_open(shm_name, ChannelType.PubSub, cfg)
        else:
            node = Node("big", prefix=shm_name.lstrip("/"))
            if how == "advertise":
                node.advertise("t", cfg)
            else:
                typed.advertise(node, "t", typed.RecordType("R", [("x", "<u8")]), cfg)
    message = str(info.value)
    assert "pool_size=10000000" in message and "max_payload_size=1000000" in message
    assert "9.1 TiB (100006400" in message and "bytes: pool_size=10000000 slots of 1000064 bytes" in message
    room, limit = shm.room_for_new_object()
    assert limit in message
    assert shm_entries(shm_name) == [] and shm_entries(shm_name + "_t") == []


def test_opening_or_reinitialising_an_existing_region_needs_no_room(shm_name, monkeypatch):
    """Opening a region that exists takes no memory, nor does re-creating
    it in place (its pages are already held): a lack of room only stops a
    region that needs new memory."""
    SharedRegion.create(shm_name, ChannelType.PubSub, Config(**SMALL))
    monkeypatch.setattr(shm, "room_for_new_object", lambda: (0, "free in /dev/shm"))
    opened = SharedRegion.create_or_open(shm_name, ChannelType.PubSub, Config(**SMALL))
    assert opened.geometry.pool_size == 16
    assert not SharedRegion.create(shm_name, ChannelType.PubSub, Config(**SMALL)).mapping.is_replaced()
    with pytest.raises(ValueError, match="only 0 bytes are free in /dev/shm"):
        SharedRegion.create(shm_name + "_other", ChannelType.PubSub, Config(**SMALL))
    with pytest.raises(ValueError, match="only 0 bytes are free in /dev/shm"):
        SharedRegion.create(shm_name, ChannelType.PubSub, Config(**dict(SMALL, pool_size=64)))  # a new object
    assert shm_entries(shm_name + "_other") == []


def test_a_new_region_has_its_memory_reserved(shm_name):
    """Every page of a new region is allocated at create (posix_fallocate),
    not on first touch: the object's allocated blocks cover its size."""
    region = SharedRegion.create(shm_name, ChannelType.PubSub, Config(pool_size=1024))
    assert os.stat(f"/dev/shm{shm_name}").st_blocks * 512 >= region.geometry.total_size


TINY_SHM_CHILD = r"""
import json, os, sys
sys.path[:0] = json.loads(sys.argv[1])
from kickmsg import ChannelType, Config, SharedRegion, Subscriber, shm
results = {}
def attempt(label, name, cfg):
    try:
        region = SharedRegion.create(name, ChannelType.PubSub, cfg)
        Subscriber(region)
        results[label] = ["created", os.stat("/dev/shm" + name).st_blocks * 512, region.geometry.total_size]
    except ValueError as error:
        results[label] = ["ValueError", str(error)]
    results[label + " leaves"] = sorted(os.listdir("/dev/shm"))
big = Config(pool_size=512, max_payload_size=4096)    # 2.0 MiB on a 1 MiB /dev/shm
fits = Config(pool_size=65, max_payload_size=4096)    # 0.3 MiB
attempt("checked", "/too_big", big)
shm.room_for_new_object = lambda: (1 << 40, "pretended")  # past the check: the kernel must refuse
attempt("reserved", "/too_big", big)
attempt("fits", "/fits", fits)
print(json.dumps(results))
"""


def test_a_region_that_cannot_be_backed_fails_at_create_and_leaves_nothing():
    """On a 1 MiB /dev/shm (a private tmpfs): a 2.0 MiB region is refused by
    the room check; with the check pretending there is room, the kernel's
    ENOSPC at the reservation is a ValueError too, and the half-made object
    is removed. A region that fits is created, reserved and usable."""
    results = run_on_a_tiny_dev_shm(TINY_SHM_CHILD)
    assert results["checked"][0] == "ValueError" and "are free in /dev/shm" in results["checked"][1]
    assert results["checked leaves"] == []
    assert results["reserved"][0] == "ValueError"
    assert "No space left on device while reserving 2.0 MiB" in results["reserved"][1]
    assert "pool_size=512 slots of 4160 bytes" in results["reserved"][1]
    assert results["reserved leaves"] == []
    status, allocated, total = results["fits"]
    assert status == "created" and allocated >= total
    assert results["fits leaves"] == ["fits", "fits.kickmsg-subscribers"]


SPARSE_OBJECT_CHILD = r"""
import json, os, sys
sys.path[:0] = json.loads(sys.argv[1])
from kickmsg import SharedRegion, shm
with open("/dev/shm/sparse", "wb") as sparse:  # made elsewhere, never reserved: 2 MiB on a 1 MiB tmpfs
    sparse.truncate(2 << 20)
try:
    SharedRegion.open("/sparse")
    print(json.dumps(["opened"]))
except shm.NoRoomError as error:
    print(json.dumps(["NoRoomError", str(error)]))
"""


def test_a_sparse_region_that_cannot_be_backed_fails_at_open_not_with_sigbus():
    """Open maps every page of a writable mapping (MADV_POPULATE_WRITE): an
    object someone else made sparse, larger than its filesystem can back,
    is refused there with NoRoomError instead of a SIGBUS at first touch."""
    outcome, message = run_on_a_tiny_dev_shm(SPARSE_OBJECT_CHILD)
    assert outcome == "NoRoomError"
    assert "cannot back every page of shared memory /sparse: no room left for it" in message


# -- 2. a pool no larger than a ring ---------------------------------------------------------


@pytest.mark.parametrize("pool, capacity", [(64, 64), (4, 8), (1, 1)])
def test_a_pool_no_larger_than_a_ring_is_refused(shm_name, pool, capacity):
    """The old README's Config(max_subscribers=4, pool_size=64) with the
    default ring of 64 deadlocked after 64 messages: refused, naming both
    values and the rule; nothing is created."""
    cfg = Config(max_subscribers=4, sub_ring_capacity=capacity, pool_size=pool)
    for create in (SharedRegion.create, SharedRegion.create_or_open):
        with pytest.raises(ValueError) as info:
            create(shm_name, ChannelType.PubSub, cfg)
        message = str(info.value)
        assert f"pool_size ({pool}) must be greater than sub_ring_capacity ({capacity})" in message
        assert "plus one per concurrent publisher and per view held" in message
    assert shm_entries(shm_name) == []


def test_the_smallest_pool_that_works_never_runs_dry(shm_name):
    """pool_size = sub_ring_capacity + 1, one publisher, a subscriber that
    reads everything: every send finds a slot, forever."""
    region = SharedRegion.create(shm_name, ChannelType.PubSub, Config(max_subscribers=2, sub_ring_capacity=8, pool_size=9))
    pub, sub = Publisher(region), Subscriber(region)
    for index in range(100):
        pub.send(b"%d" % index)
        assert sub.try_receive() == b"%d" % index
    sub.close()
    rawregion.assert_pool_whole(shm_name)


NATIVE_DEADLOCKING_REGION = r"""
cfg = make_config(P["config"])
region = kickmsg.SharedRegion.create(P["name"], kickmsg.ChannelType.PubSub, cfg, "native")
sub = kickmsg.Subscriber(region)
pub = kickmsg.Publisher(region)
sent = 0
for index in range(P["config"]["pool_size"] + 3):
    try:
        pub.send(b"m%d" % index)
        sent += 1
    except BlockingIOError:
        pass
    sub.try_receive()
ready()
wait_go()
done(sent)
"""


def test_a_native_region_with_a_pool_no_larger_than_a_ring_is_flagged(shm_name):
    """The native library creates such a region (and it locks up: a reader
    of every message still cannot send after pool_size messages). Opening
    it warns, diagnose() and audit() flag it, and a send here says why the
    pool is empty."""
    config = dict(max_subscribers=2, sub_ring_capacity=8, pool_size=8, max_payload_size=64)
    with nativepeer.start_native(NATIVE_DEADLOCKING_REGION, name=shm_name, config=config) as peer:
        peer.wait_ready()
        with pytest.warns(RuntimeWarning, match=r"pool_size \(8\) must be greater than sub_ring_capacity \(8\)"):
            region = SharedRegion.open(shm_name)
        health = region.diagnose()
        assert health.pool_too_small and not health.healthy
        report = audit(region)
        assert report.damage()["pools too small for their rings"] == 1 and not report.clean
        with pytest.raises(BlockingIOError) as info:
            Publisher(region).send(b"one more")
        assert "8 held by ring entries" in str(info.value)
        assert "re-create the channel with a larger pool_size" in str(info.value)
        peer.tell()
        assert peer.result() == 8  # native: every send after the 8th failed
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        SharedRegion.inspect(shm_name)  # a read-only look for tools does not warn: they show it


# -- 6. names that clash with sidecars, sidecars left behind -------------------------------------


@pytest.mark.parametrize("suffix", [".kickmsg-subscribers", ".kickmsg-publishers", ".kickmsg-bridges", ".owners"])
@pytest.mark.parametrize("call", ["create", "open", "create_or_open", "unlink_shm", "Node.advertise"])
def test_a_name_ending_like_a_record_file_is_refused(call, suffix):
    """/x.kickmsg-subscribers is region /x's sidecar (/x.owners the previous
    release's name): such a region name is refused with the rule, by every
    call that takes a name."""
    name = "/kp35err_limits_x" + suffix
    with pytest.raises(ValueError, match=f"it ends in '{re.escape(suffix)}'.*not ending in"):
        if call == "create":
            SharedRegion.create(name, ChannelType.PubSub, Config(**SMALL))
        elif call == "open":
            SharedRegion.open(name)
        elif call == "create_or_open":
            SharedRegion.create_or_open(name, ChannelType.PubSub, Config(**SMALL))
        elif call == "unlink_shm":
            unlink_shm(name)
        else:
            Node("n", prefix="kp35err_limits").advertise("x" + suffix, Config(**SMALL))


@pytest.mark.parametrize("create", [SharedRegion.create, SharedRegion.create_or_open])
def test_creating_a_region_discards_a_stale_sidecar(shm_name, create):
    """A region removed by something else (native unlink_shm, rm) leaves its
    sidecar behind; creating the name again discards it."""
    region = SharedRegion.create(shm_name, ChannelType.PubSub, Config(**SMALL))
    Subscriber(region).close()
    os.unlink(f"/dev/shm{shm_name}")  # as `rm` or native unlink_shm would: the sidecar stays
    assert shm_entries(shm_name) == [shm_name.lstrip("/") + ".kickmsg-subscribers"]
    create(shm_name, ChannelType.PubSub, Config(**SMALL))
    assert shm_entries(shm_name) == [shm_name.lstrip("/")]


# -- 7. invalid configs: one exception, both ValueError and RuntimeError --------------------------

INVALID_CONFIGS = [  # (field, value, what the error says); every other field as SMALL
    ("max_subscribers", 0, "max_subscribers must be > 0 (got 0)"),
    ("sub_ring_capacity", 0, "sub_ring_capacity must be a power of 2 (got 0)"),
    ("sub_ring_capacity", 3, "sub_ring_capacity must be a power of 2 (got 3)"),
    ("pool_size", 0, "pool_size must be > 0 (got 0)"),
    ("max_payload_size", 0, "max_payload_size must be > 0 (got 0)"),
    ("pool_size", 2**32 - 1, "pool_size must be < 4294967295 (slot indices are 32-bit), got 4294967295"),
    ("max_payload_size", 2**32, "max_payload_size must fit a 32-bit length, got 4294967296"),
    ("max_subscribers", 2**32, "max_subscribers must fit a 32-bit refcount, got 4294967296"),
    ("max_subscribers", MAX_SUBSCRIBERS + 1, f"max_subscribers must be at most {MAX_SUBSCRIBERS}, got {MAX_SUBSCRIBERS + 1}"),
    ("commit_timeout", 86_401, "commit_timeout must be at most 1 day, got 86401000000 us"),
    ("pool_size", 8, "pool_size (8) must be greater than sub_ring_capacity (8)"),
    ("pool_size", MAX_POOL_SIZE + 1, f"pool_size must be at most {MAX_POOL_SIZE}, got {MAX_POOL_SIZE + 1}"),
    ("pool_size", 10**7, "pool_size=10000000 slots"),  # with max_payload_size=10**6 below: 9.1 TiB
]


@pytest.mark.parametrize("field, value, text", INVALID_CONFIGS, ids=lambda v: str(v)[:20])
@pytest.mark.parametrize("constructor", ["create", "create_or_open"])
def test_every_invalid_config_is_a_config_error_naming_the_field_and_value(shm_name, constructor, field, value, text):
    """0.1.0 raises RuntimeError for the fields it checks, the docs
    promises ValueError: ConfigError is both, for every refusal of a config,
    and names the field, the value and the region; nothing is created."""
    cfg = Config(**SMALL)
    if value == 10**7:
        cfg.max_payload_size = 10**6
    setattr(cfg, field, value)
    with pytest.raises(ConfigError) as info:
        getattr(SharedRegion, constructor)(shm_name, ChannelType.PubSub, cfg)
    assert isinstance(info.value, ValueError) and isinstance(info.value, RuntimeError)
    assert text in str(info.value) and shm_name in str(info.value)
    assert shm_entries(shm_name) == []


@pytest.mark.parametrize("build, text", [
    (lambda: Config(max_subscribers=-1), "Config.max_subscribers must be an unsigned 64-bit integer, got -1"),
    (lambda: Config(pool_size=2**64), "Config.pool_size must be an unsigned 64-bit integer, got 18446744073709551616"),
    (lambda: Config(commit_timeout=-1), "Config.commit_timeout must not be negative, got -1"),
    (lambda: Config(commit_timeout=float("nan")), "Config.commit_timeout must be a finite number of seconds, got nan"),
    (lambda: SharedRegion.create("/hlimits_never", 3, Config(**SMALL)), "channel type must be ChannelType.PubSub or "
                                                                        "ChannelType.Broadcast, got 3"),
])
def test_a_config_refused_as_it_is_built_is_a_config_error_too(build, text):
    with pytest.raises(ConfigError, match=re.escape(text)) as info:
        build()
    assert isinstance(info.value, ValueError) and isinstance(info.value, RuntimeError)
    assert kickmsg.ConfigError is ConfigError


def test_max_subscribers_is_bounded_for_regions_this_package_creates(shm_name):
    """1024 rings are made; one more is refused by every way of creating a
    region, the command line included (one line, exit 2, nothing made)."""
    ring_cheap = dict(sub_ring_capacity=1, pool_size=2, max_payload_size=8)
    region = SharedRegion.create(shm_name, ChannelType.PubSub, Config(max_subscribers=MAX_SUBSCRIBERS, **ring_cheap))
    assert region.geometry.max_subs == MAX_SUBSCRIBERS
    too_many = Config(max_subscribers=MAX_SUBSCRIBERS + 1, **ring_cheap)
    with pytest.raises(ConfigError, match="max_subscribers must be at most 1024, got 1025"):
        SharedRegion.create(shm_name + "_more", ChannelType.PubSub, too_many)
    with pytest.raises(ConfigError, match="max_subscribers must be at most 1024, got 1025"):
        Node("big", prefix=shm_name.lstrip("/")).advertise("t", too_many)
    done = subprocess.run([sys.executable, "-m", "kickmsg", "create", shm_name + "_cli", "--max-subscribers", "1000000"],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 2 and done.stdout == ""
    assert done.stderr == (f"kickmsg create: error: cannot create {shm_name}_cli: max_subscribers must be at most 1024, "
                           f"got 1000000 (every publish visits every ring, and so do the tools)\n")
    assert shm_entries(shm_name + "_more") == shm_entries(shm_name + "_t") == shm_entries(shm_name + "_cli") == []


NATIVE_MANY_RINGS = r"""
region = kickmsg.SharedRegion.create(P["name"], kickmsg.ChannelType.PubSub, make_config(P["config"]), "native")
done(region.name)
"""


def test_a_native_region_with_more_rings_than_the_bound_can_be_joined(shm_name):
    """The bound is on what this package creates: create_or_open with the
    same config joins a native region of 2000 rings, and subscribes."""
    config = dict(max_subscribers=2000, sub_ring_capacity=1, pool_size=4, max_payload_size=8)
    nativepeer.run_native(NATIVE_MANY_RINGS, name=shm_name, config=config)
    region = SharedRegion.create_or_open(shm_name, ChannelType.PubSub, Config(**config))
    subscriber = Subscriber(region)
    Publisher(region).send(b"hello")
    assert subscriber.try_receive() == b"hello"


def test_pool_size_is_bounded_for_regions_this_package_creates(shm_name):
    """2**20 slots are made; one more is refused (a pool of 100 million
    8-byte slots fits the machine, but create would lay out each slot and
    the tools read each); a native region with more is opened."""
    small_slots = dict(max_subscribers=1, sub_ring_capacity=1, max_payload_size=8)
    region = SharedRegion.create(shm_name, ChannelType.PubSub, Config(pool_size=MAX_POOL_SIZE, **small_slots))
    assert region.geometry.pool_size == MAX_POOL_SIZE
    with pytest.raises(ConfigError, match=f"pool_size must be at most {MAX_POOL_SIZE}, got 100000000"):
        SharedRegion.create(shm_name + "_more", ChannelType.PubSub, Config(pool_size=10**8, **small_slots))
    config = dict(small_slots, pool_size=MAX_POOL_SIZE + 1)
    nativepeer.run_native(NATIVE_MANY_RINGS, name=shm_name + "_native", config=config)
    assert SharedRegion.create_or_open(shm_name + "_native", ChannelType.PubSub, Config(**config)).geometry.pool_size == MAX_POOL_SIZE + 1
    unlink_shm(shm_name + "_native")
    assert shm_entries(shm_name + "_more") == []
