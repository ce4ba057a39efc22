"""Recording to Parquet and playing back: kickmsg.recording.record and `kickmsg record/play`.
The tests on the ``channels`` fixture run on layout 4 and layout 9, but
those whose recorder is another process: its progress shows only in
``kickmsg.ops.diagnostics`` (layout 4's owner records), and when it has
subscribed only in its ring going Live, which on layout 9 comes before the
subscriber reads its start position."""
import json
import os
import pathlib
import random
import re
import select
import signal
import subprocess
import sys
import threading
import time

import pyarrow.parquet
import pytest

import kickmsg
from kickmsg import typed
from kickmsg import owners
from kickmsg.ops import diagnostics
from kickmsg.recording import mcap, record, stamp
from kickmsg.recording.files import COLUMNS, SCHEMA_KEY, file_format, recording_files
from kickmsg.recording.record import Recorder, play

from conftest import layout4_only, on_layout4
from nativepeer import start_native9, subscriber_joined

KICKMSG = str(pathlib.Path(sys.executable).with_name("kickmsg"))
CONFIG = kickmsg.Config(max_subscribers=4, sub_ring_capacity=1024, pool_size=4096, max_payload_size=256)  # bursts fit


@pytest.fixture
def channels(shm_name, layout):
    """Two channels (one typed) of each layout in turn, unlinked after the test."""
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
    thread = threading.Thread(target=lambda: done.update(summary=recorder.run(stop=stop)), daemon=True)
    thread.start()
    # its subscribers made (a Live ring is not enough: a layout-9 ring is Live before its start position is read)
    wait_until(lambda: len(recorder.subscribers) == len(names), "the recorder subscribing")
    publish()
    wait_until(lambda: caught_up(recorder), "the recorder reading every message")
    stop.set()
    thread.join(timeout=30)
    assert not thread.is_alive()
    return done["summary"]


def wait_until(condition, what, timeout=30):
    """Wait for ``condition()`` to hold, failing the test after ``timeout`` s."""
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting: {what}"
        time.sleep(0.01)


def caught_up(recorder):
    """Whether the subscribers of a Recorder of this process have nothing
    left to receive (what they took is written before ``run`` returns)."""
    return len(recorder.subscribers) == len(recorder.regions) and not any(
        subscriber._has_message_ready() for subscriber in list(recorder.subscribers.values()))


def drained(names, pid):
    """Whether the subscribers of process ``pid`` (a recorder) on ``names``
    have read every message written so far (as their records, updated every
    0.1 s, say)."""
    rings = [ring for name in names for ring in diagnostics.stats(name).rings if ring.owner_pid == pid]
    return len(rings) == len(names) and all(ring.pending == 0 for ring in rings)


def messages_on_disk(directory):
    """How many messages the files of ``directory`` hold: the complete ones
    and what a recorder has flushed so far to its ``.partial`` files (what
    would survive it being killed now); None while a file is renamed or first written."""
    try:
        return sum(_messages_in(str(path)) for path in directory.iterdir())
    except (FileNotFoundError, ValueError):
        return None


def _messages_in(path):
    """Messages in one file of a recording directory (0 for other files)."""
    if path.endswith(".mcap.partial"):
        return sum(isinstance(r, mcap.Message) for r in mcap._flushed_records(path))
    if path.endswith(".parquet.partial") and os.path.getsize(path):
        return sum(batch.num_rows for batch in record._flushed_batches(path)[1])
    if path.endswith(".mcap"):
        return sum(1 for _ in mcap.played_messages(path)[1])
    if path.endswith(".parquet"):
        return pyarrow.parquet.read_metadata(path).num_rows
    return 0


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
            time.sleep(0.0005)  # spaces the recorded times (the data, not a synchronisation)

    record_while(channels, tmp_path / "first", publish)
    record_while(channels, tmp_path / "second", lambda: play(str(tmp_path / "first"), rate=2.0))
    first = pyarrow.parquet.read_table(tmp_path / "first").sort_by("recv_mono_ns").to_pylist()
    second = pyarrow.parquet.read_table(tmp_path / "second").sort_by("recv_mono_ns").to_pylist()
    for name in channels:
        assert [r["payload"] for r in second if r["channel"] == name] == [r["payload"] for r in first if r["channel"] == name]
        assert [r["payload"] for r in first if r["channel"] == name] == sent[channels.index(name) :: 2]
    assert sorted(r["payload"] for r in first) == sorted(sent)


