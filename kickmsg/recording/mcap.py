"""Recordings as MCAP files (Foxglove), written and read with the ``mcap`` library.

One MCAP channel per kickmsg channel, topic = the shm name; chunks are
zstd-compressed. Every message is JSON (``json`` encoding, ``jsonschema``
schema):

- a typed channel (``kickmsg.typed``; its descriptor rebuilds to a
  ``RecordType``) carries the record's fields, ``{"stamp_ns": ..., "x":
  ...}``; a message of several records is ``{"_records": [{...}, ...]}``,
  one that is not a whole number of records ``{"_payload": BASE64}``. A
  record type that is not a struct is the field ``value``. Byte strings
  (``|S``) are base64, non-finite floats the strings ``NaN``,
  ``Infinity``, ``-Infinity`` (JSON has no such numbers). A record type
  with a field JSON has no form for here (complex, datetime, void) or a
  field named ``_records`` or ``_payload`` is recorded as untyped;
- any other channel: ``{"payload": BASE64}``. JSON cannot hold raw bytes;
  base64 (``contentEncoding: base64``) is how JSON Schema, and so Foxglove,
  marks binary data, and it costs 4/3 of the size before compression.

Message fields: ``log_time`` = receive time (wall clock, ns since the
epoch); ``publish_time`` = the payload's stamp (``kickmsg.recording.stamp``,
CLOCK_MONOTONIC) moved to the wall clock, ``recv_wall - (recv_mono -
stamp)``, when the stamp is 0 to 60 s before receipt, else the receive time;
``sequence`` = the ring position (mod 2**32: the field is 32 bits).
Metadata records: ``kickmsg.recording`` (the recorder run),
``kickmsg.channel`` (one per channel: geometry and schema descriptor, what
``play`` needs to re-create it) and ``kickmsg.losses`` (one per channel:
messages, lost, ``[ring_pos, lost]`` for each message the recorder lost
messages before, and ``rejoins``: ``[log_time, rejoined]`` where the
recorder's count of re-created regions it followed changes, the Parquet
column ``rejoined``); their values are JSON text, but for the plain texts
``recording``, ``host`` and ``channel``.
"""
import base64
import bisect
import json
import os
import struct
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import IO, Any

import numpy as np
import pyarrow.parquet
import zstandard
from mcap.exceptions import McapError
from mcap.reader import SeekingReader
from mcap.records import Channel, Message, Metadata
from mcap.stream_reader import StreamReader
from mcap.well_known import MessageEncoding, SchemaEncoding
from mcap.writer import CompressionType, Writer

import kickmsg
from kickmsg import jsontext
from kickmsg.description import schema_from_json
from kickmsg.errors import RecordingError
from kickmsg.recording.files import COLUMNS, SCHEMA_KEY, file_format, recording_files
from kickmsg.typed import RecordType

__all__ = [
    "CHUNK_BYTES", "ConvertSummary", "MAPPING_KEY", "McapRecording", "McapRecordingWriter", "PAYLOAD_SCHEMA_NAME",
    "RESERVED_KEYS", "SEQUENCE_MASK", "STAMP_WINDOW_NS", "TEXT_KEYS", "analysis_table", "channel_record_type",
    "convert", "decode_records", "encode_records", "partial_recording", "played_messages", "publish_time",
    "read_recording", "recover",
]

PAYLOAD_SCHEMA_NAME = "kickmsg.Payload"
MAPPING_KEY = "kickmsg.mapping"  # channel metadata: "fields" (typed records) or "payload" (base64)
STAMP_WINDOW_NS = 60 * 10**9  # a stamp this far before receipt at most is a publish time (as the analysis)
SEQUENCE_MASK = 0xFFFFFFFF
CHUNK_BYTES = 1024 * 1024  # the mcap library's default chunk size
RESERVED_KEYS = ("_records", "_payload")
TEXT_KEYS = ("recording", "host", "channel")  # metadata values kept as text; the others are JSON


# -- numpy records <-> JSON ---------------------------------------------------


def _as_struct(dtype: np.dtype) -> np.dtype:
    """A record dtype with fields: a plain one becomes the field ``value``."""
    return dtype if dtype.names else np.dtype([("value", dtype)])


