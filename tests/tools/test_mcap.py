"""MCAP recordings: `kickmsg record --format mcap`, `kickmsg convert`, `kickmsg play FILE.mcap`.

Files are read back with the mcap library's own reader, CRCs checked."""
import base64
import json
import math
import os
import pathlib
import signal
import subprocess
import sys
import threading
import time

import numpy as np
import pyarrow.parquet
import pytest
from mcap.reader import NonSeekingReader, make_reader
from mcap.writer import Writer

import kickmsg
from conftest import on_layout4
from kickmsg import typed
from kickmsg.recording import stamp
from kickmsg.recording.mcap import channel_record_type, decode_records, encode_records
from kickmsg.recording.record import Recorder
from nativepeer import subscriber_joined
from test_record import drained, messages_on_disk, receiving_after, record_while, wait_until

PYTHON = sys.executable
ROOT = pathlib.Path(__file__).resolve().parents[2]
KICKMSG = [PYTHON, "-m", "kickmsg"]
CONFIG = kickmsg.Config(max_subscribers=4, sub_ring_capacity=1024, pool_size=4096, max_payload_size=256)
IMU_FIELDS = [stamp.FIELD, ("x", "<f4"), ("v", "<f4", (3,)), ("ok", "?"), ("tag", "S4")]
IMU = typed.RecordType("Imu", IMU_FIELDS)
PUBLISHER = f"""
import json, sys
import numpy as np
import kickmsg
from kickmsg import typed
from kickmsg.recording import stamp
plain_name, imu_name, count = sys.argv[1], sys.argv[2], int(sys.argv[3])
imu_type = typed.RecordType("Imu", {IMU_FIELDS!r})
plain = kickmsg.Publisher(kickmsg.SharedRegion.open(plain_name))
imu = typed.TypedPublisher(kickmsg.Publisher(kickmsg.SharedRegion.open(imu_name)), imu_type)
sent = {{"plain": [], "imu": []}}
for i in range(count):
    payload = stamp.stamped(b"m%d" % i * (1 + i % 4))
    plain.send(payload)
    record = np.array([(stamp.now(), i / 10, (i, -i, 0.1), i % 2 == 0, b"t%d" % i)], dtype=imu_type.dtype)
    imu.send(record)
    sent["plain"].append(payload.hex())
    sent["imu"].append(record.tobytes().hex())
print(json.dumps(sent))
"""


@pytest.fixture
def channels(shm_name):
    """An untyped PubSub channel and a typed (Imu) Broadcast one."""
    names = [shm_name + "_plain", shm_name + "_imu"]
    kickmsg.SharedRegion.create(names[0], kickmsg.ChannelType.PubSub, CONFIG, "test")
    typed_config = kickmsg.Config(max_subscribers=4, sub_ring_capacity=1024, pool_size=4096, max_payload_size=128,
                                  schema=IMU.schema)
    kickmsg.SharedRegion.create(names[1], kickmsg.ChannelType.Broadcast, typed_config, "test")
    yield names
    for name in names:
        kickmsg.unlink_shm(name)


def wait_for_subscriber(names, process):
    """Until the recorder process has joined every channel (or ended)."""
    wait_until(lambda: all(subscriber_joined(name) for name in names) or process.poll() is not None,
               "the recorder subscribing")
    assert process.poll() is None, process.stderr.read()


def wait_for_recorder(names, recorder):
    """Until the recorder in this process has joined every channel (its
    subscriber made: the join is over, so it gets every message from now on)."""
    wait_until(lambda: all(name in recorder.summary.channels for name in names), "the recorder subscribing")


def read_mcap(path):
    """Every message (in log-time order), the summary and the metadata, read
    with CRCs checked; the data section's CRC is checked by a linear pass."""
    with open(path, "rb") as file:
        reader = make_reader(file, validate_crcs=True)
        summary = reader.get_summary()
        messages = [(channel.topic, message, json.loads(message.data)) for _, channel, message in reader.iter_messages()]
        metadata = [(record.name, {k: v if k in ("recording", "host", "channel") else json.loads(v)
                                   for k, v in record.metadata.items()}) for record in reader.iter_metadata()]
    with open(path, "rb") as file:
        records = list(NonSeekingReader(file, validate_crcs=True)._stream_reader.records)
    assert type(records[-1]).__name__ == "Footer"
    [data_end] = [record for record in records if type(record).__name__ == "DataEnd"]
    assert data_end.data_section_crc != 0  # written, and checked by the pass above
    return messages, summary, metadata


