"""Layout 9 (kickmsg.protocol.v9): byte layout, sizes, hashes, validation at
open, create/open/create_or_open, each checked against the native 0.9.2
wheel run in subprocesses (tests/nativepeer.py)."""
import os
import re
import struct

import pytest

from kickmsg import shm
from kickmsg.protocol.v9 import layout, words
from kickmsg.protocol.v9.layout import CorruptRegionError, Geometry, VersionMismatchError
from kickmsg.protocol.v9.region import ChannelConfig, Region
from kickmsg.schema import SchemaInfo
from nativepeer import run_native9

# (type, subs, capacity, pool, payload, creator) -> (total, rings@, pool@, ring stride,
# slot stride, config hash): WIRE9.md A.7's table, measured on the wheel.
VECTORS = [
    ((1, 16, 64, 256, 4096, "wire"), (1_084_288, 896, 19_328, 1152, 4160, 0x6C3FF20F1D29365E)),
    ((1, 4, 8, 16, 256, "wire"), (7040, 896, 1920, 256, 320, 0xE54469415ACEB14A)),
    ((2, 4, 8, 16, 256, "wire"), (7040, 896, 1920, 256, 320, 0x0A9A6AA4E15DCF3D)),
    ((1, 2, 4, 4, 32, "wire"), (1536, 896, 1280, 192, 64, 0x8B5560AC3A2FB1C7)),
    ((1, 1, 1, 1, 1, ""), (1088, 832, 1024, 192, 64, 0x58E60C87F53574B9)),
]

# A native child: create each region described, report info(), stats(), and the raw header words.
NATIVE_CREATE = r'''
import struct
layout_names = {0: "Free", 1: "Live", 2: "Draining", 3: "Reclaiming"}
out = []
for spec in P["regions"]:
    cfg = make_config(spec["config"])
    region = kickmsg.SharedRegion.create(spec["name"], getattr(kickmsg.ChannelType, spec["type"]), cfg, spec["creator"])
    info, stats = region.info(), region.stats()
    raw = open("/dev/shm" + spec["name"], "rb").read()
    out.append({
        "info": {k: getattr(info, k) for k in ("shm_name", "version", "config_hash", "total_size", "max_subs",
                 "sub_ring_capacity", "pool_size", "max_payload_size", "commit_timeout_us", "creator_pid",
                 "creator_name", "created_at_ns")},
        "channel_type": int(info.channel_type.value) if hasattr(info.channel_type, "value") else {"PubSub": 1, "Broadcast": 2}[str(info.channel_type).split(".")[-1]],
        "stats": {"pool_free": stats.pool_free, "pool_size": stats.pool_size, "live_rings": stats.live_rings,
                  "total_steals": stats.total_steals, "rings": [[layout_names[int(r.state)], r.in_flight, r.write_pos, r.dropped_count, r.lost_count] for r in stats.rings]},
        "words": {"free_top": struct.unpack_from("<Q", raw, 768)[0], "identity": struct.unpack_from("<Q", raw, 784)[0],
                  "sub_rings_offset": struct.unpack_from("<Q", raw, 24)[0], "pool_offset": struct.unpack_from("<Q", raw, 32)[0],
                  "slot_stride": struct.unpack_from("<Q", raw, 80)[0], "ring_stride": struct.unpack_from("<Q", raw, 88)[0]},
        "pid": os.getpid(),
    })
done(out)
'''


def native_config(subs: int, capacity: int, pool: int, payload: int, **extra: object) -> dict:
    return {"max_subscribers": subs, "sub_ring_capacity": capacity, "pool_size": pool, "max_payload_size": payload, **extra}


@pytest.mark.parametrize(("config", "expected"), VECTORS)
def test_geometry_matches_the_measured_vectors(config, expected):
    channel_type, subs, capacity, pool, payload, creator = config
    g = Geometry.for_config(channel_type, subs, capacity, pool, payload, 10_000, len(creator))
    assert (g.total_size, g.sub_rings_offset, g.pool_offset, g.ring_stride, g.slot_stride, g.config_hash) == expected


