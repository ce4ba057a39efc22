"""Publisher crashes at each crash point of the spec, with real processes.

A victim publisher process is armed with ``kickmsg.verify.faults.crash_at``: at the
chosen point of the publish flow, in the middle of its stream, it stops
itself (SIGSTOP) and the test SIGKILLs it there. A surviving publisher
process and two subscriber processes live on. For every crash point the test
checks, following the spec's crash table ("Crash point" / "Class B" / GC):

1. what ``diagnose()`` and ``audit()`` see right after the kill;
2. that the survivors keep delivering: the surviving publisher times out at
   most once, on the entry the victim left stuck, and heals it; every ring
   position is received or counted lost by its subscriber;
3. that the operator's recovery (``repair_locked_entries``,
   ``reset_retired_rings(drain=True)``, ``reclaim_orphaned_slots``) gives
   back the whole pool but the one slot the spec calls unrecoverable (a
   publisher killed between pop and refcount pre-set), and audits clean.

The commit timeout is short (20 ms) so crash detection is quick. The victim
publishes alone before it dies (the survivor waits), and the survivor
publishes alone after: two live publishers racing under a 20 ms timeout on
a loaded machine could take a merely descheduled one for a crashed one, and
the test would no longer be deterministic. Every wait is bounded; nothing is
timed.
"""
from typing import NamedTuple

import pytest

from conftest import on_layout4
import crashworkers
import mpworkers
import rawregion
from crashworkers import CTX
from kickmsg import ChannelType, Config, Publisher, SharedRegion, Subscriber, audit
from kickmsg.verify import faults

MAX_SUBS, CAPACITY, POOL_SIZE = 4, 16, 64
COMMIT_TIMEOUT_S = 0.02
VICTIM, SURVIVOR = 1, 2  # publisher ids in the numbered messages
CRASH_MESSAGE = 20  # the victim dies while publishing its message 20 (0-based), after the rings wrapped
SURVIVOR_MESSAGES = 3 * CAPACITY  # enough to wrap onto the victim's stuck entry and well past it
RING_FREE, RING_LIVE = 0, 1
LOCKED_SEQUENCE = 0xFFFF_FFFF_FFFF_FFFF

# These tests check layout 4's own: the crash points of layout 4's publish flow and its owner records.
pytestmark = [pytest.mark.timeout(120), on_layout4]


class Expected(NamedTuple):
    """What a crash at one point leaves (subscribers on rings 0 and 1)."""

    skip: int  # occurrences of the point let pass, so that the victim dies in CRASH_MESSAGE, on ring 0
    ring0_claimed: bool  # the victim claimed ring 0's position CRASH_MESSAGE (ring 1 untouched)
    ring0_delivered: bool  # ... and committed its message there
    crash_entry_sequence: int  # ring 0's entry at that position, right after the kill
    stuck_admission: bool  # the victim stays counted in ring 0's in_flight forever
    locked: int  # stuck entries diagnose() reports right after the kill
    leaked: int  # slots audit() calls leaked right after the kill: all reclaimable
    unrecoverable: int  # slots lost for good (off the stack, refcount 0, in no ring)


