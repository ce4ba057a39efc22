"""Crash points on layout 9 (kickmsg.verify.crashes, `kickmsg verify --layout 9
--crash-points`): an actor dies at every step of every flow in turn, with
traffic and repairs around it, and the invariants hold; what a death loses
for good is exactly the documented windows' ring; every ring is joinable
again after the repairs; a sleeper whose waker died wakes at its timeout;
0.9.2's reclaimers evict a live owner from a death point and ours never;
the command's bounds, progress and Ctrl-C.

The whole table without preemptions takes about 3 s; the eviction flow
with one preemption after each death about 5 s. Deeper runs are commands
(docs/explanation/verification.md, "Crash points and repairs").
"""
import re
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from kickmsg import cli
from kickmsg.cli import checking
from kickmsg.protocol.v9.receive import Subscriber
from kickmsg.verify import Scenario9, crashes, invariants, layout9, traces

FLOWS = {flow.key: flow for flow in crashes.FLOWS}
KICKMSG = str(Path(sys.executable).with_name("kickmsg"))


@pytest.fixture(scope="module")
def table():
    return crashes.crash_points()


def _lost_at(table, key):
    """(function, operation) of each death of flow ``key`` that loses a ring."""
    return [(row.where.split(":")[0], row.operation) for row in table if row.flow == FLOWS[key].name and row.rings_lost]


# A subscriber's windows (docs: "a ring no repair can reclaim"): after its
# Free -> Live CAS, before its owner_pid store (B.4 2-3); after clearing
# owner_pid, before the ring is Free (B.12 3-4).
JOIN_WINDOW = [("Subscriber._try_join", "store_relaxed_u64"), ("Subscriber._try_join", "store_release_u64")]
LEAVE_WINDOW = [("Subscriber.close", "store_relaxed_u64"), ("drain_window", "load_acquire_u64"),
                ("drain_window", "load_acquire_u64"), ("drain_window", "cas_acq_rel_u64"),
                ("release_slot", "fetch_sub_acq_rel_u32"), ("push", "load_relaxed_u64"), ("push", "store_relaxed_u32"),
                ("push", "cas_release_u64"), ("Subscriber.close", "store_release_u32")]


def test_every_death_of_every_flow_ends_clean(table):
    """Each flow's victim dies before each of its steps 2..n (one run each),
    and no run breaks an invariant, at any step or at the end."""
    for flow in crashes.FLOWS:
        rows = [row for row in table if row.flow == flow.name]
        assert [row.step for row in rows] == list(range(2, rows[0].steps + 1)), flow.key
        assert all(row.victim == flow.victim and row.schedules == 1 for row in rows)
    failed = [(row.flow, row.step, row.violation) for row in table if row.violation]
    assert not failed


def test_only_the_documented_windows_lose_a_ring_and_its_slots(table):
    """A publisher's death loses nothing once the repairs ran; a
    subscriber's loses its ring (and the slot its one entry claims) only in
    the join's and the leave's windows; a joiner healing a ring loses it
    too from its claim of the dead owner's ring until it frees it."""
    assert _lost_at(table, "publish") == _lost_at(table, "publish-wake") == []
    assert _lost_at(table, "subscribe") == _lost_at(table, "subscribe-blocking") == JOIN_WINDOW + LEAVE_WINDOW
    healing = _lost_at(table, "join-heals")
    assert healing[0] == ("reclaim_dead_ring", "load_relaxed_u32")  # the step after its owner_pid CAS
    assert healing[-len(JOIN_WINDOW + LEAVE_WINDOW):] == JOIN_WINDOW + LEAVE_WINDOW
    assert {function for function, _ in healing[:-len(JOIN_WINDOW + LEAVE_WINDOW)]} == {"reclaim_dead_ring",
                                                                                         "drain_window"}
    assert all(row.rings_lost <= 1 and row.slots_lost <= FLOWS["subscribe"].scenario.capacity for row in table)


def test_a_death_is_made_before_the_planned_step():
    flow = FLOWS["subscribe"]
    _, base = layout9.run_schedule(flow.scenario, lambda index, choice: choice.default)
    victim_steps = [step for step in base.steps if step.actor == "sub0"]
    death = crashes.plan(base, "sub0", 7)
    _, crashed = layout9.run_schedule(flow.scenario, lambda index, choice: death[index] if index < len(death)
                                      else choice.default)
    made = [step for step in crashed.steps if step.actor == "sub0"]
    assert [(s.where, s.line, s.operation, s.result) for s in made] == [(s.where, s.line, s.operation, s.result)
                                                                        for s in victim_steps[:7]]
    assert crashed.choices[len(death) - 1].chosen == "sub0 dies" and crashed.violation is None


