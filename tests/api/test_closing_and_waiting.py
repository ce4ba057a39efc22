"""Closing a Publisher, a receive that blocks by default (and Ctrl-C ends),
and what a WaitSet refuses or does with a subscriber closed while in it.
Processes are real; every wait is bounded."""
import signal
import time

import pytest

import rawregion
from kickmsg import ChannelType, Config, Publisher, SharedRegion, Subscriber, WaitSet
from kickmsg import owners
from kickmsg.region import unlink_shm
from nativepeer import start_ours

# Every test on layout 4 and layout 9 (the ``layout`` fixture).
pytestmark = [pytest.mark.timeout(120), pytest.mark.usefixtures("layout")]

SMALL = Config(max_subscribers=4, sub_ring_capacity=8, pool_size=16, max_payload_size=64)


@pytest.fixture
def region(shm_name):
    made = SharedRegion.create(shm_name, ChannelType.PubSub, SMALL, "closing-test")
    yield made
    unlink_shm(shm_name)


def free_slots(name: str) -> int:
    return len(rawregion.pool(rawregion.read_bytes(name)).free_slots)


# -- Publisher.close ---------------------------------------------------------------------------


def test_publisher_close_clears_its_record_gives_back_its_slot_and_refuses_to_send(region):
    with Publisher(region, name="closing-pub") as publisher:
        assert [record.name for record, _ in owners.read_publishers(region)] == [b"closing-pub"]
        slot = publisher.allocate(8)
        assert free_slots(region.name) == SMALL.pool_size - 1
    assert owners.read_publishers(region) == []
    assert free_slots(region.name) == SMALL.pool_size  # the slot allocated and not published is back
    assert slot.publish() == 0  # delivers nothing
    for attempt in (lambda: publisher.send(b"late"), lambda: publisher.allocate(4)):
        with pytest.raises(ValueError, match=f"this publisher of {region.name} is closed"):
            attempt()
    publisher.close()  # again: nothing more


def test_a_closed_publisher_sends_nothing_to_a_subscriber(region):
    with Subscriber(region) as subscriber:
        publisher = Publisher(region)
        publisher.send(b"before")
        publisher.close()
        with pytest.raises(ValueError):
            publisher.send(b"after")
        assert [subscriber.try_receive(), subscriber.try_receive()] == [b"before", None]


# -- receive() blocks until a message ----------------------------------------------------------

BLOCKING_RECEIVER = r"""
import signal
signal.signal(signal.SIGINT, signal.default_int_handler)
region = kickmsg.SharedRegion.open(P["name"])
subscriber = kickmsg.Subscriber(region)
ready()
try:
    outcome = ["received", subscriber.receive().decode()]
except KeyboardInterrupt:
    outcome = ["interrupted", None]
subscriber.close()
done(outcome)
"""


def wait_until_sleeping(name: str, receiver) -> None:
    """Until the receiver's ring says a receive sleeps on it (has_waiter)."""
    deadline = time.monotonic() + 30
    while not rawregion.ring(rawregion.read_bytes(name), 0).has_waiter:
        assert receiver.proc.poll() is None and time.monotonic() < deadline, "the receiver never slept in receive()"
        time.sleep(0.005)


def test_receive_without_a_timeout_waits_for_a_message(region):
    with start_ours(BLOCKING_RECEIVER, name=region.name, timeout=60) as receiver:
        receiver.wait_ready()
        wait_until_sleeping(region.name, receiver)
        Publisher(region).send(b"worth the wait")
        assert receiver.result() == ["received", "worth the wait"]


def test_ctrl_c_interrupts_a_receive_without_a_timeout(region):
    """The receive raises KeyboardInterrupt; the subscriber then leaves its
    ring cleanly."""
    with start_ours(BLOCKING_RECEIVER, name=region.name, timeout=60) as receiver:
        receiver.wait_ready()
        wait_until_sleeping(region.name, receiver)
        receiver.proc.send_signal(signal.SIGINT)
        assert receiver.result() == ["interrupted", None]
    data = rawregion.read_bytes(region.name)
    assert [rawregion.ring(data, index).state for index in range(SMALL.max_subscribers)] == [0] * SMALL.max_subscribers


# -- WaitSet: what it refuses, and members closed while in it ----------------------------------


def test_waitset_refuses_a_handler_that_is_not_callable(region):
    with Subscriber(region) as subscriber, WaitSet() as waitset:
        with pytest.raises(TypeError, match="a WaitSet handler must be callable, not 'print'"):
            waitset.add(subscriber, "print")
        assert subscriber not in waitset


def test_waitset_refuses_a_closed_subscriber(region):
    subscriber = Subscriber(region)
    subscriber.close()
    with WaitSet() as waitset:
        with pytest.raises(ValueError, match=r"Subscriber\(.*closed.*\) is closed: a WaitSet cannot wait on it"):
            waitset.add(subscriber)
        assert len(waitset) == 0


def test_a_member_closed_while_in_the_set_is_removed_by_the_next_wait(region):
    publisher = Publisher(region)
    with Subscriber(region) as kept, WaitSet() as waitset:
        closed = Subscriber(region)
        waitset.add(kept)
        waitset.add(closed)
        closed.close()
        publisher.send(b"for the one kept")
        assert waitset.wait(timeout=5) == [kept]
        assert closed not in waitset and len(waitset) == 1
        kept.close()
        with pytest.raises(ValueError, match="no subscribers to wait on"):
            waitset.wait(timeout=0)


def test_a_handler_may_close_its_own_subscriber(region):
    """spin_once stops handling that subscriber's messages at once; the
    next wait removes it, the others go on."""
    publisher = Publisher(region)
    handled = []
    with Subscriber(region) as other, Subscriber(region) as quitter, WaitSet() as waitset:
        def quit_after_one(message):
            handled.append(("quitter", message))
            quitter.close()

        waitset.add(quitter, quit_after_one)
        waitset.add(other, lambda message: handled.append(("other", message)))
        publisher.send(b"one")
        publisher.send(b"two")
        assert waitset.spin_once(timeout=5) == 3
        assert handled == [("quitter", b"one"), ("other", b"one"), ("other", b"two")]
        publisher.send(b"three")
        assert waitset.spin_once(timeout=5) == 1
        assert handled[-1] == ("other", b"three") and len(waitset) == 1
