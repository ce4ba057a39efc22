"""Layout 9 against the native kickmsg 0.9.2 wheel, both ways.

The wheel only ever runs in subprocesses (tests/nativepeer.py); our side runs
in the test process or in subprocesses of its own. Every scenario is bounded
in time; children are killed and regions removed whatever the outcome.
Waits are on observable state (a child's ``ready`` line, a ring's
has_waiter word), never on sleeps.
"""
import threading
import time

import pytest

from kickmsg.atomics import Atomics
from kickmsg.protocol.v9 import ChannelConfig, Publisher, Region, Subscriber, layout, repair, words
from kickmsg.protocol.v9.layout import HAS_WAITER_OFFSET, OWNER_PID_OFFSET, WAITER_FUTEX
from nativepeer import check_payload, make_payload, run_native9, start_native9, start_ours

# The same small API over either implementation, for the children.
NATIVE_API = r'''
def open_region(name):
    return kickmsg.SharedRegion.open(name)

def new_subscriber(region):
    return kickmsg.Subscriber(region)

def new_publisher(region):
    return kickmsg.Publisher(region)

def send_zero_copy(pub, payload):
    slot = pub.allocate()
    if slot is None:
        return False
    with memoryview(slot) as view:
        view[:len(payload)] = payload
    slot.publish(len(payload))
    return True

def ring_lost(region, index):
    return region.stats().rings[index].lost_count

def leave(sub):
    """Use as ``sub = leave(sub)``: the native Subscriber leaves in its
    destructor, once the last reference goes."""
    return None
'''

OURS_API = r'''
from kickmsg.protocol.v9 import Region, Publisher, Subscriber

def open_region(name):
    return Region.open(name)

def new_subscriber(region):
    return Subscriber(region)

def new_publisher(region):
    return Publisher(region)

def send_zero_copy(pub, payload):
    slot = pub.allocate()
    if slot == 0xFFFFFFFF:
        return False
    pub.payload(slot, len(payload))[:] = payload
    pub.publish(slot, len(payload))
    return True

def ring_lost(region, index):
    return region.stats().rings[index].lost_count

def leave(sub):
    sub.close()
    return None
'''

# Shared by both: publish and receive loops with self-checking payloads.
LOOPS = r'''
import time

def publish_all(pub, seqs, tag=0, how="mixed", seconds=30.0):
    """make_payload(seq) (prefixed by a one-byte publisher tag) for each seq,
    by send or zero-copy alternately; retry while the pool is dry."""
    deadline = time.monotonic() + seconds
    for index, seq in enumerate(seqs):
        payload = bytes([tag]) + make_payload(seq)
        while True:
            if how == "zero-copy" or (how == "mixed" and index % 2):
                if send_zero_copy(pub, payload):
                    break
            else:
                try:
                    assert pub.send(payload) == len(payload)
                    break
                except BlockingIOError:
                    pass
            if time.monotonic() > deadline:
                raise TimeoutError(f"the pool stayed dry at message {seq}")
            time.sleep(0.0005)  # back-off while subscribers free slots

def receive_all(sub, expected, seconds=30.0, block=True, last=None):
    """Receive (copy and zero-copy alternately) until ``expected`` messages
    arrived (or the one numbered ``last``), or nothing is left when block is
    False. Returns [tag, seq, ring_pos or -1] per message and the loss count."""
    got = []
    deadline = time.monotonic() + seconds
    while len(got) < expected and time.monotonic() < deadline and not (got and got[-1][1] == last):
        if len(got) % 2:
            view = sub.try_receive_view()
            if view is None and block:
                view = sub.receive_view(0.2)
            if view is None:
                if not block:
                    break
                continue
            with view:
                data = bytes(view)
                position = view.ring_pos
        else:
            data = sub.try_receive()
            if data is None and block:
                data = sub.receive(0.2)
            if data is None:
                if not block:
                    break
                continue
            position = -1
        got.append([data[0], check_payload(data[1:]), position])
    return got, sub.lost
'''

