"""kickmsg.spark: the ``kickmsg`` data source and the driver telemetry.

One local SparkSession (``local[2]``) serves the whole module. Every test has
its own prefix under the session's SESSION_PREFIX, and the channels under it
are unlinked at the end of the test. The other side of a channel (a paced
publisher, a subscriber reading what Spark wrote, a telemetry viewer) is a
real process started with ``nativepeer``: this package or the native
kickmsg 0.1.0. Waiting is always bounded; nothing asserts on durations.
"""
import atexit
import contextlib
import datetime
import itertools
import json
import os
import pathlib
import re
import signal
import struct
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from types import SimpleNamespace

import numpy as np
import pytest
from pyspark.sql import Row
from pyspark.sql.datasource import CaseInsensitiveDict
from pyspark.sql.types import (
    ArrayType,
    BinaryType,
    FloatType,
    LongType,
    StringType,
    StructField,
    StructType,
    TimestampType,
)

import kickmsg.spark
import rawregion
from conftest import SESSION_PREFIX, on_layout4
from kickmsg import ChannelType, Config, Node, Publisher, SharedRegion, Subscriber, typed
from kickmsg import owners
from kickmsg.spark.source import Receiver, StreamReader, Writer
from kickmsg.spark.telemetry import TELEMETRY_CONFIG, DriverTelemetry
from nativepeer import check_payload, make_payload, start_native, start_native9, start_ours, subscriber_joined

WAIT_S = 60.0  # upper bound of every wait (a loaded 2-core machine is slow, never this slow)
RING_FREE, RING_LIVE = 0, 1
RING_STATES_9 = ("Free", "Live", "Draining", "Reclaiming")  # RingStats.state's names, in their order

# Every ring holds every message of a test: nothing is lost.
ROOMY = {"max_subscribers": 4, "sub_ring_capacity": 256, "pool_size": 512, "max_payload_size": 256}

Sample = typed.RecordType("Sample", [("stamp", "<u8"), ("accel", "<f4", (3,)), ("tag", "S4")])

# -- snippets run in a subprocess by either implementation (see nativepeer) --------

PACED_PUBLISHER = """
import time
pub = kickmsg.Publisher(open_region({"name": P["name"]}))
began = time.monotonic()
for seq in range(P["count"]):
    time.sleep(max(0.0, began + seq / P["rate_hz"] - time.monotonic()))
    publish(pub, [seq], "send")
done({"published": P["count"]})
"""

PUBLISHER_ON_GO = """
pub = kickmsg.Publisher(open_region({"name": P["name"]}))
payloads = [make_payload(seq, P.get("max_body", 200)) for seq in range(P["count"])]
ready()
wait_go()
for payload in payloads:  # as fast as the implementation goes
    while True:
        try:
            pub.send(payload)
            break
        except BlockingIOError:
            pass
done({"published": len(payloads)})
"""

SUBSCRIBER = """
import time
sub = kickmsg.Subscriber(open_region({"name": P["name"]}))
ready()
payloads = []
deadline = time.monotonic() + P["seconds"]
while len(payloads) < P["count"] and time.monotonic() < deadline:
    data = sub.receive(0.1)
    if data is not None:
        payloads.append(bytes(data).hex())
extra = sub.receive(0.3)  # a duplicate would arrive now
if extra is not None:
    payloads.append(bytes(extra).hex())
done({"payloads": payloads, "lost": sub.lost})
"""

TELEMETRY_VIEWER = """
import json, time
node = kickmsg.Node("telemetry-viewer", P["prefix"])  # positional: 0.9.2 calls it namespace
sub = node.subscribe_or_create("spark.telemetry", make_config(P["config"]))
ready()
events = []
deadline = time.monotonic() + P["seconds"]
while time.monotonic() < deadline and not (events and events[-1]["kind"] == "telemetry_end"):
    data = sub.receive(0.1)
    if data is not None:
        events.append(json.loads(bytes(data)))
done(events)
"""

# -- fixtures and helpers ------------------------------------------------------------


def peer(impl: str, code: str, **params):
    """A subprocess running ``code`` with ``impl`` ("ours", "native" 0.1.0 or
    "native9" 0.9.2), killed after WAIT_S."""
    start = {"ours": start_ours, "native": start_native, "native9": start_native9}[impl]
    return start(code, timeout=WAIT_S, **params)


_prefixes = itertools.count()
_queries = itertools.count()


@pytest.fixture(scope="module")
def spark():
    session = kickmsg.spark.session("local[2]", "kickmsg-tests")
    yield session
    for query in session.streams.active:
        query.stop()
    session.stop()


@pytest.fixture
def prefix(spark):
    """A Node prefix of this test; its channels are unlinked at the end, and
    any streaming query still running is stopped."""
    value = f"{SESSION_PREFIX}_spark{next(_prefixes)}"
    yield value
    for query in spark.streams.active:
        query.stop()
    for path in pathlib.Path("/dev/shm").glob(f"{value}_*"):
        path.unlink(missing_ok=True)


def make_topic(prefix: str, topic: str, **cfg) -> str:
    """Create a PubSub topic with Node naming; its shm name."""
    Node("test", prefix=prefix).advertise(topic, Config(**cfg))
    return f"/{prefix}_{topic}"


