# Layout 4's publisher for the compiled build (Cython pure mode): the flow of
# publish.py, unchanged, with its door, its region, its rings and its words
# typed. ``found`` stays a Python integer: it holds a signed search result,
# a 32-bit state and a 64-bit sequence in turn.
from libc.stdint cimport uint32_t, uint64_t, uintptr_t

cimport cython

from kickmsg.atomics cimport Atomics
from kickmsg.protocol.v4.region cimport Region, RingAddresses

cdef uint64_t IN_FLIGHT_ONE, INVALID_SLOT, LOCKED_SEQUENCE, PAYLOAD_LEN_OFFSET, REFCOUNT_OFFSET
cdef uint64_t RING_LIVE, RING_STATE_MASK, SEQUENCE_OFFSET, SLOT_IDX_OFFSET, U32_MAX, U64_MAX

cdef class Publisher:
    cdef dict __dict__
    cdef object __weakref__
    cdef public Region region
    cdef public uint64_t pending
    cdef public uint64_t dropped

    @cython.locals(region=Region, ops=Atomics, capacity=uint64_t, mask=uint64_t, pool_size=uint64_t,
                   commit_timeout_ns=uint64_t, delivered=uint64_t, dropped=uint64_t, excess=uint64_t,
                   first_state_flight=uintptr_t, ring_stride=uint64_t, max_subs=uint64_t, index=uint64_t,
                   live=uint64_t, state_flight=uint32_t, ring=RingAddresses, admitted=bint, position=uint64_t,
                   entry=uintptr_t, sequence=uint64_t, previous_sequence=uint64_t, evicted_slot=uint64_t,
                   committed=bint)
    cpdef uint64_t _deliver(self, uint64_t slot, uint64_t payload_len)

@cython.locals(spins=uint64_t, sequence=uint64_t)
cpdef uint64_t wait_and_capture_slot(Atomics ops, uintptr_t entry, uint64_t expected_sequence, uint64_t timeout_ns)
