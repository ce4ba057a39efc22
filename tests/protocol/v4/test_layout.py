"""The wire layout: constants, structure offsets, geometry, hashes, and the
header of a freshly created region decoded independently with rawregion."""
import ctypes
import datetime
import os
import struct
import time

import pytest

import rawregion
from conftest import on_layout4
from kickmsg import ChannelType, Config, SchemaInfo, SharedRegion
from kickmsg.protocol.v4 import layout
from kickmsg import hash as kmhash

# These tests check layout 4's own: its ctypes layout and byte offsets.
pytestmark = on_layout4

# WIRE.md's three test vectors: (type, subs, cap, pool, payload) -> (config_hash, total_size with creator "wire").
WIRE_VECTORS = [
    ((1, 16, 64, 256, 4096), 0x6C3FF20F1D29365E, 1_084_288),
    ((1, 4, 8, 16, 256), 0xE54469415ACEB14A, 7_040),
    ((2, 4, 8, 16, 256), 0x0A9A6AA4E15DCF3D, 7_040),
]


def _align64(n):
    return (n + 63) // 64 * 64


# -- constants -----------------------------------------------------------------


def test_constants_match_wire():
    assert layout.MAGIC == 0x4B49434B4D534721
    assert layout.MAGIC.to_bytes(8, "big") == b"KICKMSG!"
    assert layout.VERSION == 4
    assert layout.INVALID_SLOT == 0xFFFFFFFF
    assert layout.LOCKED_SEQUENCE == 0xFFFFFFFFFFFFFFFF
    assert layout.CACHE_LINE == 64
    assert layout.DEFAULT_COMMIT_TIMEOUT_US == 10_000
    assert (layout.CHANNEL_PUBSUB, layout.CHANNEL_BROADCAST) == (1, 2)
    assert (int(ChannelType.PubSub), int(ChannelType.Broadcast)) == (1, 2)
    assert (layout.RING_FREE, layout.RING_LIVE, layout.RING_DRAINING) == (0, 1, 2)
    assert layout.RING_STATE_MASK == 3
    assert layout.IN_FLIGHT_ONE == 4
    assert (layout.SCHEMA_UNSET, layout.SCHEMA_CLAIMING, layout.SCHEMA_SET) == (0, 1, 2)


# -- ctypes structures -------------------------------------------------------------

HEADER_OFFSETS = {
    "magic": 0,
    "version": 8,
    "channel_type": 12,
    "total_size": 16,
    "sub_rings_offset": 24,
    "pool_offset": 32,
    "max_subs": 40,
    "sub_ring_capacity": 48,
    "sub_ring_mask": 56,
    "pool_size": 64,
    "slot_data_size": 72,
    "slot_stride": 80,
    "sub_ring_stride": 88,
    "commit_timeout_us": 96,
    "config_hash": 104,
    "creator_pid": 112,
    "created_at_ns": 120,
    "creator_name_len": 128,
    "schema_state": 192,
    "schema_data": 256,
    "free_top": 768,
}


@pytest.mark.parametrize("field, offset", HEADER_OFFSETS.items())
def test_header_field_offsets(field, offset):
    assert getattr(layout.Header, field).offset == offset


def test_structure_sizes():
    assert ctypes.sizeof(layout.Header) == layout.HEADER_SIZE == 832
    assert ctypes.sizeof(layout.SchemaInfoLayout) == 512
    assert ctypes.sizeof(layout.SubRingHeader) == layout.RING_HEADER_SIZE == 128
    assert ctypes.sizeof(layout.Entry) == layout.ENTRY_SIZE == 16
    assert ctypes.sizeof(layout.SlotHeader) == layout.SLOT_HEADER_SIZE == 8


def test_field_widths():
    """Atomic words have the widths WIRE.md gives them."""
    h = layout.Header
    assert h.magic.size == h.free_top.size == h.total_size.size == 8
    assert h.version.size == h.channel_type.size == h.schema_state.size == 4
    assert h.creator_name_len.size == 2
    assert layout.SubRingHeader.state_flight.size == 4
    assert layout.SubRingHeader.write_pos.size == 8
    assert layout.SubRingHeader.has_waiter.size == 4
    assert layout.Entry.sequence.size == 8
    assert layout.Entry.slot_idx.size == layout.Entry.payload_len.size == 4
    assert layout.SlotHeader.refcount.size == layout.SlotHeader.next_free.size == 4


def test_schema_info_offsets():
    s = layout.SchemaInfoLayout
    assert (s.identity.offset, s.layout.offset, s.name.offset) == (0, 64, 128)
    assert (s.version.offset, s.identity_algo.offset, s.layout_algo.offset, s.flags.offset) == (256, 260, 264, 268)
    assert (s.reserved.offset, s.reserved.size) == (272, 240)


