"""The ``kickmsg`` Spark data source (Python Data Source API of Spark 4).

Options: ``topic`` (with ``prefix``, default ``kickmsg``: Node naming) or
``name`` (the shm name).

- ``spark.readStream.format("kickmsg")``: a subscriber on the driver's host,
  joined when the query starts. A background thread receives continuously
  into a bounded buffer (``maxBufferedMessages``, default 100 000); each
  micro-batch takes what arrived since the previous one, at most
  ``maxMessagesPerBatch`` (default 10 000) messages.
- ``spark.read.format("kickmsg")``: subscribes and collects what arrives
  within ``waitMs`` (default 1000) or until ``maxMessages`` (default 10 000).
- ``df.write.format("kickmsg")``: one message per row (a binary ``payload``
  column, else every column as JSON: binary as base64, times in ISO 8601). Each task joins the channel as it
  exists, or creates it as ``advertise_or_join`` does with the config
  options ``maxSubscribers``, ``subRingCapacity``, ``poolSize``,
  ``maxPayloadSize`` (defaults as ``Config()``) and ``layout`` (4 or 9,
  default ``$KICKMSG_LAYOUT`` of the task, else
  ``kickmsg.layouts.DEFAULT_LAYOUT``); an empty pool is retried
  with backoff for up to ``poolWaitMs`` (default 5000), then the task fails.

Rows read: ``topic, ring_pos, received_at, lost, payload`` where ``lost``
counts the messages the subscriber lost just before this one. With
``decode=true`` on a typed channel (``kickmsg.typed``) the record fields
become columns in place of ``payload``, one row per record, after a column
``skipped``: the messages passed over just before this one because they
were not whole records (empty, or a size that is not a multiple of the
record's). ``lost`` and ``skipped`` are on the first row of a message's
records (0 on the others), and the losses of a skipped message go onto
the next row, so that summing either column counts each message once.

Delivery is at most once: the channel is lossy by design (losses are in
``lost``), a query sees only what is published after it starts, and a
restarted query starts from now (Kickmsg keeps no history to replay).
"""
import atexit
import base64
import collections
import datetime
import os
import signal
import sys
import threading
import time
from collections.abc import Iterator, Mapping
from typing import Any

import numpy
from pyspark.sql import Row
from pyspark.sql.datasource import (
    DataSource,
    DataSourceReader,
    DataSourceWriter,
    InputPartition,
    SimpleDataSourceStreamReader,
    WriterCommitMessage,
)
from pyspark.sql.types import (
    ArrayType,
    BinaryType,
    BooleanType,
    ByteType,
    DataType,
    DoubleType,
    FloatType,
    IntegerType,
    LongType,
    ShortType,
    StringType,
    StructField,
    StructType,
    TimestampType,
)

from kickmsg import jsontext
from kickmsg.config import ChannelType, Config
from kickmsg.errors import RegionNotFoundError
from kickmsg.publisher import Publisher, send_retrying
from kickmsg.layouts import check_layout
from kickmsg.region import SharedRegion
from kickmsg.subscriber import Subscriber
from kickmsg.typed import RecordType

__all__ = [
    "BASE_FIELDS", "BatchReader", "Commit", "KickmsgDataSource", "Message", "NUMPY_TO_SPARK", "PAYLOAD_FIELD",
    "Receiver", "RowMaker", "StreamReader", "Writer", "channel_name", "record_type_of", "spark_type", "subscribe",
]

BASE_FIELDS = [
    StructField("topic", StringType(), False),
    StructField("ring_pos", LongType(), False),
    StructField("received_at", TimestampType(), False),
    StructField("lost", LongType(), False),
]
PAYLOAD_FIELD = StructField("payload", BinaryType(), False)
SKIPPED_FIELD = StructField("skipped", LongType(), False)  # decode=true: messages not whole records, passed over
NUMPY_TO_SPARK = {
    "b": BooleanType(),
    "i1": ByteType(),
    "i2": ShortType(),
    "i4": IntegerType(),
    "i8": LongType(),
    "u1": ShortType(),
    "u2": IntegerType(),
    "u4": LongType(),
    "u8": LongType(),  # values above 2**63 - 1 cannot be represented
    "f2": FloatType(),
    "f4": FloatType(),
    "f8": DoubleType(),
}


