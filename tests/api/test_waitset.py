"""WaitSet: waiting on many subscribers at once, and handlers.

A WaitSet announces itself on every ring as a blocking receive does
(has_waiter = 1, then write_pos read again), sleeps on all their futex words
at once and clears has_waiter when the wait ends, however it ends. The
multi-process tests publish from real processes, ours and the native 0.1.0;
where the sleeping path matters, tests run with the kernel's futex_waitv and
with the polling fallback.
"""
import datetime
import os
import signal
import threading
import time

import pytest

import rawregion
from conftest import new_shm_name
from kickmsg import ChannelType, Config, Node, Publisher, SharedRegion, Subscriber, WaitSet, atomics, typed
from kickmsg.atomics import Atomics
from kickmsg.protocol import common
from kickmsg.protocol.v4.layout import LOCKED_SEQUENCE, SEQUENCE_OFFSET, U32_MAX
from kickmsg.region import unlink_shm
from nativepeer import start_native, start_native9, start_ours
from conftest import layout4_only

# Every test on layout 4 and layout 9 (the ``layout`` fixture), but those marked layout4_only.
pytestmark = [pytest.mark.timeout(120), pytest.mark.usefixtures("layout")]
SMALL = dict(max_subscribers=2, sub_ring_capacity=8, pool_size=16, max_payload_size=64)
WAITV_PATHS = {"kernel": atomics.futex_waitv_kernel, "polling": atomics.futex_waitv_polling}


@pytest.fixture(params=list(WAITV_PATHS))
def waitv_path(request, monkeypatch):
    """Run the test with the kernel's futex_waitv, then with the fallback."""
    monkeypatch.setattr(atomics, "futex_waitv_uses_polling", request.param == "polling")
    return request.param


@pytest.fixture
def channels():
    """make(count, **config) -> that many fresh regions, removed after the test."""
    names = []

    def make(count: int, **fields) -> list[SharedRegion]:
        names.extend(new_shm_name("ws") for _ in range(count))
        config = Config(**{**SMALL, **fields})
        return [SharedRegion.create(name, ChannelType.PubSub, config) for name in names[-count:]]

    yield make
    for name in names:
        unlink_shm(name)


def has_waiters(regions: list[SharedRegion]) -> list[int]:
    """has_waiter of ring 0 of each region, read from /dev/shm by the independent reader."""
    return [rawregion.ring(rawregion.read_bytes(region.name), 0).has_waiter for region in regions]


def publish_once_announced(region: SharedRegion, message: bytes) -> threading.Thread:
    """From a thread: publish ``message`` once a waiter announced itself on ring 0."""

    def run():
        deadline = time.monotonic() + 20
        while has_waiters([region]) != [1] and time.monotonic() < deadline:
            time.sleep(0.001)
        Publisher(region).send(message)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread


# -- waiting ---------------------------------------------------------------------------


def test_wait_returns_the_subscribers_with_a_message_in_the_order_added(channels):
    regions = channels(3)
    subscribers = [Subscriber(region) for region in regions]
    with WaitSet() as waitset:
        for subscriber in subscribers:
            waitset.add(subscriber)
        assert waitset.wait(0.05) == []
        Publisher(regions[2]).send(b"c")
        Publisher(regions[0]).send(b"a")
        assert waitset.wait(0) == [subscribers[0], subscribers[2]]
        assert waitset.wait(5) == [subscribers[0], subscribers[2]]  # a wait receives nothing
        assert [subscriber.try_receive() for subscriber in subscribers] == [b"a", None, b"c"]
        assert waitset.wait(datetime.timedelta(milliseconds=20)) == []


def test_members_and_errors(channels):
    (region,) = channels(1)
    subscriber = Subscriber(region)
    waitset = WaitSet()
    with pytest.raises(ValueError, match="no subscribers to wait on"):
        waitset.wait(0)
    waitset.add(subscriber)
    assert subscriber in waitset and len(waitset) == 1
    with pytest.raises(ValueError, match="already in this WaitSet"):
        waitset.add(subscriber)
    with pytest.raises(TypeError, match="a Subscriber or a TypedSubscriber"):
        waitset.add(region)
    waitset.remove(subscriber)
    assert subscriber not in waitset
    with pytest.raises(KeyError):
        waitset.remove(subscriber)
    waitset.add(subscriber)
    subscriber.close()  # removed by the next wait, which then has nothing to wait on
    with pytest.raises(ValueError, match="no subscribers to wait on"):
        waitset.wait(0)
    assert subscriber not in waitset