def _fields(dtype: np.dtype) -> list[tuple[str, np.dtype]]:
    """A struct dtype's fields as (name, dtype), in order."""
    fields: Mapping[str, tuple] = dtype.fields or {}
    return [(name, fields[name][0]) for name in dtype.names or ()]


def _supported(dtype: np.dtype) -> bool:
    """Whether every field of ``dtype`` has a JSON form here."""
    if dtype.subdtype is not None:
        return _supported(dtype.subdtype[0])
    if dtype.names:
        return all(_supported(inner) for _, inner in _fields(dtype))
    return dtype.kind in "iufbSU"


def _json_schema(dtype: np.dtype) -> dict[str, Any]:
    """The JSON Schema of one value of ``dtype``."""
    if dtype.subdtype is not None:
        base, shape = dtype.subdtype
        schema = _json_schema(base)
        for length in reversed(shape):
            schema = {"type": "array", "items": schema, "minItems": length, "maxItems": length}
        return schema
    if dtype.names:
        return {"type": "object", "properties": {name: _json_schema(inner) for name, inner in _fields(dtype)}}
    if dtype.kind in "iu":
        return {"type": "integer"}
    if dtype.kind == "f":
        return {"type": ["number", "string"], "description": "NaN, Infinity, -Infinity as strings"}
    if dtype.kind == "b":
        return {"type": "boolean"}
    if dtype.kind == "S":
        return {"type": "string", "contentEncoding": "base64"}
    return {"type": "string"}


def _to_json(value: Any, dtype: np.dtype) -> Any:
    """One value of ``dtype`` (a numpy scalar, record or subarray) as JSON data."""
    if dtype.subdtype is not None:
        base = dtype.subdtype[0]
        return [_to_json(item, base) if np.ndim(item) == 0 else _to_json(item, np.dtype((base, np.shape(item))))
                for item in np.asarray(value)]
    if dtype.names:
        return {name: _to_json(value[name], inner) for name, inner in _fields(dtype)}
    if dtype.kind in "iu":
        return int(value)
    if dtype.kind == "f":
        return jsontext.number(float(value))
    if dtype.kind == "b":
        return bool(value)
    if dtype.kind == "S":
        return base64.b64encode(bytes(value).ljust(dtype.itemsize, b"\0")).decode("ascii")
    return str(value)


def _from_json(value: Any, dtype: np.dtype) -> Any:
    """JSON data back to what numpy assigns to a value of ``dtype``."""
    if dtype.subdtype is not None:
        base, shape = dtype.subdtype
        inner = base if len(shape) == 1 else np.dtype((base, shape[1:]))
        return [_from_json(item, inner) for item in value]
    if dtype.names:
        return tuple(_from_json(value[name], inner) for name, inner in _fields(dtype))
    if dtype.kind == "f":
        return jsontext.NON_FINITE[value] if isinstance(value, str) else float(value)
    if dtype.kind == "S":
        return base64.b64decode(value, validate=True)
    return value


def encode_records(payload: bytes, record_type: RecordType) -> dict[str, Any]:
    """A typed message as JSON data: the record's fields, ``_records`` for
    several, ``_payload`` (base64) if it is not a whole number of records."""
    dtype = _as_struct(record_type.dtype)
    if not payload or len(payload) % dtype.itemsize:
        return {"_payload": base64.b64encode(payload).decode("ascii")}
    records = [_to_json(record, dtype) for record in np.frombuffer(payload, dtype=dtype)]
    return records[0] if len(records) == 1 else {"_records": records}


def decode_records(message: dict[str, Any], record_type: RecordType) -> bytes:
    """The payload bytes of a typed message's JSON data (padding between
    fields comes back as zeros)."""
    if "_payload" in message:
        return base64.b64decode(message["_payload"], validate=True)
    records = message["_records"] if "_records" in message else [message]
    dtype = _as_struct(record_type.dtype)
    array = np.zeros(len(records), dtype=dtype)
    for index, record in enumerate(records):
        array[index] = _from_json(record, dtype)
    return array.tobytes()


def channel_record_type(description: dict[str, Any]) -> RecordType | None:
    """The record type a recorded channel carries, if its fields map to JSON."""
    schema = description.get("schema")
    if schema is None:
        return None
    record_type = RecordType.from_schema(schema_from_json(schema))
    if record_type is None or not _supported(record_type.dtype):
        return None
    if any(key in (record_type.dtype.names or ()) for key in RESERVED_KEYS):
        return None
    return record_type