SUBSCRIBE_CHILD = r'''
region = open_region(P["name"])
sub = new_subscriber(region)
ready()
wait_go()
got, lost = receive_all(sub, P["expected"], block=P.get("block", True))
ring = ring_lost(region, P.get("ring", 0))
sub = leave(sub)
done({"got": got, "lost": lost, "ring_lost": ring})
'''

PUBLISH_CHILD = r'''
region = open_region(P["name"])
pub = new_publisher(region)
ready()
wait_go()
publish_all(pub, range(P["count"]), tag=P.get("tag", 0), how=P.get("how", "mixed"))
done({"dropped": pub.dropped})
'''


def native(code: str, **params):
    return start_native9(NATIVE_API + LOOPS + code, **params)


def ours_child(code: str, **params):
    return start_ours(OURS_API + LOOPS + code, **params)


# The loops, for the test process too (with our classes).
_ours_namespace: dict = {"make_payload": make_payload, "check_payload": check_payload}
exec(OURS_API + LOOPS, _ours_namespace)
publish_all = _ours_namespace["publish_all"]
receive_all = _ours_namespace["receive_all"]


def _region(name: str, subs: int, capacity: int, pool: int, payload: int = 256) -> Region:
    return Region.create(name, 1, ChannelConfig(subs, capacity, pool, payload), "test")


def _check_in_order(got: list, count: int, lost: int) -> None:
    seqs = [seq for _, seq, _ in got]
    assert seqs == sorted(set(seqs)), "duplicated or reordered"
    assert len(seqs) + lost == count
    assert seqs[-1] == count - 1


def test_native_publishes_ours_receives(shm_name):
    """3000 messages through a 64-entry ring; ours receives while native
    sends (send and zero-copy allocate/publish alternately). Everything
    is either received in order or counted lost, and the ring's lost_count
    agrees."""
    count = 3000
    region = _region(shm_name, 2, 64, 200)
    sub = Subscriber(region)
    with native(PUBLISH_CHILD, name=shm_name, count=count) as peer:
        peer.wait_ready()
        peer.tell()
        got, lost = receive_all(sub, count, last=count - 1)
        # what remains once the publisher is done
        result = peer.result()
        more, lost = receive_all(sub, count, block=False)
    got += more
    _check_in_order(got, count, lost)
    assert region.stats().rings[0].lost_count == lost
    assert result["dropped"] == 0
    positions = [pos for _, _, pos in got if pos >= 0]
    assert positions == sorted(positions) and positions  # zero-copy views carry their ring positions


def test_ours_publishes_native_receives_exactly(shm_name):
    """Ring large enough for all: native receives all 500 in order, none lost;
    its zero-copy views report the positions we wrote."""
    count = 500
    region = _region(shm_name, 2, 512, 600)
    pub = Publisher(region)
    with native(SUBSCRIBE_CHILD, name=shm_name, expected=count) as peer:
        peer.wait_ready()
        peer.tell()
        publish_all(pub, range(count))
        result = peer.result()
    seqs = [seq for _, seq, _ in result["got"]]
    assert seqs == list(range(count)) and result["lost"] == 0
    assert all(pos == index for index, (_, _, pos) in enumerate(result["got"]) if pos >= 0)
    stats = region.stats()
    assert stats.total_writes == count and stats.total_losses == 0 and stats.pool_free == 600


def test_native_publishes_ours_receives_exactly(shm_name):
    count = 500
    region = _region(shm_name, 2, 512, 600)
    sub = Subscriber(region)
    run_native9(NATIVE_API + LOOPS + PUBLISH_CHILD.replace("ready()\nwait_go()\n", ""), name=shm_name, count=count)
    got, lost = receive_all(sub, count, block=False)
    assert [seq for _, seq, _ in got] == list(range(count)) and lost == 0
    assert [pos for _, _, pos in got if pos >= 0] == list(range(1, count, 2))  # zero-copy on odd turns
    sub.close()
    assert region.stats().pool_free == 600