PREVIOUS_LAP = CRASH_MESSAGE - CAPACITY + 1  # sequence committed at that entry one lap earlier
EXPECTED = {
    # Popped, never published: the spec's one unrecoverable slot.
    "after_pop": Expected(
        skip=CRASH_MESSAGE, ring0_claimed=False, ring0_delivered=False, crash_entry_sequence=PREVIOUS_LAP,
        stuck_admission=False, locked=0, leaked=0, unrecoverable=1,
    ),
    # Refcount pre-set to max_subs, no ring visited: all its references leak.
    "after_refcount": Expected(
        skip=CRASH_MESSAGE, ring0_claimed=False, ring0_delivered=False, crash_entry_sequence=PREVIOUS_LAP,
        stuck_admission=False, locked=0, leaked=1, unrecoverable=0,
    ),
    # Delivered to ring 0 only (two admissions per message): max_subs - 1 references leak.
    "mid_ring_loop": Expected(
        skip=2 * CRASH_MESSAGE, ring0_claimed=True, ring0_delivered=True, crash_entry_sequence=CRASH_MESSAGE + 1,
        stuck_admission=False, locked=0, leaked=1, unrecoverable=0,
    ),
    # Case B: position claimed, entry still the previous lap's. Its old slot
    # keeps ring 0's reference (its release was deferred), the victim's slot
    # all of its own. diagnose() cannot tell it from a claim in progress.
    "after_claim": Expected(
        skip=2 * CRASH_MESSAGE, ring0_claimed=True, ring0_delivered=False, crash_entry_sequence=PREVIOUS_LAP,
        stuck_admission=True, locked=0, leaked=2, unrecoverable=0,
    ),
    # Case A: the entry is LOCKED, which diagnose() sees; same leaks as Case B.
    "holding_lock": Expected(
        skip=2 * CRASH_MESSAGE, ring0_claimed=True, ring0_delivered=False, crash_entry_sequence=LOCKED_SEQUENCE,
        stuck_admission=True, locked=1, leaked=2, unrecoverable=0,
    ),
}


def test_every_crash_point_has_expectations():
    assert set(EXPECTED) == set(faults.CRASH_POINTS)


def crash_config(**fields) -> Config:
    values = {
        "max_subscribers": MAX_SUBS, "sub_ring_capacity": CAPACITY, "pool_size": POOL_SIZE,
        "max_payload_size": 64, "commit_timeout": COMMIT_TIMEOUT_S,
    }
    return Config(**(values | fields))


def raw_rings(name) -> list:
    data = rawregion.read_bytes(name)
    return [rawregion.ring(data, index) for index in range(rawregion.header(data)["max_subs"])]


def assert_all_rings_free(name):
    for index, ring in enumerate(raw_rings(name)):
        assert (ring.state, ring.in_flight) == (RING_FREE, 0), f"ring {index} of {name}: {ring}"


def readable_end(ring) -> int:
    """Where a subscriber of a ring nobody writes to stops: the first
    position of the ring's window whose entry is not committed, else
    write_pos."""
    capacity = len(ring.entries)
    for position in range(max(0, ring.write_pos - capacity), ring.write_pos):
        if ring.entries[position % capacity][0] != position + 1:
            return position
    return ring.write_pos


def wait_until_subscribers_idle(procs, name, progress):
    """Wait until each subscriber has passed every readable position of its
    ring: it then holds no pin, so audit() sees only what the crash left."""
    for ring_index, counter in progress.items():
        procs.wait_until(
            lambda ring_index=ring_index, counter=counter: counter.value == readable_end(raw_rings(name)[ring_index]),
            f"the subscriber of ring {ring_index} to catch up",
        )


def committed_window_slots(ring) -> list:
    """Slots named by committed entries of the ring's window (its references)."""
    capacity = len(ring.entries)
    slots = []
    for position in range(max(0, ring.write_pos - capacity), ring.write_pos):
        sequence, slot, _ = ring.entries[position % capacity]
        if sequence == position + 1 and slot != rawregion.INVALID_SLOT:
            slots.append(slot)
    return slots


# -- a publisher killed at each crash point ---------------------------------------------


