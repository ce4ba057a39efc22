"""kickmsg.typed: numpy record channels with a type check on join.

Fingerprints are recomputed here from their documented text forms; zero-copy
is checked with ``np.shares_memory`` and pins with the independent
``rawregion`` reader.
"""
import gc
import mmap
import struct

import numpy as np
import pytest

from kickmsg import Config, Node, Publisher, SchemaInfo, SharedRegion
from kickmsg.hash import identity_from_fnv1a
from kickmsg import typed
from kickmsg.typed import RecordType, TypedPublisher, TypedSubscriber, TypeMismatchError
import rawregion

ALGO = 0x4B4D5459  # "KMTY"

IMU_FIELDS = [("stamp_ns", "<u8"), ("accel", "<f4", (3,))]
Imu = RecordType("Imu", IMU_FIELDS)

# Every test on layout 4 and layout 9 (the ``layout`` fixture), but those marked layout4_only.
pytestmark = pytest.mark.usefixtures("layout")


@pytest.fixture
def node(prefix):
    return Node("typed-test", prefix=prefix)


def refcounts(name: str) -> list:
    return rawregion.pool(rawregion.read_bytes(name)).refcounts


def padded(fields, offsets, itemsize):
    """A structured dtype with explicit offsets and itemsize."""
    formats = [field[1] if len(field) == 2 else (field[1], field[2]) for field in fields]
    return np.dtype({"names": [field[0] for field in fields], "formats": formats,
                     "offsets": offsets, "itemsize": itemsize})


# -- fingerprints -----------------------------------------------------------------


def test_fingerprints_follow_their_text_forms():
    assert Imu.dtype.itemsize == 20
    info = Imu.schema
    assert info.identity == identity_from_fnv1a("Imu{stamp_ns:<u8,accel:<f4[3]}")
    assert info.layout == identity_from_fnv1a("20{0+8,8+12}")
    assert info.name == "Imu:20{stamp_ns:<u8@0,accel:<f4[3]@8}"
    assert (info.identity_algo, info.layout_algo, info.version, info.flags) == (ALGO, ALGO, 0, 0)
    assert RecordType("Imu", IMU_FIELDS, version=5).schema.version == 5


def test_nested_and_subarray_fingerprints():
    pose = RecordType("Pose", [("pos", [("x", "<f8"), ("y", "<f8")]), ("cov", "<f4", (2, 3))])
    assert pose.schema.identity == identity_from_fnv1a("Pose{pos:{x:<f8,y:<f8},cov:<f4[2,3]}")
    assert pose.schema.layout == identity_from_fnv1a("40{0+16{0+8,8+8},16+24}")


def test_plain_dtype_fingerprints():
    temperature = RecordType("Temperature", "<f8")
    assert temperature.schema.identity == identity_from_fnv1a("Temperature:<f8")
    assert temperature.schema.layout == identity_from_fnv1a("8")


def same(a: RecordType, b: RecordType) -> tuple:
    """(identity equal, layout equal)."""
    return a.schema.identity == b.schema.identity, a.schema.layout == b.schema.layout


def test_an_equal_declaration_has_equal_fingerprints():
    again = RecordType("Imu", np.dtype([("stamp_ns", np.uint64), ("accel", np.float32, 3)]))
    assert same(Imu, again) == (True, True)
    assert again.schema == Imu.schema


@pytest.mark.parametrize(
    "other",
    [
        RecordType("Imu", [("stamp", "<u8"), ("accel", "<f4", (3,))]),  # field renamed
        RecordType("Imu", [("stamp_ns", "<i8"), ("accel", "<f4", (3,))]),  # kind, same size
        RecordType("Imu", [("stamp_ns", ">u8"), ("accel", "<f4", (3,))]),  # byte order
        RecordType("Gyro", IMU_FIELDS),  # type name
        RecordType("Imu", [("stamp_ns", "<u8"), ("accel", "<i4", (3,))]),  # subarray base kind
    ],
    ids=["renamed", "kind", "byteorder", "typename", "subarray-kind"],
)
def test_identity_changes_with_names_and_kinds_layout_does_not(other):
    assert same(Imu, other) == (False, True)


