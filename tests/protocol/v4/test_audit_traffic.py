"""The audit of a channel with traffic (kickmsg.ops.audit): one look at a busy
region catches flows half-way (a slot popped but in no ring yet, an entry
claimed but not committed, a slot being released), so the audit reports only
what holds still across its looks. Here publishers and subscribers of both
implementations (the native kickmsg 0.1.0 in subprocesses) keep a channel
busy while it is audited hundreds of times: no audit may call it damaged,
and real damage made under that traffic is still found.
"""
import os
import sys
import time

import pytest

from conftest import on_layout4
from kickmsg import ChannelType, Config, Publisher, SharedRegion, Subscriber, audit
from kickmsg.atomics import Atomics
from kickmsg.ops import diagnostics
from kickmsg.ops.audit import SlotReading
from nativepeer import Peer, start_native, start_ours
from test_health import make

# These tests check layout 4's own: native 0.1.0 publishers and layout 4's audit.
pytestmark = on_layout4

# commit_timeout 1 s, not the default 10 ms: on a loaded test machine the
# protocol itself takes a writer paused 10 ms for crashed and really leaks a
# slot (the spec's bounded leak), which the audit would rightly report.
CONFIG = dict(max_subscribers=8, sub_ring_capacity=16, pool_size=64, max_payload_size=256, commit_timeout=1.0)
AUDITS = 300
RUN_S = 120.0  # no child runs longer

# Until told to stop: publish by send and by allocate+publish in turns
# (bursts of 2, every 2 ms), retrying a dry pool. Result: [sent, dropped].
PUBLISHER = r"""
import select, time
publisher = kickmsg.Publisher(kickmsg.SharedRegion.open(P["name"]))
ready()
wait_go()
sent = 0
while not select.select([sys.stdin], [], [], 0)[0]:
    for _ in range(2):
        payload = make_payload(sent)
        if sent % 2:
            slot = publisher.allocate(len(payload))
            if slot is None:
                continue
            with memoryview(slot) as view:
                view[:] = payload
            slot.publish()
        else:
            try:
                publisher.send(payload)
            except BlockingIOError:
                continue
        sent += 1
    time.sleep(0.002)
done([sent, publisher.dropped])
"""

# Until told to stop: receive by copy and by view in turns, checking every
# message. Result: the number received.
SUBSCRIBER = r"""
import select
subscriber = kickmsg.Subscriber(kickmsg.SharedRegion.open(P["name"]))
ready()
wait_go()
received = 0
while not select.select([sys.stdin], [], [], 0)[0]:
    if received % 2:
        view = subscriber.receive_view(0.01)
        if view is not None:
            with view:
                check_payload(bytes(view))
            received += 1
    else:
        data = subscriber.receive(0.01)
        if data is not None:
            check_payload(data)
            received += 1
done(received)
"""

# Takes one message as a view and keeps it until killed: its pin is leaked.
VIEW_HOLDER = r"""
subscriber = kickmsg.Subscriber(kickmsg.SharedRegion.open(P["name"]))
view = None
while view is None:
    view = subscriber.receive_view(0.1)
ready()
wait_go()
"""

START = {"native": start_native, "ours": start_ours}


def start_traffic(name: str, subscribers: list[str], publishers: list[str]) -> tuple[list[Peer], list[Peer]]:
    """Subscribers, then publishers, of the given implementations, all
    running on ``name`` once this returns."""
    subscriber_peers = [START[impl](SUBSCRIBER, RUN_S, name=name) for impl in subscribers]
    publisher_peers = [START[impl](PUBLISHER, RUN_S, name=name) for impl in publishers]
    for peer in subscriber_peers + publisher_peers:
        peer.wait_ready()
    for peer in subscriber_peers + publisher_peers:
        peer.tell()
    return subscriber_peers, publisher_peers


def stop(peers: list[Peer]) -> list:
    """Tell each peer to stop; their results."""
    for peer in peers:
        peer.tell()
    return [peer.result() for peer in peers]


def wait_for_a_new_message(region: SharedRegion) -> None:
    """Return once ring 0 (a Live ring) has been written to again."""
    written = region.core.atomics.load_acquire_u64(region.core.rings[0].write_pos)
    deadline = time.monotonic() + 30
    while region.core.atomics.load_acquire_u64(region.core.rings[0].write_pos) == written:
        assert time.monotonic() < deadline, "the traffic stopped"
        os.sched_yield()