def run_cli(*args, timeout=60):
    return subprocess.run(KICKMSG + [str(arg) for arg in args], capture_output=True, text=True, timeout=timeout)


def assert_one_line_error(result, *fragments):
    assert result.returncode == 2, result.stderr
    assert result.stderr.count("\n") == 1 and "Traceback" not in result.stderr, result.stderr
    for fragment in fragments:
        assert fragment in result.stderr


@pytest.mark.parametrize("signal_number", [signal.SIGINT, signal.SIGTERM])
@on_layout4
def test_record_mcap_from_a_publisher_process(channels, tmp_path, signal_number):
    """`kickmsg record --format mcap` (a process) records what a publisher
    process sends; stopped by a signal, it leaves a complete, valid file in
    which the mcap reader finds every message with its fields."""
    plain, imu = channels
    recorder = subprocess.Popen(KICKMSG + ["record", plain, imu, "--out", str(tmp_path), "--format", "mcap"],
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        wait_for_subscriber(channels, recorder)
        wall_before = time.time_ns()
        publisher = subprocess.run([PYTHON, "-c", PUBLISHER, plain, imu, "120"], capture_output=True, text=True,
                                   timeout=60)
        assert publisher.returncode == 0, publisher.stderr
        wait_until(lambda: drained(channels, recorder.pid), "the recorder reading every message")
        wall_after = time.time_ns()
        recorder.send_signal(signal_number)
        out, err = recorder.communicate(timeout=30)
    finally:
        recorder.kill()
    assert recorder.returncode == 0, err
    assert f"{plain}: 120 messages" in out and f"{imu}: 120 messages" in out
    sent = json.loads(publisher.stdout)
    files = list(tmp_path.iterdir())
    assert len(files) == 1 and files[0].name.endswith(".mcap")
    messages, summary, metadata = read_mcap(files[0])

    assert summary.statistics.message_count == 240 and len(summary.channels) == 2 and len(summary.schemas) == 2
    topics = {channel.id: channel.topic for channel in summary.channels.values()}
    assert {topics[i]: n for i, n in summary.statistics.channel_message_counts.items()} == {plain: 120, imu: 120}
    schemas = {channel.topic: summary.schemas[channel.schema_id] for channel in summary.channels.values()}
    assert all(schema.encoding == "jsonschema" for schema in schemas.values())
    assert all(channel.message_encoding == "json" for channel in summary.channels.values())
    assert json.loads(schemas[plain].data)["properties"]["payload"]["contentEncoding"] == "base64"
    assert schemas[imu].name == "Imu" and set(json.loads(schemas[imu].data)["properties"]) >= {"stamp_ns", "x", "v", "ok"}

    plain_messages = [(m, data) for topic, m, data in messages if topic == plain]
    assert [base64.b64decode(data["payload"]) for _, data in plain_messages] == [bytes.fromhex(p) for p in sent["plain"]]
    imu_messages = [(m, data) for topic, m, data in messages if topic == imu]
    for (message, data), payload in zip(imu_messages, sent["imu"], strict=True):
        record = np.frombuffer(bytes.fromhex(payload), dtype=IMU.dtype)[0]
        assert data == {"stamp_ns": int(record["stamp_ns"]), "x": float(record["x"]), "v": [float(v) for v in record["v"]],
                        "ok": bool(record["ok"]), "tag": base64.b64encode(bytes(record["tag"]).ljust(4, b"\0")).decode()}
    for pairs in (plain_messages, imu_messages):
        assert [m.sequence for m, _ in pairs] == list(range(120))  # ring positions
        assert all(wall_before <= m.log_time <= wall_after for m, _ in pairs)  # receive time, wall clock
        # stamped payloads: publish_time is the stamp moved to the wall clock, before the receipt
        assert all(wall_before <= m.publish_time <= m.log_time for m, _ in pairs)

    found = {}
    for name, values in metadata:
        found.setdefault(name, {})[values.get("channel")] = values
    assert found["kickmsg.channel"][plain]["sub_ring_capacity"] == 1024
    assert found["kickmsg.channel"][imu]["channel_type"] == 2
    assert found["kickmsg.channel"][imu]["schema"]["name"] == IMU.description
    assert found["kickmsg.channel"][plain]["schema"] is None
    assert {name: (v["messages"], v["lost"], v["before"]) for name, v in found["kickmsg.losses"].items()} == {
        plain: (120, 0, []), imu: (120, 0, [])}
    [recording] = found["kickmsg.recording"].values()
    assert files[0].name.startswith(recording["recording"])


def test_recorder_losses_are_in_the_mcap_metadata(shm_name, tmp_path):
    """A burst larger than the ring before the recorder reads: the messages it
    missed are in kickmsg.losses, at the ring position after the gap."""
    region = kickmsg.SharedRegion.create(shm_name, kickmsg.ChannelType.PubSub,
                                         kickmsg.Config(max_subscribers=2, sub_ring_capacity=8, pool_size=64), "test")
    recorder = Recorder([shm_name], str(tmp_path), format="mcap")
    published = threading.Event()
    recorder._receive = receiving_after(published, recorder._receive)  # the receiving thread starts late
    stop = threading.Event()
    thread = threading.Thread(target=recorder.run, kwargs={"stop": stop}, daemon=True)
    thread.start()
    wait_for_recorder([shm_name], recorder)
    publisher = kickmsg.Publisher(region)
    for i in range(100):
        publisher.send(b"l%d" % i)
    published.set()
    counts = recorder.summary.channels[shm_name]
    wait_until(lambda: counts.messages + counts.lost == 100, "the recorder reading the ring")
    stop.set()
    thread.join(timeout=30)
    [file] = tmp_path.iterdir()
    messages, summary, metadata = read_mcap(file)
    assert [base64.b64decode(data["payload"]) for _, _, data in messages] == [b"l%d" % i for i in range(92, 100)]
    assert [m.sequence for _, m, _ in messages] == list(range(92, 100))
    assert [m.publish_time == m.log_time for _, m, _ in messages] == [True] * 8  # not stamped
    [losses] = [values for name, values in metadata if name == "kickmsg.losses"]
    assert losses == {"channel": shm_name, "messages": 8, "lost": 92, "before": [[92, 92]], "rejoins": []}


@on_layout4
def test_convert_a_parquet_recording(channels, tmp_path):
    """Every Parquet row becomes a message: log_time = recv_wall_ns,
    publish_time = the stamp on the wall clock, sequence = ring_pos."""
    plain, imu = channels
    recorder = Recorder(channels, str(tmp_path / "rec"))
    stop = threading.Event()
    thread = threading.Thread(target=recorder.run, kwargs={"stop": stop}, daemon=True)
    thread.start()
    wait_for_recorder(channels, recorder)
    publisher = subprocess.run([PYTHON, "-c", PUBLISHER, plain, imu, "50"], capture_output=True, text=True, timeout=60)
    assert publisher.returncode == 0, publisher.stderr
    wait_until(lambda: drained(channels, os.getpid()), "the recorder reading every message")
    stop.set()
    thread.join(timeout=30)
    result = run_cli("convert", tmp_path / "rec", tmp_path / "rec.mcap", "--json")
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout) == {"out": str(tmp_path / "rec.mcap"), "messages": 100, "channels": sorted(channels)}
    rows = pyarrow.parquet.read_table(tmp_path / "rec").sort_by("recv_wall_ns").to_pylist()
    messages, summary, metadata = read_mcap(tmp_path / "rec.mcap")
    assert summary.statistics.message_count == len(rows) == 100
    by_key = {(topic, m.sequence): m for topic, m, _ in messages}
    for row in rows:
        message = by_key[(row["channel"], row["ring_pos"])]
        assert message.log_time == row["recv_wall_ns"]
        assert message.publish_time == row["recv_wall_ns"] - (row["recv_mono_ns"] - row["stamp_ns"])
    plain_payloads = [base64.b64decode(data["payload"]) for topic, _, data in messages if topic == plain]
    assert plain_payloads == [bytes.fromhex(p) for p in json.loads(publisher.stdout)["plain"]]
    imu_fields = [data for topic, _, data in messages if topic == imu]
    assert [data["x"] for data in imu_fields] == [float(np.float32(i / 10)) for i in range(50)]
    assert any(name == "kickmsg.recording" and values["recording"] == rows[0]["recording"] for name, values in metadata)