def test_has_waiter_is_set_while_waiting_and_cleared_however_the_wait_ends(channels, waitv_path):
    regions = channels(3)
    subscribers = [Subscriber(region) for region in regions]
    waitset = WaitSet()
    for subscriber in subscribers:
        waitset.add(subscriber)
    seen = []

    def watch_then_publish():  # every ring announced, then a message to one of them
        deadline = time.monotonic() + 20
        while has_waiters(regions) != [1, 1, 1] and time.monotonic() < deadline:
            time.sleep(0.001)
        seen.append(has_waiters(regions))
        Publisher(regions[1]).send(b"b")

    watcher = threading.Thread(target=watch_then_publish, daemon=True)
    watcher.start()
    assert waitset.wait(20) == [subscribers[1]]
    watcher.join()
    assert seen == [[1, 1, 1]] and has_waiters(regions) == [0, 0, 0]
    assert subscribers[1].try_receive() == b"b"

    assert waitset.wait(0.02) == [] and has_waiters(regions) == [0, 0, 0]  # timed out

    class Interrupted(Exception):
        pass

    def interrupt(signum, frame):
        raise Interrupted

    previous = signal.signal(signal.SIGALRM, interrupt)
    try:
        signal.setitimer(signal.ITIMER_REAL, 0.1)
        with pytest.raises(Interrupted):
            waitset.wait(20)  # a signal handler raising in the middle of the sleep
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)
    assert has_waiters(regions) == [0, 0, 0]


class RecordingAtomics(Atomics):
    """Notes, in order, what happens to one ring's has_waiter and write_pos,
    and each sleep (futex_wait, futex_waitv) with the words slept on."""

    def __init__(self, ring, monkeypatch):
        self.ring = ring
        self.trace = []
        monkeypatch.setattr(common, "HARDWARE", self)  # the door a WaitSet sleeps through

    def futex_waitv(self, addresses, values, timeout_ns):
        self.trace.append(("sleep on", list(zip(addresses, values))))
        return atomics.futex_waitv_kernel(addresses, values, timeout_ns)

    def store_relaxed_u32(self, address, value):
        if address == self.ring.has_waiter:
            self.trace.append(("has_waiter =", value))
        super().store_relaxed_u32(address, value)

    def load_acquire_u64(self, address):
        value = super().load_acquire_u64(address)
        if address == self.ring.write_pos:
            self.trace.append(("write_pos ->", value))
        return value

    def futex_wait(self, address, expected, timeout_ns):
        self.trace.append(("sleep on", [(address, expected)]))
        return super().futex_wait(address, expected, timeout_ns)


def check_announced_before_every_sleep(trace: list, write_pos: int) -> None:
    """The blocking receive's protocol: before each sleep, has_waiter = 1
    then write_pos read, and the sleep is on write_pos's low 32 bits with
    the value read; has_waiter = 0 after the last sleep."""
    announced, seen = False, None
    for event in trace:
        if event[0] == "has_waiter =":
            announced, seen = event[1] == 1, None
        elif event[0] == "write_pos ->":
            seen = event[1]
        else:
            assert announced and seen is not None and (write_pos, seen & U32_MAX) in event[1], trace
    has_waiter = [event for event in trace if event[0] == "has_waiter ="]
    assert any(event[0] == "sleep on" for event in trace) and has_waiter[-1] == ("has_waiter =", 0), trace


@layout4_only
def test_a_wait_announces_itself_on_each_ring_as_a_blocking_receive_does(channels, monkeypatch):
    (region,) = channels(1)
    subscriber = Subscriber(region)
    ring = region.core.rings[0]
    region.core.atomics = recording = RecordingAtomics(ring, monkeypatch)
    assert subscriber.receive(0.01) is None
    check_announced_before_every_sleep(recording.trace, ring.write_pos)
    Publisher(region).send(b"x")  # write_pos 1: the value slept on follows it
    assert subscriber.try_receive() == b"x"
    recording.trace.clear()
    waitset = WaitSet()
    waitset.add(subscriber)
    assert waitset.wait(0.01) == []
    check_announced_before_every_sleep(recording.trace, ring.write_pos)
    assert ("write_pos ->", 1) in recording.trace


@layout4_only
def test_an_entry_claimed_but_not_committed_is_not_ready(channels):
    """A publisher between claiming a position and committing it: the
    WaitSet naps (as a blocking receive does) instead of reporting it."""
    (region,) = channels(1)
    subscriber = Subscriber(region)
    Publisher(region).send(b"x")
    sequence_address = region.core.rings[0].entries[0] + SEQUENCE_OFFSET
    region.core.atomics.store_release_u64(sequence_address, LOCKED_SEQUENCE)  # looks mid-commit
    waitset = WaitSet()
    waitset.add(subscriber)
    assert waitset.wait(0.1) == []
    region.core.atomics.store_release_u64(sequence_address, 1)  # committed, with no wake-up
    assert waitset.wait(10) == [subscriber]
    assert subscriber.try_receive() == b"x"