def channel_name(options: Mapping[str, str]) -> str:
    """The shm name the options designate."""
    if "name" in options:
        return options["name"]
    if "topic" in options:
        return f"/{options.get('prefix', 'kickmsg')}_{options['topic']}"
    raise ValueError("the kickmsg data source needs option 'topic' (with 'prefix') or 'name'")


def spark_type(dtype: numpy.dtype) -> DataType:
    """The Spark type holding values of a numpy field type."""
    if dtype.subdtype is not None:
        base, shape = dtype.subdtype
        element = spark_type(base)
        for _ in shape:
            element = ArrayType(element, False)
        return element
    if dtype.names:
        return StructType([StructField(name, spark_type(dtype[name])) for name in dtype.names])
    if dtype.kind == "S" or dtype.kind == "V":
        return BinaryType()
    if dtype.kind == "U":
        return StringType()
    key = "b" if dtype.kind == "b" else f"{dtype.kind}{dtype.itemsize}"
    if key not in NUMPY_TO_SPARK:
        raise ValueError(f"no Spark type for numpy field type {dtype}")
    return NUMPY_TO_SPARK[key]


def record_type_of(name: str) -> RecordType:
    """The record type of a typed channel (for decode=true)."""
    schema = SharedRegion.inspect(name).schema()
    record_type = RecordType.from_schema(schema) if schema is not None else None
    if record_type is None:
        raise ValueError(f"option decode=true needs a typed channel (kickmsg.typed); {name} is not one")
    return record_type


class KickmsgDataSource(DataSource):
    """``format("kickmsg")``: read, stream and write Kickmsg channels."""

    @classmethod
    def name(cls) -> str:
        return "kickmsg"

    def _decode(self) -> RecordType | None:
        if self.options.get("decode", "false").lower() != "true":
            return None
        return record_type_of(channel_name(self.options))

    def schema(self) -> StructType:
        record_type = self._decode()
        if record_type is None:
            return StructType(BASE_FIELDS + [PAYLOAD_FIELD])
        dtype = record_type.dtype
        if not dtype.names:
            return StructType(BASE_FIELDS + [SKIPPED_FIELD, StructField("value", spark_type(dtype))])
        return StructType(BASE_FIELDS + [SKIPPED_FIELD] + [StructField(n, spark_type(dtype[n])) for n in dtype.names])

    def reader(self, schema: StructType) -> "BatchReader":
        return BatchReader(self.options, self._decode())

    def simpleStreamReader(self, schema: StructType) -> "StreamReader":
        return StreamReader(self.options, self._decode())

    def writer(self, schema: StructType, overwrite: bool) -> "Writer":
        return Writer(self.options, schema)


class RowMaker:
    """Turns received messages into rows of the source's schema."""

    def __init__(self, options: Mapping[str, str], record_type: RecordType | None) -> None:
        self.topic = options.get("topic", channel_name(options))
        self.record_type = record_type
        self.lost = 0  # decode: lost before the messages skipped since the last row
        self.skipped = 0  # decode: messages skipped since the last row (not whole records)

    def rows(self, payload: bytes, ring_pos: int, received_at: datetime.datetime, lost: int) -> list[tuple[Any, ...]]:
        if self.record_type is None:
            return [(self.topic, ring_pos, received_at, lost, payload)]
        dtype = self.record_type.dtype
        if not payload or len(payload) % dtype.itemsize:  # not whole records: a foreign message, skipped
            self.lost += lost
            self.skipped += 1
            return []
        lost, skipped = self.lost + lost, self.skipped
        self.lost = self.skipped = 0
        records = numpy.frombuffer(payload, dtype=dtype)
        if not dtype.names:
            values = [(record.tolist(),) for record in records]
        else:
            values = [tuple(record[name].tolist() for name in dtype.names) for record in records]
        first = (self.topic, ring_pos, received_at, lost, skipped)
        later = (self.topic, ring_pos, received_at, 0, 0)
        return [(later if index else first) + value for index, value in enumerate(values)]