@pytest.mark.parametrize("direction", ["native-to-ours", "ours-to-native"])
def test_slow_subscriber_losses_are_counted_alike(shm_name, direction):
    """100 messages into an 8-entry ring before the subscriber reads: it gets
    the last 8 and counts 92 lost, as does the ring's lost_count seen by the
    other implementation."""
    region = _region(shm_name, 1, 8, 16)
    if direction == "native-to-ours":
        sub = Subscriber(region)
        run_native9(NATIVE_API + LOOPS + PUBLISH_CHILD.replace("ready()\nwait_go()\n", ""), name=shm_name, count=100)
        got, lost = receive_all(sub, 100, block=False)
        assert [seq for _, seq, _ in got] == list(range(92, 100)) and lost == 92
        code = 'done(open_region(P["name"]).stats().rings[0].lost_count)'
        assert run_native9(NATIVE_API + code, name=shm_name) == 92
    else:
        pub = Publisher(region)
        with native(SUBSCRIBE_CHILD, name=shm_name, expected=100, block=False) as peer:
            peer.wait_ready()
            publish_all(pub, range(100))
            peer.tell()
            result = peer.result()
        assert [seq for _, seq, _ in result["got"]] == list(range(92, 100))
        assert result["lost"] == result["ring_lost"] == 92
        assert region.stats().rings[0].lost_count == 92


def _wait_for(condition, what: str, seconds: float = 20.0) -> None:
    """Poll observable state until ``condition()`` holds (bounded)."""
    deadline = time.monotonic() + seconds
    while not condition():
        if time.monotonic() > deadline:
            pytest.fail(f"timed out waiting for {what}")
        time.sleep(0.001)


def test_native_publisher_wakes_our_blocked_subscriber(shm_name):
    region = _region(shm_name, 1, 8, 16)
    sub = Subscriber(region)
    received: list = []
    thread = threading.Thread(target=lambda: received.append(sub.receive(30.0)), daemon=True)
    thread.start()
    try:
        has_waiter = region.ring_address(0) + HAS_WAITER_OFFSET
        _wait_for(lambda: region.atomics.load_acquire_u32(has_waiter) == WAITER_FUTEX, "our subscriber to park")
        run_native9(NATIVE_API + 'done(new_publisher(open_region(P["name"])).send(b"wake up"))', name=shm_name)
    finally:
        thread.join(40)
    assert received == [b"wake up"]
    assert region.atomics.load_acquire_u32(region.ring_address(0) + HAS_WAITER_OFFSET) == 0


def test_our_publisher_wakes_a_blocked_native_subscriber(shm_name):
    region = _region(shm_name, 1, 8, 16)
    code = r'''
sub = new_subscriber(open_region(P["name"]))
ready()
data = sub.receive(30.0)
done(None if data is None else data.decode())
'''
    with native(code, name=shm_name) as peer:
        peer.wait_ready()
        has_waiter = region.ring_address(0) + HAS_WAITER_OFFSET
        _wait_for(lambda: region.atomics.load_acquire_u32(has_waiter) == WAITER_FUTEX, "the native subscriber to park")
        Publisher(region).send(b"wake up")
        assert peer.result() == "wake up"


def test_ring_reuse_after_leave_both_ways(shm_name):
    """One ring only: a native subscriber leaves, ours takes the ring; ours
    leaves, a native one takes it; the pool is whole each time."""
    region = _region(shm_name, 1, 8, 12)
    pub = Publisher(region)
    owner = region.ring_address(0) + OWNER_PID_OFFSET
    code = r'''
region = open_region(P["name"])
sub = new_subscriber(region)
ready()
wait_go()
got, lost = receive_all(sub, P["expected"], block=False)
done({"got": got, "lost": lost})
'''
    for round_ in range(2):
        with native(code, name=shm_name, expected=5) as peer:
            peer.wait_ready()
            assert region.atomics.load_acquire_u64(owner) == peer.proc.pid
            publish_all(pub, range(5))
            peer.tell()
            result = peer.result()
        assert [seq for _, seq, _ in result["got"]] == list(range(5)) and result["lost"] == 0
        assert region.stats().pool_free == 12 and region.atomics.load_acquire_u64(owner) == 0
        with Subscriber(region) as sub:
            assert sub.ring_index == 0
            run_native9(NATIVE_API + LOOPS + 'done(publish_all(new_publisher(open_region(P["name"])), range(20)))', name=shm_name)
            got, lost = receive_all(sub, 20, block=False)
            assert [seq for _, seq, _ in got] == list(range(12, 20)) and lost == 12
        assert region.stats().pool_free == 12 and region.stats().live_rings == 0


