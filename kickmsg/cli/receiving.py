"""Commands that subscribe while they run: echo, hz, bw."""
import argparse
import statistics
import sys
import time
from collections.abc import Callable
from typing import Any

import numpy

import kickmsg
from kickmsg import jsontext, typed
from kickmsg.region import SharedRegion
from kickmsg.subscriber import SampleView
from kickmsg.terminal import printable
from kickmsg.cli.common import (
    EXIT_FOUND,
    EXIT_OK,
    CommandError,
    Commands,
    add_command,
    channel_name,
    counted,
    emit,
    open_writable,
    positive_int,
    positive_number,
    stop_on_signals,
)

__all__ = [
    "BINARY_FORMATS", "DEFAULT_SILENCE_S", "Describe", "FRAME_LENGTH_BYTES", "RECEIVE_SLICE_S", "add_commands", "cmd_bw",
    "cmd_echo", "cmd_hz", "decode_records", "format_message", "measure", "receive_slice", "silence_note", "subscribed",
    "tell_rejoined",
]

RECEIVE_SLICE_S = 0.1  # a receive waits at most this long, so that a stop signal is seen soon
# hz/bw's report of the last messages: (times, sizes, received) -> (figures, text)
Describe = Callable[[list[float], list[int], int], tuple[dict[str, Any], str]]
DEFAULT_SILENCE_S = 10.0  # hz/bw --count without --timeout give up after this long without a message
BINARY_FORMATS = ("raw", "frames")  # echo's payload bytes as they are; frames put each one's length first
FRAME_LENGTH_BYTES = 8  # echo --format frames: the payload's length, unsigned little-endian, then the payload


def add_commands(commands: Commands) -> None:
    """echo, hz, bw: their options and examples."""
    sub = add_command(commands, "echo", cmd_echo, "subscribe and print messages (typed channels print their fields)",
                      "  kickmsg echo --topic imu --count 5\n  kickmsg echo /kickmsg_imu --format hex\n"
                      "  kickmsg echo --topic imu --format raw --count 1 > frame.bin\n"
                      "  kickmsg echo --topic imu --format frames > dump.frames")
    sub.add_argument("--count", type=positive_int, help="stop after this many messages")
    sub.add_argument("--format", choices=("text", "hex", "json", "raw", "frames"), default="text",
                     help="text (control characters escaped), hex, json (one object a line), raw (the payloads' bytes "
                          "back to back: --count N takes N messages), frames (each payload after its length, 8 bytes "
                          "unsigned little-endian)")
    sub.add_argument("--timeout", type=positive_number, metavar="S",
                     help="stop when nothing arrives for S seconds (exit 1 if --count was not reached; default: wait)")

    for name, function, summary in (
        ("hz", cmd_hz, "publish rate seen by a subscriber: mean, min/max/std of intervals"),
        ("bw", cmd_bw, "bandwidth seen by a subscriber: bytes/s and message sizes"),
    ):
        sub = add_command(commands, name, function, summary,
                          f"  kickmsg {name} --topic imu\n  kickmsg {name} /kickmsg_imu --count 100 --json")
        sub.add_argument("--window", type=positive_int, default=1000, help="messages kept for the statistics (default 1000)")
        sub.add_argument("--every", type=positive_number, default=1.0, help="seconds between reports (default 1)")
        sub.add_argument("--count", type=positive_int, help="stop after this many messages")
        sub.add_argument("--duration", type=positive_number, help="stop after this many seconds")
        sub.add_argument("--timeout", type=positive_number, metavar="S",
                         help=f"stop when nothing arrives for S seconds (default with --count: {DEFAULT_SILENCE_S:g}; "
                              f"exit 1 if --count was not reached)")


def decode_records(data: bytes, record_type: typed.RecordType | None) -> numpy.ndarray | None:
    """A typed message's records; None if the channel is untyped or the
    length is not a whole number of records."""
    if record_type is None or len(data) % record_type.dtype.itemsize:
        return None
    return numpy.frombuffer(data, dtype=record_type.dtype)


def _json_value(value: object) -> str:
    """JSON for what numpy's tolist() gives that json does not know (bytes fields)."""
    if isinstance(value, bytes):
        return value.decode("utf-8", errors="backslashreplace")
    return str(value)


def _field_text(value: object) -> str:
    """A field as numpy prints it: the shortest text that reads back the same."""
    if isinstance(value, numpy.ndarray):
        return numpy.array2string(value, separator=", ", floatmode="unique")
    return str(value)


