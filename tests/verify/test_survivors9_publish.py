"""Layout 9's publish survivors closed by rules 3, 9 and 12 of
``kickmsg.verify.layout9`` and by the trials of ``mutations.TRIALS9_PUBLISH``.

Each is shown on a small trial that kills a mutant the default bounds left
alive: the unmutated flows pass the trial (under both memory models), the
mutant fails it with the expected violation.
"""
import re

import pytest

from kickmsg.protocol.v9 import ChannelConfig, Publisher, Region, Subscriber, layout, words
from kickmsg.verify import Scenario9, explore, mutants, mutations, orders
from kickmsg.verify.layout9 import MUTANT_SCENARIOS9
from kickmsg.verify.mutations import TRIALS9_PUBLISH, Trial

MUTANTS = {derived.id: derived.mutant for derived in mutations.derive(9)[0]}
GUARDS = ("protocol/v9/publish.py:225 drop-operand #2", "protocol/v9/publish.py:225 move-bound",
          "protocol/v9/publish.py:162 drop-operand #2")
WRAP, LEAVER = TRIALS9_PUBLISH
TWO_PUBLISHERS = Trial(Scenario9(subscribers=0, idle=1), least_preemptions=1)  # the smallest that shows the check
STEAL = Trial(orders.SCENARIOS9["steal"], least_preemptions=1)  # a publisher may die holding its lock
STEAL_UNPROVEN = Trial(MUTANT_SCENARIOS9["steal-unproven"][0], least_preemptions=3, models=("sc",))  # in the set


@pytest.mark.parametrize("mutant, trial, violation", [
    # rule 12: a publish delivering to no ring
    ("protocol/v9/publish.py:152 drop-condition", Trial(orders.SCENARIO9),
     r"pub0's message 0 claimed no position on ring\(s\) 0, Live for the whole publish"),
    # rule 12: a steal that keeps its repairer lock
    ("protocol/v9/publish.py:65 remove-step", STEAL,
     r"at the end ring 0 entry 0 is left repairer lock of pos 1 by pub[01], which did not die"),
    # rule 3: a skip marker stored before the steal's CAS, over another's lock
    ("protocol/v9/publish.py:63 swap-steps", STEAL,
     r"pub[01] stores skip marker of pos 1 on ring 0 entry 0 over .*, not over its own repairer lock \(B\.8 3: a steal "
     r"takes the lock first\)"),
    # rule 12: an abandon not counted on the ring's dropped_count
    ("protocol/v9/publish.py:294 remove-step", STEAL,
     r"pub[01] abandoned 1 deliveries of message 0, but counted 0 on the rings' dropped_count"),
    # rule 12: a steal not counted
    ("protocol/v9/publish.py:66 remove-step", STEAL,
     r"at the end steal_count is 0, but 1 steal\(s\) were made \(1 by live actors\)"),
    # the wrapping trial: the first lap's prev_seq taken as pos - capacity + 1 (negative)
    ("protocol/v9/publish.py:178 drop-condition", WRAP,
     r"pub0 abandoned 1 deliveries of message 0, though no time passed, nobody died and no repairer ran"),
    # the wrapping trial: the slot pushed while the ring that took it still claims it
    ("protocol/v9/publish.py:239 drop-condition", WRAP,
     r"slot \d \(refcount 1, 1 claim\(s\), 0 view\(s\)\) is on the free stack"),
    # the leaver's trial: admitted into a ring that left, its claim stays there (rule 9)
    ("protocol/v9/publish.py:162 drop-condition", LEAVER,
     r"at the end slot\(s\) \[1\] are off the free stack, though nobody died and every leave quiesced .*"),
    # rule 12: a wait that returns an older commit at once, so the lock is given up (the set kills it in
    # steal-unproven's scenario, at three preemptions)
    ("protocol/v9/publish.py:254 drop-operand #2", TWO_PUBLISHERS,
     r"pub[01] abandoned 1 deliveries of message 0, though no time passed, nobody died and no repairer ran"),
    # rule 3: the previous lap's commit, landed between the failed lock and the self-repair, stolen as stale
    ("protocol/v9/publish.py:282 negate-condition", STEAL_UNPROVEN,
     r"pub0 steals commit of pos 0 on ring 0 entry 0 for position 1: not more than one wrap behind it .*"),
    ("protocol/v9/publish.py:282 move-bound", STEAL_UNPROVEN,
     r"pub0 steals commit of pos 0 on ring 0 entry 0 for position 1: not more than one wrap behind it .*"),
])
def test_survivor_killed(mutant: str, trial: Trial, violation: str) -> None:
    preemptions = trial.preemptions(0)
    for model in trial.models:
        baseline = explore(trial.scenario, preemptions=preemptions, memory_model=model, stale=int(model == "ra"))
        assert baseline.violation is None, model
    report = explore(trial.scenario, mutant=MUTANTS[mutant], preemptions=preemptions)
    assert report.violation is not None
    assert re.fullmatch(violation, report.violation.splitlines()[0])


