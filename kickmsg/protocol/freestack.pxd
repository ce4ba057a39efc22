# The free stack's types for the compiled build (Cython pure mode): the
# flows of freestack.py, unchanged, compiled with their door typed (calls
# reach the shim's C functions) and their 32- and 64-bit words as C
# integers. Only what is declared here is typed; the rest stays Python.
from libc.stdint cimport uint32_t, uint64_t, uintptr_t

cimport cython

from kickmsg.atomics cimport Atomics

# Imported from kickmsg.protocol.common, held here as C integers.
cdef uint64_t INVALID_SLOT, U32_MAX

@cython.locals(generation=uint64_t)
cdef uint64_t _next_top(uint64_t top, uint64_t slot)

@cython.locals(ops=Atomics, top=uint64_t, head=uint64_t, pool_size=uint64_t, next_slot=uint64_t, found=uint64_t)
cpdef uint64_t pop(object region, bint empty_on_corrupt_head)

@cython.locals(ops=Atomics, next_free_address=uintptr_t, top=uint64_t, found=uint64_t)
cpdef void push(object region, uint64_t slot)

@cython.locals(previous=uint32_t)
cpdef void release_slot(object region, uint64_t slot, uint32_t references=*)