def subscribe(options: Mapping[str, str]) -> Subscriber:
    name = channel_name(options)
    try:
        return Subscriber(SharedRegion.open(name))
    except FileNotFoundError:
        raise RegionNotFoundError(f"kickmsg data source: no such channel {name}") from None


class BatchReader(DataSourceReader):
    """``spark.read``: what arrives within waitMs, at most maxMessages."""

    def __init__(self, options: Mapping[str, str], record_type: RecordType | None) -> None:
        self.options = options  # Spark's CaseInsensitiveDict: maxMessages == maxmessages
        self.record_type = record_type

    def partitions(self) -> list[InputPartition]:
        return [InputPartition(0)]

    def read(self, partition: InputPartition) -> Iterator[tuple[Any, ...]]:
        maker = RowMaker(self.options, self.record_type)
        deadline = time.monotonic() + int(self.options.get("waitMs", 1000)) / 1000
        remaining = int(self.options.get("maxMessages", 10_000))
        with subscribe(self.options) as subscriber:
            lost = 0
            while remaining > 0 and (wait := deadline - time.monotonic()) > 0:
                view = subscriber.receive_view(wait)
                if view is None:
                    break
                with view:
                    payload, ring_pos = bytes(view), view.ring_pos
                yield from maker.rows(payload, ring_pos, datetime.datetime.now(), subscriber.lost - lost)
                lost = subscriber.lost
                remaining -= 1


Message = tuple[bytes, int, datetime.datetime, int]  # RowMaker.rows' arguments: payload, ring_pos, received_at, lost


def _exit_once(*_: object) -> None:
    """SIGTERM: exit normally, so that atexit leaves the ring; a second
    SIGTERM meanwhile (Spark may send more) must not cut that short."""
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    sys.exit(0)


class Receiver:
    """A subscriber and a background thread that receives continuously into
    a bounded buffer, for the stream reader."""

    def __init__(self, options: Mapping[str, str]) -> None:
        self.buffer: collections.deque[Message] = collections.deque()
        self.buffer_limit = int(options.get("maxBufferedMessages", 100_000))
        self.overflow = 0  # messages dropped because the buffer was full
        self.lock = threading.Lock()
        self.subscriber = subscribe(options)
        self.running = True
        self.thread = threading.Thread(target=self._receive, name="kickmsg-receiver", daemon=True)
        self.thread.start()
        # Spark ends this process with SIGTERM, without telling the reader: exit
        # normally instead, so that atexit leaves the ring before the end.
        atexit.register(self.stop)
        signal.signal(signal.SIGTERM, _exit_once)

    def _receive(self) -> None:
        lost = 0
        while self.running:
            try:
                view = self.subscriber.receive_view(0.1)
            except ValueError:
                if self.running:
                    raise
                return  # closed by a stop that could not wait for this thread
            if view is None:
                continue
            with view:
                payload, ring_pos = bytes(view), view.ring_pos
            missed, lost = self.subscriber.lost - lost, self.subscriber.lost
            with self.lock:
                if len(self.buffer) >= self.buffer_limit:
                    self.overflow += 1 + missed
                    continue
                self.buffer.append((payload, ring_pos, datetime.datetime.now(), missed + self.overflow))
                self.overflow = 0

    def take(self, limit: int) -> list[Message]:
        """Up to ``limit`` buffered messages, oldest first."""
        with self.lock:
            return [self.buffer.popleft() for _ in range(min(len(self.buffer), limit))]

    def stop(self) -> None:
        """Stop receiving and leave the ring (idempotent)."""
        if self.running:
            self.running = False
            try:
                self.thread.join(timeout=5)
            finally:
                self.subscriber.close()