def test_ring_entry_slot_offsets():
    assert layout.SubRingHeader.state_flight.offset == 0
    assert layout.SubRingHeader.write_pos.offset == 64
    assert layout.SubRingHeader.has_waiter.offset == 72
    assert (layout.Entry.sequence.offset, layout.Entry.slot_idx.offset, layout.Entry.payload_len.offset) == (0, 8, 12)
    assert (layout.SlotHeader.refcount.offset, layout.SlotHeader.next_free.offset) == (0, 4)


# -- geometry and config hash -----------------------------------------------------------


@pytest.mark.parametrize("params, expected_hash, expected_total", WIRE_VECTORS)
def test_config_hash_vectors(params, expected_hash, expected_total):
    assert layout.config_hash(*params, 10_000) == expected_hash


@pytest.mark.parametrize("params, expected_hash, expected_total", WIRE_VECTORS)
def test_geometry_vectors(params, expected_hash, expected_total):
    channel_type, subs, cap, pool, payload = params
    g = layout.Geometry.for_config(channel_type, subs, cap, pool, payload, 10_000, len("wire"))
    assert g.total_size == expected_total
    assert g.config_hash == expected_hash
    assert g.sub_rings_offset == _align64(832 + 4)
    assert g.ring_stride == _align64(128 + cap * 16)
    assert g.slot_stride == _align64(8 + payload)
    assert g.pool_offset == g.sub_rings_offset + subs * g.ring_stride
    assert g.total_size == g.pool_offset + pool * g.slot_stride
    assert g.mask == cap - 1
    assert (g.channel_type, g.max_subs, g.capacity, g.pool_size, g.slot_data_size) == params


def test_config_hash_is_fnv_of_packed_config():
    packed = struct.pack("<IQQQQq", 2, 3, 32, 100, 777, 1234)
    assert layout.config_hash(2, 3, 32, 100, 777, 1234) == kmhash.fnv1a_64(packed)


def test_config_hash_depends_on_every_field():
    base = (1, 4, 8, 16, 256, 10_000)
    reference = layout.config_hash(*base)
    for i in range(len(base)):
        changed = list(base)
        changed[i] += 1
        assert layout.config_hash(*changed) != reference, f"field {i} is not hashed"


@pytest.mark.parametrize("params, expected_hash, expected_total", WIRE_VECTORS)
def test_created_region_matches_vectors(shm_name, params, expected_hash, expected_total):
    channel_type, subs, cap, pool, payload = params
    cfg = Config(max_subscribers=subs, sub_ring_capacity=cap, pool_size=pool, max_payload_size=payload)
    SharedRegion.create(shm_name, ChannelType(channel_type), cfg, "wire")
    data = rawregion.read_bytes(shm_name)
    assert len(data) == expected_total
    h = rawregion.header(data)
    assert h["config_hash"] == expected_hash
    assert h["total_size"] == expected_total


# -- FNV-1a -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    "data, expected",
    [
        (b"", 0xCBF29CE484222325),
        (b"a", 0xAF63DC4C8601EC8C),
        (b"foobar", 0x85944171F73967E8),
    ],
)
def test_fnv1a_known_values(data, expected):
    assert kmhash.fnv1a_64(data) == expected


def test_fnv1a_constants():
    assert kmhash.FNV1A_64_OFFSET_BASIS == 0xCBF29CE484222325
    assert kmhash.FNV1A_64_PRIME == 0x100000001B3


def test_fnv1a_chaining_with_seed():
    assert kmhash.fnv1a_64(b"bar", seed=kmhash.fnv1a_64(b"foo")) == kmhash.fnv1a_64(b"foobar")
    assert kmhash.fnv1a_64(b"", seed=12345) == 12345


def test_fnv1a_str_is_utf8():
    assert kmhash.fnv1a_64("foobar") == kmhash.fnv1a_64(b"foobar")
    assert kmhash.fnv1a_64("é") == kmhash.fnv1a_64("é".encode("utf-8"))


def test_fnv1a_rejects_bad_seed():
    with pytest.raises(ValueError):
        kmhash.fnv1a_64(b"x", seed=-1)
    with pytest.raises(ValueError):
        kmhash.fnv1a_64(b"x", seed=2**64)


def test_identity_from_fnv1a_layout():
    identity = kmhash.identity_from_fnv1a("my.Type")
    assert isinstance(identity, bytes) and len(identity) == 64
    assert int.from_bytes(identity[:8], "little") == kmhash.fnv1a_64(b"my.Type")
    assert identity[8:] == bytes(56)
    assert kmhash.identity_from_fnv1a(b"my.Type") == identity


# -- header of a region we create, decoded with rawregion ----------------------------------------


def _small_config(**changes):
    fields = dict(max_subscribers=3, sub_ring_capacity=16, pool_size=20, max_payload_size=100)
    fields.update(changes)
    return Config(**fields)


