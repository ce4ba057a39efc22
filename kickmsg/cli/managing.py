"""Commands that write: pub, create, rm, repair, clean. ``rm`` and ``clean``
know layout 9's participant registries and blackboards too."""
import argparse
import errno
import fcntl
import os
import signal
import sys
import time
from collections.abc import Callable
from typing import Any

import kickmsg
from kickmsg import layouts, shm
from kickmsg import owners
from kickmsg.ops import audit
from kickmsg.protocol.v4 import layout
from kickmsg.cli.common import (
    EXIT_ERROR,
    EXIT_OK,
    CommandError,
    Commands,
    add_command,
    add_geometry_options,
    channel_name,
    config_of,
    counted,
    emit,
    geometry_fields,
    geometry_options_given,
    open_writable,
    positive_int,
    positive_number,
    shm_name,
    stop_on_signals,
)
from kickmsg.config import ChannelType
from kickmsg.ops.diagnostics import (
    BLACKBOARD,
    REGISTRY,
    is_orphan_sidecar,
    is_sidecar,
    object_type,
    pid_alive,
    read_magic_and_version,
    shm_objects,
    user_name,
)
from kickmsg.protocol.v9 import blackboard as board9
from kickmsg.protocol.v9 import registry as registry9
from kickmsg.protocol.info import DrainedRing
from kickmsg.publisher import send_retrying
from kickmsg.region import DeadSubscriberReport, SharedRegion
from kickmsg.terminal import printable
from kickmsg.userfiles import FileTooLarge, read_at_most

__all__ = [
    "IN_USE", "SIDECARS", "add_commands", "candidate_type", "check_data_given", "clean_report", "cmd_clean", "cmd_create",
    "cmd_pub", "cmd_repair", "cmd_rm", "confirm", "dead_bridge_records", "dead_subscriber_sentences", "given_back",
    "payload_of", "publishing_region", "remove_each", "remove_file", "remove_region", "type_suffix", "why_not_unused",
]


