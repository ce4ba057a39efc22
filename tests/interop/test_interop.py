"""Interop with the native kickmsg 0.1.0 on layout 4 and 0.9.2 on layout 9
(the ``layout`` fixture), which run only in subprocesses.

Each test shares one channel between this package and the native library:
native creates -> we publish -> native receives, and the reverse; the copy
and zero-copy paths on both sides; rings wrapped many times; create_or_open
from either side on the other's region; both publishers at once. Every
payload carries its sequence number and a checksum, and every test that
moves messages ends by checking, with the independent ``rawregion`` reader,
that all slots are back on the free stack.
"""
import datetime
import os
import time

import pytest

import kickmsg
from kickmsg import ChannelType, Publisher, SharedRegion, Subscriber
import rawregion
from conftest import new_shm_name
from nativepeer import (
    check_payload,
    make_config,
    publish,
    receive_until,
    run_native_of_layout,
    run_ours,
    start_native_of_layout,
    start_ours,
)

# A channel big enough that nothing is lost: every ring holds all messages.
ROOMY = {"max_subscribers": 4, "sub_ring_capacity": 256, "pool_size": 512, "max_payload_size": 256}
# A channel that wraps: 8 entries per ring.
TIGHT = {"max_subscribers": 2, "sub_ring_capacity": 8, "pool_size": 32, "max_payload_size": 256}

# Every test on layout 4 against 0.1.0, and on layout 9 against 0.9.2.
pytestmark = pytest.mark.usefixtures("layout")

# -- snippets, run by either implementation (see nativepeer) -----------------

CREATE = """
region = open_region(P)
done({"pid": os.getpid()})
"""

TRY_CREATE_OR_OPEN = """
try:
    region = open_region(P)
except Exception as error:
    done({"error": type(error).__name__, "message": str(error)})
else:
    done({"error": None})
"""

SUBSCRIBE = """
if P.get("wait"):
    ready()
    wait_go()
region = open_region(P)
sub = kickmsg.Subscriber(region)
ready()
result = receive_until(sub, P["last"], P["mode"])
result["more"] = sub.try_receive() is not None
del sub  # leave the ring
done(result)
"""

PUBLISH = """
region = open_region(P)
pub = kickmsg.Publisher(region)
if P.get("wait"):
    ready()
    wait_go()
done(publish(pub, range(P["first"], P["first"] + P["count"]), P.get("by", "mixed")))
"""

SUBSCRIBE_WITHOUT_READING = """
region = open_region(P)
sub = kickmsg.Subscriber(region)
ready()
wait_go()
del sub  # leave the ring with every message unread
done(None)
"""

READ_LATER = """
region = open_region(P)
sub = kickmsg.Subscriber(region)
ready()
wait_go()
seqs, positions = [], []
for view in iter(sub.try_receive_view, None):
    with view:
        seqs.append(check_payload(view))
        positions.append(view.ring_pos)
done({"seqs": seqs, "positions": positions, "lost": sub.lost})
"""

READ_SCHEMA = """
region = open_region(P)
if P.get("claim"):
    assert region.try_claim_schema(make_config({"schema": P["claim"]}).schema)
info = region.schema()
done(None if info is None else {
    "identity": info.identity.hex(), "layout": info.layout.hex(), "name": info.name, "version": info.version,
    "identity_algo": info.identity_algo, "layout_algo": info.layout_algo, "flags": info.flags,
})
"""

BLOCKING_RECEIVE = """
region = open_region(P)
sub = kickmsg.Subscriber(region)
ready()
data = sub.receive(3600.0)  # only a publisher's wake-up ends this in time
done(check_payload(data))
"""


def start(impl, code, **params):
    return (start_native_of_layout if impl == "native" else start_ours)(code, **params)


def run(impl, code, **params):
    return (run_native_of_layout if impl == "native" else run_ours)(code, **params)