def test_a_50_byte_payload_needs_a_128_byte_slot():
    assert Geometry.for_config(1, 1, 1, 1, 50).slot_stride == 128  # 64 in layout 4


def test_wire_encodings():
    assert words.pack_meta(0, 7) == 0x1000008
    assert words.pack_meta(5, 3) == 0x6000004
    assert words.publisher_lock(4) == 0x8000000000000004
    assert words.skip_marker(4) == 0x4000000000000005
    assert words.skip_marker(10) == 0x400000000000000B
    assert words.seq_skip(words.skip_marker(3)) and not words.seq_locked(words.skip_marker(3))
    assert words.seq_locked(words.repairer_lock(3)) and not words.seq_skip(words.repairer_lock(3))
    # serial order of tags: a zeroed meta precedes position 0, a newer claim does not precede
    assert words.meta_precedes(0, 0)
    assert words.meta_precedes(words.pack_meta(3, 1), 7)
    assert not words.meta_precedes(words.pack_meta(7, 1), 7)
    assert not words.meta_precedes(words.pack_meta(9, 1), 7)
    assert words.meta_precedes(words.pack_meta(2**40 - 2, 1), 2**40 + 5)  # across the tag's wrap


def test_the_words_hold_at_the_edges_of_their_widths():
    """The same values on the pure build (Python integers) and the compiled
    one (64-bit words): every field wraps at its own width, never at 64 bits."""
    top = 2**64 - 1
    assert words.seq_pos(top) == 2**62 - 1 and words.seq_locked(top) and not words.seq_skip(top)
    assert words.publisher_lock(top) == top ^ (1 << 62)
    assert words.repairer_lock(2**62 - 1) == top
    assert words.skip_marker(2**62 - 1) == 1 << 62  # the value part wraps to 0
    assert words.meta_tag_of(2**40 - 1) == 0 and words.meta_tag_of(top) == 0
    assert words.pack_meta(2**40 - 2, 2**24 - 2) == top
    assert words.meta_tag(top) == 2**40 - 1 and words.meta_slot_field(top) == 2**24 - 1
    assert words.meta_precedes(words.pack_meta(2**39 - 1, 0), 0) is False  # 2**39 - 1 positions on: newer
    assert words.meta_precedes(words.pack_meta(2**39, 0), 0) is True  # 2**39 on reads as behind (serial order)


def test_native_regions_parse_and_validate(shm_name):
    """The wheel creates regions of several configs; we open each and read
    every header field as the wheel reports it through info() and stats()."""
    specs = [
        {"name": f"{shm_name}_{i}", "type": "PubSub" if t == 1 else "Broadcast", "creator": creator,
         "config": native_config(subs, cap, pool, payload)}
        for i, ((t, subs, cap, pool, payload, creator), _) in enumerate(VECTORS)
    ]
    specs.append({"name": f"{shm_name}_x", "type": "PubSub", "creator": "a creator name of 41 bytes, no NUL ......",
                  "config": native_config(3, 16, 40, 50, commit_timeout=0.025, identity=0x1234)})
    try:
        reports = run_native9(NATIVE_CREATE, regions=specs)
        assert len(reports) == len(specs)
        for spec, report in zip(specs, reports):
            region = Region.open(spec["name"])
            info, stats, words = region.info(), region.stats(), report["words"]
            assert info.__dict__ | {"channel_type": 0} == report["info"] | {"channel_type": 0}
            assert info.channel_type == report["channel_type"]
            assert info.creator_pid == report["pid"]
            assert stats.pool_free == report["stats"]["pool_free"] == stats.pool_size == spec["config"]["pool_size"]
            assert stats.live_rings == report["stats"]["live_rings"] == 0
            assert stats.total_steals == report["stats"]["total_steals"] == 0
            assert [[r.state, r.in_flight, r.write_pos, r.dropped_count, r.lost_count] for r in stats.rings] == report["stats"]["rings"]
            g = region.geometry
            assert (g.sub_rings_offset, g.pool_offset, g.slot_stride, g.ring_stride) == (
                words["sub_rings_offset"], words["pool_offset"], words["slot_stride"], words["ring_stride"])
            # B.1 step 6: gen pool_size, top pool_size - 1; links i -> i - 1
            pool = g.pool_size
            assert words["free_top"] == pool << 32 | (pool - 1)
            ours = Geometry.for_config(g.channel_type, g.max_subs, g.capacity, pool, g.slot_data_size,
                                       g.commit_timeout_us, len(spec["creator"].encode()))
            assert ours == g
        assert reports[-1]["info"]["commit_timeout_us"] == 25_000
        assert reports[-1]["words"]["identity"] == 0x1234
    finally:
        for spec in specs:
            shm.unlink(spec["name"])