def add_commands(commands: Commands) -> None:
    """pub, create, rm, repair, clean: their options and examples."""
    sub = add_command(commands, "pub", cmd_pub, "publish from the shell: text, hex (--hex) or a file (@path)",
                      "  kickmsg pub --topic cmd 'hello'\n  kickmsg pub /kickmsg_cmd --hex 01ff --rate 10 --count 50\n"
                      "  kickmsg pub --topic blob @frame.bin\n  kickmsg pub /kickmsg_cmd 'hello' --create --pool 512")
    sub.add_argument("data", help="text, hex digits with --hex, or @path")
    sub.add_argument("--hex", action="store_true", help="DATA is hexadecimal")
    sub.add_argument("--rate", type=positive_number, help="messages per second (default: as fast as possible)")
    sub.add_argument("--count", type=positive_int, default=1, help="how many times to publish (default 1)")
    sub.add_argument("--create", action="store_true",
                     help="create the channel if it does not exist (a Broadcast one if named by --broadcast), "
                          "with the options below; an existing channel is used as it is. The channel stays "
                          "after pub exits, as channels do (kickmsg rm NAME removes it)")
    add_geometry_options(sub, creator="kickmsg-pub")

    sub = add_command(commands, "create", cmd_create, "create a channel (refuses an existing name unless --replace)",
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

    sub = add_command(commands, "rm", cmd_rm, "remove regions (and their owner sidecars)",
                      "  kickmsg rm /kickmsg_imu /kickmsg_camera\n  kickmsg rm /not_a_region --force", channel=False)
    sub.add_argument("names", nargs="+", metavar="NAME", help="shm names")
    sub.add_argument("--force", action="store_true", help="also remove objects that are not Kickmsg regions")

    sub = add_command(commands, "repair", cmd_repair, "repair a channel (without options: the repairs safe under traffic)",
                      "  kickmsg repair --topic imu\n  kickmsg repair --topic imu --retired --orphans --yes\n"
                      "  kickmsg repair --topic imu --ring 3 --force   # ring 3: no record says who holds it")
    sub.add_argument("--locked", action="store_true", help="commit entries left locked by crashed publishers (safe)")
    sub.add_argument("--dead-subscribers", action="store_true",
                     help="free rings of subscribers that died, give back the slots Free rings still hold, and clear "
                          "records of publishers that died (safe)")
    sub.add_argument("--retired", action="store_true", help="reset and drain rings left by crashed publishers (unsafe)")
    sub.add_argument("--orphans", action="store_true", help="reclaim unreferenced slots (needs quiescence)")
    sub.add_argument("--ring", type=int, metavar="N",
                     help="with --force: free ring N that no owner record accounts for (refused if a live process "
                          "holds its record; only once no process reads it)")
    sub.add_argument("--force", action="store_true", help="confirm --ring N")
    sub.add_argument("--yes", action="store_true", help="do not ask for confirmation")

    sub = add_command(commands, "clean", cmd_clean, "remove regions whose creator is dead and that no process has open or mapped",
                      "  kickmsg clean --dry-run\n  kickmsg clean --prefix kickmsg", channel=False)
    sub.add_argument("--dry-run", action="store_true", help="only list what would be removed")
    sub.add_argument("--force", action="store_true",
                     help="also remove regions of dead creators that could not be proven unused (never one in use)")
    sub.add_argument("--prefix", help="only names starting with /PREFIX")


def payload_of(args: argparse.Namespace, region: SharedRegion) -> bytes:
    """DATA as bytes: text, hex digits with --hex, or the file named ``@path``,
    read no further than the region's max_payload_size (plus one byte)."""
    if args.data.startswith("@"):
        limit = region.geometry.slot_data_size
        try:
            return read_at_most(args.data[1:], limit, f"max_payload_size of {region.name}")
        except OSError as error:
            raise CommandError(f"cannot read {args.data[1:]}: {error.strerror}") from None
        except FileTooLarge as error:
            raise CommandError(str(error)) from None
    if args.hex:
        try:
            return bytes.fromhex(args.data)
        except ValueError:
            raise CommandError(f"not hexadecimal: {args.data!r}") from None
    return args.data.encode("utf-8")


def publishing_region(args: argparse.Namespace) -> SharedRegion:
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
        return SharedRegion.create_or_open(name, channel_type, config_of(args), args.creator, mode=args.mode, layout=args.layout)
    return open_writable(name)


def check_data_given(args: argparse.Namespace) -> None:
    """``kickmsg pub /c``: argparse took the channel for the data; say the
    data is missing rather than that no channel was named."""
    named = [args.name, args.topic, args.broadcast, args.mailbox]
    if all(value is None for value in named) and (args.data.startswith("/") or shm.object_size(shm_name(args.data)) is not None):
        raise CommandError(f"no data to publish to {args.data}: give it after the channel, e.g. "
                           f"kickmsg pub {args.data} 'hello' (text, hex digits with --hex, or @path)")


def cmd_pub(args: argparse.Namespace) -> int:
    check_data_given(args)
    stop = stop_on_signals()
    region = publishing_region(args)
    payload = payload_of(args, region)
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
                f"(after {published} of {args.count} message(s) published): {audit.explain_empty_pool(publisher.region)}"
            )
        published += 1
    data = {"name": region.name, "published": published, "size": len(payload), "dropped": publisher.dropped}
    emit(args, data, f"published {published} message(s) of {len(payload)} bytes to {printable(region.name)}")
    return EXIT_OK


def confirm(args: argparse.Namespace, question: str) -> None:
    if args.yes:
        return
    if not sys.stdin.isatty():
        raise CommandError(f"{question} — refusing without --yes (stdin is not a terminal)")
    if input(f"{question} Continue? [y/N] ").strip().lower() not in ("y", "yes"):
        raise CommandError("cancelled")


