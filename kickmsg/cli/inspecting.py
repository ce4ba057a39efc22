"""Commands that look without touching: list, info, stats, watch, schema,
schema-diff, diagnose, audit, exporter. They render ``kickmsg.ops.diagnostics``.
``list`` groups by namespace the regions a participant registry lists;
reading a blackboard's keys (list, info, exporter) takes its lock for a
moment, as 0.9.2's snapshot does.
"""
import argparse
import dataclasses
import datetime
import sys
from typing import Any

from kickmsg import jsontext, layouts, shm, typed
from kickmsg.cli.boards import board_text, registry_text, topic_table
from kickmsg.ops import diagnostics
from kickmsg.ops.audit import audit
from kickmsg.cli.common import (
    EXIT_FOUND,
    EXIT_OK,
    CommandError,
    Commands,
    add_command,
    channel_name,
    counted,
    emit,
    import_module_of_extra,
    inspect,
    port_number,
    positive_int,
    positive_number,
    stop_on_signals,
    table,
)
from kickmsg.description import schema_to_json
from kickmsg.errors import BoardBusyError, RegionError
from kickmsg.schema import Diff, diff
from kickmsg.terminal import printable

__all__ = [
    "JSON_FIELDS", "LIST_COLUMNS", "TABLE_COLUMNS", "add_commands", "bridge_lines", "cmd_audit", "cmd_diagnose",
    "cmd_exporter", "cmd_info", "cmd_list", "cmd_schema", "cmd_schema_diff", "cmd_stats", "cmd_watch", "json_list_row",
    "namespace_lines", "object_type_of", "owner_cell", "publisher_lines", "text_list_row",
]

LIST_COLUMNS = (
    "name", "type", "version", "creator", "pid", "alive", "subs", "pubs", "bridges", "capacity", "pool", "payload",
    "schema", "health", "mode", "owner", "problem", "namespace", "topic", "topics",
)
TABLE_COLUMNS = tuple(c for c in LIST_COLUMNS if c not in ("bridges", "problem", "namespace", "topic", "topics"))  # problems go in a footer
JSON_FIELDS = {  # list --json: numbers apart
    "subs": ("subs_live", "subs_max"), "pubs": ("pubs_live", "pubs_stall"), "pool": ("pool_free", "pool_size"),
    "bridges": ("bridges_live", "bridges_dead"),
}


def add_commands(commands: Commands) -> None:
    """list, info, stats, watch, schema, schema-diff, diagnose, audit, exporter: their options and examples."""
    sub = add_command(commands, "list", cmd_list, "list the Kickmsg regions in /dev/shm",
                      "  kickmsg list\n  kickmsg list --prefix kickmsg -o name,subs,pool\n  kickmsg list --json\n"
                      "  kickmsg list --all          # also orphan sidecars and objects of other programs", channel=False)
    sub.add_argument("--prefix", help="only names starting with /PREFIX")
    sub.add_argument("-o", dest="columns", metavar="COLUMNS", help=f"comma-separated columns of {','.join(LIST_COLUMNS)}")
    sub.add_argument("--all", action="store_true", help="also list orphan sidecars and objects that are not Kickmsg regions")

    add_command(commands, "info", cmd_info, "every header field, decoded",
                "  kickmsg info /kickmsg_imu\n  kickmsg info --topic imu --json")
    sub = add_command(commands, "stats", cmd_stats, "rings (state, in-flight, write position, pending, losses) and pool use",
                      "  kickmsg stats --topic imu\n  kickmsg stats /kickmsg_imu --all-rings   # idle rings too, one line each")
    sub.add_argument("--all-rings", action="store_true",
                     help="a line for every ring (by default idle rings, Free and never written, are counted in one line)")

    sub = add_command(commands, "watch", cmd_watch, "a live view: messages/s per ring, pool use, new losses (Ctrl-C stops)",
                      "  kickmsg watch --topic imu\n  kickmsg watch /kickmsg_imu --interval 0.5 --count 10 --json")
    sub.add_argument("--interval", type=positive_number, default=1.0, help="seconds between refreshes (default 1)")
    sub.add_argument("--count", type=positive_int, help="stop after this many refreshes")

    add_command(commands, "schema", cmd_schema, "the channel's schema descriptor", "  kickmsg schema --topic imu")
    sub = add_command(commands, "schema-diff", cmd_schema_diff,
                      "compare two channels' schema descriptors (exit 1 if they differ)",
                      "  kickmsg schema-diff /kickmsg_imu /kickmsg_imu_replay", channel=False)
    sub.add_argument("a")
    sub.add_argument("b")

    add_command(commands, "diagnose", cmd_diagnose, "health counts (read-only; exit 1 if damage is found)",
                "  kickmsg diagnose --topic imu")
    add_command(commands, "audit", cmd_audit, "check every invariant (read-only; exit 1 unless clean)",
                "  kickmsg audit /kickmsg_imu --json")

    sub = add_command(commands, "exporter", cmd_exporter, "serve Prometheus metrics of every channel on /metrics (read-only)",
                      "  kickmsg exporter\n  kickmsg exporter --port 9464 --bind 127.0.0.1 --prefix kickmsg --interval 5",
                      channel=False, json_flag=False)
    sub.add_argument("--port", type=port_number, default=9464, help="TCP port (default 9464; 0: any free port)")
    sub.add_argument("--bind", default="127.0.0.1", metavar="ADDRESS", help="address to listen on (default 127.0.0.1)")
    sub.add_argument("--prefix", help="only channels whose name starts with /PREFIX")
    sub.add_argument("--interval", type=positive_number, default=5.0, help="seconds between readings (default 5)")