@pytest.mark.parametrize(
    "dtype",
    [
        padded(IMU_FIELDS, [0, 12], 24),  # accel moved
        padded(IMU_FIELDS, [0, 8], 24),  # tail padding only
    ],
    ids=["offset", "padding"],
)
def test_layout_changes_with_offsets_and_padding_identity_does_not(dtype):
    assert same(Imu, RecordType("Imu", dtype)) == (True, False)


def test_aligned_dtype_changes_only_the_layout():
    packed = RecordType("Flag", np.dtype([("on", "u1"), ("value", "<f8")]))
    aligned = RecordType("Flag", np.dtype([("on", "u1"), ("value", "<f8")], align=True))
    assert same(packed, aligned) == (True, False)


def test_adding_a_field_changes_both():
    assert same(Imu, RecordType("Imu", IMU_FIELDS + [("gyro", "<f4", (3,))])) == (False, False)


def test_version_changes_neither_fingerprint():
    other = RecordType("Imu", IMU_FIELDS, version=2)
    assert same(Imu, other) == (True, True)
    assert other.schema.version == 2


def test_record_type_refuses_object_and_empty_dtypes():
    with pytest.raises(ValueError, match="fixed-size"):
        RecordType("Bad", [("o", object)])
    with pytest.raises(ValueError, match="fixed-size"):
        RecordType("Empty", np.dtype([]))


def test_record_type_repr():
    assert repr(Imu) == "RecordType('Imu:20{stamp_ns:<u8@0,accel:<f4[3]@8}', version=0)"


# -- advertise, subscribe, receive ------------------------------------------------------


def test_advertise_bakes_the_schema_at_create(node, prefix):
    pub = typed.advertise(node, "imu", Imu)
    assert isinstance(pub, TypedPublisher)
    header = rawregion.header(rawregion.read_bytes(f"/{prefix}_imu"))
    assert header["schema_state"] == 2
    assert header["slot_data_size"] == 4080  # no cfg: as many whole records as fit in Config()'s 4096 bytes
    assert pub.publisher.region.schema() == Imu.schema
    assert node.topic_schema("imu") == Imu.schema


def test_advertise_keeps_the_callers_config(node, prefix):
    cfg = Config(max_payload_size=200, pool_size=32, sub_ring_capacity=16)
    typed.advertise(node, "imu", Imu, cfg)
    assert cfg.schema is None  # not modified
    header = rawregion.header(rawregion.read_bytes(f"/{prefix}_imu"))
    assert (header["slot_data_size"], header["pool_size"], header["sub_ring_capacity"]) == (200, 32, 16)


def test_send_and_receive_records(node):
    pub = typed.advertise(node, "imu", Imu, Config(max_payload_size=5 * 20))
    sub = typed.subscribe(Node("reader", prefix=node.prefix), "imu", Imu)
    assert pub.send((7, (1.0, 2.0, 3.0))) == 1
    batch = np.zeros(3, Imu.dtype)
    batch["stamp_ns"] = [10, 11, 12]
    batch["accel"][:, 2] = 9.81
    assert pub.send(batch) == 3
    first = sub.try_receive()
    assert first.dtype == Imu.dtype and first.shape == (1,)
    assert first["stamp_ns"][0] == 7 and first["accel"][0].tolist() == [1.0, 2.0, 3.0]
    second = sub.receive(5.0)
    assert second.tobytes() == batch.tobytes()
    assert sub.try_receive() is None
    assert sub.receive(0.001) is None


def test_received_records_are_zero_copy_and_read_only(node, prefix):
    """The subscriber's array lies over the very slot the publisher wrote
    in place, and cannot be written."""
    pub = typed.advertise(node, "imu", Imu, Config(max_payload_size=40, max_subscribers=1, sub_ring_capacity=2, pool_size=4))
    sub = typed.subscribe(node, "imu", Imu)
    slot = pub.allocate(2)
    written = slot.records
    written["stamp_ns"] = [1, 2]
    written["accel"] = [[0.5, 0.5, 0.5], [1.5, 1.5, 1.5]]
    assert slot.publish() == 1
    received = sub.try_receive()
    assert np.shares_memory(received, written)
    assert not received.flags.writeable and not received.flags.owndata
    with pytest.raises(ValueError):
        received["stamp_ns"][0] = 99
    assert received["stamp_ns"].tolist() == [1, 2]
    assert received["accel"][1].tolist() == [1.5, 1.5, 1.5]