def format_message(data: bytes, ring_pos: int, records: numpy.ndarray | None, fmt: str) -> str:
    """One line of ``echo`` output; typed records print their fields."""
    names = records.dtype.names if records is not None else None
    if fmt == "json":
        entry: dict[str, object] = {"ring_pos": ring_pos, "size": len(data)}
        if records is not None:
            entry["fields"] = [{n: r[n].tolist() for n in names} if names else r.tolist() for r in records]
        else:
            entry["text"] = data.decode("utf-8", errors="backslashreplace")
            entry["hex"] = data.hex()
        return jsontext.dumps(entry, default=_json_value)
    if fmt == "hex":
        return f"[{ring_pos}] {data.hex()}"
    if records is not None:
        shown = (" ".join(f"{n}={_field_text(r[n])}" for n in names) if names else _field_text(r) for r in records)
        return f"[{ring_pos}] " + printable("; ".join(shown))
    return f"[{ring_pos}] {printable(data.decode('utf-8', errors='backslashreplace'))}"


def subscribed(args: argparse.Namespace) -> tuple[SharedRegion, kickmsg.Subscriber]:
    """A subscriber on the named channel (joins a ring while the command runs)."""
    region = open_writable(channel_name(args))
    try:
        return region, kickmsg.Subscriber(region)
    except RuntimeError as error:
        raise CommandError(str(error).splitlines()[0]) from None


def receive_slice(args: argparse.Namespace, subscriber: kickmsg.Subscriber, *deadlines: float | None) -> SampleView | None:
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
    print(f"kickmsg {command}: {printable(name)} was re-created; following it ({counted(lost, 'message', 'messages')} lost: "
          "unread, or published before it rejoined)",
          file=sys.stderr, flush=True)


def silence_note(seconds: float, received: int, count: int | None) -> str:
    """Why a receiving command stopped on its silence timeout."""
    arrived = "" if count is None else f" ({received} of {count} messages arrived)"
    return f"stopped: no message for {seconds:g} s{arrived}"


def cmd_echo(args: argparse.Namespace) -> int:
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
            if args.format in BINARY_FORMATS:
                if args.format == "frames":
                    sys.stdout.buffer.write(len(data).to_bytes(FRAME_LENGTH_BYTES, "little"))
                sys.stdout.buffer.write(data)
                sys.stdout.buffer.flush()
            else:
                records = decode_records(data, record_type)
                print(format_message(data, ring_pos, records, "json" if args.json else args.format), flush=True)
            printed += 1
    if subscriber.lost and not args.json and args.format not in BINARY_FORMATS:
        print(f"(lost {subscriber.lost} messages)", file=sys.stderr)
    if silent and args.count is not None:
        print(f"kickmsg echo: {silence_note(args.timeout, printed, args.count)}", file=sys.stderr)
        return EXIT_FOUND
    return EXIT_OK


def measure(args: argparse.Namespace, describe: Describe) -> int:
    """Receive for hz/bw until --count, --duration, a stop signal, or
    silence (--timeout; DEFAULT_SILENCE_S with --count). Every --every
    seconds print ``describe(times, sizes, received)`` of the last --window
    messages, or how long nothing has arrived; then a final report. With
    --json each report is one JSON line (``final`` false, ``new_messages``
    since the last report, ``silent_s`` since the last message), the final
    one ``final`` true with why it ``stopped``. Exit status 1 if silence
    ended it before --count messages arrived."""
    stop = stop_on_signals()
    args.json_lines = True
    _, subscriber = subscribed(args)
    silence = args.timeout if args.timeout is not None else DEFAULT_SILENCE_S if args.count is not None else None
    times: list[float] = []  # the arrival times of the last --window messages
    sizes: list[int] = []  # and their sizes
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
                figures, text = describe(times, sizes, received)
                silent_s = round(now - last_message, 1)
                emit(args, dict(figures, final=False, new_messages=received - reported, silent_s=silent_s),
                     text if received > reported else f"no new messages for {silent_s:.1f} s")
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
    if stopped == "silence" and silence is not None:
        text += "\n" + silence_note(silence, received, args.count)
    emit(args, dict(stats, final=True, stopped=stopped), text)
    return EXIT_FOUND if stopped == "silence" and args.count is not None else EXIT_OK


def cmd_hz(args: argparse.Namespace) -> int:
    def describe(times: list[float], sizes: list[int], received: int) -> tuple[dict[str, Any], str]:
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


def cmd_bw(args: argparse.Namespace) -> int:
    def describe(times: list[float], sizes: list[int], received: int) -> tuple[dict[str, Any], str]:
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
