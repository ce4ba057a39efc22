"""Recording channels to Parquet, and playing recordings back.

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
"""
import json
import os
import socket
import threading
import time
from dataclasses import dataclass, field

import pyarrow
import pyarrow.parquet

from kickmsg import stamp
from kickmsg.config import ChannelType, Config
from kickmsg.publisher import Publisher, send_retrying
from kickmsg.region import SharedRegion
from kickmsg.schema import SchemaInfo
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


def _channel_description(region: SharedRegion) -> dict:
    """What a player needs to re-create the channel."""
    g = region.geometry
    schema = region.schema()
    return {
        "channel_type": g.channel_type,
        "max_subscribers": g.max_subs,
        "sub_ring_capacity": g.capacity,
        "pool_size": g.pool_size,
        "max_payload_size": g.slot_data_size,
        "commit_timeout_us": g.commit_timeout_us,
        "schema": None if schema is None else {
            "identity": schema.identity.hex(), "layout": schema.layout.hex(), "name": schema.name,
            "version": schema.version, "identity_algo": schema.identity_algo,
            "layout_algo": schema.layout_algo, "flags": schema.flags,
        },
    }


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


class Recorder:
    """Subscribes to channels and writes every message to Parquet.

    One receiving thread per channel (blocking zero-copy receives, without
    the GIL while waiting); the calling thread writes buffered rows every
    ``FLUSH_INTERVAL_S`` and rotates files past ``rotate_mb``.
    """

    def __init__(self, names: list[str], out_dir: str, rotate_mb: float = 64, payload: bool = True, on_rejoin=None):
        """``on_rejoin(name, subscriber)`` is called (from that channel's
        thread) when a channel is re-created and the recorder follows it."""
        if not names:
            raise ValueError("the recorder needs at least one channel")
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
            "channels": {name: _channel_description(region) for name, region in self.regions.items()},
        }
        columns = COLUMNS if payload else COLUMNS[:-1]
        self.schema = pyarrow.schema(columns, metadata={SCHEMA_KEY: json.dumps(self.metadata).encode()})
        self.rows = []  # buffered rows, in arrival order
        self.lock = threading.Lock()
        self.stopping = threading.Event()
        self.writer = None
        self.file_bytes = 0  # written to the current file
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
                row = [self.recording, name, view.ring_pos, received_mono, received_wall, len(view),
                       subscriber.lost - lost, head if head is not None and head < 2**63 else None]
                if self.payload:
                    row.append(bytes(view))
            lost = subscriber.lost
            with self.lock:
                self.rows.append(row)
            counts.messages += 1
            counts.lost += row[6]
            counts.bytes += row[5]

    def _flush(self) -> None:
        """Write the buffered rows; start a new file past the rotation size."""
        with self.lock:
            rows, self.rows = self.rows, []
        if not rows:
            return
        if self.writer is None:
            path = os.path.join(self.out_dir, f"{self.recording}-{len(self.summary.files):04d}.parquet")
            self.writer = pyarrow.parquet.ParquetWriter(path + ".partial", self.schema)
            self.summary.files.append(path)
            self.file_bytes = 0
        columns = list(zip(*rows))
        table = pyarrow.Table.from_arrays(
            [pyarrow.array(values, type=column.type) for values, column in zip(columns, self.schema)], schema=self.schema
        )
        self.writer.write_table(table)
        self.file_bytes += table.nbytes  # uncompressed: rotation errs on the small side
        if self.file_bytes >= self.rotate_bytes:
            self._close_file()

    def _close_file(self) -> None:
        """Finish the current file and give it its name (a file being written
        is ``*.parquet.partial``, so readers never see a half-written one)."""
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
    """The Parquet files of a recording directory (or a single file), in order."""
    if os.path.isfile(path):
        return [path]
    files = sorted(os.path.join(path, name) for name in os.listdir(path) if name.endswith(".parquet"))
    if not files:
        raise ValueError(f"no .parquet files in {path}")
    return files


def _open_or_create(name: str, description: dict) -> SharedRegion:
    """The channel if it exists, else created as it was recorded."""
    try:
        return SharedRegion.open(name)
    except FileNotFoundError:
        schema = description["schema"]
        config = Config(
            max_subscribers=description["max_subscribers"],
            sub_ring_capacity=description["sub_ring_capacity"],
            pool_size=description["pool_size"],
            max_payload_size=description["max_payload_size"],
            commit_timeout=description["commit_timeout_us"] / 1e6,
            schema=None if schema is None else SchemaInfo(
                identity=bytes.fromhex(schema["identity"]), layout=bytes.fromhex(schema["layout"]),
                name=schema["name"], version=schema["version"], identity_algo=schema["identity_algo"],
                layout_algo=schema["layout_algo"], flags=schema["flags"],
            ),
        )
        return SharedRegion.create_or_open(name, ChannelType(description["channel_type"]), config, "kickmsg-play")


@dataclass
class PlaySummary:
    messages: int = 0
    dropped: int = 0  # the pool stayed empty for a second
    channels: set = field(default_factory=set)


def play(path: str, rate: float = 1.0, loop: bool = False, stop: threading.Event | None = None) -> PlaySummary:
    """Republish a recording into its channels with the original timing
    (intervals divided by ``rate``). Channels that do not exist are created
    as recorded. With ``loop``, starts over until ``stop`` is set."""
    if rate <= 0:
        raise ValueError(f"rate must be positive, got {rate}")
    summary = PlaySummary()
    publishers = {}
    stop = stop or threading.Event()
    while True:
        clocks = {}  # recording -> (our monotonic start, its first receive time)
        for file in recording_files(path):
            table = pyarrow.parquet.read_table(file)
            if "payload" not in table.column_names:
                raise ValueError(f"{file} was recorded without payloads: nothing to play")
            metadata = json.loads(table.schema.metadata[SCHEMA_KEY])
            for name, description in metadata["channels"].items():
                if name not in publishers:
                    publishers[name] = Publisher(_open_or_create(name, description))
            rows = table.sort_by([("recording", "ascending"), ("recv_mono_ns", "ascending")]).to_pydict()
            for recording, channel, received, payload in zip(
                rows["recording"], rows["channel"], rows["recv_mono_ns"], rows["payload"]
            ):
                began, first = clocks.setdefault(recording, (time.monotonic(), received))
                if stop.wait(max(0.0, began + (received - first) / 1e9 / rate - time.monotonic())):
                    return summary
                summary.channels.add(channel)
                if send_retrying(publishers[channel], payload, 1.0):
                    summary.messages += 1
                else:
                    summary.dropped += 1
        if not loop or stop.is_set():
            return summary