@pytest.mark.parametrize("point", faults.CRASH_POINTS)
def test_publisher_killed_at_crash_point(point, shm_name, procs):
    """The victim dies at ``point`` in its message CRASH_MESSAGE; the other
    processes go on, then the operator recovers the region (see module doc)."""
    expect = EXPECTED[point]
    region = SharedRegion.create(shm_name, ChannelType.PubSub, crash_config())
    done = CTX.Event()
    progress = {ring: CTX.Value("q", 0, lock=False) for ring in (0, 1)}
    for ring in (0, 1):  # one after the other: sub-0 takes ring 0, sub-1 ring 1
        procs.start_ready(f"sub-{ring}", crashworkers.counting_subscriber, shm_name, done, progress[ring])
    assert [ring.state for ring in raw_rings(shm_name)] == [RING_LIVE, RING_LIVE, RING_FREE, RING_FREE]
    # Both publishers wait for the subscribers rather than lap them, so every
    # loss below is the crash's. The survivor's gates are set after the kill.
    go_survivor, stuck_at = CTX.Event(), CTX.Value("q", -1, lock=False)
    survivor_start = {ring: CTX.Value("q", 0, lock=False) for ring in (0, 1)}
    survivor_gates = [(progress[0], survivor_start[0], stuck_at), (progress[1], survivor_start[1], -1)]
    procs.start_ready(
        "survivor", crashworkers.gated_publisher, shm_name, SURVIVOR, SURVIVOR_MESSAGES, go_survivor,
        survivor_gates, CAPACITY,
    )
    go_victim, stopped = CTX.Event(), CTX.Value("i", 0, lock=False)
    victim_gates = [(progress[0], 0, -1), (progress[1], 0, -1)]
    procs.start_ready(
        "victim", crashworkers.crashing_publisher, shm_name, VICTIM, point, expect.skip, go_victim, stopped,
        victim_gates, CAPACITY,
    )

    # The victim publishes until it stops at the crash point; kill it there.
    go_victim.set()
    procs.wait_stopped("victim", stopped)
    procs.kill("victim")
    wait_until_subscribers_idle(procs, shm_name, progress)

    # 1. What the crash left, right after the kill.
    at_kill = raw_rings(shm_name)
    victim_slot = check_crash_residue(point, region, shm_name)

    # 2. The survivors keep delivering. The subscriber of ring 0 may be stuck
    #    at the victim's uncommitted position until the survivor heals it.
    survivor_start[0].value, survivor_start[1].value = at_kill[0].write_pos, at_kill[1].write_pos
    if readable_end(at_kill[0]) < at_kill[0].write_pos:
        stuck_at.value = readable_end(at_kill[0])
    assert stuck_at.value == (CRASH_MESSAGE if expect.stuck_admission else -1)
    go_survivor.set()
    survivor = procs.wait_for("result", ["survivor"])["survivor"]
    procs.join(["survivor"])
    assert survivor["dropped"] == expect.stuck_admission, survivor  # one timeout on the stuck entry, healed
    done.set()
    results = procs.wait_for("result", ["sub-0", "sub-1"])
    procs.join(["sub-0", "sub-1"])
    check_delivery(expect, results, at_kill, raw_rings(shm_name))

    # 3. The subscribers have left. A ring the victim stayed admitted to timed
    #    out its drain and is retired. Recover the region.
    assert [results[label]["drain_timeouts"] for label in ("sub-0", "sub-1")] == [expect.stuck_admission, 0]
    health = region.diagnose()
    assert (health.locked_entries, health.retired_rings, health.draining_rings, health.live_rings) == (
        0, expect.stuck_admission, 0, 0
    ), health
    assert region.repair_locked_entries() == 0  # the survivor's self-repair already healed the entry
    assert region.reset_retired_rings(drain=True) == expect.stuck_admission
    assert region.reclaim_orphaned_slots() == expect.leaked
    assert_all_rings_free(shm_name)
    pool = rawregion.pool(rawregion.read_bytes(shm_name))
    assert not pool.cycle and not pool.out_of_range, pool
    assert len(pool.free_slots) == len(set(pool.free_slots)) == POOL_SIZE - expect.unrecoverable, pool
    missing = sorted(set(range(POOL_SIZE)) - set(pool.free_slots))
    assert missing == ([victim_slot] if expect.unrecoverable else [])
    assert not any(pool.refcounts), pool.refcounts
    report = audit(region)
    assert report.clean == (not missing), report.verdict  # the unrecoverable slot is lost: damage
    assert report.being_written == report.unreferenced_slots == missing


