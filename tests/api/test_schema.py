"""The schema descriptor: SchemaInfo, its place in the header, the claim
protocol (Unset -> Claiming -> Set), recovery from a stuck claim, schema.diff
and the FNV-1a helpers.

Region bytes are checked with the independent ``rawregion`` reader, and
states a crashed claimant would leave behind are poked straight into
/dev/shm with ``mmap``.
"""
import mmap
import struct

import pytest

from kickmsg import ChannelType, Config, SchemaInfo, SharedRegion, hash, schema
from kickmsg.schema import Diff
import rawregion
from conftest import new_shm_name
from nativepeer import CLAIM_SCHEMA, race, start_ours

SCHEMA_STATE = 192  # u32: Unset 0, Claiming 1, Set 2
SCHEMA_DATA = 256  # the 512-byte SchemaInfo
UNSET, CLAIMING, SET = 0, 1, 2

SMALL = dict(max_subscribers=2, sub_ring_capacity=2, pool_size=4, max_payload_size=64)


def small_config(**fields) -> Config:
    return Config(**{**SMALL, **fields})


def full_info(**fields) -> SchemaInfo:
    """A descriptor with every field set to something recognisable."""
    values = dict(
        identity=bytes(range(64)),
        layout=bytes(range(100, 164)),
        name="demo.Pose",
        version=7,
        identity_algo=0x11223344,
        layout_algo=0x55667788,
        flags=0x99AABBCC,
    )
    values.update(fields)
    return SchemaInfo(**values)


def poke(name: str, offset: int, data: bytes) -> None:
    """Write raw bytes into a region through a mapping of our own, as a
    crashed or foreign process could have left them."""
    with open(f"/dev/shm{name}", "r+b") as file, mmap.mmap(file.fileno(), 0) as memory:
        memory[offset : offset + len(data)] = data


def schema_state(name: str) -> int:
    return rawregion.header(rawregion.read_bytes(name))["schema_state"]


def schema_bytes(name: str) -> bytes:
    return rawregion.read_bytes(name)[SCHEMA_DATA : SCHEMA_DATA + 512]


# -- SchemaInfo --------------------------------------------------------------


def test_schema_info_defaults():
    """A new descriptor is all zeros and an empty name."""
    info = SchemaInfo()
    assert info.identity == bytes(64)
    assert info.layout == bytes(64)
    assert info.name == ""
    assert (info.version, info.identity_algo, info.layout_algo, info.flags) == (0, 0, 0, 0)


def test_schema_info_fields_by_keyword_and_by_attribute():
    """Fields can be given to the constructor or assigned one by one (the
    native binding's way)."""
    by_keyword = full_info()
    by_attribute = SchemaInfo()
    by_attribute.identity = bytes(range(64))
    by_attribute.layout = bytes(range(100, 164))
    by_attribute.name = "demo.Pose"
    by_attribute.version = 7
    by_attribute.identity_algo = 0x11223344
    by_attribute.layout_algo = 0x55667788
    by_attribute.flags = 0x99AABBCC
    assert by_keyword == by_attribute
    assert by_attribute.identity == bytes(range(64))
    assert by_attribute.flags == 0x99AABBCC


@pytest.mark.parametrize("field", ["identity", "layout"])
@pytest.mark.parametrize("size", [0, 8, 63, 65, 128])
def test_fingerprints_must_be_exactly_64_bytes(field, size):
    """identity and layout of any other size are refused, as natively."""
    with pytest.raises(ValueError, match=f"SchemaInfo.{field} must be exactly 64 bytes"):
        SchemaInfo(**{field: bytes(size)})
    info = SchemaInfo()
    with pytest.raises(ValueError, match=f"SchemaInfo.{field} must be exactly 64 bytes"):
        setattr(info, field, b"x" * size)
    assert getattr(info, field) == bytes(64)  # unchanged


def test_fingerprints_accept_any_bytes_like_and_store_bytes():
    info = SchemaInfo(identity=bytearray(b"\x01" * 64), layout=memoryview(b"\x02" * 64))
    assert type(info.identity) is bytes and info.identity == b"\x01" * 64
    assert type(info.layout) is bytes and info.layout == b"\x02" * 64


