"""Typed channels: numpy records with a type check when anyone joins.

A ``RecordType`` names a numpy dtype (``RecordType("Imu", [("ax", "<f4"),
...])``). From it come two fingerprints, stored in the region's schema
descriptor by whoever joins first (the creator bakes it in at advertise time)
and compared by everyone who joins later:

- identity: FNV-1a 64 of ``Imu{ax:<f4,ay:<f4,...}`` (type name, field names
  and kinds), in the first 8 bytes of the 64-byte field, as
  ``kickmsg.hash.identity_from_fnv1a`` makes it;
- layout: FNV-1a 64 of ``24{0+4,4+4,...}`` (itemsize, each field's offset
  and size), the same way.

The descriptor's name holds a readable description with both,
``Imu:24{ax:<f4@0,ay:<f4@4,...}`` (cut to 127 bytes), so a mismatch can be
reported field by field. Nothing in the wire layout changes: an untyped
native peer sees an ordinary schema descriptor and plain bytes.

A message carries one or more records back to back. Receiving gives a
read-only structured array over the slot itself (zero-copy; the slot stays
pinned while the array is alive).

Blackboard keys (layout 9) hold records too: ``declare(board, key, type)``
and ``observe(board, key, type)`` write and read them, and
``snapshot_json(board, types)`` gives a board's keys as strict JSON with
their values decoded. A board has no schema descriptor, so only a value's
length is checked against the type.
"""
import base64
import copy
import dataclasses
import datetime
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Self

import numpy as np
import numpy.typing as npt

from kickmsg import jsontext
from kickmsg.config import Config
from kickmsg.errors import TypeMismatchError
from kickmsg.hash import identity_from_fnv1a
from kickmsg.node import Node
from kickmsg.protocol.v9.blackboard import Blackboard, BlackboardReader, BlackboardWriter
from kickmsg.publisher import AllocatedSlot, Publisher
from kickmsg.region import SharedRegion
from kickmsg.schema import SchemaInfo
from kickmsg.subscriber import SampleView, Subscriber

__all__ = [
    "RecordType", "TYPED_FINGERPRINT_ALGO", "TypedBlackboardReader", "TypedBlackboardWriter", "TypedPublisher",
    "TypedReadOutcome", "TypedSlot", "TypedSubscriber", "advertise", "declare", "join_check", "observe",
    "snapshot_json", "subscribe",
]

TYPED_FINGERPRINT_ALGO = 0x4B4D5459  # "KMTY": the identity_algo/layout_algo tag of kickmsg.typed v1


def _fields(dtype: np.dtype) -> list[tuple[str, np.dtype, int]]:
    """(name, dtype, offset) of each field of a structured dtype, in order;
    none for a plain one."""
    fields = dtype.fields
    if fields is None:
        return []
    return [(name, fields[name][0], fields[name][1]) for name in dtype.names or ()]


def _kind(dtype: np.dtype) -> str:
    """A field's kind: ``<f4``, ``|S16``, ``<f4[3]``, ``{x:<f8,y:<f8}``."""
    if dtype.subdtype is not None:
        base, shape = dtype.subdtype
        return f"{_kind(base)}[{','.join(map(str, shape))}]"
    if dtype.names:
        return "{" + ",".join(f"{name}:{_kind(field)}" for name, field, _ in _fields(dtype)) + "}"
    return dtype.str


def _layout(dtype: np.dtype) -> str:
    """Itemsize and each field's offset and size: ``24{0+4,4+4,...}``."""
    if not dtype.names:
        return str(dtype.itemsize)
    fields = (f"{offset}+{_layout(field)}" for _, field, offset in _fields(dtype))
    return f"{dtype.itemsize}{{{','.join(fields)}}}"


def _split_fields(text: str) -> list[str]:
    """Split ``a,b{c,d},e[2,3]`` at the commas outside brackets."""
    parts, depth, start = [], 0, 0
    for index, char in enumerate(text):
        depth += char in "{["
        depth -= char in "}]"
        if char == "," and depth == 0:
            parts.append(text[start:index])
            start = index + 1
    parts.append(text[start:])
    return [part for part in parts if part]


def _dtype_of_kind(kind: str) -> np.dtype:
    """The dtype a ``_kind`` text stands for (nested structs packed)."""
    if kind.endswith("]"):
        base, _, shape = kind[:-1].rpartition("[")
        return np.dtype((_dtype_of_kind(base), tuple(int(n) for n in shape.split(","))))
    if kind.startswith("{"):
        parts = (part.partition(":") for part in _split_fields(kind[1:-1]))
        return np.dtype([(name, _dtype_of_kind(inner)) for name, _, inner in parts])
    return np.dtype(kind)


