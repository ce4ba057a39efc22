"""Spin, then park (a blocking receive's polling budget) and pages mapped at
open (no page faults on the first messages)."""
import datetime
import mmap
import resource
import threading
import time

import pytest

import kickmsg
from conftest import layout4_only

# Every test on layout 4 and layout 9 (the ``layout`` fixture), but those marked layout4_only.
pytestmark = pytest.mark.usefixtures("layout")


def subscriber_counting_waits(region, spin):
    """A subscriber whose futex sleeps are counted."""
    subscriber = kickmsg.Subscriber(region, spin=spin)
    sleeps = []
    park = subscriber.core.park
    subscriber.core.park = lambda deadline_ns: sleeps.append(1) or park(deadline_ns)
    return subscriber, sleeps


def publish_later(region, messages, every_s):
    def run():
        publisher = kickmsg.Publisher(region)
        for message in messages:
            time.sleep(every_s)
            publisher.send(message)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread


def test_a_topic_slower_than_the_budget_never_spins(shm_name):
    """Every wait outlasts the 1 ms budget: each sleeps on the futex at once."""
    region = kickmsg.SharedRegion.create(shm_name, kickmsg.ChannelType.PubSub, kickmsg.Config(), "t")
    subscriber, sleeps = subscriber_counting_waits(region, spin=0.001)
    messages = [b"m%d" % index for index in range(5)]
    thread = publish_later(region, messages, every_s=0.02)  # 50 Hz
    received, sleeps_before = [], []
    for _ in messages:
        sleeps_before.append(len(sleeps))
        received.append(subscriber.receive(timeout=2.0))
    thread.join()
    assert received == messages
    assert all(later > earlier for earlier, later in zip(sleeps_before, sleeps_before[1:] + [len(sleeps)]))


def test_messages_sooner_than_the_budget_are_caught_spinning(shm_name):
    """The first wait parks (nothing known yet); it lasted less than the
    budget, so the next ones keep trying and never sleep on the futex."""
    region = kickmsg.SharedRegion.create(shm_name, kickmsg.ChannelType.PubSub, kickmsg.Config(), "t")
    subscriber, sleeps = subscriber_counting_waits(region, spin=datetime.timedelta(seconds=2))
    messages = [b"m%d" % index for index in range(5)]
    thread = publish_later(region, messages, every_s=0.01)
    received = [subscriber.receive(timeout=5.0)]
    sleeps_for_the_first = len(sleeps)
    received += [subscriber.receive(timeout=5.0) for _ in messages[1:]]
    thread.join()
    assert received == messages
    assert sleeps_for_the_first >= 1 and len(sleeps) == sleeps_for_the_first


def test_a_spin_ends_at_the_deadline(shm_name):
    region = kickmsg.SharedRegion.create(shm_name, kickmsg.ChannelType.PubSub, kickmsg.Config(), "t")
    subscriber, sleeps = subscriber_counting_waits(region, spin=10.0)
    subscriber._idle_gap_ns = 0  # as if messages had just been arriving back to back
    began = time.monotonic()
    assert subscriber.receive(timeout=0.05) is None
    assert time.monotonic() - began < 5.0 and sleeps == []  # spun until the deadline, never slept


def test_spin_zero_never_spins(shm_name):
    region = kickmsg.SharedRegion.create(shm_name, kickmsg.ChannelType.PubSub, kickmsg.Config(), "t")
    subscriber, sleeps = subscriber_counting_waits(region, spin=0)
    subscriber._idle_gap_ns = 0
    assert subscriber.receive(timeout=0.01) is None
    assert sleeps


@pytest.mark.parametrize("spin, error", [(-0.001, ValueError), ("fast", TypeError), (True, TypeError)])
def test_a_bad_budget_is_refused_naming_it(shm_name, spin, error):
    region = kickmsg.SharedRegion.create(shm_name, kickmsg.ChannelType.PubSub, kickmsg.Config(), "t")
    with pytest.raises(error, match="spin"):
        kickmsg.Subscriber(region, spin=spin)
    with pytest.raises(error, match="spin"):
        kickmsg.WaitSet(spin=spin)


@pytest.mark.parametrize("spin, every_s", [(2.0, 0.01), (0.001, 0.02)])
def test_a_waitset_spins_then_parks_like_a_receive(prefix, monkeypatch, spin, every_s):
    """Two channels, messages alternating between them: with a budget longer
    than the gaps only the first wait sleeps in futex_waitv, the others see
    their message while spinning; with a shorter one every wait sleeps."""
    from kickmsg import atomics
    from kickmsg.protocol import common

    regions = [
        kickmsg.SharedRegion.create(f"/{prefix}_{index}", kickmsg.ChannelType.PubSub, kickmsg.Config(), "t")
        for index in range(2)
    ]
    subscribers = [kickmsg.Subscriber(region) for region in regions]
    sleeps = []

    class CountingSleeps(atomics.Atomics):
        def futex_waitv(self, *args):
            sleeps.append(1)
            return atomics.HARDWARE.futex_waitv(*args)

    monkeypatch.setattr(common, "HARDWARE", CountingSleeps())  # the door a WaitSet sleeps through
    messages = [b"m%d" % index for index in range(6)]

    def publish():
        publishers = [kickmsg.Publisher(region) for region in regions]
        for index, message in enumerate(messages):
            time.sleep(every_s)
            publishers[index % 2].send(message)

    thread = threading.Thread(target=publish, daemon=True)
    thread.start()
    waitset = kickmsg.WaitSet(spin=spin)
    for subscriber in subscribers:
        waitset.add(subscriber)
    received, sleeps_per_wait = [], []
    while len(received) < len(messages):
        before = len(sleeps)
        ready = waitset.wait(timeout=5.0)
        sleeps_per_wait.append(len(sleeps) - before)
        received += [subscriber.try_receive() for subscriber in ready]
    thread.join()
    assert received == messages
    if spin > every_s:
        assert sleeps_per_wait[0] >= 1 and sum(sleeps_per_wait[1:]) == 0
    else:
        assert all(sleeps_per_wait)


def minor_faults_touching(buffer, start, end) -> int:
    """Minor page faults this process takes writing one byte per page."""
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    for offset in range(start, end, mmap.PAGESIZE):
        buffer[offset] = 1
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before


@layout4_only
def test_a_writable_mapping_has_its_pages_mapped_already(shm_name):
    """Create and open map every page (MADV_POPULATE_WRITE): a first pass over
    a 4 MiB pool takes (almost) no page faults, where it used to take one
    per page (a write fault maps one page at a time)."""
    cfg = kickmsg.Config(sub_ring_capacity=8, pool_size=64, max_payload_size=65536)
    created = kickmsg.SharedRegion.create(shm_name, kickmsg.ChannelType.PubSub, cfg, "t")
    pages = created.mapping.size // mmap.PAGESIZE
    start = created.core.payload_offsets[0]
    assert minor_faults_touching(created.mapping.buffer, start, created.mapping.size) < pages // 10
    opened = kickmsg.SharedRegion.open(shm_name)
    assert opened.mapping is not created.mapping
    assert minor_faults_touching(opened.mapping.buffer, start, opened.mapping.size) < pages // 10