def test_convert_refuses_an_existing_file_unless_forced(channels, tmp_path):
    record = tmp_path / "rec"
    record_three_parquet_messages(channels, record)
    out = tmp_path / "out.mcap"
    out.write_bytes(b"keep me")
    assert_one_line_error(run_cli("convert", record, out), str(out), "exists", "--force")
    assert out.read_bytes() == b"keep me"
    result = run_cli("convert", record, out, "--force")
    assert result.returncode == 0, result.stderr
    assert read_mcap(out)[1].statistics.message_count == 3
    assert [path.name for path in tmp_path.iterdir() if path.name.startswith("out")] == ["out.mcap"]
    assert_one_line_error(run_cli("convert", record, tmp_path), "is a directory")
    assert_one_line_error(run_cli("convert", tmp_path / "nothing", tmp_path / "new.mcap"), "no such file or directory")
    assert not (tmp_path / "new.mcap").exists()


def test_convert_refuses_its_own_input_an_mcap_input_and_a_missing_directory(channels, tmp_path):
    """Careless conversions: onto the recording itself (even with --force:
    it would be lost), from MCAP, into a directory that does not exist:
    one line naming the file, nothing written, the recording intact."""
    record = tmp_path / "rec"
    record_three_parquet_messages(channels, record)
    [parquet] = record.iterdir()
    before = parquet.read_bytes()
    for force in ([], ["--force"]):
        assert_one_line_error(run_cli("convert", parquet, parquet, *force), str(parquet), "part of the recording being converted")
        assert_one_line_error(run_cli("convert", record, parquet, *force), "part of the recording being converted")
    assert parquet.read_bytes() == before and list(record.iterdir()) == [parquet]
    assert_one_line_error(run_cli("convert", record, tmp_path / "no" / "dir" / "out.mcap"),
                          f"cannot write {tmp_path / 'no' / 'dir' / 'out.mcap'}: no directory {tmp_path / 'no' / 'dir'}")
    assert not (tmp_path / "no").exists()
    assert run_cli("convert", record, tmp_path / "out.mcap").returncode == 0
    assert_one_line_error(run_cli("convert", tmp_path / "out.mcap", tmp_path / "again.mcap"),
                          f"{tmp_path / 'out.mcap'} is MCAP already")
    assert not (tmp_path / "again.mcap").exists()