def _parse_description(description: str) -> tuple[str, str, str, dict[str, tuple[str, str]] | None, bool]:
    """Read back ``Name:itemsize{field:kind@offset,...}`` or ``Name:itemsize<kind>``.

    Returns (type name, itemsize, plain kind, fields as name -> (kind,
    offset), complete). A description cut at 127 bytes is incomplete: its
    last, partial field is dropped.
    """
    head, brace, body = description.partition("{")
    type_name, _, itemsize_and_kind = head.rpartition(":")
    itemsize = itemsize_and_kind[: len(itemsize_and_kind) - len(itemsize_and_kind.lstrip("0123456789"))]
    if not brace:
        return type_name, itemsize, itemsize_and_kind[len(itemsize):], None, True
    complete = body.endswith("}")
    parts = _split_fields(body.removesuffix("}"))
    if not complete:
        parts = parts[:-1]
    fields: dict[str, tuple[str, str]] = {}
    for part in parts:
        field, _, kind_at_offset = part.partition(":")
        kind, _, offset = kind_at_offset.rpartition("@")
        fields[field] = (kind, offset)
    return type_name, itemsize, "", fields, complete


class RecordType:
    """A named numpy dtype that typed publishers and subscribers agree on.

    Type and field names may not contain the description's separators
    (``{}@,`` in the type name; ``:{}@,[]`` in field names).
    """

    def __init__(self, name: str, dtype: npt.DTypeLike, version: int = 0) -> None:
        self.name = name
        self.dtype: np.dtype = np.dtype(dtype)
        self.version = version
        if self.dtype.hasobject or self.dtype.itemsize == 0:
            raise ValueError(f"RecordType {name!r} needs a fixed-size dtype without Python objects, got {self.dtype}")
        if not name or any(char in name for char in "{}@,"):
            raise ValueError(f"RecordType name {name!r} must be non-empty and free of any of {{}}@,")
        for field in self.dtype.names or ():
            if any(char in field for char in ":{}@,[]"):
                raise ValueError(f"RecordType {name!r}: field name {field!r} contains one of :{{}}@,[]")
        self.fields = [(field, _kind(field_dtype), offset) for field, field_dtype, offset in _fields(self.dtype)]
        if self.dtype.names:
            identity_text = f"{name}{_kind(self.dtype)}"
            body = "{" + ",".join(f"{field}:{kind}@{offset}" for field, kind, offset in self.fields) + "}"
        else:
            identity_text = f"{name}:{_kind(self.dtype)}"
            body = _kind(self.dtype)
        self.description = f"{name}:{self.dtype.itemsize}{body}"
        self.schema = SchemaInfo(
            identity=identity_from_fnv1a(identity_text),
            layout=identity_from_fnv1a(_layout(self.dtype)),
            name=self.description,
            version=version,
            identity_algo=TYPED_FINGERPRINT_ALGO,
            layout_algo=TYPED_FINGERPRINT_ALGO,
        )

    @classmethod
    def from_schema(cls, schema: SchemaInfo) -> "RecordType | None":
        """Rebuild the record type a typed channel's descriptor describes
        (for tools such as ``kickmsg echo``); None if the descriptor was not
        made by kickmsg.typed, was cut at 127 bytes, or does not rebuild to
        the same fingerprints."""
        if schema.identity_algo != TYPED_FINGERPRINT_ALGO:
            return None
        type_name, itemsize, plain_kind, fields, complete = _parse_description(schema.name)
        if not complete or not itemsize:
            return None
        try:
            if fields is None:
                dtype = _dtype_of_kind(plain_kind)
            else:
                dtype = np.dtype(
                    {
                        "names": list(fields),
                        "formats": [_dtype_of_kind(kind) for kind, _ in fields.values()],
                        "offsets": [int(offset) for _, offset in fields.values()],
                        "itemsize": int(itemsize),
                    }
                )
            rebuilt = cls(type_name, dtype, schema.version)
        except (TypeError, ValueError):
            return None
        return rebuilt if rebuilt.differences(schema) == [] else None

    def differences(self, schema: SchemaInfo) -> list[str]:
        """How a channel's descriptor differs from this type; empty if it matches."""
        ours = self.schema
        if (schema.identity, schema.layout, schema.version) == (ours.identity, ours.layout, ours.version):
            return []
        if schema.identity_algo != TYPED_FINGERPRINT_ALGO:
            return [f"the channel's schema {schema.name!r} was not made by kickmsg.typed (identity_algo {schema.identity_algo})"]
        their_name, their_itemsize, their_kind, theirs, complete = _parse_description(schema.name)
        found = []
        if schema.version != ours.version:
            found.append(f"version: {ours.version} here, {schema.version} in the channel")
        if their_name != self.name:
            found.append(f"type name: {self.name!r} here, {their_name!r} in the channel")
        if their_itemsize != str(self.dtype.itemsize):
            found.append(f"itemsize: {self.dtype.itemsize} here, {their_itemsize} in the channel")
        if theirs is None or not self.dtype.names:
            our_kind = "" if self.dtype.names else _kind(self.dtype)
            if our_kind != their_kind:
                found.append(f"kind: {our_kind or 'fields'} here, {their_kind or 'fields'} in the channel")
        else:
            for field, kind, offset in self.fields:
                if field not in theirs:
                    if complete:
                        found.append(f"field {field!r} ({kind}) is not in the channel's type")
                elif theirs[field][0] != kind:
                    found.append(f"field {field!r}: {kind} here, {theirs[field][0]} in the channel")
                elif theirs[field][1] != str(offset):
                    found.append(f"field {field!r}: offset {offset} here, {theirs[field][1]} in the channel")
            for field, (kind, _) in theirs.items():
                if field not in self.dtype.names:
                    found.append(f"field {field!r} ({kind}) is only in the channel's type")
        if not complete:
            found.append("(the channel's description is cut at 127 bytes; fields after the cut are compared by fingerprint only)")
        if not found:
            found.append("the fingerprints differ although the descriptions agree")
        return found

    def __repr__(self) -> str:
        return f"RecordType({self.description!r}, version={self.version})"


