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
                         (``kickmsg.recording.stamp``); null if shorter or >= 2**63
rejoined        int32    times the recorder had followed the channel to a
                         re-created region (0 before any): ``ring_pos``
                         starts over with each, and the first row after one
                         has in ``lost`` what was unread in the old region
                         and what the new one held when it was joined
payload         binary   the message (absent with ``payload=False``)
==============  =======  ==============================================

A file being written is ``*.parquet.partial``: an Arrow IPC stream to which
every flush (``flush_interval``, 1 s by default) appends the rows received
since the last one; closing it (rotation, the end of the run) writes the
Parquet file. A recorder killed outright loses at most the rows of the last
flush interval: ``recover`` turns its ``.partial`` files into complete ones.
Each file's key-value metadata ``kickmsg.recording`` (JSON) names the
recording and each channel's layout (4 or 9), geometry and schema
descriptor, so that a player can re-create the channels. The recorder subscribes like any other
subscriber: it never slows publishers down, and when it falls behind its own
losses are in the ``lost`` column.

With ``format="mcap"`` the same rows go to MCAP files instead
(``kickmsg.recording.mcap``: Foxglove opens them; each flush writes a chunk);
``play`` plays both.
"""
import json
import math
import os
import socket
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from types import ModuleType
from typing import Any

import pyarrow
import pyarrow.ipc
import pyarrow.parquet

from kickmsg import jsontext, layouts, shm
from kickmsg.description import channel_config, describe, described_layout
from kickmsg.errors import RecordingError
from kickmsg.ops import diagnostics
from kickmsg.publisher import Publisher, send_retrying
from kickmsg.recording import stamp
from kickmsg.recording.files import CLOSING, COLUMNS, EARLIER_COLUMNS, FORMATS, PARTIAL, SCHEMA_KEY, file_format, recording_files
from kickmsg.region import SharedRegion
from kickmsg.subscriber import Subscriber

__all__ = [
    "ChannelCounts", "FLUSH_INTERVAL_S", "MCAP_EXTRA", "PLAYER", "PlaySummary", "Recorder", "RecordingSummary",
    "Recovered", "channel_names", "mcap_module", "play", "recording_channels", "recover",
]

FLUSH_INTERVAL_S = 1.0  # default: buffered rows reach the file (and survive a killed recorder) this often
MCAP_EXTRA = "pip install 'kickmsg-py[mcap]'"
PLAYER = "kickmsg-play"  # creator of the channels play makes, and name of its publishers


def mcap_module() -> ModuleType:
    """The MCAP module, or a one-line error naming the extra it needs."""
    try:
        from kickmsg.recording import mcap
    except ImportError as error:
        raise RuntimeError(f"MCAP needs the mcap extra ({error}): {MCAP_EXTRA}") from None
    return mcap


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
    skipped: dict[str, str] = field(default_factory=dict)  # channel -> why it is not being recorded (at the end)


class _ParquetFile:
    """One Parquet file of a recording, written first as an Arrow IPC stream
    (``PATH.partial``): each ``write`` appends a record batch and hands it to
    the operating system, so a killed recorder keeps it; ``close`` writes the
    Parquet file ``PATH`` from the stream."""

    def __init__(self, path: str, schema: pyarrow.Schema):
        self.path = path
        self.sink = open(path + PARTIAL, "wb")
        self.stream = pyarrow.ipc.new_stream(self.sink, schema)
        self.schema = schema
        self.bytes = 0

    def write(self, rows: list[list]) -> None:
        """Append the rows and flush them to the file."""
        columns = list(zip(*rows))
        table = pyarrow.Table.from_arrays(
            [pyarrow.array(values, type=column.type) for values, column in zip(columns, self.schema)], schema=self.schema
        )
        self.stream.write_table(table)
        self.sink.flush()
        self.bytes += table.nbytes  # uncompressed: rotation errs on the small side

    def size(self) -> int:
        return self.bytes

    def close(self) -> None:
        self.stream.close()
        self.sink.close()
        _parquet_from_stream(self.path + PARTIAL, self.path)


class _McapFile:
    """One MCAP file of a recording (the same rows as the Parquet columns)."""

    def __init__(self, path: str, metadata: dict, rotate_bytes: int):
        """Written as ``PATH.partial``, renamed ``PATH`` when closed; chunks
        no larger than the rotation size, so that a file can rotate."""
        self.path = path
        recording = {key: metadata[key] for key in ("recording", "host", "started_wall_ns")}
        mcap = mcap_module()
        chunk_bytes = max(1, min(mcap.CHUNK_BYTES, rotate_bytes))
        self.writer = mcap.McapRecordingWriter(path + PARTIAL, [recording], metadata["channels"], chunk_bytes)

    def write(self, rows: list[list]) -> None:
        """Append the rows and flush them to the file (a chunk of their own)."""
        for _, channel, ring_pos, recv_mono, recv_wall, _, lost, stamp_ns, rejoined, payload in rows:
            self.writer.write_message(channel, ring_pos, recv_mono, recv_wall, lost, stamp_ns, payload, rejoined)
        self.writer.flush()

    def size(self) -> int:
        return self.writer.size()

    def close(self) -> None:
        self.writer.close()
        os.rename(self.path + PARTIAL, self.path)


class Recorder:
    """Subscribes to channels and writes every message to Parquet (or MCAP).

    One receiving thread per channel (blocking zero-copy receives, without
    the GIL while waiting); the calling thread writes buffered rows to the
    file every ``flush_interval`` seconds, rotates files past ``rotate_mb``
    and, with ``discover``, looks for new channels.

    A channel found by ``discover`` that cannot be joined (no ring to spare:
    a mailbox whose one ring is taken, a full channel) is skipped, and so
    is a recorded channel re-created with no ring to spare: ``on_skipped(name,
    reason)`` is called once, the other channels are recorded on, and the
    join is tried again at each flush (``on_found`` or ``on_rejoin`` then
    tells it succeeded).
    """

    def __init__(self, names: list[str], out_dir: str, rotate_mb: float = 64, payload: bool = True,
                 on_rejoin: Callable[[str, Subscriber], None] | None = None, format: str = "parquet",
                 flush_interval: float = FLUSH_INTERVAL_S, discover: str | None = None,
                 on_found: Callable[[str], None] | None = None,
                 on_skipped: Callable[[str, str], None] | None = None):
        """``on_rejoin(name, subscriber)`` is called (from that channel's
        thread) when a channel is re-created and the recorder follows it.
        ``format``: ``parquet`` or ``mcap`` (which needs the payloads).
        ``flush_interval``: seconds between writes to the file, what a
        recorder killed outright loses at most. ``discover``: also record
        every channel whose name starts with ``/discover`` (``""``: every
        channel), those created later included (looked for at each flush);
        ``on_found(name)`` is called for each one found after the start
        (or joined after it was skipped); ``on_skipped(name, reason)`` for
        each one skipped (see above)."""
        if not names and discover is None:
            raise ValueError("the recorder needs at least one channel, or a prefix to discover channels by")
        if not (math.isfinite(flush_interval) and flush_interval > 0):
            raise ValueError(f"flush_interval must be a finite number of seconds above 0, got {flush_interval!r}")
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
        self.on_found = on_found
        self.on_skipped = on_skipped
        self.flush_interval = flush_interval
        started = time.time_ns()
        self.recording = f"{socket.gethostname()}-{os.getpid()}-{started}"
        self.summary = RecordingSummary(self.recording)
        self.discover = None if discover is None else discover.lstrip("/")
        self.regions = {name: SharedRegion.open(name) for name in names}
        self.subscribers: dict[str, Subscriber] = {}
        self.skip_lock = threading.Lock()  # the channels' threads skip too
        if discover is not None:
            self.subscribers = self._join_found(self._new_channels())
            self.regions.update({name: subscriber.region for name, subscriber in self.subscribers.items()})
        self.metadata: dict[str, Any] = {
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
        self.threads: list[threading.Thread] = []  # one receiving thread per channel
        os.makedirs(out_dir, exist_ok=True)

    def _new_channels(self) -> dict[str, SharedRegion]:
        """The channels named ``/discover...`` not recorded yet (a region
        being created, damaged or not ours to read is looked at next time)."""
        found = {}
        for name in channel_names(self.discover or ""):
            if name not in self.regions:
                try:
                    found[name] = SharedRegion.open(name)
                except (RuntimeError, ValueError, OSError):
                    continue
        return found

    def _join_found(self, found: dict[str, SharedRegion]) -> dict[str, Subscriber]:
        """Subscribers of the channels found; one that cannot be joined is
        skipped (looked at again next time)."""
        joined = {}
        for name, region in found.items():
            try:
                joined[name] = Subscriber(region)
            except RuntimeError as error:  # e.g. No free subscriber slots
                self._skip(name, error)
        return joined

    def _skip(self, name: str, error: Exception) -> None:
        """Note that ``name`` is not being recorded, and why; tell it once."""
        reason = str(error).splitlines()[0]
        with self.skip_lock:
            told = name in self.summary.skipped
            self.summary.skipped[name] = reason
        if not told and self.on_skipped is not None:
            self.on_skipped(name, reason)

    def _unskip(self, name: str) -> None:
        """``name`` is recorded again (if it was skipped, no longer)."""
        with self.skip_lock:
            self.summary.skipped.pop(name, None)

    def _start_receiving(self, name: str, subscriber: Subscriber) -> None:
        """Start the receiving thread of one channel."""
        self.subscribers[name] = subscriber
        self.summary.channels[name] = ChannelCounts()
        thread = threading.Thread(target=self._receive, args=(name, self.subscribers[name]), name=f"record {name}",
                                  daemon=True)
        self.threads.append(thread)
        thread.start()

    def _record_new_channels(self) -> None:
        """Start recording the channels that appeared since the last look; the
        file being written is closed first (its metadata lists the channels)."""
        joined = self._join_found(self._new_channels())
        if not joined:
            return
        if self.writer is not None:
            self._close_file()
        self.regions.update({name: subscriber.region for name, subscriber in joined.items()})
        self.metadata["channels"].update({name: describe(subscriber.region) for name, subscriber in joined.items()})
        self.schema = self.schema.with_metadata({SCHEMA_KEY: jsontext.dumps(self.metadata).encode()})
        for name, subscriber in joined.items():
            self._unskip(name)
            self._start_receiving(name, subscriber)
            if self.on_found is not None:
                self.on_found(name)

    def _receive(self, name: str, subscriber: Subscriber) -> None:
        """One channel's thread: every message becomes a buffered row."""
        counts = self.summary.channels[name]
        lost = 0
        while not self.stopping.is_set():
            try:
                view = subscriber.receive_view(0.1)
            except RuntimeError as error:  # re-created with no ring to spare: try again at the next flush
                self._skip(name, error)
                self.stopping.wait(self.flush_interval)
                continue
            if subscriber.rejoined != counts.rejoined:
                self._unskip(name)
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
                       head if head is not None and head < 2**63 else None, counts.rejoined]
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
                self.writer = _McapFile(path, self.metadata, self.rotate_bytes)
            else:
                self.writer = _ParquetFile(path, self.schema)
            self.summary.files.append(path)
        self.writer.write(rows)
        if self.writer.size() >= self.rotate_bytes:
            self._close_file()

    def _close_file(self) -> None:
        """Finish the current file and give it its name (a file being written
        is ``*.parquet.partial`` or ``*.mcap.partial``, so readers never see a
        half-written one)."""
        if self.writer is not None:
            self.writer.close()  # and renames it
            self.writer = None

    def run(self, duration: float | None = None, stop: threading.Event | None = None) -> RecordingSummary:
        """Record until ``duration`` seconds pass or ``stop`` is set; every
        buffered row is written and the file closed before returning."""
        for name, region in self.regions.items():
            self._start_receiving(name, self.subscribers[name] if name in self.subscribers else Subscriber(region))
        deadline = None if duration is None else time.monotonic() + duration
        stop = stop or threading.Event()
        try:
            while not stop.is_set():
                remaining = self.flush_interval if deadline is None else min(self.flush_interval, deadline - time.monotonic())
                if remaining <= 0:
                    break
                stop.wait(remaining)
                self._flush()
                if self.discover is not None:
                    self._record_new_channels()
        finally:
            self.stopping.set()
            for thread in self.threads:
                thread.join()
            for subscriber in self.subscribers.values():
                subscriber.close()
            self._flush()
            if self.writer is not None:
                self._close_file()
        return self.summary


