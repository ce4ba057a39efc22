# Layout 9's region for the compiled build (Cython pure mode): the door and
# the addresses the flows read at every step as C fields; everything else
# (the clock, the liveness checks, the header) stays in the instance's
# __dict__, where kickmsg.verify and the tests replace it.
from libc.stdint cimport uintptr_t

from kickmsg.atomics cimport Atomics
from kickmsg.protocol.v9.layout cimport Geometry

cdef class Region:
    cdef dict __dict__
    cdef object __weakref__
    cdef public Atomics atomics
    cdef public Geometry geometry
    cdef public object mapping, ring_addresses, ring_entries, slot_addresses, payload_offsets
    cdef public uintptr_t base, free_top_address, steal_count_address

    cpdef object payload(self, object slot, object length)