def cmd_repair(args: argparse.Namespace) -> int:
    if args.force and args.ring is None:
        raise CommandError("--force confirms --ring N: give the ring to free")
    if args.ring is not None and not args.force:
        raise CommandError(f"--ring {args.ring} frees the ring although no record shows its owner dead: only once no "
                           f"process reads it (a native subscriber, say); add --force to do it")
    chosen = [args.locked, args.retired, args.orphans, args.dead_subscribers, args.ring is not None]
    if not any(chosen):
        args.locked = args.dead_subscribers = True  # the repairs that are safe under traffic
    region = open_writable(channel_name(args))
    if args.retired:
        confirm(args, "--retired resets rings left by a crashed publisher: only safe once it is known to be gone.")
    if args.orphans:
        confirm(args, "--orphans reclaims unreferenced slots: only safe with every publisher paused and no view alive.")
    done: dict[str, Any] = {}
    lines: list[str] = []
    if args.ring is not None:
        freed = region.free_ring(args.ring)
        done["ring"] = {"index": args.ring, "freed": freed}
        lines.append(f"freed ring {args.ring}" if freed else f"ring {args.ring} is Free already")
    if args.dead_subscribers:
        report = region.reclaim_dead_subscribers()
        done["dead_subscribers"] = {"reclaimed": report.reclaimed, "unrecorded": report.unrecorded, "timed_out": report.timed_out}
        if region.layout == layouts.LAYOUT_9:  # layout 4's drain does not count what it gives back
            done["dead_subscribers"]["claims_given_back"] = report.claims_given_back
        lines += dead_subscriber_sentences(region.name, report)
        done["dead_publishers_reclaimed"] = owners.reclaim_dead_publishers(region)
        lines += [f"reclaimed the record of dead publisher {pid}" for pid in done["dead_publishers_reclaimed"]]
    if args.locked:
        done["locked_entries_repaired"] = region.repair_locked_entries()
        lines.append(f"repaired {counted(done['locked_entries_repaired'], 'locked entry', 'locked entries')}")
    if args.dead_subscribers or args.retired:
        # Free rings' claims go back to the pool (left by reclaims and resets that do not drain);
        # with --retired, retired rings are reset and drained too (both layouts)
        drained = region.drain_free_rings(retired=args.retired)
        done["free_rings_drained"] = [vars(d) for d in drained if not d.in_flight]
        lines += [f"drained Free ring {d.ring}: {given_back(d)}" for d in drained if not d.in_flight]
        if args.retired:
            reset = [d for d in drained if d.in_flight]
            done["retired_rings_reset"] = len(reset)
            done["retired_rings_drained"] = [vars(d) for d in reset]
            lines.append(f"reset {counted(len(reset), 'retired ring', 'retired rings')}"
                         + "".join(f"; ring {d.ring}: {given_back(d)}" for d in reset if d.slots))
    if args.orphans:
        before = audit.look(region)  # the step runs at quiescence (its contract): two looks tell what it did
        done["orphaned_slots_reclaimed"] = region.reclaim_orphaned_slots()
        after = audit.look(region)
        came_back = sorted(set(after.free_slot_list) - set(before.free_slot_list))
        corrected = [slot for slot in range(after.pool_size)
                     if slot not in came_back and after.refcounts[slot] != before.refcounts[slot]]
        done["orphaned_slots_given_back"] = came_back
        done["refcounts_corrected"] = corrected
        lines.append(f"reclaimed {counted(done['orphaned_slots_reclaimed'], 'orphaned slot', 'orphaned slots')}"
                     + (f" ({', '.join(map(str, came_back))})" if came_back else ""))
        lines += [f"set the refcount of slot {slot} to the {counted(after.refcounts[slot], 'reference', 'references')} "
                  f"its ring entries hold (it was {before.refcounts[slot]}: pins of views of a dead process)"
                  for slot in corrected]
    emit(args, dict(done, name=region.name), "\n".join(lines))
    return EXIT_OK


