# Layout 9's publisher for the compiled build (Cython pure mode): the flow of
# publish.py, unchanged, with its door, its region and its words typed.
# ``found`` stays a Python integer: it holds a signed search result, a 32-bit
# state and a 64-bit word in turn; ``slot`` and ``length`` too, so a wrong
# one gets the flow's own error.
from libc.stdint cimport uint32_t, uint64_t, uintptr_t

cimport cython

from kickmsg.atomics cimport Atomics
from kickmsg.protocol cimport freestack
from kickmsg.protocol.v9.layout cimport Geometry
from kickmsg.protocol.v9.region cimport Region
from kickmsg.protocol.v9.words cimport (
    meta_precedes, meta_slot_field, pack_meta, publisher_lock, repairer_lock, seq_locked, seq_pos, skip_marker,
)

cdef uint64_t DROPPED_COUNT_OFFSET, HAS_WAITER_OFFSET, IN_FLIGHT_ONE, INVALID_SLOT, META_OFFSET, PAYLOAD_LEN_OFFSET
cdef uint64_t REFCOUNT_OFFSET, RING_LIVE, RING_STATE_MASK, SEQUENCE_OFFSET, SEQ_VALUE_MASK, STATE_FLIGHT_OFFSET
cdef uint64_t U32_MAX, WAITER_CARRIER, WAITER_FUTEX, WRITE_POS_OFFSET

@cython.locals(ops=Atomics, waiter=uint32_t)
cpdef bint wake_ring(Region region, uintptr_t ring)

@cython.locals(ops=Atomics)
cpdef bint steal_and_skip(Region region, uintptr_t entry, uint64_t observed, uint64_t pos)

cdef class Publisher:
    cdef dict __dict__
    cdef object __weakref__
    cdef public Region region
    cdef public uint64_t pending, dropped

    @cython.locals(region=Region, g=Geometry, ops=Atomics, slot_address=uintptr_t, delivered=uint64_t, excess=uint64_t,
                   first_state_flight=uintptr_t, index=uint64_t, live=uint64_t, state_flight=uint32_t,
                   ring=uintptr_t, state_flight_address=uintptr_t, admitted=bint, pos=uint64_t, entry=uintptr_t,
                   prev_seq=uint64_t, last_seq=uint64_t, stable=bint, lock_value=uint64_t, observed=uint64_t,
                   locked=bint, my_meta=uint64_t, old=uint64_t, taken=bint, evicted=uint64_t, previous=uint32_t)
    cpdef object publish(self, object slot, object length)

    @cython.locals(ops=Atomics, address=uintptr_t, first=uint64_t, timeout_ns=uint64_t, start=uint64_t,
                   spins=uint64_t, current=uint64_t)
    cpdef tuple _wait_for_commit(self, uintptr_t entry, uint64_t prev_seq)

    @cython.locals(ops=Atomics, seq=uint64_t)
    cpdef void _self_repair(self, uintptr_t entry, uint64_t pos, uint64_t last_seq, bint stable)

    @cython.locals(ops=Atomics)
    cpdef bint _abandon(self, uintptr_t ring)