def test_an_idle_wait_uses_almost_no_cpu(channels, waitv_path):
    """Ten subscribers, nothing published: wait(2.0) sleeps (waking only to
    check in every 0.1 s, or in 5 ms slices for the fallback)."""
    waitset = WaitSet()
    for region in channels(10):
        waitset.add(Subscriber(region))
    before = time.process_time()
    assert waitset.wait(2.0) == []
    used = time.process_time() - before
    assert used < 0.2, f"an idle wait(2.0) on 10 subscribers ({waitv_path}) used {used:.3f} s of CPU"


def test_more_subscribers_than_the_kernel_sleeps_on(channels):
    """130 subscribers: 128 sleep in the kernel, the others are compared
    between slices. A message to either kind is found, and only it."""
    regions = channels(130)
    subscribers = [Subscriber(region) for region in regions]
    waitset = WaitSet()
    for subscriber in subscribers:
        waitset.add(subscriber)
    for index in (3, 129):
        publisher = publish_once_announced(regions[index], b"to %d" % index)
        assert waitset.wait(20) == [subscribers[index]]
        publisher.join()
        assert subscribers[index].try_receive() == b"to %d" % index


# -- typed subscribers, read-latest, handlers ------------------------------------------


def test_typed_subscribers_and_read_latest(prefix):
    node = Node("dashboard", prefix=prefix)
    Imu = typed.RecordType("Imu", [("seq", "<u4"), ("accel", "<f4")])
    imu_publisher = typed.advertise(node, "imu", Imu, Config(**SMALL))
    imu = typed.subscribe(node, "imu", Imu)
    state_publisher = node.advertise("state", Config(**SMALL))
    state = node.subscribe("state")
    handled = []
    with WaitSet() as waitset:
        waitset.add(imu, handled.append)
        waitset.add(state, handled.append, latest=True)
        with pytest.raises(ValueError, match="already in this WaitSet"):
            waitset.add(imu.subscriber)  # the same ring as the typed subscriber's
        assert waitset.wait(0.02) == []
        imu_publisher.send((1, 9.8))
        imu_publisher.send([(2, 9.7), (3, 9.6)])
        for number in range(5):
            state_publisher.send(b"%d" % number)
        assert waitset.wait(5) == [imu, state]
        assert waitset.spin_once(5) == 3
    assert [records["seq"].tolist() for records in handled[:2]] == [[1], [2, 3]]
    assert handled[2] == b"4" and state.skipped == 4 and state.lost == 0


def test_handlers_are_called_for_each_message(channels):
    regions = channels(2)
    subscribers = [Subscriber(region) for region in regions]
    publishers = [Publisher(region) for region in regions]
    handled = []
    waitset = WaitSet()
    waitset.add(subscribers[0], lambda message: handled.append(("a", message)))
    waitset.add(subscribers[1], lambda message: handled.append(("b", message)))
    assert waitset.spin_once(0.02) == 0
    for message in (b"1", b"2", b"3"):
        publishers[0].send(message)
    publishers[1].send(b"x")
    assert waitset.spin_once(5) == 4
    assert handled == [("a", b"1"), ("a", b"2"), ("a", b"3"), ("b", b"x")]
    handled.clear()
    threading.Timer(0.05, publishers[1].send, [b"later"]).start()
    assert waitset.spin(0.5) == 1 and handled == [("b", b"later")]


def test_a_busy_channel_cannot_starve_the_others(channels):
    """A handler that publishes again into its own channel: one spin_once
    handles at most a ring's worth (8) of it."""
    (region,) = channels(1)
    publisher = Publisher(region)
    waitset = WaitSet()
    waitset.add(Subscriber(region), publisher.send)
    publisher.send(b"again")
    assert waitset.spin_once(5) == SMALL["sub_ring_capacity"]


def test_handler_errors_stop_the_spin_and_lose_nothing(channels):
    (region,) = channels(1)
    subscriber, publisher = Subscriber(region), Publisher(region)
    waitset = WaitSet()

    def handler(message):
        if message == b"2":
            raise ValueError("cannot handle 2")

    waitset.add(subscriber, handler)
    for message in (b"1", b"2", b"3"):
        publisher.send(message)
    with pytest.raises(ValueError, match="cannot handle 2"):
        waitset.spin_once(5)
    assert subscriber.try_receive() == b"3" and has_waiters([region]) == [0]
    waitset.add(Subscriber(region))
    with pytest.raises(ValueError, match="spin needs a handler for every subscriber"):
        waitset.spin_once(0)