def test_our_region_bytes_equal_the_wheels(shm_name):
    """Same config, same creator: the two regions differ only in creator_pid
    and created_at_ns."""
    schema = {"name": "pkg/Msg", "version": 3, "identity": "ab" * 64, "layout": "cd" * 64, "identity_algo": 1}
    spec = {"name": shm_name + "_n", "type": "Broadcast", "creator": "twin", "config": native_config(3, 8, 12, 40, schema=schema)}
    try:
        run_native9(NATIVE_CREATE, regions=[spec])
        info = SchemaInfo(name="pkg/Msg", version=3, identity=bytes([0xAB]) * 64, layout=bytes([0xCD]) * 64, identity_algo=1)
        Region.create(shm_name, layout.CHANNEL_BROADCAST, ChannelConfig(3, 8, 12, 40, schema=info), "twin")
        with open("/dev/shm" + shm_name, "rb") as f:
            ours = bytearray(f.read())
        with open("/dev/shm" + spec["name"], "rb") as f:
            theirs = bytearray(f.read())
        assert len(ours) == len(theirs)
        for data in (ours, theirs):
            data[112:128] = bytes(16)  # creator_pid, created_at_ns
        assert ours == theirs
        assert Region.open(shm_name).schema() == info
    finally:
        shm.unlink(spec["name"])


def test_created_at_is_realtime(shm_name):
    region = Region.create(shm_name, 1, ChannelConfig(1, 1, 2, 8))
    import time

    assert abs(region.info().created_at_ns - time.time_ns()) < 600 * 10**9  # wall clock, not boot-relative


def test_identity_hashes_equal_the_nodes(prefix):
    """The wheel's Node stamps these identities (A.9)."""
    code = r'''
import struct
node = kickmsg.Node("my node/x", P["ns"])
cfg = make_config({"max_subscribers": 1, "sub_ring_capacity": 2, "pool_size": 4, "max_payload_size": 8})
handles = [node.advertise("/robot/arm:joint 1", cfg), node.join_broadcast("/all", cfg), node.create_mailbox("in box", cfg)]
out = {}
for name in P["names"]:
    with open("/dev/shm" + name, "rb") as f:
        out[name] = struct.unpack_from("<Q", f.read(800), 784)[0]
done(out)
'''
    ns = prefix
    names = [layout.topic_shm_name(ns, "/robot/arm:joint 1"), layout.broadcast_shm_name(ns, "/all"),
             layout.mailbox_shm_name(ns, "my node/x", "in box")]
    stamped = run_native9(code, ns=ns, names=names)
    assert stamped[names[0]] == layout.topic_identity(ns, "/robot/arm:joint 1")
    assert stamped[names[1]] == layout.broadcast_identity(ns, "/all")
    assert stamped[names[2]] == layout.mailbox_identity(ns, "my_node.x", "in box")