def ring_states(name: str) -> list[int]:
    """The state of each ring of ``name``, of either layout (0 Free, 1 Live, ...)."""
    data = rawregion.read_bytes(name)
    if struct.unpack_from("<I", data, 8)[0] == 9:  # the version word
        region = SharedRegion.inspect(name)
        return [RING_STATES_9.index(ring.state) for ring in region.stats().rings]
    return [rawregion.ring(data, index).state for index in range(rawregion.header(data)["max_subs"])]


def make_channel(prefix: str, topic: str, layout: int) -> str:
    """A PubSub channel /{prefix}_{topic} (ROOMY) of ``layout``; its shm name."""
    name = f"/{prefix}_{topic}"
    SharedRegion.create(name, ChannelType.PubSub, Config(**ROOMY), "test", layout=layout)
    return name


def wait_for(predicate, what: str, timeout: float = WAIT_S) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            pytest.fail(f"timed out after {timeout:g} s waiting for {what}")
        time.sleep(0.02)


def ring_owner(name: str) -> int:
    """The pid of the process subscribed on ring 0 of ``name`` (as soon as it has recorded itself)."""
    wait_for(lambda: owners.read_owners(name, 1)[0][1], f"the owner record of {name}'s ring 0")
    return owners.read_owners(name, 1)[0][0].pid


def wait_for_subscriber(name: str, query=None, future=None) -> None:
    """Until the Spark side has joined ``name``: a ring is Live and its
    subscriber waits for messages (has_waiter; on layout 9 a ring is Live
    before its subscriber has chosen where to start reading, WIRE9.md B.4).
    Fails early if the query or the batch read has already failed."""

    def joined():
        if query is not None and query.exception() is not None:
            pytest.fail(f"the query failed: {query.exception()}")
        if future is not None and future.done():
            future.result()  # raises the read's error
            pytest.fail("the read finished before it subscribed")
        return subscriber_joined(name)

    wait_for(joined, f"a subscriber on {name}")


class Collector:
    """A streaming query's rows via foreachBatch, in arrival order, per micro-batch."""

    def __init__(self):
        self.batches = []  # (batch id, rows)
        self.lock = threading.Lock()

    def __call__(self, frame, batch_id):
        rows = frame.collect()
        with self.lock:
            self.batches.append((batch_id, rows))

    @property
    def rows(self) -> list:
        with self.lock:
            return [row for _, rows in self.batches for row in rows]


def start_stream(spark, options: dict) -> tuple:
    """Start a query reading ``format("kickmsg")`` with ``options``; (query, collector)."""
    collector = Collector()
    query = (
        spark.readStream.format("kickmsg").options(**options).load()
        .writeStream.foreachBatch(collector).queryName(f"kickmsg_test_{next(_queries)}")
        .trigger(processingTime="100 milliseconds").start()
    )
    return query, collector


def wait_for_rows(query, collector: Collector, predicate, what: str) -> list:
    def arrived():
        if query.exception() is not None:
            pytest.fail(f"the query failed: {query.exception()}")
        return predicate(collector.rows)

    wait_for(arrived, what)
    return collector.rows


def read_in_background(frame_reader):
    """Collect a batch read in a thread (it blocks for waitMs); a future."""
    executor = ThreadPoolExecutor(max_workers=1)
    future = executor.submit(lambda: frame_reader.load().collect())
    executor.shutdown(wait=False)
    return future


def seqs_of(rows) -> list[int]:
    return [check_payload(bytes(row.payload)) for row in rows]


# -- 1. streaming read ---------------------------------------------------------------


def test_stream_schema(spark, prefix):
    """Rows are topic, ring_pos, received_at, lost, payload; ``name`` designates the channel."""
    name = make_topic(prefix, "schema", **ROOMY)
    frame = spark.readStream.format("kickmsg").option("name", name).load()
    assert frame.isStreaming
    assert frame.schema == StructType([
        StructField("topic", StringType(), False),
        StructField("ring_pos", LongType(), False),
        StructField("received_at", TimestampType(), False),
        StructField("lost", LongType(), False),
        StructField("payload", BinaryType(), False),
    ])


@pytest.mark.parametrize("impl, by_name", [("ours", False), ("native", True), ("native9", True)],
                         ids=["ours-publisher-topic-option", "native-publisher-name-option", "native9-layout9-name-option"])
@on_layout4  # native 0.1.0 peers or the owner records of layout 4
def test_stream_receives_every_message_of_a_paced_publisher(spark, prefix, impl, by_name):
    """300 messages at 200 Hz from another process arrive once each, in order,
    none lost (native9: 0.9.2 publishing into a layout-9 channel)."""
    name = make_channel(prefix, "paced", 9) if impl == "native9" else make_topic(prefix, "paced", **ROOMY)
    options = {"name": name} if by_name else {"topic": "paced", "prefix": prefix}
    query, collector = start_stream(spark, options)
    wait_for_subscriber(name, query)
    with peer(impl, PACED_PUBLISHER, name=name, count=300, rate_hz=200.0) as publisher:
        assert publisher.result() == {"published": 300}
    wait_for_rows(query, collector, lambda rows: len(rows) >= 300, "300 rows")
    query.stop()
    rows = collector.rows  # with any duplicate of the last batches
    assert seqs_of(rows) == list(range(300))
    assert [row.ring_pos for row in rows] == list(range(300))
    assert sum(row.lost for row in rows) == 0
    assert {row.topic for row in rows} == {name if by_name else "paced"}
    assert all(isinstance(row.received_at, datetime.datetime) for row in rows)


