"""Soak test: mixed traffic of both implementations, with crashes, for minutes.

What is soaked
--------------
One or two channels of one layout (``--layout``: 9, native kickmsg 0.9.2's,
or 4, native kickmsg 0.1.0's; default ``$KICKMSG_LAYOUT``, else 9) carry
traffic from publishers and to subscribers of BOTH implementations, each in
its own process (``scripts/soak_worker.py``; a native one runs under
``python -I -S`` with only the native wheel of that layout on its path).
With ``--channels 2`` (the default) the first channel is created by this
package, the second by the native wheel. By default 3 publishers and 3
subscribers run at a time, and for the whole run:

- subscribers join and leave repeatedly (each lives 2-8 s, then is replaced,
  by either implementation); publishers are replaced too (5-20 s);
- about every ``--kill-every`` seconds (10) a publisher is killed with
  SIGKILL, alternating implementations, and about every
  ``--sub-kill-every`` seconds (20) a subscriber; a killed subscriber's ring
  is recovered at once, under traffic, by ``reclaim_dead_subscribers()`` and
  ``kickmsg repair NAME --dead-subscribers`` in turn (on layout 9 every
  subscriber records itself as its ring's owner, and this is
  ``reclaim_dead_rings``; on layout 4 only ours record themselves, and a
  native 0.1.0 subscriber's ring is left on its behalf: the supervisor
  knows its ring because it lets one subscriber join at a time);
- every ``--maintenance-every`` seconds (30) the supervisor pauses every
  worker between two operations and runs the recovery at quiescence:
  ``reclaim_dead_subscribers()``, ``repair_locked_entries()``,
  ``reset_retired_rings(drain=True)``, ``reclaim_orphaned_slots()``, then
  ``audit()``. Slots whose refcount a dead publisher left too high while a
  live ring still holds them may stay leaked until that ring lets go; any
  other damage left after the repair fails the run.

Messages carry (publisher id, implementation, sequence, length) and a body
and CRC-32 that depend on them. Every subscriber checks each message's
content, that no message comes twice and that each publisher's messages come
in increasing order, and counts what it received, what its ring reported
lost and the gaps in each publisher's sequence. The counts live in a small
control file that the supervisor maps, so they survive a SIGKILL.

At the end everything stops the hard way: one subscriber and then every
publisher are killed (each in the middle of a burst), so nobody is left to
self-repair what they leave behind; the other subscribers read what is left
and leave. Each channel is then audited, recovered (the four steps above,
plus, on layout 4, the ring of a killed native subscriber) and audited
again. The run passes (exit code 0) only if the final audit is clean, every
ring can be joined again and a message goes through, every slot is back in
the pool but the documented unrecoverable ones (a slot "being written" by a
publisher killed between pop and publish: at most one per publisher killed;
a slot still claimed by the entries of a Free ring counts as lost), no
subscriber saw a corrupt, duplicate or out-of-order message, and no worker
failed.

Running it
----------
    .venv/bin/python scripts/soak.py                    # 5 minutes, layout 9
    .venv/bin/python scripts/soak.py --layout 4 --seconds 60 --json soak.json

It needs the native wheel of its layout in ``.native/kickmsg-0.9.2`` or
``.native/kickmsg-0.1.0`` (``make soak`` and ``make test`` install both).
Everything it creates (shared memory, ``.owners`` sidecars, the control
file, worker logs, worker processes) is removed at the end, also on failure,
Ctrl-C or SIGTERM (``--keep-logs`` keeps the logs).
"""
import argparse
import json
import mmap
import os
import pathlib
import random
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass

import soak_worker as W  # scripts/ is sys.path[0] when this file is run

ROOT = pathlib.Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))  # this repository's kickmsg (the supervisor never imports the native one)

import kickmsg
from kickmsg import layouts
from kickmsg.ops.audit import audit
from kickmsg.protocol.v4 import rings

# Per layout: the native wheel's directory and the module file that shows it is installed.
NATIVE = {
    layouts.LAYOUT_4: (ROOT / ".native" / "kickmsg-0.1.0", "kickmsg.abi3.so"),
    layouts.LAYOUT_9: (ROOT / ".native" / "kickmsg-0.9.2", "kickmsg/_native.abi3.so"),
}
NATIVE_VERSION = {layouts.LAYOUT_4: "0.1.0", layouts.LAYOUT_9: "0.9.2"}
WORKER = pathlib.Path(__file__).resolve().parent / "soak_worker.py"
IMPLS = ("ours", "native")

START_TIMEOUT_S = 30  # a worker must be ready within this (2 loaded cores)
EXIT_TIMEOUT_S = 15  # a worker told to leave must exit within this
PAUSE_TIMEOUT_S = 15  # every worker must acknowledge a pause within this
TICK_S = 0.05
AIM_S = 1.0  # how long a kill waits for its victim to be busy
AIM_DELAY_S = 0.002  # then up to this much longer
MAX_WORKERS = 64  # publishers + subscribers at a time, one process each
SUBSCRIBER_LIFETIME_S = (2.0, 8.0)
PUBLISHER_LIFETIME_S = (5.0, 20.0)


@dataclass
class Worker:
    record: int
    role: str
    impl: str
    channel: int
    proc: subprocess.Popen
    log: pathlib.Path
    ends_at: float  # when the supervisor tells it to leave
    ring: int | None = None  # a subscriber's ring
    start_pos: int = 0  # the write position of that ring when it joined

    def __str__(self):
        ring = f" ring {self.ring}" if self.ring is not None else ""
        return f"{self.impl} {self.role} #{self.record} (pid {self.proc.pid}, channel {self.channel}{ring})"


def by_impl() -> dict:
    return {impl: 0 for impl in IMPLS}


