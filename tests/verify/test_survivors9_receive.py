"""Layout 9's receive and repair survivors (docs/explanation/verification.md,
"Arguments: layout 9's receive and repair"): the trial added for them
passes with the real flows and kills the mutants it is for; the claim
checks of pin_next and drain_window hold at their bound (a slot field one
past the pool), and a receive without a deadline naps while the head is
claimed, which the explorer (its regions well formed, its receives with a
deadline) never reaches; an older lap's skip marker under a claimed
position is not taken for that position's (R3: the explorer reaches it only
at three preemptions); the leave racing a publisher's admission or a
join (R8), in the two trials added for it, and a leave that gives up before
its deadline (rule 14)."""
import pytest

from kickmsg.protocol.v9 import ChannelConfig, Publisher, Region, Subscriber, layout, receive, repair, words
from kickmsg.verify import explore, mutants, mutations

TRIAL = mutations.TRIALS9_RECEIVE[0]


def _derived(mutant_id):
    return next(derived for derived in mutations.derive(9)[0] if derived.id == mutant_id)


def _explore(mutant=None):
    return explore(TRIAL.scenario, mutant=mutant, preemptions=TRIAL.least_preemptions, memory_model="sc")


def test_the_receive_trial_is_in_layout_9s_set_and_passes_with_the_real_flows():
    assert TRIAL in mutations.TRIALS[9]
    report = _explore()
    assert report.violation is None and report.schedules < 200


@pytest.mark.parametrize(("mutant_id", "violation"), [
    ("protocol/v9/receive.py:267 move-bound", "lost position 0 of ring 0, committed and never overwritten"),
    ("protocol/v9/receive.py:240 move-bound #2", "lost position 0 of ring 0, committed and never overwritten"),
    ("protocol/v9/receive.py:169 swap-steps", "at the end slot(s) [0] are off the free stack"),
    ("protocol/v9/receive.py:176 remove-step", "but its owner_pid does not record it"),
    ("protocol/v9/receive.py:439 remove-step", "is Free but still records owner_pid"),
    ("protocol/v9/repair.py:232 move-bound", "at the end slot(s) [0] are off the free stack"),
])
def test_the_receive_trial_kills_the_survivors_it_is_for(mutant_id, violation):
    report = _explore(_derived(mutant_id).mutant)
    assert report.violation is not None and violation in report.violation


JOIN_DURING_LEAVE = mutations.TRIALS9_RECEIVE[1]
LEAVE_DURING_PUBLISH = mutations.TRIALS9_PUBLISH[1]


@pytest.mark.parametrize("trial", [JOIN_DURING_LEAVE, LEAVE_DURING_PUBLISH])
def test_the_leave_trials_are_in_the_set_and_pass_with_the_real_flows(trial):
    assert trial in mutations.TRIALS[9]
    report = explore(trial.scenario, preemptions=trial.least_preemptions, memory_model="sc")
    assert report.violation is None and report.complete


@pytest.mark.parametrize(("trial", "mutant_id", "violation"), [
    # R8: the CAS to Draining lost to an admission, the ring left Live: a message admitted during the drain
    (LEAVE_DURING_PUBLISH, "protocol/v9/receive.py:425 drop-condition", "are off the free stack, though nobody died"),
    (LEAVE_DURING_PUBLISH, "protocol/v9/receive.py:425 negate-condition", "are off the free stack, though nobody"),
    # rule 14: giving up at the first look at a publisher in flight, before the deadline
    (LEAVE_DURING_PUBLISH, "protocol/v9/receive.py:432 drop-condition",
     "leaver0's leave gave up waiting for the publishers in flight at 0 ns, before its deadline"),
    (LEAVE_DURING_PUBLISH, "protocol/v9/receive.py:432 negate-condition", "before its deadline"),
    # Free stored over a publisher in flight: its fetch_sub then underflows
    (LEAVE_DURING_PUBLISH, "protocol/v9/receive.py:444 drop-condition", "publishers in flight, of 1 (an underflow?)"),
    # the retire branch: one CAS that lost to the publisher's fetch_sub leaves the ring Draining
    (LEAVE_DURING_PUBLISH, "protocol/v9/receive.py:451 swap-steps", "is not Free with nobody in flight"),
    (LEAVE_DURING_PUBLISH, "protocol/v9/receive.py:452 drop-condition", "is not Free with nobody in flight"),
    (LEAVE_DURING_PUBLISH, "protocol/v9/receive.py:452 negate-condition", "is not Free with nobody in flight"),
    # Free stored before the drain: the reader's ring is joined while it still drains it
    (JOIN_DURING_LEAVE, "protocol/v9/receive.py:445 swap-steps", "but its owner_pid does not record it"),
])
def test_the_leave_trials_kill_the_survivors_they_are_for(trial, mutant_id, violation):
    report = explore(trial.scenario, mutant=_derived(mutant_id).mutant, preemptions=trial.least_preemptions,
                     memory_model="sc")
    assert report.violation is not None and violation in report.violation


