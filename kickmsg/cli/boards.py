"""The commands of 0.9.2's two non-channel region types (WIRE9.md C, D):
``registry`` (a namespace's participants, by topic), ``blackboard``/``bb``
(a board's keys) and ``bbwatch`` (a board's changes as they happen).

They work on regions of this package and of the native kickmsg 0.9.2. The
namespace is ``-n NS`` (or ``registry NS``), else ``$KICKMSG_NAMESPACE``,
else "kickmsg" (as 0.9.2's tools). An absent registry or board is exit
status 1 (as 0.9.2's ``bb``); only ``--sweep`` writes (it frees the rows or
keys of dead processes), though reading a board's key list takes its lock
for a moment.
"""
import argparse
import base64
import os
import sys
from typing import Any

from kickmsg import jsontext, shm
from kickmsg.cli.common import (
    EXIT_FOUND,
    EXIT_OK,
    CommandError,
    Commands,
    add_command,
    counted,
    emit,
    positive_int,
    stop_on_signals,
    table,
)
from kickmsg.ops import diagnostics
from kickmsg.protocol.v9.blackboard import Blackboard
from kickmsg.protocol.v9.registry import Registry
from kickmsg.terminal import printable

__all__ = [
    "DEFAULT_NAMESPACE", "PREVIEW_BYTES", "WATCH_SLICE_S", "absent", "add_commands", "add_namespace_option",
    "board_text", "cmd_bbwatch", "cmd_blackboard", "cmd_registry", "namespace_of", "open_board", "people",
    "registry_text", "topic_table",
]

DEFAULT_NAMESPACE = "kickmsg"
WATCH_SLICE_S = 0.5  # bbwatch's longest sleep between checks for a stop signal
PREVIEW_BYTES = 48  # of a value, in bbwatch's text output


def add_namespace_option(sub: argparse.ArgumentParser) -> None:
    sub.add_argument("-n", "--namespace", default=None,
                     help=f"namespace (default: $KICKMSG_NAMESPACE, else {DEFAULT_NAMESPACE})")


def namespace_of(args: argparse.Namespace) -> str:
    """``registry NS``, ``bb NAME NS`` or ``-n NS`` (not both; an empty one is refused as a
    name, not replaced), else the environment's, else the default."""
    positional = getattr(args, "ns", None)
    if positional is not None and args.namespace is not None:
        raise CommandError(f"give the namespace once: {positional!r} and -n {args.namespace!r}")
    given = positional if positional is not None else args.namespace
    return given if given is not None else os.environ.get("KICKMSG_NAMESPACE") or DEFAULT_NAMESPACE


def absent(args: argparse.Namespace, what: str) -> int:
    """An absent registry or board: one line on stderr, exit status 1."""
    print(f"kickmsg {args.command}: {what}", file=sys.stderr)
    return EXIT_FOUND


# -- registry ----------------------------------------------------------------------------


def cmd_registry(args: argparse.Namespace) -> int:
    """The namespace's topics with their producers and consumers (stalled:
    the process is gone); ``--sweep`` first frees the rows of dead processes."""
    namespace = namespace_of(args)
    registry = Registry.try_open(namespace)
    if registry is None:
        return absent(args, f"no participant registry for namespace {namespace!r}")
    swept = registry.sweep_stale() if args.sweep else None
    found = diagnostics.registry_info(registry)
    emit(args, dict(diagnostics.to_json(found), swept=swept), registry_text(found, swept))
    return EXIT_OK


def registry_text(found: diagnostics.RegistryInfo, swept: int | None = None) -> str:
    """A registry's heading and its topics (``registry``, ``info``)."""
    lines = [f"{printable(found.name)}: {counted(len(found.topics), 'topic', 'topics')}, "
             f"{counted(found.participants, 'participant', 'participants')} ({found.stalled} stalled)"
             + (f", {counted(swept, 'stale row', 'stale rows')} swept" if swept is not None else "")]
    if found.topics:
        lines.append(topic_table(found.topics))
    return "\n".join(lines)