def live_rings(region) -> set[int]:
    return {index for index, ring in enumerate(region.stats().rings) if ring.state == "Live"}


def audit_summary(region) -> dict:
    """The audit's counts, plus the slots of ``leaked`` that ring entries
    still hold (reclaim_orphaned_slots leaves those: it cannot tell which
    reference is the extra one)."""
    report = audit(region)
    referenced = {slot for slot, count in enumerate(report.ring_references) if count}
    return {
        "verdict": report.verdict,
        "clean": report.clean,
        "damage": {what: count for what, count in report.damage().items() if count},
        "free_slots": report.free_slots,
        "slots_not_free": report.pool_size - report.free_slots,
        "being_written": len(report.being_written),
        "leaked_slots": len(report.leaked_slots),
        "leaked_slots_held_by_rings": len(set(report.leaked_slots) & referenced),
        "under_referenced_slots": len(report.under_referenced_slots),
        "double_free_candidates": len(report.double_free_candidates),
        "free_stack_problems": len(report.free_stack_problems),
        "locked_entries": sum(len(r.locked_entries) for r in report.rings),
        "stale_entries": sum(len(r.stale_entries) for r in report.rings),
        "bad_entries": sum(len(r.bad_entries) for r in report.rings),
        "retired_rings": len(report.retired_rings),
        "draining_rings": len(report.draining_rings),
        "reclaiming_rings": len(report.reclaiming_rings),
        "dead_owner_rings": len(report.dead_owner_rings),
        "live_rings": sum(r.state == "Live" for r in report.rings),
        "references_in_free_rings": sum(r.references for r in report.rings if r.state == "Free"),
        "schema_state": report.schema_state,
    }


class Failure(Exception):
    """Something the soak cannot go on from."""


