"""The one door to shared-memory atomics.

Every atomic read, write or read-modify-write that kickmsg performs on a
region goes through an ``Atomics`` object: the publish, receive, join, drain
and repair flows never touch shared words any other way. Each operation names
its width and memory order, exactly as the spec states them::

    load_acquire_u64(addr)              store_release_u64(addr, value)
    cas_acq_rel_u32(addr, expected, desired) -> value found
    fetch_sub_release_u32(addr, operand)     -> previous value

Addresses are plain integers. A CAS is strong and returns the value it found
at ``addr``: it succeeded exactly when that value equals ``expected``.
``cas_acq_rel`` fails with acquire order, ``cas_release`` fails relaxed,
``cas_seq_cst`` fails seq_cst (a failed CAS reads with its order minus the
release part). Read-modify-writes exist in every order from relaxed to
acq_rel, so a mutant can weaken any order one step by editing one call.

A region uses ``HARDWARE`` unless it is given another object with the same
methods; a test or a verification tool can pass a subclass that observes or
schedules each step. Run as Python source, every method of the hardware
object is the shim's C function itself (cffi), so the hot path pays for no
Python layer; in the compiled build (``kickmsg.build``) ``Atomics`` is an
extension type whose methods call those C functions directly, typed by
``kickmsg/atomics.pxd``, and a subclass's methods still take their place.
"""
import errno
import os
import time
import warnings
from collections.abc import Callable, Sequence

import cython

from kickmsg._atomics_cffi import lib as _lib  # called holding the GIL: they never block
from kickmsg._futex_cffi import ffi as _futex_ffi
from kickmsg._futex_cffi import lib as _futex_lib  # called with the GIL released: they sleep

if cython.compiled:  # the shim's C functions themselves, declared in kickmsg/_shim.pxd
    from cython.cimports.kickmsg._shim import (
        km_load_relaxed_u32, km_load_acquire_u32, km_store_relaxed_u32, km_store_release_u32, km_store_seq_cst_u32,
        km_cas_relaxed_u32, km_cas_acquire_u32, km_cas_release_u32, km_cas_acq_rel_u32, km_cas_seq_cst_u32,
        km_fetch_add_relaxed_u32, km_fetch_add_acquire_u32, km_fetch_add_release_u32, km_fetch_add_acq_rel_u32,
        km_fetch_sub_relaxed_u32, km_fetch_sub_acquire_u32, km_fetch_sub_release_u32, km_fetch_sub_acq_rel_u32,
        km_load_relaxed_u64, km_load_acquire_u64, km_store_relaxed_u64, km_store_release_u64, km_store_seq_cst_u64,
        km_cas_relaxed_u64, km_cas_acquire_u64, km_cas_release_u64, km_cas_acq_rel_u64, km_cas_seq_cst_u64,
        km_fetch_add_relaxed_u64, km_fetch_add_acquire_u64, km_fetch_add_release_u64, km_fetch_add_acq_rel_u64,
        km_fetch_sub_relaxed_u64, km_fetch_sub_acquire_u64, km_fetch_sub_release_u64, km_fetch_sub_acq_rel_u64,
        km_find_relaxed_u32, km_fence_seq_cst,
    )

__all__ = [
    "Atomics", "COMPILED", "FUTEX_INTERRUPTED", "FUTEX_TIMED_OUT", "FUTEX_VALUE_CHANGED", "FUTEX_WAITV_MAX", "FUTEX_WOKEN",
    "FutexWaitv", "HARDWARE", "OPERATIONS", "POLL_SLICE_MAX_NS", "POLL_SLICE_MIN_NS", "futex_waitv_kernel",
    "futex_waitv_polling", "futex_waitv_uses_polling",
]

FUTEX_WOKEN = _futex_lib.KM_FUTEX_WOKEN
FUTEX_TIMED_OUT = _futex_lib.KM_FUTEX_TIMED_OUT
FUTEX_VALUE_CHANGED = _futex_lib.KM_FUTEX_VALUE_CHANGED
FUTEX_INTERRUPTED = _futex_lib.KM_FUTEX_INTERRUPTED


# -- Sleeping on many words at once (WaitSet, kickmsg.aio) -------------------

FUTEX_WAITV_MAX = _futex_lib.KM_FUTEX_WAITV_MAX  # words one futex_waitv call can sleep on
POLL_SLICE_MIN_NS = 50_000  # the polling sleep's first slice...
POLL_SLICE_MAX_NS = 5_000_000  # ...doubling up to this while nothing changes