# -- writing ------------------------------------------------------------------


def publish_time(recv_mono_ns: int, recv_wall_ns: int, stamp_ns: int | None) -> int:
    """The stamp on the wall clock, if it is a plausible publish time; else the receive time."""
    if stamp_ns is not None and 0 <= recv_mono_ns - stamp_ns <= STAMP_WINDOW_NS:
        return recv_wall_ns - (recv_mono_ns - stamp_ns)
    return recv_wall_ns


@dataclass
class _Channel:
    """One kickmsg channel in the file being written."""

    channel_id: int
    record_type: RecordType | None
    messages: int = 0
    lost: int = 0
    losses: list[list[int]] = field(default_factory=list)  # [ring_pos, lost] where lost > 0
    rejoined: int = 0  # of the last message written
    rejoins: list[list[int]] = field(default_factory=list)  # [log_time, rejoined] where rejoined changes


class McapRecordingWriter:
    """Writes one MCAP file of a recording: schemas, channels and metadata
    up front, then messages (``write_message``), losses at ``close``."""

    def __init__(self, path: str, recordings: list[dict[str, Any]], channels: dict[str, dict[str, Any]],
                 chunk_bytes: int = CHUNK_BYTES):
        """``recordings``: the recorder runs (recording id, host, start);
        ``channels``: shm name -> description (geometry and schema descriptor);
        ``chunk_bytes``: uncompressed size past which a chunk is written."""
        self.path = path
        self.stream: IO[bytes] = open(path, "wb")
        self.writer = Writer(self.stream, chunk_size=chunk_bytes, compression=CompressionType.ZSTD, enable_data_crcs=True)
        self.writer.start(library=f"kickmsg-py {kickmsg.__version__} (mcap-python)")
        self.channels: dict[str, _Channel] = {}
        for recording in recordings:
            self.writer.add_metadata("kickmsg.recording", _json_values(recording))
        for name, description in channels.items():
            self.channels[name] = self._register(name, description)
            self.writer.add_metadata("kickmsg.channel", _json_values({"channel": name, **description}))

    def _register(self, name: str, description: dict[str, Any]) -> _Channel:
        """A schema and an MCAP channel for one kickmsg channel."""
        record_type = channel_record_type(description)
        if record_type is None:
            properties = {"payload": {"type": "string", "contentEncoding": "base64", "description": "the message bytes"}}
            schema: dict[str, Any] = {"type": "object", "title": PAYLOAD_SCHEMA_NAME, "properties": properties}
            schema_name = PAYLOAD_SCHEMA_NAME
        else:
            schema = _json_schema(_as_struct(record_type.dtype))
            schema["title"] = record_type.name
            schema["description"] = f"kickmsg typed channel {record_type.description}"
            record_schema = dict(schema)
            schema["properties"] = dict(schema["properties"], _records={"type": "array", "items": record_schema},
                                        _payload={"type": "string", "contentEncoding": "base64"})
            schema_name = record_type.name
        schema_id = self.writer.register_schema(schema_name, SchemaEncoding.JSONSchema, jsontext.dumps(schema).encode())
        mapping = "payload" if record_type is None else "fields"
        channel_id = self.writer.register_channel(name, MessageEncoding.JSON, schema_id, {MAPPING_KEY: mapping})
        return _Channel(channel_id, record_type)

    def write_message(self, channel: str, ring_pos: int, recv_mono_ns: int, recv_wall_ns: int, lost: int,
                      stamp_ns: int | None, payload: bytes, rejoined: int) -> None:
        """One received message; ``rejoined``: the re-created regions the
        recorder had followed on this channel when it received it."""
        target = self.channels[channel]
        if target.record_type is None:
            data: dict[str, Any] = {"payload": base64.b64encode(payload).decode("ascii")}
        else:
            data = encode_records(payload, target.record_type)
        self.writer.add_message(
            target.channel_id, log_time=recv_wall_ns, data=jsontext.dumps(data, separators=(",", ":")).encode(),
            publish_time=publish_time(recv_mono_ns, recv_wall_ns, stamp_ns), sequence=ring_pos & SEQUENCE_MASK,
        )
        self._count(target, ring_pos, recv_wall_ns, lost, rejoined)

    def copy_message(self, channel: str, message: Message, lost: int, rejoined: int) -> None:
        """A message of another kickmsg MCAP file, as it is."""
        target = self.channels[channel]
        self.writer.add_message(target.channel_id, log_time=message.log_time, data=message.data,
                                publish_time=message.publish_time, sequence=message.sequence)
        self._count(target, message.sequence, message.log_time, lost, rejoined)

    @staticmethod
    def _count(target: _Channel, ring_pos: int, log_time: int, lost: int, rejoined: int) -> None:
        """A message written: its channel's counts, losses and rejoins."""
        target.messages += 1
        if lost:
            target.lost += lost
            target.losses.append([ring_pos, lost])
        if rejoined != target.rejoined:
            target.rejoined = rejoined
            target.rejoins.append([log_time, rejoined])

    def flush(self) -> None:
        """Write the messages so far as a chunk and hand them to the operating system."""
        self.writer.flush()

    def size(self) -> int:
        """Bytes written to the file so far (complete, compressed chunks)."""
        return self.stream.tell()

    def close(self) -> None:
        """Write the losses and the summary; close the file."""
        for name, channel in self.channels.items():
            self.writer.add_metadata("kickmsg.losses", _json_values(
                {"channel": name, "messages": channel.messages, "lost": channel.lost, "before": channel.losses,
                 "rejoins": channel.rejoins}
            ))
        self.writer.finish()
        self.stream.close()


