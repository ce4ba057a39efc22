"""Publishers and subscribers in separate processes sharing one region.

The workers live in ``mpworkers`` and run in spawned processes (started by the
``procs`` fixture, a ``crashworkers.Processes``). Every wait is
bounded; a worker that does not finish in time is killed and the test fails
naming it. Results come back on a pipe per worker; the region's final state is checked
with ``rawregion``, which shares no code with the package.
"""
import os
import signal
import time

import pytest

import mpworkers
import rawregion
from crashworkers import CTX, RUN_S, STARTUP_S
from conftest import on_layout4
from kickmsg import ChannelType, Config, Publisher, SharedRegion, Subscriber

RING_FREE, RING_LIVE = 0, 1
# The blocked receiver waits up to 30 s, then checks the ring once more, so a
# missed wake-up would still deliver the message after 30 s. Waiting less
# than that for it tells a wake-up from a timeout (a wake-up takes far less).
WAKE_WAIT_S = 20

pytestmark = pytest.mark.timeout(240)


def channel_config(**fields) -> Config:
    """A config with a generous commit timeout: on two busy cores a publisher
    may be descheduled mid-commit, and must not be taken for a crashed one."""
    return Config(commit_timeout=2.0, **fields)


def ring_states(name) -> list:
    data = rawregion.read_bytes(name)
    count = rawregion.header(data)["max_subs"]
    return [rawregion.ring(data, index) for index in range(count)]


def assert_all_rings_free(name):
    for index, ring in enumerate(ring_states(name)):
        assert (ring.state, ring.in_flight) == (RING_FREE, 0), f"ring {index} of {name}: {ring}"


def wait_for_ring(name, index, condition, what):
    """Poll ring ``index`` (raw bytes) until ``condition(ring)``, bounded."""
    deadline = time.monotonic() + STARTUP_S
    while True:
        ring = rawregion.ring(rawregion.read_bytes(name), index)
        if condition(ring):
            return ring
        assert time.monotonic() < deadline, f"ring {index} of {name} never {what}: {ring}"
        time.sleep(0.001)


# -- 1. many publishers, many subscribers --------------------------------------------


def test_two_publishers_three_subscribers(shm_name, procs):
    """2 publisher x 3 subscriber processes, 20 000 messages each publisher.

    Every subscriber joins before publishing starts and stays to the end, so
    its ring sees all 40 000 publishes: each is received or counted lost.
    Received messages are intact, unique and in order per publisher; one
    subscriber reads zero-copy views and keeps a few pinned while traffic
    goes on. After everyone has left, the pool is whole and every ring Free.
    """
    count, publishers, subscribers = 20_000, [1, 2], ["sub-a", "sub-b", "sub-views"]
    # Between publishes the rings hold at most capacity + 2 distinct slots
    # (each ring's latest entries differ from another's only by the
    # publishers' one message in flight). With held_views pinned on top, this
    # pool always has a slot for the next publish; it may run dry briefly
    # (publishers then retry), rarely in practice.
    capacity, held_views = 16, 3
    cfg = channel_config(max_subscribers=4, sub_ring_capacity=capacity, pool_size=capacity + 8, max_payload_size=64)
    SharedRegion.create(shm_name, ChannelType.PubSub, cfg)
    go, done = CTX.Event(), CTX.Event()

    procs.start("sub-a", mpworkers.numbered_subscriber, shm_name, done)
    procs.start("sub-b", mpworkers.numbered_subscriber, shm_name, done)
    procs.start("sub-views", mpworkers.numbered_subscriber, shm_name, done, None, None, held_views)
    procs.wait_for("ready", subscribers, STARTUP_S)
    for publisher_id in publishers:
        procs.start(f"pub-{publisher_id}", mpworkers.numbered_publisher, shm_name, publisher_id, count, go)
    publisher_labels = [f"pub-{publisher_id}" for publisher_id in publishers]
    procs.wait_for("ready", publisher_labels, STARTUP_S)
    go.set()

    published = procs.wait_for("result", publisher_labels, RUN_S)
    procs.join(publisher_labels)
    done.set()
    received = procs.wait_for("result", subscribers, RUN_S)
    procs.join(subscribers)

    print("publishers:", published)
    for label, result in received.items():
        print(label, {key: result[key] for key in ("received", "lost", "per_publisher")})
        assert result["problem_count"] == 0, f"{label}: {result['problem_count']} problems, first: {result['problems']}"
        assert result["received"] + result["lost"] == len(publishers) * count, f"{label}: {result}"
        assert set(result["per_publisher"]) <= set(publishers), f"{label}: {result}"
        assert result["drain_timeouts"] == 0, f"{label}: {result}"
    rings = ring_states(shm_name)
    assert [ring.write_pos for ring in rings] == [len(publishers) * count] * len(subscribers) + [0]
    assert_all_rings_free(shm_name)
    rawregion.assert_pool_whole(shm_name)


# -- 2. blocking receive woken across processes -----------------------------------