# futex_waitv's signature: (addresses, expected values, timeout_ns) -> (outcome, index)
FutexWaitv = Callable[[Sequence[int], Sequence[int], int], tuple[int, int]]


# Whether futex_waitv sleeps by futex_waitv_polling: KICKMSG_FUTEX_WAITV=polling
# in the environment selects the fallback from the start (what a kernel before
# 5.16 gets); a kernel without futex_waitv selects it at the first call.
futex_waitv_uses_polling = os.environ.get("KICKMSG_FUTEX_WAITV") == "polling"


def futex_waitv_kernel(addresses: Sequence[int], expected_values: Sequence[int], timeout_ns: int) -> tuple[int, int]:
    """Sleep (without the GIL) until one of the 32-bit words at ``addresses``
    is woken or no longer holds its expected value, or ``timeout_ns`` passes
    (negative: no limit). Returns (FUTEX_* outcome, index of the word that
    woke it or was seen changed; -1 on a timeout or an interruption).

    The kernel's futex_waitv (Linux >= 5.16) sleeps on up to
    FUTEX_WAITV_MAX words; words beyond those are compared between slices of
    that sleep, as ``futex_waitv_polling`` does. On a kernel without
    futex_waitv, warns once and uses ``futex_waitv_polling`` from then on."""
    global futex_waitv_uses_polling
    if futex_waitv_uses_polling:
        return futex_waitv_polling(addresses, expected_values, timeout_ns)
    if len(addresses) > FUTEX_WAITV_MAX:
        return _sleep_in_slices(addresses, expected_values, timeout_ns, FUTEX_WAITV_MAX, futex_waitv_kernel)
    woken_index = _futex_ffi.new("int32_t *")
    outcome = _futex_lib.km_futex_waitv(
        _futex_ffi.new("uintptr_t[]", addresses), _futex_ffi.new("uint32_t[]", expected_values), len(addresses), timeout_ns,
        woken_index,
    )
    if outcome == -errno.ENOSYS:
        warnings.warn(
            "this kernel has no futex_waitv (Linux < 5.16): WaitSet and kickmsg.aio poll instead "
            f"(sleeps of {POLL_SLICE_MIN_NS // 1000} us doubling to {POLL_SLICE_MAX_NS // 1_000_000} ms)",
            RuntimeWarning,
            stacklevel=2,
        )
        futex_waitv_uses_polling = True
        return futex_waitv_polling(addresses, expected_values, timeout_ns)
    if outcome < 0:
        raise OSError(-outcome, f"futex_waitv: {os.strerror(-outcome)}")
    if outcome == FUTEX_VALUE_CHANGED:  # the kernel does not say which: look
        return outcome, _first_changed(addresses, expected_values, 0)
    return outcome, woken_index[0]


def futex_waitv_polling(addresses: Sequence[int], expected_values: Sequence[int], timeout_ns: int) -> tuple[int, int]:
    """``futex_waitv_kernel`` without the kernel's futex_waitv: sleep on the
    first word alone (futex_wait) in slices of 50 us doubling to 5 ms while
    nothing changes, and compare the other words with their expected values
    between slices. It never busy-waits; a change of another word is seen
    within one slice."""
    return _sleep_in_slices(addresses, expected_values, timeout_ns, 1, _futex_wait_first)


def _futex_wait_first(addresses: Sequence[int], expected_values: Sequence[int], timeout_ns: int) -> tuple[int, int]:
    """futex_wait on the one word given, with futex_waitv's result."""
    outcome = _futex_lib.km_futex_wait(addresses[0], expected_values[0], timeout_ns)
    if outcome < 0:
        raise OSError(-outcome, f"futex_wait: {os.strerror(-outcome)}")
    return outcome, 0 if outcome in (FUTEX_WOKEN, FUTEX_VALUE_CHANGED) else -1


def _first_changed(addresses: Sequence[int], expected_values: Sequence[int], start: int) -> int:
    """The index of the first word from ``start`` on that no longer holds
    its expected value, or -1."""
    for index in range(start, len(addresses)):
        if _lib.km_load_acquire_u32(addresses[index]) != expected_values[index]:
            return index
    return -1