def given_back(drained: DrainedRing) -> str:
    """What a drained ring gave back: ``gave back 2 claims (slots 3, 7)``."""
    if not drained.slots:
        return "it held no claim"
    return f"gave back {counted(len(drained.slots), 'claim', 'claims')} (slots {', '.join(map(str, sorted(drained.slots)))})"


def dead_subscriber_sentences(name: str, report: DeadSubscriberReport) -> list[str]:
    """What reclaim_dead_subscribers() did, one sentence per ring or group."""
    lines = [
        f"reclaimed ring {ring} of dead subscriber {pid}"
        + (f": gave back {counted(report.claims_given_back[ring], 'claim', 'claims')}" if ring in report.claims_given_back else "")
        for ring, pid in report.reclaimed
    ]
    lines += [
        f"could not reclaim ring {ring} of a dead subscriber: publishers stayed in flight, so it is left retired "
        f"(kickmsg repair --retired resets it)"
        for ring in report.timed_out
    ]
    if not lines:
        lines.append("no ring is held by a dead subscriber")
    for ring in report.unrecorded:
        lines.append(f"left ring {ring} alone: held by a subscriber that records no owner (native, or one that could "
                     f"not record itself); once no process reads it, kickmsg repair {name} --ring {ring} --force frees it")
    return lines


IN_USE = "a process has it open or mapped"
SIDECARS = "sidecars"  # rm's type for a name of which only record files were left


