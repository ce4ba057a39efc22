"""The ``kickmsg`` command: list, inspect, watch, echo, measure, create,
remove, repair and clean channels.

Works on regions made by this package and by the native library. Channels
are named by shm name (``/kickmsg_imu``) or with the Node naming rules
(``--topic imu [--prefix kickmsg]``, ``--broadcast CH``, ``--mailbox OWNER
TAG``). Every subcommand takes ``--json``. Inspection commands attach
read-only (``SharedRegion.inspect``), so they cannot modify a region; only
``create``, ``rm``, ``pub``, ``repair`` and ``clean`` write, and
``echo``/``hz``/``bw``/``record`` join a ring as a subscriber while they run.

Commands that run until stopped end cleanly on SIGINT, SIGTERM or SIGHUP
(they leave their ring, close their files and print their summary); a second
signal forces them out (exit status 130). Output into a closed pipe ends a
command quietly, as it does a Unix filter.

Exit status: 0 success; 1 a check found something (``diagnose``, ``audit``,
``schema-diff``, ``crosscheck``, ``verify``) or ``echo``/``hz``/``bw`` stopped
for silence before ``--count`` messages arrived; 2 an error, reported on one
line.
"""
import argparse
import datetime
import glob
import importlib
import json
import math
import os
import re
import signal
import statistics
import sys
import threading
import time
import warnings
from types import ModuleType
from typing import Any

import numpy

import kickmsg
from kickmsg import diagnostics, layout, owners, shm, typed
from kickmsg.audit import audit
from kickmsg.diagnostics import is_kickmsg, is_orphan_sidecar, is_sidecar, pid_alive, read_magic_and_version, shm_objects
from kickmsg.config import ChannelType, Config
from kickmsg.publisher import send_retrying
from kickmsg.region import SharedRegion
from kickmsg.schema import Diff, diff

EXIT_OK, EXIT_FOUND, EXIT_ERROR = 0, 1, 2
EXIT_FORCED = 130  # a second stop signal (or Ctrl-C) forced the command out
LIST_COLUMNS = (
    "name", "type", "version", "creator", "pid", "alive", "subs", "pubs", "capacity", "pool", "payload", "schema",
    "health", "mode", "owner", "problem",
)
TABLE_COLUMNS = LIST_COLUMNS[:-1]  # the text table tells problems in a footer
JSON_FIELDS = {  # list --json: numbers apart
    "subs": ("subs_live", "subs_max"), "pubs": ("pubs_live", "pubs_stall"), "pool": ("pool_free", "pool_size"),
}
NODE_NAMING = "NAME, --topic T, --broadcast CH or --mailbox OWNER TAG"
STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
RECEIVE_SLICE_S = 0.1  # a receive waits at most this long, so that a stop signal is seen soon
DEFAULT_SILENCE_S = 10.0  # hz/bw --count without --timeout give up after this long without a message
GEOMETRY_OPTIONS = ("max_subscribers", "ring", "pool", "payload", "commit_timeout")  # of create and pub --create
URI_SCHEME = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]*://")  # hdfs://, s3a://, file://: Spark's to resolve
GLOB_CHARACTERS = "*?["
PARQUET_MAGIC = b"PAR1"


class CommandError(Exception):
    """Bad input: reported as one line, exit status 2."""


# -- naming and opening ------------------------------------------------------


def shm_name(text: str) -> str:
    """``x`` or ``/x`` -> ``/x``."""
    return text if text.startswith("/") else "/" + text


def channel_name(args) -> str:
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


def _attach(how, name: str) -> SharedRegion:
    try:
        return how(name)
    except shm.RegionNotFoundError:
        raise CommandError(f"no such region: {name}") from None
    except shm.RegionPermissionError:
        raise CommandError(f"permission denied: {name}") from None
    except RuntimeError as error:
        text = str(error)
        if "bad magic" in text:
            raise CommandError(f"not a Kickmsg region: {name}") from None
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


def emit(args, data, text: str) -> None:
    """Print ``data`` as JSON with --json, else ``text``."""
    print(json.dumps(data, indent=None if getattr(args, "json_lines", False) else 2) if args.json else text, flush=True)


def table(rows: list[dict], columns) -> str:
    """Plain aligned columns; a missing value shows as ``-``."""
    cells = [[str(column).upper() for column in columns]]
    cells += [["-" if row.get(c) is None else str(row[c]) for c in columns] for row in rows]
    widths = [max(len(line[i]) for line in cells) for i in range(len(columns))]
    return "\n".join("  ".join(cell.ljust(width) for cell, width in zip(line, widths)).rstrip() for line in cells)


def counted(number: int, singular: str, plural: str) -> str:
    """``1 locked entry``, ``2 locked entries``."""
    return f"{number} {singular if number == 1 else plural}"


# -- stopping -------------------------------------------------------------------


def stop_on_signals() -> threading.Event:
    """An event that SIGINT, SIGTERM or SIGHUP sets: the command checks it
    between receives (never interrupted inside one, where a slot may be
    pinned), leaves its ring, closes its files and prints its summary. A
    second signal while stopping forces it out (KeyboardInterrupt)."""
    stop = threading.Event()

    def handle(number, frame):
        if stop.is_set():
            raise KeyboardInterrupt
        stop.set()

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
    def show(message, category, filename, lineno, file=None, line=None):
        print(f"kickmsg {command}: warning: {message}", file=sys.stderr, flush=True)

    warnings.showwarning = show


# -- descriptions ----------------------------------------------------------------


def schema_dict(info) -> dict | None:
    if info is None:
        return None
    return {
        "name": info.name,
        "version": info.version,
        "identity": info.identity.hex(),
        "layout": info.layout.hex(),
        "identity_algo": info.identity_algo,
        "layout_algo": info.layout_algo,
        "flags": info.flags,
    }


def geometry_fields(region: SharedRegion) -> dict:
    """The channel type and the Config fields a region was made with."""
    g = region.geometry
    return {
        "type": region.channel_type.name,
        "max_subscribers": g.max_subs,
        "sub_ring_capacity": g.capacity,
        "pool_size": g.pool_size,
        "max_payload_size": g.slot_data_size,
        "commit_timeout_us": g.commit_timeout_us,
    }


# -- subcommands ---------------------------------------------------------------------


def cmd_list(args: argparse.Namespace) -> int:
    columns = args.columns.split(",") if args.columns else list(LIST_COLUMNS if args.json else TABLE_COLUMNS)
    unknown = [c for c in columns if c not in LIST_COLUMNS]
    if unknown:
        raise CommandError(f"unknown column(s) {', '.join(unknown)}; choose from {','.join(LIST_COLUMNS)}")
    found = diagnostics.list_regions(args.prefix, everything=args.all)
    rows = [row for row in found if row.type != "unreadable"]
    denied = len(found) - len(rows)
    unreadable = f"{counted(denied, 'object', 'objects')} could not be read: permission denied"
    if args.json:
        print(json.dumps([json_list_row(row, columns) for row in rows], indent=2), flush=True)
        if denied:
            print(f"kickmsg list: {unreadable}", file=sys.stderr)
        return EXIT_OK
    lines = [table([text_list_row(row) for row in rows], columns) if rows else
             "no shared-memory objects" if args.all else "no Kickmsg regions"]
    if any(row.type == "damaged" or row.type.startswith("unsupported") for row in rows):
        lines.append("kickmsg info NAME for details on damaged or unsupported regions")
    if "pubs" in columns and any(row.pubs_live is not None for row in rows):
        lines.append(f"PUBS: live publishers of this package ({diagnostics.UNRECORDED_PUBLISHERS})")
    if denied:
        lines.append(unreadable)
    print("\n".join(lines), flush=True)
    return EXIT_OK


