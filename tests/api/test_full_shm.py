"""A full ``/dev/shm`` (or a records file we may not write) never stops a
channel: the owner and publisher records are bookkeeping beyond 0.1.0, so a
publisher or subscriber whose record cannot be written warns once and goes
on unrecorded; a join that cannot complete leaves its ring Free; and
``kickmsg repair NAME --ring N --force`` frees a ring no record accounts for,
refusing one a live process holds the record of.

The full /dev/shm is a private 1 MiB tmpfs (``tinyshm``), filled by a file
until the kernel says ENOSPC.
"""
import multiprocessing
import os
import pwd
import subprocess
import sys

import pytest

import crashworkers
import rawregion
from conftest import on_layout4
from kickmsg import ChannelType, Config, Publisher, SharedRegion, Subscriber, audit, cli
from kickmsg import owners
from kickmsg.protocol.v4 import layout
from tinyshm import run_on_a_tiny_dev_shm

# These tests check layout 4's own: owner and publisher records in sidecar files.
pytestmark = on_layout4

SMALL = dict(max_subscribers=4, sub_ring_capacity=8, pool_size=32, max_payload_size=64)
NOBODY = pwd.getpwnam("nobody")


def free_rings(region: SharedRegion) -> list[int]:
    """The rings a subscriber may join: Free, nobody in flight."""
    return [ring.index for ring in region.core.rings if region.core.atomics.load_acquire_u32(ring.state_flight) == layout.RING_FREE]


FULL_SHM_CHILD = r"""
import json, os, signal, subprocess, sys, warnings
paths = json.loads(sys.argv[1])
sys.path[:0] = paths
import mpworkers
from kickmsg import ChannelType, Config, Publisher, SharedRegion, Subscriber, audit
from kickmsg.ops import diagnostics
from kickmsg.protocol.v4 import layout

NAME, MAX_SUBS = "/full", 4
ENV = dict(os.environ, PYTHONPATH=os.pathsep.join(paths))
results = {}
region = SharedRegion.create(NAME, ChannelType.PubSub, Config(max_subscribers=MAX_SUBS, sub_ring_capacity=8,
                                                              pool_size=32, max_payload_size=64))

def free_rings():
    return [ring.index for ring in region.core.rings if region.core.atomics.load_acquire_u32(ring.state_flight) == layout.RING_FREE]

def kickmsg(*args):
    done = subprocess.run([sys.executable, "-m", "kickmsg", *args], capture_output=True, text=True, timeout=60, env=ENV)
    return [done.returncode, done.stdout, done.stderr]

def start_echo():
    echo = subprocess.Popen([sys.executable, "-m", "kickmsg", "echo", NAME, "--count", "1", "--timeout", "60"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=ENV)
    mpworkers.wait_until(lambda: 0 not in free_rings() or echo.poll() is not None, "kickmsg echo to join ring 0")
    return echo

# Fill /dev/shm: the region is there, its records files are not (or empty).
filler = os.open("/dev/shm/filler", os.O_WRONLY | os.O_CREAT)
try:
    while True:
        os.write(filler, b"x" * 4096)
except OSError as error:
    results["filled"] = os.strerror(error.errno)

# Subscribers and a publisher of this process: each join goes on, one warning per records file.
with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    results["recorded"] = []
    for _ in range(3 * MAX_SUBS):
        with Subscriber(region) as subscriber:
            results["recorded"].append(subscriber._sidecar is not None)
    results["free after joins"] = free_rings()
    publisher, subscriber = Publisher(region), Subscriber(region)
    publisher.send(b"still works")
    results["received"] = subscriber.receive(5.0).decode()
    subscriber.close()
results["warnings"] = [str(warning.message) for warning in caught]

# The commands: echo receives, pub publishes, each warning on one line.
echo = start_echo()
publisher.send(b"to echo")
out, err = echo.communicate(timeout=60)
results["echo"] = [echo.returncode, out, err]
results["free after echo"] = free_rings()
results["pub"] = kickmsg("pub", NAME, "hello")

# An unrecorded subscriber killed with SIGKILL keeps its ring: repair leaves it alone and says how to free it.
echo = start_echo()
echo.send_signal(signal.SIGKILL)
echo.wait(60)
results["free after kill"] = free_rings()
results["repair"] = kickmsg("repair", NAME)

# Room again: records are written; --ring N --force frees the dead one's ring, refuses ours.
os.close(filler)
os.unlink("/dev/shm/filler")
holder = Subscriber(region)
results["holder"] = [holder._sidecar is not None, diagnostics.stats(NAME).rings[holder.core.ring_index].owner_pid == os.getpid()]
results["force held"] = kickmsg("repair", NAME, "--ring", str(holder.core.ring_index), "--force")
results["force unrecorded"] = kickmsg("repair", NAME, "--ring", "0", "--force")
results["free after force"] = free_rings()
holder.close()
with Subscriber(region) as subscriber:
    recorded_publisher = Publisher(region, name="after")
    recorded_publisher.send(b"after")
    results["after"] = [subscriber.core.ring_index, subscriber.receive(5.0).decode(),
                        [p.node_name for p in diagnostics.stats(NAME).publishers]]
results["audit"] = audit(region).verdict
print(json.dumps(results))
"""