def count_looks(monkeypatch) -> list[int]:
    """Make the audit count its looks: the returned list gets one number per
    call of ``look``, reset by the caller between audits."""
    audit_module = sys.modules["kickmsg.ops.audit"]
    looks = [0]
    real_look = audit_module.look

    def counted(region):
        looks[0] += 1
        return real_look(region)

    monkeypatch.setattr(audit_module, "look", counted)
    return looks


@pytest.mark.timeout(180)
def test_hundreds_of_audits_of_a_busy_channel_find_no_damage(shm_name, monkeypatch):
    SharedRegion.create(shm_name, ChannelType.PubSub, Config(**CONFIG))
    looks = count_looks(monkeypatch)
    subscribers, publishers = start_traffic(shm_name, ["native", "native", "ours"], ["native", "native", "ours", "ours"])
    try:
        inspected = SharedRegion.inspect(shm_name)
        verdicts, looked_again = [], 0
        for number in range(AUDITS):
            wait_for_a_new_message(inspected)
            looks[0] = 0
            # kickmsg.ops.audit, and the health that `kickmsg list`/`audit` and the exporter show.
            verdicts.append(audit(inspected).verdict if number % 2 else diagnostics.health(shm_name).verdict)
            looked_again += looks[0] > 1
        received = stop(subscribers)
        sent_dropped = stop(publishers)
    finally:
        for peer in subscribers + publishers:
            peer.kill()
    assert [verdict for verdict in verdicts if not verdict.startswith("clean: ")] == []
    # The traffic flowed (between every two audits), no publisher gave up on
    # a ring entry (the protocol's own crash verdict), and the audits did
    # catch flows half-way.
    assert all(count > 0 for count in received), received
    assert all(sent > 0 and dropped == 0 for sent, dropped in sent_dropped), sent_dropped
    assert looked_again > 0


@pytest.mark.timeout(180)
def test_a_pin_leaked_under_traffic_is_found(shm_name):
    """A native subscriber killed while it holds a view leaks that slot's
    pin: with the channel busy all along, the audit reports exactly that
    slot, and nothing before it."""
    region = SharedRegion.create(shm_name, ChannelType.PubSub, Config(**CONFIG))
    subscribers, publishers = start_traffic(shm_name, ["native", "ours"], ["native", "ours"])
    holder = start_native(VIEW_HOLDER, RUN_S, name=shm_name)
    try:
        holder.wait_ready()
        holder.kill()
        inspected = SharedRegion.inspect(shm_name)
        reports = [audit(inspected)]
        while reports[-1].clean and len(reports) < 1000:  # its ring entries are evicted within milliseconds
            reports.append(audit(inspected))
        stop(subscribers)
        stop(publishers)
    finally:
        for peer in subscribers + publishers + [holder]:
            peer.kill()
    damaged = reports[-1]
    assert not damaged.clean, "the leaked pin was never reported"
    assert [report.verdict for report in reports[:-1] if not report.clean] == []
    assert {what: count for what, count in damaged.damage().items() if count} == {"leaked slots": 1}
    [slot] = damaged.leaked_slots
    assert (damaged.slot_readings[slot].refcount, damaged.slot_readings[slot].entries) == (1, ())
    # At quiescence the repair that takes back leaked slots takes back that one.
    assert region.reclaim_orphaned_slots() == 1
    assert audit(region).clean


class ChangingAfterFirstLook(Atomics):
    """Hardware atomics that call ``change`` once, when the audit's first
    look reads the schema state (its last read)."""

    def __init__(self, schema_state_address: int, change):
        self.schema_state_address = schema_state_address
        self.change = change

    def load_acquire_u32(self, address: int) -> int:
        if address == self.schema_state_address and self.change is not None:
            self.change, change = None, self.change
            change()
        return super().load_acquire_u32(address)


def test_a_state_gone_at_the_next_look_is_not_reported(shm_name):
    """A refcount one above its ring references (what a publisher between
    its pre-set and its last ring shows) that is put right after the first
    look is not reported; left as it is, it is."""
    region, raw = make(shm_name)
    subscriber = Subscriber(region)
    Publisher(region).send(b"x")
    slot = raw.read_ring(0).entries[0][1]
    raw.set_refcount(slot, 2)
    region.core.atomics = ChangingAfterFirstLook(region.core.schema_state_address, lambda: raw.set_refcount(slot, 1))
    assert audit(region).verdict == "clean: 15 of 16 slots free, 1 live rings"
    assert region.core.atomics.change is None  # the first look did see it
    raw.set_refcount(slot, 2)
    report = audit(region)
    assert report.leaked_slots == [slot]
    assert report.slot_readings == {slot: SlotReading(refcount=2, on_free_stack=False, entries=((0, 0),))}
    raw.set_refcount(slot, 1)
    subscriber.close()