def test_stream_decodes_typed_records(spark, prefix):
    """decode=true: one row per record, the record fields as columns after
    ``skipped``; a message that is not whole records is passed over and
    counted in the next row's ``skipped``."""
    node = Node("imu", prefix=prefix)
    publisher = typed.advertise(node, "imu", Sample, Config(max_payload_size=3 * Sample.dtype.itemsize))
    frame = spark.readStream.format("kickmsg").option("topic", "imu").option("prefix", prefix) \
        .option("decode", "true").load()
    assert [(field.name, field.dataType) for field in frame.schema.fields[3:]] == [
        ("lost", LongType()), ("skipped", LongType()),
        ("stamp", LongType()), ("accel", ArrayType(FloatType(), False)), ("tag", BinaryType())]
    query, collector = start_stream(spark, {"topic": "imu", "prefix": prefix, "decode": "true"})
    wait_for_subscriber(f"/{prefix}_imu", query)
    assert publisher.send(np.array([(1, (0.5, 1.5, 2.5), b"a"), (2, (3.0, 4.0, 5.0), b"bb"),
                                    (3, (-1.0, 0.0, 1.0), b"cccc")], dtype=Sample.dtype)) == 3
    Publisher(SharedRegion.open(f"/{prefix}_imu")).send(b"not a record")  # 12 bytes, records are 24
    assert publisher.send((4, (9.5, 9.75, 9.875), b"d")) == 1
    rows = wait_for_rows(query, collector, lambda rows: len(rows) >= 4, "4 records")
    query.stop()
    assert [(row.ring_pos, row.skipped, row.stamp, list(row.accel), bytes(row.tag)) for row in collector.rows] == [
        (0, 0, 1, [0.5, 1.5, 2.5], b"a"),
        (0, 0, 2, [3.0, 4.0, 5.0], b"bb"),
        (0, 0, 3, [-1.0, 0.0, 1.0], b"cccc"),
        (2, 1, 4, [9.5, 9.75, 9.875], b"d"),
    ]
    assert "payload" not in rows[0].asDict()


def test_decode_on_an_untyped_channel_is_refused(spark, prefix):
    name = make_topic(prefix, "plain", **ROOMY)
    with pytest.raises(Exception) as error:
        spark.readStream.format("kickmsg").option("name", name).option("decode", "true").load()
    assert "needs a typed channel" in str(error.value) and name in str(error.value)


def test_max_messages_per_batch_bounds_every_micro_batch(spark, prefix):
    """100 messages with maxMessagesPerBatch=30: every batch has at most 30 rows, all arrive."""
    name = make_topic(prefix, "bounded", **ROOMY)
    query, collector = start_stream(spark, {"name": name, "maxMessagesPerBatch": "30"})
    wait_for_subscriber(name, query)
    with peer("ours", PUBLISHER_ON_GO, name=name, count=100) as publisher:
        publisher.wait_ready()
        publisher.tell()
        publisher.result()
    rows = wait_for_rows(query, collector, lambda rows: len(rows) >= 100, "100 rows")
    # A batch's progress is reported once the batch has committed, just after foreachBatch.
    wait_for(lambda: sum(entry.numInputRows for entry in query.recentProgress) >= 100, "the last progress")
    progress = [entry for entry in query.recentProgress if entry.numInputRows > 0]
    query.stop()
    assert seqs_of(rows) == list(range(100))
    assert all(len(rows) <= 30 for _, rows in collector.batches)
    assert all(entry.numInputRows <= 30 for entry in progress)
    assert sum(entry.numInputRows for entry in progress) == 100


def stopped(task: pathlib.Path) -> bool:
    """Whether a thread (/proc/<pid>/task/<tid>) is stopped by a signal."""
    try:
        return (task / "stat").read_text().rpartition(")")[2].split()[0] in ("T", "t")
    except FileNotFoundError:  # the thread has ended
        return True


@contextlib.contextmanager
def paused(pid: int):
    """SIGSTOP a Spark Python process (checked to be one) for the block, then SIGCONT it."""
    with open(f"/proc/{pid}/cmdline", "rb") as cmdline:
        assert b"pyspark" in cmdline.read(), f"process {pid} is not one of Spark's Python processes"
    os.kill(pid, signal.SIGSTOP)
    try:
        wait_for(lambda: all(stopped(task) for task in pathlib.Path(f"/proc/{pid}/task").iterdir()),
                 f"every thread of {pid} to stop")  # kill() returns before they have
        yield
    finally:
        os.kill(pid, signal.SIGCONT)