def test_naming():
    assert layout.topic_shm_name("demo_ns", "/robot/arm:joint 1") == "/demo_ns_robot.arm_joint_1"
    assert layout.mailbox_shm_name("demo_ns", "my node/x", "in box") == "/demo_ns_my_node.x_mbx_in_box"
    assert layout.broadcast_shm_name("demo ns!", "/all") == "/demo_ns__broadcast_all"
    with pytest.raises(ValueError, match="topic name is empty after sanitization"):
        layout.topic_shm_name("ns", "///")
    with pytest.raises(OSError, match="exceeds platform limit"):
        layout.topic_shm_name("ns", "t" * 300)


# -- Validation at open (A.10) ----------------------------------------------------

def _forge(name: str, offset: int, fmt: str, value: int) -> None:
    with open("/dev/shm" + name, "r+b") as f:
        f.seek(offset)
        f.write(struct.pack(fmt, value))


CORRUPTIONS = [
    # (offset, format, value, expected message fragment)
    (0, "<Q", 0x1234, "bad magic"),
    (12, "<I", 7, "channel_type 7"),
    (16, "<Q", 100, "total_size 100"),
    (40, "<Q", 0, "max_subs is 0"),
    (48, "<Q", 6, "sub_ring_capacity 6 is not a power of two"),
    (56, "<Q", 3, "sub_ring_mask 3"),
    (64, "<Q", 2**24, "pool_size 16777216 exceeds MAX_POOL_SIZE"),
    (64, "<Q", 1000, "pool_size 1000 slots"),
    (72, "<Q", 310, "slot_stride 320 < 16 + slot_data_size 310"),
    (80, "<Q", 96, "slot_stride 96 is not a multiple"),
    (88, "<Q", 128, "sub_ring_stride 128 < 128 + 16 x sub_ring_capacity 8"),
    (24, "<Q", 960, "max_subs 4 rings of 256 bytes do not fit"),
    (24, "<Q", 512, "offsets out of order"),
    (32, "<Q", 7040, "offsets out of order"),
    (128, "<H", 100, "creator_name_len 100 overlaps"),
    (40, "<Q", 5, "max_subs 5 rings"),
]


@pytest.mark.parametrize(("offset", "fmt", "value", "message"), CORRUPTIONS)
def test_corrupt_headers_are_refused(shm_name, offset, fmt, value, message):
    Region.create(shm_name, 1, ChannelConfig(4, 8, 16, 256), "wire")
    Region.open(shm_name)
    _forge(shm_name, offset, fmt, value)
    with pytest.raises(CorruptRegionError, match=re.escape(message)) as caught:
        Region.open(shm_name)
    assert shm_name in str(caught.value)


def test_version_mismatch_and_short_objects(shm_name):
    Region.create(shm_name, 1, ChannelConfig(1, 2, 4, 8))
    _forge(shm_name, 8, "<I", 4)
    with pytest.raises(VersionMismatchError, match="version 4"):
        Region.open(shm_name)
    with pytest.raises(VersionMismatchError):
        Region.create_or_open(shm_name, 1, ChannelConfig(1, 2, 4, 8))
    os.truncate("/dev/shm" + shm_name, 100)
    with pytest.raises(CorruptRegionError, match="Buffer smaller than region Header"):
        Region.open(shm_name)
    os.truncate("/dev/shm" + shm_name, 0)
    with pytest.raises(shm.RegionNotFoundError):
        Region.open(shm_name)


def test_total_size_beyond_the_mapping(shm_name):
    Region.create(shm_name, 1, ChannelConfig(1, 2, 4, 8))
    _forge(shm_name, 16, "<Q", 10**9)
    with pytest.raises(CorruptRegionError, match="total_size 1000000000 exceeds the mapped size"):
        Region.open(shm_name)


def test_identity_is_checked_when_both_are_stamped(shm_name):
    Region.create(shm_name, 1, ChannelConfig(1, 2, 4, 8, identity=5))
    Region.open(shm_name, expected_identity=5)
    Region.open(shm_name)  # 0: no expectation
    with pytest.raises(CorruptRegionError, match="Identity mismatch"):
        Region.open(shm_name, expected_identity=6)