def _sleep_in_slices(
    addresses: Sequence[int], expected_values: Sequence[int], timeout_ns: int, in_kernel: int, kernel_sleep: FutexWaitv
) -> tuple[int, int]:
    """Sleep on the first ``in_kernel`` words with ``kernel_sleep``, in
    slices; between slices, compare the other words with their values."""
    deadline_ns = None if timeout_ns < 0 else time.monotonic_ns() + timeout_ns
    slice_ns = POLL_SLICE_MIN_NS
    while True:
        changed = _first_changed(addresses, expected_values, in_kernel)
        if changed >= 0:
            return FUTEX_VALUE_CHANGED, changed
        if deadline_ns is not None:
            slice_ns = min(slice_ns, deadline_ns - time.monotonic_ns())
            if slice_ns <= 0:
                return FUTEX_TIMED_OUT, -1
        outcome, index = kernel_sleep(addresses[:in_kernel], expected_values[:in_kernel], slice_ns)
        if outcome != FUTEX_TIMED_OUT:
            return outcome, index
        slice_ns = min(2 * slice_ns, POLL_SLICE_MAX_NS)


class Atomics:
    """Hardware atomics on the current process's memory (C11 builtins)."""

    def load_relaxed_u32(self, address: int) -> int:
        return km_load_relaxed_u32(address)

    def load_acquire_u32(self, address: int) -> int:
        return km_load_acquire_u32(address)

    def store_relaxed_u32(self, address: int, value: int) -> None:
        km_store_relaxed_u32(address, value)

    def store_release_u32(self, address: int, value: int) -> None:
        km_store_release_u32(address, value)

    def store_seq_cst_u32(self, address: int, value: int) -> None:
        km_store_seq_cst_u32(address, value)

    def cas_relaxed_u32(self, address: int, expected: int, desired: int) -> int:
        return km_cas_relaxed_u32(address, expected, desired)

    def cas_acquire_u32(self, address: int, expected: int, desired: int) -> int:
        return km_cas_acquire_u32(address, expected, desired)

    def cas_release_u32(self, address: int, expected: int, desired: int) -> int:
        return km_cas_release_u32(address, expected, desired)

    def cas_acq_rel_u32(self, address: int, expected: int, desired: int) -> int:
        return km_cas_acq_rel_u32(address, expected, desired)

    def cas_seq_cst_u32(self, address: int, expected: int, desired: int) -> int:
        return km_cas_seq_cst_u32(address, expected, desired)

    def fetch_add_relaxed_u32(self, address: int, operand: int) -> int:
        return km_fetch_add_relaxed_u32(address, operand)

    def fetch_add_acquire_u32(self, address: int, operand: int) -> int:
        return km_fetch_add_acquire_u32(address, operand)

    def fetch_add_release_u32(self, address: int, operand: int) -> int:
        return km_fetch_add_release_u32(address, operand)

    def fetch_add_acq_rel_u32(self, address: int, operand: int) -> int:
        return km_fetch_add_acq_rel_u32(address, operand)

    def fetch_sub_relaxed_u32(self, address: int, operand: int) -> int:
        return km_fetch_sub_relaxed_u32(address, operand)

    def fetch_sub_acquire_u32(self, address: int, operand: int) -> int:
        return km_fetch_sub_acquire_u32(address, operand)

    def fetch_sub_release_u32(self, address: int, operand: int) -> int:
        return km_fetch_sub_release_u32(address, operand)

    def fetch_sub_acq_rel_u32(self, address: int, operand: int) -> int:
        return km_fetch_sub_acq_rel_u32(address, operand)

    def load_relaxed_u64(self, address: int) -> int:
        return km_load_relaxed_u64(address)

    def load_acquire_u64(self, address: int) -> int:
        return km_load_acquire_u64(address)

    def store_relaxed_u64(self, address: int, value: int) -> None:
        km_store_relaxed_u64(address, value)

    def store_release_u64(self, address: int, value: int) -> None:
        km_store_release_u64(address, value)

    def store_seq_cst_u64(self, address: int, value: int) -> None:
        km_store_seq_cst_u64(address, value)

    def cas_relaxed_u64(self, address: int, expected: int, desired: int) -> int:
        return km_cas_relaxed_u64(address, expected, desired)

    def cas_acquire_u64(self, address: int, expected: int, desired: int) -> int:
        return km_cas_acquire_u64(address, expected, desired)

    def cas_release_u64(self, address: int, expected: int, desired: int) -> int:
        return km_cas_release_u64(address, expected, desired)

    def cas_acq_rel_u64(self, address: int, expected: int, desired: int) -> int:
        return km_cas_acq_rel_u64(address, expected, desired)

    def cas_seq_cst_u64(self, address: int, expected: int, desired: int) -> int:
        return km_cas_seq_cst_u64(address, expected, desired)

    def fetch_add_relaxed_u64(self, address: int, operand: int) -> int:
        return km_fetch_add_relaxed_u64(address, operand)

    def fetch_add_acquire_u64(self, address: int, operand: int) -> int:
        return km_fetch_add_acquire_u64(address, operand)

    def fetch_add_release_u64(self, address: int, operand: int) -> int:
        return km_fetch_add_release_u64(address, operand)

    def fetch_add_acq_rel_u64(self, address: int, operand: int) -> int:
        return km_fetch_add_acq_rel_u64(address, operand)

    def fetch_sub_relaxed_u64(self, address: int, operand: int) -> int:
        return km_fetch_sub_relaxed_u64(address, operand)

    def fetch_sub_acquire_u64(self, address: int, operand: int) -> int:
        return km_fetch_sub_acquire_u64(address, operand)

    def fetch_sub_release_u64(self, address: int, operand: int) -> int:
        return km_fetch_sub_release_u64(address, operand)

    def fetch_sub_acq_rel_u64(self, address: int, operand: int) -> int:
        return km_fetch_sub_acq_rel_u64(address, operand)

    def find_relaxed_u32(self, address: int, stride: int, start: int, count: int, mask: int, value: int) -> int:
        """Relaxed loads of the 32-bit words ``stride`` bytes apart from
        ``address``, indices ``start`` to ``count - 1``, each on its own,
        until one masked with ``mask`` equals ``value``: that index << 32 |
        the word read, or -1 if none did. One call for a publisher's relaxed
        pre-check of many rings (the next Live one); a scheduler makes each
        load a step of its own."""
        return km_find_relaxed_u32(address, stride, start, count, mask, value)

    def fence_seq_cst(self) -> None:
        """A seq_cst thread fence (layout 9 orders its waiter handshakes with
        one on each side: the waiter after storing has_waiter, the publisher
        after committing and before reading has_waiter)."""
        km_fence_seq_cst()

    # futex_wait(addr, expected_u32, timeout_ns) -> FUTEX_* outcome or -errno;
    # timeout_ns < 0 waits without limit. The GIL is released while asleep.
    futex_wait = _futex_lib.km_futex_wait
    # futex_wake_all(addr) -> number of waiters woken.
    futex_wake_all = _futex_lib.km_futex_wake_all
    # futex_waitv(addresses, expected_values, timeout_ns) -> (outcome, index):
    # sleep on many words at once, as above.
    futex_waitv = staticmethod(futex_waitv_kernel)