def test_a_sleeper_whose_waker_died_wakes_at_its_timeout():
    """pub0 commits and dies before its futex_wake_all: sub0, asleep on the
    futex, is owed a wake-up nobody will make (not a lost wake-up: its waker
    died); time passes to its receive timeout, it wakes and receives."""
    flow = FLOWS["publish-wake"]
    _, base = layout9.run_schedule(flow.scenario, lambda index, choice: choice.default)
    steps = [step for step in base.steps if step.actor == "pub0"]
    made = next(index for index, step in enumerate(steps) if step.operation == "futex_wake_all")
    death = crashes.plan(base, "pub0", made)
    world, outcome = layout9.run_schedule(flow.scenario, lambda index, choice: death[index] if index < len(death)
                                          else choice.default)
    assert outcome.violation is None, traces.format_trace(world, outcome, world.repaired)
    assert [data for _, _, data in world.received["sub0"]] == [invariants.message(0, 0)]
    assert world.clock.now >= layout9.RECEIVE_TIMEOUT_NS


def test_at_the_end_every_ring_is_joined_again(monkeypatch):
    """Rule 7, on a ring nobody joined in the run: a join that fails, or a
    leave that does not free the ring, is a violation."""
    scenario = Scenario9(publishers=1, subscribers=0, rings=1)
    monkeypatch.setattr(Subscriber, "_try_join", lambda self: False)
    _, outcome = layout9.run_schedule(scenario, lambda index, choice: choice.default)
    assert outcome.violation.startswith("at the end, after the repairs, a fresh subscriber cannot join: No free "
                                        "subscriber slots"), outcome.violation
    monkeypatch.undo()

    def close_keeping_the_ring(self, record=None):
        self.ring_index = -1
        return True

    monkeypatch.setattr(Subscriber, "close", close_keeping_the_ring)
    _, outcome = layout9.run_schedule(scenario, lambda index, choice: choice.default)
    assert outcome.violation == "at the end ring 0, joined and left by a fresh subscriber, is Live+0, not Free"


def test_the_eviction_from_a_death_point_0_9_2_yes_ours_no():
    """EVICTION: sub0 dies at each step, then one preemption: 0.9.2's
    reclaimers evict the live sub1 from some death points, ours from none."""
    flows = (FLOWS["eviction"],)
    ours = crashes.crash_points(flows, preemptions=1)
    assert not [row.violation for row in ours if row.violation]
    assert sum(row.schedules for row in ours) > len(ours)  # the preemptions were explored
    shipped = crashes.crash_points(flows, preemptions=1, mutant="reclaim-0.9.2")
    evicted = [row for row in shipped if row.violation]
    assert evicted and all(row.violation.endswith("alive (a live owner is never evicted)") for row in evicted)


def test_cli_crash_points_with_progress(capsys, monkeypatch):
    monkeypatch.setattr(checking, "PROGRESS_INTERVAL_S", 0.0)  # a progress line at every row
    assert cli.main(["verify", "--layout", "9", "--crash-points", "--crash-flow", "publish-wake", "--json"]) == 0
    out, err = capsys.readouterr()
    rows = __import__("json").loads(out)["rows"]
    assert len(rows) == 16 and all(row["outcome"] == "ok" for row in rows)
    assert re.fullmatch(r"kickmsg verify: 16 of 16 crash points done in \d+ s, about 0 s left", err.splitlines()[-1])


@pytest.mark.parametrize("words, error", [
    (["--crash-points", "--pool", "3"], "--crash-points runs its own flows under sequential consistency: drop --pool"),
    (["--crash-points", "--preemptions", "9"], "--preemptions must be from 0 to 8, not 9"),
    (["--crash-points", "--mutant", "release-before-lock"], "mutant release-before-lock breaks layout 4's flows"),
    (["--crash-flow", "eviction"], "--crash-flow chooses a flow of --crash-points"),
])
def test_cli_crash_points_refuses_what_does_not_apply(capsys, words, error):
    assert cli.main(["verify", "--layout", "9", *words]) == 2
    assert error in capsys.readouterr().err


def test_orders_progress_counts_sites(capsys):
    progress = checking.RowProgress("sites", every_row=True)
    progress(1, 4, "kickmsg/protocol/freestack.py:65 load_acquire_u64 -> relaxed: counter-example")
    assert re.fullmatch(r"kickmsg verify: 1 of 4 sites done in \d+ s, about \d+ s left: "
                        r"kickmsg/protocol/freestack.py:65 load_acquire_u64 -> relaxed: counter-example\n",
                        capsys.readouterr().err)
    assert progress.counted() == "1 of 4 sites done"


@pytest.mark.parametrize("words, counted", [
    (["--preemptions", "3"], r"\d+ of at most 1000000 schedules run"),
    (["--crash-points", "--crash-flow", "eviction", "--preemptions", "2"], r"\d+ of 19 crash points done"),
], ids=["explore", "crash-points"])
def test_ctrl_c_ends_a_long_verify_with_its_partial_count(words, counted):
    """SIGINT once the run has said how far it is (its first progress line):
    exit 130, and one last line saying how far it got."""
    command = subprocess.Popen([KICKMSG, "verify", "--layout", "9", *words], stdin=subprocess.DEVNULL,
                               stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        first = command.stderr.readline()
        assert first.startswith("kickmsg verify: "), first
        command.send_signal(signal.SIGINT)
        rest = command.stderr.read()
        assert command.wait(timeout=60) == 130
    finally:
        if command.poll() is None:
            command.kill()
            command.wait(timeout=10)
    assert re.fullmatch(rf"kickmsg verify: interrupted after \d+ s: {counted} \(not exhaustive\)\n", rest), rest
