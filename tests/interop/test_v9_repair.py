"""Layout-9 repair and recovery (WIRE9.md B.13, B.16, B.17), each measured
against the native 0.9.2 wheel: the same forged state is built in two
regions, the wheel repairs one (in a subprocess), we repair the other, and
the results and the words left behind must agree."""
import os

import pytest

from kickmsg import shm
from kickmsg.protocol.v9 import ChannelConfig, Publisher, Region, Subscriber, layout, liveness, repair
from kickmsg.protocol.v9 import words as words9
from kickmsg.schema import SchemaInfo
from nativepeer import run_native9, start_native9, start_ours
from test_v9_interop import NATIVE_API, OURS_API

# A native child: health before, the repair named, health after, and chosen words.
NATIVE_REPAIR = r'''
import struct
region = kickmsg.SharedRegion.open(P["name"])
def health():
    h = region.diagnose()
    return [h.locked_entries, h.retired_rings, h.draining_rings, h.live_rings, h.schema_stuck]
before = health()
result = getattr(region, P["call"])()
after = health()
with open("/dev/shm" + P["name"], "rb") as f:
    raw = f.read()
done({"before": before, "result": result, "after": after,
      "words": {str(off): struct.unpack_from("<Q" if size == 8 else "<I", raw, off)[0] for off, size in P["words"]},
      "pool_free": region.stats().pool_free})
'''


def _health(region: Region) -> list:
    h = repair.diagnose(region)
    return [h.locked_entries, h.retired_rings, h.draining_rings, h.live_rings, h.schema_stuck]


def _word(region: Region, offset: int, size: int) -> int:
    address = region.base + offset
    return region.atomics.load_acquire_u64(address) if size == 8 else region.atomics.load_acquire_u32(address)


def _twins(shm_name: str, build, call: str, ours, words) -> tuple[dict, dict]:
    """Build the state in two regions; the wheel runs ``call`` on one, we
    run ``ours`` on the other. Returns (native report, our report)."""
    keep = []
    try:
        regions = []
        for name in (shm_name + "_n", shm_name):
            region = Region.create(name, 1, ChannelConfig(2, 8, 24, 64, commit_timeout_us=20_000), "twin")
            keep.append(build(region))
            regions.append(region)
        offsets = [(offset, size) for offset, size in words(regions[1])]
        native_report = run_native9(NATIVE_REPAIR, name=shm_name + "_n", call=call, words=offsets)
        region = regions[1]
        before = _health(region)
        result = ours(region)
        ours_report = {"before": before, "result": result, "after": _health(region),
                       "words": {str(off): _word(region, off, size) for off, size in offsets},
                       "pool_free": region.stats().pool_free}
        return native_report, ours_report
    finally:
        shm.unlink(shm_name + "_n")


def _publish(region: Region, count: int) -> Subscriber:
    sub = Subscriber(region)
    pub = Publisher(region)
    for i in range(count):
        pub.send(b"m%d" % i)
    return sub


def test_repair_locked_entries_like_the_wheel(shm_name):
    """A dead publisher's lock at position 4 becomes skip(4) =
    0x4000000000000005 after one commit timeout; the claim stays."""
    def build(region):
        sub = _publish(region, 5)
        region.atomics.store_release_u64(region.entry_address(0, 4) + layout.SEQUENCE_OFFSET, words9.publisher_lock(4))
        return sub

    def words(region):
        entry = region.entry_address(0, 4) - region.base
        return [(entry + layout.SEQUENCE_OFFSET, 8), (entry + layout.META_OFFSET, 8), (layout.STEAL_COUNT_OFFSET, 8)]

    native, ours = _twins(shm_name, build, "repair_locked_entries", repair.repair_locked_entries, words)
    assert native == ours
    assert ours["result"] == 1 and ours["before"][0] == 1 and ours["after"][0] == 0
    values = list(ours["words"].values())
    assert values[0] == 0x4000000000000005 and words9.meta_tag(values[1]) == 5 and values[2] == 1