def record_three_parquet_messages(channels, out):
    def publish():
        publisher = kickmsg.Publisher(kickmsg.SharedRegion.open(channels[0]))
        for i in range(3):
            publisher.send(b"p%d" % i)

    record_while(channels, out, publish)


def test_convert_refuses_a_recording_without_payloads(channels, tmp_path):
    recorder = Recorder(channels, str(tmp_path / "rec"), payload=False)
    stop = threading.Event()
    thread = threading.Thread(target=recorder.run, kwargs={"stop": stop}, daemon=True)
    thread.start()
    wait_for_recorder(channels, recorder)
    kickmsg.Publisher(kickmsg.SharedRegion.open(channels[0])).send(b"q")
    wait_until(lambda: recorder.summary.channels[channels[0]].messages == 1, "the recorder reading the message")
    stop.set()
    thread.join(timeout=30)
    assert_one_line_error(run_cli("convert", tmp_path / "rec", tmp_path / "o.mcap"), "without payloads")
    assert not (tmp_path / "o.mcap").exists() and not (tmp_path / "o.mcap.partial").exists()


def test_play_an_mcap_recording_into_a_channel(layout, channels, tmp_path):  # layout first: it makes the channels'
    """Record to MCAP, then `kickmsg play FILE.mcap` republishes the same
    bytes, in order, on each channel (the typed one rebuilt from its fields)."""
    plain, imu = channels
    assert kickmsg.SharedRegion.open(plain).layout == layout
    sent = {}

    def publish():
        done = subprocess.run([PYTHON, "-c", PUBLISHER, plain, imu, "40"], capture_output=True, text=True, timeout=60)
        assert done.returncode == 0, done.stderr
        sent.update(json.loads(done.stdout))

    summary = record_while(channels, tmp_path, publish, format="mcap")
    [file] = summary.files
    listeners = [kickmsg.Subscriber(kickmsg.SharedRegion.open(name)) for name in channels]
    result = run_cli("play", file, "--rate", "20", "--json")
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout) == {"messages": 80, "dropped": 0, "channels": sorted(channels)}
    assert [bytes(m) for m in listeners[0]] == [bytes.fromhex(p) for p in sent["plain"]]
    assert [bytes(m) for m in listeners[1]] == [bytes.fromhex(p) for p in sent["imu"]]
    for listener in listeners:
        listener.close()