class StreamReader(SimpleDataSourceStreamReader):
    """``spark.readStream``: a subscriber held for the query's life, in the
    driver-side Python process Spark keeps for this source. It joins the
    ring when the query asks for its first offset (Spark pickles the reader
    before that, so the live part is created then, and never pickled)."""

    def __init__(self, options: Mapping[str, str], record_type: RecordType | None) -> None:
        self.options = options  # Spark's CaseInsensitiveDict: maxMessages == maxmessages
        self.maker = RowMaker(options, record_type)
        self.max_per_batch = int(options.get("maxMessagesPerBatch", 10_000))
        self.receiver: Receiver | None = None

    def __getstate__(self) -> dict[str, Any]:
        return dict(self.__dict__, receiver=None)

    def initialOffset(self) -> dict:
        self.receiver = self.receiver or Receiver(self.options)
        return {"received": 0}

    def read(self, start: dict) -> tuple[Iterator[tuple[Any, ...]], dict]:
        """What arrived since the previous micro-batch (at most maxMessagesPerBatch)."""
        self.receiver = self.receiver or Receiver(self.options)
        taken = self.receiver.take(self.max_per_batch)
        rows = [row for message in taken for row in self.maker.rows(*message)]
        return iter(rows), {"received": start["received"] + len(taken)}

    def readBetweenOffsets(self, start: dict, end: dict) -> Iterator[tuple[Any, ...]]:
        """A batch replayed after a failure: Kickmsg keeps no history, so
        nothing (delivery is at most once)."""
        return iter([])

    def commit(self, end: dict) -> None:
        pass


def _json_value(value: object) -> str:
    """JSON for the column types json does not know: binary as base64,
    dates and times in ISO 8601, decimals and the rest as text."""
    if isinstance(value, (bytes, bytearray)):
        return base64.b64encode(value).decode("ascii")
    if isinstance(value, (datetime.date, datetime.datetime)):
        return value.isoformat()
    return str(value)


class Commit(WriterCommitMessage):
    def __init__(self, published: int) -> None:
        self.published = published


class Writer(DataSourceWriter):
    """``df.write``: one message per row, every task a publisher."""

    def __init__(self, options: Mapping[str, str], schema: StructType) -> None:
        self.options = options  # Spark's CaseInsensitiveDict: maxMessages == maxmessages
        self.name = channel_name(options)
        self.payload_column = any(f.name == "payload" and isinstance(f.dataType, BinaryType) for f in schema.fields)
        self.pool_wait_s = int(options.get("poolWaitMs", 5000)) / 1000
        self.layout = None if "layout" not in options else check_layout(int(options["layout"]), "the layout option")

    def _config(self) -> Config:
        defaults = Config()
        return Config(
            max_subscribers=int(self.options.get("maxSubscribers", defaults.max_subscribers)),
            sub_ring_capacity=int(self.options.get("subRingCapacity", defaults.sub_ring_capacity)),
            pool_size=int(self.options.get("poolSize", defaults.pool_size)),
            max_payload_size=int(self.options.get("maxPayloadSize", defaults.max_payload_size)),
        )

    def write(self, iterator: Iterator[Row]) -> Commit:
        try:  # an existing channel is joined as it is
            region = SharedRegion.open(self.name)
        except RuntimeError:  # missing, or another task is creating it: as advertise_or_join does
            region = SharedRegion.create_or_open(self.name, ChannelType.PubSub, self._config(), f"spark-writer-{os.getpid()}",
                                                 layout=self.layout)
        publisher = Publisher(region)
        limit = publisher.region.geometry.slot_data_size
        published = 0
        for row in iterator:
            payload = bytes(row["payload"]) if self.payload_column else jsontext.dumps(row.asDict(recursive=True), default=_json_value).encode()
            if len(payload) > limit:
                raise ValueError(
                    f"kickmsg writer: row {published} is {len(payload)} bytes, more than max_payload_size {limit} of {self.name}"
                )
            if not send_retrying(publisher, payload, self.pool_wait_s):
                raise RuntimeError(
                    f"kickmsg writer: the slot pool of {self.name} stayed exhausted for "
                    f"{self.pool_wait_s:g} s after {published} message(s) of this task "
                    "(subscribers hold every slot: read faster or enlarge poolSize)"
                )
            published += 1
        return Commit(published)

    def commit(self, messages: list[WriterCommitMessage | None]) -> None:
        total = sum(message.published for message in messages if isinstance(message, Commit))
        print(f"kickmsg: published {total} message(s) to {self.name} from {len(messages)} task(s)", flush=True)
