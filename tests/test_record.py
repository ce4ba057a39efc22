"""Recording to Parquet and playing back: kickmsg.record and `kickmsg record/play`."""
import json
import os
import pathlib
import signal
import subprocess
import sys
import threading
import time

import pyarrow.parquet
import pytest

import kickmsg
from kickmsg import diagnostics, owners, stamp, typed
from kickmsg.record import COLUMNS, SCHEMA_KEY, Recorder, play, recording_files

KICKMSG = str(pathlib.Path(sys.executable).with_name("kickmsg"))
CONFIG = kickmsg.Config(max_subscribers=4, sub_ring_capacity=1024, pool_size=4096, max_payload_size=256)  # bursts fit


@pytest.fixture
def channels(shm_name):
    """Two channels (one typed), unlinked after the test."""
    names = [shm_name + "_a", shm_name + "_b"]
    Imu = typed.RecordType("Imu", [stamp.FIELD, ("x", "<f4")])
    kickmsg.SharedRegion.create(names[0], kickmsg.ChannelType.PubSub, CONFIG, "test")
    typed_config = kickmsg.Config(max_subscribers=4, sub_ring_capacity=256, pool_size=1024, max_payload_size=64,
                                  schema=Imu.schema)
    kickmsg.SharedRegion.create(names[1], kickmsg.ChannelType.Broadcast, typed_config, "test")
    yield names
    for name in names:
        kickmsg.unlink_shm(name)


def record_while(names, out, publish, **options):
    """Run a Recorder in a thread while ``publish()`` runs; return its summary."""
    recorder = Recorder(names, str(out), **options)
    stop = threading.Event()
    done = {}
    thread = threading.Thread(target=lambda: done.update(summary=recorder.run(stop=stop)))
    thread.start()
    deadline = time.monotonic() + 10
    while not all(_has_live_ring(name) for name in names):  # the recorder has joined every channel
        assert time.monotonic() < deadline, "the recorder never subscribed"
        time.sleep(0.01)
    publish()
    time.sleep(0.3)  # let the receiving threads drain
    stop.set()
    thread.join(timeout=30)
    assert not thread.is_alive()
    return done["summary"]


def _has_live_ring(name):
    return kickmsg.SharedRegion.inspect(name).diagnose().live_rings > 0


def messages(count, tag):
    """``count`` stamped payloads of varied sizes (each call stamps anew)."""
    return [stamp.stamped(b"%s-%d" % (tag, i) * (1 + i % 5)) for i in range(count)]


def test_recording_has_every_message_and_the_columns(channels, tmp_path):
    sent = {channels[0]: messages(300, b"a"), channels[1]: messages(100, b"b")}

    def publish():
        publishers = {name: kickmsg.Publisher(kickmsg.SharedRegion.open(name)) for name in channels}
        for i in range(300):
            publishers[channels[0]].send(sent[channels[0]][i])
            if i < 100:
                publishers[channels[1]].send(sent[channels[1]][i])

    summary = record_while(channels, tmp_path, publish)
    table = pyarrow.parquet.read_table(tmp_path)
    assert table.schema.names == [name for name, _ in COLUMNS]
    rows = table.to_pylist()
    for name in channels:
        mine = [row for row in rows if row["channel"] == name]
        assert [row["payload"] for row in mine] == sent[name]
        assert [row["ring_pos"] for row in mine] == list(range(len(sent[name])))
        assert all(row["lost"] == 0 and row["size"] == len(row["payload"]) for row in mine)
        assert all(row["stamp_ns"] == stamp.read(row["payload"]) for row in mine)
        assert all(0 <= row["recv_mono_ns"] - row["stamp_ns"] < 10**10 for row in mine)
        assert (summary.channels[name].messages, summary.channels[name].lost) == (len(sent[name]), 0)
    assert len({row["recording"] for row in rows}) == 1
    metadata = json.loads(table.schema.metadata[SCHEMA_KEY])
    assert metadata["channels"][channels[1]]["channel_type"] == 2
    assert metadata["channels"][channels[1]]["schema"]["name"].startswith("Imu:")
    assert metadata["channels"][channels[0]]["sub_ring_capacity"] == 1024


def test_record_play_record_gives_the_same_payloads_in_order(channels, tmp_path):
    """Record, play the recording into the same channels while recording
    again: the second recording holds the same payloads in the same order on
    each channel. (Across channels the order is not observable: each channel
    is received by a thread of its own, and their receive times can swap two
    messages played 0.25 ms apart.)"""
    sent = messages(200, b"x")

    def publish():
        publishers = [kickmsg.Publisher(kickmsg.SharedRegion.open(name)) for name in channels]
        for i, payload in enumerate(sent):
            publishers[i % 2].send(payload)
            time.sleep(0.0005)

    record_while(channels, tmp_path / "first", publish)
    record_while(channels, tmp_path / "second", lambda: play(str(tmp_path / "first"), rate=2.0))
    first = pyarrow.parquet.read_table(tmp_path / "first").sort_by("recv_mono_ns").to_pylist()
    second = pyarrow.parquet.read_table(tmp_path / "second").sort_by("recv_mono_ns").to_pylist()
    for name in channels:
        assert [r["payload"] for r in second if r["channel"] == name] == [r["payload"] for r in first if r["channel"] == name]
        assert [r["payload"] for r in first if r["channel"] == name] == sent[channels.index(name) :: 2]
    assert sorted(r["payload"] for r in first) == sorted(sent)


