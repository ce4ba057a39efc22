"""A region with many rings, as the native library makes them (it has no
bound on max_subscribers): the tools read the header, two words of each
idle ring and nothing else of it, and ``stats`` counts idle rings in one
line instead of printing each. Counted, never timed: reads through a
counting atomics object, ring address objects built, owner records read.
"""
import collections
import json
import os
import subprocess
import sys

import pytest

import nativepeer
from kickmsg import Publisher, SharedRegion, Subscriber
from kickmsg.atomics import HARDWARE, OPERATIONS, Atomics
from kickmsg import owners
from kickmsg.ops import diagnostics, exporter
from kickmsg.protocol.v4 import layout

RINGS = 20_000  # far above the 1024 this package creates; a million behaves the same, only slower to build
USED = 3  # rings 0..2: two subscribers of ours (Live), one that left (Free, written)
CONFIG = dict(max_subscribers=RINGS, sub_ring_capacity=2, pool_size=8, max_payload_size=8)

NATIVE_CREATE = r"""
region = kickmsg.SharedRegion.create(P["name"], kickmsg.ChannelType.PubSub, make_config(P["config"]), "native")
done(region.name)
"""


@pytest.fixture
def many_rings(shm_name):
    """A native region of RINGS rings: rings 0 and 1 held by our
    subscribers, ring 2 left by one, 3 messages published; the rest idle."""
    nativepeer.run_native(NATIVE_CREATE, name=shm_name, config=CONFIG)
    region = SharedRegion.open(shm_name)
    subscribers = [Subscriber(region) for _ in range(USED)]
    publisher = Publisher(region)
    for n in range(3):
        publisher.send(b"m%d" % n)
    subscribers.pop().close()
    yield shm_name
    del subscribers, publisher


class Counts:
    """What the tools read: atomic reads per (ring, offset in the ring),
    reads outside the rings, ring address objects built, owner records
    read."""

    def __init__(self):
        self.ring_words = collections.Counter()  # (ring, offset) -> reads
        self.other_words = 0
        self.rings_built = 0
        self.records_read = 0


def counting_atomics(counts: Counts, region: SharedRegion) -> Atomics:
    """The hardware atomics, counting each call by the word it touches: a
    (ring, offset in the ring), or any other word."""
    g, base = region.geometry, region.mapping.address

    class CountingAtomics(Atomics):
        pass

    def counted_operation(name):
        operation = getattr(HARDWARE, name)

        def counted(self, address, *arguments):
            offset = address - base - g.sub_rings_offset
            if 0 <= offset < g.max_subs * g.ring_stride:
                counts.ring_words[divmod(offset, g.ring_stride)] += 1
            else:
                counts.other_words += 1
            return operation(address, *arguments)

        return counted

    for name in OPERATIONS:
        if name != "fence_seq_cst":  # the fence touches no word
            setattr(CountingAtomics, name, counted_operation(name))
    return CountingAtomics()


@pytest.fixture
def counts(monkeypatch):
    """Every region the tools open or inspect reads through a counting
    atomics object, and counts the ring address objects it builds (its
    core's ``ring`` calls, each building one); owner record reads are
    counted."""
    counts = Counts()
    opening, inspecting, reading = SharedRegion.open, SharedRegion.inspect, owners._read_record

    def counted(found):
        core = found.core
        core.atomics = counting_atomics(counts, found)
        building = core.ring

        def counting_ring(index):
            counts.rings_built += 1
            return building(index)

        core.ring = counting_ring
        return found

    def counting_read_record(fd, ring):
        counts.records_read += 1
        return reading(fd, ring)

    monkeypatch.setattr(SharedRegion, "open", staticmethod(lambda name, expected_identity=0: counted(opening(name, expected_identity))))
    monkeypatch.setattr(SharedRegion, "inspect", staticmethod(lambda name: counted(inspecting(name))))
    monkeypatch.setattr(owners, "_read_record", counting_read_record)
    return counts