def check_crash_residue(point, region, name) -> int:
    """Check what diagnose() and audit() see right after the kill (the
    victim dead, the survivor waiting, the subscribers idle); return the
    slot the victim was publishing."""
    expect = EXPECTED[point]
    data = rawregion.read_bytes(name)
    ring0, ring1 = rawregion.ring(data, 0), rawregion.ring(data, 1)
    pool = rawregion.pool(data)
    assert (ring0.write_pos, ring1.write_pos) == (CRASH_MESSAGE + expect.ring0_claimed, CRASH_MESSAGE)
    assert (ring0.in_flight, ring1.in_flight) == (expect.stuck_admission, 0)
    crash_entry_sequence, crash_entry_slot, _ = ring0.entries[CRASH_MESSAGE % CAPACITY]
    assert crash_entry_sequence == expect.crash_entry_sequence

    health = region.diagnose()
    assert (health.locked_entries, health.retired_rings, health.draining_rings, health.live_rings) == (
        expect.locked, 0, 0, 2
    ), health
    report = audit(region)
    assert not (report.free_stack_problems or report.under_referenced_slots or report.double_free_candidates), report
    if expect.locked:
        assert report.rings[0].locked_entries == [CRASH_MESSAGE]
    full_refcount = [slot for slot, refcount in enumerate(pool.refcounts) if refcount == MAX_SUBS]
    if expect.unrecoverable:  # popped, refcount never set: the slot looks like one being written
        assert full_refcount == [] and len(report.being_written) == 1, report
        (victim_slot,) = report.being_written
        assert pool.refcounts[victim_slot] == 0 and victim_slot not in pool.free_slots
        assert report.leaked_slots == [] and report.unreferenced_slots == [victim_slot], report.verdict
        return victim_slot
    # Refcount pre-set to max_subs: the victim's slot is the only one that high.
    assert len(full_refcount) == 1, pool.refcounts
    (victim_slot,) = full_refcount
    leaked = {victim_slot}
    if expect.stuck_admission:  # the entry it never committed still names the previous lap's slot
        leaked.add(crash_entry_slot)
    if expect.ring0_delivered:  # ring 0's reference is one of the max_subs
        assert crash_entry_slot == victim_slot
    assert sorted(report.leaked_slots) == sorted(leaked) and len(leaked) == expect.leaked, report
    assert report.being_written == [] and not report.clean, report.verdict
    return victim_slot


def check_delivery(expect, results, at_kill, final):
    """Every ring position was received or counted lost; ring 1 got every
    message; ring 0 lost, when the victim stayed stuck on it, its
    uncommitted position and the survivor's message that healed it."""
    for ring_index, label in enumerate(["sub-0", "sub-1"]):
        result = results[label]
        print(label, {key: result[key] for key in ("received", "lost", "per_publisher", "drain_timeouts")})
        assert result["problem_count"] == 0, result["problems"]
        assert final[ring_index].write_pos == at_kill[ring_index].write_pos + SURVIVOR_MESSAGES
        assert result["received"] + result["lost"] == final[ring_index].write_pos, result
        assert result["last"][SURVIVOR] == SURVIVOR_MESSAGES - 1, result
    assert (results["sub-1"]["per_publisher"], results["sub-1"]["lost"]) == (
        {VICTIM: CRASH_MESSAGE, SURVIVOR: SURVIVOR_MESSAGES}, 0
    )
    assert (results["sub-0"]["per_publisher"], results["sub-0"]["lost"]) == (
        {VICTIM: CRASH_MESSAGE + expect.ring0_delivered, SURVIVOR: SURVIVOR_MESSAGES - expect.stuck_admission},
        2 * expect.stuck_admission,
    )


# -- recovery without the drain ----------------------------------------------------------