def test_the_geometry_snapshot_ignores_later_header_writes(shm_name):
    region = Region.create(shm_name, 1, ChannelConfig(2, 4, 8, 32))
    _forge(shm_name, 64, "<Q", 10**12)  # pool_size, after the open
    assert region.geometry.pool_size == 8
    assert region.stats().pool_size == 8 and region.stats().pool_free == 8


def test_native_refuses_every_corruption_we_refuse_with_the_same_words(shm_name):
    """The wheel opens each corrupt copy and refuses it; our message begins
    with its words (then names the region, the field and the value)."""
    names = []
    for index, (offset, fmt, value, _) in enumerate(CORRUPTIONS):
        names.append(f"{shm_name}_{index}")
        Region.create(names[-1], 1, ChannelConfig(4, 8, 16, 256), "wire")
        _forge(names[-1], offset, fmt, value)
    code = r'''
out = []
for name in P["names"]:
    try:
        kickmsg.SharedRegion.open(name)
        out.append("opened")
    except RuntimeError as error:
        out.append(str(error))
done(out)
'''
    try:
        verdicts = run_native9(code, names=names)
        for name, verdict in zip(names, verdicts):
            with pytest.raises(CorruptRegionError) as caught:
                Region.open(name)
            assert verdict != "opened"
            assert str(caught.value).startswith(verdict), (str(caught.value), verdict)
    finally:
        for name in names:
            shm.unlink(name)


def test_create_replaces_and_keeps_old_mappings(shm_name):
    first = Region.create(shm_name, 1, ChannelConfig(1, 2, 4, 8))
    inode = os.stat("/dev/shm" + shm_name).st_ino
    Region.create(shm_name, 1, ChannelConfig(1, 2, 4, 8))
    assert os.stat("/dev/shm" + shm_name).st_ino != inode  # unlink + O_EXCL, never O_TRUNC
    assert first.info().version == 9  # the old mapping still reads
    assert os.stat("/dev/shm" + shm_name).st_mode & 0o777 == 0o600 & ~_umask()


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def test_create_or_open(shm_name):
    created = Region.create_or_open(shm_name, 1, ChannelConfig(2, 4, 8, 32), "me")
    opened = Region.create_or_open(shm_name, 1, ChannelConfig(2, 4, 8, 32), "other")
    assert opened.info().creator_name == "me" and opened.geometry == created.geometry
    with pytest.raises(RuntimeError, match="Config mismatch on existing region"):
        Region.create_or_open(shm_name, 1, ChannelConfig(2, 4, 8, 64))


def test_config_refusals():
    for args, message in [((3, 1, 1, 1, 1), "Unsupported channel type"), ((1, 1, 3, 1, 1), "power of 2"),
                          ((1, 1, 1, 2**24 - 1, 1), "MAX_POOL_SIZE"), ((1, 0, 1, 1, 1), "max_subscribers"),
                          ((1, 1, 1, 1, 0), "max_payload_size"), ((1, 1, 1, 0, 1), "pool_size")]:
        with pytest.raises(ValueError, match=message):
            Geometry.for_config(*args)


def test_native_publishes_and_subscribes_on_our_region(shm_name):
    """We create (B.1); the wheel opens it, joins, sends 40 messages through
    a 16-entry ring and receives each in order; both read the same stats."""
    Region.create(shm_name, 1, ChannelConfig(2, 16, 24, 64), "ours")
    code = r'''
region = kickmsg.SharedRegion.open(P["name"])
sub = kickmsg.Subscriber(region)
pub = kickmsg.Publisher(region)
got = []
for i in range(40):
    assert pub.send(b"m%d" % i) == len(b"m%d" % i)
    got.append(sub.try_receive().decode())
stats = region.stats()
done({"got": got, "lost": sub.lost, "creator": region.info().creator_name, "writes": stats.total_writes,
      "free": stats.pool_free, "live": stats.live_rings})
'''
    result = run_native9(code, name=shm_name)
    assert result["got"] == [f"m{i}" for i in range(40)]
    assert (result["lost"], result["creator"], result["writes"], result["live"]) == (0, "ours", 40, 1)
    stats = Region.open(shm_name).stats()
    assert stats.total_writes == 40 and stats.live_rings == 0  # the child left: its ring is Free again
    # the ring kept its last 16 claims until the leave drained them: the pool is whole
    assert stats.pool_free == 24 and result["free"] == 24 - 16


