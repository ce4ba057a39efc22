"""Read-latest: try_receive_latest / receive_latest.

The newest committed message is returned and the unread ones passed over
are counted in ``skipped`` (messages overwritten before that count in
``lost``, as for an ordinary receive). Only the subscriber's private read
position moves: the ring's slot references are still given back by eviction
and by the drain when the subscriber leaves, which the independent
``rawregion`` reader checks.
"""
import mmap
import struct
import threading
import time

import pytest

from kickmsg import ChannelType, Config, Publisher, SharedRegion, Subscriber
import rawregion
from nativepeer import check_payload, publish, start_ours

LOCKED = 0xFFFFFFFFFFFFFFFF

# Every test on layout 4 and layout 9 (the ``layout`` fixture), but those marked layout4_only.
pytestmark = pytest.mark.usefixtures("layout")


def make(name: str, **fields):
    cfg = Config(**{**dict(max_subscribers=2, sub_ring_capacity=8, pool_size=32, max_payload_size=64), **fields})
    region = SharedRegion.create(name, ChannelType.PubSub, cfg)
    return Publisher(region), Subscriber(region)


def send_numbers(pub: Publisher, numbers) -> None:
    for number in numbers:
        pub.send(b"%d" % number)


def counts(sub: Subscriber) -> tuple:
    return sub.skipped, sub.lost


def busy_refcounts(name: str) -> list:
    """The refcounts of the slots in use, in slot order."""
    return [count for count in rawregion.pool(rawregion.read_bytes(name)).refcounts if count]


def sequence_address(name: str, ring: int, position: int) -> int:
    header = rawregion.header(rawregion.read_bytes(name))
    ring_base = header["sub_rings_offset"] + ring * header["sub_ring_stride"]
    return ring_base + 128 + (position & header["sub_ring_mask"]) * 16


def poke_sequence(name: str, ring: int, position: int, value: int) -> None:
    with open(f"/dev/shm{name}", "r+b") as file, mmap.mmap(file.fileno(), 0) as memory:
        struct.pack_into("<Q", memory, sequence_address(name, ring, position), value)


# -- one call at a time ---------------------------------------------------------------


def test_returns_the_newest_and_counts_the_rest_as_skipped(shm_name):
    pub, sub = make(shm_name)
    send_numbers(pub, range(5))
    assert sub.try_receive_latest() == b"4"
    assert counts(sub) == (4, 0)
    assert sub.try_receive_latest() is None  # nothing new
    assert sub.try_receive() is None
    assert counts(sub) == (4, 0)


def test_nothing_to_skip(shm_name):
    pub, sub = make(shm_name)
    assert sub.try_receive_latest() is None
    pub.send(b"only")
    assert sub.try_receive_latest() == b"only"
    assert counts(sub) == (0, 0)


def test_skipped_starts_at_zero_and_ordinary_receives_leave_it(shm_name):
    pub, sub = make(shm_name)
    assert sub.skipped == 0
    send_numbers(pub, range(3))
    assert list(sub) == [b"0", b"1", b"2"]
    assert counts(sub) == (0, 0)


def test_overflow_beyond_capacity_is_lost_not_skipped(shm_name):
    """20 messages into a ring of 8: 12 were overwritten (lost), 7 of the
    8 still there are passed over (skipped), the newest is returned."""
    pub, sub = make(shm_name)
    send_numbers(pub, range(20))
    assert sub.try_receive_latest() == b"19"
    assert counts(sub) == (7, 12)
    assert 1 + sub.skipped + sub.lost == 20


def test_exactly_a_full_ring_loses_nothing(shm_name):
    pub, sub = make(shm_name)
    send_numbers(pub, range(8))
    assert sub.try_receive_latest() == b"7"
    assert counts(sub) == (7, 0)


def test_interleaving_with_try_receive(shm_name):
    pub, sub = make(shm_name)
    send_numbers(pub, range(5))
    assert sub.try_receive() == b"0"
    assert sub.try_receive_latest() == b"4"
    assert counts(sub) == (3, 0)  # 1, 2, 3
    send_numbers(pub, [5, 6])
    assert sub.try_receive() == b"5"
    assert sub.try_receive_latest() == b"6"
    assert sub.try_receive() is None
    send_numbers(pub, [7, 8, 9])
    assert sub.try_receive_latest() == b"9"
    assert list(sub) == []
    assert counts(sub) == (5, 0)  # 1, 2, 3, 7, 8


def test_views_after_a_latest_continue_from_there(shm_name):
    pub, sub = make(shm_name)
    send_numbers(pub, range(4))
    assert sub.try_receive_latest() == b"3"
    pub.send(b"4")
    with sub.try_receive_view() as view:
        assert (bytes(view), view.ring_pos) == (b"4", 4)


def test_receive_latest_returns_at_once_when_something_is_there(shm_name):
    pub, sub = make(shm_name)
    send_numbers(pub, range(3))
    assert sub.receive_latest(30.0) == b"2"
    assert sub.receive_latest(0.001) is None  # times out: nothing new
    assert counts(sub) == (2, 0)