@pytest.mark.timeout(400)
def test_a_full_dev_shm_does_not_stop_a_channel():
    """On a full /dev/shm: joins go on unrecorded (rings all Free after
    3 x max_subscribers joins and leaves), with one warning per records file
    naming the region, the file and the cause; publishing and receiving
    work, from the API and from kickmsg echo/pub. An unrecorded subscriber
    killed keeps its ring; repair points at --ring N --force, which (room
    again) frees it and refuses the ring of a live recorded subscriber,
    naming its pid. New subscribers and publishers record themselves; the
    region audits clean."""
    results = run_on_a_tiny_dev_shm(FULL_SHM_CHILD, timeout=360)
    assert results["filled"] == "No space left on device"
    assert results["recorded"] == [False] * 12 and results["free after joins"] == [0, 1, 2, 3]
    assert results["received"] == "still works"
    owners_warning = ("/full: cannot write records in /dev/shm/full.kickmsg-subscribers: No space left on device; subscribers "
                      "in this process go on without an owner record: tools do not show them, and the ring of one "
                      "that is killed stays taken until kickmsg repair /full --ring N --force frees it")
    publishers_warning = ("/full: cannot write records in /dev/shm/full.kickmsg-publishers: No space left on device; "
                          "publishers in this process go on unrecorded: kickmsg stats and list do not show them")
    assert results["warnings"] == [owners_warning, publishers_warning]

    code, out, err = results["echo"]
    assert (code, out.split("] ", 1)[1]) == (0, "to echo\n")
    assert err == f"kickmsg echo: warning: {owners_warning}\n"
    assert results["free after echo"] == [0, 1, 2, 3]
    code, out, err = results["pub"]
    assert (code, out, err) == (0, "published 1 message(s) of 5 bytes to /full\n", f"kickmsg pub: warning: {publishers_warning}\n")

    assert results["free after kill"] == [1, 2, 3]
    code, out, err = results["repair"]
    assert code == 0
    assert ("left ring 0 alone: held by a subscriber that records no owner (native, or one that could not record "
            "itself); once no process reads it, kickmsg repair /full --ring 0 --force frees it") in out.splitlines()

    assert results["holder"] == [True, True]
    code, out, err = results["force held"]
    assert code == 2 and "ring 1 of /full is held by live process" in err and "(its owner record is locked): not freed" in err
    code, out, err = results["force unrecorded"]
    assert (code, out) == (0, "freed ring 0\n")
    assert results["free after force"] == [0, 2, 3]
    assert results["after"] == [0, "after", ["after"]]
    assert results["audit"].startswith("clean: 32 of 32 slots free")


def test_the_pid_refused_is_the_live_holder(shm_name):
    """--ring N --force on the ring of a live recorded subscriber (this
    process) is refused naming its pid, and the ring stays Live."""
    region = SharedRegion.create(shm_name, ChannelType.PubSub, Config(**SMALL))
    with Subscriber(region):
        done = subprocess.run([sys.executable, "-m", "kickmsg", "repair", shm_name, "--ring", "0", "--force"],
                              capture_output=True, text=True, timeout=60)
        assert done.returncode == 2
        assert done.stderr == (f"kickmsg repair: error: ring 0 of {shm_name} is held by live process {os.getpid()} "
                               f"(its owner record is locked): not freed\n")
        assert free_rings(region) == [1, 2, 3]


def test_free_ring_of_a_killed_recorded_subscriber(shm_name, procs):
    """A ring whose recorded owner was killed is freed as reclaim would:
    drained from its start position, its record cleared."""
    region = SharedRegion.create(shm_name, ChannelType.PubSub, Config(**SMALL))
    procs.start_ready("dead", crashworkers.parked_subscriber, shm_name)
    publisher = Publisher(region)
    for sequence in range(5):
        publisher.send(b"%d" % sequence)
    procs.kill("dead")
    assert free_rings(region) == [1, 2, 3]
    assert region.free_ring(0) is True
    assert free_rings(region) == [0, 1, 2, 3] and owners.read_owners(shm_name, 4)[0] == (None, False)
    rawregion.assert_pool_whole(shm_name)
    assert audit(region).clean


