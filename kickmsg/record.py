"""Recording channels to Parquet (or MCAP), and playing recordings back.

A recording is a directory of Parquet files (pyarrow), one row per message:

==============  =======  ==============================================
column          type     meaning
==============  =======  ==============================================
recording       string   id of the recorder run (monotonic times compare
                         only within one recording)
channel         string   shm name
ring_pos        int64    the recorder's ring position of the message
recv_mono_ns    int64    receive time, CLOCK_MONOTONIC ns
recv_wall_ns    int64    receive time, wall clock ns since the epoch
size            int32    payload length
lost            int64    messages the recorder lost on this channel just
                         before this one
stamp_ns        int64    the payload's first 8 bytes (little-endian), the
                         publish time if the payload is stamped
                         (``kickmsg.stamp``); null if shorter or >= 2**63
payload         binary   the message (absent with ``payload=False``)
==============  =======  ==============================================

A file being written is named ``*.parquet.partial`` until it is complete.
Each file's key-value metadata ``kickmsg.recording`` (JSON) names the
recording and each channel's geometry and schema descriptor, so that a
player can re-create the channels. The recorder subscribes like any other
subscriber: it never slows publishers down, and when it falls behind its own
losses are in the ``lost`` column.

With ``format="mcap"`` the same rows go to MCAP files instead
(``kickmsg.mcap_file``: Foxglove opens them); ``play`` plays both.
"""
import json
import os
import socket
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from types import ModuleType

import pyarrow
import pyarrow.parquet

from kickmsg import jsontext, stamp
from kickmsg.description import channel_config, describe
from kickmsg.publisher import Publisher, send_retrying
from kickmsg.region import SharedRegion
from kickmsg.subscriber import Subscriber

SCHEMA_KEY = b"kickmsg.recording"
COLUMNS = [
    ("recording", pyarrow.string()),
    ("channel", pyarrow.string()),
    ("ring_pos", pyarrow.int64()),
    ("recv_mono_ns", pyarrow.int64()),
    ("recv_wall_ns", pyarrow.int64()),
    ("size", pyarrow.int32()),
    ("lost", pyarrow.int64()),
    ("stamp_ns", pyarrow.int64()),
    ("payload", pyarrow.binary()),
]
FLUSH_INTERVAL_S = 0.5  # buffered rows reach the file at least this often
FORMATS = ("parquet", "mcap")
MCAP_MAGIC = b"\x89MCAP0\r\n"  # the first 8 bytes of an MCAP file
PARQUET_MAGIC = b"PAR1"  # the first (and last) 4 bytes of a Parquet file
MCAP_EXTRA = "pip install 'kickmsg-py[mcap]'"
PLAYER = "kickmsg-play"  # creator of the channels play makes, and name of its publishers


def mcap_module() -> ModuleType:
    """The MCAP module, or a one-line error naming the extra it needs."""
    try:
        from kickmsg import mcap_file
    except ImportError as error:
        raise RuntimeError(f"MCAP needs the mcap extra ({error}): {MCAP_EXTRA}") from None
    return mcap_file


@dataclass
class ChannelCounts:
    messages: int = 0
    lost: int = 0
    bytes: int = 0
    rejoined: int = 0  # times the channel was re-created and the recorder followed it


@dataclass
class RecordingSummary:
    recording: str
    files: list[str] = field(default_factory=list)
    channels: dict[str, ChannelCounts] = field(default_factory=dict)


class _ParquetFile:
    """One Parquet file of a recording."""

    def __init__(self, path: str, schema: pyarrow.Schema):
        self.writer = pyarrow.parquet.ParquetWriter(path, schema)
        self.schema = schema
        self.bytes = 0

    def write(self, rows: list[list]) -> None:
        columns = list(zip(*rows))
        table = pyarrow.Table.from_arrays(
            [pyarrow.array(values, type=column.type) for values, column in zip(columns, self.schema)], schema=self.schema
        )
        self.writer.write_table(table)
        self.bytes += table.nbytes  # uncompressed: rotation errs on the small side

    def size(self) -> int:
        return self.bytes

    def close(self) -> None:
        self.writer.close()


class _McapFile:
    """One MCAP file of a recording (the same rows as the Parquet columns)."""

    def __init__(self, path: str, metadata: dict, rotate_bytes: int):
        """Chunks no larger than the rotation size, so that a file can rotate."""
        recording = {key: metadata[key] for key in ("recording", "host", "started_wall_ns")}
        mcap_file = mcap_module()
        chunk_bytes = max(1, min(mcap_file.CHUNK_BYTES, rotate_bytes))
        self.writer = mcap_file.McapRecordingWriter(path, [recording], metadata["channels"], chunk_bytes)

    def write(self, rows: list[list]) -> None:
        for _, channel, ring_pos, recv_mono, recv_wall, _, lost, stamp_ns, payload in rows:
            self.writer.write_message(channel, ring_pos, recv_mono, recv_wall, lost, stamp_ns, payload)

    def size(self) -> int:
        return self.writer.size()

    def close(self) -> None:
        self.writer.close()