def json_list_row(row: diagnostics.RegionSummary, columns: list[str]) -> dict[str, Any]:
    """A list row for --json: the chosen columns, ``subs``, ``pubs`` and
    ``pool`` as two numbers each (``subs_live``, ``subs_max``, ``pubs_live``,
    ``pubs_stall``, ``pool_free``, ``pool_size``)."""
    fields = vars(row)
    return {name: fields[name] for column in columns for name in JSON_FIELDS.get(column, (column,))}


def text_list_row(row: diagnostics.RegionSummary) -> dict[str, Any]:
    """A list row for the table: ``subs`` and ``pool`` as ``live/max``,
    ``free/size``, ``pubs`` as ``live`` (``+N stall``), health as its first word."""
    cells = vars(row)
    if row.subs_live is None:
        return cells
    stall = f"+{row.pubs_stall}stall" if row.pubs_stall else ""
    return dict(cells, subs=f"{row.subs_live}/{row.subs_max}", pool=f"{row.pool_free}/{row.pool_size}",
                pubs=f"{row.pubs_live}{stall}", health=(row.health or "").split(":")[0])


def cmd_info(args: argparse.Namespace) -> int:
    found = diagnostics.region_info(inspect(channel_name(args)))
    data = diagnostics.to_json(found)
    lines = []
    for key, value in data.items():
        if key == "hazards":
            continue
        if isinstance(value, dict):
            value = ", ".join(f"{k}={v}" for k, v in value.items())
        lines.append(f"{key:<18} {value}")
    lines += [f"{'warning':<18} {hazard}" for hazard in found.hazards]
    emit(args, data, "\n".join(lines))
    return EXIT_OK


def cmd_stats(args: argparse.Namespace) -> int:
    region = inspect(channel_name(args))
    found = diagnostics.region_stats(region, audit(region))
    shown = [dict(vars(row), owner_pid=owner_cell(row)) for row in found.rings]
    lines = [f"{region.name}: pool {found.pool_free}/{found.pool_size} slots free", table(
        shown, ["ring", "state", "in_flight", "write_pos", "held", "locked", "owner_pid", "read_pos", "pending", "lost"]
    )]
    lines += [
        f"ring {row.ring}: its subscriber (pid {row.owner_pid}) died; kickmsg repair {region.name} reclaims it"
        for row in found.rings if row.owner_alive is False
    ]
    lines += publisher_lines(region.name, found.publishers)
    emit(args, diagnostics.to_json(found), "\n".join(lines))
    return EXIT_OK


def publisher_lines(name: str, publishers: list[diagnostics.Participant]) -> list[str]:
    """The recorded publishers as a table (a dead one as ``stall``), and
    the reminder that native publishers are not recorded."""
    if not publishers:
        return [f"publishers: none recorded ({diagnostics.UNRECORDED_PUBLISHERS})"]
    rows = [dict(vars(p), state="live" if p.alive else "stall") for p in publishers]
    lines = [f"publishers ({diagnostics.UNRECORDED_PUBLISHERS}):",
             table(rows, ["pid", "node_name", "state", "sent", "dropped"])]
    lines += [f"publisher {p.pid} died without leaving (stall); kickmsg repair {name} reclaims its record"
              for p in publishers if not p.alive]
    return lines


def owner_cell(row: diagnostics.RingStats) -> str | None:
    """A ring's owner pid for the text table, marked if that process died."""
    if row.owner_pid is None:
        return None
    return f"{row.owner_pid} (dead)" if row.owner_alive is False else str(row.owner_pid)


def cmd_watch(args: argparse.Namespace) -> int:
    stop = stop_on_signals()
    name = channel_name(args)
    inspect(name)  # a one-line error before anything else
    args.json_lines = True
    for refreshes, snapshot in enumerate(diagnostics.watch(name, args.interval, stop), 1):
        if args.json:
            emit(args, diagnostics.to_json(snapshot), "")
        else:
            shown = [vars(row) for row in snapshot.rings if row.state != "Free" or row.in_flight]
            live = sum(p.alive for p in snapshot.publishers)
            stalled = len(snapshot.publishers) - live
            screen = (
                f"{snapshot.name}  {datetime.datetime.now():%H:%M:%S}  pool {snapshot.pool_used}/{snapshot.pool_size} in use\n"
                f"{snapshot.verdict}\n"
                f"publishers: {live} live, {stalled} stall ({diagnostics.UNRECORDED_PUBLISHERS})\n"
                + (table(shown, ["ring", "state", "in_flight", "write_pos", "msgs_per_s", "pending", "lost", "new_lost"]) if shown else "no active rings")
            )
            print(("\x1b[H\x1b[2J" if sys.stdout.isatty() else "") + screen + "\n", flush=True)
        if args.count is not None and refreshes >= args.count:
            break
    return EXIT_OK


def decode_records(data: bytes, record_type: typed.RecordType | None) -> numpy.ndarray | None:
    """A typed message's records; None if the channel is untyped or the
    length is not a whole number of records."""
    if record_type is None or len(data) % record_type.dtype.itemsize:
        return None
    return numpy.frombuffer(data, dtype=record_type.dtype)


def _json_value(value):
    """JSON for what numpy's tolist() gives that json does not know (bytes fields)."""
    if isinstance(value, bytes):
        return value.decode("utf-8", errors="backslashreplace")
    return str(value)


def _field_text(value) -> str:
    """A field as numpy prints it: the shortest text that reads back the same."""
    if isinstance(value, numpy.ndarray):
        return numpy.array2string(value, separator=", ", floatmode="unique")
    return str(value)


def format_message(data: bytes, ring_pos: int, records: numpy.ndarray | None, fmt: str) -> str:
    """One line of ``echo`` output; typed records print their fields."""
    names = records.dtype.names if records is not None else None
    if fmt == "json":
        entry = {"ring_pos": ring_pos, "size": len(data)}
        if records is not None:
            entry["fields"] = [{n: r[n].tolist() for n in names} if names else r.tolist() for r in records]
        else:
            entry["text"] = data.decode("utf-8", errors="backslashreplace")
            entry["hex"] = data.hex()
        return json.dumps(entry, default=_json_value)
    if fmt == "hex":
        return f"[{ring_pos}] {data.hex()}"
    if records is not None:
        shown = (" ".join(f"{n}={_field_text(r[n])}" for n in names) if names else _field_text(r) for r in records)
        return f"[{ring_pos}] " + "; ".join(shown)
    return f"[{ring_pos}] {data.decode('utf-8', errors='backslashreplace')}"


def subscribed(args):
    """A subscriber on the named channel (joins a ring while the command runs)."""
    region = open_writable(channel_name(args))
    try:
        return region, kickmsg.Subscriber(region)
    except RuntimeError as error:
        raise CommandError(str(error).splitlines()[0]) from None


def receive_slice(args, subscriber: kickmsg.Subscriber, *deadlines: float | None):
    """The next message as a view, waiting at most RECEIVE_SLICE_S or until
    the nearest deadline (monotonic seconds; None: none), so that the caller
    sees its stop flag soon. Tells on stderr when the subscriber followed
    its channel to a re-created region."""
    lost, rejoined = subscriber.lost, subscriber.rejoined
    now = time.monotonic()
    view = subscriber.receive_view(max(0.0, min([RECEIVE_SLICE_S] + [d - now for d in deadlines if d is not None])))
    if subscriber.rejoined != rejoined:
        tell_rejoined(args.command, subscriber.region.name, subscriber.lost - lost)
    return view