def test_created_header_fields(shm_name):
    cfg = _small_config(commit_timeout=datetime.timedelta(milliseconds=25))
    before = time.monotonic_ns()
    SharedRegion.create(shm_name, ChannelType.Broadcast, cfg, "creator-ü")
    after = time.monotonic_ns()
    data = rawregion.read_bytes(shm_name)
    h = rawregion.header(data)
    name_bytes = "creator-ü".encode()
    header_size = _align64(832 + len(name_bytes))
    ring_stride = _align64(128 + 16 * 16)
    slot_stride = _align64(8 + 100)
    assert h["magic"] == 0x4B49434B4D534721
    assert data[:8] == b"!GSMKCIK"  # little-endian "KICKMSG!"
    assert h["version"] == 4
    assert h["channel_type"] == 2
    assert h["sub_rings_offset"] == header_size
    assert h["sub_ring_stride"] == ring_stride
    assert h["pool_offset"] == header_size + 3 * ring_stride
    assert h["slot_stride"] == slot_stride
    assert h["total_size"] == header_size + 3 * ring_stride + 20 * slot_stride == len(data)
    assert (h["max_subs"], h["sub_ring_capacity"], h["sub_ring_mask"]) == (3, 16, 15)
    assert (h["pool_size"], h["slot_data_size"]) == (20, 100)
    assert h["commit_timeout_us"] == 25_000
    assert h["config_hash"] == layout.config_hash(2, 3, 16, 20, 100, 25_000)
    assert h["creator_pid"] == os.getpid()
    # 0.1.0 stamps CLOCK_MONOTONIC here (measured on the native wheel; WIRE.md says
    # "wall clock", which is wrong for 0.1.0 -- see the report).
    assert before <= h["created_at_ns"] <= after
    assert h["creator_name_len"] == len(name_bytes)
    assert data[832 : 832 + len(name_bytes)] == name_bytes
    assert h["schema_state"] == 0
    assert data[256:768] == bytes(512)
    # Free stack: slots 0..19 pushed in order, so generation 20 and top slot 19.
    assert h["free_top"] == (20 << 32) | 19


def test_created_rings_and_pool(shm_name):
    SharedRegion.create(shm_name, ChannelType.PubSub, _small_config())
    data = rawregion.read_bytes(shm_name)
    for index in range(3):
        ring = rawregion.ring(data, index)
        assert (ring.state, ring.in_flight, ring.write_pos, ring.has_waiter) == (0, 0, 0, 0)
        assert ring.entries == [(0, 0, 0)] * 16
    pool = rawregion.pool(data)
    assert pool.free_slots == list(range(19, -1, -1))  # pops 19 first
    assert pool.refcounts == [0] * 20
    rawregion.assert_pool_whole(shm_name)
    h = rawregion.header(data)
    slot0_next = struct.unpack_from("<I", data, h["pool_offset"] + 4)[0]
    assert slot0_next == 0xFFFFFFFF


def test_default_pool_free_top(shm_name):
    """WIRE.md: a fresh pool of 256 has free_top 0x00000100_000000FF."""
    SharedRegion.create(shm_name, ChannelType.PubSub, Config(max_subscribers=1))
    assert rawregion.header(rawregion.read_bytes(shm_name))["free_top"] == 0x00000100_000000FF


def test_empty_creator_name(shm_name):
    SharedRegion.create(shm_name, ChannelType.PubSub, _small_config())
    h = rawregion.header(rawregion.read_bytes(shm_name))
    assert h["creator_name_len"] == 0
    assert h["sub_rings_offset"] == 832


def test_schema_written_at_creation(shm_name):
    identity = bytes(range(64))
    layout_fp = bytes(range(64, 128))
    schema = SchemaInfo(
        identity=identity, layout=layout_fp, name="pkg.Pose", version=7, identity_algo=1, layout_algo=2, flags=3
    )
    SharedRegion.create(shm_name, ChannelType.PubSub, _small_config(schema=schema))
    data = rawregion.read_bytes(shm_name)
    assert rawregion.header(data)["schema_state"] == 2
    blob = data[256:768]
    assert blob[0:64] == identity
    assert blob[64:128] == layout_fp
    assert blob[128:256] == b"pkg.Pose".ljust(128, b"\0")
    assert struct.unpack_from("<IIII", blob, 256) == (7, 1, 2, 3)
    assert blob[272:512] == bytes(240)
    # The schema is not hashed.
    assert rawregion.header(data)["config_hash"] == layout.config_hash(1, 3, 16, 20, 100, 10_000)


def test_long_schema_name_cut_to_127_bytes(shm_name):
    schema = SchemaInfo(name="n" * 300)
    SharedRegion.create(shm_name, ChannelType.PubSub, _small_config(schema=schema))
    blob = rawregion.read_bytes(shm_name)[256:768]
    assert blob[128:255] == b"n" * 127
    assert blob[255] == 0