def channel_names(prefix: str) -> list[str]:
    """The Kickmsg regions in /dev/shm whose name starts with ``/prefix``
    (every one for ``""``), sorted."""
    names = []
    for entry in diagnostics.shm_objects(prefix):
        try:
            if not diagnostics.is_sidecar(entry) and diagnostics.is_kickmsg(diagnostics.read_magic_and_version(entry.path)):
                names.append("/" + entry.name)
        except OSError:  # removed meanwhile, or not ours to read
            continue
    return names


def _flushed_batches(partial: str) -> tuple[pyarrow.Schema, list[pyarrow.RecordBatch]]:
    """The schema and the complete record batches of a ``.parquet.partial``
    stream; one cut short by a killed recorder ends at its last complete
    batch."""
    source = pyarrow.memory_map(partial)
    try:
        reader = pyarrow.ipc.open_stream(source)
    except (pyarrow.ArrowException, OSError) as error:
        raise RecordingError(f"{partial} holds no complete row (remove it): {error}") from None
    columns = reader.schema.remove_metadata()
    if not any(columns.equals(pyarrow.schema(recorded)) for recorded in (COLUMNS, COLUMNS[:-1], EARLIER_COLUMNS,
                                                                          EARLIER_COLUMNS[:-1])):
        raise RecordingError(f"{partial} does not have a recording's columns: {', '.join(columns.names)}")
    batches = []
    while True:
        try:
            batch = reader.read_next_batch()
            batch.validate(full=True)  # offsets within the buffers, before anything reads them
        except StopIteration:
            break
        except (pyarrow.ArrowException, OSError):  # the batch being written when the recorder was killed
            break
        batches.append(batch)
    return reader.schema, batches