def why_not_unused(path: str) -> str | None:
    """None once it is proven that no process, of any user or container,
    has the object open or mapped: the kernel grants a write lease
    (F_SETLEASE) only then, and it is given back at once. Else why not:
    ``IN_USE``, or why it could not be proven. A process opening the object
    while the lease is held sends SIGIO, which the caller must ignore."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError as error:
        return f"cannot open it ({error.strerror})"
    try:
        fcntl.fcntl(fd, fcntl.F_SETLEASE, fcntl.F_WRLCK)
        fcntl.fcntl(fd, fcntl.F_SETLEASE, fcntl.F_UNLCK)
        return None
    except OSError as error:
        if error.errno in (errno.EAGAIN, errno.EBUSY):
            return IN_USE
        if error.errno == errno.EACCES:
            return f"only its owner, {user_name(os.fstat(fd).st_uid)}, or a process with CAP_LEASE can tell whether a process has it open"
        return f"the kernel cannot tell whether a process has it open ({error.strerror})"
    finally:
        os.close(fd)


def cmd_clean(args: argparse.Namespace) -> int:
    """Remove regions whose creator is dead (channels, blackboards) and
    participant registries, once it is proven that no process has them open
    or mapped, and sidecars whose region is gone; clear the records of dead
    bridges. What it cannot judge or remove is reported, and the rest goes on."""
    signal.signal(signal.SIGIO, signal.SIG_IGN)  # see why_not_unused
    stale, unproven, in_use, orphan_sidecars, skipped = [], [], [], [], []
    bridged: set[str] = set()  # channels with a file of bridge records (two, ours and the previous release's, count once)
    types: dict[str, str] = {}  # the type of each region judged
    for entry in shm_objects(args.prefix):
        name = "/" + entry.name
        try:
            if is_sidecar(entry):
                if is_orphan_sidecar(entry):
                    orphan_sidecars.append(name)
                elif owners.sidecar_kind(entry.name) == "bridge":
                    bridged.add(owners.region_of_sidecar(entry.name))
                continue
            kind = candidate_type(entry.path)
            if kind is None:
                continue
        except OSError as error:  # unreadable, another user's, or removed meanwhile
            if not isinstance(error, FileNotFoundError):
                skipped.append({"name": name, "reason": f"cannot read it ({error.strerror})"})
            continue
        types[name] = kind
        reason = why_not_unused(entry.path)
        if reason is None:
            stale.append(name)
        elif reason == IN_USE:
            in_use.append(name)
        else:
            unproven.append({"name": name, "reason": reason})
    dead_bridges = [record for name in sorted(bridged) for record in dead_bridge_records(name, args.dry_run)]
    to_remove = (stale + [found["name"] for found in unproven]) if args.force else stale
    removed, failed = ([*to_remove], []) if args.dry_run else remove_each(to_remove, kickmsg.unlink_shm)
    sidecars, failed_sidecars = ([*orphan_sidecars], []) if args.dry_run else remove_each(orphan_sidecars, remove_file)
    data = {"dry_run": args.dry_run, "removed": removed, "sidecars": sidecars, "dead_bridges": dead_bridges,
            "in_use": in_use, "unproven": [] if args.force else unproven, "failed": failed + failed_sidecars,
            "skipped": skipped, "types": types}
    emit(args, data, clean_report(data))
    return EXIT_ERROR if data["failed"] else EXIT_OK


def candidate_type(path: str) -> str | None:
    """What ``clean`` may remove once it is proven unused: a channel (of a
    layout we read, 4 or 9) or a blackboard whose creator is dead, or any
    participant registry (it has no creator: while a Node lists itself in
    it, the Node has it mapped); its type, else None. OSError if the object
    cannot be read. Both channel layouts keep the creator's pid at the same
    offset of the same-sized header."""
    found = read_magic_and_version(path)
    kind = object_type(found)
    if found is None or kind is None:
        return None
    if kind == REGISTRY:
        return kind if found[1] == registry9.VERSION else None
    if kind == BLACKBOARD:
        if found[1] != board9.VERSION:
            return None
        with open(path, "rb") as file:
            file.seek(board9.CREATOR_PID_OFFSET)
            creator_pid = int.from_bytes(file.read(8).ljust(8, b"\0"), "little")
        return kind if not pid_alive(creator_pid) else None
    if found[1] not in layouts.SUPPORTED_LAYOUTS:
        return None
    with open(path, "rb") as file:
        header = layout.Header.from_buffer_copy(file.read(layout.HEADER_SIZE).ljust(layout.HEADER_SIZE, b"\0"))
    return kind if not pid_alive(header.creator_pid) else None


def remove_file(name: str) -> None:
    """Remove one file of /dev/shm (an orphan sidecar)."""
    path = shm.SHM_DIRECTORY + name
    shm.check_may_remove(name, [path])
    os.unlink(path)


def remove_each(names: list[str], remove: Callable[[str], None]) -> tuple[list[str], list[dict[str, str]]]:
    """Remove each name in turn, going on past failures: the names removed,
    and ``{"name", "reason"}`` for each that could not be."""
    removed, failed = [], []
    for name in names:
        try:
            remove(name)
        except shm.RegionPermissionError as error:  # names the file, its owner and who we are
            failed.append({"name": name, "reason": str(error)})
        except OSError as error:
            failed.append({"name": name, "reason": f"cannot remove {name}: {error.strerror}"})
        else:
            removed.append(name)
    return removed, failed


def clean_report(data: dict[str, Any]) -> str:
    """clean's outcome in sentences, one per object."""
    verb = "would remove" if data["dry_run"] else "removed"
    types = data["types"]
    lines = [f"{verb} {printable(name)}{type_suffix(types.get(name))}" for name in data["removed"] + data["sidecars"]]
    lines += [f"{'would reclaim' if data['dry_run'] else 'reclaimed'} the record of dead bridge {found['pid']} on {printable(found['name'])}"
              for found in data["dead_bridges"]]
    lines += [f"left {printable(name)}{type_suffix(types[name])}: "
              f"{'' if types[name] == REGISTRY else 'its creator is dead, but '}{IN_USE}" for name in data["in_use"]]
    lines += [f"left {printable(found['name'])}{type_suffix(types[found['name']])}: could not prove it unused "
              f"({printable(found['reason'])}); --force removes it" for found in data["unproven"]]
    lines += [printable(found["reason"]) for found in data["failed"]]
    lines += [f"skipped {printable(found['name'])}: {printable(found['reason'])}" for found in data["skipped"]]
    return "\n".join(lines or ["nothing to clean"])