@on_layout4  # native 0.1.0 peers or the owner records of layout 4
def test_ring_overflow_is_counted_in_lost(spark, prefix):
    """20 messages into a 2-entry ring while the query's receiver is paused:
    at most 2 rows, each row's ``lost`` is the gap in ring positions before
    it, and rows + losses == published."""
    name = make_topic(prefix, "tiny", max_subscribers=1, sub_ring_capacity=2, pool_size=8, max_payload_size=64)
    query, collector = start_stream(spark, {"name": name})
    wait_for_subscriber(name, query)
    publisher = Publisher(SharedRegion.open(name))
    with paused(ring_owner(name)):  # the process holding the subscriber: its receiver thread
        for seq in range(20):
            publisher.send(make_payload(seq, max_body=8))
    rows = wait_for_rows(query, collector, lambda rows: rows and rows[-1].ring_pos == 19, "the last message")
    query.stop()
    positions = [row.ring_pos for row in rows]
    assert len(rows) <= 2
    assert [row.lost for row in rows] == [pos - before - 1 for before, pos in zip([-1] + positions, positions)]
    assert seqs_of(rows) == positions
    assert len(rows) + sum(row.lost for row in rows) == 20


def test_stream_reads_the_buffer_limit_option(prefix):
    """maxBufferedMessages, given as Spark gives options to a source (a CaseInsensitiveDict)."""
    name = make_topic(prefix, "buffered", **ROOMY)
    reader = StreamReader(CaseInsensitiveDict({"name": name, "maxBufferedMessages": "5"}), None)
    reader.initialOffset()
    try:
        assert reader.receiver.buffer_limit == 5
    finally:
        reader.receiver.stop()


@on_layout4  # native 0.1.0 peers or the owner records of layout 4
def test_stopped_query_frees_its_ring(spark, prefix):
    """Once the query's source process is gone, its ring is Free again."""
    name = make_topic(prefix, "stop", **ROOMY)
    query, _ = start_stream(spark, {"name": name})
    wait_for_subscriber(name, query)
    owner = ring_owner(name)
    query.stop()
    wait_for(lambda: not os.path.exists(f"/proc/{owner}"), f"the exit of the source's process {owner}")
    assert ring_states(name)[0] == RING_FREE


@on_layout4
def test_the_source_leaves_its_ring_even_if_a_second_sigterm_cuts_into_its_exit(prefix, monkeypatch):
    """Spark ends the source's process with SIGTERM, which exits normally so
    that atexit leaves the ring; Spark may send another meanwhile. The first
    one's handler ignores the next ones, and a stop whose join is cut short
    still leaves the ring (a second SIGTERM used to leave it Live)."""
    name = make_topic(prefix, "sigterm", **ROOMY)
    installed = []  # (signal, handler) in the order the source sets them
    monkeypatch.setattr(signal, "signal", lambda number, handler: installed.append((number, handler)))
    monkeypatch.setattr(atexit, "register", lambda function: None)  # not this test process's exit
    receiver = Receiver({"name": name})
    [(number, on_sigterm)] = installed
    assert number == signal.SIGTERM
    with pytest.raises(SystemExit):
        on_sigterm(signal.SIGTERM, None)
    assert installed[1:] == [(signal.SIGTERM, signal.SIG_IGN)]  # before its exit begins

    def join_cut_short(timeout=None):
        raise SystemExit(0)  # what a second SIGTERM's handler did inside stop()

    monkeypatch.setattr(receiver.thread, "join", join_cut_short)
    with pytest.raises(SystemExit):
        receiver.stop()
    assert ring_states(name)[0] == RING_FREE


# -- 4. batch read -----------------------------------------------------------------


def read_while_publishing(spark, name: str, count: int, go_after_s: float = 0.0, **options) -> list:
    """A batch read of ``name`` with ``options``; once it has subscribed (and
    ``go_after_s`` later), another process publishes ``count`` messages. Its rows."""
    with peer("ours", PUBLISHER_ON_GO, name=name, count=count) as publisher:
        publisher.wait_ready()
        future = read_in_background(spark.read.format("kickmsg").option("name", name).options(**options))
        wait_for_subscriber(name, future=future)
        time.sleep(go_after_s)
        publisher.tell()
        publisher.result()
    rows = future.result(timeout=WAIT_S)
    wait_for(lambda: RING_LIVE not in ring_states(name), "the read to leave its ring")
    return rows


@pytest.mark.parametrize("layout", [4, 9])
def test_batch_read_returns_what_is_published_during_wait(spark, prefix, layout):
    """The messages another process publishes while the read waits are the rows."""
    name = make_channel(prefix, "batch", layout)
    rows = read_while_publishing(spark, name, 5, waitMs="3000")
    assert seqs_of(rows) == list(range(5))
    assert [(row.topic, row.ring_pos, row.lost) for row in rows] == [(name, pos, 0) for pos in range(5)]


def test_batch_read_waits_for_wait_ms(spark, prefix):
    """waitMs=6000: messages published 2 s after the read subscribed are still returned."""
    name = make_topic(prefix, "batch", **ROOMY)
    rows = read_while_publishing(spark, name, 5, go_after_s=2.0, waitMs="6000")
    assert seqs_of(rows) == list(range(5))


def test_batch_read_stops_at_max_messages(spark, prefix):
    """maxMessages=10 of 25 published: the first 10 rows, without waiting for waitMs."""
    name = make_topic(prefix, "batch", **ROOMY)
    rows = read_while_publishing(spark, name, 25, waitMs="120000", maxMessages="10")
    assert seqs_of(rows) == list(range(10))


# -- 5. batch write ----------------------------------------------------------------


