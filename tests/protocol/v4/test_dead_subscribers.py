"""Subscribers killed without leaving, and ``reclaim_dead_subscribers()``.

A subscriber killed with SIGKILL never runs its teardown: its ring stays Live
forever, and after max_subscribers such deaths nobody can subscribe. Each
subscriber of this package records itself in a sidecar beside the region,
``/dev/shm/<name>.kickmsg-subscribers`` (pid, process start time, start position, the
region's created_at_ns, ...), and holds an OFD lock on its record while it
lives. ``reclaim_dead_subscribers()`` leaves, on their behalf, exactly the
rings whose record's lock is free: Live rings, and Draining ones whose owner
died during its own teardown. It leaves alone rings whose owner lives, rings
of native subscribers (no record) and records of an earlier incarnation of
the region; and a subscriber killed during its teardown leaves no record that
could outlive its ownership.

Subscribers run in spawned processes (``crashworkers``); native ones in
subprocesses (``nativepeer``). Records are decoded with ``struct``.
"""
import os
import signal
import struct

import pytest

from conftest import on_layout4
import crashworkers
import mpworkers
import nativepeer
import rawregion
from crashworkers import CTX, require
from kickmsg import ChannelType, Config, Publisher, SharedRegion, Subscriber, audit, unlink_shm
from kickmsg import owners

RING_FREE, RING_LIVE, RING_DRAINING = 0, 1, 2
# The head of a record: pid, process start (clock ticks), start_pos, region
# created_at_ns (the record goes on; its size is owners.RECORD_SIZE).
RECORD_HEAD = struct.Struct("<QQQQ")

# These tests check layout 4's own: subscribers' owner records in sidecar files.
pytestmark = [pytest.mark.timeout(120), on_layout4]

NATIVE_SUBSCRIBER = r'''
sub = kickmsg.Subscriber(kickmsg.SharedRegion.open(P["name"]))
ready()
wait_go()
result = receive_until(sub, [P["count"] - 1])
del sub
done(result)
'''

NATIVE_RECREATE_AND_SUBSCRIBE = r'''
region = kickmsg.SharedRegion.create(P["name"], kickmsg.ChannelType.PubSub, make_config(P["config"]))
sub = kickmsg.Subscriber(region)
ready()
wait_go()
del sub
done(True)
'''

RECLAIM = r'''
report = kickmsg.SharedRegion.open(P["name"]).reclaim_dead_subscribers()
done({"reclaimed": report.reclaimed, "unrecorded": report.unrecorded, "timed_out": report.timed_out})
'''


def small_config(**fields) -> Config:
    values = {"max_subscribers": 3, "sub_ring_capacity": 8, "pool_size": 32, "max_payload_size": 64}
    return Config(**(values | fields))


def sidecar_path(name: str) -> str:
    return f"/dev/shm{name}.kickmsg-subscribers"


def sidecar_records(name: str, max_subs: int) -> list[bytes]:
    """Each ring's record as raw bytes, all zero where there is none (the
    file only grows as far as records have been written)."""
    size = owners.RECORD_SIZE
    with open(sidecar_path(name), "rb") as file:
        data = file.read()
    assert size >= RECORD_HEAD.size and len(data) <= size * max_subs, f"odd sidecar size {len(data)}"
    data = data.ljust(size * max_subs, b"\0")
    return [data[ring * size : (ring + 1) * size] for ring in range(max_subs)]


def record_head(record: bytes) -> tuple:
    """(pid, process start, start_pos, region created_at_ns) of a record."""
    return RECORD_HEAD.unpack_from(record)


def raw_rings(name) -> list:
    data = rawregion.read_bytes(name)
    return [rawregion.ring(data, index) for index in range(rawregion.header(data)["max_subs"])]


def ring_states(name) -> list:
    return [(ring.state, ring.in_flight) for ring in raw_rings(name)]


def created_at(name) -> int:
    return rawregion.header(rawregion.read_bytes(name))["created_at_ns"]


def as_tuple(report):
    return report.reclaimed, report.unrecorded, report.timed_out


