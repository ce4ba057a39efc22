# Layout 4's region for the compiled build (Cython pure mode): the ring
# addresses (read-only, as the frozen record they were) and the words the
# flows read at every step as C fields.
from libc.stdint cimport uintptr_t

from kickmsg.atomics cimport Atomics

cdef class RingAddresses:
    cdef readonly object index
    cdef readonly uintptr_t state_flight, write_pos, has_waiter
    cdef readonly object entries

cdef class Region:
    cdef dict __dict__
    cdef object __weakref__
    cdef public Atomics atomics
    cdef public object geometry, slot_addresses, payload_offsets, mapping
    cdef public uintptr_t free_top_address