def _json_values(values: dict[str, Any]) -> dict[str, str]:
    """MCAP metadata holds strings: text as it is, other values as JSON text."""
    return {key: value if key in TEXT_KEYS else jsontext.dumps(value) for key, value in values.items()}


def _from_json_values(values: dict[str, str]) -> dict[str, Any]:
    return {key: value if key in TEXT_KEYS else json.loads(value) for key, value in values.items()}


# -- reading --------------------------------------------------------------------


@dataclass
class McapRecording:
    """What a kickmsg MCAP file holds besides its messages."""

    recordings: list[dict[str, Any]]
    channels: dict[str, dict[str, Any]]  # shm name -> geometry and schema descriptor
    losses: dict[str, dict[str, Any]]  # shm name -> messages, lost, before


def _reader(file: IO[bytes], path: str) -> SeekingReader:
    """A reader that checks CRCs and never believes a record longer than the file."""
    return SeekingReader(file, validate_crcs=True, record_size_limit=max(1, os.path.getsize(path)))


def _unreadable(path: str, error: Exception) -> ValueError:
    return ValueError(f"{path}: not a readable MCAP file (truncated or damaged?): {type(error).__name__}: {error}")


# What the mcap library (and zstandard, struct, json underneath) raise on a
# damaged or truncated file: turned into one ValueError naming the file. (A
# chunk that claims a huge uncompressed size fails to allocate: MemoryError,
# or one beyond what zstandard takes: OverflowError.)
_READ_ERRORS = (McapError, ValueError, KeyError, IndexError, struct.error, EOFError, OSError, TypeError,
                zstandard.ZstdError, MemoryError, OverflowError)


def read_recording(path: str) -> McapRecording:
    """The metadata of a kickmsg MCAP recording; ValueError if the file is
    damaged or is not a kickmsg recording."""
    try:
        with open(path, "rb") as file:
            reader = _reader(file, path)
            if reader.get_summary() is None:
                raise McapError("no summary section")
            found = [(record.name, _from_json_values(record.metadata)) for record in reader.iter_metadata()]
    except _READ_ERRORS as error:
        raise _unreadable(path, error) from None
    recording = McapRecording(
        recordings=[values for name, values in found if name == "kickmsg.recording"],
        channels={values.pop("channel"): values for name, values in found if name == "kickmsg.channel"},
        losses={values.pop("channel"): values for name, values in found if name == "kickmsg.losses"},
    )
    if not recording.channels:
        raise RecordingError(f"{path} is an MCAP file but not a kickmsg recording (no kickmsg.channel metadata)")
    return recording