def test_received_array_pins_its_slot(node, prefix):
    """The slot stays pinned while the array (or a slice of it) lives."""
    name = f"/{prefix}_imu"
    pub = typed.advertise(node, "imu", Imu, Config(max_payload_size=20, max_subscribers=1, sub_ring_capacity=2, pool_size=4))
    sub = typed.subscribe(node, "imu", Imu)
    pub.send((1, (0, 0, 0)))
    records = sub.try_receive()
    assert sorted(refcounts(name)) == [0, 0, 0, 2]  # the ring's reference + the array's pin
    stamps = records["stamp_ns"]
    del records
    gc.collect()
    assert sorted(refcounts(name)) == [0, 0, 0, 2]  # a view of the array holds it too
    assert stamps.tolist() == [1]
    del stamps
    gc.collect()
    assert sorted(refcounts(name)) == [0, 0, 0, 1]
    sub.close()
    rawregion.assert_pool_whole(name)


def test_allocate_too_many_records_returns_none(node):
    pub = typed.advertise(node, "imu", Imu, Config(max_payload_size=40))
    assert pub.allocate(3) is None
    assert pub.allocate(2) is not None


def test_empty_message_is_an_empty_array(node):
    pub = typed.advertise(node, "imu", Imu)
    sub = typed.subscribe(node, "imu", Imu)
    assert pub.send(np.zeros(0, Imu.dtype)) == 0
    records = sub.try_receive()
    assert records.shape == (0,) and records.dtype == Imu.dtype


def test_nested_and_subarray_records(node):
    pose = RecordType("Pose", [("pos", [("x", "<f8"), ("y", "<f8")]), ("cov", "<f4", (2, 3)), ("tag", "S4")])
    pub = typed.advertise(node, "pose", pose)
    sub = typed.subscribe(node, "pose", pose)
    record = np.zeros(1, pose.dtype)
    record["pos"]["x"], record["pos"]["y"] = 1.25, -2.5
    record["cov"] = np.arange(6, dtype="<f4").reshape(2, 3)
    record["tag"] = b"abcd"
    pub.send(record)
    received = sub.try_receive()
    assert received["pos"]["y"][0] == -2.5
    assert received["cov"][0].tolist() == [[0, 1, 2], [3, 4, 5]]
    assert received["tag"][0] == b"abcd"
    assert received.tobytes() == record.tobytes()


def test_plain_dtype_records(node):
    temperature = RecordType("Temperature", "<f8")
    pub = typed.advertise(node, "temp", temperature, Config(max_payload_size=24))
    sub = typed.subscribe(node, "temp", temperature)
    assert pub.send(np.array([20.5, 21.0, 21.5])) == 3
    assert pub.send(19.0) == 1
    assert sub.try_receive().tolist() == [20.5, 21.0, 21.5]
    assert sub.try_receive().tolist() == [19.0]


def test_subarray_dtype_records_written_in_place(node):
    """A record that is itself a subarray: allocate, fill, receive."""
    vector = RecordType("Vec3", ("<f4", (3,)))
    pub = typed.advertise(node, "vec", vector, Config(max_payload_size=24))
    sub = typed.subscribe(node, "vec", vector)
    slot = pub.allocate(2)
    slot.records[:] = [[1, 2, 3], [4, 5, 6]]
    slot.publish()
    assert sub.try_receive().tolist() == [[1, 2, 3], [4, 5, 6]]


def test_subarray_dtype_records_sent(node):
    vector = RecordType("Vec3", ("<f4", (3,)))
    pub = typed.advertise(node, "vec", vector, Config(max_payload_size=72))
    sub = typed.subscribe(node, "vec", vector)
    assert pub.send(np.array([[1, 2, 3], [4, 5, 6]], dtype="<f4")) == 2
    assert sub.try_receive().tolist() == [[1, 2, 3], [4, 5, 6]]


def test_typed_subscriber_counts_lost_and_closes(node, prefix):
    pub = typed.advertise(node, "imu", Imu, Config(sub_ring_capacity=4, max_payload_size=20, pool_size=16))
    with typed.subscribe(node, "imu", Imu) as sub:
        for index in range(10):
            pub.send((index, (0, 0, 0)))
        stamps = []
        while (records := sub.try_receive()) is not None:
            stamps.append(int(records["stamp_ns"][0]))
        assert stamps == [6, 7, 8, 9]
        assert sub.lost == 6
    rawregion.assert_pool_whole(f"/{prefix}_imu")


