"""FNV-1a 64-bit hashing: the config hash and schema identity helpers."""

__all__ = ["FNV1A_64_OFFSET_BASIS", "FNV1A_64_PRIME", "fnv1a_64", "identity_from_fnv1a"]

FNV1A_64_OFFSET_BASIS = 0xCBF29CE484222325
FNV1A_64_PRIME = 0x100000001B3
_U64 = 0xFFFFFFFFFFFFFFFF


def fnv1a_64(data: bytes | str, seed: int = FNV1A_64_OFFSET_BASIS) -> int:
    """64-bit FNV-1a of ``data`` (a ``str`` is hashed as UTF-8).

    Chain hashes by passing a previous result as ``seed``:
    ``fnv1a_64(b"b", seed=fnv1a_64(b"a")) == fnv1a_64(b"ab")``.
    """
    if isinstance(data, str):
        data = data.encode("utf-8")
    if not 0 <= seed <= _U64:
        raise ValueError(f"seed must be an unsigned 64-bit integer, got {seed}")
    value = seed
    for byte in bytes(data):
        value = ((value ^ byte) * FNV1A_64_PRIME) & _U64
    return value


def identity_from_fnv1a(descriptor: bytes | str) -> bytes:
    """A 64-byte schema identity: the FNV-1a of ``descriptor`` in the first 8
    bytes (little-endian), zeros after."""
    return fnv1a_64(descriptor).to_bytes(8, "little") + bytes(56)