def test_play_creates_missing_channels_from_the_mcap_metadata(layout, channels, tmp_path, monkeypatch):  # layout first
    """Of the layout recorded (whatever KICKMSG_LAYOUT says), or of --layout's."""
    summary = record_while(channels, tmp_path, lambda: kickmsg.Publisher(kickmsg.SharedRegion.open(channels[1])).send(
        np.zeros(1, IMU.dtype).tobytes()), format="mcap")
    other = 13 - layout  # 4 <-> 9
    monkeypatch.setenv("KICKMSG_LAYOUT", str(other))
    for chosen, expected in (([], layout), (["--layout", str(other)], other)):
        for name in channels:
            kickmsg.unlink_shm(name)
        result = run_cli("play", tmp_path, *chosen)  # the directory of the .mcap file
        assert result.returncode == 0, result.stderr
        recreated = kickmsg.SharedRegion.inspect(channels[1])
        assert recreated.layout == expected and recreated.channel_type is kickmsg.ChannelType.Broadcast
        assert recreated.geometry.slot_data_size == 128 and recreated.schema() == IMU.schema
    assert len(summary.files) == 1


def test_typed_round_trip_every_kind_of_field(shm_name, tmp_path):
    """Nested structs, 2-d arrays, bytes, text, bools, NaN and infinities,
    several records in one message and a partial record: record to MCAP,
    play back, the same bytes arrive."""
    point = [("x", "<f8"), ("y", "<f8")]
    kind = typed.RecordType("Everything", [stamp.FIELD, ("p", point), ("m", "<f4", (2, 3)), ("n", "<i2"), ("u", "<u8"),
                                           ("flag", "?"), ("raw", "S3"), ("text", "<U5")])
    config = kickmsg.Config(max_subscribers=4, sub_ring_capacity=64, pool_size=256, max_payload_size=1024,
                            schema=kind.schema)
    region = kickmsg.SharedRegion.create(shm_name, kickmsg.ChannelType.PubSub, config, "test")
    one = np.zeros(1, kind.dtype)
    one[0] = (stamp.now(), (math.nan, -math.inf), [[0.1, 1e-30, math.inf], [-0.0, 3.5, 7]], -5, 2**64 - 1, True,
              b"a\0b", "héllo")
    three = np.zeros(3, kind.dtype)
    three["n"] = [1, 2, 3]
    three["raw"] = [b"xyz", b"", b"\0\0z"]
    payloads = [one.tobytes(), three.tobytes(), b"\x01\x02\x03"]
    for payload in payloads:  # the mapping itself: fields, _records, _payload
        assert decode_records(json.loads(json.dumps(encode_records(payload, kind))), kind) == payload
    assert set(encode_records(payloads[1], kind)) == {"_records"} and set(encode_records(payloads[2], kind)) == {"_payload"}
    padded = typed.RecordType("Padded", {"names": ["a", "b"], "formats": ["u1", "<u4"], "offsets": [0, 4], "itemsize": 8})
    with_padding = bytes([7, 0xAA, 0xBB, 0xCC, 1, 0, 0, 0])
    assert decode_records(encode_records(with_padding, padded), padded) == bytes([7, 0, 0, 0, 1, 0, 0, 0])

    def publish():
        publisher = kickmsg.Publisher(region)
        for payload in payloads:
            publisher.send(payload)

    summary = record_while([shm_name], tmp_path, publish, format="mcap")
    messages, _, _ = read_mcap(summary.files[0])
    first = messages[0][2]
    assert first["p"] == {"x": "NaN", "y": "-Infinity"} and first["m"][0][2] == "Infinity" and first["u"] == 2**64 - 1
    assert first["text"] == "héllo" and base64.b64decode(first["raw"]) == b"a\0b"
    listener = kickmsg.Subscriber(region)
    result = run_cli("play", summary.files[0], "--rate", "20")
    assert result.returncode == 0, result.stderr
    assert [bytes(m) for m in listener] == payloads
    listener.close()