# -- type checks on join ------------------------------------------------------------------

MISMATCHES = {
    "renamed": (
        RecordType("Imu", [("stamp", "<u8"), ("accel", "<f4", (3,))]),
        ["field 'stamp_ns' (<u8) is only in the channel's type", "field 'stamp' (<u8) is not in the channel's type"],
    ),
    "kind": (
        RecordType("Imu", [("stamp_ns", "<i8"), ("accel", "<f4", (3,))]),
        ["field 'stamp_ns': <i8 here, <u8 in the channel"],
    ),
    "offset": (
        RecordType("Imu", padded(IMU_FIELDS, [0, 12], 24)),
        ["field 'accel': offset 12 here, 8 in the channel", "itemsize: 24 here, 20 in the channel"],
    ),
    "extra": (
        RecordType("Imu", IMU_FIELDS + [("gyro", "<f4", (3,))]),
        ["field 'gyro' (<f4[3]) is not in the channel's type", "itemsize: 32 here, 20 in the channel"],
    ),
    "missing": (
        RecordType("Imu", [("stamp_ns", "<u8")]),
        ["field 'accel' (<f4[3]) is only in the channel's type", "itemsize: 8 here, 20 in the channel"],
    ),
    "typename": (RecordType("Gyro", IMU_FIELDS), ["type name: 'Gyro' here, 'Imu' in the channel"]),
    "version": (RecordType("Imu", IMU_FIELDS, version=3), ["version: 3 here, 0 in the channel"]),
}


@pytest.mark.parametrize("case", MISMATCHES)
def test_mismatching_subscriber_is_refused_with_every_difference(node, prefix, case):
    other, expected = MISMATCHES[case]
    typed.advertise(node, "imu", Imu, Config(max_payload_size=64))
    with pytest.raises(TypeMismatchError) as error:
        typed.subscribe(Node("reader", prefix=prefix), "imu", other)
    message = str(error.value)
    assert f"/{prefix}_imu" in message
    assert Imu.description in message and other.description in message
    for line in expected:
        assert line in message, f"{line!r} missing from:\n{message}"
    assert len(message.splitlines()) == 1 + len(expected)  # nothing else reported
    assert isinstance(error.value, RuntimeError)


def test_mismatching_publisher_is_refused(node, prefix):
    typed.advertise(node, "imu", Imu)
    region = SharedRegion.open(f"/{prefix}_imu")
    with pytest.raises(TypeMismatchError, match="type name"):
        TypedPublisher(Publisher(region), RecordType("Gyro", IMU_FIELDS))
    assert region.schema() == Imu.schema  # unchanged


def test_same_type_joins(node, prefix):
    typed.advertise(node, "imu", Imu)
    TypedSubscriber(Node("r", prefix=prefix).subscribe("imu"), RecordType("Imu", IMU_FIELDS))
    TypedPublisher(Publisher(SharedRegion.open(f"/{prefix}_imu")), Imu)


def test_late_publisher_claims_the_schema(node, prefix):
    """A typed publisher on a region without a schema claims it; later
    joiners are checked against it."""
    plain = node.advertise("imu", Config(max_payload_size=64))
    assert node.topic_schema("imu") is None
    pub = TypedPublisher(plain, Imu)
    assert node.topic_schema("imu") == Imu.schema
    assert rawregion.header(rawregion.read_bytes(f"/{prefix}_imu"))["schema_state"] == 2
    sub = typed.subscribe(Node("reader", prefix=prefix), "imu", Imu)
    pub.send((3, (1, 1, 1)))
    assert sub.try_receive()["stamp_ns"].tolist() == [3]
    with pytest.raises(TypeMismatchError):
        typed.subscribe(Node("other", prefix=prefix), "imu", RecordType("Gyro", IMU_FIELDS))


def test_late_subscriber_claims_the_schema(node):
    node.advertise("imu", Config(max_payload_size=64))
    typed.subscribe(node, "imu", Imu)
    assert node.topic_schema("imu") == Imu.schema
    with pytest.raises(TypeMismatchError):
        TypedPublisher(node.advertise_or_join("imu", Config(max_payload_size=64)), RecordType("Gyro", IMU_FIELDS))


