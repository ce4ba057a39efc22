# Layout 9's sequence and meta words for the compiled build (Cython pure
# mode): the functions of words.py, unchanged, on 64-bit words, with their
# constants (imported from kickmsg.protocol.v9.layout) held as C integers.
# The flows cimport them: a call is a C call.
from libc.stdint cimport uint64_t

cimport cython

cdef uint64_t META_SLOT_BITS, META_SLOT_MASK, META_TAG_MASK, META_TAG_SIGN, SEQ_LOCK_BIT, SEQ_REPAIR_BIT, SEQ_VALUE_MASK

cpdef bint seq_locked(uint64_t seq)
cpdef bint seq_skip(uint64_t seq)
cpdef uint64_t seq_pos(uint64_t seq)
cpdef uint64_t publisher_lock(uint64_t pos)
cpdef uint64_t repairer_lock(uint64_t pos)
cpdef uint64_t skip_marker(uint64_t pos)
cpdef uint64_t meta_tag_of(uint64_t pos)
cpdef uint64_t pack_meta(uint64_t pos, uint64_t slot)
cpdef uint64_t meta_tag(uint64_t meta)
cpdef uint64_t meta_slot_field(uint64_t meta)

@cython.locals(distance=uint64_t)
cpdef bint meta_precedes(uint64_t meta, uint64_t pos)