def tell_rejoined(command: str, name: str, lost: int) -> None:
    print(f"kickmsg {command}: {name} was re-created; following it ({counted(lost, 'unread message', 'unread messages')} lost)",
          file=sys.stderr, flush=True)


def silence_note(seconds: float, received: int, count: int | None) -> str:
    """Why a receiving command stopped on its silence timeout."""
    arrived = "" if count is None else f" ({received} of {count} messages arrived)"
    return f"stopped: no message for {seconds:g} s{arrived}"


def cmd_echo(args) -> int:
    stop = stop_on_signals()
    region, subscriber = subscribed(args)
    schema = region.schema()
    record_type = typed.RecordType.from_schema(schema) if schema else None
    printed = 0
    last_message = time.monotonic()
    silent = False  # stopped by --timeout
    with subscriber:
        while (args.count is None or printed < args.count) and not stop.is_set():
            quiet_until = None if args.timeout is None else last_message + args.timeout
            if quiet_until is not None and time.monotonic() >= quiet_until:
                silent = True
                break
            view = receive_slice(args, subscriber, quiet_until)
            if view is None:
                continue
            last_message = time.monotonic()
            with view:
                data, ring_pos = bytes(view), view.ring_pos
            if args.format == "raw":
                sys.stdout.buffer.write(data)
                sys.stdout.buffer.flush()
            else:
                records = decode_records(data, record_type)
                print(format_message(data, ring_pos, records, "json" if args.json else args.format), flush=True)
            printed += 1
    if subscriber.lost and not args.json and args.format != "raw":
        print(f"(lost {subscriber.lost} messages)", file=sys.stderr)
    if silent and args.count is not None:
        print(f"kickmsg echo: {silence_note(args.timeout, printed, args.count)}", file=sys.stderr)
        return EXIT_FOUND
    return EXIT_OK


def measure(args, describe) -> int:
    """Receive for hz/bw until --count, --duration, a stop signal, or
    silence (--timeout; DEFAULT_SILENCE_S with --count). Every --every
    seconds print ``describe(times, sizes, received)`` of the last --window
    messages, or how long nothing has arrived; then a final report. Exit
    status 1 if silence ended it before --count messages arrived."""
    stop = stop_on_signals()
    _, subscriber = subscribed(args)
    silence = args.timeout if args.timeout is not None else DEFAULT_SILENCE_S if args.count is not None else None
    times, sizes = [], []  # the last --window messages
    received = reported = 0  # messages in all, and when last reported
    started = last_message = time.monotonic()
    end = None if args.duration is None else started + args.duration
    next_report = started + args.every
    with subscriber:
        while True:
            now = time.monotonic()
            quiet_until = None if silence is None else last_message + silence
            if stop.is_set():
                stopped = "signal"
            elif args.count is not None and received >= args.count:
                stopped = "count"
            elif end is not None and now >= end:
                stopped = "duration"
            elif quiet_until is not None and now >= quiet_until:
                stopped = "silence"
            else:
                stopped = None
            if stopped:
                break
            if now >= next_report:
                if not args.json:
                    news = describe(times, sizes, received)[1] if received > reported else None
                    print(news or f"no new messages for {now - last_message:.1f} s", flush=True)
                reported, next_report = received, now + args.every
            view = receive_slice(args, subscriber, end, quiet_until, next_report)
            if view is None:
                continue
            with view:
                sizes.append(len(view))
            last_message = time.monotonic()
            received += 1
            times.append(last_message)
            del times[: -args.window - 1], sizes[: -args.window]
    stats, text = describe(times, sizes, received)
    if stopped == "silence":
        text += "\n" + silence_note(silence, received, args.count)
    emit(args, dict(stats, final=True, stopped=stopped), text)
    return EXIT_FOUND if stopped == "silence" and args.count is not None else EXIT_OK


def cmd_hz(args) -> int:
    def describe(times, sizes, received):
        intervals = [b - a for a, b in zip(times, times[1:])]
        if not intervals:
            return {"messages": received, "rate_hz": None}, f"received {received} message(s): no rate yet"
        mean = statistics.fmean(intervals)
        stats = {
            "messages": received,
            "rate_hz": round(1 / mean, 3) if mean > 0 else None,
            "min_s": round(min(intervals), 6),
            "max_s": round(max(intervals), 6),
            "std_s": round(statistics.pstdev(intervals), 6),
            "window": len(intervals),
        }
        return stats, (
            f"average rate: {stats['rate_hz'] or 0:.3f}\n\tmin: {stats['min_s']:.6f}s max: {stats['max_s']:.6f}s "
            f"std dev: {stats['std_s']:.6f}s window: {stats['window']}"
        )

    return measure(args, describe)


def cmd_bw(args) -> int:
    def describe(times, sizes, received):
        if len(times) < 2:
            return {"messages": received, "bytes_per_s": None}, f"received {received} message(s): no bandwidth yet"
        span = times[-1] - times[0]
        counted_sizes = sizes[1:]  # bytes that arrived within the span
        stats = {
            "messages": received,
            "bytes_per_s": round(sum(counted_sizes) / span, 1) if span > 0 else None,
            "mean_size": round(statistics.fmean(sizes), 1),
            "min_size": min(sizes),
            "max_size": max(sizes),
            "window": len(sizes),
        }
        return stats, (
            f"average: {stats['bytes_per_s'] or 0:.1f} B/s\n\tmean: {stats['mean_size']:.1f} B "
            f"min: {stats['min_size']} B max: {stats['max_size']} B window: {stats['window']}"
        )

    return measure(args, describe)


def payload_of(args) -> bytes:
    if args.data.startswith("@"):
        try:
            with open(args.data[1:], "rb") as file:
                return file.read()
        except OSError as error:
            raise CommandError(f"cannot read {args.data[1:]}: {error.strerror}") from None
    if args.hex:
        try:
            return bytes.fromhex(args.data)
        except ValueError:
            raise CommandError(f"not hexadecimal: {args.data!r}") from None
    return args.data.encode("utf-8")


def config_of(args) -> Config:
    """The Config of the geometry options (--ring, --pool, ...); Config()'s
    defaults for those not given."""
    given = {
        "max_subscribers": args.max_subscribers, "sub_ring_capacity": args.ring, "pool_size": args.pool,
        "max_payload_size": args.payload, "commit_timeout": args.commit_timeout,
    }
    return Config(**{field: value for field, value in given.items() if value is not None})


def geometry_options_given(args) -> list[str]:
    return [f"--{option.replace('_', '-')}" for option in GEOMETRY_OPTIONS if getattr(args, option) is not None]


def publishing_region(args) -> SharedRegion:
    """The channel pub publishes into; with --create, made (as the geometry
    options say) if no object has its name. An existing one is used as it is."""
    name = channel_name(args)
    shm.check_name(name)
    if not args.create:
        if geometry_options_given(args):
            raise CommandError(f"{', '.join(geometry_options_given(args))}: only with --create (they shape a channel pub creates)")
        if shm.object_size(name) is None:
            raise CommandError(f"no such region: {name} (pub --create creates it)")
    elif shm.object_size(name) is None:
        channel_type = ChannelType.Broadcast if args.broadcast is not None else ChannelType.PubSub
        return SharedRegion.create_or_open(name, channel_type, config_of(args), args.creator, mode=args.mode)
    return open_writable(name)