def test_many_publishers_and_subscribers_mixed(shm_name):
    """Two native and two of our publishers (subprocesses), two native and
    two of our subscribers: every subscriber gets every message, each
    publisher's in order, nothing lost (the rings hold all of them)."""
    per_publisher = 300
    publishers = 4
    total = per_publisher * publishers
    _region(shm_name, 4, 2048, 4 * 2048 + 16, payload=240)
    subscribers = [
        native(SUBSCRIBE_CHILD, name=shm_name, expected=total, timeout=90),
        native(SUBSCRIBE_CHILD, name=shm_name, expected=total, timeout=90),
        ours_child(SUBSCRIBE_CHILD, name=shm_name, expected=total, timeout=90),
        ours_child(SUBSCRIBE_CHILD, name=shm_name, expected=total, timeout=90),
    ]
    publishers_: list = []
    try:
        for peer in subscribers:  # every ring is claimed before anyone publishes
            peer.wait_ready()
        publishers_ += [
            (native if tag < 2 else ours_child)(PUBLISH_CHILD, name=shm_name, count=per_publisher, tag=tag, timeout=90)
            for tag in range(publishers)
        ]
        for peer in publishers_:
            peer.wait_ready()
        for peer in subscribers + publishers_:
            peer.tell()
        results = [peer.result() for peer in publishers_ + subscribers]
    finally:
        for peer in subscribers + publishers_:
            peer.kill()
    for result in results[:publishers]:
        assert result["dropped"] == 0
    for result in results[publishers:]:
        assert result["lost"] == 0 and len(result["got"]) == total
        for tag in range(publishers):
            assert [seq for t, seq, _ in result["got"] if t == tag] == list(range(per_publisher))
    stats = Region.open(shm_name).stats()
    assert stats.total_drops == stats.total_losses == 0 and stats.pool_free == stats.pool_size


# -- 0.9.2's recovery behaviours, both ways ----------------------------------------


def _forge_dead_claim(region: Region, pos: int) -> None:
    """As if a publisher claimed ``pos`` on ring 0, locked its entry and died:
    write_pos = pos + 1, sequence = the publisher lock of pos."""
    ops = region.atomics
    assert ops.load_acquire_u64(region.ring_address(0) + layout.WRITE_POS_OFFSET) == pos
    ops.store_release_u64(region.entry_address(0, pos) + layout.SEQUENCE_OFFSET, words.publisher_lock(pos))
    ops.store_release_u64(region.ring_address(0) + layout.WRITE_POS_OFFSET, pos + 1)


STEAL_PUBLISHER = r'''
pub = new_publisher(open_region(P["name"]))
publish_all(pub, P["seqs"], how="send")
done({"dropped": pub.dropped})
'''