def write(frame, prefix: str, topic: str, **options) -> None:
    frame.write.format("kickmsg").option("topic", topic).option("prefix", prefix).options(**options) \
        .mode("append").save()


@pytest.mark.parametrize("impl", ["ours", "native", "native9"])
@on_layout4  # native 0.1.0 peers or the owner records of layout 4
def test_write_payload_column_to_a_subscriber_process(spark, prefix, impl):
    """A binary ``payload`` column: each row is one message with exactly those
    bytes (native9: into a layout-9 topic, to a native 0.9.2 subscriber)."""
    if impl == "native9":
        name = f"/{prefix}_out"
        SharedRegion.create(name, ChannelType.PubSub, Config(**ROOMY), "test", layout=9)
    else:
        name = make_topic(prefix, "out", **ROOMY)
    payloads = [make_payload(seq) for seq in range(40)]
    frame = spark.createDataFrame([(payload,) for payload in payloads], "payload binary").repartition(2)
    with peer(impl, SUBSCRIBER, name=name, count=40, seconds=WAIT_S - 10) as subscriber:
        subscriber.wait_ready()
        write(frame, prefix, "out")
        result = subscriber.result()
    assert sorted(bytes.fromhex(payload) for payload in result["payloads"]) == sorted(payloads)
    assert result["lost"] == 0


@pytest.mark.parametrize("impl", ["ours", "native"])
@on_layout4  # native 0.1.0 peers or the owner records of layout 4
def test_write_rows_as_json_to_a_subscriber_process(spark, prefix, impl):
    """Without a payload column each row is a JSON object of its columns."""
    name = make_topic(prefix, "orders", **ROOMY)
    rows = [(i, f"item-{i}", 9.5 * i, [i, i + 1], None if i % 3 else "note") for i in range(30)]
    frame = spark.createDataFrame(rows, "id int, item string, price double, pair array<int>, note string") \
        .repartition(2)
    with peer(impl, SUBSCRIBER, name=name, count=30, seconds=WAIT_S - 10) as subscriber:
        subscriber.wait_ready()
        write(frame, prefix, "orders")
        result = subscriber.result()
    received = sorted((json.loads(bytes.fromhex(payload)) for payload in result["payloads"]), key=lambda d: d["id"])
    assert received == [{"id": i, "item": item, "price": price, "pair": pair, "note": note}
                        for i, item, price, pair, note in rows]


def test_write_creates_a_missing_topic(spark, prefix):
    """Without config options a new topic has Config()'s geometry; the writer is its creator."""
    name = f"/{prefix}_fresh"
    frame = spark.createDataFrame([(b"x" * 10,)], "payload binary").coalesce(1)  # one task: see the racing test
    write(frame, prefix, "fresh")
    header = rawregion.header(rawregion.read_bytes(name))
    defaults = Config()
    assert (header["max_subs"], header["sub_ring_capacity"], header["pool_size"], header["slot_data_size"]) == (
        defaults.max_subscribers, defaults.sub_ring_capacity, defaults.pool_size, defaults.max_payload_size)
    assert header["channel_type"] == ChannelType.PubSub
    assert header["creator_name"].startswith("spark-writer-")
    rawregion.assert_pool_whole(name)


def test_write_creates_a_missing_topic_with_the_config_options(spark, prefix):
    """maxSubscribers, subRingCapacity, poolSize, maxPayloadSize give the new topic's geometry."""
    name = f"/{prefix}_fresh"
    frame = spark.createDataFrame([(b"x" * 10,)], "payload binary").coalesce(1)
    write(frame, prefix, "fresh", maxSubscribers="3", subRingCapacity="16", poolSize="40", maxPayloadSize="200")
    header = rawregion.header(rawregion.read_bytes(name))
    assert (header["max_subs"], header["sub_ring_capacity"], header["pool_size"], header["slot_data_size"]) == (
        3, 16, 40, 200)
    assert header["channel_type"] == ChannelType.PubSub
    assert header["creator_name"].startswith("spark-writer-")
    rawregion.assert_pool_whole(name)
    write(frame, prefix, "fresh9", maxSubscribers="3", subRingCapacity="16", poolSize="40", maxPayloadSize="200",
          layout="9")
    region = SharedRegion.inspect(f"/{prefix}_fresh9")
    info = region.info()
    assert region.layout == 9 and (info.max_subs, info.sub_ring_capacity, info.pool_size, info.max_payload_size) == (
        3, 16, 40, 200)
    assert info.creator_name.startswith("spark-writer-") and region.stats().pool_free == 40


def test_write_joins_an_existing_topic_as_it_is(spark, prefix):
    """Config options do not change a topic that exists: it is joined, not re-created."""
    name = make_topic(prefix, "kept", max_subscribers=2, sub_ring_capacity=32, pool_size=64, max_payload_size=128)
    before = rawregion.header(rawregion.read_bytes(name))
    del before["free_top"]  # moves with every allocation
    subscriber = Subscriber(SharedRegion.open(name))
    frame = spark.createDataFrame([(bytes([i]) * 100,) for i in range(20)], "payload binary").repartition(2)
    write(frame, prefix, "kept", maxSubscribers="8", subRingCapacity="256", poolSize="999", maxPayloadSize="4096")
    after = rawregion.header(rawregion.read_bytes(name))
    del after["free_top"]
    assert after == before
    received = []
    while (data := subscriber.try_receive()) is not None:
        received.append(bytes(data))
    subscriber.close()
    assert sorted(received) == [bytes([i]) * 100 for i in range(20)]


