"""Views and allocated slots in a forked child.

A child forked while its parent holds a received view or an allocated slot
gets copies of those objects; collecting the copies must not give back the
parent's pin or slot. Views the child receives itself are its own: dropped,
they give their pin back. (The owner is told apart by process id, read
once per process by ``kickmsg.process`` and again after a fork.)

The scenario runs in a fresh interpreter of its own: forking the test
runner, which other tests may have left with threads, could deadlock the
child on a lock one of them held.
"""
import gc
import os
import signal
import subprocess
import sys
import time

import pytest

from kickmsg import ChannelType, Config, Publisher, SharedRegion, Subscriber, process
import rawregion
from conftest import TESTS

CHILD_TIMEOUT_S = 20

# On layout 4 and on layout 9 (the scenario's interpreter inherits $KICKMSG_LAYOUT).
pytestmark = pytest.mark.usefixtures("layout")


def refcounts(name: str) -> list:
    return rawregion.pool(rawregion.read_bytes(name)).refcounts


def wait_for_child(pid: int) -> int:
    """The child's exit status; killed and failed after CHILD_TIMEOUT_S."""
    deadline = time.monotonic() + CHILD_TIMEOUT_S
    while time.monotonic() < deadline:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            return os.waitstatus_to_exitcode(status)
        time.sleep(0.01)
    os.kill(pid, signal.SIGKILL)
    os.waitpid(pid, 0)
    raise AssertionError(f"forked child {pid} did not finish within {CHILD_TIMEOUT_S} s")


def test_copies_in_a_forked_child_leave_the_parents_pin_and_slot_alone(shm_name):
    done = subprocess.run([sys.executable, __file__, shm_name], capture_output=True, text=True,
                          timeout=2 * CHILD_TIMEOUT_S + 30, env=dict(os.environ, PYTHONPATH=str(TESTS)))
    assert done.returncode == 0, done.stdout + done.stderr


def forked_copies(shm_name: str) -> None:
    """The scenario: a parent holding a view and a slot forks (single-threaded)."""
    config = Config(max_subscribers=1, sub_ring_capacity=4, pool_size=8, max_payload_size=64)
    region = SharedRegion.create(shm_name, ChannelType.PubSub, config)
    pub, sub = Publisher(region), Subscriber(region)
    pub.send(b"held by the parent")
    pub.send(b"received by the child")
    view = sub.try_receive_view()
    slot = pub.allocate(8)
    held, allocated = view._core.slot, slot._slot
    child = os.fork()
    if child == 0:  # the child: drop the copies, receive and drop a view of its own
        status = 1
        try:
            del view, slot
            own = sub.try_receive_view()
            status = 2 if process.pid != os.getpid() else 3 if own is None else 0
            del own
            gc.collect()
        finally:
            os._exit(status)
    assert wait_for_child(child) == 0
    counts = refcounts(shm_name)
    assert counts[held] == 2  # the ring's reference and the parent's pin
    assert counts[allocated] == 0 and allocated not in rawregion.pool(rawregion.read_bytes(shm_name)).free_slots
    assert sorted(counts, reverse=True)[:3] == [2, 1, 0]  # the child's own view was unpinned
    view.release()
    slot.publish()
    sub.close()
    rawregion.assert_pool_whole(shm_name)


if __name__ == "__main__":
    forked_copies(sys.argv[1])