def cmd_list(args: argparse.Namespace) -> int:
    columns = args.columns.split(",") if args.columns else list(LIST_COLUMNS if args.json else TABLE_COLUMNS)
    unknown = [c for c in columns if c not in LIST_COLUMNS]
    if unknown:
        raise CommandError(f"unknown column(s) {', '.join(unknown)}; choose from {','.join(LIST_COLUMNS)}")
    found = diagnostics.list_regions(args.prefix, everything=args.all)
    rows = [row for row in found if row.type != "unreadable"]
    if not args.columns and not args.json and any(row.bridges_live or row.bridges_dead for row in rows):
        columns.insert(columns.index("pubs") + 1, "bridges")  # shown when some channel is bridged
    denied = len(found) - len(rows)
    unreadable = f"{counted(denied, 'object', 'objects')} could not be read: permission denied"
    if args.json:
        print(jsontext.dumps([json_list_row(row, columns) for row in rows], indent=2), flush=True)
        if denied:
            print(f"kickmsg list: {unreadable}", file=sys.stderr)
        return EXIT_OK
    registries = [row for row in rows if row.topics is not None]
    others = [row for row in rows if row.namespace is None]  # not accounted for by a registry
    lines = [namespace_lines(registry, rows) for registry in registries]
    if others or not registries:
        lines.append(table([text_list_row(row) for row in others], columns) if others else
                     "no shared-memory objects" if args.all else "no Kickmsg regions")
    if any(row.type in ("damaged", "busy") or row.type.startswith("unsupported") for row in rows):
        lines.append("kickmsg info NAME for details on damaged or unsupported regions")
    if "pubs" in columns and any(row.pubs_live is not None for row in others):
        lines.append(f"PUBS: live publishers of this package ({diagnostics.UNRECORDED_PUBLISHERS})")
    if "bridges" in columns and any(row.bridges_live is not None for row in others):
        lines.append("BRIDGES: live kickmsg bridges forwarding the channel (kickmsg stats NAME shows their figures)")
    if registries:
        lines.append("PRODUCERS, CONSUMERS: rows of the namespace's participant registry, node[pid] (any implementation); "
                     "stalled: the process is gone (kickmsg registry NS --sweep frees their rows)")
    if denied:
        lines.append(unreadable)
    print("\n".join(lines), flush=True)
    return EXIT_OK


def namespace_lines(registry: diagnostics.RegionSummary, rows: list[diagnostics.RegionSummary]) -> str:
    """A namespace's heading and its registry's topics, each with what its
    region is (type and health, ``missing`` when there is no such object)."""
    topics = registry.topics or []
    listed = {row.name: row for row in rows}
    regions = {}
    for topic in topics:
        row = listed.get(topic.shm_name)
        if row is not None:
            regions[topic.shm_name] = f"{row.type} {(row.health or '').split(':')[0]}".strip()
        elif not diagnostics.exists(topic.shm_name):
            regions[topic.shm_name] = "missing"
    heading = (f"namespace {printable(registry.namespace or '')} ({printable(registry.name)}): "
               f"{counted(len(topics), 'topic', 'topics')}, {registry.health}")
    return "\n".join([heading, topic_table(topics, regions)] if topics else [heading]) + "\n"