def type_suffix(kind: str | None) -> str:
    """`` (registry)``, `` (blackboard)``: a channel, the usual object, goes unnamed."""
    return f" ({kind})" if kind in (REGISTRY, BLACKBOARD) else ""


def dead_bridge_records(name: str, dry_run: bool) -> list[dict[str, Any]]:
    """The records of dead bridges beside channel ``name`` (of any instance
    of it), cleared unless ``dry_run``: ``{"name", "pid"}`` each."""
    return [{"name": name, "pid": pid} for pid in owners.reclaim_dead_bridges(name, dry_run)]


def cmd_create(args: argparse.Namespace) -> int:
    name = channel_name(args)
    shm.check_name(name)
    existed = shm.object_size(name) is not None
    if existed and not args.replace:
        raise CommandError(f"{name} already exists (--replace would replace it)")
    channel_type = ChannelType.Broadcast if args.broadcast_type else ChannelType.PubSub
    make = SharedRegion.create if args.replace else SharedRegion.create_or_open  # the latter never replaces
    region = make(name, channel_type, config_of(args), args.creator, mode=args.mode, layout=args.layout)
    if region.incarnation()[0] != os.getpid():
        raise CommandError(f"{name} already exists (--replace would replace it)")  # made by another process meanwhile
    data = dict(
        {"name": name}, **geometry_fields(region), total_size=region.geometry.total_size,
        mode=f"{region.mapping.mode:04o}", creator=args.creator, replaced=existed,
    )
    lines = [f"{'replaced' if existed else 'created'} {printable(name)}"] + [f"{key:<18} {printable(str(value))}" for key, value in data.items()
                                                                  if key not in ("name", "replaced")]
    emit(args, data, "\n".join(lines))
    return EXIT_OK


def cmd_rm(args: argparse.Namespace) -> int:
    removed, errors, types = [], {}, {}
    for name in map(shm_name, args.names):
        try:
            types[name] = remove_region(name, args.force)
        except (CommandError, ValueError, OSError) as error:
            errors[name] = str(error).splitlines()[0]
            print(f"kickmsg rm: error: {printable(errors[name])}", file=sys.stderr, flush=True)
            continue
        removed.append(name)
        if args.json:
            continue
        if types[name] == SIDECARS:
            print(f"removed the record files of {printable(name)} (the region was gone already)", flush=True)
        else:
            print(f"removed {printable(name)}{type_suffix(types[name])}", flush=True)
    if args.json:
        emit(args, {"removed": removed, "errors": errors, "types": types}, "")
    return EXIT_ERROR if errors else EXIT_OK


def remove_region(name: str, force: bool) -> str | None:
    """Remove a region (a channel and its sidecars, a participant registry,
    a blackboard), or the sidecars of a region that is gone; refuse what is
    not a Kickmsg region unless ``force``. Any object of /dev/shm can be
    named, whatever its text. Its type (``SIDECARS``: only sidecars were
    left; None: not a Kickmsg region, or unreadable)."""
    shm.check_existing_name(name)
    try:
        found = read_magic_and_version(shm.SHM_DIRECTORY + name)
    except FileNotFoundError:
        left = [path for path in owners.sidecar_paths(name) if os.path.lexists(path)]
        if not left:
            raise CommandError(f"no such region: {name}") from None
        shm.check_may_remove(name, left)
        owners.unlink(name)
        return SIDECARS
    except PermissionError:
        if not force:
            raise CommandError(f"permission denied: cannot read {name} to check it is a Kickmsg region (--force removes it anyway)") from None
        found = None
    kind = object_type(found)
    if kind is None and not force:
        raise CommandError(f"not a Kickmsg region: {name} (--force removes it anyway)")
    kickmsg.unlink_shm(name)
    return kind
