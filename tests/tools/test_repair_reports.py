"""What `kickmsg repair`, `audit` and `diagnose` say of lost and stranded
slots (issue 34 items 2 and 3), with real processes: a repair never leaves
a channel less able to deliver than before it, every step reports the slots
it gave back, every audit finding names the command that fixes it, and the
audit never calls a channel with lost slots clean."""
import os
import queue
import signal
import struct
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

import kickmsg
from conftest import SESSION_PREFIX
from kickmsg import owners
from nativepeer import start_ours

KICKMSG = Path(sys.executable).with_name("kickmsg")
SMALL = ["--ring", "8", "--pool", "16", "--max-subscribers", "4", "--payload", "64"]
FREE, LIVE = 0, 1  # ring states, the low 2 bits of state_flight (both layouts)
GIVE_UP_S = 30.0


@pytest.fixture
def name(request):
    """A name of our own (hrp), removed with its sidecars whatever the outcome."""
    value = f"/hrp_{SESSION_PREFIX}_{request.node.name[:30].replace('[', '_').replace(']', '')}"
    yield value
    kickmsg.unlink_shm(value)
    owners.unlink(value)


def cli(*args: str, code: int = 0) -> str:
    """``kickmsg ARGS``, run to completion with its exit status checked: its stdout."""
    done = subprocess.run([str(KICKMSG), *args], stdin=subprocess.DEVNULL, capture_output=True, timeout=60, text=True)
    assert done.returncode == code, (args, done.returncode, done.stdout, done.stderr)
    return done.stdout


class Running:
    """``kickmsg ARGS`` in the background; its stdout lines counted as they come; killed on exit."""

    def __init__(self, *args: str):
        self.proc = subprocess.Popen([str(KICKMSG), *args], stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                     stderr=subprocess.PIPE, text=True)
        self.lines: queue.Queue[str] = queue.Queue()
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.lines.put(line)

    def wait_for_lines(self, count: int) -> None:
        """Wait until ``count`` more lines have come (at most GIVE_UP_S)."""
        for _ in range(count):
            try:
                self.lines.get(timeout=GIVE_UP_S)
            except queue.Empty:
                pytest.fail(f"{self.proc.args}: no line for {GIVE_UP_S} s (exit status {self.proc.poll()})")

    def __enter__(self) -> "Running":
        return self

    def __exit__(self, *exc_info) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait(timeout=10)


def wait_until(condition, what: str) -> None:
    deadline = time.monotonic() + GIVE_UP_S
    while not condition():
        if time.monotonic() > deadline:
            pytest.fail(f"gave up after {GIVE_UP_S} s waiting for {what}")
        time.sleep(0.02)


def live_rings(name: str) -> int:
    return kickmsg.SharedRegion.inspect(name).diagnose().live_rings


def poke_ring_state(name: str, ring: int, state_flight: int) -> None:
    """Write ring ``ring``'s state_flight word (sub_rings_offset at 24 and
    sub_ring_stride at 88 in the header, state_flight first in the ring:
    the same in both layouts)."""
    with open(f"/dev/shm{name}", "r+b") as file:
        rings_offset, = struct.unpack_from("<Q", file.read(96), 24)
        file.seek(88)
        stride, = struct.unpack("<Q", file.read(8))
        file.seek(rings_offset + ring * stride)
        file.write(struct.pack("<I", state_flight))