COMPILED: bool = cython.compiled
"""Whether this door, and the flows built with it, run compiled (False with
KICKMSG_PURE=1 or where the build did not compile them: kickmsg.build)."""

OPERATIONS = (
    "load_relaxed_u32", "load_acquire_u32", "store_relaxed_u32", "store_release_u32", "store_seq_cst_u32",
    "cas_relaxed_u32", "cas_acquire_u32", "cas_release_u32", "cas_acq_rel_u32", "cas_seq_cst_u32",
    "fetch_add_relaxed_u32", "fetch_add_acquire_u32", "fetch_add_release_u32", "fetch_add_acq_rel_u32",
    "fetch_sub_relaxed_u32", "fetch_sub_acquire_u32", "fetch_sub_release_u32", "fetch_sub_acq_rel_u32",
    "load_relaxed_u64", "load_acquire_u64", "store_relaxed_u64", "store_release_u64", "store_seq_cst_u64",
    "cas_relaxed_u64", "cas_acquire_u64", "cas_release_u64", "cas_acq_rel_u64", "cas_seq_cst_u64",
    "fetch_add_relaxed_u64", "fetch_add_acquire_u64", "fetch_add_release_u64", "fetch_add_acq_rel_u64",
    "fetch_sub_relaxed_u64", "fetch_sub_acquire_u64", "fetch_sub_release_u64", "fetch_sub_acq_rel_u64",
    "find_relaxed_u32", "fence_seq_cst",
)
"""The operations of the door done by the atomics shim (not the futex calls)."""

if not cython.compiled:
    # Pure Python: the hardware's operations are the shim's C functions
    # themselves, not the methods above calling them (a Python frame less per
    # call). Compiled, each method is a direct C call (kickmsg/atomics.pxd).
    for _name in OPERATIONS:
        setattr(Atomics, _name, getattr(_lib, "km_" + _name))  # a builtin: no binding to the instance


HARDWARE = Atomics()