def test_play_creates_missing_channels_as_recorded(channels, tmp_path, layout, monkeypatch):
    """Of the layout recorded (whatever the process default), or of the one asked for."""
    record_while(channels, tmp_path, lambda: kickmsg.Publisher(kickmsg.SharedRegion.open(channels[1])).send(b"q" * 20))
    other = 13 - layout  # 4 <-> 9
    monkeypatch.setenv("KICKMSG_LAYOUT", str(other))
    for chosen, expected in ((None, layout), (other, other)):
        for name in channels:
            kickmsg.unlink_shm(name)
        play(str(tmp_path), layout=chosen)
        recreated = kickmsg.SharedRegion.inspect(channels[1])
        assert recreated.layout == expected and recreated.channel_type is kickmsg.ChannelType.Broadcast
        assert recreated.geometry.slot_data_size == 64 and recreated.schema().name.startswith("Imu:")


def _publishers_seen(name):
    """Whether the channel exists, is ready and has a publisher record."""
    try:
        return bool(diagnostics.stats(name).publishers)
    except diagnostics.RegionError:  # not created yet, or being initialised
        return False


@layout4_only  # publisher records: kickmsg.ops.diagnostics, layout 4 for now
def test_play_publishes_and_creates_as_kickmsg_play(channels, tmp_path):
    """kickmsg stats shows play's publishers as kickmsg-play (not as the
    interpreter), and the channels it creates name it as their creator."""
    record_while(channels, tmp_path, lambda: kickmsg.Publisher(kickmsg.SharedRegion.open(channels[0])).send(b"p"))
    kickmsg.unlink_shm(channels[0])
    stop = threading.Event()
    player = threading.Thread(target=play, args=(str(tmp_path),), kwargs={"loop": True, "stop": stop}, daemon=True)
    player.start()
    try:
        wait_until(lambda: _publishers_seen(channels[0]), "play publishing")
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
            time.sleep(0.05)  # the recorded timing (the data, not a synchronisation)

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
            time.sleep(0.05)  # the recorded timing (the data, not a synchronisation)

    record_while(channels, tmp_path, publish)
    listener = kickmsg.Subscriber(kickmsg.SharedRegion.open(channels[0]))
    stop, outcome = threading.Event(), {}
    player = threading.Thread(target=lambda: outcome.update(summary=play(str(tmp_path), rate=1e-12, stop=stop)), daemon=True)
    player.start()
    assert listener.receive(30) is not None  # the first message is played; the second is centuries away
    listener.close()
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
            wait_until(lambda: messages_on_disk(tmp_path) == 100 * (i + 1), "the burst being written")  # a flush per burst

    summary = record_while(channels, tmp_path, publish, rotate_mb=0.01, flush_interval=0.1)
    files = recording_files(str(tmp_path))
    assert files == sorted(summary.files) and len(files) >= 3
    assert sum(pyarrow.parquet.read_metadata(f).num_rows for f in files) == 600


def test_recorder_losses_are_in_the_data(channels, tmp_path):
    """A burst larger than the ring before the recorder can read: what it
    misses is counted in the lost column, and received + lost = published."""
    region = kickmsg.SharedRegion.create(channels[0], kickmsg.ChannelType.PubSub,
                                         kickmsg.Config(max_subscribers=2, sub_ring_capacity=8, pool_size=64), "test")
    recorder = Recorder([channels[0]], str(tmp_path))
    published = threading.Event()
    recorder._receive = receiving_after(published, recorder._receive)  # the receiving thread starts late
    stop = threading.Event()
    thread = threading.Thread(target=recorder.run, kwargs={"stop": stop}, daemon=True)
    thread.start()
    wait_until(lambda: recorder.subscribers, "the recorder subscribing")
    publisher = kickmsg.Publisher(region)
    for payload in messages(100, b"l"):
        publisher.send(payload)
    published.set()
    counts = recorder.summary.channels[channels[0]]
    wait_until(lambda: counts.messages + counts.lost == 100, "the recorder reading the ring")
    stop.set()
    thread.join(timeout=30)
    table = pyarrow.parquet.read_table(tmp_path)
    assert table.num_rows == 8  # the ring's worth
    assert sum(table.column("lost").to_pylist()) == 92


