"""futex_waitv through kickmsg.atomics: the kernel's (Linux >= 5.16) and the
polling fallback, more words than the kernel takes, and a kernel without
futex_waitv (made with a seccomp filter in a child process)."""
import ctypes
import os
import subprocess
import sys
import textwrap
import threading

import pytest

from conftest import ROOT
from kickmsg import atomics

pytestmark = pytest.mark.timeout(60)
WAITV_PATHS = {"kernel": atomics.futex_waitv_kernel, "polling": atomics.futex_waitv_polling}


@pytest.fixture(params=list(WAITV_PATHS))
def futex_waitv(request):
    return WAITV_PATHS[request.param]


def words(count: int):
    """``count`` zeroed u32 words of ordinary memory and their addresses."""
    memory = (ctypes.c_uint32 * count)()
    return memory, [ctypes.addressof(memory) + 4 * index for index in range(count)]


def change_and_wake(memory, addresses, index: int, started: threading.Event):
    """From another thread, once the sleeper has started: change word
    ``index`` and wake it (as a publisher does)."""

    def run():
        started.wait()
        memory[index] = 7
        atomics.HARDWARE.futex_wake_all(addresses[index])

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread


def test_timeout_and_a_word_already_changed(futex_waitv):
    _, addresses = words(3)
    assert futex_waitv(addresses, [0, 0, 0], 2_000_000) == (atomics.FUTEX_TIMED_OUT, -1)
    assert futex_waitv(addresses, [0, 5, 0], 2_000_000) == (atomics.FUTEX_VALUE_CHANGED, 1)


def test_says_which_word_woke_it_and_releases_the_gil(futex_waitv):
    """A thread sleeps without limit on three words; this thread keeps
    running Python meanwhile, then changes and wakes word 2."""
    memory, addresses = words(3)
    outcome = []
    sleeper = threading.Thread(target=lambda: outcome.append(futex_waitv(addresses, [0, 0, 0], -1)), daemon=True)
    sleeper.start()
    spins = sum(1 for _ in range(200_000))  # runs only if the sleeper does not hold the GIL
    started = threading.Event()
    waker = change_and_wake(memory, addresses, 2, started)
    started.set()
    waker.join()
    sleeper.join(timeout=10)
    assert not sleeper.is_alive() and spins == 200_000
    # The kernel reports the wake-up of word 2; the fallback sees it changed.
    assert outcome[0][1] == 2 and outcome[0][0] in (atomics.FUTEX_WOKEN, atomics.FUTEX_VALUE_CHANGED)


@pytest.mark.parametrize("index", [5, atomics.FUTEX_WAITV_MAX + 40])
def test_more_words_than_the_kernel_takes(futex_waitv, index):
    """200 words: a change of one of the first 128 (asleep in the kernel)
    or of one beyond (compared between slices) ends the sleep, with its index."""
    memory, addresses = words(200)
    started = threading.Event()
    waker = change_and_wake(memory, addresses, index, started)
    started.set()
    outcome, found = futex_waitv(addresses, [0] * 200, 10_000_000_000)
    waker.join()
    assert found == index and outcome in (atomics.FUTEX_WOKEN, atomics.FUTEX_VALUE_CHANGED)


def run_child(code: str, env: dict | None = None) -> str:
    done = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True, timeout=60, cwd=ROOT,
        env=dict(os.environ, **(env or {})),
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return done.stdout


def test_the_environment_selects_the_fallback():
    code = "from kickmsg import atomics; print(atomics.futex_waitv_uses_polling)"
    assert run_child(code).strip() == "False"
    assert run_child(code, {"KICKMSG_FUTEX_WAITV": "polling"}).strip() == "True"


# A child where the kernel answers futex_waitv (449 on every architecture)
# with ENOSYS, as a kernel before 5.16 does: a seccomp filter of four
# instructions (load the system call number; if 449, fail with ENOSYS).
WITHOUT_FUTEX_WAITV = r"""
import ctypes, errno, threading, time, warnings

class SockFilter(ctypes.Structure):
    _fields_ = [("code", ctypes.c_uint16), ("jt", ctypes.c_uint8), ("jf", ctypes.c_uint8), ("k", ctypes.c_uint32)]

class SockFprog(ctypes.Structure):
    _fields_ = [("len", ctypes.c_uint16), ("filter", ctypes.POINTER(SockFilter))]

program = (SockFilter * 4)(
    SockFilter(0x20, 0, 0, 0),                          # BPF_LD|BPF_W|BPF_ABS: seccomp_data.nr
    SockFilter(0x15, 0, 1, 449),                        # BPF_JMP|BPF_JEQ|BPF_K
    SockFilter(0x06, 0, 0, 0x00050000 | errno.ENOSYS),  # SECCOMP_RET_ERRNO
    SockFilter(0x06, 0, 0, 0x7FFF0000),                 # SECCOMP_RET_ALLOW
)
libc = ctypes.CDLL(None, use_errno=True)
assert libc.prctl(38, 1, 0, 0, 0) == 0  # PR_SET_NO_NEW_PRIVS
assert libc.prctl(22, 2, ctypes.byref(SockFprog(4, program)), 0, 0) == 0  # PR_SET_SECCOMP, FILTER

import kickmsg
from kickmsg import atomics

cfg = kickmsg.Config(max_subscribers=2, sub_ring_capacity=8, pool_size=16, max_payload_size=64)
region = kickmsg.SharedRegion.create(NAME, kickmsg.ChannelType.PubSub, cfg)
subscriber, publisher = kickmsg.Subscriber(region), kickmsg.Publisher(region)
waitset = kickmsg.WaitSet()
waitset.add(subscriber)
with warnings.catch_warnings(record=True) as warned:
    warnings.simplefilter("always")
    empty = waitset.wait(0.05)
    threading.Timer(0.2, publisher.send, [b"late"]).start()
    ready = waitset.wait(10)
    received = subscriber.try_receive()
    again = waitset.wait(0.05)
print([str(warning.message) for warning in warned])
print(atomics.futex_waitv_uses_polling, empty, ready == [subscriber], received, again)
region.unlink()
"""


def test_a_kernel_without_futex_waitv_says_so_once_and_polls(shm_name):
    lines = run_child(f"NAME = {shm_name!r}\n" + WITHOUT_FUTEX_WAITV).splitlines()
    assert lines[0].count("this kernel has no futex_waitv (Linux < 5.16)") == 1
    assert lines[1] == "True [] True b'late' []"
