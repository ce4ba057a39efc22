# Layout 9's receive flow for the compiled build (Cython pure mode): the flow
# of receive.py, unchanged, with its door, its region, its cursor and its
# words typed. A layout-9 ring is never re-created in place, so write_pos
# never falls behind read_pos and their differences stay unsigned.
from libc.stdint cimport int64_t, uint32_t, uint64_t, uintptr_t

cimport cython

from kickmsg.atomics cimport Atomics
from kickmsg.protocol cimport freestack
from kickmsg.protocol.v9.layout cimport Geometry
from kickmsg.protocol.v9.region cimport Region
from kickmsg.protocol.v9.words cimport meta_slot_field, meta_tag, meta_tag_of, seq_locked, seq_pos, seq_skip

cdef uint64_t LOST_COUNT_OFFSET, META_OFFSET, PAYLOAD_LEN_OFFSET, REFCOUNT_OFFSET, SEQUENCE_OFFSET, U32_MAX
cdef uint64_t WRITE_POS_OFFSET

cdef class Subscriber:
    cdef dict __dict__
    cdef object __weakref__
    cdef public Region region
    cdef public int64_t ring_index
    cdef public uintptr_t ring
    cdef public uint64_t read_pos, lost

    @cython.locals(region=Region, g=Geometry, ops=Atomics, ring=uintptr_t, write_pos=uint64_t,
                   entry=uintptr_t, expected=uint64_t, s1=uint64_t, meta=uint64_t, field=uint64_t, slot=uint64_t,
                   slot_address=uintptr_t, refcount=uint32_t, found=uint32_t, pinned=bint, length=uint32_t,
                   position=uint64_t)
    cpdef object pin_next(self)

    cpdef void lose(self, uint64_t count=*)
