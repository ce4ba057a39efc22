"""The schema descriptor: an opt-in, off-hot-path type fingerprint in the header.

The library stores and compares descriptors; what the fingerprints mean, and
what counts as a mismatch, is the caller's policy.
"""
import enum
from typing import Any

from kickmsg.protocol.v4 import layout

__all__ = ["Diff", "FINGERPRINT_SIZE", "MAX_NAME_BYTES", "SchemaInfo", "diff"]

FINGERPRINT_SIZE = 64
MAX_NAME_BYTES = 127  # the name field is 128 bytes, NUL-terminated


class Diff(enum.IntFlag):
    """Which fields of two descriptors differ (``flags``/``reserved`` never count)."""

    Equal = 0
    Identity = 1
    Layout = 2
    Version = 4
    Name = 8
    IdentityAlgo = 16
    LayoutAlgo = 32


def _cut_utf8(text: str, limit: int) -> bytes:
    """``text`` as UTF-8, cut to at most ``limit`` bytes on a character boundary."""
    encoded = text.encode("utf-8")
    if len(encoded) <= limit:
        return encoded
    return encoded[:limit].decode("utf-8", errors="ignore").encode("utf-8")


class SchemaInfo:
    """A 512-byte schema descriptor: two 64-byte fingerprints, a name, tags.

    ``identity`` and ``layout`` must be exactly 64 bytes (``ValueError``
    otherwise); ``name`` is kept to 127 UTF-8 bytes; the four integers are
    unsigned 32-bit.
    """

    _U32_FIELDS = ("version", "identity_algo", "layout_algo", "flags")

    def __init__(
        self,
        *,
        identity: bytes = bytes(FINGERPRINT_SIZE),
        layout: bytes = bytes(FINGERPRINT_SIZE),
        name: str = "",
        version: int = 0,
        identity_algo: int = 0,
        layout_algo: int = 0,
        flags: int = 0,
    ) -> None:
        self.identity = identity
        self.layout = layout
        self.name = name
        self.version = version
        self.identity_algo = identity_algo
        self.layout_algo = layout_algo
        self.flags = flags

    def __setattr__(self, field: str, value: Any) -> None:
        if field in ("identity", "layout"):
            value = bytes(value)
            if len(value) != FINGERPRINT_SIZE:
                raise ValueError(f"SchemaInfo.{field} must be exactly {FINGERPRINT_SIZE} bytes, got {len(value)}")
        elif field == "name":
            if not isinstance(value, str):
                raise TypeError(f"SchemaInfo.name must be a str, got {value!r}")
            # Stored NUL-terminated: a NUL ends the name, as in 0.1.0.
            value = _cut_utf8(value.split("\0", 1)[0], MAX_NAME_BYTES).decode("utf-8")
        elif field in self._U32_FIELDS:
            if not isinstance(value, int) or isinstance(value, bool):
                raise TypeError(f"SchemaInfo.{field} must be an int, got {value!r}")
            if not 0 <= value <= layout.U32_MAX:
                raise ValueError(f"SchemaInfo.{field} must be an unsigned 32-bit integer, got {value}")
        else:
            raise AttributeError(f"SchemaInfo has no field {field!r}")
        object.__setattr__(self, field, value)

    def write_to(self, target: layout.SchemaInfoLayout) -> None:
        """Fill the 512-byte wire form, zeroing the reserved bytes."""
        target.identity[:] = self.identity
        target.layout[:] = self.layout
        target.name[:] = self.name.encode("utf-8").ljust(len(target.name), b"\0")
        target.version = self.version
        target.identity_algo = self.identity_algo
        target.layout_algo = self.layout_algo
        target.flags = self.flags
        target.reserved[:] = bytes(len(target.reserved))

    @classmethod
    def read_from(cls, source: layout.SchemaInfoLayout) -> "SchemaInfo":
        """Decode the wire form (a name that is not valid UTF-8 is decoded
        with replacement characters, never an error)."""
        return cls(
            identity=bytes(source.identity),
            layout=bytes(source.layout),
            name=bytes(source.name[:MAX_NAME_BYTES]).split(b"\0", 1)[0].decode("utf-8", errors="replace"),
            version=source.version,
            identity_algo=source.identity_algo,
            layout_algo=source.layout_algo,
            flags=source.flags,
        )

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, SchemaInfo):
            return NotImplemented
        return vars(self) == vars(other)

    __hash__ = None  # type: ignore[assignment]  # unhashable: fields are mutable and compared by value

    def __repr__(self) -> str:
        return (
            f"SchemaInfo(name={self.name!r}, version={self.version}, "
            f"identity={self.identity[:8].hex()}…, layout={self.layout[:8].hex()}…, "
            f"identity_algo={self.identity_algo}, layout_algo={self.layout_algo}, flags={self.flags})"
        )


def diff(a: SchemaInfo, b: SchemaInfo) -> Diff:
    """The fields in which ``a`` and ``b`` differ, as ``Diff`` flags."""
    found = Diff.Equal
    if a.identity != b.identity:
        found |= Diff.Identity
    if a.layout != b.layout:
        found |= Diff.Layout
    if a.version != b.version:
        found |= Diff.Version
    if a.name != b.name:
        found |= Diff.Name
    if a.identity_algo != b.identity_algo:
        found |= Diff.IdentityAlgo
    if a.layout_algo != b.layout_algo:
        found |= Diff.LayoutAlgo
    return found
