"""The exceptions this package raises to its users, all in one place.

``kickmsg`` exports every one, and every one derives from ``KickmsgError``:
``except kickmsg.KickmsgError`` catches whatever this package raises on
purpose. Each also derives from the built-in exception
a caller would try first (``ValueError``, ``FileNotFoundError``,
``TimeoutError``...) and, where the native kickmsg raises ``RuntimeError``
for the same fault, from ``RuntimeError`` too, so code written for either
implementation catches it. This module imports nothing of the package: the
protocol cores, the API and the tools all raise from here.
"""

__all__ = [
    "KickmsgError",
    "BoardBusyError",
    "BridgeError",
    "ConfigError",
    "CorruptRegionError",
    "EmptyObjectError",
    "FileTooLarge",
    "Layout4Only",
    "LayoutError",
    "NoRoomError",
    "PoolEmptyError",
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
    could not be read this time (the board is not damaged for that)."""


class BridgeError(KickmsgError, RuntimeError):
    """A bridge cannot start or cannot forward a channel as configured."""


class FileTooLarge(KickmsgError, ValueError):
    """A named file holds more than its use allows."""