def people(participants: list[diagnostics.RegistryParticipant]) -> str | None:
    """``node[pid]``, then ``Both`` for a row that publishes and subscribes,
    ``stalled`` for one whose process is gone; None for nobody."""
    return ", ".join(f"{p.node_name}[{p.pid}]" + (" Both" if p.role == "Both" else "") + (" stalled" if p.stalled else "")
                     for p in participants) or None


def topic_table(topics: list[diagnostics.RegistryTopic], regions: dict[str, str] | None = None) -> str:
    """A registry's topics as a table; with ``regions`` (shm name to what
    the region is), a REGION column."""
    columns = ["topic", "kind", "shm_name", *(["region"] if regions is not None else []), "producers", "consumers"]
    rows = [{"topic": t.topic, "kind": t.kind, "shm_name": t.shm_name, "region": (regions or {}).get(t.shm_name),
             "producers": people(t.producers), "consumers": people(t.consumers)} for t in topics]
    return table(rows, columns)


# -- blackboard ----------------------------------------------------------------------------


def open_board(args: argparse.Namespace) -> Blackboard | None:
    return Blackboard.try_open(namespace_of(args), args.board)


def cmd_blackboard(args: argparse.Namespace) -> int:
    """A board's keys: size, updates, age, owner, live or dead."""
    board = open_board(args)
    if board is None:
        return absent(args, f"no blackboard {Blackboard.shm_name(namespace_of(args), args.board)}")
    swept = board.sweep_stale() if args.sweep else None
    found = diagnostics.board_info(board)
    emit(args, dict(diagnostics.to_json(found), swept=swept), board_text(found, swept))
    return EXIT_OK


def board_text(found: diagnostics.BoardInfo, swept: int | None = None) -> str:
    """A board's heading and its keys (``blackboard``, ``info``)."""
    lines = [f"{printable(found.name)}: capacity {found.capacity}, max value {found.max_value_size} bytes, "
             f"{counted(len(found.keys), 'key', 'keys')}"
             + (f", {counted(swept, 'stale key', 'stale keys')} swept" if swept is not None else "")]
    if found.keys:
        rows = [dict(vars(key), age=None if key.age_s is None else f"{key.age_s:.3f}s") for key in found.keys]
        lines.append(table(rows, ("key", "size", "updates", "age", "owner", "pid", "state")))
    return "\n".join(lines)


# -- bbwatch ---------------------------------------------------------------------------------


def cmd_bbwatch(args: argparse.Namespace) -> int:
    """Print the board's keys, then every change (a new value, a new owner,
    a key gone) as it happens, until stopped or ``--count`` events. A board
    re-created under the name is followed (said on stderr); one removed
    ends it (exit status 2)."""
    board = open_board(args)
    if board is None:
        return absent(args, f"no blackboard {Blackboard.shm_name(namespace_of(args), args.board)}")
    stop = stop_on_signals()
    known: dict[str, tuple[int, int]] = {}  # key -> (update count, owner pid) last reported
    printed = 0
    while not stop.is_set():
        board = _same_board(args, board)
        seen = board.change_seq
        for event in _changes(board, known):
            print(_event_text(event) if not args.json else _event_json(event), flush=True)
            printed += 1
            if args.count is not None and printed >= args.count:
                return EXIT_OK
        board.wait(seen, WATCH_SLICE_S)  # a change, or a slice gone: look again (and at the stop signal)
    return EXIT_OK


def _same_board(args: argparse.Namespace, board: Blackboard) -> Blackboard:
    """The board under its name now: this one, or the one re-created under
    it (the events go on from what was last reported); none is an error."""
    present = shm.object_size(board.name) is not None
    if present and not board.mapping.is_replaced():
        return board
    again = open_board(args) if present else None
    if again is None:
        raise CommandError(f"{board.name} was removed")
    print(f"kickmsg {args.command}: {printable(board.name)} was re-created; following it", file=sys.stderr, flush=True)
    return again