def test_reset_without_drain_leaves_the_window_taken_until_reused(shm_name, procs):
    """Native semantics: ``reset_retired_rings()`` only frees the ring. The
    references its entries held when its subscriber's teardown timed out stay
    taken (a GC pass does not free them: the entries still name them) until
    the ring is reused and publishers wrap over them. ``drain=True`` gives
    them back at once (see the crash-point test)."""
    capacity, pool_size = 8, 24
    cfg = crash_config(max_subscribers=2, sub_ring_capacity=capacity, pool_size=pool_size)
    region = SharedRegion.create(shm_name, ChannelType.PubSub, cfg)
    sub = Subscriber(region)  # ring 0, the only live ring: one claim per message
    go, stopped = CTX.Event(), CTX.Value("i", 0, lock=False)
    crash_position = 10  # past the first wrap
    procs.start_ready(
        "victim", crashworkers.crashing_publisher, shm_name, VICTIM, "after_claim", crash_position, go, stopped
    )
    go.set()
    procs.wait_stopped("victim", stopped)
    procs.kill("victim")

    pub = Publisher(region)
    for sequence in range(capacity + 4):  # wraps onto the stuck entry: one timeout, healed
        pub.send(mpworkers.numbered_message(SURVIVOR, sequence))
    assert pub.dropped == 1
    received = []
    mpworkers.drain_rest(sub, sub.try_receive, received.append)
    assert len(received) + sub.lost == crash_position + 1 + capacity + 4
    sub.close()
    assert sub.drain_timeouts == 1
    ring = raw_rings(shm_name)[0]
    assert (ring.state, ring.in_flight) == (RING_FREE, 1)  # retired

    assert region.reset_retired_rings() == 1
    assert region.reclaim_orphaned_slots() == 2  # the victim's slot and the one its entry named
    ring = raw_rings(shm_name)[0]
    assert (ring.state, ring.in_flight) == (RING_FREE, 0)
    taken = committed_window_slots(ring)
    assert len(taken) == capacity - 1  # the window, less the entry the survivor healed (no slot)
    pool = rawregion.pool(rawregion.read_bytes(shm_name))
    assert sorted(pool.free_slots) == sorted(set(range(pool_size)) - set(taken))
    assert [pool.refcounts[slot] for slot in taken] == [1] * len(taken)
    report = audit(region)
    assert report.free_slots == pool_size - len(taken), report.verdict  # consistent, not leaked: stranded
    assert sorted(report.stranded_slots) == sorted(taken) and not report.leaked_slots, report.verdict

    # Reuse: a new subscriber joins the ring; one lap of messages evicts the old window.
    with Subscriber(region) as again:
        for sequence in range(capacity):
            pub.send(mpworkers.numbered_message(SURVIVOR, 100 + sequence))
        received = []
        mpworkers.drain_rest(again, again.try_receive, received.append)
        assert (len(received), again.lost) == (capacity, 0)
    assert_all_rings_free(shm_name)
    rawregion.assert_pool_whole(shm_name)
    assert audit(region).clean


# -- a subscriber killed while holding views ------------------------------------------------


def test_subscriber_killed_holding_views(shm_name, procs):
    """SIGKILL skips the teardown: the ring stays Live and each view's pin
    leaks. reclaim_dead_subscribers() frees the ring (its references
    drained); reclaim_orphaned_slots(), at quiescence, frees the pins."""
    count, pool_size = 3, 8
    region = SharedRegion.create(
        shm_name, ChannelType.PubSub, crash_config(max_subscribers=2, sub_ring_capacity=4, pool_size=pool_size)
    )
    procs.start_ready("holder", mpworkers.view_holder, shm_name, count, "wait")
    pub = Publisher(region)
    messages = [f"message {i}".encode() for i in range(count)]
    for message in messages:
        pub.send(message)
    assert procs.wait_for("holding", ["holder"])["holder"] == messages
    holder_pid = procs.pid("holder")
    procs.kill("holder")

    ring = raw_rings(shm_name)[0]
    assert (ring.state, ring.in_flight, ring.write_pos) == (RING_LIVE, 0, count)
    held = [slot for _, slot, _ in ring.entries[:count]]
    pool = rawregion.pool(rawregion.read_bytes(shm_name))
    assert [pool.refcounts[slot] for slot in held] == [2] * count  # ring reference + view pin
    assert sorted(audit(region).leaked_slots) == sorted(held)

    dead = region.reclaim_dead_subscribers()
    assert (dead.reclaimed, dead.unrecorded, dead.timed_out) == ([(0, holder_pid)], [], [])
    assert_all_rings_free(shm_name)
    pool = rawregion.pool(rawregion.read_bytes(shm_name))
    assert [pool.refcounts[slot] for slot in held] == [1] * count  # only the dead views' pins
    assert sorted(audit(region).leaked_slots) == sorted(held)

    assert region.reclaim_orphaned_slots() == count
    rawregion.assert_pool_whole(shm_name)
    report = audit(region)
    assert report.clean and report.being_written == [], report.verdict