def assert_idle_rings_read_two_words_at_most(counts, times):
    """Of an idle ring, only state_flight and write_pos, ``times`` each at
    most; of the used rings, whatever their windows need."""
    idle = {(ring, offset): reads for (ring, offset), reads in counts.ring_words.items() if ring >= USED}
    assert {offset for _, offset in idle} <= {layout.STATE_FLIGHT_OFFSET, layout.WRITE_POS_OFFSET}
    assert max(idle.values()) <= times
    assert counts.rings_built <= USED * times  # an address object per used ring, none per idle ring
    assert counts.records_read <= 2 * USED * times  # the audit and the ring rows read the used rings' records, no more


def test_info_reads_the_header_and_no_ring(many_rings, counts):
    found = diagnostics.info(many_rings)
    assert (found.max_subs, found.creator_name) == (RINGS, "native")
    assert counts.ring_words == {} and counts.rings_built == 0 and counts.records_read == 0


def test_list_reads_two_words_of_each_idle_ring(many_rings, counts):
    [row] = diagnostics.list_regions(prefix=many_rings.lstrip("/"))
    assert (row.subs_live, row.subs_max, row.health) == (2, RINGS, "clean: 6 of 8 slots free, 2 live rings")
    assert_idle_rings_read_two_words_at_most(counts, 1)


def test_stats_lists_the_used_rings_and_counts_the_idle_ones(many_rings, counts):
    found = diagnostics.stats(many_rings)
    assert [(r.ring, r.state, r.write_pos, r.owner_pid) for r in found.rings] == [
        (0, "Live", 3, os.getpid()), (1, "Live", 3, os.getpid()), (2, "Free", 3, None)]
    assert (found.idle_rings, found.live_rings) == (RINGS - USED, 2)
    assert_idle_rings_read_two_words_at_most(counts, 1)
    every = diagnostics.stats(many_rings, every_ring=True)
    assert [r.ring for r in every.rings] == list(range(RINGS)) and every.idle_rings == 0
    assert every.rings[RINGS - 1] == diagnostics.RingStats(RINGS - 1, "Free", 0, 0, 0, 0, None, None, None, None, None)


def test_watch_reads_two_words_of_each_idle_ring_per_snapshot(many_rings, counts):
    watching = diagnostics.watch(many_rings, 0.01)
    first, second = next(watching), next(watching)
    assert [r.ring for r in second.rings] == [0, 1, 2] and second.idle_rings == RINGS - USED
    assert [r.msgs_per_s for r in second.rings] == [0.0, 0.0, 0.0] and first.rings[0].msgs_per_s is None
    assert_idle_rings_read_two_words_at_most(counts, 2)


def test_the_exporter_reads_two_words_of_each_idle_ring(many_rings, counts):
    [sample] = exporter.gather(many_rings.lstrip("/"))
    assert sample.stats is not None and [r.ring for r in sample.stats.rings] == [0, 1, 2]
    assert_idle_rings_read_two_words_at_most(counts, 1)


def test_a_join_builds_the_addresses_of_the_rings_it_tries_only(many_rings, counts):
    region = SharedRegion.open(many_rings)
    subscriber = Subscriber(region)  # ring 2, the first Free one
    assert counts.rings_built == 3
    Publisher(region).send(b"to all")  # a publish visits every ring: it builds them all, once
    assert subscriber.try_receive() == b"to all"
    assert counts.rings_built == 3 + RINGS


def kickmsg_command(*arguments: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "kickmsg", *arguments], capture_output=True, text=True, timeout=120)


def test_the_stats_command_prints_one_line_for_the_idle_rings(many_rings):
    lines = kickmsg_command("stats", many_rings).stdout.splitlines()
    assert [line.split()[:2] for line in lines[2:5]] == [["0", "Live"], ["1", "Live"], ["2", "Free"]]
    assert lines[5] == f"{RINGS - USED} idle rings (Free, never written; --all-rings lists them)"
    assert len(lines) == 9  # the pool line, 4 of the ring table, the idle line, 3 of the publishers
    every = json.loads(kickmsg_command("stats", many_rings, "--all-rings", "--json").stdout)
    assert len(every["rings"]) == RINGS and every["idle_rings"] == 0


def test_diagnose_builds_the_addresses_of_the_used_rings_only(many_rings, counts):
    health = SharedRegion.open(many_rings).diagnose()
    assert (health.live_rings, health.dead_subscriber_rings, health.healthy) == (2, 0, True)
    assert counts.rings_built <= 3 * USED  # the used rings, again for the slots they hold, then those with an owner record