def cmd_pub(args) -> int:
    stop = stop_on_signals()
    region = publishing_region(args)
    payload = payload_of(args)
    if len(payload) > region.geometry.slot_data_size:
        raise CommandError(f"{len(payload)} bytes exceed max_payload_size {region.geometry.slot_data_size} of {region.name}")
    publisher = kickmsg.Publisher(region, name="kickmsg-pub")  # its record names it
    published = 0
    began = time.monotonic()
    while published < args.count and not stop.is_set():
        if args.rate is not None and stop.wait(max(0.0, began + published / args.rate - time.monotonic())):
            break
        if not send_retrying(publisher, payload, 1.0):
            raise CommandError(
                f"slot pool of {region.name} stayed empty for 1 s "
                f"(after {published} of {args.count} message(s) published)"
            )
        published += 1
    data = {"name": region.name, "published": published, "size": len(payload), "dropped": publisher.dropped}
    emit(args, data, f"published {published} message(s) of {len(payload)} bytes to {region.name}")
    return EXIT_OK


def cmd_schema(args) -> int:
    region = inspect(channel_name(args))
    info = region.schema()
    data = {"name": region.name, "schema": schema_dict(info)}
    if info is None:
        text = f"{region.name}: no schema descriptor"
    else:
        record_type = typed.RecordType.from_schema(info)
        text = "\n".join(f"{key:<14} {value}" for key, value in schema_dict(info).items())
        if record_type is not None:
            data["record_dtype"] = str(record_type.dtype)
            text += f"\n{'record dtype':<14} {record_type.dtype}"
    emit(args, data, text)
    return EXIT_OK


def cmd_schema_diff(args) -> int:
    names = [a if a.startswith("/") else "/" + a for a in (args.a, args.b)]
    schemas = [inspect(name).schema() for name in names]
    if None in schemas:
        missing = [name for name, info in zip(names, schemas) if info is None]
        data = {"equal": schemas[0] is schemas[1], "differences": [], "without_schema": missing}
        emit(args, data, f"no schema descriptor on {', '.join(missing)}")
        return EXIT_OK if data["equal"] else EXIT_FOUND
    found = diff(*schemas)
    names_of = [flag.name for flag in Diff if flag and flag in found]
    emit(args, {"equal": not names_of, "differences": names_of}, "equal" if not names_of else "differ: " + ", ".join(names_of))
    return EXIT_OK if not names_of else EXIT_FOUND


def cmd_diagnose(args) -> int:
    region = inspect(channel_name(args))
    report = region.diagnose()
    data = {
        "locked_entries": report.locked_entries,
        "retired_rings": report.retired_rings,
        "draining_rings": report.draining_rings,
        "live_rings": report.live_rings,
        "schema_stuck": report.schema_stuck,
        "dead_subscriber_rings": report.dead_subscriber_rings,
        "pool_too_small": report.pool_too_small,
    }
    width = max(map(len, data))
    lines = [f"{key:<{width}} {value}" for key, value in data.items()]
    lines += [f"ring {ring}: its subscriber (pid {pid}) died; kickmsg repair reclaims it" for ring, pid in region.dead_subscriber_rings()]
    lines += [f"warning: {hazard}" for hazard in region.geometry.hazards()]
    emit(args, dict(data, healthy=report.healthy), "\n".join(lines))
    return EXIT_OK if report.healthy else EXIT_FOUND


def cmd_audit(args) -> int:
    report = audit(inspect(channel_name(args)))
    data = {
        "verdict": report.verdict,
        "clean": report.clean,
        "pool_size": report.pool_size,
        "free_slots": report.free_slots,
        "free_stack_problems": report.free_stack_problems,
        "being_written": report.being_written,
        "leaked_slots": report.leaked_slots,
        "under_referenced_slots": report.under_referenced_slots,
        "double_free_candidates": report.double_free_candidates,
        "schema_state": report.schema_state,
        "hazards": report.hazards,
        "rings": [vars(ring) for ring in report.rings],
    }
    problems = ("free_stack_problems", "leaked_slots", "under_referenced_slots", "double_free_candidates")
    details = [f"  {key}: {data[key]}" for key in problems if data[key]]
    details += [f"  being_written: {report.being_written}"] if report.being_written else []
    for ring in report.rings:
        for what in ("locked_entries", "stale_entries", "bad_entries"):
            if getattr(ring, what):
                details.append(f"  ring {ring.index} {what}: {getattr(ring, what)}")
        if ring.owner_dead:
            details.append(f"  ring {ring.index} is held by dead subscriber {ring.owner_pid} (kickmsg repair reclaims it)")
    details += [f"  {hazard}" for hazard in report.hazards]
    emit(args, data, "\n".join([report.verdict] + details))
    return EXIT_OK if report.clean else EXIT_FOUND


def confirm(args, question: str) -> None:
    if args.yes:
        return
    if not sys.stdin.isatty():
        raise CommandError(f"{question} — refusing without --yes (stdin is not a terminal)")
    if input(f"{question} Continue? [y/N] ").strip().lower() not in ("y", "yes"):
        raise CommandError("cancelled")


def cmd_repair(args: argparse.Namespace) -> int:
    chosen = [args.locked, args.retired, args.orphans, args.dead_subscribers]
    if not any(chosen):
        args.locked = args.dead_subscribers = True  # the repairs that are safe under traffic
    region = open_writable(channel_name(args))
    if args.retired:
        confirm(args, "--retired resets rings left by a crashed publisher: only safe once it is known to be gone.")
    if args.orphans:
        confirm(args, "--orphans reclaims unreferenced slots: only safe with every publisher paused and no view alive.")
    done: dict[str, Any] = {}
    lines: list[str] = []
    if args.dead_subscribers:
        report = region.reclaim_dead_subscribers()
        done["dead_subscribers"] = {"reclaimed": report.reclaimed, "unrecorded": report.unrecorded, "timed_out": report.timed_out}
        lines += dead_subscriber_sentences(report)
        done["dead_publishers_reclaimed"] = owners.reclaim_dead_publishers(region.name)
        lines += [f"reclaimed the record of dead publisher {pid}" for pid in done["dead_publishers_reclaimed"]]
    if args.locked:
        done["locked_entries_repaired"] = region.repair_locked_entries()
        lines.append(f"repaired {counted(done['locked_entries_repaired'], 'locked entry', 'locked entries')}")
    if args.retired:
        done["retired_rings_reset"] = region.reset_retired_rings(drain=True)
        lines.append(f"reset {counted(done['retired_rings_reset'], 'retired ring', 'retired rings')}")
    if args.orphans:
        done["orphaned_slots_reclaimed"] = region.reclaim_orphaned_slots()
        lines.append(f"reclaimed {counted(done['orphaned_slots_reclaimed'], 'orphaned slot', 'orphaned slots')}")
    emit(args, dict(done, name=region.name), "\n".join(lines))
    return EXIT_OK


def dead_subscriber_sentences(report) -> list[str]:
    """What reclaim_dead_subscribers() did, one sentence per ring or group."""
    lines = [f"reclaimed ring {ring} of dead subscriber {pid}" for ring, pid in report.reclaimed]
    lines += [
        f"could not reclaim ring {ring} of a dead subscriber: publishers stayed in flight, so it is left retired "
        f"(kickmsg repair --retired resets it)"
        for ring in report.timed_out
    ]
    if not lines:
        lines.append("no ring is held by a dead subscriber")
    if report.unrecorded:
        rings = ", ".join(map(str, report.unrecorded))
        lines.append(
            f"left ring {rings} alone: held by a subscriber that records no owner (native?)" if len(report.unrecorded) == 1
            else f"left rings {rings} alone: held by subscribers that record no owner (native?)"
        )
    return lines