class Soak:
    def __init__(self, args):
        self.args = args
        self.rng = random.Random(args.seed)
        self.native_dir, self.native_module = NATIVE[args.layout]
        self.tag = f"kmsoak_{os.getpid()}_{secrets.token_hex(3)}"
        self.names = [f"/{self.tag}_c{channel}" for channel in range(args.channels)]
        self.tmp = pathlib.Path(tempfile.mkdtemp(prefix="kickmsg-soak-"))
        self.control_path = self.tmp / "control"
        self.regions = []
        self.workers: list[Worker] = []  # every worker started, alive or not
        self.publishers: list[Worker | None] = [None] * args.publishers
        self.subscribers: list[Worker | None] = [None] * args.subscribers
        self.next_record = 1
        self.pause_epoch = 0
        self.join_retry_at = 0.0  # subscribers found no free ring: wait before trying again
        self.kill_turn = {"publisher": "ours", "subscriber": "native"}
        self.next_reclaim_by_cli = False  # killed subscribers' rings: by the API and by the CLI in turn
        self.problems: list[str] = []  # what makes the run fail
        self.events = {
            "publisher_kills": by_impl(),
            "subscriber_kills": by_impl(),
            "publisher_kills_while_busy": 0,  # in a burst
            "subscriber_kills_while_busy": 0,  # holding a view
            "publisher_starts": by_impl(),
            "publisher_stops": by_impl(),
            "subscriber_joins": by_impl(),
            "subscriber_leaves": by_impl(),
            "join_failures_no_free_ring": 0,
            "subscriber_drain_timeouts": by_impl(),  # teardowns that gave up waiting
            "killed_rings_reclaimed_under_traffic": by_impl(),
            "killed_rings_reclaim_timeouts": by_impl(),  # left retired, reset later
            "killed_rings_reclaimed_by_cli": 0,  # of those reclaimed, by `kickmsg repair --dead-subscribers`
        }
        self.maintenance_runs = []  # one result per channel per pause
        self.pauses = 0
        self.config = {
            "max_subscribers": args.max_subscribers,
            "sub_ring_capacity": args.ring_capacity,
            "pool_size": args.pool_size,
            "max_payload_size": args.max_payload,
            "commit_timeout": args.commit_timeout_ms / 1000,
        }

    # -- set-up and clean-up ---------------------------------------------------

    def set_up(self) -> None:
        if not (self.native_dir / self.native_module).is_file():
            raise Failure(f"the native kickmsg {NATIVE_VERSION[self.args.layout]} is not in {self.native_dir} "
                          f"(`make soak` installs it)")
        with open(self.control_path, "wb") as file:
            file.truncate(W.WORDS_PER_RECORD * 8 * W.MAX_RECORDS)
        with open(self.control_path, "r+b") as file:
            self._control_map = mmap.mmap(file.fileno(), 0)
        self.words = memoryview(self._control_map).cast("Q")
        self.header = self.words[: W.WORDS_PER_RECORD]
        for channel, name in enumerate(self.names):
            creator = "ours" if channel % 2 == 0 else "native"
            if creator == "ours":
                cfg = kickmsg.Config(**self.config)
                kickmsg.SharedRegion.create(name, kickmsg.ChannelType.PubSub, cfg, "soak-ours", layout=self.args.layout)
            else:
                self.run_native_creator(name)
            self.regions.append(kickmsg.SharedRegion.open(name))

    def run_native_creator(self, name: str) -> None:
        params = {"role": "create", "impl": "native", "impl_path": str(self.native_dir), "channel": name,
                  "config": self.config, "creator": "soak-native"}
        log = self.tmp / "create-native.log"
        with open(log, "wb") as out:
            code = subprocess.run(self.command("native", params), check=False, stdout=out, stderr=subprocess.STDOUT,
                                  timeout=START_TIMEOUT_S, cwd=self.tmp).returncode
        if code != 0:
            raise Failure(f"the native creator of {name} failed ({code}):\n{log.read_text()}")

    def clean_up(self) -> None:
        # Ctrl-C reaches the supervisor once per process in the terminal's
        # group (and `timeout` forwards its own): do not let a second one
        # interrupt the clean-up.
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        for worker in self.workers:
            if worker.proc.poll() is None:
                worker.proc.kill()
                worker.proc.wait()
        for name in self.names:
            kickmsg.unlink_shm(name)  # and its .owners sidecar
        self.regions.clear()
        if self.args.keep_logs:
            print(f"logs kept in {self.tmp}")
        else:
            shutil.rmtree(self.tmp, ignore_errors=True)

    # -- workers -------------------------------------------------------------------

    @staticmethod
    def command(impl: str, params: dict) -> list[str]:
        isolation = ["-I", "-S"] if impl == "native" else ["-I"]  # ours needs the venv's site-packages
        return [sys.executable, *isolation, str(WORKER), json.dumps(params)]

    def record(self, index: int):
        return self.words[index * W.WORDS_PER_RECORD : (index + 1) * W.WORDS_PER_RECORD]

    def pick_impl(self, role: str) -> str:
        """The implementation with fewer live workers in this role (random on a tie)."""
        live = [w for w in (self.publishers if role == "publisher" else self.subscribers) if w]
        counts = {impl: sum(w.impl == impl for w in live) for impl in IMPLS}
        if counts["ours"] == counts["native"]:
            return self.rng.choice(IMPLS)
        return min(IMPLS, key=counts.get)

    def start(self, role: str, slot: int) -> Worker | None:
        """Start a worker for a publisher or subscriber slot and wait until it
        is ready; None if a subscriber found no free ring."""
        channel = slot % len(self.names)
        impl = self.pick_impl(role)
        index = self.next_record
        if index >= W.MAX_RECORDS:
            raise Failure("out of control-file records; run shorter")
        self.next_record += 1
        me = self.record(index)
        me[W.ROLE], me[W.IMPL], me[W.CHANNEL] = W.ROLE_CODES[role], W.IMPL_CODES[impl], channel
        params = {
            "role": role, "impl": impl, "channel": self.names[channel], "control": str(self.control_path),
            "record": index, "seed": self.rng.getrandbits(32), "max_payload": self.args.max_payload,
            "max_burst": self.args.max_burst, "max_pause": self.args.max_pause_ms / 1000,
            "impl_path": str(self.native_dir if impl == "native" else ROOT),
        }
        region = self.regions[channel]
        # A subscriber joins the first Free ring, and only joins turn a ring
        # Live; as this supervisor starts one subscriber at a time, the ring
        # that is Live after and was not before is its ring. That ring was
        # Free until then, so its write position was already the
        # subscriber's start position.
        live_before = live_rings(region) if role == "subscriber" else set()
        write_pos_before = [ring.write_pos for ring in region.stats().rings]
        log = self.tmp / f"w{index:04d}-{role}-{impl}.log"
        with open(log, "wb") as out:
            proc = subprocess.Popen(self.command(impl, params), stdout=out, stderr=subprocess.STDOUT,
                                    stdin=subprocess.DEVNULL, cwd=self.tmp)
        lifetime = SUBSCRIBER_LIFETIME_S if role == "subscriber" else PUBLISHER_LIFETIME_S
        worker = Worker(index, role, impl, channel, proc, log, time.monotonic() + self.rng.uniform(*lifetime))
        self.workers.append(worker)
        deadline = time.monotonic() + START_TIMEOUT_S
        while me[W.STATE] == W.STATE_STARTING:
            if proc.poll() is not None:
                break
            if time.monotonic() > deadline:
                raise Failure(f"{worker} was not ready within {START_TIMEOUT_S} s\n{self.tail(worker)}")
            time.sleep(0.005)
        if me[W.STATE] == W.STATE_NO_RING:
            proc.wait()
            self.events["join_failures_no_free_ring"] += 1
            return None
        if me[W.STATE] != W.STATE_READY:
            proc.wait()
            raise Failure(f"{worker} exited with {proc.returncode} before being ready\n{self.tail(worker)}")
        if role == "subscriber":
            joined = live_rings(region) - live_before
            if len(joined) != 1:
                raise Failure(f"{worker}: cannot tell which ring it joined (new Live rings: {sorted(joined)})")
            worker.ring = joined.pop()
            worker.start_pos = write_pos_before[worker.ring]
            self.events["subscriber_joins"][impl] += 1
        else:
            self.events["publisher_starts"][impl] += 1
        return worker

    def tail(self, worker: Worker, lines: int = 30) -> str:
        try:
            text = worker.log.read_text(errors="replace").splitlines()[-lines:]
        except OSError:
            text = []
        return "\n".join(f"    | {line}" for line in text)

    def stop(self, worker: Worker) -> None:
        """Tell a worker to leave and wait for it; a subscriber's teardown
        that gave up waiting for a publisher shows as a retired ring."""
        self.record(worker.record)[W.LEAVE] = 1
        self.wait_exit(worker)
        if worker.role == "subscriber":
            self.check_ring_after_leave(worker)
            self.events["subscriber_leaves"][worker.impl] += 1
        else:
            self.events["publisher_stops"][worker.impl] += 1

    def wait_exit(self, worker: Worker) -> None:
        try:
            code = worker.proc.wait(timeout=EXIT_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            worker.proc.kill()
            worker.proc.wait()
            self.fail(f"{worker} did not exit within {EXIT_TIMEOUT_S} s when told to\n{self.tail(worker)}")
            return
        if code != 0 or self.record(worker.record)[W.STATE] != W.STATE_DONE:
            self.fail(f"{worker} exited with code {code}\n{self.tail(worker)}")

    def check_ring_after_leave(self, worker: Worker) -> None:
        ring = self.regions[worker.channel].stats().rings[worker.ring]
        timed_out = self.record(worker.record)[W.DRAIN_TIMEOUTS]  # reported by ours only
        if ring.state == "Free" and ring.in_flight and not timed_out:
            timed_out = 1  # a native teardown that gave up: the ring is left retired
        elif ring.state == "Live":
            self.fail(f"{worker} exited but its ring is still Live")
        self.events["subscriber_drain_timeouts"][worker.impl] += timed_out

    def fail(self, text: str) -> None:
        self.problems.append(text)
        print(f"PROBLEM: {text}", flush=True)

    def check_unexpected_exits(self) -> None:
        for slots in (self.publishers, self.subscribers):
            for slot, worker in enumerate(slots):
                if worker and worker.proc.poll() is not None:
                    self.fail(f"{worker} exited on its own with code {worker.proc.returncode}\n{self.tail(worker)}")
                    slots[slot] = None

    # -- crashes ----------------------------------------------------------------

    def victim(self, slots: list) -> tuple[int, Worker] | None:
        """A live worker to kill, of the implementation whose turn it is if any."""
        role = "publisher" if slots is self.publishers else "subscriber"
        candidates = [(i, w) for i, w in enumerate(slots) if w]
        if not candidates:
            return None
        preferred = [(i, w) for i, w in candidates if w.impl == self.kill_turn[role]]
        slot, worker = self.rng.choice(preferred or candidates)
        self.kill_turn[role] = "native" if worker.impl == "ours" else "ours"
        return slot, worker

    def kill(self, worker: Worker) -> None:
        """SIGKILL a worker, preferably while it is busy (a publisher in a
        burst, a subscriber holding a view): for up to AIM_S, wait until it
        is, let a random moment more pass (a kill at once would hit the
        start of the burst every time), and kill it if it still is."""
        me = self.record(worker.record)
        deadline = time.monotonic() + AIM_S
        while time.monotonic() < deadline:
            if me[W.BUSY]:
                time.sleep(self.rng.uniform(0, AIM_DELAY_S))
                if me[W.BUSY]:
                    break
            time.sleep(0.0002)
        aimed = bool(me[W.BUSY])
        os.kill(worker.proc.pid, signal.SIGKILL)
        worker.proc.wait()
        self.events[f"{worker.role}_kills"][worker.impl] += 1
        self.events[f"{worker.role}_kills_while_busy"] += aimed
        if self.args.verbose:
            print(f"  killed {worker}{' while busy' if aimed else ''}", flush=True)

    def kill_publisher(self, replace: bool = True) -> None:
        chosen = self.victim(self.publishers)
        if chosen:
            slot, worker = chosen
            self.kill(worker)
            self.publishers[slot] = None
            if replace:
                self.publishers[slot] = self.start("publisher", slot)

    def kill_subscriber(self, recover: bool = True) -> Worker | None:
        """Kill a subscriber; unless told otherwise, recover its ring under
        traffic and start another subscriber."""
        chosen = self.victim(self.subscribers)
        if not chosen:
            return None
        slot, worker = chosen
        self.kill(worker)
        self.subscribers[slot] = None
        if recover:
            self.recover_killed_ring(worker)
            self.subscribers[slot] = self.start("subscriber", slot)
        return worker

    def recover_killed_ring(self, worker: Worker) -> None:
        """Give a killed subscriber's ring back: for every subscriber that
        recorded itself as its ring's owner (all on layout 9, ours on layout
        4), ``reclaim_dead_subscribers()`` and ``kickmsg repair
        --dead-subscribers`` in turn; for a native 0.1.0 one, the teardown
        done on its behalf. Safe under traffic."""
        region = self.regions[worker.channel]
        if worker.impl == "ours" or self.args.layout == layouts.LAYOUT_9:
            by_cli, self.next_reclaim_by_cli = self.next_reclaim_by_cli, not self.next_reclaim_by_cli
            if by_cli:
                how, (reclaimed, timed_out) = "kickmsg repair --dead-subscribers", self.repair_dead_subscribers(worker)
            else:
                report = region.reclaim_dead_subscribers()
                how, reclaimed, timed_out = "reclaim_dead_subscribers()", [r for r, _ in report.reclaimed], report.timed_out
            if worker.ring in reclaimed:
                left = True
                self.events["killed_rings_reclaimed_by_cli"] += by_cli
            elif worker.ring in timed_out:
                left = False
            else:
                self.fail(f"{how} did not reclaim the ring of {worker}: reclaimed {reclaimed}, timed out {timed_out}")
                return
        else:
            left = rings.leave(region.core, region.core.ring(worker.ring), worker.start_pos)
        key = "killed_rings_reclaimed_under_traffic" if left else "killed_rings_reclaim_timeouts"
        self.events[key][worker.impl] += 1

    def repair_dead_subscribers(self, worker: Worker) -> tuple[list[int], list[int]]:
        """Run ``kickmsg repair NAME --dead-subscribers --json`` (this
        repository's CLI) on the worker's channel: the rings it reclaimed and
        those it left retired."""
        command = [sys.executable, "-m", "kickmsg", "repair", self.names[worker.channel], "--dead-subscribers", "--json"]
        done = subprocess.run(command, capture_output=True, text=True, timeout=START_TIMEOUT_S, cwd=ROOT, check=False)
        if done.returncode != 0:
            raise Failure(f"{' '.join(command[2:])} failed ({done.returncode}) for {worker}:\n{done.stdout}{done.stderr}")
        found = json.loads(done.stdout)["dead_subscribers"]
        return [ring for ring, _ in found["reclaimed"]], found["timed_out"]

    # -- pauses and recovery ----------------------------------------------------------

    def alive(self) -> list[Worker]:
        return [w for w in self.publishers + self.subscribers if w and w.proc.poll() is None]

    def pause(self) -> None:
        """Have every live worker stop between two operations (no publisher
        in flight, no view held) and wait until all have."""
        self.pause_epoch += 1
        self.header[W.PAUSE_EPOCH] = self.pause_epoch
        self.header[W.PAUSED] = 1
        deadline = time.monotonic() + PAUSE_TIMEOUT_S
        for worker in self.alive():
            while self.record(worker.record)[W.ACK_EPOCH] != self.pause_epoch and worker.proc.poll() is None:
                if time.monotonic() > deadline:
                    raise Failure(f"{worker} did not pause within {PAUSE_TIMEOUT_S} s\n{self.tail(worker)}")
                time.sleep(0.001)

    def resume(self) -> None:
        self.header[W.PAUSED] = 0

    def recover(self, channel: int, dead_native: list[Worker] = ()) -> dict:
        """The recovery sequence, at quiescence, with the audits around it."""
        region = self.regions[channel]
        before = audit_summary(region)
        health = region.diagnose()
        dead = region.reclaim_dead_subscribers()
        on_behalf = on_behalf_timeouts = 0
        for worker in dead_native:  # 0.1.0's rings have no owner record: leave them on their behalf
            if rings.leave(region.core, region.core.ring(worker.ring), worker.start_pos):
                on_behalf += 1
            else:
                on_behalf_timeouts += 1
        repaired = region.repair_locked_entries()
        reset = region.reset_retired_rings(drain=True)
        reclaimed = region.reclaim_orphaned_slots()
        after = audit_summary(region)
        return {
            "channel": channel,
            "before": before,
            "diagnose_before": {"locked_entries": health.locked_entries, "retired_rings": health.retired_rings,
                                "draining_rings": health.draining_rings, "live_rings": health.live_rings},
            "dead_subscriber_rings_reclaimed": len(dead.reclaimed),
            "dead_subscriber_rings_timed_out": len(dead.timed_out),
            "native_rings_left_on_behalf": on_behalf,
            "native_rings_on_behalf_timed_out": on_behalf_timeouts,
            "entries_repaired": repaired,
            "retired_rings_reset": reset,
            "slots_reclaimed": reclaimed,
            "after": after,
        }

    def kills(self) -> int:
        return self.publisher_kills() + sum(self.events["subscriber_kills"].values())

    def publisher_kills(self) -> int:
        """The bound on slots "being written": one per publisher killed."""
        return sum(self.events["publisher_kills"].values())

    def maintenance(self) -> None:
        """Pause everyone, recover every channel, check what is left, resume."""
        started = time.monotonic()
        self.pauses += 1
        self.pause()
        try:
            for channel in range(len(self.regions)):
                result = self.recover(channel)
                after = result["after"]
                # At a pause the only damage allowed after recovery: slots
                # whose refcount a dead publisher left too high while a ring
                # still holds them (they come back once no ring does).
                unexplained = {key: after[key] for key in (
                    "under_referenced_slots", "double_free_candidates", "free_stack_problems",
                    "locked_entries", "stale_entries", "bad_entries", "retired_rings", "draining_rings",
                    "reclaiming_rings", "dead_owner_rings",
                ) if after[key]}
                if after["leaked_slots"] != after["leaked_slots_held_by_rings"]:
                    unexplained["leaked_slots_held_by_no_ring"] = after["leaked_slots"] - after["leaked_slots_held_by_rings"]
                if after["being_written"] > self.publisher_kills():
                    unexplained["being_written_beyond_kills"] = after["being_written"]
                if unexplained:
                    self.fail(f"channel {channel} after recovery at a pause: {unexplained}; {after['verdict']}")
                result["pause_ms"] = round((time.monotonic() - started) * 1000, 1)
                self.maintenance_runs.append(result)
                if self.args.verbose:
                    print(f"  maintenance c{channel}: repaired {result['entries_repaired']}, reset "
                          f"{result['retired_rings_reset']}, reclaimed {result['slots_reclaimed']}; "
                          f"{after['verdict']}", flush=True)
        finally:
            self.resume()

    # -- the run ----------------------------------------------------------------------

    def fill_slots(self) -> None:
        """Replace the workers whose time is up, and start missing ones. A
        subscriber that finds no free ring triggers a recovery pause, then
        one more try (and a 1 s back-off if that fails too)."""
        now = time.monotonic()
        for role, slots in (("publisher", self.publishers), ("subscriber", self.subscribers)):
            for slot, worker in enumerate(slots):
                if worker and now >= worker.ends_at:
                    self.stop(worker)
                    slots[slot] = worker = None
                if worker is None and now >= self.join_retry_at:
                    slots[slot] = self.start(role, slot)
                    if slots[slot] is None:
                        self.maintenance()
                        slots[slot] = self.start(role, slot)
                    if slots[slot] is None:
                        self.join_retry_at = time.monotonic() + 1

    def run(self) -> dict:
        args = self.args
        self.set_up()
        began = time.monotonic()
        end = began + args.duration

        def jitter(every):
            return time.monotonic() + every * self.rng.uniform(0.5, 1.5)

        next_publisher_kill, next_subscriber_kill = jitter(args.kill_every), jitter(args.sub_kill_every)
        next_maintenance = began + args.maintenance_every if args.maintenance_every else float("inf")
        next_report = began + 10
        while time.monotonic() < end:
            self.check_unexpected_exits()
            self.fill_slots()
            now = time.monotonic()
            if args.kill_every and now >= next_publisher_kill:
                self.kill_publisher()
                next_publisher_kill = jitter(args.kill_every)
            if args.sub_kill_every and now >= next_subscriber_kill:
                self.kill_subscriber()
                next_subscriber_kill = jitter(args.sub_kill_every)
            if now >= next_maintenance:
                self.maintenance()
                next_maintenance = time.monotonic() + args.maintenance_every
            if now >= next_report:
                self.progress(now - began)
                next_report = now + 10
            time.sleep(TICK_S)
        return self.finish(time.monotonic() - began)

    def progress(self, elapsed: float) -> None:
        totals = self.totals()
        print(f"[{elapsed:5.0f} s] published {sum(totals['published'].values())}, received "
              f"{sum(totals['received'].values())}, kills {self.kills()}, problems {len(self.problems)}", flush=True)

    def finish(self, duration: float) -> dict:
        # Stop everything, crashing as much as possible and leaving the damage
        # to the final recovery: kill one subscriber and then every publisher,
        # each in the middle of a burst, so nobody is left to self-repair
        # what they leave behind. The other subscribers read what is left
        # and leave.
        self.check_unexpected_exits()
        last_killed_subscriber = self.kill_subscriber(recover=False)
        while any(self.publishers):
            self.kill_publisher(replace=False)
        self.header[W.STOP] = 1
        for worker in [w for w in self.subscribers if w]:
            self.wait_exit(worker)
            self.check_ring_after_leave(worker)
            self.events["subscriber_leaves"][worker.impl] += 1
        self.subscribers = [None] * len(self.subscribers)
        # Recover each channel at quiescence, then check it.
        final = []
        for channel, region in enumerate(self.regions):
            dead_native = [w for w in [last_killed_subscriber] if w and w.impl == "native" and w.channel == channel
                           and self.args.layout == layouts.LAYOUT_4]  # layout 9's record their owner
            result = self.recover(channel, dead_native)
            result["usable_after_recovery"] = self.check_usable(region)
            result["audit_after_reuse"] = audit_summary(region)
            final.append(result)
        return self.report(duration, final)

    def check_usable(self, region) -> str:
        """Join every ring with a subscriber of ours, send one message through,
        leave. 'ok' or what went wrong."""
        subscribers = []
        try:
            for _ in range(region.geometry.max_subs):
                subscribers.append(kickmsg.Subscriber(region))
            message = W.make_message(0, W.IMPL_CODES["ours"], 0, region.geometry.slot_data_size)
            kickmsg.Publisher(region).send(message)
            reached = sum(sub.try_receive() == message for sub in subscribers)
            if reached != len(subscribers):
                return f"the message reached {reached} of {len(subscribers)} rings"
            return "ok"
        except Exception as error:  # noqa: BLE001 (reported, fails the run)
            return f"{type(error).__name__}: {error}"
        finally:
            for sub in subscribers:
                sub.close()

    # -- figures -------------------------------------------------------------------------

    def totals(self) -> dict:
        totals = {key: by_impl() for key in (
            "published", "published_zero_copy", "pool_dry_retries", "dropped_deliveries",
            "received", "received_from_ours", "received_from_native", "received_by_view", "lost",
            "sequence_gaps", "corrupt", "duplicates", "out_of_order",
        )}
        impl_names = {code: impl for impl, code in W.IMPL_CODES.items()}
        for index in range(1, self.next_record):
            r = self.record(index)
            impl = impl_names.get(r[W.IMPL])
            if r[W.ROLE] == W.ROLE_CODES["publisher"]:
                totals["published"][impl] += r[W.PUBLISHED]
                totals["published_zero_copy"][impl] += r[W.ZERO_COPY]
                totals["pool_dry_retries"][impl] += r[W.POOL_DRY]
                totals["dropped_deliveries"][impl] += r[W.DROPPED]
            elif r[W.ROLE] == W.ROLE_CODES["subscriber"]:
                totals["received"][impl] += r[W.FROM_OURS] + r[W.FROM_NATIVE]
                totals["received_from_ours"][impl] += r[W.FROM_OURS]
                totals["received_from_native"][impl] += r[W.FROM_NATIVE]
                totals["received_by_view"][impl] += r[W.VIEWS]
                totals["lost"][impl] += r[W.LOST]
                totals["sequence_gaps"][impl] += r[W.GAPS]
                totals["corrupt"][impl] += r[W.CORRUPT]
                totals["duplicates"][impl] += r[W.DUPLICATES]
                totals["out_of_order"][impl] += r[W.OUT_OF_ORDER]
        return totals

    def subscriber_complaints(self) -> list[str]:
        lines = []
        for worker in self.workers:
            try:
                text = worker.log.read_text(errors="replace")
            except OSError:
                continue
            lines += [f"{worker}: {line}" for line in text.splitlines() if line.startswith("PROBLEM")]
        return lines[:20]

    def unexplained_damage(self, summary: dict) -> dict[str, int]:
        """What an audit found beyond the documented bound: on layout 4 a
        slot lost by a publisher killed between allocating and publishing
        is damage no repair can tell from a paused publisher's (the spec's
        unrecoverable leak), bounded by the slots being written below."""
        damage = dict(summary["damage"])
        if self.args.layout == layouts.LAYOUT_4 and damage.get("unreferenced slots", 0) <= self.publisher_kills():
            damage.pop("unreferenced slots", None)
        return damage

    def report(self, duration: float, final: list[dict]) -> dict:
        totals = self.totals()
        bad_messages = sum(sum(totals[key].values()) for key in ("corrupt", "duplicates", "out_of_order"))
        if bad_messages:
            self.fail(f"subscribers saw {bad_messages} corrupt, duplicate or out-of-order messages")
        for result in final:
            after, channel = result["after"], result["channel"]
            if self.unexplained_damage(after):
                self.fail(f"channel {channel}: the final audit is not clean: {after['verdict']}")
            if after["live_rings"]:
                self.fail(f"channel {channel}: {after['live_rings']} ring(s) still Live after everyone left")
            if after["being_written"] > self.publisher_kills():
                self.fail(f"channel {channel}: {after['being_written']} slots being written, more than the "
                          f"{self.publisher_kills()} publishers killed")
            # Everyone has left and the channel is recovered: every slot is
            # free but those "being written" (the documented bound, above).
            if after["slots_not_free"] > after["being_written"]:
                self.fail(f"channel {channel}: {after['slots_not_free']} slots are not free after recovery, "
                          f"{after['being_written']} of them being written; "
                          f"{after['references_in_free_rings']} held by the entries of Free rings")
            if result["usable_after_recovery"] != "ok":
                self.fail(f"channel {channel}: not usable after recovery: {result['usable_after_recovery']}")
            reuse = result["audit_after_reuse"]
            if self.unexplained_damage(reuse):
                self.fail(f"channel {channel}: audit after reuse: {reuse['verdict']}")
        maintenance = {
            "pauses": self.pauses,
            "entries_repaired": sum(m["entries_repaired"] for m in self.maintenance_runs),
            "retired_rings_reset": sum(m["retired_rings_reset"] for m in self.maintenance_runs),
            "slots_reclaimed": sum(m["slots_reclaimed"] for m in self.maintenance_runs),
            "dead_subscriber_rings_reclaimed": sum(m["dead_subscriber_rings_reclaimed"] for m in self.maintenance_runs),
            "leaked_slots_before": sum(m["before"]["leaked_slots"] for m in self.maintenance_runs),
            "leaked_slots_still_held_after": sum(m["after"]["leaked_slots"] for m in self.maintenance_runs),
            "most_references_in_free_rings_after": max(
                (m["after"]["references_in_free_rings"] for m in self.maintenance_runs), default=0),
            "max_pause_ms": max((m["pause_ms"] for m in self.maintenance_runs), default=0),
        }
        return {
            "verdict": "PASS" if not self.problems else "FAIL",
            "problems": self.problems,
            "subscriber_complaints": self.subscriber_complaints(),
            "duration_s": round(duration, 1),
            "settings": {key: value for key, value in vars(self.args).items() if key != "json"},
            "layout": self.args.layout,
            "native_version": NATIVE_VERSION[self.args.layout],
            "channels": {name: ("ours" if i % 2 == 0 else "native") + "-created" for i, name in enumerate(self.names)},
            "messages": totals,
            "events": self.events,
            "crashes_survived": {"publisher_kills": self.events["publisher_kills"],
                                 "subscriber_kills": self.events["subscriber_kills"], "total": self.kills()},
            "maintenance": maintenance,
            "final_recovery": final,
        }


def print_report(report: dict) -> None:
    m, e = report["messages"], report["events"]

    def pair(d):
        return f"ours {d['ours']:>9}  native {d['native']:>9}"

    print()
    channels = ", ".join(f"{name} ({creator})" for name, creator in report["channels"].items())
    print(f"soak: layout {report['layout']} (native {report['native_version']}), {report['duration_s']} s, "
          f"channels {channels}")
    print(f"  published           {pair(m['published'])}   (zero-copy {sum(m['published_zero_copy'].values())}, "
          f"pool-dry retries {sum(m['pool_dry_retries'].values())}, dropped deliveries {sum(m['dropped_deliveries'].values())})")
    print(f"  received            {pair(m['received'])}   (by view {sum(m['received_by_view'].values())})")
    print(f"    from ours         {pair(m['received_from_ours'])}")
    print(f"    from native       {pair(m['received_from_native'])}")
    print(f"  lost (ring)         {pair(m['lost'])}")
    print(f"  sequence gaps       {pair(m['sequence_gaps'])}")
    print(f"  corrupt/dup/order   ours {m['corrupt']['ours']}/{m['duplicates']['ours']}/{m['out_of_order']['ours']}"
          f"  native {m['corrupt']['native']}/{m['duplicates']['native']}/{m['out_of_order']['native']}")
    print(f"  publisher kills     {pair(e['publisher_kills'])}   ({e['publisher_kills_while_busy']} in a burst)")
    print(f"  subscriber kills    {pair(e['subscriber_kills'])}   ({e['subscriber_kills_while_busy']} holding a view)")
    print(f"  publisher starts    {pair(e['publisher_starts'])}   stops {sum(e['publisher_stops'].values())}")
    print(f"  subscriber joins    {pair(e['subscriber_joins'])}")
    print(f"  subscriber leaves   {pair(e['subscriber_leaves'])}")
    print(f"  drain timeouts      {pair(e['subscriber_drain_timeouts'])}   (teardowns that gave up)")
    print(f"  killed rings back   {pair(e['killed_rings_reclaimed_under_traffic'])}   (timeouts "
          f"{sum(e['killed_rings_reclaim_timeouts'].values())}, join failures {e['join_failures_no_free_ring']}; "
          f"{e['killed_rings_reclaimed_by_cli']} by the CLI)")
    mt = report["maintenance"]
    print(f"  maintenance pauses  {mt['pauses']}: entries repaired {mt['entries_repaired']}, rings reset "
          f"{mt['retired_rings_reset']}, slots reclaimed {mt['slots_reclaimed']}, leaked before {mt['leaked_slots_before']}, "
          f"still held after {mt['leaked_slots_still_held_after']}, longest pause {mt['max_pause_ms']} ms, "
          f"references left in Free rings after, at most {mt['most_references_in_free_rings_after']}")
    for result in report["final_recovery"]:
        b, a = result["before"], result["after"]
        print(f"  final, channel {result['channel']}:")
        print(f"    before recovery   leaked {b['leaked_slots']}, being written {b['being_written']}, locked "
              f"{b['locked_entries']}, stale {b['stale_entries']}, retired rings {b['retired_rings']}, "
              f"live rings {b['live_rings']}, free {b['free_slots']}")
        print(f"    recovered         dead-subscriber rings {result['dead_subscriber_rings_reclaimed']} "
              f"(+{result['native_rings_left_on_behalf']} native on behalf), entries repaired "
              f"{result['entries_repaired']}, rings reset {result['retired_rings_reset']}, slots reclaimed "
              f"{result['slots_reclaimed']}")
        print(f"    audit after       {a['verdict']} ({a['references_in_free_rings']} references left in Free rings; "
              f"{a['slots_not_free']} slots not free, {a['being_written']} being written)")
        print(f"    usable after      {result['usable_after_recovery']}; audit {result['audit_after_reuse']['verdict']}")
    for line in report["subscriber_complaints"]:
        print(f"  {line}")
    for problem in report["problems"]:
        print(f"  PROBLEM: {problem}")
    print(f"verdict: {report['verdict']}")


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    length = parser.add_mutually_exclusive_group()
    length.add_argument("--minutes", type=float, default=5.0, help="how long to run (default 5)")
    length.add_argument("--seconds", type=float, help="how long to run, in seconds")
    parser.add_argument("--json", metavar="PATH", help="also write the figures as JSON to PATH")
    parser.add_argument("--seed", type=int, default=None, help="random seed (default: random, printed)")
    parser.add_argument("--layout", type=int, choices=layouts.SUPPORTED_LAYOUTS, default=None,
                        help="the channels' layout: 9 (native 0.9.2) or 4 (native 0.1.0); "
                             "default $KICKMSG_LAYOUT, else 9")
    parser.add_argument("--channels", type=int, choices=(1, 2), default=2)
    parser.add_argument("--publishers", type=int, default=3)
    parser.add_argument("--subscribers", type=int, default=3)
    parser.add_argument("--kill-every", type=float, default=10.0, help="seconds between publisher kills (0: none)")
    parser.add_argument("--sub-kill-every", type=float, default=20.0, help="seconds between subscriber kills (0: none)")
    parser.add_argument("--maintenance-every", type=float, default=30.0,
                        help="seconds between paused recoveries (0: only at the end)")
    parser.add_argument("--commit-timeout-ms", type=float, default=20.0)
    parser.add_argument("--max-subscribers", type=int, default=8)
    parser.add_argument("--ring-capacity", type=int, default=64)
    parser.add_argument("--pool-size", type=int, default=512)
    parser.add_argument("--max-payload", type=int, default=1024)
    parser.add_argument("--max-burst", type=int, default=32, help="messages per publisher burst, at most")
    parser.add_argument("--max-pause-ms", type=float, default=4.0, help="pause between bursts, at most")
    parser.add_argument("--keep-logs", action="store_true")
    parser.add_argument("-v", "--verbose", action="store_true")
    args = parser.parse_args(argv)
    args.duration = args.seconds if args.seconds is not None else args.minutes * 60
    if args.duration < 0:
        given = args.seconds if args.seconds is not None else args.minutes
        parser.error(f"--seconds/--minutes must not be negative, got {given:g}")
    for name in ("publishers", "subscribers", "kill_every", "sub_kill_every", "maintenance_every",
                 "commit_timeout_ms", "max_pause_ms"):
        if getattr(args, name) < 0:
            parser.error(f"--{name.replace('_', '-')} must not be negative, got {getattr(args, name):g}")
    if args.publishers + args.subscribers > MAX_WORKERS:
        parser.error(f"--publishers + --subscribers must be at most {MAX_WORKERS} (one process each), "
                     f"got {args.publishers + args.subscribers}")
    if args.max_burst < 1:
        parser.error(f"--max-burst must be at least 1, got {args.max_burst}")
    if args.max_payload < W.OVERHEAD:
        parser.error(f"--max-payload must be at least {W.OVERHEAD} (a message's head and CRC), got {args.max_payload}")
    problem = kickmsg.Config(max_subscribers=args.max_subscribers, sub_ring_capacity=args.ring_capacity,
                             pool_size=args.pool_size, max_payload_size=args.max_payload).validation_error()
    if problem:
        parser.error(problem)
    try:
        args.layout = layouts.chosen_layout(args.layout)
    except ValueError as error:  # a bad $KICKMSG_LAYOUT
        parser.error(str(error))
    if args.seed is None:
        args.seed = secrets.randbits(32)
    return args


def on_sigterm(signum, frame):
    raise KeyboardInterrupt


def main(argv=None) -> int:
    args = parse_args(argv)
    signal.signal(signal.SIGTERM, on_sigterm)
    print(f"soak: layout {args.layout} (native {NATIVE_VERSION[args.layout]}), {args.duration:g} s, "
          f"{args.publishers} publishers and {args.subscribers} subscribers at a time on {args.channels} channel(s), "
          f"seed {args.seed}", flush=True)
    soak = Soak(args)
    try:
        report = soak.run()
    except KeyboardInterrupt:
        print("interrupted: cleaning up", flush=True)
        return 130
    except Failure as failure:
        print(f"FAILED: {failure}", flush=True)
        report = {"verdict": "FAIL", "problems": soak.problems + [str(failure)], "aborted": True}
    finally:
        soak.clean_up()
    if not report.get("aborted"):
        print_report(report)
    if args.json:
        with open(args.json, "w") as file:
            json.dump(report, file, indent=2)
            file.write("\n")
    return 0 if report["verdict"] == "PASS" else 1


if __name__ == "__main__":
    sys.exit(main())