@pytest.mark.parametrize("field", ["version", "identity_algo", "layout_algo", "flags"])
def test_integer_fields_are_unsigned_32_bit(field):
    info = SchemaInfo()
    setattr(info, field, 0xFFFFFFFF)
    assert getattr(info, field) == 0xFFFFFFFF
    for bad in (-1, 1 << 32):
        with pytest.raises(ValueError, match=field):
            setattr(info, field, bad)
    for bad in ("1", 1.0, True, None):
        with pytest.raises(TypeError, match=field):
            setattr(info, field, bad)


def test_name_must_be_a_string_and_unknown_fields_are_refused():
    with pytest.raises(TypeError, match="name"):
        SchemaInfo(name=b"bytes")
    info = SchemaInfo()
    with pytest.raises(AttributeError, match="reserved"):
        info.reserved = bytes(240)
    with pytest.raises(TypeError):
        SchemaInfo(colour="red")


def test_ascii_name_is_cut_to_127_bytes():
    assert SchemaInfo(name="n" * 127).name == "n" * 127
    assert SchemaInfo(name="n" * 128).name == "n" * 127
    assert SchemaInfo(name="n" * 500).name == "n" * 127


@pytest.mark.parametrize("char", ["é", "€", "𝄞"])  # 2, 3 and 4 UTF-8 bytes
def test_multibyte_name_is_cut_on_a_character_boundary(char):
    """The cut keeps at most 127 bytes and never splits a character (the
    native binding splits it and then cannot read its own name back)."""
    width = len(char.encode())
    info = SchemaInfo(name="a" + char * 100)
    encoded = info.name.encode("utf-8")
    assert len(encoded) <= 127
    assert len(encoded) > 127 - width  # only the partial character is dropped
    assert info.name == "a" + char * ((127 - 1) // width)


def test_equality_compares_every_field():
    assert SchemaInfo() == SchemaInfo()
    assert full_info() == full_info()
    for field, value in [
        ("identity", b"\xff" * 64),
        ("layout", b"\xff" * 64),
        ("name", "other"),
        ("version", 8),
        ("identity_algo", 1),
        ("layout_algo", 1),
        ("flags", 1),
    ]:
        assert full_info() != full_info(**{field: value}), field
    assert SchemaInfo() != "SchemaInfo()"


def test_schema_info_is_not_hashable():
    """Mutable, compared by value: no hash."""
    with pytest.raises(TypeError):
        hash_of = {SchemaInfo()}  # noqa: F841


def test_schema_info_repr():
    text = repr(full_info())
    assert text.startswith("SchemaInfo(")
    for part in ["'demo.Pose'", "version=7", "identity=00010203", "layout=64656667", f"flags={0x99AABBCC}"]:
        assert part in text


# -- baked in at create --------------------------------------------------------


def test_schema_baked_in_at_create(shm_name):
    """Config.schema is written at creation: schema() returns it and the
    header shows Set and the wire form at offset 256."""
    info = full_info()
    region = SharedRegion.create(shm_name, ChannelType.PubSub, small_config(schema=info), "creator")
    assert region.schema() == info
    assert schema_state(shm_name) == SET
    data = schema_bytes(shm_name)
    assert data[0:64] == bytes(range(64))
    assert data[64:128] == bytes(range(100, 164))
    assert data[128:256] == b"demo.Pose".ljust(128, b"\0")
    assert struct.unpack_from("<IIII", data, 256) == (7, 0x11223344, 0x55667788, 0x99AABBCC)
    assert data[272:512] == bytes(240)


def test_schema_name_on_the_wire_is_nul_terminated_even_when_full(shm_name):
    info = SchemaInfo(name="x" * 300)
    SharedRegion.create(shm_name, ChannelType.PubSub, small_config(schema=info))
    data = schema_bytes(shm_name)
    assert data[128:256] == b"x" * 127 + b"\0"


def test_multibyte_name_on_the_wire(shm_name):
    """A cut multibyte name is stored as valid UTF-8, NUL-padded."""
    info = SchemaInfo(name="€" * 60)  # 180 bytes, cut to 42 characters = 126 bytes
    region = SharedRegion.create(shm_name, ChannelType.PubSub, small_config(schema=info))
    data = schema_bytes(shm_name)
    assert data[128:256] == ("€" * 42).encode() + b"\0\0"
    assert region.schema().name == "€" * 42


def test_name_with_embedded_nul_round_trips(shm_name):
    """A descriptor reads back from the region equal to what was written
    (native 0.1.0 cuts such a name at the NUL when it is assigned)."""
    try:
        info = SchemaInfo(name="a\0b")
    except ValueError:
        return  # refusing it is fine too
    region = SharedRegion.create(shm_name, ChannelType.PubSub, small_config(schema=info))
    assert region.schema() == info


def test_schema_is_none_when_unset(shm_name):
    region = SharedRegion.create(shm_name, ChannelType.PubSub, small_config())
    assert region.schema() is None
    assert schema_state(shm_name) == UNSET
    assert schema_bytes(shm_name) == bytes(512)
    assert SharedRegion.open(shm_name).schema() is None


def test_schema_is_not_part_of_the_config_hash(shm_name):
    """A region made with a schema is joined by create_or_open without one,
    and the joiner sees the creator's schema."""
    SharedRegion.create(shm_name, ChannelType.PubSub, small_config(schema=full_info()))
    joined = SharedRegion.create_or_open(shm_name, ChannelType.PubSub, small_config(), "joiner")
    assert joined.schema() == full_info()


def test_open_reads_the_schema(shm_name):
    SharedRegion.create(shm_name, ChannelType.Broadcast, small_config(schema=full_info(name="b")))
    assert SharedRegion.open(shm_name).schema() == full_info(name="b")


def test_a_name_that_is_not_utf8_reads_with_replacement(shm_name):
    """A foreign writer may leave bytes that are not UTF-8 (the native
    binding cuts inside a character): schema() still works."""
    region = SharedRegion.create(shm_name, ChannelType.PubSub, small_config(schema=SchemaInfo(name="ok")))
    poke(shm_name, SCHEMA_DATA + 128, b"ab\xc3\0")  # a lone lead byte
    assert region.schema().name == "ab\ufffd"


def test_reserved_bytes_are_not_exposed(shm_name):
    """Garbage in reserved[] does not change what schema() returns."""
    region = SharedRegion.create(shm_name, ChannelType.PubSub, small_config(schema=full_info()))
    poke(shm_name, SCHEMA_DATA + 272, b"\xee" * 240)
    assert region.schema() == full_info()


# -- late claims -------------------------------------------------------------------


def test_try_claim_schema_winner_and_loser(shm_name):
    """The first claim wins and is visible to every opener; a later claim
    returns False and changes nothing."""
    first = SharedRegion.create(shm_name, ChannelType.PubSub, small_config())
    second = SharedRegion.open(shm_name)
    winner, loser = full_info(name="winner"), full_info(name="loser", version=99)
    assert first.try_claim_schema(winner) is True
    assert schema_state(shm_name) == SET
    before = schema_bytes(shm_name)
    assert second.try_claim_schema(loser) is False
    assert first.try_claim_schema(loser) is False
    assert schema_bytes(shm_name) == before
    assert first.schema() == winner
    assert second.schema() == winner


def test_claim_on_a_region_created_with_a_schema_loses(shm_name):
    region = SharedRegion.create(shm_name, ChannelType.PubSub, small_config(schema=full_info()))
    assert region.try_claim_schema(SchemaInfo(name="late")) is False
    assert region.schema() == full_info()


def test_claim_zeroes_reserved_bytes(shm_name):
    """reserved[] is zero on write, whatever was there before."""
    region = SharedRegion.create(shm_name, ChannelType.PubSub, small_config())
    poke(shm_name, SCHEMA_DATA + 272, b"\xee" * 240)
    assert region.try_claim_schema(full_info(name="short"))
    assert schema_bytes(shm_name)[272:512] == bytes(240)
    assert region.schema() == full_info(name="short")


def test_claim_writes_the_whole_name_field(shm_name):
    """After a reset claim left old name bytes behind, a new claim stores
    its name zero-padded to 128 bytes, as native 0.1.0 does (it copies the
    whole 512-byte descriptor)."""
    region = SharedRegion.create(shm_name, ChannelType.PubSub, small_config())
    poke(shm_name, SCHEMA_DATA + 128, b"\xee" * 128)  # a dead claimant's half-written name
    assert region.try_claim_schema(full_info(name="short"))
    assert schema_bytes(shm_name)[128:256] == b"short".ljust(128, b"\0")


def test_try_claim_schema_needs_a_schema_info(shm_name):
    region = SharedRegion.create(shm_name, ChannelType.PubSub, small_config())
    with pytest.raises(TypeError, match="SchemaInfo"):
        region.try_claim_schema({"name": "x"})
    assert schema_state(shm_name) == UNSET


def test_loser_facing_a_stuck_claim_gives_up(shm_name):
    """A claimant that died between Unset -> Claiming and Set leaves the
    state at Claiming: later claims wait a bounded while, return False and
    write nothing; schema() is None meanwhile."""
    region = SharedRegion.create(shm_name, ChannelType.PubSub, small_config())
    poke(shm_name, SCHEMA_STATE, struct.pack("<I", CLAIMING))
    assert region.schema() is None
    assert region.try_claim_schema(full_info()) is False
    assert schema_state(shm_name) == CLAIMING
    assert schema_bytes(shm_name) == bytes(512)
    assert region.schema() is None


def test_diagnose_reports_a_stuck_claim(shm_name):
    region = SharedRegion.create(shm_name, ChannelType.PubSub, small_config())
    assert region.diagnose().schema_stuck is False
    poke(shm_name, SCHEMA_STATE, struct.pack("<I", CLAIMING))
    assert region.diagnose().schema_stuck is True
    assert region.reset_schema_claim() is True
    assert region.diagnose().schema_stuck is False


def test_reset_schema_claim_then_claim_again(shm_name):
    """reset_schema_claim turns Claiming back into Unset, after which a new
    claim succeeds."""
    region = SharedRegion.create(shm_name, ChannelType.PubSub, small_config())
    poke(shm_name, SCHEMA_STATE, struct.pack("<I", CLAIMING))
    assert region.reset_schema_claim() is True
    assert schema_state(shm_name) == UNSET
    assert region.reset_schema_claim() is False  # nothing to reset any more
    assert region.try_claim_schema(full_info()) is True
    assert region.schema() == full_info()


def test_reset_schema_claim_leaves_unset_and_set_alone(shm_name):
    """Only Claiming -> Unset: a Set descriptor is never cleared, an Unset
    one stays Unset."""
    region = SharedRegion.create(shm_name, ChannelType.PubSub, small_config())
    assert region.reset_schema_claim() is False
    assert schema_state(shm_name) == UNSET
    assert region.try_claim_schema(full_info())
    assert region.reset_schema_claim() is False
    assert schema_state(shm_name) == SET
    assert region.schema() == full_info()


def test_unknown_schema_state_reads_as_no_schema(shm_name):
    """A state value no writer uses is neither Set nor Claiming."""
    region = SharedRegion.create(shm_name, ChannelType.PubSub, small_config(schema=full_info()))
    poke(shm_name, SCHEMA_STATE, struct.pack("<I", 7))
    assert region.schema() is None
    assert region.diagnose().schema_stuck is False
    assert region.try_claim_schema(SchemaInfo()) is False
    assert region.reset_schema_claim() is False


def test_claim_race_between_processes_has_one_winner():
    """Four processes claim at once: exactly one wins, and the region holds
    its descriptor."""
    name = new_shm_name("claimrace")
    SharedRegion.create(name, ChannelType.PubSub, small_config())
    won = race([start_ours(CLAIM_SCHEMA, name=name, who=f"claimant-{index}") for index in range(4)])
    assert won.count(True) == 1
    winner = won.index(True)
    assert SharedRegion.open(name).schema().name == f"claimant-{winner}"
    assert schema_state(name) == SET


# -- schema.diff ------------------------------------------------------------------

DIFFERENT = {
    "identity": (dict(identity=b"\xff" * 64), Diff.Identity, 1),
    "layout": (dict(layout=b"\xff" * 64), Diff.Layout, 2),
    "version": (dict(version=8), Diff.Version, 4),
    "name": (dict(name="demo.Twist"), Diff.Name, 8),
    "identity_algo": (dict(identity_algo=1), Diff.IdentityAlgo, 16),
    "layout_algo": (dict(layout_algo=1), Diff.LayoutAlgo, 32),
}


def test_diff_flag_values():
    assert [(flag.name, int(flag)) for flag in Diff] == [
        ("Identity", 1), ("Layout", 2), ("Version", 4), ("Name", 8), ("IdentityAlgo", 16), ("LayoutAlgo", 32),
    ]
    assert Diff.Equal == 0


def test_diff_of_equal_descriptors_is_zero():
    result = schema.diff(full_info(), full_info())
    assert result == Diff.Equal == 0
    assert isinstance(result, int)


@pytest.mark.parametrize("field", DIFFERENT)
def test_diff_reports_each_field(field):
    change, flag, value = DIFFERENT[field]
    result = schema.diff(full_info(), full_info(**change))
    assert result == flag == value
    assert schema.diff(full_info(**change), full_info()) == value  # symmetric


def test_diff_combines_flags():
    everything = {}
    for change, _, _ in DIFFERENT.values():
        everything.update(change)
    assert schema.diff(full_info(), full_info(**everything)) == 63
    result = schema.diff(full_info(), full_info(identity=b"\1" * 64, version=1, layout_algo=2))
    assert result == Diff.Identity | Diff.Version | Diff.LayoutAlgo == 1 | 4 | 32
    assert Diff.Layout not in result


def test_diff_ignores_flags():
    assert schema.diff(full_info(flags=0), full_info(flags=0xFFFFFFFF)) == 0
    assert schema.diff(full_info(flags=1), full_info(flags=2, version=1)) == Diff.Version


def test_diff_ignores_reserved_bytes(shm_name):
    """Two regions whose descriptors differ only in reserved[] compare equal."""
    region = SharedRegion.create(shm_name, ChannelType.PubSub, small_config(schema=full_info()))
    poke(shm_name, SCHEMA_DATA + 272, b"\x01" * 240)
    assert schema.diff(region.schema(), full_info()) == 0


def test_diff_of_a_region_schema_against_the_caller(shm_name):
    """The intended use: read a channel's descriptor, diff it with ours."""
    region = SharedRegion.create(shm_name, ChannelType.PubSub, small_config(schema=full_info(version=1)))
    assert schema.diff(region.schema(), full_info(version=2)) == Diff.Version


# -- hash --------------------------------------------------------------------------


def test_fnv1a_64_known_values():
    """The standard FNV-1a 64 test vectors."""
    assert hash.fnv1a_64(b"") == 0xCBF29CE484222325
    assert hash.fnv1a_64(b"a") == 0xAF63DC4C8601EC8C
    assert hash.fnv1a_64(b"foobar") == 0x85944171F73967E8
    assert hash.fnv1a_64(b"abc") == 16654208175385433931  # as the native binding computes it


def test_fnv1a_64_of_str_is_of_its_utf8_bytes():
    assert hash.fnv1a_64("foobar") == hash.fnv1a_64(b"foobar")
    assert hash.fnv1a_64("Größe") == hash.fnv1a_64("Größe".encode("utf-8"))


def test_fnv1a_64_accepts_bytes_like():
    assert hash.fnv1a_64(bytearray(b"foobar")) == hash.fnv1a_64(memoryview(b"foobar")) == 0x85944171F73967E8


def test_fnv1a_64_chains_through_seed():
    assert hash.fnv1a_64(b"bar", seed=hash.fnv1a_64(b"foo")) == hash.fnv1a_64(b"foobar")
    assert hash.fnv1a_64(b"", seed=12345) == 12345
    assert hash.fnv1a_64(b"x", hash.FNV1A_64_OFFSET_BASIS) == hash.fnv1a_64(b"x")


def test_fnv1a_64_seed_must_be_u64():
    hash.fnv1a_64(b"x", seed=(1 << 64) - 1)
    for bad in (-1, 1 << 64):
        with pytest.raises(ValueError, match="seed"):
            hash.fnv1a_64(b"x", seed=bad)


def test_fnv1a_64_reproduces_the_config_hash_vector():
    """WIRE.md: the default PubSub config hashes to 0x6c3ff20f1d29365e."""
    packed = struct.pack("<IQQQQq", 1, 16, 64, 256, 4096, 10_000)
    assert hash.fnv1a_64(packed) == 0x6C3FF20F1D29365E


def test_identity_from_fnv1a():
    identity = hash.identity_from_fnv1a("abc")
    assert len(identity) == 64
    assert identity[:8] == struct.pack("<Q", hash.fnv1a_64(b"abc"))
    assert identity[8:] == bytes(56)
    assert identity.hex().startswith("4b57410519a21fe7")  # as the native binding makes it
    assert hash.identity_from_fnv1a(b"abc") == identity
    SchemaInfo(identity=identity)  # fits the descriptor as is