def test_writer_waits_for_a_topic_another_task_is_creating(prefix):
    """The writer joins a topic whose creator finishes half a second later."""
    name = f"/{prefix}_racing"
    cfg = Config(max_subscribers=2, sub_ring_capacity=8, pool_size=16, max_payload_size=64)
    SharedRegion.create(name, ChannelType.PubSub, cfg, "other-task")
    with open(f"/dev/shm{name}", "r+b") as region_file:  # as a creator mid-way leaves it: no magic yet
        region_file.write(struct.pack("<Q", 0))
    creator = threading.Timer(0.5, SharedRegion.create, (name, ChannelType.PubSub, cfg, "other-task"))
    creator.start()
    try:
        options = {"name": name, "maxSubscribers": "2", "subRingCapacity": "8", "poolSize": "16", "maxPayloadSize": "64"}
        writer = Writer(options, StructType([StructField("payload", BinaryType())]))
        assert writer.write(iter([Row(payload=b"hello")])).published == 1
    finally:
        creator.join()


# -- 6. errors ----------------------------------------------------------------------


def test_stream_of_a_missing_topic_fails_naming_it(spark, prefix):
    query, _ = start_stream(spark, {"topic": "absent", "prefix": prefix})
    with pytest.raises(Exception) as error:
        query.awaitTermination(WAIT_S)
    assert f"/{prefix}_absent" in str(error.value)
    assert not query.isActive


def test_batch_read_of_a_missing_topic_fails_naming_it(spark, prefix):
    with pytest.raises(Exception) as error:
        spark.read.format("kickmsg").option("topic", "absent").option("prefix", prefix).load().collect()
    assert f"no such channel /{prefix}_absent" in str(error.value)


def test_write_of_an_oversize_row_fails(spark, prefix):
    make_topic(prefix, "small", max_subscribers=1, sub_ring_capacity=4, pool_size=8, max_payload_size=64)
    frame = spark.createDataFrame([(b"x" * 64,), (b"y" * 65,)], "payload binary").coalesce(1)
    with pytest.raises(Exception) as error:
        write(frame, prefix, "small")
    assert "65 bytes, more than max_payload_size 64" in str(error.value)


def test_write_into_an_exhausted_pool_fails(spark, prefix):
    """Publishers here hold all 4 slots allocated and unpublished: after
    poolWaitMs the job fails."""
    name = make_topic(prefix, "stuck", max_subscribers=1, sub_ring_capacity=2, pool_size=4, max_payload_size=64)
    region = SharedRegion.open(name)
    held = [Publisher(region).allocate(8) for _ in range(4)]
    assert None not in held
    frame = spark.createDataFrame([(bytes([i]),) for i in range(10)], "payload binary").coalesce(1)
    with pytest.raises(Exception) as error:
        write(frame, prefix, "stuck", poolWaitMs="200")
    assert f"the slot pool of {name} stayed exhausted" in str(error.value)
    del held


def test_missing_topic_and_name_options_are_reported(spark, prefix):
    """Without topic or name: a read, a write and a stream fail saying which options are needed."""
    message = re.escape("needs option 'topic' (with 'prefix') or 'name'")
    with pytest.raises(Exception, match=message):
        spark.read.format("kickmsg").option("prefix", prefix).load().collect()
    with pytest.raises(Exception, match=message):
        spark.createDataFrame([(b"x",)], "payload binary").write.format("kickmsg").mode("append").save()
    query, _ = start_stream(spark, {"prefix": prefix})
    with pytest.raises(Exception, match=message):
        query.awaitTermination(WAIT_S)


# -- 7. driver telemetry -------------------------------------------------------------


def telemetry_viewer(impl: str, prefix: str):
    """A process subscribed to /{prefix}_spark.telemetry (created by it, as
    DriverTelemetry would, if absent); ready when it returns."""
    config = {key: getattr(TELEMETRY_CONFIG, key) for key in Config._COUNT_FIELDS}
    viewer = peer(impl, TELEMETRY_VIEWER, prefix=prefix, config=config, seconds=WAIT_S - 10)
    viewer.wait_ready()
    return viewer


def run_small_job(spark) -> int:
    """A job of one 4-task stage; returns once Spark's status store, which the
    telemetry polls, has recorded its end."""
    tracker = spark.sparkContext.statusTracker()
    before = set(tracker.getJobIdsForGroup())
    total = spark.sparkContext.parallelize(range(1000), 4).map(lambda x: 2 * x).sum()

    def ended():
        new = set(tracker.getJobIdsForGroup()) - before
        return new and all(tracker.getJobInfo(job).status in ("SUCCEEDED", "FAILED") for job in new)

    wait_for(ended, "the status store to record the end of the job")
    return total


