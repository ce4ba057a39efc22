"""Shared by the commands: naming and opening channels, output, stopping
on signals, and the argument types.
"""
import argparse
import importlib
import math
import os
import signal
import sys
import threading
import warnings
from collections.abc import Callable, Sequence
from types import FrameType, ModuleType
from typing import Any, TextIO

from kickmsg import jsontext, layouts, shm
from kickmsg.stopsignals import STOP_SIGNALS, exit_forced
from kickmsg.config import MAX_POOL_SIZE, MAX_SUBSCRIBERS, Config
from kickmsg.errors import KickmsgError
from kickmsg.ops import diagnostics
from kickmsg.region import SharedRegion
from kickmsg.terminal import printable

__all__ = [
    "CommandError", "EXIT_ERROR", "EXIT_FOUND", "EXIT_OK", "GEOMETRY_OPTIONS", "NODE_NAMING", "NUMBER_RANGE",
    "add_geometry_options", "channel_name", "config_of", "counted", "discard_stdout", "emit", "geometry_fields",
    "geometry_options_given", "import_extra", "import_module_of_extra", "inspect", "octal_mode", "open_writable",
    "port_number", "positive_int", "positive_number", "print_warnings_on_one_line", "remapping", "shm_name",
    "stop_on_signals", "table",
]

EXIT_OK, EXIT_FOUND, EXIT_ERROR = 0, 1, 2
NODE_NAMING = "NAME, --topic T, --broadcast CH or --mailbox OWNER TAG"
GEOMETRY_OPTIONS = ("max_subscribers", "ring", "pool", "payload", "commit_timeout", "layout")  # of create and pub --create


class CommandError(KickmsgError):
    """Bad input: reported as one line, exit status 2."""


def shm_name(text: str) -> str:
    """``x`` or ``/x`` -> ``/x``."""
    return text if text.startswith("/") else "/" + text


def channel_name(args: argparse.Namespace) -> str:
    """The shm name the arguments designate (Node naming rules for --topic etc.)."""
    chosen = [args.name is not None, args.topic is not None, args.broadcast is not None, args.mailbox is not None]
    if sum(chosen) != 1:
        raise CommandError(f"name exactly one channel: {args.naming}")
    if args.topic is not None:
        return f"/{args.prefix}_{args.topic}"
    if args.broadcast is not None:
        return f"/{args.prefix}_broadcast_{args.broadcast}"
    if args.mailbox is not None:
        owner, tag = args.mailbox
        return f"/{args.prefix}_{owner}_mbx_{tag}"
    return shm_name(args.name)


def inspect(name: str) -> SharedRegion:
    """Attach read-only, turning every failure into a one-line error."""
    return _attach(SharedRegion.inspect, name)


def open_writable(name: str) -> SharedRegion:
    return _attach(SharedRegion.open, name)


def _attach(how: Callable[[str], SharedRegion], name: str) -> SharedRegion:
    try:
        return how(name)
    except shm.RegionNotFoundError:
        raise CommandError(f"no such region: {name}") from None
    except shm.RegionPermissionError as error:  # names the mode, the owner and who we are
        raise CommandError(str(error)) from None
    except RuntimeError as error:
        text = str(error)
        if "bad magic" in text:
            raise CommandError(diagnostics.not_a_channel(name)) from None
        if "Version mismatch" in text:
            raise CommandError(f"unsupported version: {text}") from None
        raise CommandError(text.splitlines()[0]) from None


def import_extra(module: str) -> ModuleType:
    """Import a module that needs the ``spark`` extra (pyarrow, pyspark,
    matplotlib); if it cannot be imported, a one-line error naming the extra."""
    return import_module_of_extra(module, "spark")


def import_module_of_extra(module: str, extra: str) -> ModuleType:
    """Import a module that needs an extra; if it cannot be imported, a
    one-line error naming the extra."""
    try:
        return importlib.import_module(module)
    except ImportError as error:
        raise CommandError(
            f"cannot import {error.name or module} ({error}); install the {extra} extra: pip install 'kickmsg-py[{extra}]'"
        ) from None


def emit(args: argparse.Namespace, data: object, text: str) -> None:
    """Print ``data`` as JSON with --json, else ``text``."""
    print(jsontext.dumps(data, indent=None if getattr(args, "json_lines", False) else 2) if args.json else text, flush=True)


def table(rows: list[dict[str, Any]], columns: Sequence[str]) -> str:
    """Plain aligned columns; a missing value shows as ``-``, control
    characters in a value as escapes."""
    cells = [[str(column).upper() for column in columns]]
    cells += [["-" if row.get(c) is None else printable(str(row[c])) for c in columns] for row in rows]
    widths = [max(len(line[i]) for line in cells) for i in range(len(columns))]
    return "\n".join("  ".join(cell.ljust(width) for cell, width in zip(line, widths)).rstrip() for line in cells)


def counted(number: int, singular: str, plural: str) -> str:
    """``1 locked entry``, ``2 locked entries``."""
    return f"{number} {singular if number == 1 else plural}"


def stop_on_signals() -> threading.Event:
    """An event that SIGINT, SIGTERM or SIGHUP sets: the command checks it
    between receives (never interrupted inside one, where a slot may be
    pinned), leaves its ring, closes its files and prints its summary. A
    second signal forces it out at once (``exit_forced``), whatever it is
    doing."""
    stop = threading.Event()
    signalled = False

    def handle(number: int, frame: FrameType | None) -> None:
        nonlocal signalled
        if signalled or stop.is_set():
            exit_forced(number, frame)
        signalled = True
        # Set from a thread of its own: the signal may have stopped this
        # thread inside stop.wait() while it held the event's lock, which
        # set() takes too (set here, it would wait for itself forever).
        threading.Thread(target=stop.set, name="stop on signal", daemon=True).start()

    for number in STOP_SIGNALS:
        signal.signal(number, handle)
    return stop