@pytest.fixture
def region(shm_name):
    return Region.create(shm_name, 1, ChannelConfig(2, 4, 8, 32), "survivors")


def _claim_one_past_the_pool(region, pos):
    """The claim of ring 0's entry ``pos`` rewritten to name slot pool_size
    (slot field pool_size + 1), the first index past the pool."""
    address = region.entry_address(0, pos) + layout.META_OFFSET
    region.atomics.store_release_u64(address, words.pack_meta(pos, region.geometry.pool_size))
    return address


def test_a_claim_one_past_the_pool_is_a_counted_loss(region):
    sub = Subscriber(region)
    pub = Publisher(region)
    pub.send(b"first")
    pub.send(b"second")
    _claim_one_past_the_pool(region, 0)
    assert sub.try_receive() == b"second"
    assert sub.lost == 1


def test_a_drain_skips_a_claim_one_past_the_pool(region):
    sub = Subscriber(region)
    Publisher(region).send(b"only")
    address = _claim_one_past_the_pool(region, 0)
    claim = region.atomics.load_acquire_u64(address)
    assert repair.drain_window(region, sub.ring_index, sub.start_pos) == 0
    assert region.atomics.load_acquire_u64(address) == claim  # left as it is: no slot released


class Napped(Exception):
    """Raised by the test's sleep_ns: the receive reached its nap."""


def test_a_receive_without_a_deadline_naps_while_the_head_is_claimed(region, monkeypatch):
    sub = Subscriber(region)
    ops = region.atomics
    ops.store_release_u64(region.ring_address(0) + layout.WRITE_POS_OFFSET, 1)  # position 0 claimed,
    ops.store_release_u64(region.entry_address(0, 0) + layout.SEQUENCE_OFFSET, words.publisher_lock(0))  # not committed
    naps = []

    def nap(ns):
        naps.append(ns)
        raise Napped

    monkeypatch.setattr(region, "sleep_ns", nap)
    with pytest.raises(Napped):
        sub.receive_view_until(None)  # YIELDS_BEFORE_SLEEP yields on the claimed head, then the nap
    assert naps == [receive.POLL_SLEEP_NS]


def _receive_over_an_older_laps_skip_marker(region):
    """Position 4 claimed (write_pos 5), its entry still holding the skip
    marker of position 0 (a lap of 4 before): a receive, then (read_pos, lost)."""
    sub = Subscriber(region)
    ops = region.atomics
    ops.store_release_u64(region.entry_address(sub.ring_index, 0) + layout.SEQUENCE_OFFSET, words.skip_marker(0))
    ops.store_release_u64(region.ring_address(sub.ring_index) + layout.WRITE_POS_OFFSET, 5)
    sub.read_pos = 4  # positions 0-3 gone past
    assert sub.try_receive() is None
    found = sub.read_pos, sub.lost
    sub.close()
    return found


def test_an_older_laps_skip_marker_under_a_claimed_position_is_not_consumed(region, monkeypatch):
    """R3: nothing to read yet, nothing lost. Without the position check
    (228 drop-operand #2) the receive counts position 4 lost and goes past
    it, before its publisher commits it."""
    assert _receive_over_an_older_laps_skip_marker(region) == (4, 0)
    for patch in _derived("protocol/v9/receive.py:228 drop-operand #2").mutant.patches:
        monkeypatch.setattr(patch.owner, patch.attribute, mutants.build(patch, "R3"))
    assert _receive_over_an_older_laps_skip_marker(region) == (5, 1)
