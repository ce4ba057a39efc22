# The door's types for the compiled build (Cython pure mode): Atomics is an
# extension type whose operations are methods of fixed C signature calling
# the shim's C functions (kickmsg/_shim.pxd) directly, with no cffi layer in
# between. A subclass (a test's or a tool's door) overrides any of them.
# atomics.py's first line tells Cython to take its types from here, not from
# its annotations.
from libc.stdint cimport int64_t, uint32_t, uint64_t, uintptr_t

cdef class Atomics:
    cpdef uint32_t load_relaxed_u32(self, uintptr_t address)
    cpdef uint32_t load_acquire_u32(self, uintptr_t address)
    cpdef void store_relaxed_u32(self, uintptr_t address, uint32_t value)
    cpdef void store_release_u32(self, uintptr_t address, uint32_t value)
    cpdef void store_seq_cst_u32(self, uintptr_t address, uint32_t value)
    cpdef uint32_t cas_relaxed_u32(self, uintptr_t address, uint32_t expected, uint32_t desired)
    cpdef uint32_t cas_acquire_u32(self, uintptr_t address, uint32_t expected, uint32_t desired)
    cpdef uint32_t cas_release_u32(self, uintptr_t address, uint32_t expected, uint32_t desired)
    cpdef uint32_t cas_acq_rel_u32(self, uintptr_t address, uint32_t expected, uint32_t desired)
    cpdef uint32_t cas_seq_cst_u32(self, uintptr_t address, uint32_t expected, uint32_t desired)
    cpdef uint32_t fetch_add_relaxed_u32(self, uintptr_t address, uint32_t operand)
    cpdef uint32_t fetch_add_acquire_u32(self, uintptr_t address, uint32_t operand)
    cpdef uint32_t fetch_add_release_u32(self, uintptr_t address, uint32_t operand)
    cpdef uint32_t fetch_add_acq_rel_u32(self, uintptr_t address, uint32_t operand)
    cpdef uint32_t fetch_sub_relaxed_u32(self, uintptr_t address, uint32_t operand)
    cpdef uint32_t fetch_sub_acquire_u32(self, uintptr_t address, uint32_t operand)
    cpdef uint32_t fetch_sub_release_u32(self, uintptr_t address, uint32_t operand)
    cpdef uint32_t fetch_sub_acq_rel_u32(self, uintptr_t address, uint32_t operand)
    cpdef uint64_t load_relaxed_u64(self, uintptr_t address)
    cpdef uint64_t load_acquire_u64(self, uintptr_t address)
    cpdef void store_relaxed_u64(self, uintptr_t address, uint64_t value)
    cpdef void store_release_u64(self, uintptr_t address, uint64_t value)
    cpdef void store_seq_cst_u64(self, uintptr_t address, uint64_t value)
    cpdef uint64_t cas_relaxed_u64(self, uintptr_t address, uint64_t expected, uint64_t desired)
    cpdef uint64_t cas_acquire_u64(self, uintptr_t address, uint64_t expected, uint64_t desired)
    cpdef uint64_t cas_release_u64(self, uintptr_t address, uint64_t expected, uint64_t desired)
    cpdef uint64_t cas_acq_rel_u64(self, uintptr_t address, uint64_t expected, uint64_t desired)
    cpdef uint64_t cas_seq_cst_u64(self, uintptr_t address, uint64_t expected, uint64_t desired)
    cpdef uint64_t fetch_add_relaxed_u64(self, uintptr_t address, uint64_t operand)
    cpdef uint64_t fetch_add_acquire_u64(self, uintptr_t address, uint64_t operand)
    cpdef uint64_t fetch_add_release_u64(self, uintptr_t address, uint64_t operand)
    cpdef uint64_t fetch_add_acq_rel_u64(self, uintptr_t address, uint64_t operand)
    cpdef uint64_t fetch_sub_relaxed_u64(self, uintptr_t address, uint64_t operand)
    cpdef uint64_t fetch_sub_acquire_u64(self, uintptr_t address, uint64_t operand)
    cpdef uint64_t fetch_sub_release_u64(self, uintptr_t address, uint64_t operand)
    cpdef uint64_t fetch_sub_acq_rel_u64(self, uintptr_t address, uint64_t operand)
    cpdef int64_t find_relaxed_u32(self, uintptr_t address, uintptr_t stride, uint32_t start, uint32_t count, uint32_t mask, uint32_t value)
    cpdef void fence_seq_cst(self)
