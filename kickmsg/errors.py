"""The exceptions this package raises to its users, all in one place.

``kickmsg`` exports every one. Each also derives from the built-in exception
a caller would try first (``ValueError``, ``FileNotFoundError``,
``TimeoutError``...) and, where the native kickmsg raises ``RuntimeError``
for the same fault, from ``RuntimeError`` too, so code written for either
implementation catches it. This module imports nothing of the package: the
protocol cores, the API and the tools all raise from here.
"""

__all__ = [
    "BoardBusyError",
    "BridgeError",
    "ConfigError",
    "CorruptRegionError",
    "EmptyObjectError",
    "FileTooLarge",
    "Layout4Only",
    "NoRoomError",
    "RegionError",
    "RegionInitTimeout",
    "RegionNotFoundError",
    "RegionPermissionError",
    "TypeMismatchError",
    "VersionMismatchError",
]


# -- a channel's config --------------------------------------------------------------------

class ConfigError(ValueError, RuntimeError):
    """An invalid channel config, naming the field and the value at fault.

    A ``ValueError`` (what this package documents) that is also a
    ``RuntimeError`` (what the native 0.1.0 raises for the fields it
    checks), so code written for either catches it."""


# -- shared-memory objects (kickmsg.shm) --------------------------------------------------

class RegionNotFoundError(FileNotFoundError, RuntimeError):
    """No shared-memory object has this name."""


class RegionPermissionError(PermissionError, RuntimeError):
    """The shared-memory object exists but this process may not map it."""


class NoRoomError(OSError):
    """A new object could not be given its memory (ENOSPC): nothing was left behind."""


class EmptyObjectError(RuntimeError):
    """The object exists but has no bytes yet (a creator between shm_open
    and ftruncate, or not a Kickmsg region)."""


# -- a region's contents and layout -------------------------------------------------------

class CorruptRegionError(RuntimeError):
    """Shared memory holds a value that no correct writer could have stored."""


class VersionMismatchError(RuntimeError):
    """The region's version word is not 9 (0.9.2 raises RuntimeError too)."""


class RegionInitTimeout(TimeoutError, RuntimeError):
    """create_or_open found the region but it never became initialised
    (0.9.2 raises RuntimeError: this is one)."""


class Layout4Only(AttributeError, RuntimeError):
    """A layout-4 internal asked of a layout-9 region (a RuntimeError, as the
    tools report them)."""


# -- typed channels (kickmsg.typed) --------------------------------------------------------

class TypeMismatchError(RuntimeError):
    """A channel carries another record type than the one we join with."""


# -- the tools: diagnostics, the bridge, files they read -----------------------------------

class RegionError(RuntimeError):
    """A region that cannot be inspected: missing, not permitted, not a
    Kickmsg region, an unsupported version, or damaged (one-line message)."""


class BoardBusyError(RegionError):
    """A blackboard whose lock stayed taken by a live holder: its keys
    could not be read this time (the board is not damaged for that)."""


class BridgeError(RuntimeError):
    """A bridge cannot start or cannot forward a channel as configured."""


class FileTooLarge(ValueError):
    """A named file holds more than its use allows."""
