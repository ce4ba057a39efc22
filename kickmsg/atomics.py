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
methods; a test or a verification tool can pass one that observes or
schedules each step. On the hardware object every method is the compiled C
function itself, so the hot path pays for no Python layer.
"""
from kickmsg._atomics_cffi import lib as _lib

FUTEX_WOKEN = _lib.KM_FUTEX_WOKEN
FUTEX_TIMED_OUT = _lib.KM_FUTEX_TIMED_OUT
FUTEX_VALUE_CHANGED = _lib.KM_FUTEX_VALUE_CHANGED
FUTEX_INTERRUPTED = _lib.KM_FUTEX_INTERRUPTED


class Atomics:
    """Hardware atomics on the current process's memory (C11 builtins)."""

    load_relaxed_u32 = _lib.km_load_relaxed_u32
    load_acquire_u32 = _lib.km_load_acquire_u32
    store_relaxed_u32 = _lib.km_store_relaxed_u32
    store_release_u32 = _lib.km_store_release_u32
    store_seq_cst_u32 = _lib.km_store_seq_cst_u32
    cas_relaxed_u32 = _lib.km_cas_relaxed_u32
    cas_acquire_u32 = _lib.km_cas_acquire_u32
    cas_release_u32 = _lib.km_cas_release_u32
    cas_acq_rel_u32 = _lib.km_cas_acq_rel_u32
    cas_seq_cst_u32 = _lib.km_cas_seq_cst_u32
    fetch_add_relaxed_u32 = _lib.km_fetch_add_relaxed_u32
    fetch_add_acquire_u32 = _lib.km_fetch_add_acquire_u32
    fetch_add_release_u32 = _lib.km_fetch_add_release_u32
    fetch_add_acq_rel_u32 = _lib.km_fetch_add_acq_rel_u32
    fetch_sub_relaxed_u32 = _lib.km_fetch_sub_relaxed_u32
    fetch_sub_acquire_u32 = _lib.km_fetch_sub_acquire_u32
    fetch_sub_release_u32 = _lib.km_fetch_sub_release_u32
    fetch_sub_acq_rel_u32 = _lib.km_fetch_sub_acq_rel_u32

    load_relaxed_u64 = _lib.km_load_relaxed_u64
    load_acquire_u64 = _lib.km_load_acquire_u64
    store_relaxed_u64 = _lib.km_store_relaxed_u64
    store_release_u64 = _lib.km_store_release_u64
    store_seq_cst_u64 = _lib.km_store_seq_cst_u64
    cas_relaxed_u64 = _lib.km_cas_relaxed_u64
    cas_acquire_u64 = _lib.km_cas_acquire_u64
    cas_release_u64 = _lib.km_cas_release_u64
    cas_acq_rel_u64 = _lib.km_cas_acq_rel_u64
    cas_seq_cst_u64 = _lib.km_cas_seq_cst_u64
    fetch_add_relaxed_u64 = _lib.km_fetch_add_relaxed_u64
    fetch_add_acquire_u64 = _lib.km_fetch_add_acquire_u64
    fetch_add_release_u64 = _lib.km_fetch_add_release_u64
    fetch_add_acq_rel_u64 = _lib.km_fetch_add_acq_rel_u64
    fetch_sub_relaxed_u64 = _lib.km_fetch_sub_relaxed_u64
    fetch_sub_acquire_u64 = _lib.km_fetch_sub_acquire_u64
    fetch_sub_release_u64 = _lib.km_fetch_sub_release_u64
    fetch_sub_acq_rel_u64 = _lib.km_fetch_sub_acq_rel_u64

    # futex_wait(addr, expected_u32, timeout_ns) -> FUTEX_* outcome or -errno;
    # timeout_ns < 0 waits without limit. The GIL is released while asleep.
    futex_wait = _lib.km_futex_wait
    # futex_wake_all(addr) -> number of waiters woken.
    futex_wake_all = _lib.km_futex_wake_all


HARDWARE = Atomics()