class Recorder:
    """Subscribes to channels and writes every message to Parquet (or MCAP).

    One receiving thread per channel (blocking zero-copy receives, without
    the GIL while waiting); the calling thread writes buffered rows every
    ``FLUSH_INTERVAL_S`` and rotates files past ``rotate_mb``.
    """

    def __init__(self, names: list[str], out_dir: str, rotate_mb: float = 64, payload: bool = True,
                 on_rejoin: Callable[[str, Subscriber], None] | None = None, format: str = "parquet"):
        """``on_rejoin(name, subscriber)`` is called (from that channel's
        thread) when a channel is re-created and the recorder follows it.
        ``format``: ``parquet`` or ``mcap`` (which needs the payloads)."""
        if not names:
            raise ValueError("the recorder needs at least one channel")
        if format not in FORMATS:
            raise ValueError(f"unknown recording format {format!r}: one of {', '.join(FORMATS)}")
        if format == "mcap" and not payload:
            raise ValueError("an MCAP recording needs the payloads (its messages carry them): drop --no-payload")
        if format == "mcap":
            mcap_module()  # the extra is there, before anything is subscribed
        self.format = format
        self.out_dir = out_dir
        self.rotate_bytes = int(rotate_mb * 1024 * 1024)
        self.payload = payload
        self.on_rejoin = on_rejoin
        started = time.time_ns()
        self.recording = f"{socket.gethostname()}-{os.getpid()}-{started}"
        self.summary = RecordingSummary(self.recording)
        self.regions = {name: SharedRegion.open(name) for name in names}
        self.metadata = {
            "recording": self.recording,
            "host": socket.gethostname(),
            "started_wall_ns": started,
            "channels": {name: describe(region) for name, region in self.regions.items()},
        }
        columns = COLUMNS if payload else COLUMNS[:-1]
        self.schema = pyarrow.schema(columns, metadata={SCHEMA_KEY: jsontext.dumps(self.metadata).encode()})
        self.rows: list[list] = []  # buffered rows, in arrival order
        self.lock = threading.Lock()
        self.stopping = threading.Event()
        self.writer: _ParquetFile | _McapFile | None = None  # the file being written
        os.makedirs(out_dir, exist_ok=True)

    def _receive(self, name: str, subscriber: Subscriber) -> None:
        """One channel's thread: every message becomes a buffered row."""
        counts = self.summary.channels[name]
        lost = 0
        while not self.stopping.is_set():
            view = subscriber.receive_view(0.1)
            if subscriber.rejoined != counts.rejoined:
                counts.rejoined = subscriber.rejoined
                if self.on_rejoin is not None:
                    self.on_rejoin(name, subscriber)
            if view is None:
                continue
            with view:
                received_mono, received_wall = time.monotonic_ns(), time.time_ns()
                head = stamp.read(view)
                size, lost_before = len(view), subscriber.lost - lost
                row = [self.recording, name, view.ring_pos, received_mono, received_wall, size, lost_before,
                       head if head is not None and head < 2**63 else None]
                if self.payload:
                    row.append(bytes(view))
            lost = subscriber.lost
            with self.lock:
                self.rows.append(row)
            counts.messages += 1
            counts.lost += lost_before
            counts.bytes += size

    def _flush(self) -> None:
        """Write the buffered rows; start a new file past the rotation size."""
        with self.lock:
            rows, self.rows = self.rows, []
        if not rows:
            return
        if self.writer is None:
            path = os.path.join(self.out_dir, f"{self.recording}-{len(self.summary.files):04d}.{self.format}")
            if self.format == "mcap":
                self.writer = _McapFile(path + ".partial", self.metadata, self.rotate_bytes)
            else:
                self.writer = _ParquetFile(path + ".partial", self.schema)
            self.summary.files.append(path)
        self.writer.write(rows)
        if self.writer.size() >= self.rotate_bytes:
            self._close_file()

    def _close_file(self) -> None:
        """Finish the current file and give it its name (a file being written
        is ``*.parquet.partial`` or ``*.mcap.partial``, so readers never see a
        half-written one)."""
        if self.writer is not None:
            self.writer.close()
            self.writer = None
        os.rename(self.summary.files[-1] + ".partial", self.summary.files[-1])

    def run(self, duration: float | None = None, stop: threading.Event | None = None) -> RecordingSummary:
        """Record until ``duration`` seconds pass or ``stop`` is set; every
        buffered row is written and the file closed before returning."""
        subscribers = {name: Subscriber(region) for name, region in self.regions.items()}
        for name in subscribers:
            self.summary.channels[name] = ChannelCounts()
        threads = [
            threading.Thread(target=self._receive, args=(name, subscriber), name=f"record {name}", daemon=True)
            for name, subscriber in subscribers.items()
        ]
        for thread in threads:
            thread.start()
        deadline = None if duration is None else time.monotonic() + duration
        stop = stop or threading.Event()
        try:
            while not stop.is_set():
                remaining = FLUSH_INTERVAL_S if deadline is None else min(FLUSH_INTERVAL_S, deadline - time.monotonic())
                if remaining <= 0:
                    break
                stop.wait(remaining)
                self._flush()
        finally:
            self.stopping.set()
            for thread in threads:
                thread.join()
            for subscriber in subscribers.values():
                subscriber.close()
            self._flush()
            if self.writer is not None:
                self._close_file()
        return self.summary