def test_play_creates_missing_channels_as_recorded(channels, tmp_path):
    record_while(channels, tmp_path, lambda: kickmsg.Publisher(kickmsg.SharedRegion.open(channels[1])).send(b"q" * 20))
    for name in channels:
        kickmsg.unlink_shm(name)
    play(str(tmp_path))
    recreated = kickmsg.SharedRegion.inspect(channels[1])
    assert recreated.channel_type is kickmsg.ChannelType.Broadcast
    assert recreated.geometry.slot_data_size == 64 and recreated.schema().name.startswith("Imu:")


def _publishers_seen(name):
    """Whether the channel exists, is ready and has a publisher record."""
    try:
        return bool(diagnostics.stats(name).publishers)
    except diagnostics.RegionError:  # not created yet, or being initialised
        return False


def test_play_publishes_and_creates_as_kickmsg_play(channels, tmp_path):
    """kickmsg stats shows play's publishers as kickmsg-play (not as the
    interpreter), and the channels it creates name it as their creator."""
    record_while(channels, tmp_path, lambda: kickmsg.Publisher(kickmsg.SharedRegion.open(channels[0])).send(b"p"))
    kickmsg.unlink_shm(channels[0])
    stop = threading.Event()
    player = threading.Thread(target=play, args=(str(tmp_path),), kwargs={"loop": True, "stop": stop})
    player.start()
    try:
        deadline = time.monotonic() + 10
        while not _publishers_seen(channels[0]):
            assert time.monotonic() < deadline, "play never published"
            time.sleep(0.01)
        assert [p.node_name for p in diagnostics.stats(channels[0]).publishers] == ["kickmsg-play"]
        assert diagnostics.info(channels[0]).creator_name == "kickmsg-play"
    finally:
        stop.set()
        player.join(timeout=30)
    owners.unlink(channels[0])


def test_play_keeps_the_original_timing_scaled_by_rate(channels, tmp_path):
    """Messages 50 ms apart, played at rate 0.5: message k cannot arrive
    before the play started + its recorded offset / 0.5. A lower bound that
    holds whatever the load (never an upper bound on time); a player that
    ignored the rate or the offsets would break it."""
    def publish():
        publisher = kickmsg.Publisher(kickmsg.SharedRegion.open(channels[0]))
        for payload in messages(5, b"t"):
            publisher.send(payload)
            time.sleep(0.05)

    record_while(channels, tmp_path / "first", publish)
    recorded = pyarrow.parquet.read_table(tmp_path / "first").column("recv_mono_ns").to_pylist()
    started = {}

    def replay():
        started["ns"] = time.monotonic_ns()
        play(str(tmp_path / "first"), rate=0.5)

    record_while(channels, tmp_path / "second", replay)
    received = pyarrow.parquet.read_table(tmp_path / "second").column("recv_mono_ns").to_pylist()
    assert len(received) == 5
    assert all(arrival - started["ns"] >= (offset - recorded[0]) / 0.5 for arrival, offset in zip(received, recorded))


def test_play_at_a_rate_so_slow_the_next_message_is_centuries_away_still_stops(channels, tmp_path):
    """At rate 1e-12 the second message is due in ~1 600 years, beyond what a
    wait can take (threading.TIMEOUT_MAX): play waits the most it can and
    still ends at once when told to stop."""
    def publish():
        publisher = kickmsg.Publisher(kickmsg.SharedRegion.open(channels[0]))
        for payload in messages(2, b"c"):
            publisher.send(payload)
            time.sleep(0.05)

    record_while(channels, tmp_path, publish)
    stop, outcome = threading.Event(), {}
    player = threading.Thread(target=lambda: outcome.update(summary=play(str(tmp_path), rate=1e-12, stop=stop)))
    player.start()
    time.sleep(0.3)
    stop.set()
    player.join(timeout=30)
    assert not player.is_alive() and outcome["summary"].messages == 1


def test_no_payload_recording_keeps_sizes_and_stamps(channels, tmp_path):
    sent = messages(50, b"n")
    record_while(channels, tmp_path, lambda: [kickmsg.Publisher(kickmsg.SharedRegion.open(channels[0])).send(m) for m in sent],
                 payload=False)
    table = pyarrow.parquet.read_table(tmp_path)
    assert "payload" not in table.column_names
    assert table.column("size").to_pylist() == [len(m) for m in sent]
    assert table.column("stamp_ns").to_pylist() == [stamp.read(m) for m in sent]
    with pytest.raises(ValueError, match="without payloads"):
        play(str(tmp_path))


