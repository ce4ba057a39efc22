"""cffi builder for the atomics shim ``kickmsg/_atomics.c``.

Run by setup.py (``cffi_modules``); produces the extension
``kickmsg._atomics_cffi``. The declarations below mirror the C file: every
atomic operation exists for ``u32`` (uint32_t) and ``u64`` (uint64_t).
"""
import pathlib

from cffi import FFI

SHIM_SOURCE = pathlib.Path(__file__).with_name("_atomics.c")

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

FUTEX_DECLARATIONS = """
    #define KM_FUTEX_WOKEN 0
    #define KM_FUTEX_TIMED_OUT 1
    #define KM_FUTEX_VALUE_CHANGED 2
    #define KM_FUTEX_INTERRUPTED 3
    int km_futex_wait(uintptr_t addr, uint32_t expected, int64_t timeout_ns);
    int km_futex_wake_all(uintptr_t addr);
"""

FUTEX_WAITV_DECLARATIONS = """
    #define KM_FUTEX_WAITV_MAX 128
    int km_futex_waitv(const uintptr_t *addresses, const uint32_t *expected,
                       uint32_t count, int64_t timeout_ns, int32_t *woken_index);
"""

ffibuilder = FFI()
for c_type, suffix in (("uint32_t", "u32"), ("uint64_t", "u64")):
    ffibuilder.cdef(
        ATOMIC_DECLARATIONS.replace("SUFFIX", suffix).replace("T ", c_type + " ")
    )
ffibuilder.cdef(FUTEX_DECLARATIONS)
ffibuilder.cdef(FUTEX_WAITV_DECLARATIONS)
ffibuilder.set_source(
    "kickmsg._atomics_cffi",
    SHIM_SOURCE.read_text(),
    extra_compile_args=["-O2", "-Wall", "-Wextra"],
)

if __name__ == "__main__":
    ffibuilder.compile(verbose=True)