def cmd_record(args) -> int:
    record = import_extra("kickmsg.record")
    stop = stop_on_signals()
    names = [shm_name(name) for name in args.names]

    def tell_rejoin(name, subscriber):  # from that channel's thread; the rows so far carry its earlier losses
        tell_rejoined("record", name, subscriber.lost - recorder.summary.channels[name].lost)

    try:
        recorder = record.Recorder(names, args.out, rotate_mb=args.rotate_mb, payload=not args.no_payload, on_rejoin=tell_rejoin)
    except shm.RegionNotFoundError as error:
        raise CommandError(str(error)) from None
    if not args.json:
        print(f"recording {', '.join(names)} into {args.out} (Ctrl-C stops)", flush=True)
    summary = recorder.run(duration=args.duration, stop=stop)
    channels = {name: vars(counts) for name, counts in summary.channels.items()}
    data = {"recording": summary.recording, "files": summary.files, "channels": channels}
    lines = [f"{name}: {c['messages']} messages, {c['bytes']} bytes, lost {c['lost']}" for name, c in channels.items()]
    emit(args, data, "\n".join(lines + [f"files: {', '.join(summary.files) or 'none'}"]))
    return EXIT_OK


def cmd_play(args) -> int:
    record = import_extra("kickmsg.record")
    stop = stop_on_signals()
    summary = record.play(args.path, rate=args.rate, loop=args.loop, stop=stop)
    data = {"messages": summary.messages, "dropped": summary.dropped, "channels": sorted(summary.channels)}
    emit(args, data, f"played {summary.messages} messages into {', '.join(sorted(summary.channels))}"
         + (f" ({summary.dropped} dropped: the pool stayed full)" if summary.dropped else ""))
    return EXIT_OK


def cmd_analyze(args) -> int:
    for path in args.paths:
        check_recording_path(path)
    analysis = import_extra("kickmsg.spark.analysis")
    if args.html_path:
        import_extra("matplotlib")
    errors = import_extra("pyspark.errors")
    try:
        result = analysis.run(args.paths, master=args.master, json_path=args.json_path, html_path=args.html_path)
    except errors.PySparkException as error:
        raise CommandError(str(error).strip().splitlines()[0]) from None
    print(analysis.format_table(result))
    if args.html_path:
        print(f"report: {os.path.abspath(args.html_path)}")
    return EXIT_OK


def check_recording_path(path: str) -> None:
    """Refuse, before Spark starts, a local path that holds no recording: a
    missing path, a directory without *.parquet files, a file without the
    Parquet magic, a glob that matches nothing. URIs (hdfs://, s3a://) are
    Spark's to resolve."""
    if URI_SCHEME.match(path):
        return
    if any(character in path for character in GLOB_CHARACTERS):
        if not glob.glob(path):
            raise CommandError(f"nothing matches {path}")
        return
    if os.path.isdir(path):
        files = [os.path.join(top, name) for top, _, names in os.walk(path) for name in names if name.endswith(".parquet")]
        if not files:
            raise CommandError(f"no .parquet files in {path}")
    elif os.path.exists(path):
        files = [path]
    else:
        raise CommandError(f"no such file or directory: {path}")
    for file in files:
        if not is_parquet(file):
            raise CommandError(f"not a Parquet file: {file} (no {PARQUET_MAGIC.decode()} magic at its start and end)")


def is_parquet(path: str) -> bool:
    """Whether the file starts and ends with the Parquet magic."""
    with open(path, "rb") as file:
        head = file.read(4)
        if file.seek(0, os.SEEK_END) < 8:
            return False
        file.seek(-4, os.SEEK_END)
        return head == PARQUET_MAGIC and file.read(4) == PARQUET_MAGIC


def mapped_by_any_process(paths: set[str]) -> tuple[set[str], int]:
    """Which of ``paths`` some process maps, and how many processes could
    not be checked (their /proc/PID/maps is not readable)."""
    mapped, unchecked = set(), 0
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            with open(f"/proc/{entry.name}/maps", encoding="utf-8", errors="replace") as maps:
                for line in maps:
                    path = line.rstrip("\n").split(maxsplit=5)[-1].removesuffix(" (deleted)")
                    if path in paths:
                        mapped.add(path)
        except (FileNotFoundError, ProcessLookupError):
            continue
        except PermissionError:
            unchecked += 1
    return mapped, unchecked


def cmd_clean(args) -> int:
    """Remove regions whose creator is dead and that no process maps any
    more, and sidecars whose region is gone."""
    candidates, orphan_sidecars = {}, []
    for entry in shm_objects(args.prefix):
        if is_sidecar(entry):
            if is_orphan_sidecar(entry):
                orphan_sidecars.append("/" + entry.name)
            continue
        try:
            found = read_magic_and_version(entry.path)
            if not is_kickmsg(found) or found[1] != layout.VERSION:
                continue
            with open(entry.path, "rb") as file:
                header = layout.Header.from_buffer_copy(file.read(layout.HEADER_SIZE).ljust(layout.HEADER_SIZE, b"\0"))
        except OSError:  # unreadable, or removed meanwhile: not ours to judge
            continue
        if not pid_alive(header.creator_pid):
            candidates[entry.path] = "/" + entry.name
    in_use, unchecked = mapped_by_any_process(set(candidates))
    removed = [candidates[path] for path in sorted(candidates) if path not in in_use]
    if not args.dry_run:
        for name in removed:
            kickmsg.unlink_shm(name)
        for name in orphan_sidecars:
            os.unlink(shm.SHM_DIRECTORY + name)
    verb = "would remove" if args.dry_run else "removed"
    lines = [f"{verb} {name}" for name in removed + orphan_sidecars] or ["nothing to clean"]
    if unchecked:
        lines.append(f"({unchecked} process{'' if unchecked == 1 else 'es'} could not be checked for mappings)")
    data = {"dry_run": args.dry_run, "removed": removed, "sidecars": orphan_sidecars, "unchecked_processes": unchecked}
    emit(args, data, "\n".join(lines))
    return EXIT_OK


def cmd_create(args) -> int:
    name = channel_name(args)
    shm.check_name(name)
    existed = shm.object_size(name) is not None
    if existed and not args.replace:
        raise CommandError(f"{name} already exists (--replace would replace it)")
    channel_type = ChannelType.Broadcast if args.broadcast_type else ChannelType.PubSub
    make = SharedRegion.create if args.replace else SharedRegion.create_or_open  # the latter never replaces
    region = make(name, channel_type, config_of(args), args.creator, mode=args.mode)
    if region.header.creator_pid != os.getpid():
        raise CommandError(f"{name} already exists (--replace would replace it)")  # made by another process meanwhile
    data = dict(
        {"name": name}, **geometry_fields(region), total_size=region.geometry.total_size,
        mode=f"{region.mapping.mode:04o}", creator=args.creator, replaced=existed,
    )
    lines = [f"{'replaced' if existed else 'created'} {name}"] + [f"{key:<18} {value}" for key, value in data.items()
                                                                  if key not in ("name", "replaced")]
    emit(args, data, "\n".join(lines))
    return EXIT_OK


def cmd_rm(args) -> int:
    removed, errors = [], {}
    for name in map(shm_name, args.names):
        try:
            remove_region(name, args.force)
        except (CommandError, ValueError, OSError) as error:
            errors[name] = str(error).splitlines()[0]
            print(f"kickmsg rm: error: {errors[name]}", file=sys.stderr, flush=True)
            continue
        removed.append(name)
        if not args.json:
            print(f"removed {name}", flush=True)
    if args.json:
        emit(args, {"removed": removed, "errors": errors}, "")
    return EXIT_ERROR if errors else EXIT_OK