def _parquet_from_stream(partial: str, out: str) -> int:
    """Write the rows of a ``.parquet.partial`` stream as the Parquet file
    ``out`` (through ``out.closing``, renamed when complete), remove the
    stream, and return the number of rows."""
    schema, batches = _flushed_batches(partial)
    table = pyarrow.Table.from_batches(batches, schema)
    pyarrow.parquet.write_table(table, out + CLOSING)
    os.replace(out + CLOSING, out)
    os.unlink(partial)
    return table.num_rows


def _writer_pid(partial: str) -> tuple[str, int] | None:
    """(recording id, pid) of the recorder that wrote a ``.partial`` file,
    if it ran on this host; None for another host."""
    if partial.endswith(".mcap" + PARTIAL):
        recording = mcap_module().partial_recording(partial)
    else:
        metadata = _flushed_batches(partial)[0].metadata or {}
        recording = json.loads(metadata.get(SCHEMA_KEY, b"{}"))
    host, run = recording.get("host", ""), recording.get("recording", "")
    if host != socket.gethostname() or not run.startswith(host + "-"):
        return None
    return run, int(run[len(host) + 1:].split("-")[0])  # recording ids are HOST-PID-START


@dataclass
class Recovered:
    file: str  # the complete file written
    messages: int  # messages it holds