def assert_recovered(name, region):
    """Every ring Free, the pool whole, the audit clean."""
    assert ring_states(name) == [(RING_FREE, 0)] * region.geometry.max_subs
    rawregion.assert_pool_whole(name)
    report = audit(region)
    assert report.clean and not report.being_written, report.verdict


# -- killed subscribers fill the rings; reclaim frees exactly them ------------------------


def fill_rings_with_killed_subscribers(name, region, procs, max_subs) -> list[int]:
    """Start max_subs subscriber processes that record themselves, publish
    five messages, kill them all. Their rings stay Live. Returns their pids."""
    pids = [procs.start_ready(f"dead-{ring}", crashworkers.parked_subscriber, name) for ring in range(max_subs)]
    assert ring_states(name) == [(RING_LIVE, 0)] * max_subs
    records = sidecar_records(name, max_subs)
    for ring, pid in enumerate(pids):
        assert record_head(records[ring]) == (pid, crashworkers.process_start_ticks(pid), 0, created_at(name))
    pub = Publisher(region)
    for sequence in range(5):  # each ring now holds five references
        pub.send(mpworkers.numbered_message(1, sequence))
    for ring in range(max_subs):
        procs.kill(f"dead-{ring}")
    assert ring_states(name) == [(RING_LIVE, 0)] * max_subs
    return pids


def test_killed_subscribers_are_reported_and_reclaimed(shm_name, procs):
    """Three subscriber processes (max_subscribers=3) record themselves, hold
    messages, and are killed: their rings stay Live. diagnose() and audit()
    report them; reclaim_dead_subscribers() drains and frees the three
    rings, names (ring, pid), and clears their records."""
    max_subs = 3
    region = SharedRegion.create(shm_name, ChannelType.PubSub, small_config(max_subscribers=max_subs))
    pids = fill_rings_with_killed_subscribers(shm_name, region, procs, max_subs)
    health = region.diagnose()
    assert health.dead_subscriber_rings == max_subs and not health.healthy
    assert region.dead_subscriber_rings() == list(enumerate(pids))
    report = audit(region)
    assert [ring.owner_dead for ring in report.rings] == [True] * max_subs
    assert report.damage()["rings held by dead subscribers"] == max_subs and not report.clean

    report = region.reclaim_dead_subscribers()
    assert as_tuple(report) == ([(ring, pid) for ring, pid in enumerate(pids)], [], [])
    assert not any(b"".join(sidecar_records(shm_name, max_subs)))  # records cleared
    assert_recovered(shm_name, region)
    assert as_tuple(region.reclaim_dead_subscribers()) == ([], [], [])
    assert region.diagnose().healthy
    with Subscriber(region):
        assert ring_states(shm_name)[0] == (RING_LIVE, 0)


def test_a_join_reclaims_the_rings_of_killed_subscribers(shm_name, procs):
    """Every ring is held by a killed subscriber: a new subscriber does not
    fail with "No free subscriber slots" but reclaims the dead owners'
    rings first (all of them), then joins one: the channel heals itself."""
    max_subs = 3
    region = SharedRegion.create(shm_name, ChannelType.PubSub, small_config(max_subscribers=max_subs))
    fill_rings_with_killed_subscribers(shm_name, region, procs, max_subs)
    with Subscriber(region) as subscriber:
        assert ring_states(shm_name) == [(RING_LIVE, 0), (RING_FREE, 0), (RING_FREE, 0)]
        assert region.diagnose().dead_subscriber_rings == 0
        Publisher(region).send(b"heard")
        assert subscriber.try_receive() == b"heard"
    assert_recovered(shm_name, region)


def test_a_full_channel_names_who_holds_the_rings(shm_name, procs):
    """With every ring held by a living subscriber, a join still fails,
    and the error says who holds the rings."""
    region = SharedRegion.create(shm_name, ChannelType.PubSub, small_config(max_subscribers=2))
    holders = [Subscriber(region) for _ in range(2)]
    with pytest.raises(RuntimeError, match=r"No free subscriber slots in .*: all 2 rings are taken or retired "
                                           r"\(2 by live subscribers of this package, 0 by subscribers that"):
        Subscriber(region)
    for holder in holders:
        holder.close()


