"""Layout 9 heals itself: a join that finds no Free ring leaves, on their
behalf, the rings of provably dead owners (WIRE9.md B.16) and tries again;
the reclaim gives the dead ring's claims back to the pool, as its owner's
leave would have (B.12), and never takes a live owner's ring
(``kickmsg.protocol.v9.repair.reclaim_dead_ring``).

Subscribers run in real processes, ours and the native 0.9.2 wheel's
(``nativepeer``), and are killed with SIGKILL or SIGTERM (the default
handler: no teardown runs either way)."""
import itertools
import os
import signal
import subprocess
import sys
import time

import pytest

from kickmsg import ChannelType, Config, Publisher, SharedRegion, Subscriber, unlink_shm
from kickmsg.protocol.v9 import layout
from kickmsg.verify import mutants
from nativepeer import run_native9, start_native9, start_ours

pytestmark = pytest.mark.timeout(120)

PARKED_SUBSCRIBER = r'''
sub = kickmsg.Subscriber(kickmsg.SharedRegion.open(P["name"]))
ready()
wait_go()
'''

NATIVE_JOIN_AND_RECEIVE = r'''
region = kickmsg.SharedRegion.open(P["name"])
sub = kickmsg.Subscriber(region)
kickmsg.Publisher(region).send(b"native after our reclaim")
done(sub.try_receive().decode())
'''

_names = itertools.count()


@pytest.fixture
def name():
    """A fresh /hrc_ name, unlinked after the test whatever its outcome."""
    value = f"/hrc_reclaim_{os.getpid()}_{next(_names)}"
    yield value
    unlink_shm(value)  # with its sidecars (the publishers record themselves)


def create(name: str, rings: int, capacity: int = 8, pool: int = 16) -> SharedRegion:
    return SharedRegion.create(name, ChannelType.PubSub, Config(max_subscribers=rings, sub_ring_capacity=capacity,
                                                                pool_size=pool, max_payload_size=64), layout=9)


def start_subscriber(impl: str, name: str):
    start = start_native9 if impl == "native" else start_ours
    peer = start(PARKED_SUBSCRIBER, name=name)
    peer.wait_ready()
    return peer


def kill(peer, signum: int) -> None:
    """``signum`` to the child, then reaped: its pid is gone."""
    peer.proc.send_signal(signum)
    peer.proc.wait(timeout=30)
    peer.kill()


def ring_states(region: SharedRegion) -> list[tuple[str, int]]:
    return [(ring.state, ring.in_flight) for ring in region.stats().rings]


@pytest.mark.parametrize("signum", [signal.SIGKILL, signal.SIGTERM], ids=["SIGKILL", "SIGTERM"])
@pytest.mark.parametrize("impl", ["ours", "native"])
def test_a_join_reclaims_the_rings_of_killed_subscribers(name, impl, signum):
    """Both rings of a 2-ring channel held by killed subscribers, each
    holding five claims: a new subscriber of ours joins (no "No free
    subscriber slots"), both dead rings are drained back to the pool, and a
    native 0.9.2 subscriber then joins the other ring and receives."""
    region = create(name, rings=2)
    peers = [start_subscriber(impl, name) for _ in range(2)]
    try:
        publisher = Publisher(region)
        for sequence in range(5):
            publisher.send(b"before %d" % sequence)
        assert region.stats().pool_free == 11  # five slots, each claimed by both rings
        for peer in peers:
            kill(peer, signum)
    finally:
        for peer in peers:
            peer.kill()
    assert region.diagnose().dead_subscriber_rings == 2
    with Subscriber(region) as subscriber:
        assert ring_states(region) == [("Live", 0), ("Free", 0)]
        assert region.stats().pool_free == 16  # the dead rings' claims went back, as their leaves would have
        assert region.diagnose().dead_subscriber_rings == 0
        assert run_native9(NATIVE_JOIN_AND_RECEIVE, name=name) == "native after our reclaim"
        assert subscriber.try_receive() == b"native after our reclaim"
    assert ring_states(region) == [("Free", 0), ("Free", 0)] and region.stats().pool_free == 16


def test_a_live_subscriber_is_never_evicted_and_a_full_channel_names_its_holders(name):
    """Ring 0 held by a live native subscriber, ring 1 by a killed one of
    ours: our join takes ring 1 only; a third join fails naming each holder
    (pid, alive) and the repair; the native subscriber still receives."""
    region = create(name, rings=2)
    live = start_native9(r'''
import datetime
region = kickmsg.SharedRegion.open(P["name"])
sub = kickmsg.Subscriber(region)
ready()
wait_go()
done(sub.receive(datetime.timedelta(seconds=20)).decode())
''', name=name)
    with live:
        live.wait_ready()
        dead = start_subscriber("ours", name)
        dead_pid = dead.proc.pid
        kill(dead, signal.SIGKILL)
        with Subscriber(region) as subscriber:
            assert ring_states(region) == [("Live", 0), ("Live", 0)]
            ring0 = region.core.ring_address(0)
            assert region.core.atomics.load_acquire_u64(ring0 + layout.OWNER_PID_OFFSET) == live.proc.pid
            with pytest.raises(RuntimeError) as raised:
                Subscriber(region)
            message = str(raised.value)
            assert f"No free subscriber slots in {name} (2 rings: ring 0 Live, pid {live.proc.pid} alive; " in message
            assert f"ring 1 Live, pid {os.getpid()} alive" in message and f"kickmsg repair {name}" in message
            assert str(dead_pid) not in message
            live.tell()
            Publisher(region).send(b"both hear it")
            assert live.result() == "both hear it"
            assert subscriber.try_receive() == b"both hear it"


