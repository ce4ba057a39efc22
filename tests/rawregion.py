"""An independent reader of Kickmsg regions, for assertions.

It decodes /dev/shm bytes with ``struct`` straight from WIRE.md's offsets,
sharing no code with the package, so a test that checks the package's effects
with it does not trust the package's own layout code.
"""
import struct
from dataclasses import dataclass

INVALID_SLOT = 0xFFFFFFFF
HEADER_FORMAT = "<QIIQQQQQQQQQQQQQQH"  # magic .. creator_name_len
# Header words as (offset, struct format), from WIRE.md, for poking.
HEADER_OFFSETS = {
    "magic": (0, "<Q"),
    "version": (8, "<I"),
    "channel_type": (12, "<I"),
    "total_size": (16, "<Q"),
    "sub_rings_offset": (24, "<Q"),
    "pool_offset": (32, "<Q"),
    "max_subs": (40, "<Q"),
    "sub_ring_capacity": (48, "<Q"),
    "sub_ring_mask": (56, "<Q"),
    "pool_size": (64, "<Q"),
    "slot_data_size": (72, "<Q"),
    "slot_stride": (80, "<Q"),
    "sub_ring_stride": (88, "<Q"),
    "commit_timeout_us": (96, "<Q"),
    "config_hash": (104, "<Q"),
    "creator_pid": (112, "<Q"),
    "created_at_ns": (120, "<Q"),
    "creator_name_len": (128, "<H"),
    "schema_state": (192, "<I"),
    "free_top": (768, "<Q"),
}
HEADER_FIELDS = (
    "magic version channel_type total_size sub_rings_offset pool_offset max_subs "
    "sub_ring_capacity sub_ring_mask pool_size slot_data_size slot_stride "
    "sub_ring_stride commit_timeout_us config_hash creator_pid created_at_ns creator_name_len"
).split()


def read_bytes(name: str) -> bytes:
    with open(f"/dev/shm{name}", "rb") as file:
        return file.read()


def header(data: bytes) -> dict:
    fields = dict(zip(HEADER_FIELDS, struct.unpack_from(HEADER_FORMAT, data, 0)))
    fields["schema_state"] = struct.unpack_from("<I", data, 192)[0]
    fields["free_top"] = struct.unpack_from("<Q", data, 768)[0]
    fields["creator_name"] = data[832 : 832 + fields["creator_name_len"]].decode()
    return fields


@dataclass
class Ring:
    state: int
    in_flight: int
    write_pos: int
    has_waiter: int
    entries: list  # (sequence, slot_idx, payload_len) per index


@dataclass
class PoolState:
    free_slots: list  # walk order from free_top
    cycle: bool  # the walk revisited a slot
    out_of_range: list  # links pointing outside the pool
    refcounts: list


def ring(data: bytes, index: int) -> Ring:
    h = header(data)
    base = h["sub_rings_offset"] + index * h["sub_ring_stride"]
    state_flight = struct.unpack_from("<I", data, base)[0]
    write_pos, has_waiter = struct.unpack_from("<QI", data, base + 64)
    entries = [struct.unpack_from("<QII", data, base + 128 + 16 * i) for i in range(h["sub_ring_capacity"])]
    return Ring(state_flight & 3, state_flight >> 2, write_pos, has_waiter, entries)


def pool(data: bytes) -> PoolState:
    h = header(data)
    slot = lambda i: h["pool_offset"] + i * h["slot_stride"]
    refcounts = [struct.unpack_from("<I", data, slot(i))[0] for i in range(h["pool_size"])]
    walk, seen, out_of_range = [], set(), []
    index = h["free_top"] & 0xFFFFFFFF
    while index != INVALID_SLOT:
        if index >= h["pool_size"]:
            out_of_range.append(index)
            break
        if index in seen:
            return PoolState(walk, True, out_of_range, refcounts)
        seen.add(index)
        walk.append(index)
        index = struct.unpack_from("<I", data, slot(index) + 4)[0]
    return PoolState(walk, False, out_of_range, refcounts)


def assert_pool_whole(name: str) -> None:
    """Every slot is on the free stack exactly once, with refcount 0."""
    data = read_bytes(name)
    state = pool(data)
    size = header(data)["pool_size"]
    assert not state.cycle, f"free stack of {name} has a cycle: {state.free_slots}"
    assert not state.out_of_range, f"free stack of {name} links outside the pool: {state.out_of_range}"
    assert sorted(state.free_slots) == list(range(size)), (
        f"{name}: {size - len(state.free_slots)} slots missing from the free stack"
    )
    busy = {i: rc for i, rc in enumerate(state.refcounts) if rc}
    assert not busy, f"{name}: free slots with nonzero refcount {busy}"