def test_reclaim_leaves_a_living_owner_alone(shm_name, procs):
    """A living subscriber process and a dead one: only the dead one's ring
    is reclaimed; the living one keeps its ring, its record and its messages."""
    region = SharedRegion.create(shm_name, ChannelType.PubSub, small_config(sub_ring_capacity=16, pool_size=48))
    done, progress = CTX.Event(), CTX.Value("q", 0, lock=False)
    procs.start_ready("alive", crashworkers.counting_subscriber, shm_name, done, progress)  # ring 0
    dead_pid = procs.start_ready("dead", crashworkers.parked_subscriber, shm_name)  # ring 1
    pub = Publisher(region)
    for sequence in range(5):
        pub.send(mpworkers.numbered_message(1, sequence))
    procs.kill("dead")

    report = region.reclaim_dead_subscribers()
    assert as_tuple(report) == ([(1, dead_pid)], [], [])
    assert ring_states(shm_name) == [(RING_LIVE, 0), (RING_FREE, 0), (RING_FREE, 0)]
    assert record_head(sidecar_records(shm_name, 3)[0])[0] == procs.pid("alive")
    for sequence in range(5, 10):  # no more than a ring's worth: nothing is lapped
        pub.send(mpworkers.numbered_message(1, sequence))
    done.set()
    result = procs.wait_for("result", ["alive"])["alive"]
    procs.join(["alive"])
    assert (result["received"], result["lost"], result["problem_count"], result["drain_timeouts"]) == (10, 0, 0, 0)
    assert_recovered(shm_name, region)


def test_native_subscriber_is_left_alone_and_reported_unrecorded(shm_name, procs):
    """A native subscriber records nothing: with no sidecar at all, and then
    beside a dead subscriber of ours, its ring is reported as unrecorded and
    keeps working; only our dead subscriber's ring is reclaimed."""
    region = SharedRegion.create(shm_name, ChannelType.PubSub, small_config(max_payload_size=256))
    count = 3
    with nativepeer.start_native(NATIVE_SUBSCRIBER, name=shm_name, count=count) as native:
        native.wait_ready()  # its subscriber holds ring 0
        assert not os.path.exists(sidecar_path(shm_name))
        assert as_tuple(region.reclaim_dead_subscribers()) == ([], [0], [])

        dead_pid = procs.start_ready("dead", crashworkers.parked_subscriber, shm_name)  # ring 1
        procs.kill("dead")
        assert as_tuple(region.reclaim_dead_subscribers()) == ([(1, dead_pid)], [0], [])
        assert ring_states(shm_name)[:2] == [(RING_LIVE, 0), (RING_FREE, 0)]

        native.tell()
        pub = Publisher(region)
        for sequence in range(count):
            pub.send(nativepeer.make_payload(sequence))
        result = native.result()
    assert (result["seqs"], result["lost"], result["timed_out"]) == (list(range(count)), 0, False)
    assert_recovered(shm_name, region)