def _recover_file(partial: str) -> Recovered:
    """One ``.partial`` file made complete (see ``recover``)."""
    out = partial.removesuffix(PARTIAL)
    if os.path.exists(out):
        raise RecordingError(f"{out} exists already: {partial} is left over from it (remove one of them)")
    writer = _writer_pid(partial)
    if writer is not None and diagnostics.pid_alive(writer[1]):
        raise RecordingError(f"{partial} is still being written by recorder {writer[0]} (pid {writer[1]} is alive)")
    if out.endswith(".mcap"):
        return Recovered(out, mcap_module().recover(partial, out))
    return Recovered(out, _parquet_from_stream(partial, out))


def recover(path: str) -> list[Recovered]:
    """Turn the ``.partial`` files a killed recorder left (``path``: one such
    file, or a recording directory) into complete files of the same names
    without ``.partial``, holding every message flushed before the recorder
    died. Refused for a file whose recorder is still running, or whose
    complete file exists."""
    if os.path.isdir(path):
        partials = sorted(os.path.join(path, name) for name in os.listdir(path) if name.endswith(PARTIAL))
        if not partials:
            raise ValueError(f"no .partial files in {path}: nothing to recover")
    elif os.path.isfile(path):
        if not path.endswith((".parquet" + PARTIAL, ".mcap" + PARTIAL)):
            raise RecordingError(f"{path} is not a recording being written (*.parquet.partial or *.mcap.partial)")
        partials = [path]
    else:
        raise ValueError(f"no such file or directory: {path}")
    recovered = []
    for partial in partials:
        try:
            recovered.append(_recover_file(partial))
        except (ValueError, KeyError, TypeError, AttributeError) as error:  # what damaged metadata gives
            if os.path.exists(partial.removesuffix(PARTIAL) + CLOSING):
                os.unlink(partial.removesuffix(PARTIAL) + CLOSING)
            if partial in str(error):
                raise
            raise RecordingError(f"{partial} cannot be recovered (damaged?): {type(error).__name__}: {error}") from None
    return recovered