def remove_region(name: str, force: bool) -> None:
    """Remove a region and its sidecar; refuse what is not a Kickmsg region
    unless ``force``."""
    shm.check_name(name)
    try:
        found = read_magic_and_version(shm.SHM_DIRECTORY + name)
    except FileNotFoundError:
        raise CommandError(f"no such region: {name}") from None
    except PermissionError:
        if not force:
            raise CommandError(f"permission denied: cannot read {name} to check it is a Kickmsg region (--force removes it anyway)") from None
        found = None
    if not is_kickmsg(found) and not force:
        raise CommandError(f"not a Kickmsg region: {name} (--force removes it anyway)")
    kickmsg.unlink_shm(name)


def cmd_exporter(args: argparse.Namespace) -> int:
    stop = stop_on_signals()
    exporter = import_module_of_extra("kickmsg.exporter", "metrics")

    def tell(url: str) -> None:
        print(f"serving {url} (channels {'/' + args.prefix.lstrip('/') + '*' if args.prefix else 'all'}, "
              f"every {args.interval:g} s; Ctrl-C stops)", flush=True)

    exporter.serve(args.port, args.bind, args.prefix, args.interval, stop, on_ready=tell)
    return EXIT_OK


def cmd_crosscheck(args) -> int:
    from kickmsg import crosscheck

    try:
        if args.replay:
            operations = crosscheck.load_operations(args.replay)
            result = crosscheck.replay(args.other_python, operations, args.other_path)
        else:
            result = crosscheck.crosscheck(args.other_python, args.other_path, ops=args.ops, seed=args.seed)
    except crosscheck.SetupError as error:
        raise CommandError(str(error)) from None
    emit(args, result.to_dict(), result.report())
    return EXIT_OK if result.agreed else EXIT_FOUND


def cmd_verify(args) -> int:
    import dataclasses

    from kickmsg import verify

    for option in ("preemptions", "max_schedules", "runs", "stale", "budget"):
        if (getattr(args, option) or 0) < 0:
            raise CommandError(f"--{option.replace('_', '-')} must be 0 or more, not {getattr(args, option)}")
    preemptions = args.preemptions if args.preemptions is not None else (1 if args.orders else 2)
    mutant = verify.MUTANTS.get(args.mutant)
    model = args.memory_model or ("ra" if args.orders else mutant.model if mutant else "sc")  # memory orders: ra
    if args.orders and model != "ra":
        raise CommandError("--orders explores under --memory-model ra")
    if model == "sc" and args.stale:
        raise CommandError("--stale needs --memory-model ra")
    stale = args.stale if args.stale is not None else (2 if model == "ra" else 0)
    budget = args.budget if args.budget is not None else (2 if model == "ra" else None)
    if args.orders:
        from kickmsg.verify import orders

        began = time.monotonic()
        table = orders.check_orders(preemptions, stale, budget, progress=lambda row: print(
            f"{row.site.path}:{row.site.line} {row.site.operation} -> {row.weakened}: {row.result}", file=sys.stderr))
        bounds = f"at most {preemptions} preemption(s), {stale} stale read(s), {budget} in all"
        emit(args, {"bounds": bounds, "seconds": round(time.monotonic() - began), "rows": [r.to_dict() for r in table]},
             f"{orders.format_table(table)}\n{len(table)} rows in {time.monotonic() - began:.0f} s "
             f"(under ra, {bounds})")
        return EXIT_OK
    scenario = verify.MUTANT_SCENARIOS.get(args.mutant, verify.Scenario())
    changes = {field: getattr(args, field) for field in ("publishers", "messages", "subscribers", "capacity", "pool")}
    changes["repairer"] = True if args.repair_pass else None
    scenario = dataclasses.replace(scenario, **{k: v for k, v in changes.items() if v is not None})
    try:
        if args.seed is not None:
            report = verify.explore_random(scenario, args.mutant, runs=args.runs, seed=args.seed, memory_model=model,
                                           stale=stale)
        else:
            report = verify.explore(scenario, args.mutant, preemptions, max_schedules=args.max_schedules,
                                    memory_model=model, stale=stale, budget=budget)
    except ValueError as error:  # the region cannot be laid out (actors' errors are violations)
        raise CommandError(f"bad scenario: {error}") from None
    data = {
        "mutant": report.mutant, "scenario": dataclasses.asdict(scenario), "schedules": report.schedules,
        "exhaustive": report.complete, "seconds": round(report.seconds, 3), "violation": report.violation,
        "trace": report.trace, "memory_model": model, "preemptions": preemptions, "stale": stale,
        "budget": budget,
    }
    text = report.summary() if report.trace is None else f"{report.trace}\n{report.summary()}"
    emit(args, data, text)
    return EXIT_FOUND if report.violation else EXIT_OK


# -- the parser ------------------------------------------------------------------------


def positive_int(text: str) -> int:
    """An argparse type: an integer above 0."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not an integer: {text!r}") from None
    if value <= 0:
        raise argparse.ArgumentTypeError(f"must be greater than 0, not {text}")
    return value


def positive_number(text: str) -> float:
    """An argparse type: a finite number above 0 (seconds, a rate, megabytes)."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None
    if not (math.isfinite(value) and value > 0):
        raise argparse.ArgumentTypeError(f"must be a finite number greater than 0, not {text}")
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