def test_reclaim_while_a_publisher_keeps_publishing(shm_name, procs):
    """Two dead subscribers are reclaimed while a publisher process publishes
    without pause and a living subscriber receives. The reclaim waits for
    the publisher's admissions like a teardown would; afterwards every
    publish is accounted for by the living subscriber, and once everything
    stops the pool is whole."""
    capacity = 16
    cfg = small_config(max_subscribers=4, sub_ring_capacity=capacity, pool_size=64, commit_timeout=2.0)
    region = SharedRegion.create(shm_name, ChannelType.PubSub, cfg)
    done, progress = CTX.Event(), CTX.Value("q", 0, lock=False)
    procs.start_ready("alive", crashworkers.counting_subscriber, shm_name, done, progress)  # ring 0
    dead = [procs.start_ready(f"dead-{ring}", crashworkers.parked_subscriber, shm_name) for ring in (1, 2)]
    go, stop, published = CTX.Event(), CTX.Event(), CTX.Value("q", 0, lock=False)
    procs.start_ready("pub", crashworkers.publish_until_stopped, shm_name, 7, go, stop, published)

    go.set()
    procs.wait_until(lambda: published.value >= 2 * capacity, "the dead rings to wrap")
    for ring in (1, 2):
        procs.kill(f"dead-{ring}")
    procs.wait_until(lambda: published.value >= 4 * capacity, "more messages into the dead rings")
    report = region.reclaim_dead_subscribers()  # the publisher is still going: stop is not set
    at_reclaim = published.value
    procs.wait_until(lambda: published.value >= at_reclaim + 4 * capacity, "messages after the reclaim")
    stop.set()
    sent = procs.wait_for("result", ["pub"])["pub"]
    procs.join(["pub"])
    done.set()
    alive = procs.wait_for("result", ["alive"])["alive"]
    procs.join(["alive"])

    print("publisher:", sent, "living subscriber:", {key: alive[key] for key in ("received", "lost")})
    assert as_tuple(report) == ([(1, dead[0]), (2, dead[1])], [], [])
    assert sent["dropped"] == 0
    assert alive["problem_count"] == 0, alive["problems"]
    assert alive["received"] + alive["lost"] == sent["published"]
    assert alive["last"] == {7: sent["published"] - 1}
    rings = raw_rings(shm_name)
    assert rings[0].write_pos == sent["published"]
    assert all(ring.write_pos < sent["published"] for ring in rings[1:3])  # skipped once reclaimed
    assert alive["drain_timeouts"] == 0
    assert_recovered(shm_name, region)


def test_dead_subscriber_with_a_crashed_publisher_in_flight(shm_name, procs):
    """A publisher dies admitted to a dead subscriber's ring (after claiming
    a position): the reclaim waits commit_timeout for it, gives up, reports
    the ring as timed out and leaves it retired, its record cleared.
    reset_retired_rings(drain=True) and reclaim_orphaned_slots() finish the
    job."""
    region = SharedRegion.create(shm_name, ChannelType.PubSub, small_config(commit_timeout=0.02))
    procs.start_ready("dead", crashworkers.parked_subscriber, shm_name)  # ring 0, the only live ring
    go, stopped = CTX.Event(), CTX.Value("i", 0, lock=False)
    procs.start_ready("victim", crashworkers.crashing_publisher, shm_name, 1, "after_claim", 10, go, stopped)
    go.set()
    procs.wait_stopped("victim", stopped)
    procs.kill("victim")
    procs.kill("dead")

    report = region.reclaim_dead_subscribers()
    assert as_tuple(report) == ([], [], [0])
    assert ring_states(shm_name)[0] == (RING_FREE, 1)  # retired
    assert not any(sidecar_records(shm_name, 3)[0])
    assert region.diagnose().retired_rings == 1
    assert region.reset_retired_rings(drain=True) == 1
    assert region.reclaim_orphaned_slots() == 2  # the victim's slot, and the one its entry still names
    assert_recovered(shm_name, region)


# -- incarnations, the sidecar file, locks ----------------------------------------------------


def test_records_of_a_previous_incarnation_are_ignored(shm_name, procs):
    """The native library re-creates the region in place (it knows nothing
    of the sidecar) and subscribes on ring 0, whose record still names our
    dead subscriber of the earlier incarnation. That record is not taken for
    the native subscriber's: its ring is left alone, reported unrecorded."""
    cfg = {"max_subscribers": 2, "sub_ring_capacity": 8, "pool_size": 16, "max_payload_size": 256}
    region = SharedRegion.create(shm_name, ChannelType.PubSub, Config(**cfg))
    first_incarnation = created_at(shm_name)
    dead_pid = procs.start_ready("dead", crashworkers.parked_subscriber, shm_name)  # ring 0
    procs.kill("dead")

    with nativepeer.start_native(NATIVE_RECREATE_AND_SUBSCRIBE, name=shm_name, config=cfg) as native:
        native.wait_ready()
        assert created_at(shm_name) != first_incarnation
        assert ring_states(shm_name) == [(RING_LIVE, 0), (RING_FREE, 0)]  # the native subscriber's
        pid, _, _, incarnation = record_head(sidecar_records(shm_name, 2)[0])
        assert (pid, incarnation) == (dead_pid, first_incarnation)  # stale, its lock free

        assert as_tuple(region.reclaim_dead_subscribers()) == ([], [0], [])
        assert ring_states(shm_name)[0] == (RING_LIVE, 0)
        native.tell()
        assert native.result() is True
    assert_recovered(shm_name, region)