def receiving_after(event, receive):
    """A recorder's ``_receive`` that starts once ``event`` is set."""
    def delayed(*args):
        assert event.wait(30)
        receive(*args)
    return delayed


@layout4_only  # the recorder is another process
@pytest.mark.parametrize("signal_number", [signal.SIGTERM, signal.SIGINT])
def test_recorder_killed_by_a_signal_leaves_a_readable_file(channels, tmp_path, signal_number):
    """`kickmsg record` stopped by SIGTERM or SIGINT flushes what it buffered
    and closes the Parquet file."""
    recorder = subprocess.Popen([KICKMSG, "record", channels[0], "--out", str(tmp_path)],
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        wait_until(lambda: subscriber_joined(channels[0]) or recorder.poll() is not None, "the recorder subscribing")
        assert recorder.poll() is None, recorder.stderr.read()
        publisher = kickmsg.Publisher(kickmsg.SharedRegion.open(channels[0]))
        sent = messages(150, b"s")
        for payload in sent:
            publisher.send(payload)
        wait_until(lambda: drained(channels[:1], recorder.pid), "the recorder reading every message")
        recorder.send_signal(signal_number)
        out, err = recorder.communicate(timeout=20)
    finally:
        recorder.kill()
    assert recorder.returncode == 0, err
    assert "150 messages" in out
    table = pyarrow.parquet.read_table(tmp_path)
    assert table.column("payload").to_pylist() == sent


def recorded_payloads(file):
    """Every payload of a complete recording file, read as play reads it (MCAP CRCs checked)."""
    return [payload for _, _, _, payload in record._played_file(str(file))[1]]


@layout4_only  # the recorder is another process: on layout 9 its ring is Live before its start position is read
@pytest.mark.parametrize("format", ["parquet", "mcap"])
def test_a_killed_recorder_loses_at_most_its_last_flush_interval(channels, tmp_path, format):
    """`kickmsg record` SIGKILLed mid-stream: the messages it had flushed
    (seen in its .partial file before the kill) survive; `record --recover`
    turns the file into a complete one (refused while the recorder lives),
    whose messages are a prefix of those published, intact."""
    recorder = subprocess.Popen([KICKMSG, "record", channels[0], "--out", str(tmp_path), "--format", format,
                                 "--flush-interval", "0.2"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        wait_until(lambda: subscriber_joined(channels[0]) or recorder.poll() is not None, "the recorder subscribing")
        assert recorder.poll() is None, recorder.stderr.read()
        publisher = kickmsg.Publisher(kickmsg.SharedRegion.open(channels[0]))
        sent = messages(300, b"k")
        for payload in sent:
            publisher.send(payload)
        wait_until(lambda: messages_on_disk(tmp_path) == 300, "the recorder flushing the first 300 messages")
        [partial] = tmp_path.iterdir()
        refused = subprocess.run([KICKMSG, "record", "--recover", str(partial)], capture_output=True, text=True, timeout=60)
        assert refused.returncode == 2 and "still being written by recorder" in refused.stderr, refused.stderr
        more = messages(500, b"m")  # the recorder is killed while these arrive
        for payload in more:
            publisher.send(payload)
        recorder.kill()
        recorder.wait(timeout=30)
    finally:
        recorder.kill()
        recorder.communicate(timeout=30)
    result = subprocess.run([KICKMSG, "record", "--recover", str(tmp_path), "--json"], capture_output=True, text=True,
                            timeout=60)
    assert result.returncode == 0, result.stderr
    [recovered] = json.loads(result.stdout)
    complete = pathlib.Path(recovered["file"])
    assert list(tmp_path.iterdir()) == [complete] and partial.name == complete.name + ".partial"
    payloads = recorded_payloads(complete)
    assert recovered["messages"] == len(payloads) >= 300
    assert payloads == (sent + more)[: len(payloads)]


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
    assert result.returncode == 2 and result.stderr.count("\n") == 1 and "no such region: /kmtest_no_such_channel" in result.stderr
    result = subprocess.run([KICKMSG, "play", str(tmp_path)], capture_output=True, text=True, timeout=30)
    assert result.returncode == 2 and "no .parquet or .mcap files" in result.stderr
    assert os.listdir(tmp_path) == []
    for args, error in ((["--recover", str(tmp_path)], f"no .partial files in {tmp_path}: nothing to recover"),
                        (["--recover", str(tmp_path / "x.parquet")], f"no such file or directory: {tmp_path / 'x.parquet'}"),
                        (["--recover", KICKMSG], f"{KICKMSG} is not a recording being written"),
                        (["--recover", str(tmp_path), "/kickmsg_x"], "record --recover PATH takes no channels"),
                        (["/kickmsg_x"], "record needs --out DIR"),
                        (["--out", str(tmp_path)], "record needs the channels")):
        result = subprocess.run([KICKMSG, "record", *args], capture_output=True, text=True, timeout=30)
        assert result.returncode == 2 and result.stderr.count("\n") == 1 and error in result.stderr, result.stderr
    (tmp_path / "empty.parquet.partial").write_bytes(b"")  # killed before its first write
    result = subprocess.run([KICKMSG, "record", "--recover", str(tmp_path)], capture_output=True, text=True, timeout=30)
    assert result.returncode == 2 and "empty.parquet.partial holds no complete row (remove it)" in result.stderr


def test_stamp_round_trip_and_latency():
    payload = stamp.stamped(b"abc", stamp_ns=1_000)
    assert payload[stamp.SIZE:] == b"abc" and stamp.read(payload) == 1_000
    assert stamp.latency_ns(payload, received_ns=1_250) == 250
    assert stamp.read(b"short") is None and stamp.latency_ns(b"short") is None
    buffer = bytearray(16)
    stamp.write(buffer, stamp_ns=7)
    assert stamp.read(buffer) == 7
    assert 0 <= stamp.latency_ns(stamp.stamped(b"")) < 10_000_000_000


@pytest.mark.parametrize("interval", [0, -1.0, float("nan"), float("inf")])
def test_recorder_refuses_a_flush_interval_that_is_not_a_positive_number(interval, tmp_path):
    with pytest.raises(ValueError, match=f"flush_interval must be a finite number of seconds above 0, got {interval!r}"):
        Recorder(["/kmtest_never_opened"], str(tmp_path), flush_interval=interval)


def test_play_only_one_channel_remapped_to_a_new_name(channels, tmp_path):
    """`play --only A --remap A=NEW`: a subscriber on NEW receives A's
    recorded payloads; A and the other recorded channel get nothing."""
    sent = messages(20, b"o")

    def publish():
        publishers = [kickmsg.Publisher(kickmsg.SharedRegion.open(name)) for name in channels]
        for payload in sent:
            publishers[0].send(payload)
            publishers[1].send(payload[:16])

    record_while(channels, tmp_path, publish)
    new = channels[0] + "_new"
    kickmsg.SharedRegion.create(new, kickmsg.ChannelType.PubSub, CONFIG, "test")
    try:
        listeners = [kickmsg.Subscriber(kickmsg.SharedRegion.open(name)) for name in [new, *channels]]
        result = subprocess.run([KICKMSG, "play", str(tmp_path), "--rate", "10", "--only", channels[0],
                                 "--remap", f"{channels[0]}={new}", "--json"], capture_output=True, text=True, timeout=60)
        assert result.returncode == 0, result.stderr
        assert json.loads(result.stdout) == {"messages": 20, "dropped": 0, "channels": [new]}
        assert [bytes(m) for m in listeners[0]] == sent
        assert listeners[1].try_receive() is None and listeners[2].try_receive() is None
        for listener in listeners:
            listener.close()
        remapped_only = play(str(tmp_path), rate=10, remap={channels[1]: new}, only=[channels[1]])
        assert remapped_only.channels == {new}
    finally:
        owners.unlink(new)
    for args, error in ((["--only", "/kmtest_absent"], f"only /kmtest_absent: the recording has no such channel (it has {', '.join(sorted(channels))})"),
                        (["--remap", "/kmtest_absent=/x"], "remap /kmtest_absent: the recording has no such channel"),
                        (["--remap", f"{channels[0]}=/a/b"], "invalid shared-memory name '/a/b'"),
                        (["--remap", channels[0]], f"argument --remap: not OLD=NEW: '{channels[0]}'")):
        result = subprocess.run([KICKMSG, "play", str(tmp_path), *args], capture_output=True, text=True, timeout=60)
        assert result.returncode == 2 and error in result.stderr.splitlines()[-1], result.stderr


@pytest.mark.parametrize("format", ["parquet", "mcap"])
@on_layout4
def test_record_prefix_picks_up_a_channel_created_later(prefix, tmp_path, format):
    """`kickmsg record --prefix P`: the channel there at the start and one
    created while it records are both recorded (the second in a file whose
    metadata describes it)."""
    first, later = f"/{prefix}_first", f"/{prefix}_later"
    kickmsg.SharedRegion.create(first, kickmsg.ChannelType.PubSub, CONFIG, "test")
    recorder = subprocess.Popen([KICKMSG, "record", "--prefix", prefix, "--out", str(tmp_path), "--format", format,
                                 "--json"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        wait_until(lambda: subscriber_joined(first) or recorder.poll() is not None, "the recorder subscribing")
        assert recorder.poll() is None, recorder.stderr.read()
        kickmsg.SharedRegion.create(later, kickmsg.ChannelType.Broadcast, CONFIG, "test")
        wait_until(lambda: subscriber_joined(later) or recorder.poll() is not None, "the recorder finding the new channel")
        sent = {first: messages(30, b"f"), later: messages(20, b"l")}
        for name, payloads in sent.items():
            publisher = kickmsg.Publisher(kickmsg.SharedRegion.open(name))
            for payload in payloads:
                publisher.send(payload)
        wait_until(lambda: drained([first, later], recorder.pid), "the recorder reading every message")
        recorder.send_signal(signal.SIGINT)
        out, err = recorder.communicate(timeout=30)
    finally:
        recorder.kill()
    assert recorder.returncode == 0, err
    assert err == f"kickmsg record: {later} appeared; recording it\n"
    assert {name: counts["messages"] for name, counts in json.loads(out)["channels"].items()} == {first: 30, later: 20}
    files = recording_files(str(tmp_path))
    played = [message for file in files for message in record._played_file(file)[1]]
    for name, payloads in sent.items():
        assert [payload for _, channel, _, payload in played if channel == name] == payloads
    assert record.recording_channels(str(tmp_path))[later]["channel_type"] == 2
    assert set(record.channel_names(prefix)) == {first, later}
    assert {first, later} <= set(record.channel_names(""))  # what --all records (not run here: the machine is shared)


def test_record_all_and_prefix_on_the_command_line(tmp_path):
    """--all and --prefix exclude each other; record needs channels, one of them, or --recover."""
    result = subprocess.run([KICKMSG, "record", "--all", "--prefix", "x", "--out", str(tmp_path)], capture_output=True,
                            text=True, timeout=30)
    assert result.returncode == 2 and "argument --prefix: not allowed with argument --all" in result.stderr
    result = subprocess.run([KICKMSG, "record", "--recover", str(tmp_path), "--all"], capture_output=True, text=True,
                            timeout=30)
    assert result.returncode == 2 and "record --recover PATH takes no channels" in result.stderr
    with pytest.raises(ValueError, match="needs at least one channel, or a prefix"):
        Recorder([], str(tmp_path))


@pytest.mark.parametrize("format", ["parquet", "mcap"])
def test_recover_a_partial_file_cut_anywhere_or_damaged(channels, tmp_path, format, monkeypatch):
    """A .partial file of three flushes, cut at every 7th byte or with bytes
    flipped: recover writes a valid file or refuses in one ValueError naming
    the file, nothing else; from a cut file it keeps whole flushes, a prefix
    of the messages. (A flipped byte inside a row of a Parquet stream, which
    has no checksum, is kept as it is; MCAP chunks have CRCs.)"""
    def publish():
        publisher = kickmsg.Publisher(kickmsg.SharedRegion.open(channels[0]))
        for flush in range(3):
            for payload in messages(10, b"f%d" % flush):
                publisher.send(payload)
            wait_until(lambda: messages_on_disk(tmp_path / "rec") == 10 * (flush + 1), "the flush")

    stopped = threading.Event()
    recorder = Recorder([channels[0]], str(tmp_path / "rec"), format=format, flush_interval=0.05)
    thread = threading.Thread(target=recorder.run, kwargs={"stop": stopped}, daemon=True)
    thread.start()
    try:
        wait_until(lambda: recorder.subscribers, "the recorder subscribing")
        publish()
        [partial] = (tmp_path / "rec").iterdir()
        data = partial.read_bytes()
    finally:
        stopped.set()
        thread.join(timeout=30)
    monkeypatch.setattr(diagnostics, "pid_alive", lambda pid: False)  # as if the recorder (this process) had died
    sent = [payload for _, _, _, payload in record._played_file(recorder.summary.files[0])[1]]
    damaged_file = tmp_path / f"x.{format}.partial"
    randomness = random.Random(24)
    damages = [data[:cut] for cut in range(0, len(data), 7)] + [data]
    for _ in range(100):
        flipped = bytearray(data)
        for _ in range(3):
            flipped[randomness.randrange(len(flipped))] ^= randomness.randrange(1, 256)
        damages.append(bytes(flipped))
    kept = set()
    for damaged in damages:
        damaged_file.write_bytes(damaged)
        try:
            [recovered] = record.recover(str(damaged_file))
        except ValueError as error:
            assert str(damaged_file) in str(error)
            continue
        assert file_format(recovered.file) == format
        if damaged == data[: len(damaged)]:  # cut, not flipped: nothing but whole flushes
            payloads = recorded_payloads(recovered.file)
            assert payloads == sent[: len(payloads)] and len(payloads) % 10 == 0 and recovered.messages == len(payloads)
            kept.add(len(payloads))
        os.unlink(recovered.file)
    assert {10, 20, 30} <= kept


NATIVE_MAILBOXES = r"""
import gc, time
config = make_config(dict(max_subscribers=1, sub_ring_capacity=64, pool_size=128, max_payload_size=64))
def mailbox(tag):
    region = kickmsg.SharedRegion.create(P["prefix"] + "_nat_mbx_" + tag, kickmsg.ChannelType.PubSub, config, "native")
    return region, kickmsg.Subscriber(region)  # its one ring taken
boxes = [mailbox("inbox")]
ready()
wait_go()
boxes.append(mailbox("later"))  # created while the recorder runs
ready()
wait_go()
regions = [region for region, _ in boxes]
boxes = None
gc.collect()  # the native subscribers leave their rings
deadline = time.monotonic() + 30
while not all(subscriber_joined(region.name) for region in regions) and time.monotonic() < deadline:
    time.sleep(0.01)  # until the recorder has joined both
for region in regions:
    publisher = kickmsg.Publisher(region)
    for seq in range(3):
        publisher.send(b"box %d" % seq)
done(None)
"""


def stderr_line(process, timeout=30):
    """The next line ``process`` writes on stderr (an unbuffered binary pipe), failing after ``timeout`` s."""
    ready, _, _ = select.select([process.stderr], [], [], timeout)
    assert ready, "timed out waiting for a line on stderr"
    return process.stderr.readline().decode()


@pytest.mark.parametrize("layout", [9], ids=["layout9"], indirect=True)
def test_record_prefix_skips_a_channel_it_cannot_join_and_joins_it_later(prefix, tmp_path, layout):
    """`kickmsg record NAME --prefix P` on a namespace where native 0.9.2
    holds the one ring of two mailboxes (one there at the start, one created
    while recording): each is skipped with a warning naming it and why, the
    topic is recorded meanwhile, and each is recorded once its ring is free
    again. Before, the recorder exited 2 at once, or at the second mailbox."""
    imu = f"/{prefix}_imu"
    boxes = [f"/{prefix}_nat_mbx_inbox", f"/{prefix}_nat_mbx_later"]
    kickmsg.SharedRegion.create(imu, kickmsg.ChannelType.PubSub, CONFIG, "test")
    publisher = kickmsg.Publisher(kickmsg.SharedRegion.open(imu))
    with start_native9(NATIVE_MAILBOXES, prefix="/" + prefix) as native:
        native.wait_ready()
        recorder = subprocess.Popen([KICKMSG, "record", imu, "--prefix", prefix, "--out", str(tmp_path),
                                     "--flush-interval", "0.2", "--json"], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                    bufsize=0)  # unbuffered: select sees every line stderr_line has not read
        try:
            def skipped(box: str) -> str:  # the join's error names the ring's live holder and the repair
                return (rf"kickmsg record: warning: not recording {box} for now \(No free subscriber slots in {box} "
                        rf"\(1 rings: ring 0 Live, pid {native.proc.pid} alive; kickmsg repair {box} --dead-subscribers [^\n]*\)\); "
                        rf"recording the others, trying it again every 0\.2 s\n")
            assert re.fullmatch(skipped(boxes[0]), stderr_line(recorder))
            native.tell()
            native.wait_ready()
            assert re.fullmatch(skipped(boxes[1]), stderr_line(recorder))
            for seq in range(50):
                publisher.send(b"imu %d" % seq)
            native.tell()
            assert {stderr_line(recorder), stderr_line(recorder)} == {
                f"kickmsg record: {box} could be joined at last; recording it\n" for box in boxes}
            native.result()
            wait_until(lambda: messages_on_disk(tmp_path) == 50 + 6, "the recorder writing every message")
            recorder.send_signal(signal.SIGINT)
            out, err = recorder.communicate(timeout=30)
        finally:
            recorder.kill()
    assert recorder.returncode == 0, err
    summary = json.loads(out)
    assert {name: counts["messages"] for name, counts in summary["channels"].items()} == {imu: 50, boxes[0]: 3, boxes[1]: 3}
    assert summary["skipped"] == {}


def test_a_recorded_channel_re_created_with_no_ring_to_spare_is_skipped_then_followed(shm_name, tmp_path, layout):
    """The recorded channel is re-created with one ring, which another
    subscriber takes first: the recorder warns (on_skipped) and records on;
    once that ring is free it follows the channel (on_rejoin) and records
    what is published there. Before, the channel's thread died with the
    error and the channel was recorded no more."""
    kickmsg.SharedRegion.create(shm_name, kickmsg.ChannelType.PubSub, CONFIG, "test")
    told = []
    recorder = Recorder([shm_name], str(tmp_path), flush_interval=0.1, on_skipped=lambda *args: told.append(args),
                        on_rejoin=lambda name, subscriber: told.append((name, "rejoined")))
    stop = threading.Event()
    thread = threading.Thread(target=recorder.run, kwargs=dict(stop=stop), daemon=True)
    thread.start()
    try:
        wait_until(lambda: shm_name in recorder.subscribers, "the recorder subscribing")
        one_ring = kickmsg.Config(max_subscribers=1, sub_ring_capacity=64, pool_size=128, max_payload_size=64)
        region = kickmsg.SharedRegion.create(shm_name, kickmsg.ChannelType.PubSub, one_ring, "test")
        holder = kickmsg.Subscriber(region)
        wait_until(lambda: told, "the recorder trying to follow")
        assert len(told) == 1 and told[0][0] == shm_name and told[0][1].startswith(f"No free subscriber slots in {shm_name}")
        assert recorder.summary.skipped == {shm_name: told[0][1]}
        holder.close()
        wait_until(lambda: (shm_name, "rejoined") in told, "the recorder following the channel")
        kickmsg.Publisher(region).send(b"after")
        wait_until(lambda: recorder.summary.channels[shm_name].messages == 1, "the recorder reading it")
    finally:
        stop.set()
        thread.join(timeout=30)
    assert recorder.summary.skipped == {} and len(told) == 2
    assert pyarrow.parquet.read_table(tmp_path).column("payload").to_pylist() == [b"after"]


@pytest.mark.parametrize("format", ["parquet", "mcap"])
@pytest.mark.parametrize("layout", [9], ids=["layout9"], indirect=True)
def test_a_recording_marks_a_re_created_region_and_counts_what_it_missed(shm_name, tmp_path, layout, format):
    """A native 0.9.2 process re-creates the recorded channel with one ring,
    takes it (the recorder cannot follow yet), publishes 40 messages, leaves
    the ring, and once the recorder has joined it publishes 10 more. The
    rows of the new region have ``rejoined`` 1 (``ring_pos`` starts over
    there, at the ring's 40), the first of them ``lost`` 40 (the messages
    it could not see); MCAP keeps both in
    ``kickmsg.losses``, and its analysis rows say the same. Before, the
    recording showed neither the restart nor the 40."""
    kickmsg.SharedRegion.create(shm_name, kickmsg.ChannelType.PubSub, CONFIG, "test")
    publisher = kickmsg.Publisher(kickmsg.SharedRegion.open(shm_name))
    recorder = Recorder([shm_name], str(tmp_path), format=format, flush_interval=0.1, on_skipped=lambda *_: None)
    stop = threading.Event()
    thread = threading.Thread(target=recorder.run, kwargs=dict(stop=stop), daemon=True)
    thread.start()
    try:
        wait_until(lambda: shm_name in recorder.subscribers, "the recorder subscribing")
        for seq in range(5):
            publisher.send(b"old %d" % seq)
        wait_until(lambda: recorder.summary.channels[shm_name].messages == 5, "the recorder reading the old region")
        subscriber = recorder.subscribers[shm_name]
        with start_native9(RECREATE_AND_PUBLISH, name=shm_name, before=40, after=10) as native:
            native.wait_ready()
            native.tell()
            native.result()
        wait_until(lambda: recorder.summary.channels[shm_name].messages == 15, "the recorder reading the new region")
    finally:
        stop.set()
        thread.join(timeout=30)
    assert subscriber.rejoined == 1 and subscriber.lost == 40
    (file,) = recording_files(str(tmp_path))
    if format == "mcap":
        table = mcap.analysis_table(file)
        assert mcap.read_recording(file).losses[shm_name]["rejoins"] == [[table.column("recv_wall_ns")[5].as_py(), 1]]
    else:
        table = pyarrow.parquet.read_table(file)
    rows = table.select(["ring_pos", "lost", "rejoined"]).to_pylist()
    assert [(row["ring_pos"], row["rejoined"]) for row in rows] == [(pos, 0) for pos in range(5)] + [
        (pos, 1) for pos in range(40, 50)]
    assert [row["lost"] for row in rows] == [0] * 5 + [40] + [0] * 9
    assert recorder.summary.channels[shm_name].lost == 40


RECREATE_AND_PUBLISH = r"""
import time
ready()
wait_go()
region = kickmsg.SharedRegion.create(P["name"], kickmsg.ChannelType.PubSub,
                                     make_config(dict(max_subscribers=1, sub_ring_capacity=64, pool_size=256)), "native")
native_subscriber = kickmsg.Subscriber(region)  # the one ring: the recorder cannot follow yet
publisher = kickmsg.Publisher(region)
for seq in range(P["before"]):
    publisher.send(b"before %d" % seq)
native_subscriber = None  # leaves the ring (its write position stays)
deadline = time.monotonic() + 30
while not subscriber_joined(P["name"]) and time.monotonic() < deadline:
    time.sleep(0.005)  # until the recorder has followed and joined (native's own ring never waits)
for seq in range(P["after"]):
    publisher.send(b"after %d" % seq)
done(None)
"""