@pytest.mark.parametrize("impl", ["ours", "native", "native9"])
def test_telemetry_reports_a_job_to_another_process(spark, prefix, impl, monkeypatch):
    """telemetry_start, job_start, stage counters ending at completed == tasks,
    job_end SUCCEEDED, telemetry_end, all on /{prefix}_spark.telemetry
    (native9: a 0.9.2 viewer made it, of layout 9, and the telemetry, on
    layout 9 by $KICKMSG_LAYOUT, joins it).
    (interval=30: the one poll is the final one, after the job; a live poll
    can race the job's end, see test_telemetry_final_stage_counters_precede_job_end.)"""
    # the telemetry's layout: the viewer's (native 0.1.0 speaks layout 4 only)
    monkeypatch.setenv("KICKMSG_LAYOUT", "4" if impl == "native" else "9")
    with telemetry_viewer(impl, prefix) as viewer:
        with DriverTelemetry(spark, prefix=prefix, interval=30) as telemetry:
            assert run_small_job(spark) == 999_000
        events = viewer.result()
    regions = {path.name for path in pathlib.Path("/dev/shm").glob(f"{prefix}_*") if owners.sidecar_kind(path.name) is None}
    registry = set() if impl == "native" else {f"{prefix}_registry"}  # layout 9's participant registry
    assert regions == {f"{prefix}_spark.telemetry"} | registry  # the viewer's channel, no other
    events = [event for event in events if not event["kind"].startswith("query_")]  # late ones of earlier tests
    kinds = [event["kind"] for event in events]
    assert kinds == ["telemetry_start", "job_start", "stage", "job_end", "telemetry_end"]
    start, stage, end, summary = events[1:]
    assert events[0]["app"] == "kickmsg-tests"
    assert all(isinstance(event["t"], float) for event in events)
    assert start["stages"] == [stage["stage"]] and stage["job"] == start["job"]
    counters = [stage[key] for key in ("tasks", "active", "completed", "failed")]
    assert all(type(value) is int for value in counters)
    assert counters == [4, 0, 4, 0]
    assert end == {"kind": "job_end", "job": start["job"], "status": "SUCCEEDED", "t": end["t"]}
    assert (summary["published"], summary["dropped"]) == (telemetry.published, telemetry.dropped) == (5, 0)


def test_telemetry_reports_streaming_progress(spark, prefix):
    """A streaming query inside the block: query_progress events, batch ids increasing."""
    with telemetry_viewer("ours", prefix) as viewer:
        with DriverTelemetry(spark, prefix=prefix, interval=0.25):
            query = spark.readStream.format("rate-micro-batch").option("rowsPerBatch", 5).load() \
                .writeStream.format("noop").queryName(f"kickmsg_test_{next(_queries)}") \
                .trigger(processingTime="100 milliseconds").start()
            wait_for(lambda: len(query.recentProgress) >= 10, "10 micro-batches")
            query.stop()
        events = viewer.result()
    progress = [event for event in events if event["kind"] == "query_progress"]
    assert len(progress) >= 2
    assert {event["query"] for event in progress} == {str(query.id)}
    batches = [event["batch"] for event in progress]
    assert batches == sorted(set(batches))
    assert all(type(event["input_rows"]) is int for event in progress)
    kinds = [event["kind"] for event in events]
    assert "query_start" in kinds  # (query_end may come after the block has removed the listener)
    assert "job_start" in kinds  # each micro-batch is a job, announced by the poller


def test_telemetry_counts_a_full_pool_as_dropped(spark, prefix):
    """A viewer holds 2 of the 3 slots as views and its ring of 1 keeps the
    third: messages are dropped, the job runs on."""
    cfg = Config(max_subscribers=1, sub_ring_capacity=1, pool_size=3, max_payload_size=1024)
    node = Node("slow-viewer", prefix=prefix)
    publisher = node.advertise("spark.telemetry", cfg)
    viewer = node.subscribe("spark.telemetry")
    views = []
    for message in (b"one", b"two"):
        publisher.send(message)
        views.append(viewer.try_receive_view())
    with DriverTelemetry(spark, prefix=prefix, cfg=cfg) as telemetry:
        assert run_small_job(spark) == 999_000
    assert telemetry.published == 1  # into the one slot that was free; then the ring keeps it
    assert telemetry.dropped > 0
    for view in views:
        view.release()
    viewer.close()


class RacingTracker:
    """A fake status tracker: job 0 (one stage of 2 tasks) starts after the
    telemetry does, and its last task ends just after each stage read."""

    def __init__(self):
        self.started = False
        self.finished = False

    def getJobInfo(self, job):
        if job != 0 or not self.started:
            return None
        return SimpleNamespace(jobId=0, stageIds=[7], status="SUCCEEDED" if self.finished else "RUNNING")

    def getActiveJobsIds(self):
        return []

    def getStageInfo(self, stage):
        done = self.finished
        self.finished = True  # the last task ends right after this read
        return SimpleNamespace(numTasks=2, numActiveTasks=0 if done else 1, numCompletedTasks=2 if done else 1,
                               numFailedTasks=0)