def test_sidecar_records_each_owner_and_a_close_clears_its_record(shm_name):
    """The sidecar appears with the first subscriber and holds, per ring,
    (pid, process start time, start position, the region's created_at_ns).
    A graceful close clears exactly its own record."""
    region = SharedRegion.create(shm_name, ChannelType.PubSub, small_config())
    assert not os.path.exists(sidecar_path(shm_name))
    me = (os.getpid(), crashworkers.process_start_ticks(os.getpid()))
    first, second = Subscriber(region), Subscriber(region)
    pub = Publisher(region)
    pub.send(b"one")
    pub.send(b"two")
    records = sidecar_records(shm_name, 3)
    assert [record_head(record) for record in records[:2]] == [(*me, 0, created_at(shm_name))] * 2
    assert not any(records[2])

    first.close()
    records = sidecar_records(shm_name, 3)
    assert not any(records[0])
    assert record_head(records[1]) == (*me, 0, created_at(shm_name))
    third = Subscriber(region)  # ring 0 again, joining at its write position 2
    assert record_head(sidecar_records(shm_name, 3)[0]) == (*me, 2, created_at(shm_name))

    second.close()
    third.close()
    assert not any(b"".join(sidecar_records(shm_name, 3)))
    assert_recovered(shm_name, region)


@pytest.mark.parametrize("remove", ["region.unlink", "unlink_shm", "create"])
def test_removing_or_replacing_the_region_removes_its_sidecar(shm_name, remove):
    """unlink_shm, region.unlink and re-creating the region with another
    layout remove the sidecar; a subscriber still alive then closes without
    error."""
    cfg = small_config()
    region = SharedRegion.create(shm_name, ChannelType.PubSub, cfg)
    sub = Subscriber(region)
    assert os.path.exists(sidecar_path(shm_name))
    if remove == "region.unlink":
        region.unlink()
    elif remove == "unlink_shm":
        unlink_shm(shm_name)
    else:
        SharedRegion.create(shm_name, ChannelType.PubSub, small_config(pool_size=64))
    assert not os.path.exists(sidecar_path(shm_name))
    assert os.path.exists(f"/dev/shm{shm_name}") == (remove == "create")
    sub.close()
    assert not os.path.exists(sidecar_path(shm_name))


def test_two_subscribers_in_one_process_hold_independent_locks(shm_name):
    """Closing one of two subscribers of the same process leaves the other's
    lock held: neither this process nor another one takes it for dead."""
    region = SharedRegion.create(shm_name, ChannelType.PubSub, small_config())
    first, second = Subscriber(region), Subscriber(region)
    assert as_tuple(region.reclaim_dead_subscribers()) == ([], [], [])
    first.close()
    assert as_tuple(region.reclaim_dead_subscribers()) == ([], [], [])
    assert nativepeer.run_ours(RECLAIM, name=shm_name) == {"reclaimed": [], "unrecorded": [], "timed_out": []}
    assert ring_states(shm_name)[:2] == [(RING_FREE, 0), (RING_LIVE, 0)]
    Publisher(region).send(b"still here")
    assert second.try_receive() == b"still here"
    second.close()
    assert_recovered(shm_name, region)


# -- subscribers killed during their own teardown --------------------------------------------