# -- other processes -------------------------------------------------------------------

# A publisher process: once the test's main thread has announced itself on
# the ring (has_waiter, read from /dev/shm) and sleeps in the system call
# given (futex_waitv: 449; futex, for the fallback: 202), it publishes one
# message. Ours also counts the waiters its wake-up woke.
PUBLISH_TO_A_SLEEPER = r"""
import struct, time

def announced_and_asleep():
    with open("/dev/shm" + P["name"], "rb") as region_file:
        data = region_file.read(4096)
    rings_offset, = struct.unpack_from("<Q", data, 24)
    has_waiter, = struct.unpack_from("<I", data, rings_offset + 72)  # ring 0
    with open(f"/proc/{P['pid']}/syscall") as syscall:  # the main thread's
        return has_waiter == 1 and syscall.read().split()[0] == P["syscall"]

region = kickmsg.SharedRegion.open(P["name"])
if P["count_wakes"]:
    from kickmsg.atomics import Atomics

    class CountingWakes(Atomics):
        woken = 0

        def futex_wake_all(self, address):
            woken = super().futex_wake_all(address)
            self.woken += woken
            return woken

    region.core.atomics = CountingWakes()
publisher = kickmsg.Publisher(region)
ready()
deadline = time.monotonic() + 20
while not announced_and_asleep() and time.monotonic() < deadline:
    time.sleep(0.001)
publisher.send(P["message"].encode())
done({"woken": region.core.atomics.woken if P["count_wakes"] else None})
"""


@pytest.mark.parametrize(
    "impl, path", [("ours", "kernel"), ("ours", "polling"), ("native", "kernel")], ids=["ours", "ours-polling", "native"]
)
def test_a_hundred_subscribers_woken_by_another_process(channels, monkeypatch, layout, impl, path):
    """A publish from another process into one of 100 channels wakes the
    WaitSet, which returns exactly that subscriber; the publisher's
    wake-up found it asleep on that ring's futex (kernel path). The native
    publisher is the one of the layout: 0.1.0 or 0.9.2."""
    monkeypatch.setattr(atomics, "futex_waitv_uses_polling", path == "polling")
    regions = channels(100)
    subscribers = [Subscriber(region) for region in regions]
    waitset = WaitSet()
    for subscriber in subscribers:
        waitset.add(subscriber)
    start = start_ours if impl == "ours" else {4: start_native, 9: start_native9}[layout]
    params = dict(
        name=regions[99].name, pid=os.getpid(), syscall="449" if path == "kernel" else "202", message=f"from {impl}",
        count_wakes=impl == "ours",
    )
    with start(PUBLISH_TO_A_SLEEPER, **params) as publisher:
        publisher.wait_ready()
        ready = waitset.wait(20)
        result = publisher.result()
    assert ready == [subscribers[99]]
    assert [subscriber.try_receive() for subscriber in subscribers] == [None] * 99 + [f"from {impl}".encode()]
    assert has_waiters(regions) == [0] * 100
    if impl == "ours" and path == "kernel":
        assert result["woken"] == 1


RECREATE_AND_PUBLISH = r"""
import time
ready()
wait_go()
region = kickmsg.SharedRegion.create(P["name"], kickmsg.ChannelType.PubSub, make_config(P["config"]))
deadline = time.monotonic() + 20
while not subscriber_joined(P["name"]) and time.monotonic() < deadline:
    time.sleep(0.005)  # until the waiting subscriber followed and joined a ring
kickmsg.Publisher(region).send(b"in the new region")
done({})
"""


def test_a_wait_follows_a_region_recreated_under_it(channels):
    """Another process re-creates a channel with another layout while a
    WaitSet waits: within the same wait, the subscriber checks in, joins a
    ring of the new region, and the WaitSet sleeps on that ring's word."""
    region, other = channels(2)
    subscriber = Subscriber(region)
    waitset = WaitSet()
    waitset.add(subscriber)
    waitset.add(Subscriber(other))
    with start_ours(RECREATE_AND_PUBLISH, name=region.name, config=dict(SMALL, sub_ring_capacity=16, pool_size=32)) as peer:
        peer.wait_ready()
        peer.tell()
        ready = waitset.wait(20)
        peer.result()
    assert ready == [subscriber]
    assert subscriber.try_receive() == b"in the new region" and subscriber.rejoined == 1