@pytest.mark.parametrize("publisher", ["native", "ours"])
def test_a_stable_lock_is_stolen_and_skipped_and_both_count_it(shm_name, publisher):
    """8-entry ring, commit timeout 20 ms. Positions 0-5 delivered and read;
    a dead publisher's lock is forged at position 6. Positions 7-13 go
    through; position 14 (same entry) finds the lock unchanged for a whole
    timeout, steals it and writes skip(14) = 0x400000000000000f, dropping
    its own delivery. The subscriber (the other implementation) loses 6
    (overrun) and 14 (the skip marker): 2 losses, messages 7-13 received."""
    region = Region.create(shm_name, 1, ChannelConfig(1, 8, 24, 256, commit_timeout_us=20_000), "steal")
    ours_pub = Publisher(region)
    subscriber_code = r'''
region = open_region(P["name"])
sub = new_subscriber(region)
ready()
first, _ = receive_all(sub, 6, block=True)
ready()
wait_go()
rest, lost = receive_all(sub, 10, block=False)
stats = region.stats()
done({"first": first, "rest": rest, "lost": lost, "ring_lost": stats.rings[0].lost_count,
      "dropped": stats.rings[0].dropped_count, "steals": stats.total_steals})
'''
    if publisher == "ours":
        peer = native(subscriber_code, name=shm_name)
    else:
        peer = None
        sub = Subscriber(region)
    try:
        if peer is not None:
            peer.wait_ready()
        publish_all(ours_pub, range(6), how="send")
        if peer is not None:
            peer.wait_ready()  # it read 0-5
        else:
            first, _ = receive_all(sub, 6, block=False)
            assert [seq for _, seq, _ in first] == list(range(6))
        _forge_dead_claim(region, 6)
        if publisher == "ours":
            publish_all(ours_pub, range(7, 15), how="send")
            dropped = ours_pub.dropped
            peer.tell()
            result = peer.result()
            assert [seq for _, seq, _ in result["first"]] == list(range(6))
            rest, lost, ring_lost = result["rest"], result["lost"], result["ring_lost"]
            assert (result["dropped"], result["steals"]) == (1, 1)
        else:
            dropped = run_native9(NATIVE_API + LOOPS + STEAL_PUBLISHER, name=shm_name, seqs=list(range(7, 15)))["dropped"]
            rest, lost = receive_all(sub, 10, block=False)
            ring_lost = region.stats().rings[0].lost_count
    finally:
        if peer is not None:
            peer.kill()
    assert [seq for _, seq, _ in rest] == list(range(7, 14))
    assert lost == ring_lost == 2
    assert dropped == 1
    entry = region.entry_address(0, 14)
    assert region.atomics.load_acquire_u64(entry + layout.SEQUENCE_OFFSET) == 0x400000000000000F
    stats = region.stats()
    assert (stats.total_steals, stats.total_drops) == (1, 1)


@pytest.mark.parametrize("receiver", ["native", "ours"])
def test_a_claim_tagged_for_another_position_is_a_loss(shm_name, receiver):
    """0.9.2's receive checks the meta tag: a committed entry whose claim
    carries another position's tag is counted lost, not delivered."""
    region = _region(shm_name, 1, 8, 16)
    code = r'''
region = open_region(P["name"])
sub = new_subscriber(region)
ready()
wait_go()
got, lost = receive_all(sub, 2, block=False)
done({"got": got, "lost": lost})
'''
    peer = native(code, name=shm_name) if receiver == "native" else None
    try:
        sub = None
        if peer is not None:
            peer.wait_ready()
        else:
            sub = Subscriber(region)
        publish_all(Publisher(region), range(2), how="send")
        meta = region.entry_address(0, 0) + layout.META_OFFSET
        value = region.atomics.load_acquire_u64(meta)
        assert words.meta_tag(value) == 1
        region.atomics.store_release_u64(meta, words.pack_meta(8, words.meta_slot_field(value) - 1))  # tag of position 8
        if peer is not None:
            peer.tell()
            result = peer.result()
            got, lost = result["got"], result["lost"]
        else:
            got, lost = receive_all(sub, 2, block=False)
    finally:
        if peer is not None:
            peer.kill()
    assert [seq for _, seq, _ in got] == [1] and lost == 1


def test_a_corrupt_free_stack_head_fails_allocation_on_both(shm_name):
    region = _region(shm_name, 1, 8, 16)
    region.atomics.store_release_u64(region.free_top_address, 5 << 32 | 1000)  # index beyond the pool
    assert Publisher(region).allocate() == layout.INVALID_SLOT
    code = r'''
pub = new_publisher(open_region(P["name"]))
try:
    pub.send(b"x")
    sent = "sent"
except BlockingIOError as error:
    sent = str(error)
done({"allocate": pub.allocate() is None, "send": sent})
'''
    result = run_native9(NATIVE_API + code, name=shm_name)
    assert result["allocate"] is True and "exhausted" in result["send"]