def test_reclaim_orphaned_slots_counts_claims_like_the_wheel(shm_name):
    """0.9.2: a claimed slot whose refcount was forced to 9 comes back as its
    claim count (1 here), and a slot lost off the stack (popped, never
    published) is pushed back: returns 1."""
    def build(region):
        sub = _publish(region, 5)
        meta = region.atomics.load_acquire_u64(region.entry_address(0, 0) + layout.META_OFFSET)
        slot = words9.meta_slot_field(meta) - 1
        region.atomics.store_release_u32(region.slot_address(slot) + layout.REFCOUNT_OFFSET, 9)
        Publisher(region).allocate()  # popped and forgotten
        return sub

    def words(region):
        meta = region.atomics.load_acquire_u64(region.entry_address(0, 0) + layout.META_OFFSET)
        return [(region.geometry.slot_offset(words9.meta_slot_field(meta) - 1) + layout.REFCOUNT_OFFSET, 4)]

    native, ours = _twins(shm_name, build, "reclaim_orphaned_slots", repair.reclaim_orphaned_slots, words)
    assert native == ours
    assert ours["result"] == 1 and list(ours["words"].values()) == [1]
    assert ours["pool_free"] == 24 - 5


def test_reset_retired_rings_and_health_like_the_wheel(shm_name):
    """Ring 1 retired (Free, one publisher counted): both reset it."""
    def build(region):
        sub = _publish(region, 2)
        region.atomics.store_release_u32(region.ring_address(1) + layout.STATE_FLIGHT_OFFSET, layout.IN_FLIGHT_ONE)
        return sub

    def words(region):
        return [(region.geometry.ring_offset(1) + layout.STATE_FLIGHT_OFFSET, 4)]

    native, ours = _twins(shm_name, build, "reset_retired_rings", repair.reset_retired_rings, words)
    assert native == ours
    assert ours["result"] == 1 and ours["before"][1:4] == [1, 0, 1] and ours["after"][1] == 0


def test_draining_ring_and_stuck_schema_like_the_wheel(shm_name):
    def build(region):
        region.atomics.store_release_u32(region.ring_address(0) + layout.STATE_FLIGHT_OFFSET, layout.RING_DRAINING | layout.IN_FLIGHT_ONE)
        region.atomics.store_release_u32(region.base + layout.SCHEMA_STATE_OFFSET, layout.SCHEMA_CLAIMING)

    def words(region):
        return [(layout.SCHEMA_STATE_OFFSET, 4)]

    native, ours = _twins(shm_name, build, "reset_schema_claim", repair.reset_schema_claim, words)
    assert native == ours
    assert ours["before"] == [0, 0, 1, 0, True] and ours["result"] is True and ours["after"][4] is False


def test_schema_claim_read_by_the_wheel(shm_name):
    region = Region.create(shm_name, 1, ChannelConfig(1, 2, 4, 8))
    info = SchemaInfo(name="pkg/Pose", version=2, identity=bytes(range(64)), layout_algo=3)
    assert repair.try_claim_schema(region, info) is True
    assert repair.try_claim_schema(region, SchemaInfo(name="other")) is False
    code = r'''
s = kickmsg.SharedRegion.open(P["name"]).schema()
done([s.name, s.version, bytes(s.identity).hex(), s.layout_algo])
'''
    assert run_native9(code, name=shm_name) == ["pkg/Pose", 2, bytes(range(64)).hex(), 3]
    assert region.schema() == info


def test_a_killed_native_subscribers_ring_is_reclaimed(shm_name):
    """The wheel's subscriber is SIGKILLed: its ring stays Live under a dead
    owner. Ours sees it dead and leaves the ring on its behalf (Free, owner
    cleared, its three claims drained back to the pool, as its own leave
    would have), and a new native subscriber takes the ring."""
    region = Region.create(shm_name, 1, ChannelConfig(1, 8, 24, 64))
    code = r'''
sub = kickmsg.Subscriber(kickmsg.SharedRegion.open(P["name"]))
ready()
wait_go()
'''
    with start_native9(code, name=shm_name) as peer:
        peer.wait_ready()
        pid = peer.proc.pid
        ring = region.ring_address(0)
        assert region.atomics.load_acquire_u64(ring + layout.OWNER_PID_OFFSET) == pid
        assert repair.diagnose(region).dead_rings == 0
        pub = Publisher(region)
        for i in range(3):
            pub.send(b"%d" % i)
        peer.kill()  # SIGKILL, then reaped: the pid is gone
    assert repair.diagnose(region).dead_rings == 1
    assert repair.reclaim_dead_rings(region) == 1
    stats = region.stats()
    assert (stats.rings[0].state, stats.rings[0].in_flight, stats.pool_free) == ("Free", 0, 24)
    assert region.atomics.load_acquire_u64(region.ring_address(0) + layout.OWNER_PID_OFFSET) == 0
    assert repair.reclaim_dead_rings(region) == 0
    code = r'''
region = kickmsg.SharedRegion.open(P["name"])
sub = kickmsg.Subscriber(region)
pub = kickmsg.Publisher(region)
pub.send(b"again")
done(sub.try_receive().decode())
'''
    assert run_native9(code, name=shm_name) == "again"