def json_list_row(row: diagnostics.RegionSummary, columns: list[str]) -> dict[str, Any]:
    """A list row for --json: the chosen columns, ``subs``, ``pubs``,
    ``bridges`` and ``pool`` as two numbers each (``subs_live``,
    ``subs_max``, ``pubs_live``, ``pubs_stall``, ``bridges_live``,
    ``bridges_dead``, ``pool_free``, ``pool_size``)."""
    fields = dataclasses.asdict(row)
    return {name: fields[name] for column in columns for name in JSON_FIELDS.get(column, (column,))}


def text_list_row(row: diagnostics.RegionSummary) -> dict[str, Any]:
    """A list row for the table: ``subs`` and ``pool`` as ``live/max``,
    ``free/size``, ``pubs`` as ``live`` and ``+Nstall`` (``1+2stall``),
    ``bridges`` as ``live`` and ``+Ndead``, health as its first word."""
    cells = vars(row)
    if row.subs_live is None:
        return cells
    stall = f"+{row.pubs_stall}stall" if row.pubs_stall else ""
    dead = f"+{row.bridges_dead}dead" if row.bridges_dead else ""
    return dict(cells, subs=f"{row.subs_live}/{row.subs_max}", pool=f"{row.pool_free}/{row.pool_size}",
                pubs=f"{row.pubs_live}{stall}", bridges=f"{row.bridges_live}{dead}", health=(row.health or "").split(":")[0])


def cmd_info(args: argparse.Namespace) -> int:
    name = channel_name(args)
    kind = object_type_of(name)
    try:
        if kind == diagnostics.REGISTRY:
            registry = diagnostics.registry(name)
            emit(args, diagnostics.to_json(registry), registry_text(registry))
            return EXIT_OK
        if kind == diagnostics.BLACKBOARD:
            board = diagnostics.blackboard(name)
            emit(args, diagnostics.to_json(board), board_text(board))
            return EXIT_OK
        found = diagnostics.region_info(inspect(name))
    except (CommandError, RegionError) as error:
        damaged = None if isinstance(error, BoardBusyError) else diagnostics.damaged_info(name, str(error))
        if damaged is None:  # missing, unreadable, not Kickmsg, busy: the one line says it
            raise
        emit(args, diagnostics.to_json(damaged), damaged_text(damaged))
        return EXIT_FOUND
    data = diagnostics.to_json(found)
    lines = []
    for key, value in data.items():
        if key == "hazards":
            continue
        if isinstance(value, dict):
            value = ", ".join(f"{k}={v}" for k, v in value.items())
        lines.append(f"{key:<18} {printable(str(value))}")
    lines += [f"{'warning':<18} {hazard}" for hazard in found.hazards]
    emit(args, data, "\n".join(lines))
    return EXIT_OK


def damaged_text(found: diagnostics.DamagedInfo) -> str:
    """A region that does not open: its fault, then what its header holds."""
    lines = [f"{printable(found.name)} does not open: {printable(found.fault)}",
             f"{'type':<18} {found.type}", f"{'size':<18} {found.size} bytes",
             f"{'version':<18} {'-' if found.version is None else found.version}"]
    lines += [f"{key:<18} {f'0x{value:016x}' if key in ('magic', 'config_hash') else value}"
              for key, value in found.fields.items() if key != "version"]
    if found.creator_name is not None:
        lines.append(f"{'creator_name':<18} {printable(found.creator_name)}")
    if found.missing:
        lines.append(f"{'past its end':<18} {', '.join(found.missing)}")
    if found.type == diagnostics.CHANNEL and found.version in layouts.SUPPORTED_LAYOUTS:  # not a newer layout's
        lines.append(f"kickmsg rm {printable(found.name)} removes it")
    return "\n".join(lines)