def _parquet_messages(file: str) -> tuple[dict, list[tuple[str, str, int, bytes]]]:
    """A Parquet file's channel descriptions and its messages in receive order
    as (recording, channel, receive time ns, payload)."""
    table = pyarrow.parquet.read_table(file)
    if table.schema.metadata is None or SCHEMA_KEY not in table.schema.metadata:
        raise RecordingError(f"{file} is not a kickmsg recording (no {SCHEMA_KEY.decode()} metadata)")
    if "payload" not in table.column_names:
        raise RecordingError(f"{file} was recorded without payloads: nothing to play")
    metadata = json.loads(table.schema.metadata[SCHEMA_KEY])
    rows = table.sort_by([("recording", "ascending"), ("recv_mono_ns", "ascending")]).to_pydict()
    return metadata["channels"], list(zip(rows["recording"], rows["channel"], rows["recv_mono_ns"], rows["payload"]))


def _played_file(file: str) -> tuple[dict, Iterable[tuple[str, str, int, bytes]]]:
    """Channel descriptions and messages of one recording file, either format."""
    if file_format(file) == "mcap":
        recording, messages = mcap_module().played_messages(file)
        return recording.channels, messages
    return _parquet_messages(file)


def recording_channels(path: str) -> dict[str, dict]:
    """The channels of a recording (every file of it), as recorded: shm
    name -> geometry and schema descriptor."""
    channels: dict[str, dict] = {}
    for file in recording_files(path):
        if file_format(file) == "mcap":
            found = mcap_module().read_recording(file).channels
        else:
            metadata = pyarrow.parquet.read_schema(file).metadata or {}
            if SCHEMA_KEY not in metadata:
                raise RecordingError(f"{file} is not a kickmsg recording (no {SCHEMA_KEY.decode()} metadata)")
            found = json.loads(metadata[SCHEMA_KEY])["channels"]
        for name, description in found.items():
            channels.setdefault(name, description)
    return channels


def _open_or_create(name: str, description: dict, layout: int | None) -> SharedRegion:
    """The channel if it exists, else created as it was recorded, with
    ``layout`` if given, else the layout recorded."""
    try:
        return SharedRegion.open(name)
    except FileNotFoundError:
        channel_type, config = channel_config(description)
        chosen = described_layout(description) if layout is None else layout
        return SharedRegion.create_or_open(name, channel_type, config, PLAYER, layout=chosen)


@dataclass
class PlaySummary:
    messages: int = 0
    dropped: int = 0  # the pool stayed empty for a second
    channels: set = field(default_factory=set)


def play(path: str, rate: float = 1.0, loop: bool = False, stop: threading.Event | None = None,
         remap: dict[str, str] | None = None, only: list[str] | None = None, layout: int | None = None) -> PlaySummary:
    """Republish a recording (Parquet or MCAP files, or a directory of them)
    into its channels with the original timing (intervals divided by
    ``rate``). Channels that do not exist are created as recorded, with
    ``layout`` (4 or 9) if given, else the layout recorded. With
    ``loop``, starts over until ``stop`` is set. ``only``: the recorded
    channels to play (default all); ``remap``: recorded name -> the name to
    publish it under. A name in either that the recording lacks is refused."""
    if rate <= 0:
        raise ValueError(f"rate must be positive, got {rate}")
    if layout is not None:
        layouts.check_layout(layout)
    remap = remap or {}
    recorded = recording_channels(path)
    for option, names in (("only", only or []), ("remap", list(remap))):
        for name in names:
            if name not in recorded:
                raise ValueError(f"{option} {name}: the recording has no such channel (it has {', '.join(sorted(recorded))})")
    for name in remap.values():
        shm.check_name(name)
    summary = PlaySummary()
    publishers = {}
    stop = stop or threading.Event()
    while True:
        clocks: dict[str, tuple[float, int]] = {}  # recording -> (our monotonic start, its first receive time)
        for file in recording_files(path):
            channels, messages = _played_file(file)
            for name, description in channels.items():
                if name not in publishers and (only is None or name in only):
                    publishers[name] = Publisher(_open_or_create(remap.get(name, name), description, layout), name=PLAYER)
            for recording, channel, received, payload in messages:
                if channel not in publishers:
                    continue
                began, first = clocks.setdefault(recording, (time.monotonic(), received))
                due_in = began + (received - first) / 1e9 / rate - time.monotonic()
                if stop.wait(min(max(0.0, due_in), threading.TIMEOUT_MAX)):  # a slow rate may ask for centuries
                    return summary
                summary.channels.add(remap.get(channel, channel))
                if send_retrying(publishers[channel], payload, 1.0):
                    summary.messages += 1
                else:
                    summary.dropped += 1
        if not loop or stop.is_set():
            return summary