def join_check(region: SharedRegion, record_type: RecordType) -> None:
    """Type validation on join: claim the descriptor if none is set yet,
    else compare; raise ``TypeMismatchError`` listing every difference."""
    if record_type.dtype.itemsize > region.geometry.slot_data_size:
        raise TypeMismatchError(
            f"{region.name}: one {record_type.name} record is {record_type.dtype.itemsize} bytes, "
            f"more than max_payload_size {region.geometry.slot_data_size}"
        )
    current = region.schema()
    if current is None and region.try_claim_schema(record_type.schema):
        return
    current = region.schema()
    if current is None:
        raise TypeMismatchError(f"{region.name}: the schema descriptor is being claimed by a process that never finished")
    problems = record_type.differences(current)
    if problems:
        raise TypeMismatchError(
            f"{region.name} carries {current.name!r}, not {record_type.description!r}:\n  " + "\n  ".join(problems)
        )


class TypedPublisher:
    """Publishes records of one ``RecordType``; checks the channel's type on
    construction, and again if the region is re-created under it."""

    def __init__(self, publisher: Publisher, record_type: RecordType) -> None:
        join_check(publisher.region, record_type)
        self.publisher = publisher
        self.record_type = record_type
        self._checked_region = publisher.region

    def _check_type_if_rejoined(self) -> None:
        """A re-created region may carry another type: check it once."""
        if self.publisher.region is not self._checked_region:
            join_check(self.publisher.region, self.record_type)
            self._checked_region = self.publisher.region

    def send(self, records: npt.ArrayLike) -> int:
        """Publish one record (a tuple or numpy record) or an array of them
        as one message; returns the number of records."""
        self._check_type_if_rejoined()
        dtype = self.record_type.dtype
        # A subarray dtype (e.g. 3 x <f4) converts element by element.
        array = np.ascontiguousarray(records, dtype=dtype.base if dtype.subdtype else dtype)
        if array.nbytes % dtype.itemsize:
            raise ValueError(f"{array.nbytes} bytes of data are not a whole number of {dtype.itemsize}-byte {self.record_type.name} records")
        self.publisher.send(array)
        return array.nbytes // dtype.itemsize

    def allocate(self, count: int = 1) -> "TypedSlot | None":
        """Reserve a message of ``count`` records to fill in place; None if
        they exceed max_payload_size or the pool is empty."""
        self._check_type_if_rejoined()
        slot = self.publisher.allocate(count * self.record_type.dtype.itemsize)
        return None if slot is None else TypedSlot(slot, self.record_type.dtype)

    @property
    def dropped(self) -> int:
        return self.publisher.dropped

    def __repr__(self) -> str:
        return f"TypedPublisher({self.record_type.description!r}, region={self.publisher.region.name!r})"