def object_type_of(name: str) -> str | None:
    """The object's type by its magic; None when it cannot be read (the
    channel path then says why)."""
    try:
        shm.check_existing_name(name)
        return diagnostics.object_type(diagnostics.read_magic_and_version(shm.SHM_DIRECTORY + name))
    except (OSError, ValueError):
        return None


def cmd_stats(args: argparse.Namespace) -> int:
    region = inspect(channel_name(args))
    found = diagnostics.region_stats(region, audit(region), every_ring=args.all_rings)
    shown = [dict(vars(row), owner_pid=owner_cell(row)) for row in found.rings]
    lines = [f"{printable(region.name)}: pool {found.pool_free}/{found.pool_size} slots free"]
    columns = ["ring", "state", "in_flight", "write_pos", "held", "locked", "owner_pid", "read_pos", "pending", "lost"]
    if any(row.dropped is not None for row in found.rings):  # counted by layout-9 rings
        columns.append("dropped")
    if shown:
        lines.append(table(shown, columns))
    if found.steals is not None:
        lines.append(f"steals: {found.steals} (locks stolen into skip markers)")
    if found.idle_rings:
        lines.append(f"{counted(found.idle_rings, 'idle ring', 'idle rings')} (Free, never written; --all-rings lists them)")
    lines += [
        f"ring {row.ring}: its subscriber (pid {row.owner_pid}) died; kickmsg repair {printable(region.name)} reclaims it"
        for row in found.rings if row.owner_alive is False
    ]
    lines += publisher_lines(region.name, found.publishers)
    lines += bridge_lines(found.bridges)
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
    lines += [f"publisher {p.pid} died without leaving (stall); kickmsg repair {printable(name)} reclaims its record"
              for p in publishers if not p.alive]
    return lines


def bridge_lines(bridges: list[diagnostics.BridgeFigures]) -> list[str]:
    """The bridges forwarding the channel as a table (a dead one as ``dead``)."""
    if not bridges:
        return []
    rows = [dict(vars(b), state="live" if b.alive else "dead", matched="yes" if b.matched else "no",
                 **{"in": b.messages_in, "out": b.messages_out, "bytes/s": f"{b.bytes_per_s:.0f}"}) for b in bridges]
    for row in rows:
        if row["direction"] == "export":  # counted on the importing side only
            row["lost_on_way"] = row["lost_at_source"] = None
    lines = ["bridges (kickmsg bridge; figures as of their last update, every 0.5 s):",
             table(rows, ["pid", "state", "direction", "key", "peers", "matched", "in", "out", "lost_locally",
                          "lost_on_way", "lost_at_source", "bytes/s"])]
    lines += [f"bridge {b.pid} died without leaving; kickmsg clean reclaims its record" for b in bridges if not b.alive]
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
                f"{printable(snapshot.name)}  {datetime.datetime.now():%H:%M:%S}  pool {snapshot.pool_used}/{snapshot.pool_size} in use\n"
                f"{snapshot.verdict}\n"
                f"publishers: {live} live, {stalled} stall ({diagnostics.UNRECORDED_PUBLISHERS})\n"
                + (table(shown, ["ring", "state", "in_flight", "write_pos", "msgs_per_s", "pending", "lost", "new_lost"]) if shown else "no active rings")
            )
            print(("\x1b[H\x1b[2J" if sys.stdout.isatty() else "") + screen + "\n", flush=True)
        if args.count is not None and refreshes >= args.count:
            break
    return EXIT_OK


def cmd_schema(args: argparse.Namespace) -> int:
    region = inspect(channel_name(args))
    info = region.schema()
    data = {"name": region.name, "schema": None if info is None else schema_to_json(info)}
    if info is None:
        text = f"{printable(region.name)}: no schema descriptor"
    else:
        record_type = typed.RecordType.from_schema(info)
        text = "\n".join(f"{key:<14} {printable(str(value))}" for key, value in schema_to_json(info).items())
        if record_type is not None:
            data["record_dtype"] = str(record_type.dtype)
            text += f"\n{'record dtype':<14} {record_type.dtype}"
    emit(args, data, text)
    return EXIT_OK