def _messages(path: str, recording: McapRecording) -> Iterator[tuple[str, Message, bytes]]:
    """A recording's messages in log-time order as (channel, message, payload)."""
    record_types = {name: channel_record_type(description) for name, description in recording.channels.items()}
    try:
        with open(path, "rb") as file:
            for _, channel, message in _reader(file, path).iter_messages(log_time_order=True):
                if channel.topic not in recording.channels:
                    raise RecordingError(f"{path}: topic {channel.topic!r} has no kickmsg.channel metadata")
                data = json.loads(message.data)
                record_type = record_types[channel.topic]
                if channel.metadata.get(MAPPING_KEY) == "fields" and record_type is not None:
                    payload = decode_records(data, record_type)
                else:
                    payload = base64.b64decode(data["payload"], validate=True)
                yield channel.topic, message, payload
    except _READ_ERRORS as error:
        raise _unreadable(path, error) from None


def _recording_id(path: str, recording: McapRecording) -> str:
    return str(recording.recordings[0]["recording"]) if recording.recordings else path


def played_messages(path: str) -> tuple[McapRecording, Iterator[tuple[str, str, int, bytes]]]:
    """A recording's metadata and its messages in log-time order as
    (recording, channel, receive time ns, payload), for ``kickmsg play``."""
    recording = read_recording(path)
    recording_id = _recording_id(path, recording)
    messages = ((recording_id, channel, message.log_time, payload) for channel, message, payload in _messages(path, recording))
    return recording, messages


def analysis_table(path: str) -> pyarrow.Table:
    """A recording's messages as the rows of a Parquet recording without
    payloads, for ``kickmsg analyze``: ``ring_pos`` = the
    sequence, both receive times = ``log_time`` (the wall clock: MCAP keeps
    no monotonic time), ``lost`` and ``rejoined`` from ``kickmsg.losses``,
    ``stamp_ns`` = ``publish_time`` where it is a stamp (not the receive
    time), so that receive time - stamp is the latency the recorder saw."""
    recording = read_recording(path)
    recording_id = _recording_id(path, recording)
    schema = pyarrow.schema(COLUMNS[:-1])
    lost_at = {(name, ring_pos & SEQUENCE_MASK): lost for name, losses in recording.losses.items()
               for ring_pos, lost in losses.get("before", [])}
    rejoins = {name: losses.get("rejoins", []) for name, losses in recording.losses.items()}  # none before the field

    def rejoined(channel: str, log_time: int) -> int:
        """The ``rejoined`` of the channel's last change at or before ``log_time``."""
        changes = rejoins.get(channel, [])
        index = bisect.bisect_right([time for time, _ in changes], log_time)
        return changes[index - 1][1] if index else 0

    rows = [
        (recording_id, channel, message.sequence, message.log_time, message.log_time, len(payload),
         lost_at.get((channel, message.sequence), 0),
         message.publish_time if message.publish_time != message.log_time else None,
         rejoined(channel, message.log_time))
        for channel, message, payload in _messages(path, recording)
    ]
    columns = list(zip(*rows)) or [() for _ in schema]
    return pyarrow.Table.from_arrays([pyarrow.array(values, type=column.type) for values, column in zip(columns, schema)],
                                     schema=schema)


# -- recovering the file of a killed recorder ---------------------------------------


def _flushed_records(partial: str) -> Iterator[Metadata | Channel | Message]:
    """The metadata, channels and messages of an MCAP file cut short, in file
    order, up to its last complete chunk (CRCs checked)."""
    with open(partial, "rb") as file:
        records = StreamReader(file, validate_crcs=True, record_size_limit=max(1, os.path.getsize(partial))).records
        try:
            for record in records:
                if isinstance(record, (Metadata, Channel, Message)):
                    yield record
        except _READ_ERRORS:  # the record being written when the recorder was killed
            return


def partial_recording(partial: str) -> dict[str, Any]:
    """The ``kickmsg.recording`` metadata (recording id, host, start) of an
    MCAP file cut short."""
    for record in _flushed_records(partial):
        if isinstance(record, Metadata) and record.name == "kickmsg.recording":
            return _from_json_values(record.metadata)
    raise RecordingError(f"{partial} holds no kickmsg recording metadata (remove it: it holds no message either)")