def test_contended_small_ring_stays_ordered_and_accounted(shm_name):
    """Two native and two of our publishers race 1500 messages each through
    16-entry rings to a native and one of our subscribers, reading as they
    come: locks wait on the previous lap, slow readers are overrun. For
    every subscriber each publisher's messages arrive in order, intact,
    never twice, and received + lost + (at most one lap unread) covers every
    position of its ring."""
    per_publisher = 1500
    _region(shm_name, 2, 16, 64, payload=240)
    code = r'''
region = open_region(P["name"])
sub = new_subscriber(region)
ready()
wait_go()
got, lost = [], 0
done_publishers = 0
deadline = time.monotonic() + 60
while time.monotonic() < deadline:
    batch, lost = receive_all(sub, 10**9, seconds=0.5, block=True)
    got += batch
    if len(batch) == 0 and region.stats().rings[P["ring"]].in_flight == 0 and P["total"] <= region.stats().total_writes:
        break
more, lost = receive_all(sub, 10**9, block=False)
got += more
stats = region.stats().rings[P["ring"]]
done({"got": got, "lost": lost, "write_pos": stats.write_pos, "ring_lost": stats.lost_count})
'''
    total = 4 * per_publisher
    subscribers = [native(code, name=shm_name, ring=0, total=total, timeout=90)]
    subscribers[0].wait_ready()
    subscribers.append(ours_child(code, name=shm_name, ring=1, total=total, timeout=90))
    publishers: list = []
    try:
        subscribers[1].wait_ready()
        publishers += [(native if tag < 2 else ours_child)(PUBLISH_CHILD, name=shm_name, count=per_publisher, tag=tag, timeout=90)
                       for tag in range(4)]
        for peer in publishers:
            peer.wait_ready()
        for peer in subscribers + publishers:
            peer.tell()
        results = [peer.result() for peer in publishers + subscribers]
    finally:
        for peer in subscribers + publishers:
            peer.kill()
    for result in results[4:]:
        assert result["write_pos"] == total  # every publish reached both Live rings
        assert result["lost"] == result["ring_lost"]
        received = len(result["got"])
        assert received + result["lost"] <= total and total - (received + result["lost"]) <= 16
        for tag in range(4):
            seqs = [seq for t, seq, _ in result["got"] if t == tag]
            assert seqs == sorted(set(seqs)), f"publisher {tag}: duplicated or reordered"
    stats = Region.open(shm_name).stats()
    assert stats.pool_free == stats.pool_size and stats.live_rings == 0


# -- A publisher stalled between its claim takeover and its commit -------------------


class StallBeforeCommit(Atomics):
    """The hardware atomics, except that the commit CAS on one address
    (a sequence word, release order) first runs ``stall()``: the publisher
    holds its lock and claim while another process acts."""

    def __init__(self) -> None:
        self.address = -1
        self.stall = lambda: None

    def cas_release_u64(self, address: int, expected: int, desired: int) -> int:  # type: ignore[override]
        if address == self.address:
            self.address = -1
            self.stall()
        return super().cas_release_u64(address, expected, desired)


NATIVE_LAP = r'''
pub = kickmsg.Publisher(kickmsg.SharedRegion.open(P["name"]))
ready()
for i in range(P["count"]):
    pub.send(b"native %d" % i)
done({"dropped": pub.dropped})
'''


