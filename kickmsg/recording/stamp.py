"""Publish-time stamps: a convention for payloads that carry when they were sent.

A stamped payload starts with its publish time: 8 bytes, little-endian,
``CLOCK_MONOTONIC`` nanoseconds (``time.monotonic_ns()``, the clock every
process on the host shares). The receiver's latency is then
``time.monotonic_ns() - stamp``. A typed channel carries it as its first
field, ``("stamp_ns", "<u8")`` at offset 0: the same 8 bytes. The recorder
keeps every message's first 8 bytes (``stamp_ns`` column) and the analysis
uses them for end-to-end latency when a channel looks stamped.
"""
import struct
import time
from collections.abc import Buffer, Sized
from typing import Protocol

__all__ = ["FIELD", "SIZE", "STAMP", "SizedBuffer", "latency_ns", "now", "read", "stamped", "write"]

STAMP = struct.Struct("<Q")
SIZE = STAMP.size
FIELD = ("stamp_ns", "<u8")  # the first field of a stamped typed record


class SizedBuffer(Sized, Buffer, Protocol):
    """A payload: bytes, a memoryview, a ``SampleView``..."""


def now() -> int:
    """The current stamp value: CLOCK_MONOTONIC nanoseconds."""
    return time.monotonic_ns()


def stamped(payload: Buffer = b"", stamp_ns: int | None = None) -> bytes:
    """``payload`` with a stamp in front (now, unless ``stamp_ns`` is given)."""
    return STAMP.pack(now() if stamp_ns is None else stamp_ns) + bytes(payload)


def write(buffer: Buffer, stamp_ns: int | None = None) -> None:
    """Stamp a writable buffer in place (e.g. ``memoryview(slot)``)."""
    STAMP.pack_into(buffer, 0, now() if stamp_ns is None else stamp_ns)


def read(payload: SizedBuffer) -> int | None:
    """The stamp at the front of ``payload``, or None if it is too short."""
    return STAMP.unpack_from(payload, 0)[0] if len(payload) >= SIZE else None


def latency_ns(payload: SizedBuffer, received_ns: int | None = None) -> int | None:
    """How long ago (or before ``received_ns``) the payload was stamped."""
    stamp = read(payload)
    return None if stamp is None else (now() if received_ns is None else received_ns) - stamp