def assert_stream(result, published, lossless):
    """A subscriber's result against the seqs published (per publisher, in
    order): no duplicates, nothing foreign, each publisher's order kept,
    received + lost == published, and nothing left over."""
    seqs = result["seqs"]
    assert not result["timed_out"], f"did not receive the last messages; got {len(seqs)} of {len(published)}"
    assert not result.get("more"), "a message arrived after the last one"
    assert len(seqs) == len(set(seqs)), "duplicate messages"
    assert set(seqs) <= set(published), f"unexpected messages: {sorted(set(seqs) - set(published))[:10]}"
    for publisher in {seq // 1_000_000 for seq in published}:
        mine = [seq for seq in seqs if seq // 1_000_000 == publisher]
        assert mine == sorted(mine), f"publisher {publisher}: order not kept"
    assert len(seqs) + result["lost"] == len(published)
    if lossless:
        assert result["lost"] == 0
        assert sorted(seqs) == sorted(published)
    if result["positions"]:
        assert result["positions"] == sorted(set(result["positions"])), "views' ring positions not increasing"


def masked(data: bytes) -> bytes:
    """Region bytes with creator_pid and created_at_ns (offsets 112..127) zeroed."""
    return data[:112] + bytes(16) + data[128:]


def first_differences(a: bytes, b: bytes, limit=10) -> list:
    return [(offset, a[offset], b[offset]) for offset in range(min(len(a), len(b))) if a[offset] != b[offset]][:limit]


# -- the helper itself --------------------------------------------------------


def test_peers_run_the_intended_implementations(layout):
    """The native child imports the compiled module (0.9.2's package around
    it, on layout 9), ours the package."""
    native = {4: "kickmsg-0.1.0/kickmsg.abi3.so", 9: "kickmsg-0.9.2/kickmsg/__init__.py"}[layout]
    assert run_native_of_layout("done(kickmsg.__file__)").endswith(native)
    assert run_ours("done(kickmsg.__file__)") == kickmsg.__file__


# -- header bytes ---------------------------------------------------------------

SCHEMA = {
    "identity": (bytes(range(64))).hex(),
    "layout": (bytes(range(64, 128))).hex(),
    "name": "demo.Pose",
    "version": 3,
    "identity_algo": 1,
    "layout_algo": 2,
    "flags": 5,
}

HEADER_CASES = {
    # WIRE.md test vectors: (type, config, creator, config_hash, total_size)
    "default": ("PubSub", {}, "wire", 0x6C3FF20F1D29365E, 1_084_288),
    "small": ("PubSub", {"max_subscribers": 4, "sub_ring_capacity": 8, "pool_size": 16, "max_payload_size": 256},
              "wire", 0xE54469415ACEB14A, 7040),
    "broadcast": ("Broadcast", {"max_subscribers": 4, "sub_ring_capacity": 8, "pool_size": 16,
                                "max_payload_size": 256}, "wire", 0x0A9A6AA4E15DCF3D, 7040),
    # Odd sizes, a longer creator, a commit timeout and a schema.
    "schema": ("PubSub", {"max_subscribers": 3, "sub_ring_capacity": 16, "pool_size": 17, "max_payload_size": 100,
                          "commit_timeout": 0.25, "schema": SCHEMA}, "a-node-with-a-longer-name", None, None),
    "no-creator": ("Broadcast", {"max_subscribers": 1, "sub_ring_capacity": 1, "pool_size": 2,
                                 "max_payload_size": 1}, "", None, None),
    # A creator name of 80 UTF-8 bytes (header_size 960) and a schema name
    # cut to 127 bytes.
    "long-names": ("PubSub", {"max_subscribers": 2, "sub_ring_capacity": 4, "pool_size": 5, "max_payload_size": 64,
                              "schema": dict(SCHEMA, name="n" * 200)}, "ü" * 40, None, None),
}


@pytest.mark.parametrize("case", HEADER_CASES)
def test_fresh_region_bytes_match_native(shm_name, case, layout):
    """A region we create is byte-identical to the native one for the same
    arguments, apart from creator_pid and created_at_ns. On layout 4 both
    stamp created_at_ns from CLOCK_MONOTONIC (WIRE.md's table says wall
    clock; 0.1.0 does not), on layout 9 from CLOCK_REALTIME (WIRE9.md G.1)."""
    channel_type, config, creator, config_hash, total_size = HEADER_CASES[case]
    clock_ns = time.monotonic_ns if layout == 4 else time.time_ns
    before = clock_ns()
    pid = run_native_of_layout(CREATE, name=shm_name, how="create", type=channel_type, config=config, creator=creator)["pid"]
    after = clock_ns()
    native = rawregion.read_bytes(shm_name)

    region = SharedRegion.create(shm_name, getattr(ChannelType, channel_type), make_config(config), creator)
    ours = rawregion.read_bytes(shm_name)
    del region

    native_header, our_header = rawregion.header(native), rawregion.header(ours)
    assert native_header["creator_pid"] == pid
    assert our_header["creator_pid"] == os.getpid()
    assert before <= native_header["created_at_ns"] <= after
    assert after <= our_header["created_at_ns"] <= clock_ns()
    assert our_header["creator_name"] == creator
    if config_hash is not None and layout == 4:  # the sizes measured on 0.1.0
        assert (native_header["config_hash"], native_header["total_size"]) == (config_hash, total_size)
    assert len(ours) == len(native)
    assert masked(ours) == masked(native), f"(offset, ours, native): {first_differences(masked(ours), masked(native))}"


@pytest.mark.parametrize("writer", ["native", "ours"])
def test_schema_written_by_one_side_is_read_by_the_other(writer, shm_name):
    """A schema set at creation, or claimed later, reads back field for
    field in the other implementation."""
    reader = "ours" if writer == "native" else "native"
    with_schema = dict(ROOMY, schema=SCHEMA)
    run(writer, CREATE, name=shm_name, how="create", config=with_schema)
    assert run(reader, READ_SCHEMA, name=shm_name) == SCHEMA

    run(reader, CREATE, name=shm_name, how="create", config=ROOMY)
    assert run(reader, READ_SCHEMA, name=shm_name) is None
    claimed = dict(SCHEMA, name="claimed.Later", version=9)
    assert run(writer, READ_SCHEMA, name=shm_name, claim=claimed) == claimed
    assert run(reader, READ_SCHEMA, name=shm_name) == claimed


# -- one direction at a time -------------------------------------------------------


@pytest.mark.parametrize("mode", ["copy", "view"])
def test_native_creates_and_receives_what_we_publish(shm_name, mode):
    """Native creates and subscribes; we publish by send and by allocate."""
    count = 150
    with start_native_of_layout(SUBSCRIBE, name=shm_name, how="create", config=ROOMY, mode=mode, last=[count - 1]) as peer:
        peer.wait_ready()
        pub = Publisher(SharedRegion.open(shm_name))
        assert publish(pub, range(count), "mixed") == [1]
        result = peer.result()
    assert_stream(result, list(range(count)), lossless=True)
    assert result["seqs"] == list(range(count))
    if mode == "view":
        assert result["positions"] == list(range(count))
    del pub
    rawregion.assert_pool_whole(shm_name)


@pytest.mark.parametrize("mode", ["copy", "view"])
def test_we_create_and_receive_what_native_publishes(shm_name, mode):
    """We create and subscribe, reading while native publishes by send and
    by allocate."""
    count = 150
    region = SharedRegion.create(shm_name, ChannelType.PubSub, make_config(ROOMY), "ours")
    with Subscriber(region) as sub:
        with start_native_of_layout(PUBLISH, name=shm_name, first=0, count=count) as peer:
            result = receive_until(sub, [count - 1], mode)
            assert peer.result() == [1]
        result["more"] = sub.try_receive() is not None
    assert_stream(result, list(range(count)), lossless=True)
    assert result["seqs"] == list(range(count))
    if mode == "view":
        assert result["positions"] == list(range(count))
    rawregion.assert_pool_whole(shm_name)


def test_zero_copy_view_of_native_message_outlives_the_subscriber(shm_name):
    """A view we hold keeps a native-published slot pinned after our
    subscriber leaves; releasing it makes the pool whole."""
    region = SharedRegion.create(shm_name, ChannelType.PubSub, make_config(ROOMY), "ours")
    sub = Subscriber(region)
    run_native_of_layout(PUBLISH, name=shm_name, first=0, count=3)
    view = sub.try_receive_view()
    sub.close()
    assert check_payload(view) == 0
    assert sum(rawregion.pool(rawregion.read_bytes(shm_name)).refcounts) == 1  # our pin
    view.release()
    rawregion.assert_pool_whole(shm_name)


@pytest.mark.parametrize("reader", ["native", "ours"])
def test_unread_messages_go_back_to_the_pool_when_the_subscriber_leaves(shm_name, reader):
    """A subscriber that leaves with unread messages from the other
    implementation gives their slots back."""
    writer = "ours" if reader == "native" else "native"
    run(writer, CREATE, name=shm_name, how="create", config=ROOMY, creator=writer)
    with start(reader, SUBSCRIBE_WITHOUT_READING, name=shm_name) as peer:
        peer.wait_ready()
        assert run(writer, PUBLISH, name=shm_name, first=0, count=40) == [1]
        assert sum(rawregion.pool(rawregion.read_bytes(shm_name)).refcounts) == 40
        peer.tell()
        peer.result()
    rawregion.assert_pool_whole(shm_name)


@pytest.mark.parametrize("sleeper", ["native", "ours"])
def test_publisher_wakes_a_blocked_subscriber_of_the_other_implementation(shm_name, sleeper):
    """A subscriber blocked in receive() (has_waiter set, futex wait) is
    woken by the other implementation's publish; it could not otherwise
    return within the child's time limit."""
    waker = "ours" if sleeper == "native" else "native"
    run(waker, CREATE, name=shm_name, how="create", config=ROOMY)
    with start(sleeper, BLOCKING_RECEIVE, name=shm_name) as peer:
        peer.wait_ready()
        for _ in range(2000):  # bounded: wait until it announces it sleeps
            if rawregion.ring(rawregion.read_bytes(shm_name), 0).has_waiter:
                break
            time.sleep(0.005)
        else:
            pytest.fail("the subscriber never set has_waiter")
        run(waker, PUBLISH, name=shm_name, first=7, count=1, by="send")
        assert peer.result() == 7
    rawregion.assert_pool_whole(shm_name)


# -- rings wrapped many times -------------------------------------------------------


@pytest.mark.parametrize(
    "creator, subscriber, publisher",
    [("native", "native", "ours"), ("ours", "native", "ours"), ("ours", "ours", "native"), ("native", "ours", "native")],
)
def test_ring_wrapped_many_times(shm_name, creator, subscriber, publisher):
    """Capacity 8, thousands of messages, the subscriber reading along in
    another process: no duplicates, order kept, received + lost ==
    published, and the pool whole afterwards."""
    name = shm_name
    count = 3000
    run(creator, CREATE, name=name, how="create", config=TIGHT, creator=creator)
    with start(subscriber, SUBSCRIBE, name=name, mode="mixed", last=[count - 1]) as sub:
        sub.wait_ready()
        assert run(publisher, PUBLISH, name=name, first=0, count=count) == [1]
        result = sub.result()
    assert_stream(result, list(range(count)), lossless=False)
    assert result["seqs"][-1] == count - 1
    assert rawregion.ring(rawregion.read_bytes(name), 0).write_pos == count  # 375 laps of the ring
    rawregion.assert_pool_whole(name)


@pytest.mark.parametrize("reader", ["native", "ours"])
def test_lapped_subscriber_skips_to_the_oldest_entry(shm_name, reader):
    """20 messages from the other side into an unread ring of 8: the reader
    gets the last 8 (at ring positions 12..19) and counts 12 lost."""
    writer = "ours" if reader == "native" else "native"
    run(writer, CREATE, name=shm_name, how="create", config=TIGHT, creator=writer)
    with start(reader, READ_LATER, name=shm_name) as peer:
        peer.wait_ready()
        assert run(writer, PUBLISH, name=shm_name, first=0, count=20) == [1]
        peer.tell()
        assert peer.result() == {"seqs": list(range(12, 20)), "positions": list(range(12, 20)), "lost": 12}
    rawregion.assert_pool_whole(shm_name)


def test_we_read_along_a_native_publisher_wrapping_the_ring(shm_name):
    """In-process: our subscriber reads a fast native publisher through a
    ring of 8, by copy and by view."""
    count = 5000
    region = SharedRegion.create(shm_name, ChannelType.PubSub, make_config(TIGHT), "ours")
    with Subscriber(region) as sub:
        with start_native_of_layout(PUBLISH, name=shm_name, first=0, count=count) as peer:
            result = receive_until(sub, [count - 1], "mixed")
            assert peer.result() == [1]
        result["more"] = sub.try_receive() is not None
    assert_stream(result, list(range(count)), lossless=False)
    rawregion.assert_pool_whole(shm_name)


# -- create_or_open ---------------------------------------------------------------

MISMATCHES = {
    "pool_size": ("PubSub", dict(ROOMY, pool_size=1024)),
    "commit_timeout": ("PubSub", dict(ROOMY, commit_timeout=0.1)),
    "channel_type": ("Broadcast", ROOMY),
}


def test_our_create_or_open_accepts_a_native_region(shm_name):
    """Native creates and subscribes; our create_or_open with the same config
    opens that region (no re-creation) and our messages reach native."""
    count = 50
    with start_native_of_layout(SUBSCRIBE, name=shm_name, how="create", config=ROOMY, creator="native", mode="copy",
                      last=[count - 1]) as peer:
        peer.wait_ready()
        region = SharedRegion.create_or_open(shm_name, ChannelType.PubSub, make_config(ROOMY), "ours")
        header = rawregion.header(rawregion.read_bytes(shm_name))
        assert (header["creator_name"], header["creator_pid"]) == ("native", peer.proc.pid)
        assert publish(Publisher(region), range(count)) == [1]
        result = peer.result()
    assert_stream(result, list(range(count)), lossless=True)
    rawregion.assert_pool_whole(shm_name)


@pytest.mark.parametrize("mismatch", MISMATCHES)
def test_our_create_or_open_rejects_a_different_native_region(shm_name, mismatch):
    """A different config (or channel type) on a native region is refused,
    and the region is left as it was."""
    run_native_of_layout(CREATE, name=shm_name, how="create", config=ROOMY, creator="native")
    before = rawregion.read_bytes(shm_name)
    channel_type, config = MISMATCHES[mismatch]
    with pytest.raises(RuntimeError, match=f"Config mismatch on existing region: {shm_name}"):
        SharedRegion.create_or_open(shm_name, getattr(ChannelType, channel_type), make_config(config), "ours")
    assert rawregion.read_bytes(shm_name) == before


def test_native_create_or_open_accepts_our_region(shm_name):
    """We create and subscribe; native create_or_open with the same config
    opens our region and its messages reach us."""
    count = 50
    region = SharedRegion.create(shm_name, ChannelType.PubSub, make_config(ROOMY), "ours")
    with Subscriber(region) as sub:
        published = run_native_of_layout(PUBLISH, name=shm_name, how="create_or_open", config=ROOMY, creator="native",
                               first=0, count=count)
        assert published == [1]
        result = receive_until(sub, [count - 1], "mixed")
        result["more"] = sub.try_receive() is not None
    header = rawregion.header(rawregion.read_bytes(shm_name))
    assert (header["creator_name"], header["creator_pid"]) == ("ours", os.getpid())
    assert_stream(result, list(range(count)), lossless=True)
    rawregion.assert_pool_whole(shm_name)


@pytest.mark.parametrize("mismatch", MISMATCHES)
def test_native_create_or_open_rejects_a_different_region_of_ours(shm_name, mismatch):
    """Native refuses our region under a different config, leaving it as it was."""
    region = SharedRegion.create(shm_name, ChannelType.PubSub, make_config(ROOMY), "ours")
    before = rawregion.read_bytes(shm_name)
    channel_type, config = MISMATCHES[mismatch]
    outcome = run_native_of_layout(TRY_CREATE_OR_OPEN, name=shm_name, how="create_or_open", type=channel_type, config=config)
    assert outcome == {"error": "RuntimeError", "message": f"Config mismatch on existing region: {shm_name}"}
    assert rawregion.read_bytes(shm_name) == before
    del region


RACE_ROUNDS = 6


def test_create_or_open_race_between_implementations():
    """Native and ours call create_or_open on a fresh name at the same time:
    one creates, the other opens that same region, and both subscribers
    receive what we then publish."""
    count = 20
    for attempt in range(RACE_ROUNDS):
        name = new_shm_name("race")
        spec = dict(name=name, how="create_or_open", config=ROOMY, mode="copy", last=[count - 1], wait=True)
        with (
            start_native_of_layout(SUBSCRIBE, creator="native", **spec) as native,
            start_ours(SUBSCRIBE, creator="ours", **spec) as ours,
        ):
            native.wait_ready()
            ours.wait_ready()
            first, second = (ours, native) if attempt % 2 == 0 else (native, ours)
            first.tell()
            time.sleep(0.002 * attempt)  # vary who wins and the overlap
            second.tell()
            native.wait_ready()  # joined
            ours.wait_ready()
            assert publish(Publisher(SharedRegion.open(name)), range(count)) == [2]
            results = [native.result(), ours.result()]
        assert rawregion.header(rawregion.read_bytes(name))["creator_name"] in ("native", "ours")
        for result in results:
            assert_stream(result, list(range(count)), lossless=True)
        rawregion.assert_pool_whole(name)


# -- both publishers at once ---------------------------------------------------------


def test_native_and_our_publishers_share_a_channel(shm_name):
    """A native and our publisher (separate processes, released together)
    publish into one Broadcast channel at the same time; a native and our
    subscriber each get every message, each publisher's in order."""
    count = 800
    config = dict(ROOMY, sub_ring_capacity=2048, pool_size=4096)
    native_seqs = [1_000_000 + i for i in range(count)]
    our_seqs = [2_000_000 + i for i in range(count)]
    last = [native_seqs[-1], our_seqs[-1]]
    run_native_of_layout(CREATE, name=shm_name, how="create", type="Broadcast", config=config, creator="native")
    with Subscriber(SharedRegion.open(shm_name)) as our_sub:
        with start_native_of_layout(SUBSCRIBE, name=shm_name, mode="mixed", last=last) as native_sub:
            native_sub.wait_ready()
            with (
                start_native_of_layout(PUBLISH, name=shm_name, first=native_seqs[0], count=count, wait=True) as native_pub,
                start_ours(PUBLISH, name=shm_name, first=our_seqs[0], count=count, wait=True) as our_pub,
            ):
                native_pub.wait_ready()
                our_pub.wait_ready()
                native_pub.tell()
                our_pub.tell()
                ours = receive_until(our_sub, last, "mixed")
                assert native_pub.result() == [2]
                assert our_pub.result() == [2]
            native = native_sub.result()
        ours["more"] = our_sub.try_receive() is not None
    for result in (native, ours):
        assert_stream(result, native_seqs + our_seqs, lossless=True)
    rawregion.assert_pool_whole(shm_name)


# -- commit timeouts: the same microseconds, hashed the same way --------------------------


@pytest.mark.parametrize("seconds", [0.25, 0.000249, 0.0123456789, 1.9e-06])
def test_float_commit_timeout_gives_the_native_config_hash(shm_name, seconds):
    """commit_timeout in float seconds becomes whole microseconds that are
    hashed into the config: they must be native's (which truncates
    seconds * 1e6), or create_or_open of the other side's region fails
    for the very same Config."""
    config = dict(ROOMY, commit_timeout=seconds)
    run_native_of_layout(CREATE, name=shm_name, how="create", config=config)
    native_us = rawregion.header(rawregion.read_bytes(shm_name))["commit_timeout_us"]
    assert native_us == int(seconds * 1e6)
    assert make_config(config).commit_timeout // datetime.timedelta(microseconds=1) == native_us
    SharedRegion.create_or_open(shm_name, ChannelType.PubSub, make_config(config), "ours")


def test_we_open_a_native_region_with_a_long_commit_timeout(shm_name):
    """A 2-hour commit timeout is a valid native config: we open that region
    and our messages reach its native subscriber."""
    config = dict(ROOMY, commit_timeout=7200.0)
    with start_native_of_layout(SUBSCRIBE, name=shm_name, how="create", config=config, mode="copy", last=[0]) as peer:
        peer.wait_ready()
        publish(Publisher(SharedRegion.open(shm_name)), [0], "send")
        assert_stream(peer.result(), [0], lossless=True)