def cmd_schema_diff(args: argparse.Namespace) -> int:
    names = [a if a.startswith("/") else "/" + a for a in (args.a, args.b)]
    schemas = [inspect(name).schema() for name in names]
    if None in schemas:
        missing = [name for name, info in zip(names, schemas) if info is None]
        data = {"equal": schemas[0] is schemas[1], "differences": [], "without_schema": missing}
        emit(args, data, f"no schema descriptor on {printable(', '.join(missing))}")
        return EXIT_OK if data["equal"] else EXIT_FOUND
    found = diff(*[info for info in schemas if info is not None])
    names_of = [str(flag.name) for flag in Diff if flag and flag in found]
    emit(args, {"equal": not names_of, "differences": names_of}, "equal" if not names_of else "differ: " + ", ".join(names_of))
    return EXIT_OK if not names_of else EXIT_FOUND


def cmd_diagnose(args: argparse.Namespace) -> int:
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
        "stranded_slots": report.stranded_slots,
    }
    width = max(map(len, data))
    lines = [f"{key:<{width}} {value}" for key, value in data.items()]
    lines += [f"ring {ring}: its subscriber (pid {pid}) died; kickmsg repair reclaims it" for ring, pid in region.dead_subscriber_rings()]
    lines += [f"warning: {hazard}" for hazard in region.geometry.hazards()]
    if report.stranded_slots:
        lines.append(f"{counted(report.stranded_slots, 'slot is', 'slots are')} held only by rings that are not Live, "
                     f"leaving {region.geometry.pool_size - report.stranded_slots} of {region.geometry.pool_size} to "
                     f"Live rings that keep {region.geometry.capacity} each: kickmsg repair {printable(region.name)} "
                     f"gives them back (retired rings: --retired --yes)")
    elif report.pool_too_small and not region.geometry.hazards():
        lines.append(f"ring claims hold every slot of the pool ({region.geometry.pool_size}) while each Live ring keeps "
                     f"{region.geometry.capacity}: some Live ring holds claims of older messages (left by a reclaim "
                     f"that did not drain, in a ring a subscriber joined since), and no publisher can write to replace "
                     f"them; restart its subscriber, then kickmsg repair {printable(region.name)} drains what is left")
    emit(args, dict(data, healthy=report.healthy), "\n".join(lines))
    return EXIT_OK if report.healthy else EXIT_FOUND


def cmd_audit(args: argparse.Namespace) -> int:
    region = inspect(channel_name(args))
    report = audit(region)
    fixes = report.fixes(region.name)
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
        "unreferenced_slots": report.unreferenced_slots,
        "stranded_slots": report.stranded_slots,
        "fixes": fixes,
        "schema_state": report.schema_state,
        "hazards": report.hazards,
        "rings": [vars(ring) for ring in report.rings],
        "idle_rings": report.idle_rings,
    }
    problems = ("free_stack_problems", "leaked_slots", "unreferenced_slots", "stranded_slots", "under_referenced_slots",
                "double_free_candidates")
    details = [f"  {key}: {data[key]}" for key in problems if data[key]]
    moving = [slot for slot in report.being_written if slot not in report.unreferenced_slots]  # (those are listed)
    details += [f"  being_written: {moving}"] if moving else []
    for ring in report.rings:
        for what in ("locked_entries", "stale_entries", "bad_entries"):
            if getattr(ring, what):
                details.append(f"  ring {ring.index} {what}: {getattr(ring, what)}")
        if ring.index in report.dead_owner_rings:
            details.append(f"  ring {ring.index} is held by dead subscriber {ring.owner_pid} (kickmsg repair reclaims it)")
    details += [f"  {hazard}" for hazard in report.hazards]
    details += [f"  fix: {printable(fix)}" for fix in fixes]
    emit(args, data, "\n".join([report.verdict] + details))
    return EXIT_OK if report.clean else EXIT_FOUND


def cmd_exporter(args: argparse.Namespace) -> int:
    stop = stop_on_signals()
    exporter = import_module_of_extra("kickmsg.ops.exporter", "metrics")

    def tell(url: str) -> None:
        print(f"serving {url} (channels {'/' + args.prefix.lstrip('/') + '*' if args.prefix else 'all'}, "
              f"every {args.interval:g} s; Ctrl-C stops)", flush=True)

    exporter.serve(args.port, args.bind, args.prefix, args.interval, stop, on_ready=tell)
    return EXIT_OK