@pytest.mark.parametrize("mode", ["", "0640", "0666", "01640", "bogus", "017777"])
def test_file_modes_follow_kickmsg_shm_mode_as_the_wheel(shm_name, monkeypatch, mode, capfd):
    """Same variable, same umask: our object's mode equals the wheel's (A.12),
    and an invalid value warns alike."""
    monkeypatch.setenv("KICKMSG_SHM_MODE", mode)
    monkeypatch.setattr(layout, "_process_mode", None)  # read once per process: read it again here
    Region.create(shm_name, 1, ChannelConfig(1, 2, 4, 8))
    ours_warning = capfd.readouterr().err
    code = r'''
import tempfile
cfg = make_config({"max_subscribers": 1, "sub_ring_capacity": 2, "pool_size": 4, "max_payload_size": 8})
with tempfile.TemporaryFile() as err:
    saved = os.dup(2)
    os.dup2(err.fileno(), 2)  # the wheel warns on fd 2 from C++
    try:
        kickmsg.SharedRegion.create(P["name"], kickmsg.ChannelType.PubSub, cfg, "")
    finally:
        os.dup2(saved, 2)
    err.seek(0)
    warning = err.read().decode()
done([os.stat("/dev/shm" + P["name"]).st_mode & 0o7777, warning])
'''
    try:
        native_mode, native_warning = run_native9(code, name=shm_name + "_n")
        assert os.stat("/dev/shm" + shm_name).st_mode & 0o7777 == native_mode
        assert bool(ours_warning) == (mode in ("bogus", "017777"))
        assert native_warning.strip() == ours_warning.strip()
    finally:
        shm.unlink(shm_name + "_n")


def test_each_native_version_refuses_the_other_layout(shm_name):
    """A layout-9 region (ours) is refused by native 0.1.0; a layout-4
    region (our layout-4 code) is refused by native 0.9.2 and by our
    layout-9 open, each naming the version."""
    import kickmsg
    from nativepeer import run_native

    code = r'''
try:
    kickmsg.SharedRegion.open(P["name"])
    done("opened")
except Exception as error:
    done(type(error).__name__ + ": " + str(error))
'''
    Region.create(shm_name, 1, ChannelConfig(1, 2, 4, 8))
    assert run_native(code, name=shm_name) == "RuntimeError: Version mismatch"
    cfg = kickmsg.Config()
    cfg.max_subscribers, cfg.sub_ring_capacity, cfg.pool_size, cfg.max_payload_size = 1, 2, 4, 8
    kickmsg.SharedRegion.create(shm_name + "_4", kickmsg.ChannelType.PubSub, cfg, layout=4)
    try:
        assert run_native9(code, name=shm_name + "_4") == "RuntimeError: Region version mismatch"
        with pytest.raises(VersionMismatchError, match="version 4"):
            Region.open(shm_name + "_4")
    finally:
        shm.unlink(shm_name + "_4")


def test_create_or_open_gives_up_on_a_region_never_initialised(shm_name):
    """MAGIC zeroed (a creator died before storing it): about 200 polls of
    10 ms, then the 0.9.2 message, as a RuntimeError."""
    Region.create(shm_name, 1, ChannelConfig(1, 2, 4, 8))
    _forge(shm_name, 0, "<Q", 0)
    with pytest.raises(RuntimeError, match="Timed out waiting for region init: " + shm_name):
        Region.create_or_open(shm_name, 1, ChannelConfig(1, 2, 4, 8))