@pytest.mark.parametrize("subscriber", ["ours", "native"])
def test_a_stalled_publishers_late_commit_fails_after_a_steal(shm_name, subscriber):
    """Our publisher stalls holding the lock of position 8 (claim installed).
    A native publisher sends 8 more: its position 16 (same entry) sees the
    lock unchanged for a whole commit timeout (20 ms), steals it and writes
    a skip marker. Our commit CAS then fails: dropped, no excess (the entry
    owns our reference). The subscriber loses 8 (overwritten) and 16 (skip),
    whichever implementation it is; the pool is whole after it leaves."""
    hooked = StallBeforeCommit()
    Region.create(shm_name, 1, ChannelConfig(1, 8, 24, 64, commit_timeout_us=20_000), "stall")
    region = Region.open(shm_name, atomics=hooked)
    pub = Publisher(region)
    sub_code = r'''
region = kickmsg.SharedRegion.open(P["name"])
sub = kickmsg.Subscriber(region)
ready()
wait_go()
got = []
while True:
    data = sub.try_receive()
    if data is None:
        break
    got.append(data.decode())
done({"got": got, "lost": sub.lost})
'''
    peer = start_native9(sub_code, name=shm_name) if subscriber == "native" else None
    sub = Subscriber(region) if peer is None else None
    try:
        if peer is not None:
            peer.wait_ready()
        for i in range(8):
            pub.send(b"ours %d" % i)
        if sub is not None:
            assert [sub.try_receive() for _ in range(8)] == [b"ours %d" % i for i in range(8)]

        def steal_meanwhile() -> None:
            result = run_native9(NATIVE_LAP, name=shm_name, count=8)
            assert result["dropped"] == 1

        hooked.address = region.entry_address(0, 8) + layout.SEQUENCE_OFFSET
        hooked.stall = steal_meanwhile
        assert pub.send(b"ours late") == 9  # send reports the length, delivered or not
        assert hooked.address == -1  # the stall ran
        assert pub.dropped == 1
        entry = region.entry_address(0, 8)
        assert region.atomics.load_acquire_u64(entry + layout.SEQUENCE_OFFSET) == words.skip_marker(16)
        assert words.meta_tag(region.atomics.load_acquire_u64(entry + layout.META_OFFSET)) == 9  # our claim stays
        if peer is not None:
            peer.tell()
            result = peer.result()
            got, lost = result["got"], result["lost"]
        else:
            got = []
            while (data := sub.try_receive()) is not None:
                got.append(data.decode())
            lost = sub.lost
            sub.close()
    finally:
        if peer is not None:
            peer.kill()
    # ours read 0-7 before the stall; the native one reads only now, a lap
    # behind: 0-8 overwritten (9 lost) instead of 8 alone
    assert got == [f"native {i}" for i in range(7)] and lost == (2 if peer is None else 10)
    stats = region.stats()
    assert (stats.total_steals, stats.total_drops) == (1, 2)
    assert stats.pool_free == 24


def test_the_grace_period_spares_a_live_commit(shm_name):
    """Commit timeout 5 s. Our publisher stalls before its commit until a
    native publisher has claimed the position one lap later (it now waits
    for our commit); then we commit. Nothing is stolen or dropped."""
    hooked = StallBeforeCommit()
    Region.create(shm_name, 1, ChannelConfig(1, 8, 24, 64, commit_timeout_us=5_000_000), "grace")
    region = Region.open(shm_name, atomics=hooked)
    sub = Subscriber(region)
    pub = Publisher(region)
    for i in range(8):
        pub.send(b"ours %d" % i)
    assert [sub.try_receive() for _ in range(8)] == [b"ours %d" % i for i in range(8)]
    write_pos = region.ring_address(0) + layout.WRITE_POS_OFFSET
    with start_native9(NATIVE_LAP, name=shm_name, count=8) as peer:
        def let_it_wait() -> None:
            peer.wait_ready()
            _wait_for(lambda: region.atomics.load_acquire_u64(write_pos) == 17, "the native publisher to claim position 16")

        hooked.address = region.entry_address(0, 8) + layout.SEQUENCE_OFFSET
        hooked.stall = let_it_wait
        pub.send(b"ours late")
        assert peer.result()["dropped"] == 0
    assert pub.dropped == 0
    got = []
    while (data := sub.try_receive()) is not None:
        got.append(data)
    # the lap overwrote "ours late" before we read (1 lost); what counts: it was committed, not stolen
    assert got == [b"native %d" % i for i in range(8)] and sub.lost == 1
    stats = region.stats()
    assert (stats.total_steals, stats.total_drops) == (0, 0)


# -- Mixed traffic with publishers killed mid-flight ------------------------------------