class TypedSlot:
    """An allocated message seen as a writable record array: fill
    ``records``, then ``publish()``."""

    def __init__(self, slot: AllocatedSlot, dtype: np.dtype) -> None:
        self.slot = slot
        self.records: npt.NDArray[Any] = np.frombuffer(memoryview(slot), dtype=dtype)

    def publish(self) -> int:
        """Drop our array (the buffer must be released first) and publish."""
        del self.records
        return self.slot.publish()

    def __repr__(self) -> str:
        return f"TypedSlot({self.slot!r})"


class TypedSubscriber:
    """Receives records of one ``RecordType`` as zero-copy arrays over the slots."""

    def __init__(self, subscriber: Subscriber, record_type: RecordType) -> None:
        """Wrap a subscriber; if the channel's type differs, the subscriber is
        closed (its ring freed) and ``TypeMismatchError`` raised."""
        self.subscriber = subscriber
        self.record_type = record_type
        self._checked_region: SharedRegion | None = None
        self._check_type()

    def _check_type(self) -> None:
        """Check the channel's type (again, if the subscriber followed a
        re-created region); on a mismatch close the subscriber and raise."""
        if self.subscriber.region is self._checked_region:
            return
        try:
            join_check(self.subscriber.region, self.record_type)
        except TypeMismatchError:
            self.subscriber.close()
            raise
        self._checked_region = self.subscriber.region

    def try_receive(self) -> npt.NDArray[Any] | None:
        """The next message's records (read-only, over the slot), or None."""
        return self._records(self.subscriber.try_receive_view())

    def receive(self, timeout: datetime.timedelta | float | None = None) -> npt.NDArray[Any] | None:
        """The next message's records, waiting up to ``timeout`` (None, the
        default: until one comes), or None on timeout."""
        return self._records(self.subscriber.receive_view(timeout))

    def try_receive_latest(self) -> npt.NDArray[Any] | None:
        """The newest message's records, passing over older unread ones
        (counted in the subscriber's ``skipped``), or None (read-latest)."""
        self.subscriber._skip_to_newest()
        return self.try_receive()

    def _records(self, view: SampleView | None) -> npt.NDArray[Any] | None:
        self._check_type()
        if view is None:
            return None
        itemsize, length = self.record_type.dtype.itemsize, len(view)
        if length % itemsize:
            view.release()
            raise TypeMismatchError(
                f"{self.subscriber.region.name}: a message of {length} bytes is not a whole number of "
                f"{itemsize}-byte {self.record_type.name} records"
            )
        records = np.frombuffer(view, dtype=self.record_type.dtype)
        view.release()  # the array's buffer keeps the slot pinned from here on
        return records

    @property
    def lost(self) -> int:
        return self.subscriber.lost

    def close(self) -> None:
        self.subscriber.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"TypedSubscriber({self.record_type.description!r}, region={self.subscriber.region.name!r})"


