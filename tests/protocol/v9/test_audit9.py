"""kickmsg.ops.audit on layout 9 (WIRE9.md A.3-A.5, B.13): each invariant it
checks there, broken by hand on a region with real traffic, is reported
alone; a skip marker is not damage. (Layout 4's damages: test_health.py.)"""
import struct
import subprocess
import sys

import pytest

from kickmsg import ChannelType, Config, Publisher, SharedRegion, Subscriber
from kickmsg.ops.audit import audit
from kickmsg.protocol.v9 import layout as v9
from kickmsg.protocol.v9 import words as words9

pytestmark = pytest.mark.timeout(60)

SMALL = Config(max_subscribers=3, sub_ring_capacity=8, pool_size=16, max_payload_size=64)


def poke(region, address, fmt, value):
    struct.pack_into(fmt, region.mapping.buffer, address - region.mapping.address, value)


def peek(region, address, fmt):
    return struct.unpack_from(fmt, region.mapping.buffer, address - region.mapping.address)[0]


def dead_pid():
    """The pid of a process that has exited and been reaped."""
    child = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True, check=True)
    return int(child.stdout)


def slot_of(region, ring, pos):
    return words9.meta_slot_field(peek(region, region.core.entry_address(ring, pos) + v9.META_OFFSET, "<Q")) - 1


def refcount_address(region, slot):
    return region.core.slot_address(slot) + v9.REFCOUNT_OFFSET


def lock_entry(region, pos, lock):
    poke(region, region.core.entry_address(0, pos) + v9.SEQUENCE_OFFSET, "<Q", lock(pos))


def skip_entry(region):
    poke(region, region.core.entry_address(0, 1) + v9.SEQUENCE_OFFSET, "<Q", words9.skip_marker(1))


def claim_for_another_entry(region):
    slot = slot_of(region, 0, 1)
    poke(region, region.core.entry_address(0, 1) + v9.META_OFFSET, "<Q", words9.pack_meta(2, slot))
    poke(region, refcount_address(region, slot), "<I", 0)  # its claim is gone: the slot is nobody's


def claim_outside_the_pool(region):
    slot = slot_of(region, 0, 1)
    poke(region, region.core.entry_address(0, 1) + v9.META_OFFSET, "<Q", words9.pack_meta(1, 9999))
    poke(region, refcount_address(region, slot), "<I", 0)


def refcount_above_claims(region):
    poke(region, refcount_address(region, slot_of(region, 0, 0)), "<I", 2)


def ring_left_reclaiming(region):
    poke(region, region.core.ring_address(1) + v9.STATE_FLIGHT_OFFSET, "<I", v9.RING_RECLAIMING)


def owner_dead(region):
    poke(region, region.core.ring_address(0) + v9.OWNER_PID_OFFSET, "<Q", dead_pid())


def ring(report, index):
    [found] = [r for r in report.rings if r.index == index]
    return found


DAMAGE = {
    "publisher_lock": (lambda r: lock_entry(r, 2, words9.publisher_lock), lambda a: ring(a, 0).locked_entries == [2], "locked entries: 1"),
    "repairer_lock": (lambda r: lock_entry(r, 2, words9.repairer_lock), lambda a: ring(a, 0).locked_entries == [2], "locked entries: 1"),
    "claim_for_another_entry": (claim_for_another_entry, lambda a: ring(a, 0).bad_entries == [1], "entries naming no slot: 1"),
    "claim_outside_the_pool": (claim_outside_the_pool, lambda a: ring(a, 0).bad_entries == [1], "entries naming no slot: 1"),
    "refcount_above_claims": (refcount_above_claims, lambda a: len(a.leaked_slots) == 1, "leaked slots: 1"),
    "ring_left_reclaiming": (ring_left_reclaiming, lambda a: ring(a, 1).state == "Reclaiming", "rings left Reclaiming: 1"),
    "owner_dead": (owner_dead, lambda a: ring(a, 0).owner_alive is False, "rings held by dead subscribers: 1"),
}


@pytest.fixture
def traffic(shm_name):
    """A layout-9 region, its subscriber (ring 0, kept alive) and 3 messages."""
    region = SharedRegion.create(shm_name, ChannelType.PubSub, SMALL, "audit9", layout=9)
    subscriber = Subscriber(region)
    publisher = Publisher(region)
    for i in range(3):
        publisher.send(bytes([i]))
    report = audit(region)
    assert report.clean and ring(report, 0).references == 3 and ring(report, 0).owner_alive, report
    yield region
    subscriber.close()


@pytest.mark.parametrize("damage, found, phrase", DAMAGE.values(), ids=DAMAGE.keys())
def test_audit9_reports_each_damage_alone(traffic, damage, found, phrase):
    damage(traffic)
    report = audit(traffic)
    assert found(report), report
    found_first = report.verdict.removeprefix("DAMAGED: ").split("; ")[0].split(", unreferenced slots")[0]
    assert found_first == phrase, report.verdict  # (a slot it takes out of use shows as unreferenced too, last)


def test_audit9_a_skip_marker_is_not_damage(traffic):
    skip_entry(traffic)
    report = audit(traffic)
    assert report.clean and ring(report, 0).skip_entries == [1], report