def _changes(board: Blackboard, known: dict[str, tuple[int, int]]) -> list[dict[str, Any]]:
    """The events since ``known`` (updated in place), in key order. A key
    missing from the snapshot (its lock was busy) waits for the next round."""
    present = set(board.keys())
    statuses = {status.key: status for status in board.snapshot()}
    values = board.read_all()
    events: list[dict[str, Any]] = []
    for key in sorted(set(known) | present):
        if key not in present:
            del known[key]
            events.append({"event": "gone", "key": key})
            continue
        status = statuses.get(key)
        if status is None:
            continue
        now = (status.update_count, status.owner_pid)
        if known.get(key) == now:
            continue
        event = "key" if key not in known else "value" if known[key][0] != now[0] else "owner"
        known[key] = now
        events.append({"event": event, **vars(diagnostics.board_key(status)), "value": values.get(key)})
    return events


def _event_json(event: dict[str, Any]) -> str:
    """One line of strict JSON, the value as base64."""
    fields: dict[str, Any] = dict(event)
    value = event.get("value")
    fields["value"] = None if value is None else base64.b64encode(value).decode("ascii")
    return jsontext.dumps(fields)


def _event_text(event: dict[str, Any]) -> str:
    if event["event"] == "gone":
        return f"{printable(event['key'])}: gone"
    value = event["value"]
    preview = "-" if value is None else printable(value[:PREVIEW_BYTES].decode("utf-8", errors="backslashreplace"))
    if value is not None and len(value) > PREVIEW_BYTES:
        preview += "..."
    return (f"{printable(event['key'])}: {event['event']} #{event['updates']} {event['size']} bytes "
            f"owner {printable(event['owner'])}[{event['pid']}] {event['state']}: {preview}")


# -- the parser ------------------------------------------------------------------------------


def add_commands(commands: Commands) -> None:
    """registry, blackboard (alias bb), bbwatch: their options and examples."""
    sub = add_command(commands, "registry", cmd_registry,
                      "a namespace's topics with their producers and consumers, from its participant registry (layout 9)",
                      "  kickmsg registry demo\n  kickmsg registry -n demo --json\n"
                      "  kickmsg registry demo --sweep   # first free the rows of dead processes", channel=False)
    sub.add_argument("ns", nargs="?", metavar="NS", help="the namespace (same as -n)")
    add_namespace_option(sub)
    sub.add_argument("--sweep", action="store_true", help="first free the rows of processes that are gone")
    for name in ("blackboard", "bb"):
        sub = add_command(commands, name, cmd_blackboard,
                          "a blackboard's keys: size, updates, age, owner, live or dead (layout 9)",
                          f"  kickmsg {name} state demo\n  kickmsg {name} state -n demo --json\n"
                          f"  kickmsg {name} state -n demo --sweep   # first free the keys of dead owners", channel=False)
        sub.add_argument("board", metavar="NAME", help="the board's name (its region is /NS_bb_NAME)")
        sub.add_argument("ns", nargs="?", metavar="NS", help="the namespace (same as -n)")
        add_namespace_option(sub)
        sub.add_argument("--sweep", action="store_true", help="first free the keys of owners that are gone")
    sub = add_command(commands, "bbwatch", cmd_bbwatch, "a blackboard's keys, then its changes as they happen (Ctrl-C stops)",
                      "  kickmsg bbwatch state demo\n  kickmsg bbwatch state -n demo --json --count 10", channel=False)
    sub.add_argument("board", metavar="NAME", help="the board's name (its region is /NS_bb_NAME)")
    sub.add_argument("ns", nargs="?", metavar="NS", help="the namespace (same as -n)")
    add_namespace_option(sub)
    sub.add_argument("--count", type=positive_int, help="stop after this many events")
