"""What layouts 4 and 9 share word for word: constants, the schema
descriptor's bytes, ``align64``, the config hash and ``CorruptRegionError``
(seed 000 and WIRE9.md A.1, A.6-A.8 agree on these).

``kickmsg.protocol.v4.layout`` and ``kickmsg.protocol.v9.layout`` import
them beside what differs (header tail, ring header, entry, slot header).
"""
import ctypes
import struct
from collections.abc import Sequence

from kickmsg.atomics import HARDWARE
from kickmsg.hash import fnv1a_64
from kickmsg.errors import CorruptRegionError

__all__ = [
    "CACHE_LINE", "CHANNEL_BROADCAST", "CHANNEL_PUBSUB", "CorruptRegionError", "DEFAULT_COMMIT_TIMEOUT_US",
    "INVALID_SLOT", "IN_FLIGHT_ONE", "MAGIC", "MAX_COMMIT_TIMEOUT_US", "RING_DRAINING", "RING_FREE", "RING_LIVE",
    "RING_STATE_MASK", "SCHEMA_CLAIMING", "SCHEMA_SET", "SCHEMA_UNSET", "SchemaInfoLayout", "U16_MAX", "U32_MAX",
    "U64_MAX", "align64", "Doorbell", "config_hash", "sleep_on_words",
]

MAGIC = 0x4B49434B4D534721  # "KICKMSG!", stored last at creation (release)
INVALID_SLOT = 0xFFFFFFFF
CACHE_LINE = 64
DEFAULT_COMMIT_TIMEOUT_US = 10_000  # 0.1.0 and 0.9.2 use 10 ms (the layout-4 spec text says 100 ms)
MAX_COMMIT_TIMEOUT_US = 86_400_000_000  # our bound (1 day): a hostile header must not make waits endless

CHANNEL_PUBSUB = 1
CHANNEL_BROADCAST = 2

# Ring state: the low 2 bits of state_flight; in_flight is state_flight >> 2.
RING_FREE = 0
RING_LIVE = 1
RING_DRAINING = 2
RING_STATE_MASK = 0b11
IN_FLIGHT_ONE = 4  # one admitted publisher

SCHEMA_UNSET = 0
SCHEMA_CLAIMING = 1
SCHEMA_SET = 2

U16_MAX = 0xFFFF
U32_MAX = 0xFFFFFFFF
U64_MAX = 0xFFFFFFFFFFFFFFFF


class SchemaInfoLayout(ctypes.Structure):
    """The 512-byte schema descriptor stored in the header."""

    _fields_ = [
        ("identity", ctypes.c_uint8 * 64),
        ("layout", ctypes.c_uint8 * 64),
        ("name", ctypes.c_uint8 * 128),  # UTF-8, NUL-terminated and zero-padded
        ("version", ctypes.c_uint32),
        ("identity_algo", ctypes.c_uint32),
        ("layout_algo", ctypes.c_uint32),
        ("flags", ctypes.c_uint32),
        ("reserved", ctypes.c_uint8 * 240),  # zero on write
    ]


assert ctypes.sizeof(SchemaInfoLayout) == 512


def align64(size: int) -> int:
    return (size + CACHE_LINE - 1) // CACHE_LINE * CACHE_LINE


def config_hash(
    channel_type: int,
    max_subscribers: int,
    sub_ring_capacity: int,
    pool_size: int,
    max_payload_size: int,
    commit_timeout_us: int,
) -> int:
    """FNV-1a 64 of the packed config; two regions with equal hashes are
    interchangeable for create_or_open. Neither schema nor identity enters it."""
    packed = struct.pack(
        "<IQQQQq",
        channel_type,
        max_subscribers,
        sub_ring_capacity,
        pool_size,
        max_payload_size,
        commit_timeout_us,
    )
    return fnv1a_64(packed)


def sleep_on_words(addresses: Sequence[int], values: Sequence[int], timeout_ns: int) -> None:
    """Sleep (without the GIL) on the futex words several rings' cores
    announced (``announce_wait``: a WaitSet's subscribers, of either
    layout) until one is woken or no longer holds the value seen there, or
    ``timeout_ns`` passes (negative: no limit)."""
    HARDWARE.futex_waitv(addresses, values, timeout_ns)


class Doorbell:
    """A futex word in this process's memory that one thread rings (a new
    generation, release) to end another's sleep on it, alone (``wait``) or
    beside rings' words (``sleep_on_words([doorbell.address, ...])``)."""

    def __init__(self) -> None:
        self._word = ctypes.c_uint32(0)
        self.address = ctypes.addressof(self._word)

    def ring(self, generation: int) -> None:
        """Store ``generation`` (release) and wake every sleeper."""
        HARDWARE.store_release_u32(self.address, generation)
        HARDWARE.futex_wake_all(self.address)

    def wait(self, generation: int, timeout_ns: int) -> None:
        """Sleep while the word still holds ``generation``, at most ``timeout_ns``."""
        HARDWARE.futex_wait(self.address, generation, timeout_ns)
