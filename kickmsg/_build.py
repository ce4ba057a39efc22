"""cffi builders for the C shim: two extension modules.

Run by setup.py (``cffi_modules``):

- ``kickmsg._atomics_cffi`` from ``kickmsg/_atomics.c``: the atomic
  operations, every one for ``u32`` (uint32_t) and ``u64`` (uint64_t). They
  never block, so they are called *holding the GIL*: cffi's wrappers release
  and re-take it around every call, which costs more than the operation
  itself; ``KEEP_THE_GIL`` turns that off for this module alone.
- ``kickmsg._futex_cffi`` from ``kickmsg/_futex.c``: futex wait, wake and
  waitv, called with the GIL released as cffi does by default, so a thread
  asleep in the kernel never holds it.

The declarations below mirror the C files.
"""
import pathlib

from cffi import FFI

HERE = pathlib.Path(__file__).parent

ATOMIC_DECLARATIONS = """
    T km_load_relaxed_SUFFIX(uintptr_t addr);
    T km_load_acquire_SUFFIX(uintptr_t addr);
    void km_store_relaxed_SUFFIX(uintptr_t addr, T value);
    void km_store_release_SUFFIX(uintptr_t addr, T value);
    void km_store_seq_cst_SUFFIX(uintptr_t addr, T value);
    T km_cas_relaxed_SUFFIX(uintptr_t addr, T expected, T desired);
    T km_cas_acquire_SUFFIX(uintptr_t addr, T expected, T desired);
    T km_cas_release_SUFFIX(uintptr_t addr, T expected, T desired);
    T km_cas_acq_rel_SUFFIX(uintptr_t addr, T expected, T desired);
    T km_cas_seq_cst_SUFFIX(uintptr_t addr, T expected, T desired);
    T km_fetch_add_relaxed_SUFFIX(uintptr_t addr, T operand);
    T km_fetch_add_acquire_SUFFIX(uintptr_t addr, T operand);
    T km_fetch_add_release_SUFFIX(uintptr_t addr, T operand);
    T km_fetch_add_acq_rel_SUFFIX(uintptr_t addr, T operand);
    T km_fetch_sub_relaxed_SUFFIX(uintptr_t addr, T operand);
    T km_fetch_sub_acquire_SUFFIX(uintptr_t addr, T operand);
    T km_fetch_sub_release_SUFFIX(uintptr_t addr, T operand);
    T km_fetch_sub_acq_rel_SUFFIX(uintptr_t addr, T operand);
"""

# Placed after cffi's own definitions and before its call wrappers, which
# bracket each call with Py_BEGIN/END_ALLOW_THREADS and an errno save and
# restore: here they become an empty block (the GIL stays held; errno is
# never set by an atomic). tests/protocol/test_atomics.py checks the generated code
# still has that shape.
KEEP_THE_GIL = """
#undef Py_BEGIN_ALLOW_THREADS
#define Py_BEGIN_ALLOW_THREADS {
#undef Py_END_ALLOW_THREADS
#define Py_END_ALLOW_THREADS }
#undef _cffi_restore_errno
#define _cffi_restore_errno() ((void)0)
#undef _cffi_save_errno
#define _cffi_save_errno() ((void)0)
"""

FUTEX_DECLARATIONS = """
    #define KM_FUTEX_WOKEN 0
    #define KM_FUTEX_TIMED_OUT 1
    #define KM_FUTEX_VALUE_CHANGED 2
    #define KM_FUTEX_INTERRUPTED 3
    int km_futex_wait(uintptr_t addr, uint32_t expected, int64_t timeout_ns);
    int km_futex_wake_all(uintptr_t addr);
    #define KM_FUTEX_WAITV_MAX 128
    int km_futex_waitv(const uintptr_t *addresses, const uint32_t *expected,
                       uint32_t count, int64_t timeout_ns, int32_t *woken_index);
"""

COMPILE_ARGS = ["-O2", "-Wall", "-Wextra"]

atomics_builder = FFI()
for c_type, suffix in (("uint32_t", "u32"), ("uint64_t", "u64")):
    atomics_builder.cdef(ATOMIC_DECLARATIONS.replace("SUFFIX", suffix).replace("T ", c_type + " "))
atomics_builder.cdef("void km_fence_seq_cst(void);")
atomics_builder.cdef(
    "int64_t km_find_relaxed_u32(uintptr_t addr, uintptr_t stride, uint32_t start, uint32_t count, uint32_t mask,"
    " uint32_t value);"
)
atomics_builder.set_source(
    "kickmsg._atomics_cffi", KEEP_THE_GIL + (HERE / "_atomics.c").read_text(), extra_compile_args=COMPILE_ARGS
)

futex_builder = FFI()
futex_builder.cdef(FUTEX_DECLARATIONS)
futex_builder.set_source("kickmsg._futex_cffi", (HERE / "_futex.c").read_text(), extra_compile_args=COMPILE_ARGS)

if __name__ == "__main__":
    atomics_builder.compile(verbose=True)
    futex_builder.compile(verbose=True)