def test_receive_latest_waits_for_a_publisher(shm_name):
    """A receive_latest blocked in another thread gets the message
    published after it went to sleep."""
    pub, sub = make(shm_name)
    result = []
    thread = threading.Thread(target=lambda: result.append(sub.receive_latest(30.0)), daemon=True)
    thread.start()
    for _ in range(2000):  # bounded: until it sleeps
        if rawregion.ring(rawregion.read_bytes(shm_name), 0).has_waiter:
            break
        time.sleep(0.005)
    pub.send(b"late")
    thread.join(30)
    assert not thread.is_alive()
    assert result == [b"late"]


def test_newest_committed_passes_over_an_uncommitted_newest_entry(shm_name):
    """An entry still LOCKED by a writer is not committed: the newest
    committed one before it is returned, and the locked one is read once
    it commits."""
    pub, sub = make(shm_name, max_subscribers=1)
    send_numbers(pub, range(5))
    poke_sequence(shm_name, 0, 4, LOCKED)  # position 4 looks mid-commit
    assert sub.try_receive_latest() == b"3"
    assert counts(sub) == (3, 0)
    assert sub.try_receive_latest() is None
    poke_sequence(shm_name, 0, 4, 5)  # the writer commits
    assert sub.try_receive_latest() == b"4"
    assert counts(sub) == (3, 0)


def test_closed_subscriber_refuses(shm_name):
    pub, sub = make(shm_name)
    sub.close()
    with pytest.raises(ValueError, match="closed"):
        sub.try_receive_latest()
    with pytest.raises(ValueError, match="closed"):
        sub.receive_latest(0.01)


# -- slot references ---------------------------------------------------------------------


def test_skipping_releases_no_ring_reference(shm_name):
    """Passed-over messages keep their ring reference until they are
    evicted or the subscriber leaves."""
    pub, sub = make(shm_name, max_subscribers=1)
    send_numbers(pub, range(5))
    assert busy_refcounts(shm_name) == [1] * 5
    assert sub.try_receive_latest() == b"4"
    assert busy_refcounts(shm_name) == [1] * 5  # the copy's pin came and went
    send_numbers(pub, range(5, 15))  # wraps: evictions give slots back
    assert busy_refcounts(shm_name) == [1] * 8
    sub.close()
    rawregion.assert_pool_whole(shm_name)


def test_pool_whole_after_latest_reads_with_two_subscribers(shm_name):
    """One subscriber reads latest, the other everything: the second sees
    the whole stream, and after both leave the pool is whole."""
    region = SharedRegion.create(shm_name, ChannelType.PubSub,
                                 Config(max_subscribers=2, sub_ring_capacity=16, pool_size=48, max_payload_size=16))
    pub, latest, every = Publisher(region), Subscriber(region), Subscriber(region)
    seen = []
    for batch in range(6):
        send_numbers(pub, range(batch * 5, batch * 5 + 5))
        assert latest.try_receive_latest() == b"%d" % (batch * 5 + 4)
        seen += list(every)
    assert seen == [b"%d" % number for number in range(30)]
    assert counts(latest) == (24, 0) and every.lost == 0
    view = latest.try_receive_view()
    assert view is None
    latest.close()
    every.close()
    rawregion.assert_pool_whole(shm_name)


# -- against a publisher that keeps writing -------------------------------------------------

PUBLISH_STREAM = """
region = kickmsg.SharedRegion.open(P["name"])
pub = kickmsg.Publisher(region)
ready()
wait_go()
publish(pub, range(P["count"]), "mixed")
done(None)
"""


def read_latest_until(sub: Subscriber, last: int) -> list:
    """receive_latest until message ``last`` arrives (bounded); each one
    must be newer than the one before."""
    received = []
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        data = sub.receive_latest(0.5)
        if data is None:
            continue
        seq = check_payload(data)
        assert not received or seq > received[-1], f"{seq} after {received[-1]}"
        received.append(seq)
        if seq == last:
            return received
    pytest.fail(f"message {last} never arrived; got {received[-5:]}")


@pytest.mark.parametrize("publisher", ["process", "thread"])
def test_latest_under_a_continuous_publisher(shm_name, publisher):
    """Each receive_latest gets a newer message than the one before; every
    position passed is accounted for once: received + skipped + lost ==
    messages published (the subscriber joined before the first)."""
    count = 6000 if publisher == "process" else 3000
    region = SharedRegion.create(shm_name, ChannelType.PubSub,
                                 Config(max_subscribers=2, sub_ring_capacity=16, pool_size=64, max_payload_size=256))
    sub = Subscriber(region)
    if publisher == "process":
        with start_ours(PUBLISH_STREAM, name=shm_name, count=count) as peer:
            peer.wait_ready()
            peer.tell()
            received = read_latest_until(sub, count - 1)
            peer.result()
    else:
        thread = threading.Thread(target=publish, args=(Publisher(region), range(count)), daemon=True)
        thread.start()
        received = read_latest_until(sub, count - 1)
        thread.join(30)
        assert not thread.is_alive()
    assert len(received) + sub.skipped + sub.lost == count
    assert sub.try_receive_latest() is None
    sub.close()
    rawregion.assert_pool_whole(shm_name)