READ_UNTIL_TOLD = r'''
import threading
region = open_region(P["name"])
sub = new_subscriber(region)
stop = threading.Event()
got = []

def reader():
    while not stop.is_set():
        data = sub.receive(0.05)
        if data is not None:
            got.append([data[0], check_payload(data[1:])])

thread = threading.Thread(target=reader)
thread.start()
ready()
wait_go()
stop.set()
thread.join()
while (data := sub.try_receive()) is not None:
    got.append([data[0], check_payload(data[1:])])
lost = sub.lost
sub = leave(sub)
done({"got": got, "lost": lost})
'''

KILLABLE_PUBLISHER = r'''
pub = new_publisher(open_region(P["name"]))
publish_all(pub, range(P["before"]), tag=P["tag"])
ready()
publish_all(pub, range(P["before"], P["count"]), tag=P["tag"])
done({"dropped": pub.dropped})
'''


def test_publishers_killed_mid_flight_leave_order_intact_and_the_pool_recoverable(shm_name):
    """Four publishers (two of each implementation) into two subscribers
    (one of each) reading as messages come; one publisher of each kind is
    SIGKILLed at an arbitrary point of its run. Nothing arrives twice or out
    of order, every message read is intact; once everyone has stopped, the
    repairs (locked entries, retired rings, orphaned slots) make the pool
    whole and every ring Free."""
    region = _region(shm_name, 2, 64, 256, payload=240)
    subscribers = [native(READ_UNTIL_TOLD, name=shm_name, timeout=120), ours_child(READ_UNTIL_TOLD, name=shm_name, timeout=120)]
    publishers: list = []
    try:
        for peer in subscribers:
            peer.wait_ready()
        publishers = [(native if tag % 2 == 0 else ours_child)(KILLABLE_PUBLISHER, name=shm_name, tag=tag, before=400,
                                                              count=4000, timeout=120) for tag in range(4)]
        for peer in publishers:
            peer.wait_ready()  # each has published 400 and goes on
        publishers[0].kill()  # native, somewhere in its next messages
        publishers[1].kill()  # ours
        survivors = [publishers[2].result(), publishers[3].result()]
        for peer in subscribers:
            peer.tell()
        results = [peer.result() for peer in subscribers]
    finally:
        for peer in subscribers + publishers:
            peer.kill()
    for result in results:
        for tag in range(4):
            seqs = [seq for t, seq in result["got"] if t == tag]
            assert seqs == sorted(set(seqs)), f"publisher {tag}: duplicated or reordered"
            if tag >= 2:
                assert seqs, f"nothing of surviving publisher {tag}"
    assert all(result["dropped"] >= 0 for result in survivors)
    # everyone stopped: repair what the killed ones left
    repair.repair_locked_entries(region)
    repair.reset_retired_rings(region)
    repair.reclaim_orphaned_slots(region)
    health = repair.diagnose(region)
    assert (health.locked_entries, health.retired_rings, health.draining_rings, health.live_rings) == (0, 0, 0, 0)
    stats = region.stats()
    assert all(ring.state == "Free" and ring.in_flight == 0 for ring in stats.rings)
    # a ring left retired (a killed publisher was counted in it) was reset
    # without a drain: its entries keep their claims (B.13), and every slot
    # is either free or held by exactly its claims
    ops, g = region.atomics, region.geometry
    claims = [0] * g.pool_size
    for ring in range(g.max_subs):
        for pos in range(g.capacity):
            field = words.meta_slot_field(ops.load_acquire_u64(region.entry_address(ring, pos) + layout.META_OFFSET))
            if field:
                claims[field - 1] += 1
    refcounts = [ops.load_acquire_u32(region.slot_address(slot) + layout.REFCOUNT_OFFSET) for slot in range(g.pool_size)]
    assert stats.pool_free + sum(1 for c in claims if c) == g.pool_size
    assert all(refcounts[slot] == claims[slot] for slot in range(g.pool_size) if claims[slot])
    # the next subscribers and a lap of publishing replace those claims: the pool ends whole
    rejoined = [Subscriber(region) for _ in range(g.max_subs)]
    publish_all(Publisher(region), range(g.capacity), how="send")
    for sub in rejoined:
        sub.close()
    assert region.stats().pool_free == g.pool_size