def recover(partial: str, out: str) -> int:
    """Write what an MCAP file cut short holds (a killed recorder's
    ``.mcap.partial``: every message of its complete chunks) as the complete
    MCAP file ``out`` (through ``out.closing``), remove ``partial``, and
    return the number of messages. The losses are rebuilt from the gaps in
    each channel's sequence numbers (a loss before a channel's first message
    is not known), and a sequence number not above the one before marks a
    re-created region the recorder followed (``rejoins``; its loss is not
    known)."""
    recordings, channels, topics, messages = [], {}, {}, []
    for record in _flushed_records(partial):
        if isinstance(record, Metadata) and record.name == "kickmsg.recording":
            recordings.append(_from_json_values(record.metadata))
        elif isinstance(record, Metadata) and record.name == "kickmsg.channel":
            values = _from_json_values(record.metadata)
            channels[values.pop("channel")] = values
        elif isinstance(record, Channel):
            topics[record.id] = record.topic
        elif isinstance(record, Message) and topics.get(record.channel_id) in channels:
            messages.append((topics[record.channel_id], record))
    if not channels:
        raise RecordingError(f"{partial} holds no kickmsg channel metadata (remove it: it holds no message either)")
    closing = out + ".closing"
    writer = McapRecordingWriter(closing, recordings, channels)
    previous: dict[str, int] = {}  # channel -> last sequence
    rejoined: dict[str, int] = {}  # channel -> restarts of its sequence seen so far
    for topic, message in messages:
        last = previous.get(topic, message.sequence - 1)
        if message.sequence <= last:  # started over: the recorder followed a re-created region
            rejoined[topic] = rejoined.get(topic, 0) + 1
        writer.copy_message(topic, message, max(0, message.sequence - last - 1), rejoined.get(topic, 0))
        previous[topic] = message.sequence
    writer.close()
    os.replace(closing, out)
    os.unlink(partial)
    return len(messages)


# -- converting a Parquet recording -------------------------------------------------


@dataclass
class ConvertSummary:
    out: str
    messages: int = 0
    channels: list[str] = field(default_factory=list)


def convert(source: str, out: str, overwrite: bool = False) -> ConvertSummary:
    """Write a Parquet recording (a directory or one file) as one MCAP file.
    An existing ``out`` is refused unless ``overwrite``; the file is written
    as ``out.partial`` and renamed when complete."""
    if os.path.isdir(out):
        raise ValueError(f"{out} is a directory: name the .mcap file to write")
    files = recording_files(source)
    if os.path.exists(out) and any(os.path.samefile(out, file) for file in files):
        raise ValueError(f"{out} is part of the recording being converted: name another file")
    if os.path.exists(out) and not overwrite:
        raise ValueError(f"{out} exists: choose another name, or overwrite it with --force")
    if not os.path.isdir(os.path.dirname(out) or "."):
        raise ValueError(f"cannot write {out}: no directory {os.path.dirname(out)}")
    recordings: dict[str, dict[str, Any]] = {}
    channels: dict[str, dict[str, Any]] = {}
    for file in files:
        if file_format(file) == "mcap":
            raise ValueError(f"{file} is MCAP already: convert turns a Parquet recording into MCAP (play reads both)")
        schema = pyarrow.parquet.read_schema(file)
        if "payload" not in schema.names:
            raise RecordingError(f"{file} was recorded without payloads: nothing to put in MCAP messages")
        if schema.metadata is None or SCHEMA_KEY not in schema.metadata:
            raise RecordingError(f"{file} is not a kickmsg recording (no {SCHEMA_KEY.decode()} metadata)")
        metadata = json.loads(schema.metadata[SCHEMA_KEY])
        recordings.setdefault(metadata["recording"], {key: metadata[key] for key in ("recording", "host", "started_wall_ns")})
        for name, description in metadata["channels"].items():
            channels.setdefault(name, description)  # a channel re-created with another geometry keeps the first
    summary = ConvertSummary(out, channels=sorted(channels))
    writer = McapRecordingWriter(out + ".partial", list(recordings.values()), channels)
    try:
        for file in files:
            rows = pyarrow.parquet.read_table(file).sort_by("recv_wall_ns").to_pylist()
            for row in rows:
                writer.write_message(row["channel"], row["ring_pos"], row["recv_mono_ns"], row["recv_wall_ns"],
                                     row["lost"], row["stamp_ns"], row["payload"], row.get("rejoined") or 0)
                summary.messages += 1
        writer.close()
    except BaseException:
        writer.stream.close()
        os.unlink(out + ".partial")
        raise
    os.replace(out + ".partial", out)
    return summary