def test_repairing_a_killed_echo_leaves_the_channel_delivering(name):
    """Issue 34 item 2, as reported: ring 8, pool 16, 4 rings (layout 9), a
    publisher every 10 ms, one live echo, a second echo killed with kill -9.
    After `kickmsg repair` the channel keeps delivering (no ring that is not
    Live keeps claims), and the audit says clean because it is."""
    cli("create", name, *SMALL, "--layout", "9")
    with Running("pub", name, "tick", "--count", "1000000", "--rate", "100") as publisher, \
            Running("echo", name) as live, Running("echo", name) as doomed:
        wait_until(lambda: live_rings(name) == 2, "both echoes to join")
        live.wait_for_lines(20)  # the ring windows are full: 8 messages each
        doomed.proc.send_signal(signal.SIGKILL)
        doomed.proc.wait(timeout=10)

        found = cli("audit", name, code=1)
        assert "rings held by dead subscribers: 1" in found and f"kickmsg repair {name} reclaims them" in found, found
        repaired = cli("repair", name)
        assert f"of dead subscriber {doomed.proc.pid}" in repaired, repaired

        live.wait_for_lines(50)  # delivering again: every send failed here once the pool was starved
        assert publisher.proc.poll() is None, publisher.proc.stderr.read() if publisher.proc.stderr else ""
        report = cli("audit", name, "--json")
        assert '"clean": true' in report and '"stranded_slots": []' in report, report
        diagnosis = cli("diagnose", name)
        assert "pool_too_small        False" in diagnosis and "stranded_slots        0" in diagnosis, diagnosis


@pytest.mark.parametrize("layout", [9, 4])
def test_audit_and_diagnose_report_slots_held_by_free_rings_and_repair_gives_them_back(name, layout):
    """A Free ring whose entries still hold 8 slots (what 0.9.2's reclaim and
    both generations' reset without drain leave): the audit says DAMAGED
    and names `kickmsg repair`, diagnose says the pool is too small for the
    Live rings; the repair drains the ring and says which slots it gave back."""
    cli("create", name, *SMALL, "--layout", str(layout))
    poke_ring_state(name, 0, LIVE)  # a ring with a subscriber (none reads it: nothing else moves)
    region = kickmsg.SharedRegion.open(name)
    publisher = kickmsg.Publisher(region)
    for number in range(8):
        assert publisher.send(b"%d" % number) > 0
    poke_ring_state(name, 0, 1 << 2 | FREE)  # its teardown timed out: retired
    assert region.reset_retired_rings() == 1  # without drain, as 0.1.0 and 0.9.2 do: Free, the 8 slots kept

    found = cli("audit", name, code=1)
    assert found.startswith("DAMAGED: slots held only by rings that are not Live: 8; 8 of 16 slots free"), found
    assert f"kickmsg repair {name} drains Free rings" in found, found
    diagnosis = cli("diagnose", name, code=1)
    assert "pool_too_small        True" in diagnosis and "stranded_slots        8" in diagnosis, diagnosis

    repaired = cli("repair", name)
    assert "drained Free ring 0: gave back 8 claims (slots " in repaired, repaired
    assert cli("audit", name).startswith("clean: 16 of 16 slots free"), cli("audit", name)
    cli("diagnose", name)  # exit status 0: healthy
    publisher.close()


CRASHED_ALLOCATOR = r"""
region = kickmsg.SharedRegion.open(P["name"])
publisher = kickmsg.Publisher(region, name="allocator")
pending = publisher.allocate(4)
ready()
wait_go()
"""


@pytest.mark.parametrize("layout", [9, 4])
def test_a_publisher_killed_after_allocate_is_not_clean(name, layout):
    """Issue 34 item 3: the slot a publisher killed after allocate took is
    lost: the audit says so after repair clears its record, and names the
    fix (layout 9: --orphans; layout 4: none, the spec's unrecoverable leak)."""
    cli("create", name, *SMALL, "--layout", str(layout))
    with start_ours(CRASHED_ALLOCATOR, name=name) as child:
        child.wait_ready()
        os.kill(child.proc.pid, signal.SIGKILL)
        child.proc.wait(timeout=10)
    repaired = cli("repair", name)
    assert f"reclaimed the record of dead publisher {child.proc.pid}" in repaired, repaired
    found = cli("audit", name, code=1)
    assert found.startswith("DAMAGED: unreferenced slots: 1; 15 of 16 slots free, 0 live rings\n"), found
    if layout == 4:
        assert "re-create the channel" in found, found
        return
    assert f"kickmsg repair {name} --orphans --yes gives them back" in found, found
    orphans = cli("repair", name, "--orphans", "--yes")
    assert "reclaimed 1 orphaned slot (" in orphans, orphans
    assert cli("audit", name).startswith("clean: 16 of 16 slots free")