def recording_files(path: str) -> list[str]:
    """The Parquet or MCAP files of a recording directory (or a single file), in order."""
    if os.path.isfile(path):
        return [path]
    if not os.path.isdir(path):
        raise ValueError(f"no such file or directory: {path}")
    files = sorted(os.path.join(path, name) for name in os.listdir(path) if name.endswith((".parquet", ".mcap")))
    if not files:
        raise ValueError(f"no .parquet or .mcap files in {path}")
    return files


def file_format(file: str) -> str:
    """``mcap`` or ``parquet``, by the file's magic bytes; anything else is
    refused naming the file."""
    with open(file, "rb") as head:
        magic = head.read(8)
    if magic == MCAP_MAGIC:
        return "mcap"
    if magic[:4] == PARQUET_MAGIC:
        return "parquet"
    raise ValueError(f"{file} is not a recording: neither a Parquet nor an MCAP file")


def _parquet_messages(file: str) -> tuple[dict, list[tuple[str, str, int, bytes]]]:
    """A Parquet file's channel descriptions and its messages in receive order
    as (recording, channel, receive time ns, payload)."""
    table = pyarrow.parquet.read_table(file)
    if table.schema.metadata is None or SCHEMA_KEY not in table.schema.metadata:
        raise ValueError(f"{file} is not a kickmsg recording (no {SCHEMA_KEY.decode()} metadata)")
    if "payload" not in table.column_names:
        raise ValueError(f"{file} was recorded without payloads: nothing to play")
    metadata = json.loads(table.schema.metadata[SCHEMA_KEY])
    rows = table.sort_by([("recording", "ascending"), ("recv_mono_ns", "ascending")]).to_pydict()
    return metadata["channels"], list(zip(rows["recording"], rows["channel"], rows["recv_mono_ns"], rows["payload"]))


def _played_file(file: str) -> tuple[dict, Iterable[tuple[str, str, int, bytes]]]:
    """Channel descriptions and messages of one recording file, either format."""
    if file_format(file) == "mcap":
        recording, messages = mcap_module().played_messages(file)
        return recording.channels, messages
    return _parquet_messages(file)


def _open_or_create(name: str, description: dict) -> SharedRegion:
    """The channel if it exists, else created as it was recorded."""
    try:
        return SharedRegion.open(name)
    except FileNotFoundError:
        channel_type, config = channel_config(description)
        return SharedRegion.create_or_open(name, channel_type, config, PLAYER)


@dataclass
class PlaySummary:
    messages: int = 0
    dropped: int = 0  # the pool stayed empty for a second
    channels: set = field(default_factory=set)


def play(path: str, rate: float = 1.0, loop: bool = False, stop: threading.Event | None = None) -> PlaySummary:
    """Republish a recording (Parquet or MCAP files, or a directory of them)
    into its channels with the original timing (intervals divided by
    ``rate``). Channels that do not exist are created as recorded. With
    ``loop``, starts over until ``stop`` is set."""
    if rate <= 0:
        raise ValueError(f"rate must be positive, got {rate}")
    summary = PlaySummary()
    publishers = {}
    stop = stop or threading.Event()
    while True:
        clocks: dict[str, tuple[float, int]] = {}  # recording -> (our monotonic start, its first receive time)
        for file in recording_files(path):
            channels, messages = _played_file(file)
            for name, description in channels.items():
                if name not in publishers:
                    publishers[name] = Publisher(_open_or_create(name, description), name=PLAYER)
            for recording, channel, received, payload in messages:
                began, first = clocks.setdefault(recording, (time.monotonic(), received))
                due_in = began + (received - first) / 1e9 / rate - time.monotonic()
                if stop.wait(min(max(0.0, due_in), threading.TIMEOUT_MAX)):  # a slow rate may ask for centuries
                    return summary
                summary.channels.add(channel)
                if send_retrying(publishers[channel], payload, 1.0):
                    summary.messages += 1
                else:
                    summary.dropped += 1
        if not loop or stop.is_set():
            return summary