def discard_stdout() -> None:
    """Point stdout at /dev/null, so that the interpreter's last flush of
    what is still buffered neither fails (closed pipe) nor blocks (full pipe)."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, sys.stdout.fileno())
    os.close(devnull)


def print_warnings_on_one_line(command: str) -> None:
    """Library warnings (e.g. a geometry that cannot work) as one stderr line each."""
    def show(message: Warning | str, category: type[Warning], filename: str, lineno: int,
             file: TextIO | None = None, line: str | None = None) -> None:
        print(f"kickmsg {command}: warning: {printable(str(message))}", file=sys.stderr, flush=True)

    warnings.showwarning = show


def geometry_fields(region: SharedRegion) -> dict:
    """The channel type and the Config fields a region was made with."""
    g = region.geometry
    return {
        "type": region.channel_type.name,
        "layout": region.layout,
        "max_subscribers": g.max_subs,
        "sub_ring_capacity": g.capacity,
        "pool_size": g.pool_size,
        "max_payload_size": g.slot_data_size,
        "commit_timeout_us": g.commit_timeout_us,
    }


def config_of(args: argparse.Namespace) -> Config:
    """The Config of the geometry options (--ring, --pool, ...); Config()'s
    defaults for those not given."""
    given = {
        "max_subscribers": args.max_subscribers, "sub_ring_capacity": args.ring, "pool_size": args.pool,
        "max_payload_size": args.payload, "commit_timeout": args.commit_timeout,
    }
    return Config(**{field: value for field, value in given.items() if value is not None})


def geometry_options_given(args: argparse.Namespace) -> list[str]:
    return [f"--{option.replace('_', '-')}" for option in GEOMETRY_OPTIONS if getattr(args, option) is not None]


def positive_int(text: str) -> int:
    """An argparse type: an integer above 0."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not an integer: {text!r}") from None
    if value <= 0:
        raise argparse.ArgumentTypeError(f"must be greater than 0, not {text}")
    return value


def remapping(text: str) -> tuple[str, str]:
    """An argparse type: ``OLD=NEW``, two channel names (``x`` or ``/x``)."""
    old, equals, new = text.partition("=")
    if not (equals and old and new):
        raise argparse.ArgumentTypeError(f"not OLD=NEW: {text!r}")
    return shm_name(old), shm_name(new)


NUMBER_RANGE = (1e-6, 1e6)  # seconds, rates, megabytes: 11 days, a message in 11 days, a terabyte


def positive_number(text: str) -> float:
    """An argparse type: a finite number above 0 (seconds, a rate, megabytes),
    within NUMBER_RANGE (beyond it, waits overflow the platform's timeouts)."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None
    if not (math.isfinite(value) and value > 0):
        raise argparse.ArgumentTypeError(f"must be a finite number greater than 0, not {text}")
    smallest, largest = NUMBER_RANGE
    if not smallest <= value <= largest:
        raise argparse.ArgumentTypeError(f"must be from {smallest:g} to {largest:g}, not {text}")
    return value


def port_number(text: str) -> int:
    """An argparse type: a TCP port, 0 to 65535."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a port number: {text!r}") from None
    if not 0 <= value <= 65535:
        raise argparse.ArgumentTypeError(f"must be a port number from 0 to 65535, not {text}")
    return value


def octal_mode(text: str) -> int:
    """An argparse type: permission bits in octal, e.g. 0600."""
    try:
        return int(text, 8)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not an octal permission mode such as 0600 or 0660: {text!r}") from None


def add_geometry_options(sub: argparse.ArgumentParser, creator: str) -> None:
    """The options of a new channel (create, pub --create); Config()'s defaults."""
    defaults = Config()
    sub.add_argument("--max-subscribers", type=positive_int, metavar="N",
                     help=f"rings, one per subscriber (default {defaults.max_subscribers}, at most {MAX_SUBSCRIBERS})")
    sub.add_argument("--ring", type=positive_int, metavar="N",
                     help=f"sub_ring_capacity: messages each ring keeps, a power of 2 (default {defaults.sub_ring_capacity})")
    sub.add_argument("--pool", type=positive_int, metavar="N",
                     help=f"pool_size: message slots, more than --ring (default {defaults.pool_size}, at most {MAX_POOL_SIZE})")
    sub.add_argument("--payload", type=positive_int, metavar="BYTES",
                     help=f"max_payload_size (default {defaults.max_payload_size})")
    sub.add_argument("--commit-timeout", type=float, metavar="S",
                     help=f"seconds a publisher waits on an entry a crashed one left locked "
                          f"(default {defaults.commit_timeout.total_seconds():g})")
    sub.add_argument("--creator", default=creator, metavar="NAME", help=f"creator name in the header (default {creator})")
    sub.add_argument("--layout", type=int, choices=layouts.SUPPORTED_LAYOUTS,
                     help=f"channel layout: 4 (native kickmsg 0.1.0) or 9 (native 0.9.2) "
                          f"(default ${layouts.LAYOUT_ENV}, else {layouts.DEFAULT_LAYOUT})")
    sub.add_argument("--mode", type=octal_mode, metavar="OCTAL",
                     help=f"permission bits of the new object (default ${shm.MODE_VARIABLE}, else 0600; the umask applies)")