@pytest.mark.parametrize("use_view", [False, True], ids=["receive", "receive_view"])
def test_blocking_receive_is_woken_by_another_process(shm_name, procs, use_view):
    """A subscriber blocked in receive (futex wait) is woken by a publish from
    another process, and returns exactly that message, well before its
    receive timeout."""
    SharedRegion.create(shm_name, ChannelType.PubSub, channel_config(max_subscribers=2, sub_ring_capacity=4, pool_size=8))
    procs.start("receiver", mpworkers.blocking_receiver, shm_name, use_view)
    procs.wait_for("ready", ["receiver"], STARTUP_S)
    wait_for_ring(shm_name, 0, lambda ring: ring.has_waiter == 1, "got a waiter")

    message = f"wake up, {os.getpid()} {time.time_ns()}".encode()
    Publisher(SharedRegion.open(shm_name)).send(message)
    result = procs.wait_for("result", ["receiver"], WAKE_WAIT_S)["receiver"]
    procs.join(["receiver"])

    assert result == message
    assert_all_rings_free(shm_name)
    rawregion.assert_pool_whole(shm_name)


# -- 3. a subscriber process going away ----------------------------------------------


def publish_to_one_subscriber(name, procs, ending, count=3):
    """Start a view_holder, publish ``count`` messages to it, and wait until it
    holds them all as views. Returns the messages."""
    procs.start("holder", mpworkers.view_holder, name, count, ending)
    procs.wait_for("ready", ["holder"], STARTUP_S)
    pub = Publisher(SharedRegion.open(name))
    messages = [f"message {i}".encode() for i in range(count)]
    for message in messages:
        assert pub.send(message) == len(message)
    held = procs.wait_for("holding", ["holder"], RUN_S)["holder"]
    assert held == messages
    return messages


@pytest.mark.parametrize("ending", ["close", "return", "exit"])
def test_subscriber_process_leaving_normally_frees_its_ring(shm_name, procs, ending):
    """A subscriber process that ends normally, whether it closes, just drops
    its subscriber and views, or leaves them to interpreter shutdown, frees its
    ring and gives every slot back."""
    SharedRegion.create(shm_name, ChannelType.PubSub, channel_config(max_subscribers=2, sub_ring_capacity=4, pool_size=8))
    publish_to_one_subscriber(shm_name, procs, ending)
    procs.join(["holder"])

    assert_all_rings_free(shm_name)
    rawregion.assert_pool_whole(shm_name)


@on_layout4
def test_subscriber_killed_holding_views_leaves_its_ring_live(shm_name, procs):
    """SIGKILL skips the teardown: the ring stays Live (a later issue recovers
    it), and each received slot keeps the ring's reference plus the dead
    view's pin. Other subscribers can still join."""
    count, pool_size = 3, 8
    SharedRegion.create(
        shm_name, ChannelType.PubSub, channel_config(max_subscribers=2, sub_ring_capacity=4, pool_size=pool_size)
    )
    publish_to_one_subscriber(shm_name, procs, "wait", count)
    holder = procs.processes["holder"]
    os.kill(holder.pid, signal.SIGKILL)
    holder.join(RUN_S)
    assert holder.exitcode == -signal.SIGKILL

    data = rawregion.read_bytes(shm_name)
    ring = rawregion.ring(data, 0)
    assert (ring.state, ring.in_flight, ring.write_pos) == (RING_LIVE, 0, count)
    held_slots = [slot for _, slot, _ in ring.entries[:count]]
    pool = rawregion.pool(data)
    assert sorted(pool.free_slots + held_slots) == list(range(pool_size))
    assert [pool.refcounts[slot] for slot in held_slots] == [2] * count  # ring reference + view pin
    assert rawregion.ring(data, 1).state == RING_FREE

    with Subscriber(SharedRegion.open(shm_name)):
        assert rawregion.ring(rawregion.read_bytes(shm_name), 1).state == RING_LIVE


# -- 4. subscribers at different speeds ------------------------------------------------


def test_slow_subscriber_does_not_hold_back_a_fast_one(shm_name, procs):
    """One publisher, a fast and a slow subscriber process. The publisher
    never gets more than half a ring ahead of the fast one, which therefore
    receives everything; the slow one sleeps until two rings' worth has been
    published after each message it reads, so it is lapped and loses some,
    and accounts for every publish as received or lost. It never blocks the
    publisher or the fast subscriber."""
    count, capacity = 4_000, 16
    cfg = channel_config(max_subscribers=2, sub_ring_capacity=capacity, pool_size=2 * capacity + 8, max_payload_size=64)
    SharedRegion.create(shm_name, ChannelType.PubSub, cfg)
    go, done = CTX.Event(), CTX.Event()
    fast_progress, published = CTX.Value("q", 0, lock=False), CTX.Value("q", 0, lock=False)

    procs.start("fast", mpworkers.numbered_subscriber, shm_name, done, fast_progress, None)
    procs.start("slow", mpworkers.numbered_subscriber, shm_name, done, None, (published, 2 * capacity))
    procs.wait_for("ready", ["fast", "slow"], STARTUP_S)
    procs.start(
        "pub", mpworkers.numbered_publisher, shm_name, 7, count, go, (fast_progress, capacity // 2), published
    )
    procs.wait_for("ready", ["pub"], STARTUP_S)
    go.set()

    procs.wait_for("result", ["pub"], RUN_S)
    procs.join(["pub"])
    done.set()
    results = procs.wait_for("result", ["fast", "slow"], RUN_S)
    procs.join(["fast", "slow"])

    fast, slow = results["fast"], results["slow"]
    print("fast:", fast, "\nslow:", slow)
    for label, result in results.items():
        assert result["problem_count"] == 0, f"{label}: {result['problems']}"
    assert (fast["received"], fast["lost"]) == (count, 0)
    assert slow["lost"] > 0
    assert slow["received"] + slow["lost"] == count
    assert_all_rings_free(shm_name)
    rawregion.assert_pool_whole(shm_name)