def advertise(node: Node, topic: str, record_type: RecordType, cfg: Config | None = None) -> TypedPublisher:
    """Create a typed topic: its descriptor is baked in at creation. Without
    ``cfg``, the defaults of ``Config()`` with max_payload_size the most
    whole records that fit in its 4096 bytes (at least one)."""
    itemsize = record_type.dtype.itemsize
    cfg = copy.copy(cfg) if cfg is not None else Config(max_payload_size=max(1, Config().max_payload_size // itemsize) * itemsize)
    cfg.schema = record_type.schema
    return TypedPublisher(node.advertise(topic, cfg), record_type)


def subscribe(node: Node, topic: str, record_type: RecordType) -> TypedSubscriber:
    """Subscribe to a typed topic, checking its record type."""
    return TypedSubscriber(node.subscribe(topic), record_type)


# -- Blackboard values (layout 9) ------------------------------------------------------------
#
# A board keeps no schema descriptor: nothing in shared memory says a key's
# type, so a reader checks only that a value is a whole number of records.
# Native peers see the records' plain bytes.


@dataclass(frozen=True)
class TypedReadOutcome:
    """A typed read: ``errno`` 0 (true) with ``records`` (a copy), else the
    reason as in ``ReadOutcome`` (``records`` None)."""

    errno: int
    records: npt.NDArray[Any] | None
    updated_at_ns: int
    update_count: int

    def __bool__(self) -> bool:
        return self.errno == 0


class TypedBlackboardWriter:
    """Writes records of one ``RecordType`` to a board key it owns."""

    def __init__(self, writer: BlackboardWriter, record_type: RecordType) -> None:
        self.writer = writer
        self.record_type = record_type

    def write(self, records: npt.ArrayLike) -> int:
        """Write one record (a tuple or numpy record) or an array of them as
        the key's value; returns the number of records. The board's errors
        (an OSError with its errno: EMSGSIZE for a value too long, ...)."""
        dtype = self.record_type.dtype
        array = np.ascontiguousarray(records, dtype=dtype.base if dtype.subdtype else dtype)
        if array.nbytes % dtype.itemsize:
            raise ValueError(f"{array.nbytes} bytes of data are not a whole number of {dtype.itemsize}-byte {self.record_type.name} records")
        self.writer.write(array.tobytes())
        return array.nbytes // dtype.itemsize

    def release(self) -> None:
        self.writer.release()

    @property
    def key(self) -> str:
        return self.writer.key

    def __repr__(self) -> str:
        return f"TypedBlackboardWriter(key={self.key!r}, record_type={self.record_type.name!r})"


class TypedBlackboardReader:
    """Reads a board key's value as records of one ``RecordType``."""

    def __init__(self, reader: BlackboardReader, record_type: RecordType) -> None:
        self.reader = reader
        self.record_type = record_type

    def read(self) -> TypedReadOutcome:
        """The key's latest value as records; a value that is not a whole
        number of records is a TypeMismatchError naming its length."""
        outcome = self.reader.read()
        if not outcome:
            return TypedReadOutcome(outcome.errno, None, outcome.updated_at_ns, outcome.update_count)
        return TypedReadOutcome(0, _board_records(self.reader.key, outcome.data, self.record_type),
                                outcome.updated_at_ns, outcome.update_count)

    def owner_alive(self) -> bool:
        return self.reader.owner_alive()

    @property
    def key(self) -> str:
        return self.reader.key

    def __repr__(self) -> str:
        return f"TypedBlackboardReader(key={self.key!r}, record_type={self.record_type.name!r})"


def _board_records(key: str, data: bytes, record_type: RecordType) -> npt.NDArray[Any]:
    itemsize = record_type.dtype.itemsize
    if len(data) % itemsize:
        raise TypeMismatchError(
            f"blackboard key {key!r}: a value of {len(data)} bytes is not a whole number of "
            f"{itemsize}-byte {record_type.name} records"
        )
    return np.frombuffer(bytearray(data), dtype=record_type.dtype)


def declare(board: Blackboard, key: str, record_type: RecordType, owner_node: str | None = None) -> TypedBlackboardWriter:
    """Own ``key`` on ``board`` and write records of ``record_type`` to it;
    its value must fit in one record or more (``max_value_size``)."""
    if record_type.dtype.itemsize > board.max_value_size:
        raise ValueError(
            f"one {record_type.name} record ({record_type.dtype.itemsize} bytes) exceeds max_value_size "
            f"{board.max_value_size} of {board.name}"
        )
    return TypedBlackboardWriter(board.declare(key, owner_node), record_type)


def observe(board: Blackboard, key: str, record_type: RecordType) -> TypedBlackboardReader:
    """Read ``key`` on ``board`` as records of ``record_type``."""
    return TypedBlackboardReader(board.observe(key), record_type)


def snapshot_json(board: Blackboard, record_types: Mapping[str, RecordType] | None = None) -> str:
    """The board's keys as strict JSON (``kickmsg.jsontext``): each key's
    status, and its value as ``fields`` (a list of records, field name to
    value, bytes as base64) when ``record_types`` names its type, else as
    base64 ``value``; a key with no value has ``null``."""
    types = record_types or {}
    keys = []
    for status in board.snapshot():
        entry: dict[str, Any] = dataclasses.asdict(status)
        outcome = board.observe(status.key).read()
        data = outcome.data if outcome else None
        record_type = types.get(status.key)
        if record_type is None:
            entry["value"] = None if data is None else base64.b64encode(data).decode("ascii")
        else:
            entry["fields"] = None if data is None else _records_json(status.key, data, record_type)
        keys.append(entry)
    return jsontext.dumps({"board": board.name, "capacity": board.capacity, "max_value_size": board.max_value_size,
                           "keys": keys})


def _records_json(key: str, data: bytes, record_type: RecordType) -> list[Any]:
    """A value's records as JSON data: field name to value for a structured type."""
    records = _board_records(key, data, record_type).tolist()
    names = record_type.dtype.names
    if names:
        return [dict(zip(names, _json_value(record))) for record in records]
    return [_json_value(record) for record in records]


def _json_value(value: Any) -> Any:
    """numpy's ``tolist()`` output as JSON data: tuples as lists, bytes as base64."""
    if isinstance(value, bytes):
        return base64.b64encode(value).decode("ascii")
    if isinstance(value, (tuple, list)):
        return [_json_value(item) for item in value]
    return value
