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
import time
from typing import Any

from kickmsg import jsontext
from kickmsg.cli.common import EXIT_FOUND, EXIT_OK, CommandError, counted, emit, positive_int, stop_on_signals, table
from kickmsg.protocol.v9.blackboard import Blackboard, KeyStatus
from kickmsg.protocol.v9.registry import Kind, Participant, Registry, Role, TopicSummary
from kickmsg.terminal import printable

DEFAULT_NAMESPACE = "kickmsg"
WATCH_SLICE_S = 0.5  # bbwatch's longest sleep between checks for a stop signal
PREVIEW_BYTES = 48  # of a value, in bbwatch's text output


def add_namespace_option(sub: argparse.ArgumentParser) -> None:
    sub.add_argument("-n", "--namespace", default=None,
                     help=f"namespace (default: $KICKMSG_NAMESPACE, else {DEFAULT_NAMESPACE})")


def namespace_of(args: argparse.Namespace) -> str:
    """``registry NS`` or ``-n NS`` (not both), else the environment's, else the default."""
    positional = getattr(args, "ns", None)
    if positional is not None and args.namespace is not None:
        raise CommandError(f"give the namespace once: {positional!r} and -n {args.namespace!r}")
    return positional or args.namespace or os.environ.get("KICKMSG_NAMESPACE") or DEFAULT_NAMESPACE


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
    topics = [_topic_fields(topic) for topic in registry.list_topics()]
    lines = [f"{registry.name}: {counted(len(topics), 'topic', 'topics')}"
             + (f", {counted(swept, 'stale row', 'stale rows')} swept" if swept is not None else "")]
    if topics:
        lines.append(table([_topic_row(topic) for topic in topics], ("topic", "kind", "shm_name", "producers", "consumers")))
    emit(args, {"registry": registry.name, "swept": swept, "topics": topics}, "\n".join(lines))
    return EXIT_OK


def _participant_fields(participant: Participant, alive: bool) -> dict[str, Any]:
    role = participant.role
    return {"node": participant.node_name, "pid": participant.pid,
            "role": role.name if isinstance(role, Role) else role, "stalled": not alive}


def _topic_fields(topic: TopicSummary) -> dict[str, Any]:
    kind = topic.kind
    return {
        "topic": topic.topic_name, "shm_name": topic.shm_name, "channel_type": topic.channel_type,
        "kind": kind.name if isinstance(kind, Kind) else kind,
        "producers": [_participant_fields(p, True) for p in topic.producers]
        + [_participant_fields(p, False) for p in topic.stall_producers],
        "consumers": [_participant_fields(p, True) for p in topic.consumers]
        + [_participant_fields(p, False) for p in topic.stall_consumers],
    }


def _people(participants: list[dict[str, Any]]) -> str | None:
    return ", ".join(f"{p['node']}[{p['pid']}]" + (" stalled" if p["stalled"] else "") for p in participants) or None


def _topic_row(topic: dict[str, Any]) -> dict[str, Any]:
    return {**topic, "producers": _people(topic["producers"]), "consumers": _people(topic["consumers"])}


# -- blackboard ----------------------------------------------------------------------------


def open_board(args: argparse.Namespace) -> Blackboard | None:
    return Blackboard.try_open(namespace_of(args), args.board)


def cmd_blackboard(args: argparse.Namespace) -> int:
    """A board's keys: size, updates, age, owner, live or dead."""
    board = open_board(args)
    if board is None:
        return absent(args, f"no blackboard {Blackboard.shm_name(namespace_of(args), args.board)}")
    swept = board.sweep_stale() if args.sweep else None
    keys = [_key_fields(status) for status in board.snapshot()]
    lines = [f"{board.name}: capacity {board.capacity}, max value {board.max_value_size} bytes, "
             f"{counted(len(keys), 'key', 'keys')}"
             + (f", {counted(swept, 'stale key', 'stale keys')} swept" if swept is not None else "")]
    if keys:
        rows = [{**key, "age": None if key["age_s"] is None else f"{key['age_s']:.3f}s"} for key in keys]
        lines.append(table(rows, ("key", "size", "updates", "age", "owner", "pid", "state")))
    emit(args, {"board": board.name, "capacity": board.capacity, "max_value_size": board.max_value_size,
                "swept": swept, "keys": keys}, "\n".join(lines))
    return EXIT_OK


def _key_fields(status: KeyStatus) -> dict[str, Any]:
    """A key's status; its age from the monotonic clock (None: never written)."""
    written = status.update_count > 0
    state = "live" if status.owner_alive else "dead" if status.owner_pid else "unowned"
    return {
        "key": status.key, "size": status.value_len, "updates": status.update_count,
        "age_s": (time.monotonic_ns() - status.updated_at_ns) / 1e9 if written else None,
        "owner": status.owner_node, "pid": status.owner_pid, "state": state,
    }


# -- bbwatch ---------------------------------------------------------------------------------


def cmd_bbwatch(args: argparse.Namespace) -> int:
    """Print the board's keys, then every change (a new value, a new owner,
    a key gone) as it happens, until stopped or ``--count`` events."""
    board = open_board(args)
    if board is None:
        return absent(args, f"no blackboard {Blackboard.shm_name(namespace_of(args), args.board)}")
    stop = stop_on_signals()
    known: dict[str, tuple[int, int]] = {}  # key -> (update count, owner pid) last reported
    printed = 0
    while not stop.is_set():
        seen = board.change_seq
        for event in _changes(board, known):
            print(_event_text(event) if not args.json else _event_json(event), flush=True)
            printed += 1
            if args.count is not None and printed >= args.count:
                return EXIT_OK
        board.wait(seen, WATCH_SLICE_S)  # a change, or a slice gone: look again (and at the stop signal)
    return EXIT_OK


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
        events.append({"event": event, **_key_fields(status), "value": values.get(key)})
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


def add_board_commands(command: Any) -> None:
    """Add registry, blackboard (alias bb) and bbwatch through build_parser's ``command``."""
    sub = command("registry", cmd_registry,
                  "a namespace's topics with their producers and consumers, from its participant registry (layout 9)",
                  "  kickmsg registry demo\n  kickmsg registry -n demo --json\n"
                  "  kickmsg registry demo --sweep   # first free the rows of dead processes", channel=False)
    sub.add_argument("ns", nargs="?", metavar="NS", help="the namespace (same as -n)")
    add_namespace_option(sub)
    sub.add_argument("--sweep", action="store_true", help="first free the rows of processes that are gone")
    for name in ("blackboard", "bb"):
        sub = command(name, cmd_blackboard, "a blackboard's keys: size, updates, age, owner, live or dead (layout 9)",
                      f"  kickmsg {name} state -n demo\n  kickmsg {name} state -n demo --json\n"
                      f"  kickmsg {name} state -n demo --sweep   # first free the keys of dead owners", channel=False)
        sub.add_argument("board", metavar="NAME", help="the board's name (its region is /NS_bb_NAME)")
        add_namespace_option(sub)
        sub.add_argument("--sweep", action="store_true", help="first free the keys of owners that are gone")
    sub = command("bbwatch", cmd_bbwatch, "a blackboard's keys, then its changes as they happen (Ctrl-C stops)",
                  "  kickmsg bbwatch state -n demo\n  kickmsg bbwatch state -n demo --json --count 10", channel=False)
    sub.add_argument("board", metavar="NAME", help="the board's name (its region is /NS_bb_NAME)")
    add_namespace_option(sub)
    sub.add_argument("--count", type=positive_int, help="stop after this many events")
