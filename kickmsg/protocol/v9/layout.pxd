# Layout 9's geometry for the compiled build (Cython pure mode): the
# snapshot the flows read at every step, the frozen dataclass of layout.py
# as an extension type whose fields are C integers (read-only, as frozen).
# The rest of the module is compiled as it is.
from libc.stdint cimport uint64_t

cdef class Geometry:
    cdef readonly uint64_t channel_type, max_subs, capacity, pool_size, slot_data_size, commit_timeout_us
    cdef readonly uint64_t creator_name_len, sub_rings_offset, ring_stride, pool_offset, slot_stride, total_size
    cdef readonly uint64_t config_hash