def test_owner_liveness():
    assert liveness.owner_is_dead(0, 0) is False
    me = os.getpid()
    start = liveness.process_start_time(me)
    assert start > 0
    assert liveness.owner_is_dead(me, start) is False
    assert liveness.owner_is_dead(me, 0) is False
    assert liveness.owner_is_dead(me, start + 1) is True  # the pid now names another process
    child = os.fork()
    if child == 0:
        os._exit(0)
    os.waitpid(child, 0)
    assert liveness.owner_is_dead(child, 0) is True


@pytest.mark.parametrize("forged", [layout.RING_LIVE, layout.RING_RECLAIMING])
def test_reclaim_keeps_in_flight_and_spares_live_owners(shm_name, forged):
    region = Region.create(shm_name, 1, ChannelConfig(2, 4, 8, 32))
    ring = region.ring_address(0)
    ops = region.atomics
    ops.store_release_u32(ring + layout.STATE_FLIGHT_OFFSET, forged | layout.IN_FLIGHT_ONE)
    child = os.fork()
    if child == 0:
        os._exit(0)
    os.waitpid(child, 0)
    ops.store_release_u64(ring + layout.OWNER_PID_OFFSET, child)
    live = Subscriber(region)  # ring 1, our own live pid
    assert repair.reclaim_dead_rings(region) == 1
    assert ops.load_acquire_u32(ring + layout.STATE_FLIGHT_OFFSET) == layout.RING_FREE | layout.IN_FLIGHT_ONE  # retired
    assert region.stats().rings[1].state == "Live" and live.ring_index == 1


# WIRE9.md H.3: a lock left from an earlier wrap, repaired at the window's position.
OLD_LOCK_CHILD = r'''
region = open_region(P["name"])
sub = new_subscriber(region)
ready()
wait_go()  # the parent published positions 0-3, then forged the old lock and write_pos
repaired = repair_locked(region)
got = []
while True:
    view = sub.try_receive_view()
    if view is None:
        break
    with view:
        got.append(view.ring_pos)
done({"repaired": repaired, "received": got, "lost": sub.lost, "lost_count": region.stats().rings[0].lost_count})
'''
# test_v9_interop's API over either implementation, and the repair.
NATIVE_OLD_LOCK_API = NATIVE_API + r'''
def repair_locked(region):
    return region.repair_locked_entries()
'''
OURS_OLD_LOCK_API = OURS_API + r'''
from kickmsg.protocol.v9 import repair
def repair_locked(region):
    return repair.repair_locked_entries(region)
'''


@pytest.mark.parametrize("impl", ["native", "ours"])
def test_a_lock_from_an_earlier_wrap_is_counted_once(shm_name, impl):
    """H.3: ring of 4; positions 0-3 published, then position 0's entry
    holds lock(0) (its publisher stalled before its commit: forged) while
    write_pos is 5 (position 4's publisher claimed it and died). The window
    position of that entry is 4: repair_locked_entries turns lock(0) into
    skip(4) after one timeout. The reader, which read nothing yet, loses
    position 0 (overrun) and position 4 (the skip marker) once each and
    receives 1-3: received + lost = 5 positions, no double count, in both
    implementations."""
    region = Region.create(shm_name, 1, ChannelConfig(1, 4, 8, 64, commit_timeout_us=20_000), "h3")
    start = start_native9 if impl == "native" else start_ours
    api = NATIVE_OLD_LOCK_API if impl == "native" else OURS_OLD_LOCK_API
    with start(api + OLD_LOCK_CHILD, name=shm_name) as peer:
        peer.wait_ready()
        publisher = Publisher(region)
        for i in range(4):
            publisher.send(b"m%d" % i)
        ops = region.atomics
        ops.store_release_u64(region.entry_address(0, 0) + layout.SEQUENCE_OFFSET, words9.publisher_lock(0))
        ops.store_release_u64(region.ring_address(0) + layout.WRITE_POS_OFFSET, 5)
        peer.tell()
        result = peer.result()
    assert result == {"repaired": 1, "received": [1, 2, 3], "lost": 2, "lost_count": 2}
    sequence = ops.load_acquire_u64(region.entry_address(0, 4) + layout.SEQUENCE_OFFSET)
    assert sequence == words9.skip_marker(4) == 0x4000000000000005