def add_geometry_options(sub, creator: str) -> None:
    """The options of a new channel (create, pub --create); Config()'s defaults."""
    defaults = Config()
    sub.add_argument("--max-subscribers", type=positive_int, metavar="N",
                     help=f"rings, one per subscriber (default {defaults.max_subscribers})")
    sub.add_argument("--ring", type=positive_int, metavar="N",
                     help=f"sub_ring_capacity: messages each ring keeps, a power of 2 (default {defaults.sub_ring_capacity})")
    sub.add_argument("--pool", type=positive_int, metavar="N",
                     help=f"pool_size: message slots, more than --ring (default {defaults.pool_size})")
    sub.add_argument("--payload", type=positive_int, metavar="BYTES",
                     help=f"max_payload_size (default {defaults.max_payload_size})")
    sub.add_argument("--commit-timeout", type=float, metavar="S",
                     help=f"seconds a publisher waits on an entry a crashed one left locked "
                          f"(default {defaults.commit_timeout.total_seconds():g})")
    sub.add_argument("--creator", default=creator, metavar="NAME", help=f"creator name in the header (default {creator})")
    sub.add_argument("--mode", type=octal_mode, metavar="OCTAL",
                     help=f"permission bits of the new object (default ${shm.MODE_VARIABLE}, else 0600; the umask applies)")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="kickmsg",
        description="Inspect, watch, measure and repair Kickmsg shared-memory channels "
        "(regions of this package and of the native kickmsg 0.1.0).",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog="Run 'kickmsg COMMAND --help' for a command's options and examples.",
    )
    parser.add_argument(
        "--version", action="version",
        version=f"kickmsg {kickmsg.__version__} (pure Python; Kickmsg layout v{layout.VERSION}, as native kickmsg 0.1.0)",
    )
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    def command(name, function, summary, examples, channel=True, json_flag=True):
        sub = commands.add_parser(
            name, help=summary, description=summary, epilog="examples:\n" + examples,
            formatter_class=argparse.RawDescriptionHelpFormatter,
        )
        sub.set_defaults(run=function, naming=NODE_NAMING)
        if json_flag:
            sub.add_argument("--json", action="store_true", help="machine-readable output")
        if channel:
            sub.add_argument("name", nargs="?", help="shm name, e.g. /kickmsg_imu")
            sub.add_argument("--topic", help="PubSub topic (Node naming: /{prefix}_{topic})")
            sub.add_argument("--broadcast", metavar="CH", help="broadcast channel (/{prefix}_broadcast_{CH})")
            sub.add_argument("--mailbox", nargs=2, metavar=("OWNER", "TAG"), help="mailbox (/{prefix}_{OWNER}_mbx_{TAG})")
            sub.add_argument("--prefix", default="kickmsg", help="Node prefix (default: kickmsg)")
        return sub

    sub = command("list", cmd_list, "list the Kickmsg regions in /dev/shm",
                  "  kickmsg list\n  kickmsg list --prefix kickmsg -o name,subs,pool\n  kickmsg list --json\n"
                  "  kickmsg list --all          # also orphan sidecars and objects of other programs", channel=False)
    sub.add_argument("--prefix", help="only names starting with /PREFIX")
    sub.add_argument("-o", dest="columns", metavar="COLUMNS", help=f"comma-separated columns of {','.join(LIST_COLUMNS)}")
    sub.add_argument("--all", action="store_true", help="also list orphan sidecars and objects that are not Kickmsg regions")

    command("info", cmd_info, "every header field, decoded", "  kickmsg info /kickmsg_imu\n  kickmsg info --topic imu --json")
    command("stats", cmd_stats, "rings (state, in-flight, write position, pending, losses) and pool use",
            "  kickmsg stats --topic imu")

    sub = command("watch", cmd_watch, "a live view: messages/s per ring, pool use, new losses (Ctrl-C stops)",
                  "  kickmsg watch --topic imu\n  kickmsg watch /kickmsg_imu --interval 0.5 --count 10 --json")
    sub.add_argument("--interval", type=positive_number, default=1.0, help="seconds between refreshes (default 1)")
    sub.add_argument("--count", type=positive_int, help="stop after this many refreshes")

    sub = command("echo", cmd_echo, "subscribe and print messages (typed channels print their fields)",
                  "  kickmsg echo --topic imu --count 5\n  kickmsg echo /kickmsg_imu --format hex\n"
                  "  kickmsg echo --topic imu --format raw > dump.bin")
    sub.add_argument("--count", type=positive_int, help="stop after this many messages")
    sub.add_argument("--format", choices=("text", "hex", "json", "raw"), default="text")
    sub.add_argument("--timeout", type=positive_number, metavar="S",
                     help="stop when nothing arrives for S seconds (exit 1 if --count was not reached; default: wait)")

    for name, function, summary in (
        ("hz", cmd_hz, "publish rate seen by a subscriber: mean, min/max/std of intervals"),
        ("bw", cmd_bw, "bandwidth seen by a subscriber: bytes/s and message sizes"),
    ):
        sub = command(name, function, summary, f"  kickmsg {name} --topic imu\n  kickmsg {name} /kickmsg_imu --count 100 --json")
        sub.add_argument("--window", type=positive_int, default=1000, help="messages kept for the statistics (default 1000)")
        sub.add_argument("--every", type=positive_number, default=1.0, help="seconds between reports (default 1)")
        sub.add_argument("--count", type=positive_int, help="stop after this many messages")
        sub.add_argument("--duration", type=positive_number, help="stop after this many seconds")
        sub.add_argument("--timeout", type=positive_number, metavar="S",
                         help=f"stop when nothing arrives for S seconds (default with --count: {DEFAULT_SILENCE_S:g}; "
                              f"exit 1 if --count was not reached)")

    sub = command("pub", cmd_pub, "publish from the shell: text, hex (--hex) or a file (@path)",
                  "  kickmsg pub --topic cmd 'hello'\n  kickmsg pub /kickmsg_cmd --hex 01ff --rate 10 --count 50\n"
                  "  kickmsg pub --topic blob @frame.bin\n  kickmsg pub /kickmsg_cmd 'hello' --create --pool 512")
    sub.add_argument("data", help="text, hex digits with --hex, or @path")
    sub.add_argument("--hex", action="store_true", help="DATA is hexadecimal")
    sub.add_argument("--rate", type=positive_number, help="messages per second (default: as fast as possible)")
    sub.add_argument("--count", type=positive_int, default=1, help="how many times to publish (default 1)")
    sub.add_argument("--create", action="store_true",
                     help="create the channel if it does not exist (a Broadcast one if named by --broadcast), "
                          "with the options below; an existing channel is used as it is")
    add_geometry_options(sub, creator="kickmsg-pub")

    sub = command("create", cmd_create, "create a channel (refuses an existing name unless --replace)",
                  "  kickmsg create /kickmsg_imu\n  kickmsg create --topic imu --ring 128 --pool 1024 --payload 256\n"
                  "  kickmsg create /kickmsg_chat --broadcast --mode 0660 --json", channel=False)
    sub.set_defaults(naming="NAME or --topic T", broadcast=None, mailbox=None)
    sub.add_argument("name", nargs="?", help="shm name, e.g. /kickmsg_imu")
    sub.add_argument("--topic", help="topic (Node naming: /{prefix}_{topic})")
    sub.add_argument("--prefix", default="kickmsg", help="Node prefix (default: kickmsg)")
    sub.add_argument("--broadcast", dest="broadcast_type", action="store_true",
                     help="a Broadcast channel (default: PubSub)")
    add_geometry_options(sub, creator="kickmsg-create")
    sub.add_argument("--replace", action="store_true", help="replace an existing object of that name")

    sub = command("rm", cmd_rm, "remove regions (and their owner sidecars)",
                  "  kickmsg rm /kickmsg_imu /kickmsg_camera\n  kickmsg rm /not_a_region --force", channel=False)
    sub.add_argument("names", nargs="+", metavar="NAME", help="shm names")
    sub.add_argument("--force", action="store_true", help="also remove objects that are not Kickmsg regions")

    command("schema", cmd_schema, "the channel's schema descriptor", "  kickmsg schema --topic imu")
    sub = command("schema-diff", cmd_schema_diff, "compare two channels' schema descriptors (exit 1 if they differ)",
                  "  kickmsg schema-diff /kickmsg_imu /kickmsg_imu_replay", channel=False)
    sub.add_argument("a")
    sub.add_argument("b")

    command("diagnose", cmd_diagnose, "health counts (read-only; exit 1 if damage is found)", "  kickmsg diagnose --topic imu")
    command("audit", cmd_audit, "check every invariant (read-only; exit 1 unless clean)", "  kickmsg audit /kickmsg_imu --json")

    sub = command("repair", cmd_repair, "repair a channel (without options: the repairs safe under traffic)",
                  "  kickmsg repair --topic imu\n  kickmsg repair --topic imu --retired --orphans --yes")
    sub.add_argument("--locked", action="store_true", help="commit entries left locked by crashed publishers (safe)")
    sub.add_argument("--dead-subscribers", action="store_true",
                     help="free rings of subscribers that died, and clear records of publishers that died (safe)")
    sub.add_argument("--retired", action="store_true", help="reset and drain rings left by crashed publishers (unsafe)")
    sub.add_argument("--orphans", action="store_true", help="reclaim unreferenced slots (needs quiescence)")
    sub.add_argument("--yes", action="store_true", help="do not ask for confirmation")

    sub = command("record", cmd_record, "record channels to Parquet files (SIGINT/SIGTERM/SIGHUP close them cleanly)",
                  "  kickmsg record /kickmsg_imu /kickmsg_camera --out rec/ --duration 60\n"
                  "  kickmsg record /kickmsg_camera --out rec/ --no-payload --rotate-mb 256", channel=False)
    sub.add_argument("names", nargs="+", metavar="NAME", help="shm names of the channels")
    sub.add_argument("--out", required=True, metavar="DIR", help="directory for the Parquet files")
    sub.add_argument("--duration", type=positive_number, help="stop after this many seconds")
    sub.add_argument("--rotate-mb", type=positive_number, default=64, help="start a new file past this size (default 64)")
    sub.add_argument("--no-payload", action="store_true", help="keep sizes and stamps, not the payloads")

    sub = command("play", cmd_play, "republish a recording with its original timing",
                  "  kickmsg play rec/\n  kickmsg play rec/ --rate 2 --loop", channel=False)
    sub.add_argument("path", metavar="DIR", help="a recording directory (or one .parquet file)")
    sub.add_argument("--rate", type=positive_number, default=1.0, help="speed factor (default 1: real time)")
    sub.add_argument("--loop", action="store_true", help="start over at the end, until interrupted")

    sub = command("analyze", cmd_analyze, "analyse recordings with Spark: rates, gaps, losses, sizes, latency",
                  "  kickmsg analyze rec/ --html report.html\n"
                  "  kickmsg analyze 'runs/*/' --master 'local[2]' --json out.json\n"
                  "on a cluster, the same module unchanged:\n"
                  "  spark-submit $(python -c 'import kickmsg.spark.analysis as a; print(a.__file__)') \\\n"
                  "      'hdfs:///recordings/*/*.parquet' --json out.json --html report.html",
                  channel=False, json_flag=False)
    sub.add_argument("paths", nargs="+", metavar="DIR_OR_GLOB", help="recording directories, files or globs")
    sub.add_argument("--master", default="local[*]", help="Spark master (default local[*])")
    sub.add_argument("--json", dest="json_path", metavar="FILE", help="write the figures as JSON")
    sub.add_argument("--html", dest="html_path", metavar="FILE", help="write an HTML report with plots")

    sub = command("clean", cmd_clean, "remove regions whose creator is dead and that no process maps",
                  "  kickmsg clean --dry-run\n  kickmsg clean --prefix kickmsg", channel=False)
    sub.add_argument("--dry-run", action="store_true", help="only list what would be removed")
    sub.add_argument("--prefix", help="only names starting with /PREFIX")

    sub = command("exporter", cmd_exporter, "serve Prometheus metrics of every channel on /metrics (read-only)",
                  "  kickmsg exporter\n  kickmsg exporter --port 9464 --bind 127.0.0.1 --prefix kickmsg --interval 5",
                  channel=False, json_flag=False)
    sub.add_argument("--port", type=port_number, default=9464, help="TCP port (default 9464; 0: any free port)")
    sub.add_argument("--bind", default="127.0.0.1", metavar="ADDRESS", help="address to listen on (default 127.0.0.1)")
    sub.add_argument("--prefix", help="only channels whose name starts with /PREFIX")
    sub.add_argument("--interval", type=positive_number, default=5.0, help="seconds between readings (default 5)")

    sub = command("crosscheck", cmd_crosscheck,
                  "run random operations on this package and another implementation, compare results and region "
                  "bytes (exit 1 at the first divergence, printing a sequence that reproduces it)",
                  "  kickmsg crosscheck --other-python python3 --other-path .native/kickmsg-0.1.0\n"
                  "  kickmsg crosscheck --other-python /opt/py/bin/python --ops 5000 --seed 7 --json\n"
                  "  kickmsg crosscheck --other-python python3 --other-path .native/kickmsg-0.1.0 --replay repro.jsonl",
                  channel=False)
    sub.add_argument("--other-python", required=True, metavar="PY", help="interpreter of the other implementation")
    sub.add_argument("--other-path", metavar="DIR", help="put DIR (or DIR:DIR...) first on its sys.path, run it with "
                     "-I -S (default: -I and its own kickmsg)")
    sub.add_argument("--ops", type=int, default=1000, help="number of random operations (default 1000)")
    sub.add_argument("--seed", type=int, default=0, help="seed of the random sequence (default 0)")
    sub.add_argument("--replay", metavar="FILE", help="run the operations in FILE (one JSON list per line) instead")

    sub = command("verify", cmd_verify,
                  "run the package's publish, receive, join and leave code under a controlled scheduler, checking "
                  "the protocol's invariants after every atomic step (exit 1 at a violation, printing the trace)",
                  "  kickmsg verify                                  # every schedule with <= 2 preemptions\n"
                  "  kickmsg verify --mutant release-before-lock     # break a rule of the spec: a trace is printed\n"
                  "  kickmsg verify --seed 7 --runs 5000             # seeded random schedules instead\n"
                  "  kickmsg verify --publishers 3 --capacity 4 --preemptions 1\n"
                  "  kickmsg verify --repair-pass --preemptions 1        # a repair pass racing live traffic\n"
                  "  kickmsg verify --memory-model ra                # C11 release/acquire: <= 2 preemptions + stale reads\n"
                  "  kickmsg verify --mutant spec-seqlock-orders     # the spec's seqlock orders: a stale re-check (ra)\n"
                  "  kickmsg verify --mutant commit-relaxed          # a memory-order mutant (explored under ra)\n"
                  "  kickmsg verify --orders                         # weaken each order one step: which are needed?",
                  channel=False)
    from kickmsg.verify.mutants import MUTANTS

    sub.add_argument("--mutant", choices=sorted(MUTANTS), help="break one rule of the spec (default: none)")
    sub.add_argument("--preemptions", type=int, metavar="K",
                     help="explore every schedule with at most K preemptions (default 2; 1 with --orders)")
    sub.add_argument("--memory-model", choices=("sc", "ra"),
                     help="sc: sequential consistency; ra: the C11 release/acquire/relaxed model, with data races "
                          "on payloads (default: sc, or ra for a memory-order mutant)")
    sub.add_argument("--stale", type=int, metavar="W",
                     help="under ra, at most W loads per schedule read an older store than the newest (default 2)")
    sub.add_argument("--budget", type=int, metavar="B",
                     help="at most B preemptions and stale reads together (default: 2 under ra, no limit under sc)")
    sub.add_argument("--orders", action="store_true",
                     help="weaken every memory order of the flows one step in turn and explore under ra (at most "
                          "1 preemption); print which orders a counter-example shows necessary")
    sub.add_argument("--max-schedules", type=int, default=1_000_000, metavar="N",
                     help="stop an exhaustive exploration after N schedules (default 1000000)")
    sub.add_argument("--seed", type=int, help="run seeded random schedules instead of the exhaustive exploration")
    sub.add_argument("--runs", type=int, default=1000, help="random schedules to run with --seed (default 1000)")
    for field, meaning in (("publishers", "publishers"), ("messages", "messages per publisher"),
                          ("subscribers", "subscribers (each with its own ring)"), ("capacity", "ring capacity"),
                          ("pool", "pool slots")):
        sub.add_argument(f"--{field}", type=int, metavar="N", help=f"{meaning} (default: the mutant's scenario)")
    sub.add_argument("--repair-pass", action="store_true",
                     help="add an actor that runs repair_locked_entries() once, concurrently")
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    with warnings.catch_warnings():
        print_warnings_on_one_line(args.command)
        try:
            status = args.run(args)
            sys.stdout.flush()  # here, where a closed pipe is handled below
            return status
        except BrokenPipeError:  # the reader went away (e.g. `| head`): end quietly, as a Unix filter does
            discard_stdout()
            return EXIT_OK
        except CommandError as error:
            print(f"kickmsg {args.command}: error: {error}", file=sys.stderr)
            return EXIT_ERROR
        except (RuntimeError, ValueError, OSError) as error:
            print(f"kickmsg {args.command}: error: {str(error).splitlines()[0] if str(error) else type(error).__name__}", file=sys.stderr)
            return EXIT_ERROR
        except KeyboardInterrupt:
            discard_stdout()
            return EXIT_FORCED
