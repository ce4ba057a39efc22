"""The exceptions this package raises to its users, all in one place.

``kickmsg`` exports every one, and every one derives from ``KickmsgError``:
``except kickmsg.KickmsgError`` catches whatever this package raises on
purpose. Each also derives from the built-in exception
a caller would try first (``ValueError``, ``FileNotFoundError``,
``TimeoutError``...) and, where the native kickmsg raises ``RuntimeError``
for the same fault, from ``RuntimeError`` too, so code written for either
implementation catches it. This module imports nothing of the package: the
protocol cores, the API and the tools all raise from here.

What a program catches while it runs (a region gone, damaged, busy or
full, a peer that died, a file that is not a recording) is one of these.
A bad argument (a wrong type, a value out of its range, a malformed
name) stays a plain ``TypeError`` or ``ValueError`` naming the value at
fault: it is a mistake to fix in the calling code rather than a condition
to handle, an ``except KickmsgError`` around channel operations should not
hide it, and the native binding raises the same built-ins for it. A config
is the one argument that is a ``KickmsgError`` (``ConfigError``): it often
comes from a file or a command line, as data to refuse.

Two exceptions of the verification tools stand outside the root on
purpose: ``kickmsg.verify.scheduler.Aborted`` is a ``BaseException`` so
that no ``except Exception`` of the code under exploration swallows it,
and ``kickmsg.verify.crossdriver.Absent`` lives in a file that also runs in
the native library's interpreter and imports nothing of this package.
"""

__all__ = [
    "KickmsgError",
    "BoardBusyError",
    "BoardKeyOwnedError",
    "BridgeError",
    "CapacityError",
    "ConfigError",
    "ConfigMismatchError",
    "CorruptRegionError",
    "EmptyObjectError",
    "FileTooLarge",
    "Layout4Only",
    "LayoutError",
    "NoRoomError",
    "PoolEmptyError",
    "RecordingError",
    "RegionError",
    "RegionInitTimeout",
    "RegionNotFoundError",
    "RegionPermissionError",
    "TypeMismatchError",
    "VersionMismatchError",
]


class KickmsgError(Exception):
    """The root of every exception this package defines."""


# -- a channel's config --------------------------------------------------------------------

class ConfigError(KickmsgError, ValueError, RuntimeError):
    """An invalid channel config, naming the field and the value at fault.

    A ``ValueError`` (what this package documents) that is also a
    ``RuntimeError`` (what the native 0.1.0 raises for the fields it
    checks), so code written for either catches it."""


class ConfigMismatchError(KickmsgError, RuntimeError):
    """An existing region or blackboard was made with another config (or
    for another identity) than the one asked for; the message names what
    differs (0.9.2 raises RuntimeError: this is one)."""


# -- shared-memory objects (kickmsg.shm) --------------------------------------------------

class RegionNotFoundError(KickmsgError, FileNotFoundError, RuntimeError):
    """No shared-memory object has this name."""


class RegionPermissionError(KickmsgError, PermissionError, RuntimeError):
    """The shared-memory object exists but this process may not map it."""


class NoRoomError(KickmsgError, OSError):
    """A new object could not be given its memory (ENOSPC): nothing was left behind."""


class EmptyObjectError(KickmsgError, RuntimeError):
    """The object exists but has no bytes yet (a creator between shm_open
    and ftruncate, or not a Kickmsg region)."""


class PoolEmptyError(KickmsgError, BlockingIOError):
    """``send`` found every slot of the pool in use (subscribers still hold
    them, or a publisher died holding some): try again later, or see
    ``kickmsg audit NAME`` for who holds them."""


class CapacityError(KickmsgError, RuntimeError):
    """Every entry of a fixed-size table is taken by a live owner: a
    channel's subscriber rings, a blackboard's keys (the native bindings
    raise RuntimeError: this is one)."""


class BoardKeyOwnedError(KickmsgError, RuntimeError):
    """A blackboard key another live process owns (0.9.2 raises
    RuntimeError: this is one)."""


# -- a region's contents and layout -------------------------------------------------------

class CorruptRegionError(KickmsgError, RuntimeError):
    """Shared memory holds a value that no correct writer could have stored."""


class VersionMismatchError(KickmsgError, RuntimeError):
    """The region's version word is not 9 (0.9.2 raises RuntimeError too)."""


class RegionInitTimeout(KickmsgError, TimeoutError, RuntimeError):
    """create_or_open found the region but it never became initialised
    (0.9.2 raises RuntimeError: this is one)."""


class LayoutError(KickmsgError, AttributeError, RuntimeError):
    """A method only one layout has, asked of a region of the other; the
    message names the region's layout (an ``AttributeError``: the method is
    not there for that layout; a ``RuntimeError``, as the tools report them)."""


Layout4Only = LayoutError  # its old name (a layout-4 internal asked of a layout-9 region)


# -- typed channels (kickmsg.typed) --------------------------------------------------------

class TypeMismatchError(KickmsgError, RuntimeError):
    """A channel carries another record type than the one we join with."""


# -- the tools: diagnostics, the bridge, files they read -----------------------------------

class RegionError(KickmsgError, RuntimeError):
    """A region that cannot be inspected: missing, not permitted, not a
    Kickmsg region, an unsupported version, or damaged (one-line message)."""


class BoardBusyError(RegionError):
    """A blackboard whose lock stayed taken by a live holder: its keys
    could not be read, or a key declared, this time (the board is not
    damaged for that)."""


class BridgeError(KickmsgError, RuntimeError):
    """A bridge cannot start or cannot forward a channel as configured."""


class FileTooLarge(KickmsgError, ValueError):
    """A named file holds more than its use allows."""


class RecordingError(KickmsgError, ValueError):
    """A file that is not a usable recording: not one at all, damaged,
    without the payloads to play, or a ``.partial`` file still being
    written or left over beside its finished recording."""