def test_a_join_interrupted_while_recording_leaves_its_ring_free(shm_name, monkeypatch):
    """Ctrl-C (or any exception) after the join's CAS but before the
    subscriber exists: the ring is Free again and its record's lock dropped,
    so the next subscriber takes that ring and records itself."""
    region = SharedRegion.create(shm_name, ChannelType.PubSub, Config(**SMALL))

    def interrupted(pid: int) -> int:
        raise KeyboardInterrupt

    with monkeypatch.context() as patch:
        patch.setattr(owners, "process_start_time", interrupted)
        for _ in range(2 * SMALL["max_subscribers"]):
            with pytest.raises(KeyboardInterrupt):
                Subscriber(region)
    assert free_rings(region) == [0, 1, 2, 3]
    with Subscriber(region) as subscriber:
        assert subscriber.core.ring_index == 0 and subscriber._sidecar is not None


@pytest.mark.parametrize("args, error", [
    (["--ring", "0"], "--ring 0 frees the ring although no record shows its owner dead: only once no process reads it "
                      "(a native subscriber, say); add --force to do it"),
    (["--force"], "--force confirms --ring N: give the ring to free"),
    (["--ring", "4", "--force"], "{name} has rings 0 to 3, not 4"),
    (["--ring", "-1", "--force"], "{name} has rings 0 to 3, not -1"),
])
def test_repair_ring_refuses_what_it_cannot_do(shm_name, capsys, args, error):
    SharedRegion.create(shm_name, ChannelType.PubSub, Config(**SMALL))
    assert cli.main(["repair", shm_name, *args]) == 2
    assert capsys.readouterr().err == f"kickmsg repair: error: {error.format(name=shm_name)}\n"


def test_free_ring_of_a_free_or_retired_ring(shm_name):
    """A Free ring is left as it is (False); a retired one (Free with a
    publisher in flight) is refused: reset_retired_rings is for it."""
    region = SharedRegion.create(shm_name, ChannelType.PubSub, Config(**SMALL))
    assert region.free_ring(2) is False
    region.core.atomics.store_release_u32(region.core.rings[2].state_flight, layout.RING_FREE | 4)  # one publisher in flight
    with pytest.raises(RuntimeError, match=rf"ring 2 of {shm_name} is retired \(Free, 1 publisher\(s\) in flight\): "
                                           r"reset_retired_rings \(kickmsg repair --retired\)"):
        region.free_ring(2)
    assert region.reset_retired_rings() == 1 and region.free_ring(2) is False


def act_as_nobody(name: str, results) -> None:
    """In a spawned child (root): become nobody, then subscribe and publish
    on ``name``; what happened, and the warnings."""
    import warnings
    os.setgroups([])
    os.setgid(NOBODY.pw_gid)
    os.setuid(NOBODY.pw_uid)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        region = SharedRegion.open(name)
        publisher, subscriber = Publisher(region), Subscriber(region)
        publisher.send(b"unrecorded")
        received = subscriber.receive(5.0)
        recorded = subscriber._sidecar is not None
        subscriber.close()
    results.put({"received": received, "recorded": recorded, "warnings": [str(w.message) for w in caught]})


def test_records_files_we_may_not_write_only_warn(shm_name):
    """A region everyone may use (0666) whose records files only root may
    write (0600): user nobody publishes and receives, unrecorded, with one
    warning per file naming the cause (EACCES)."""
    old_umask = os.umask(0)
    try:
        region = SharedRegion.create(shm_name, ChannelType.PubSub, Config(**SMALL), mode=0o666)
    finally:
        os.umask(old_umask)
    Subscriber(region).close()
    Publisher(region)  # made the publishers file
    for path in (owners.sidecar_path(shm_name), owners.publishers_path(shm_name)):
        os.chmod(path, 0o600)
    context = multiprocessing.get_context("spawn")
    results = context.Queue()
    child = context.Process(target=act_as_nobody, args=(shm_name, results))
    child.start()
    try:
        outcome = results.get(timeout=60)
    finally:
        child.join(10)
        if child.is_alive():
            child.kill()
    assert outcome["received"] == b"unrecorded" and outcome["recorded"] is False
    assert outcome["warnings"] == [
        f"{shm_name}: cannot write records in /dev/shm{shm_name}.kickmsg-publishers: Permission denied; publishers in this "
        f"process go on unrecorded: kickmsg stats and list do not show them",
        f"{shm_name}: cannot write records in /dev/shm{shm_name}.kickmsg-subscribers: Permission denied; subscribers in this "
        f"process go on without an owner record: tools do not show them, and the ring of one that is killed stays "
        f"taken until kickmsg repair {shm_name} --ring N --force frees it",
    ]
