# Layout 4's receive flow for the compiled build (Cython pure mode): the flow
# of receive.py, unchanged, with its door, its region, its ring, its cursor
# and its words typed. ``write_pos`` stays a Python integer in ``pin_next``:
# a ring re-created in place puts it behind ``read_pos``, and the
# differences taken with it must go negative as Python's do, not wrap.
from libc.stdint cimport uint32_t, uint64_t, uintptr_t

cimport cython

from kickmsg.atomics cimport Atomics
from kickmsg.protocol.v4.region cimport Region, RingAddresses

cdef uint64_t LOCKED_SEQUENCE, PAYLOAD_LEN_OFFSET, REFCOUNT_OFFSET, SEQUENCE_OFFSET, SLOT_IDX_OFFSET, U32_MAX

cdef class Subscriber:
    cdef dict __dict__
    cdef object __weakref__
    cdef public Region region
    cdef public RingAddresses ring
    cdef public uint64_t read_pos, write_pos_seen, lost

@cython.locals(ops=Atomics, capacity=uint64_t, mask=uint64_t, entry=uintptr_t, expected=uint64_t, sequence=uint64_t,
               slot=uint32_t, length=uint32_t, refcount_address=uintptr_t, refcount=uint32_t, found=uint32_t,
               pinned=bint, ring_pos=uint64_t)
cpdef object pin_next(Region region, RingAddresses ring, Subscriber cursor)