@pytest.mark.parametrize("by", ["join", "reclaim_dead_subscribers"])
def test_a_full_channel_names_a_dead_holder_it_could_not_free(name, by):
    """A ring whose dead owner's publishers stay in flight past the commit
    timeout is left retired by the reclaim (the join's, or
    reclaim_dead_subscribers, which reports it timed out): a join finds no
    ring, and its error says so and names the repair."""
    region = create(name, rings=1)
    peer = start_subscriber("ours", name)
    kill(peer, signal.SIGKILL)
    ring = region.core.ring_address(0)
    region.core.atomics.fetch_add_relaxed_u32(ring + layout.STATE_FLIGHT_OFFSET, layout.IN_FLIGHT_ONE)  # a publisher died in flight
    if by == "reclaim_dead_subscribers":
        report = region.reclaim_dead_subscribers()
        assert (report.reclaimed, report.unrecorded, report.timed_out) == ([], [], [0])
    with pytest.raises(RuntimeError, match=rf"No free subscriber slots in {name} \(1 rings: ring 0 retired \(1 "
                                           rf"publisher\(s\) counted in flight\); kickmsg repair {name} "):
        Subscriber(region)
    assert region.reset_retired_rings(drain=True) == 1
    with Subscriber(region):
        assert ring_states(region) == [("Live", 0)]


def _starve_then_send(name: str) -> list[bool]:
    """Ring 8, pool 16, 4 rings; one live subscriber (here), another one
    killed after 8 messages: both rings hold 8 claims on the same 8 slots.
    Reclaim the dead ring, then send 20 messages, each received at once.
    Returns whether each send was delivered."""
    region = create(name, rings=4, capacity=8, pool=16)
    with Subscriber(region) as live:
        peer = start_subscriber("ours", name)
        try:
            publisher = Publisher(region)
            for sequence in range(8):
                publisher.send(b"%d" % sequence)
                assert live.try_receive() == b"%d" % sequence
            kill(peer, signal.SIGKILL)
        finally:
            peer.kill()
        assert region.reclaim_dead_rings() == 1
        delivered = []
        for sequence in range(8, 28):
            try:
                publisher.send(b"%d" % sequence)
            except BlockingIOError:  # slot pool exhausted
                delivered.append(False)
                continue
            delivered.append(live.try_receive() == b"%d" % sequence)
        return delivered


def test_a_reclaimed_ring_gives_its_claims_back_so_the_pool_is_not_starved(name):
    """Issue 34 item 2's channel: after our reclaim every send delivers."""
    assert _starve_then_send(name) == [True] * 20


def test_0_9_2s_reclaim_starves_that_channel(name):
    """The same with 0.9.2's reclaim (claims kept by a Free ring): once the
    live ring has wrapped onto new slots, the pool is dry for good."""
    with mutants.installed(mutants.lookup("reclaim-0.9.2")):
        delivered = _starve_then_send(name)
    assert delivered[:8] == [True] * 8 and not any(delivered[8:])


def test_an_echo_killed_with_sigkill_starts_again_on_a_channel_with_one_ring(name):
    """Issue 34 item 14: `kickmsg echo` SIGKILLed on a 1-ring channel; a new
    `kickmsg echo` joins (the dead echo's ring reclaimed by its join) and
    prints what is published."""
    region = create(name, rings=1)
    kickmsg_cli = [sys.executable, "-m", "kickmsg"]
    ring = region.core.ring_address(0)
    first = subprocess.Popen([*kickmsg_cli, "echo", name], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                             stdin=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 60
        while region.core.atomics.load_acquire_u64(ring + layout.OWNER_PID_OFFSET) != first.pid:
            assert first.poll() is None and time.monotonic() < deadline, first.stderr.read() if first.stderr else ""
            time.sleep(0.05)
    finally:
        first.kill()
        first.wait(timeout=30)
    second = subprocess.Popen([*kickmsg_cli, "echo", name, "--count", "1", "--format", "raw"], stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, stdin=subprocess.DEVNULL)
    try:
        publisher = Publisher(region)
        deadline = time.monotonic() + 60
        while second.poll() is None and time.monotonic() < deadline:
            publisher.send(b"again")
            time.sleep(0.05)
        out, err = second.communicate(timeout=30)
    finally:
        second.kill()
    assert second.returncode == 0, err.decode()
    assert out.startswith(b"again"), (out, err)