def test_hostile_files_are_refused_in_one_line(channels, tmp_path):
    """A foreign MCAP file, a truncated one, a damaged chunk, garbage after
    the magic: `kickmsg play` says what is wrong, with no traceback."""
    foreign = tmp_path / "foreign.mcap"
    with open(foreign, "wb") as file:
        writer = Writer(file)
        writer.start()
        schema = writer.register_schema("Other", "jsonschema", b"{}")
        channel = writer.register_channel("/other", "json", schema)
        writer.add_message(channel, log_time=1, data=b"{}", publish_time=1)
        writer.finish()
    assert_one_line_error(run_cli("play", foreign), "not a kickmsg recording")
    for name, content in (("text.mcap", b"not a recording\n"), ("empty.mcap", b""), ("short.parquet", b"PAR")):
        (tmp_path / name).write_bytes(content)
        assert_one_line_error(run_cli("play", tmp_path / name), f"{tmp_path / name} is not a recording: neither a Parquet nor an MCAP file")
    other = tmp_path / "other.parquet"  # a Parquet file, with a payload column, of another program
    pyarrow.parquet.write_table(pyarrow.table({"payload": [b"x"]}), other)
    assert_one_line_error(run_cli("play", other), f"{other} is not a kickmsg recording")

    summary = record_while(channels, tmp_path / "rec", lambda: [
        kickmsg.Publisher(kickmsg.SharedRegion.open(channels[0])).send(b"z%d" % i * 40) for i in range(200)], format="mcap",
        flush_interval=1e6)  # one chunk, however slowly the machine runs
    data = pathlib.Path(summary.files[0]).read_bytes()
    truncated = tmp_path / "truncated.mcap"
    truncated.write_bytes(data[: len(data) // 2])
    assert_one_line_error(run_cli("play", truncated), str(truncated), "not a readable MCAP file")
    garbage = tmp_path / "garbage.mcap"
    garbage.write_bytes(data[:8] + bytes(range(256)) * 8)
    assert_one_line_error(run_cli("play", garbage), "not a readable MCAP file")
    with open(summary.files[0], "rb") as file:
        [chunk] = make_reader(file).get_summary().chunk_indexes
    damaged = bytearray(data)
    damaged[chunk.chunk_start_offset + chunk.chunk_length - 10] ^= 0xFF  # inside the compressed messages
    (tmp_path / "damaged.mcap").write_bytes(damaged)
    listener = kickmsg.Subscriber(kickmsg.SharedRegion.open(channels[0]))
    assert_one_line_error(run_cli("play", tmp_path / "damaged.mcap"), "not a readable MCAP file")
    assert listener.try_receive() is None  # the whole chunk was refused
    listener.close()


def test_record_mcap_refuses_no_payload(channels, tmp_path):
    result = run_cli("record", channels[0], "--out", tmp_path, "--format", "mcap", "--no-payload")
    assert_one_line_error(result, "MCAP recording needs the payloads")
    assert list(tmp_path.iterdir()) == []


def test_without_the_mcap_extra_one_line_names_it(channels, tmp_path):
    """A directory first on PYTHONPATH holds an ``mcap.py`` that raises what
    Python raises for a module that is not installed."""
    shadows = tmp_path / "shadows"
    shadows.mkdir()
    (shadows / "mcap.py").write_text("raise ModuleNotFoundError(\"No module named 'mcap'\", name='mcap')\n")
    env = dict(os.environ, PYTHONPATH=f"{shadows}{os.pathsep}{ROOT}")
    extra = "pip install 'kickmsg-py[mcap]'"

    def cli(*args):
        return subprocess.run(KICKMSG + [str(arg) for arg in args], env=env, capture_output=True, text=True, timeout=60)

    assert_one_line_error(cli("record", channels[0], "--out", tmp_path / "rec", "--format", "mcap"), "mcap", extra)
    assert not (tmp_path / "rec").exists()
    (tmp_path / "a.mcap").write_bytes(b"\x89MCAP0\r\n")
    assert_one_line_error(cli("play", tmp_path / "a.mcap"), extra)
    assert_one_line_error(cli("convert", tmp_path, tmp_path / "b.mcap"), extra)


def test_record_types_without_a_json_form_are_recorded_as_payloads():
    def described(fields):
        schema = typed.RecordType("T", fields).schema
        return {"schema": {"identity": schema.identity.hex(), "layout": schema.layout.hex(), "name": schema.name,
                           "version": 0, "identity_algo": schema.identity_algo, "layout_algo": schema.layout_algo,
                           "flags": 0}}

    assert channel_record_type(described([("x", "<f4"), ("n", "<i8")])).name == "T"
    assert channel_record_type(described([("x", "<f4"), ("z", "<c8")])) is None
    assert channel_record_type(described([("x", "<f4"), ("_records", "<i4")])) is None
    assert channel_record_type({"schema": None}) is None


def test_mcap_files_rotate_by_size(shm_name, tmp_path):
    """Past --rotate-mb a new file starts; each is a complete MCAP file, and
    together they hold every message once, in order."""
    kickmsg.SharedRegion.create(shm_name, kickmsg.ChannelType.PubSub, CONFIG, "test")

    def publish():
        publisher = kickmsg.Publisher(kickmsg.SharedRegion.open(shm_name))
        for burst in range(6):
            for i in range(100):
                publisher.send(bytes([burst, i]) * 50)
            wait_until(lambda: messages_on_disk(tmp_path) == 100 * (burst + 1), "the burst being written")  # a flush per burst

    summary = record_while([shm_name], tmp_path, publish, rotate_mb=0.002, format="mcap", flush_interval=0.1)
    files = sorted(str(path) for path in tmp_path.iterdir())
    assert files == sorted(summary.files) and len(files) >= 3
    payloads = [base64.b64decode(data["payload"]) for file in files for _, _, data in read_mcap(file)[0]]
    assert payloads == [bytes([burst, i]) * 50 for burst in range(6) for i in range(100)]


def test_analyze_reads_an_mcap_recording_as_its_parquet_rows(shm_name, tmp_path):
    """An MCAP file converted from a Parquet recording (stamped messages, a
    loss) gives analyze the same rows: ring positions, sizes, losses and
    latencies (receive time - stamp); the receive time is the wall clock.
    `kickmsg analyze FILE.mcap` then counts them as from the Parquet file."""
    region = kickmsg.SharedRegion.create(shm_name, kickmsg.ChannelType.PubSub,
                                         kickmsg.Config(max_subscribers=2, sub_ring_capacity=8, pool_size=64), "test")
    recorder = Recorder([shm_name], str(tmp_path / "rec"))
    published = threading.Event()
    recorder._receive = receiving_after(published, recorder._receive)  # the ring overflows before it reads
    stop = threading.Event()
    thread = threading.Thread(target=recorder.run, kwargs={"stop": stop}, daemon=True)
    thread.start()
    wait_for_recorder([shm_name], recorder)
    publisher = kickmsg.Publisher(region)
    for i in range(20):
        publisher.send(stamp.stamped(b"a%d" % i * (1 + i % 3)))
    published.set()
    counts = recorder.summary.channels[shm_name]
    wait_until(lambda: counts.messages + counts.lost == 20, "the recorder reading the ring")
    stop.set()
    thread.join(timeout=30)
    assert run_cli("convert", tmp_path / "rec", tmp_path / "rec.mcap").returncode == 0

    from kickmsg.recording.mcap import analysis_table
    rows = pyarrow.parquet.read_table(tmp_path / "rec").to_pylist()
    converted = analysis_table(str(tmp_path / "rec.mcap")).to_pylist()
    assert [r["lost"] for r in rows] == [12] + [0] * 7
    for row, mine in zip(rows, converted, strict=True):
        assert (mine["recording"], mine["channel"], mine["ring_pos"], mine["size"], mine["lost"]) == (
            row["recording"], row["channel"], row["ring_pos"], row["size"], row["lost"])
        assert mine["recv_mono_ns"] == mine["recv_wall_ns"] == row["recv_wall_ns"]
        assert mine["recv_mono_ns"] - mine["stamp_ns"] == row["recv_mono_ns"] - row["stamp_ns"]

    pytest.importorskip("pyspark")
    result = run_cli("analyze", tmp_path / "rec.mcap", "--master", "local[1]", "--json", timeout=300)
    assert result.returncode == 0, result.stderr
    figures = json.loads(result.stdout)[shm_name]  # --json: the figures alone on stdout, as every command's
    assert (figures["messages"], figures["lost"], figures["gaps"], figures["stamped"]) == (8, 12, 0, True)
    assert figures["size_bytes"]["max"] == max(row["size"] for row in rows)