def test_subscriber_killed_right_after_freeing_its_ring_leaves_no_record_behind(shm_name, procs):
    """A subscriber is killed as soon as its teardown has freed ring 0. No
    record of it may remain there: a native subscriber that joins ring 0
    next must not be taken for that dead owner (its ring freed under it).
    Its ring is left alone and reported unrecorded."""
    region = SharedRegion.create(shm_name, ChannelType.PubSub, small_config(max_payload_size=256))
    go, stopped = CTX.Event(), CTX.Value("i", 0, lock=False)
    procs.start_ready("closing", crashworkers.subscriber_stopping_after_leaving, shm_name, go, stopped)
    go.set()
    procs.wait_stopped("closing", stopped)
    procs.kill("closing")
    require(ring_states(shm_name)[0] == (RING_FREE, 0), f"ring 0 not freed: {ring_states(shm_name)}")
    assert not any(sidecar_records(shm_name, 3)[0])

    with nativepeer.start_native(NATIVE_SUBSCRIBER, name=shm_name, count=1) as native:
        native.wait_ready()  # the native subscriber holds ring 0 now
        require(ring_states(shm_name)[0] == (RING_LIVE, 0), f"native not on ring 0: {ring_states(shm_name)}")
        assert as_tuple(region.reclaim_dead_subscribers()) == ([], [0], [])
        assert ring_states(shm_name)[0] == (RING_LIVE, 0)
        native.tell()
        Publisher(region).send(nativepeer.make_payload(0))
        assert native.result()["seqs"] == [0]
    assert_recovered(shm_name, region)


def test_subscriber_killed_during_its_teardown_is_reclaimed(shm_name, procs):
    """The only subscriber closes while a slow (stopped, alive) publisher is
    admitted to its ring, and is killed while its teardown waits. Once the
    publisher finishes, the ring is Draining with in_flight 0, which no
    subscriber can join; its dead owner's record is still there, and
    reclaim_dead_subscribers() finishes that teardown."""
    cfg = small_config(max_subscribers=1, commit_timeout=30.0)  # the teardown waits, not gives up
    region = SharedRegion.create(shm_name, ChannelType.PubSub, cfg)
    go_close = CTX.Event()
    dead_pid = procs.start_ready("closing", crashworkers.closing_subscriber, shm_name, go_close)
    go, stopped = CTX.Event(), CTX.Value("i", 0, lock=False)
    procs.start_ready("slow", crashworkers.crashing_publisher, shm_name, 1, "holding_lock", 0, go, stopped, (), 0, 1)
    go.set()
    procs.wait_stopped("slow", stopped)  # admitted to ring 0, holding an entry's lock
    go_close.set()
    procs.wait_until(lambda: ring_states(shm_name)[0] == (RING_DRAINING, 1), "the teardown to wait for the publisher")
    procs.kill("closing")
    os.kill(procs.pid("slow"), signal.SIGCONT)  # the slow publisher finishes its message
    procs.wait_for("result", ["slow"])
    procs.join(["slow"])
    require(ring_states(shm_name) == [(RING_DRAINING, 0)], f"unexpected ring state: {ring_states(shm_name)}")
    assert region.diagnose().dead_subscriber_rings == 1

    assert as_tuple(region.reclaim_dead_subscribers()) == ([(0, dead_pid)], [], [])
    assert_recovered(shm_name, region)


# -- progress in the records ------------------------------------------------------------------


@pytest.mark.parametrize("how", ["iterate", "try_receive", "receive"])
def test_an_idle_subscriber_leaves_its_record_current(shm_name, how):
    """A subscriber that reads a burst of 64 messages and goes idle has its
    read position and losses in its record (for kickmsg stats), however it
    read them: iterating, polling until empty, or blocking until a timeout."""
    region = SharedRegion.create(shm_name, ChannelType.PubSub, small_config(sub_ring_capacity=64, pool_size=128))
    subscriber = Subscriber(region)
    pub = Publisher(region)
    for sequence in range(64):
        pub.send(b"%d" % sequence)
    if how == "iterate":
        assert len(list(subscriber)) == 64
    elif how == "try_receive":
        assert sum(1 for _ in iter(subscriber.try_receive, None)) == 64
    else:
        assert sum(1 for _ in iter(lambda: subscriber.receive(0.01), None)) == 64
    record, held = owners.read_owners(shm_name, 3)[0]
    assert held and (record.read_pos, record.lost) == (64, 0)
    subscriber.close()