def test_files_rotate_by_size(channels, tmp_path):
    def publish():
        publisher = kickmsg.Publisher(kickmsg.SharedRegion.open(channels[0]))
        for i in range(6):
            for payload in messages(100, b"r%d" % i):
                publisher.send(payload)
            time.sleep(0.6)  # one flush per burst

    summary = record_while(channels, tmp_path, publish, rotate_mb=0.01)
    files = recording_files(str(tmp_path))
    assert files == sorted(summary.files) and len(files) >= 3
    assert sum(pyarrow.parquet.read_metadata(f).num_rows for f in files) == 600


def test_recorder_losses_are_in_the_data(channels, tmp_path):
    """A burst larger than the ring before the recorder can read: what it
    misses is counted in the lost column, and received + lost = published."""
    region = kickmsg.SharedRegion.create(channels[0], kickmsg.ChannelType.PubSub,
                                         kickmsg.Config(max_subscribers=2, sub_ring_capacity=8, pool_size=64), "test")
    recorder = Recorder([channels[0]], str(tmp_path))
    recorder._receive = _slow(recorder._receive)  # the receiving thread starts late
    stop = threading.Event()
    thread = threading.Thread(target=recorder.run, kwargs={"stop": stop})
    thread.start()
    while not _has_live_ring(channels[0]):
        time.sleep(0.01)
    publisher = kickmsg.Publisher(region)
    for payload in messages(100, b"l"):
        publisher.send(payload)
    time.sleep(1.0)
    stop.set()
    thread.join(timeout=30)
    table = pyarrow.parquet.read_table(tmp_path)
    assert table.num_rows == 8  # the ring's worth
    assert sum(table.column("lost").to_pylist()) == 92


def _slow(receive):
    def delayed(*args):
        time.sleep(0.5)
        receive(*args)
    return delayed


@pytest.mark.parametrize("signal_number", [signal.SIGTERM, signal.SIGINT])
def test_recorder_killed_by_a_signal_leaves_a_readable_file(channels, tmp_path, signal_number):
    """`kickmsg record` stopped by SIGTERM or SIGINT flushes what it buffered
    and closes the Parquet file."""
    recorder = subprocess.Popen([KICKMSG, "record", channels[0], "--out", str(tmp_path)],
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 20
        while not _has_live_ring(channels[0]):
            assert time.monotonic() < deadline and recorder.poll() is None, recorder.stderr.read()
            time.sleep(0.02)
        publisher = kickmsg.Publisher(kickmsg.SharedRegion.open(channels[0]))
        sent = messages(150, b"s")
        for payload in sent:
            publisher.send(payload)
        time.sleep(0.2)
        recorder.send_signal(signal_number)
        out, err = recorder.communicate(timeout=20)
    finally:
        recorder.kill()
    assert recorder.returncode == 0, err
    assert "150 messages" in out
    table = pyarrow.parquet.read_table(tmp_path)
    assert table.column("payload").to_pylist() == sent


def test_play_cli(channels, tmp_path):
    sent = messages(20, b"c")
    record_while(channels, tmp_path, lambda: [kickmsg.Publisher(kickmsg.SharedRegion.open(channels[0])).send(m)
                                              for m in sent])
    listener = kickmsg.Subscriber(kickmsg.SharedRegion.open(channels[0]))
    result = subprocess.run([KICKMSG, "play", str(tmp_path), "--rate", "10", "--json"], capture_output=True, text=True,
                            timeout=60)
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout) == {"messages": 20, "dropped": 0, "channels": [channels[0]]}
    assert list(listener) == sent
    listener.close()


def test_record_cli_errors(tmp_path):
    result = subprocess.run([KICKMSG, "record", "/kmtest_no_such_channel", "--out", str(tmp_path)],
                            capture_output=True, text=True, timeout=30)
    assert result.returncode == 2 and result.stderr.count("\n") == 1 and "no shared memory" in result.stderr
    result = subprocess.run([KICKMSG, "play", str(tmp_path)], capture_output=True, text=True, timeout=30)
    assert result.returncode == 2 and "no .parquet or .mcap files" in result.stderr
    assert os.listdir(tmp_path) == []


def test_stamp_round_trip_and_latency():
    payload = stamp.stamped(b"abc", stamp_ns=1_000)
    assert payload[stamp.SIZE:] == b"abc" and stamp.read(payload) == 1_000
    assert stamp.latency_ns(payload, received_ns=1_250) == 250
    assert stamp.read(b"short") is None and stamp.latency_ns(b"short") is None
    buffer = bytearray(16)
    stamp.write(buffer, stamp_ns=7)
    assert stamp.read(buffer) == 7
    assert 0 <= stamp.latency_ns(stamp.stamped(b"")) < 10_000_000_000