def test_channel_with_a_foreign_schema_is_refused(node):
    """An untyped channel whose descriptor someone else set."""
    foreign = SchemaInfo(name="ros::Imu", identity=b"\x01" * 64, layout=b"\x02" * 64, identity_algo=1)
    node.advertise("imu", Config(max_payload_size=64, schema=foreign))
    with pytest.raises(TypeMismatchError, match="was not made by kickmsg.typed") as error:
        typed.subscribe(node, "imu", Imu)
    assert "ros::Imu" in str(error.value)
    assert node.topic_schema("imu") == foreign  # left alone


def test_stuck_schema_claim_is_reported(node, prefix):
    """A descriptor left at Claiming: the join fails with a clear message."""
    node.advertise("imu", Config(max_payload_size=64))
    with open(f"/dev/shm/{prefix}_imu", "r+b") as file, mmap.mmap(file.fileno(), 0) as memory:
        struct.pack_into("<I", memory, 192, 1)
    with pytest.raises(TypeMismatchError, match="never finished"):
        typed.subscribe(node, "imu", Imu)


def test_records_larger_than_the_payload_are_refused(node, prefix):
    with pytest.raises(TypeMismatchError, match="more than max_payload_size 16"):
        typed.advertise(node, "imu", Imu, Config(max_payload_size=16))
    node.advertise("small", Config(max_payload_size=16))
    with pytest.raises(TypeMismatchError, match="one Imu record is 20 bytes"):
        typed.subscribe(Node("r", prefix=prefix), "small", Imu)
    assert node.topic_schema("small") is None  # not claimed


def test_message_that_is_not_whole_records_is_refused(node, prefix):
    """A plain publisher sends 7 bytes on a 20-byte record channel: that
    receive raises, the slot is not left pinned, and the next message is
    received normally."""
    name = f"/{prefix}_imu"
    pub = typed.advertise(node, "imu", Imu, Config(max_payload_size=40, max_subscribers=1, sub_ring_capacity=2, pool_size=4))
    sub = typed.subscribe(node, "imu", Imu)
    Publisher(pub.publisher.region).send(b"7 bytes")
    pub.send((5, (0, 0, 0)))
    with pytest.raises(TypeMismatchError, match="a message of 7 bytes is not a whole number of 20-byte Imu records"):
        sub.try_receive()
    assert max(refcounts(name)) == 1  # no pin left behind
    assert sub.try_receive()["stamp_ns"].tolist() == [5]
    sub.close()
    rawregion.assert_pool_whole(name)


# -- what the mismatch report should say, and does not yet -------------------------------------


def test_type_name_with_colons_reports_only_real_differences():
    ours = RecordType("ns::Imu", IMU_FIELDS, version=1)
    theirs = RecordType("ns::Imu", IMU_FIELDS, version=2)
    assert ours.differences(theirs.schema) == ["version: 1 here, 2 in the channel"]


def test_long_description_does_not_report_fields_after_the_cut_as_missing():
    ours = RecordType("T", [(f"f{index:02}", "<f4") for index in range(20)])
    theirs = RecordType("T", [(f"f{index:02}", "<f4") for index in range(19)] + [("f19", "<i4")])
    assert len(theirs.schema.name.encode()) == 127  # cut
    report = "\n".join(ours.differences(theirs.schema))
    assert "is not in the channel's type" not in report
    assert "here,  in the channel" not in report


def test_plain_dtype_kind_mismatch_names_the_kinds():
    ours, theirs = RecordType("Temperature", "<f8"), RecordType("Temperature", "<i8")
    report = "\n".join(ours.differences(theirs.schema))
    assert "<f8" in report and "<i8" in report


def test_message_that_is_not_whole_records_reports_its_length(node):
    pub = typed.advertise(node, "imu", Imu, Config(max_payload_size=40))
    sub = typed.subscribe(node, "imu", Imu)
    Publisher(pub.publisher.region).send(b"7 bytes")
    with pytest.raises(TypeMismatchError, match="a message of 7 bytes"):
        sub.try_receive()


def test_refused_subscriber_does_not_hold_a_ring(node, prefix):
    """While handling the refusal, a subscriber with the right type can
    take the channel's only ring."""
    typed.advertise(node, "imu", Imu, Config(max_subscribers=1, max_payload_size=20))
    try:
        typed.subscribe(node, "imu", RecordType("Gyro", IMU_FIELDS))
    except TypeMismatchError:
        typed.subscribe(node, "imu", Imu).close()
    else:
        pytest.fail("the wrong type was accepted")