def test_telemetry_final_stage_counters_precede_job_end(prefix):
    """The last stage event before job_end has completed == tasks, whatever the timing."""
    tracker = RacingTracker()
    fake_spark = SimpleNamespace(
        sparkContext=SimpleNamespace(statusTracker=lambda: tracker, appName="fake"),
        streams=SimpleNamespace(addListener=lambda listener: None, removeListener=lambda listener: None),
    )
    node = Node("viewer", prefix=prefix)
    node.advertise("spark.telemetry", TELEMETRY_CONFIG)
    viewer = node.subscribe("spark.telemetry")
    events = []
    with DriverTelemetry(fake_spark, prefix=prefix, interval=0.01):
        tracker.started = True
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and "job_end" not in [event["kind"] for event in events]:
            if (data := viewer.receive(0.1)) is not None:
                events.append(json.loads(data))
    viewer.close()
    kinds = [event["kind"] for event in events]
    assert "job_end" in kinds
    last_stage = [event for event in events[: kinds.index("job_end")] if event["kind"] == "stage"][-1]
    assert last_stage["completed"] == last_stage["tasks"] == 2


def fake_spark(tracker) -> SimpleNamespace:
    """What DriverTelemetry uses of a session, around a fake status tracker (no JVM)."""
    return SimpleNamespace(
        sparkContext=SimpleNamespace(statusTracker=lambda: tracker, appName="fake"),
        streams=SimpleNamespace(addListener=lambda listener: None, removeListener=lambda listener: None),
    )


def test_telemetry_publishes_into_a_topic_a_viewer_made_with_other_settings(prefix):
    """A native 0.9.2 viewer made the topic first, with settings of its own
    (16 rings of 64, 512-byte slots): the telemetry publishes into it as it
    is. Before, the driver died with RuntimeError Config mismatch."""
    config = dict(max_subscribers=16, sub_ring_capacity=64, pool_size=128, max_payload_size=512)
    with peer("native9", TELEMETRY_VIEWER, prefix=prefix, config=config, seconds=WAIT_S - 10) as viewer:
        viewer.wait_ready()
        with DriverTelemetry(fake_spark(RacingTracker()), prefix=prefix) as telemetry:
            pass
        events = viewer.result()
    assert [event["kind"] for event in events] == ["telemetry_start", "telemetry_end"]
    assert (telemetry.published, telemetry.dropped) == (2, 0)
    assert SharedRegion.open(f"/{prefix}_spark.telemetry").geometry.max_subs == 16  # the viewer's, kept


def test_telemetry_counts_events_too_large_for_the_topic_as_dropped(prefix):
    """A topic of 16-byte slots holds no event: each is counted in dropped,
    with one warning saying why, and the job goes on."""
    Node("viewer", prefix=prefix).advertise("spark.telemetry", Config(max_payload_size=16))
    with pytest.warns(RuntimeWarning, match=f"/{prefix}_spark.telemetry holds messages of up to 16 bytes; larger events"):
        with DriverTelemetry(fake_spark(RacingTracker()), prefix=prefix) as telemetry:
            pass
    assert (telemetry.published, telemetry.dropped) == (0, 2)


def test_telemetry_warns_and_carries_on_when_the_topic_cannot_be_published_into(prefix):
    """Something that is not a Kickmsg region holds the topic's name: a
    warning names it, the job goes on, every event counts in dropped."""
    path = pathlib.Path(f"/dev/shm/{prefix}_spark.telemetry")
    path.write_bytes(b"not a region" * 100)
    with pytest.warns(RuntimeWarning, match=f"cannot publish into /{prefix}_spark.telemetry .*the job goes on"):
        with DriverTelemetry(fake_spark(RacingTracker()), prefix=prefix) as telemetry:
            pass
    assert (telemetry.published, telemetry.dropped) == (0, 2)
    assert path.read_bytes() == b"not a region" * 100  # left as it was


def test_decoded_rows_carry_the_losses_of_the_messages_they_skip(prefix):
    """decode=true: the loss a skipped message (not whole records) carried
    goes onto the next row, and the skipped messages are counted there. The
    stream reader's buffer (maxBufferedMessages=1) overflows while it holds a
    message that is not a record: the 20 overflowed count as lost on the
    next message, also not a record, and both land on the record after them.
    Before, the decoded rows said lost 0 and nothing of the skipped ones."""
    name = f"/{prefix}_imu"
    publisher = typed.advertise(Node("imu", prefix=prefix), "imu", Sample, Config(**ROOMY))
    foreign = Publisher(SharedRegion.open(name))
    reader = StreamReader(CaseInsensitiveDict({"name": name, "maxBufferedMessages": "1"}), Sample)
    reader.initialOffset()
    receiver = reader.receiver
    try:
        foreign.send(b"bad")  # buffered
        wait_for(lambda: len(receiver.buffer) == 1, "the first message buffered")
        for _ in range(20):
            foreign.send(b"bad")  # the buffer is full: overflow
        wait_for(lambda: receiver.overflow == 20, "20 messages overflowing the buffer")
        assert list(reader.read({"received": 0})[0]) == []  # the first one, skipped
        foreign.send(b"bad")  # buffered, with the 20 lost before it
        wait_for(lambda: len(receiver.buffer) == 1, "the second message buffered")
        assert list(reader.read({"received": 1})[0]) == []  # skipped, its loss kept
        publisher.send((7, (1.0, 2.0, 3.0), b"ok"))
        wait_for(lambda: len(receiver.buffer) == 1, "the record buffered")
        (row,) = reader.read({"received": 2})[0]
    finally:
        receiver.stop()
    assert row[:2] == (name, 22) and row[3:6] == (20, 2, 7)  # topic, ring_pos; lost, skipped, stamp
