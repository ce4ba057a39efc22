"""Kickmsg in pure Python: lock-free shared-memory publish/subscribe.

Byte-compatible with the native ``kickmsg`` 0.1.0 (layout version 4) and
0.9.2 (layout version 9), offering their Python API on both layouts: a
process using this package and one using the native library can share a
channel in either direction. ``kickmsg.layouts`` says which layout a new
region gets. Beyond that API, the
top level adds ``audit(region)``, ``WaitSet`` (waiting on many subscribers
at once, handlers) and the exceptions of ``kickmsg.errors`` (``ConfigError``,
every invalid config: a ``ValueError`` that is also 0.1.0's
``RuntimeError``; ``RegionNotFoundError``...); typed channels are in
``kickmsg.typed``, asyncio in ``kickmsg.aio``.
"""
from kickmsg import stopsignals

stopsignals.exit_while_the_command_starts()  # first: an interrupt while the `kickmsg` command imports exits 130

from kickmsg import build  # next, before any other kickmsg module: KICKMSG_PURE=1 loads them from their source

from kickmsg import _moved, errors, hash, schema
from kickmsg.config import ChannelType, Config
from kickmsg.errors import (
    BoardBusyError,
    BoardKeyOwnedError,
    BridgeError,
    CapacityError,
    ConfigError,
    ConfigMismatchError,
    CorruptRegionError,
    EmptyObjectError,
    FileTooLarge,
    KickmsgError,
    Layout4Only,
    LayoutError,
    NoRoomError,
    PoolEmptyError,
    RecordingError,
    RegionError,
    RegionInitTimeout,
    RegionNotFoundError,
    RegionPermissionError,
    TypeMismatchError,
    VersionMismatchError,
)
from kickmsg.node import BroadcastHandle, Node
from kickmsg.ops.audit import audit
from kickmsg.process import current_pid, process_exists
from kickmsg.protocol.info import RegionInfo, RegionStats, RingStats
from kickmsg.publisher import AllocatedSlot, Publisher
from kickmsg.region import HealthReport, SharedRegion, unlink_shm
from kickmsg.schema import SchemaInfo
from kickmsg.subscriber import SampleView, Subscriber
from kickmsg.waitset import WaitSet

__version__ = "0.1.0"  # kickmsg-py's own version: it says nothing of the native releases it is compatible with

__all__ = [
    "AllocatedSlot",
    "BroadcastHandle",
    "ChannelType",
    "Config",
    "HealthReport",
    "Node",
    "Publisher",
    "RegionInfo",
    "RegionStats",
    "RingStats",
    "SampleView",
    "SchemaInfo",
    "SharedRegion",
    "Subscriber",
    "WaitSet",
    "audit",
    "current_pid",
    "hash",
    "process_exists",
    "schema",
    "unlink_shm",
]
__all__ += errors.__all__  # every exception this package raises to its users (kickmsg.errors)

build.warn_if_stale()

# Layout 9's participant registry and Blackboard (WIRE9.md C, D), named as 0.9.2 names them.
from kickmsg.protocol.v9.blackboard import (
    Blackboard,
    BlackboardConfig,
    BlackboardReader,
    BlackboardWriter,
    KeyStatus,
    ReadOutcome,
)
from kickmsg.protocol.v9.registry import Kind, Participant, Registry, Role, TopicSummary

__all__ += [
    "Blackboard",
    "BlackboardConfig",
    "BlackboardReader",
    "BlackboardWriter",
    "KeyStatus",
    "Kind",
    "Participant",
    "ReadOutcome",
    "Registry",
    "Role",
    "TopicSummary",
]

_moved.install()  # last: the old module paths (kickmsg.diagnostics...) warn and keep working for one release