def _install(monkeypatch: pytest.MonkeyPatch, mutant: str) -> None:
    for patch in MUTANTS[mutant].patches:
        monkeypatch.setattr(patch.owner, patch.attribute, mutants.build(patch, mutant))


def _forge_and_send(shm_name: str, forge: str) -> int:
    """A subscriber on one ring of one entry, a word of a hostile peer
    (``forge``), then a send; the send's result."""
    region = Region.create(shm_name, 1, ChannelConfig(1, 1, 4, 32), "guards")
    try:
        subscriber = Subscriber(region)  # kept: its ring stays Live
        publisher = Publisher(region)
        publisher.send(b"first")
        ops = region.atomics
        if forge == "claim past the pool":  # on the entry the next send takes over
            ops.store_release_u64(region.entry_address(0, 0) + layout.META_OFFSET,
                                  words.pack_meta(0, region.geometry.pool_size))
        else:  # "in_flight at its maximum": a Live ring no publisher can be admitted to
            ops.store_release_u32(region.ring_address(0) + layout.STATE_FLIGHT_OFFSET, 0xFFFFFFFD)
        sent = publisher.send(b"second")
        subscriber.close()
        return sent
    finally:
        region.unlink()


@pytest.mark.parametrize("mutant", GUARDS)
def test_guards_against_a_hostile_region(monkeypatch: pytest.MonkeyPatch, shm_name: str, mutant: str) -> None:
    """The claim of a slot past the pool is not released, a ring whose
    in_flight is at its maximum admits nobody: the send goes on. Without
    the guard, the send raises."""
    forge = "in_flight at its maximum" if ":162 " in mutant else "claim past the pool"
    assert _forge_and_send(shm_name, forge) == len(b"second")
    _install(monkeypatch, mutant)
    with pytest.raises((IndexError, OverflowError)):
        _forge_and_send(shm_name, forge)


def _send_past_a_lock_replaced_during_the_wait(shm_name: str) -> tuple[int, int]:
    """P9: entry 0 locked by position 0's stalled publisher; a send of
    position 4 waits a commit timeout on it, and as the timeout passes a
    repairer replaces the lock with its own (B.13, before its skip marker).
    The entry's sequence word after the send, and steal_count."""
    region = Region.create(shm_name, 1, ChannelConfig(1, 4, 8, 32), "p9")
    try:
        subscriber = Subscriber(region)  # kept: its ring stays Live
        ops = region.atomics
        sequence = region.entry_address(0, 0) + layout.SEQUENCE_OFFSET
        ops.store_release_u64(sequence, words.publisher_lock(0))
        ops.store_release_u64(region.ring_address(0) + layout.WRITE_POS_OFFSET, 4)
        timeout_ns = region.geometry.commit_timeout_us * 1000
        reads = []

        def clock() -> int:
            reads.append(None)
            if len(reads) == 2:  # the wait's timeout check: the stalled lock was stable, a repairer takes it now
                ops.store_release_u64(sequence, words.repairer_lock(0))
            return len(reads) * timeout_ns

        region.monotonic_ns = clock
        Publisher(region).send(b"late")
        subscriber.close()
        return ops.load_acquire_u64(sequence), ops.load_relaxed_u64(region.steal_count_address)
    finally:
        region.unlink()


def test_a_stable_lock_replaced_by_another_is_not_stolen(monkeypatch: pytest.MonkeyPatch, shm_name: str) -> None:
    """P9: the self-repair steals a stable lock only if it is still the very
    lock the wait saw; the repairer's lock is left to the repairer. Without
    the check (280 drop-operand #2) the publisher steals the repairer's lock."""
    assert _send_past_a_lock_replaced_during_the_wait(shm_name) == (words.repairer_lock(0), 0)
    _install(monkeypatch, "protocol/v9/publish.py:280 drop-operand #2")
    assert _send_past_a_lock_replaced_during_the_wait(shm_name) == (words.skip_marker(4), 1)