VIEW_HOLDER = r"""
region = kickmsg.SharedRegion.open(P["name"])
subscriber = kickmsg.Subscriber(region)
ready()
view = subscriber.receive_view(20.0)
assert view is not None
ready()  # holding it
wait_go()
"""


def test_a_subscriber_killed_holding_a_view_is_repaired_in_two_steps(name):
    """Issue 34 item 3: a subscriber killed while it holds a view (layout 9).
    `kickmsg repair` reclaims its ring and gives back the ring's claims; the
    audit then reports the dead view's pin as a leaked slot and names
    `--orphans`, which gives that slot back and says which it was."""
    cli("create", name, *SMALL, "--layout", "9")
    with start_ours(VIEW_HOLDER, name=name) as child:
        child.wait_ready()
        wait_until(lambda: live_rings(name) == 1, "the subscriber to join")
        cli("pub", name, "hello")
        child.wait_ready()  # it holds a view of the message
        os.kill(child.proc.pid, signal.SIGKILL)
        child.proc.wait(timeout=10)
    repaired = cli("repair", name)
    assert f"of dead subscriber {child.proc.pid}" in repaired, repaired
    found = cli("audit", name, code=1)
    assert found.startswith("DAMAGED: leaked slots: 1;") and f"kickmsg repair {name} --orphans --yes" in found, found
    orphans = cli("repair", name, "--orphans", "--yes")
    assert "reclaimed 1 orphaned slot (" in orphans, orphans
    assert cli("audit", name).startswith("clean: 16 of 16 slots free")


@pytest.mark.parametrize("layout", [9, 4])
def test_diagnose_says_the_pool_is_too_small_when_live_rings_claims_hold_every_slot(name, layout):
    """Two Live rings whose windows hold different messages (ring 0 joined
    again while it still held a window a reclaim did not drain): their
    claims hold all 16 slots and every send fails, and diagnose says the
    pool is too small for them, though no ring is stranded."""
    cli("create", name, *SMALL, "--layout", str(layout))
    region = kickmsg.SharedRegion.open(name)
    publisher = kickmsg.Publisher(region)
    poke_ring_state(name, 0, LIVE)
    for number in range(8):
        assert publisher.send(b"%d" % number) > 0
    poke_ring_state(name, 0, FREE)  # left by a reclaim that did not drain: 8 claims kept
    poke_ring_state(name, 1, LIVE)
    for number in range(8):
        assert publisher.send(b"%d" % number) > 0
    poke_ring_state(name, 0, LIVE)  # a subscriber joins it: 16 slots claimed by Live rings
    with pytest.raises(BlockingIOError):  # the pool is empty
        publisher.send(b"one more")
    diagnosis = cli("diagnose", name, code=1)
    assert "pool_too_small        True" in diagnosis and "stranded_slots        0" in diagnosis, diagnosis
    assert "ring claims hold every slot of the pool (16)" in diagnosis, diagnosis
    publisher.close()


@pytest.mark.parametrize("layout", [9, 4])
def test_resetting_a_retired_ring_gives_its_claims_back(name, layout):
    """`kickmsg repair --retired --yes` resets a retired ring and drains it
    (both layouts), saying which slots its claims held; the default repair
    leaves a retired ring alone."""
    cli("create", name, *SMALL, "--layout", str(layout))
    poke_ring_state(name, 0, LIVE)
    region = kickmsg.SharedRegion.open(name)
    publisher = kickmsg.Publisher(region)
    for number in range(8):
        assert publisher.send(b"%d" % number) > 0
    poke_ring_state(name, 0, 1 << 2 | FREE)  # its teardown timed out with a publisher in flight
    assert "drained" not in cli("repair", name)
    found = cli("audit", name, code=1)
    assert "retired rings: 1" in found and f"kickmsg repair {name} --retired --yes resets them" in found, found
    reset = cli("repair", name, "--retired", "--yes")
    assert "reset 1 retired ring; ring 0: gave back 8 claims (slots " in reset, reset
    assert cli("audit", name).startswith("clean: 16 of 16 slots free"), cli("audit", name)
    publisher.close()
