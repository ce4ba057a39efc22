"""Diagnostics: everything the ``kickmsg`` tools know about channels, as data.

Typed dataclasses and functions for programs (a GUI, an exporter, a
notebook) that would otherwise shell out to ``kickmsg``; the CLI only
renders them, and its ``--json`` output is ``to_json`` of them. The class
names follow the native kickmsg 0.9 ``kickmsg.diagnostics`` module where
they mean the same thing (``RegionInfo``, ``RingStats``, ``RegionStats``,
``HealthSnapshot``, ``WatchSnapshot``, ``Participant``).

Every function attaches read-only (``SharedRegion.inspect``) and works on
regions of this package and of the native library. Subscribers and
publishers of this package record themselves beside the region
(``kickmsg.owners``); native ones record nothing: their rings show without
an owner, and native publishers cannot be seen at all. Bridges
(``kickmsg bridge``) record their figures per forwarded channel the same
way (``BridgeFigures``, in ``RegionStats.bridges``).

Layout 9's two other region types (WIRE9.md C, D) have their own:
``registry`` (a namespace's participants by topic, stalled ones marked:
``RegistryInfo``) and ``blackboard`` (a board's keys, their owners live or
dead: ``BoardInfo``). Those open their region read-write, as 0.9.2 does: a
board's key list is read under its lock.
"""
import ctypes
import dataclasses
import enum
import os
import pwd
import shlex
import stat
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

from kickmsg import layouts, shm
from kickmsg.atomics import HARDWARE
from kickmsg.description import schema_to_json
from kickmsg.errors import BoardBusyError, RegionError
from kickmsg import owners
from kickmsg.ops.audit import AuditReport, RingAudit, audit
from kickmsg.protocol.v4 import layout
from kickmsg.protocol.v9 import blackboard as board9
from kickmsg.protocol.v9 import layout as layout9
from kickmsg.protocol.v9 import registry as registry9
from kickmsg.protocol.v9.layout import VersionMismatchError
from kickmsg.region import SharedRegion

__all__ = [
    "BLACKBOARD", "BoardInfo", "BoardKey", "BridgeFigures", "CHANNEL", "CHANNEL_TYPES", "DamagedInfo", "HealthSnapshot",
    "IDLE_RATE",
    "OBJECT_TYPES", "Participant", "REGISTRY", "REGISTRY_SUFFIX", "RegionInfo", "RegionStats", "RegionSummary",
    "RegistryInfo", "RegistryParticipant", "RegistryTopic", "RingRate", "RingStats", "SCHEMA_STATES",
    "UNRECORDED_PUBLISHERS", "WatchSnapshot", "account_for_registries", "age_s", "attach", "blackboard", "board_info",
    "board_key", "creator_name", "damaged_info", "exists", "health", "health_of", "info", "is_kickmsg", "is_orphan_sidecar",
    "is_sidecar", "list_regions", "not_a_channel", "object_type", "open_blackboard", "open_registry", "owned_ring_stats4",
    "owned_ring_stats9", "pid_alive", "read_bridges", "read_magic_and_version", "read_participants", "region_info",
    "region_stats", "registry", "registry_info", "ring_stats", "shm_objects", "stats", "summarize",
    "summarize_blackboard", "summarize_registry", "to_json", "user_name", "watch",
]

CHANNEL_TYPES = {layout.CHANNEL_PUBSUB: "PubSub", layout.CHANNEL_BROADCAST: "Broadcast"}
SCHEMA_STATES = {layout.SCHEMA_UNSET: "Unset", layout.SCHEMA_CLAIMING: "Claiming", layout.SCHEMA_SET: "Set"}
UNRECORDED_PUBLISHERS = "+ unrecorded: native publishers cannot be seen"
CHANNEL, REGISTRY, BLACKBOARD = "channel", "registry", "blackboard"  # the object types, by magic
OBJECT_TYPES = {layout.MAGIC: CHANNEL, registry9.MAGIC: REGISTRY, board9.MAGIC: BLACKBOARD}
REGISTRY_SUFFIX = "_registry"


# -- the data ------------------------------------------------------------------------------------


@dataclass
class RegionSummary:
    """One /dev/shm object, as ``kickmsg list`` shows it. Fields a row cannot
    have (a damaged region has no geometry) are None. A participant
    registry's row carries its namespace and ``topics``; a region one of them
    lists carries that ``namespace`` and its ``topic``."""

    name: str  # shm name, /x
    type: str  # PubSub, Broadcast, Registry, Blackboard, "unsupported (vN)", damaged, busy (a board's lock), "not Kickmsg", "orphan sidecar", unreadable
    mode: str  # permission bits, octal text
    owner: str  # user name (or uid)
    version: int | None = None  # layout version
    creator: str | None = None  # creator name in the header
    pid: int | None = None  # creator pid
    alive: bool | None = None  # whether the creator process still runs
    subs_live: int | None = None  # Live rings: subscribers of any implementation
    subs_max: int | None = None  # max_subscribers
    pubs_live: int | None = None  # live publishers of this package (native ones are unrecorded)
    pubs_stall: int | None = None  # recorded publishers whose process died
    bridges_live: int | None = None  # live bridges forwarding the channel (kickmsg bridge)
    bridges_dead: int | None = None  # bridge records whose process died
    capacity: int | None = None  # sub_ring_capacity; a board's keys, a registry's rows
    pool_free: int | None = None  # slots on the free stack
    pool_size: int | None = None
    payload: int | None = None  # max_payload_size; a board's max_value_size
    schema: str | None = None  # schema name ("" without a descriptor)
    health: str | None = None  # the audit's verdict: "clean: ..." or "DAMAGED: ..."; a board's "N keys"; a registry's "N participants"
    problem: str | None = None  # why the object is not a usable region
    namespace: str | None = None  # a registry's; of a region: the namespace whose registry lists it
    topic: str | None = None  # of a region a registry lists: its topic there
    topics: list["RegistryTopic"] | None = None  # a registry's topics, their producers and consumers


@dataclass
class RegionInfo:
    """Every header field of a region, decoded (``kickmsg info``)."""

    name: str
    magic: str  # hex
    version: int
    channel_type: str | int  # PubSub, Broadcast (the number if unknown)
    total_size: int
    sub_rings_offset: int
    pool_offset: int
    max_subs: int
    sub_ring_capacity: int
    sub_ring_mask: int
    pool_size: int
    slot_data_size: int
    slot_stride: int
    sub_ring_stride: int
    commit_timeout_us: int
    config_hash: str  # hex
    creator_pid: int
    creator_alive: bool
    created_at_ns: int  # CLOCK_MONOTONIC of the creator's boot
    age_s: float
    creator_name: str
    creator_name_len: int
    schema_state: str | int  # Unset, Claiming, Set
    schema: dict[str, Any] | None  # name, version, identity, layout (hex), identity_algo, layout_algo, flags
    free_top: dict[str, int]  # generation, slot
    hazards: list[str]  # why this geometry cannot work


@dataclass
class DamagedInfo:
    """What ``kickmsg info`` shows of a region that has a Kickmsg magic but
    does not open (damaged, truncated, an unsupported version): its fault
    and the header fields that lie within the object."""

    name: str
    type: str  # channel, registry or blackboard, by its magic
    size: int  # bytes of the object
    version: int | None  # None: the object ends before the version word
    fields: dict[str, int]  # a channel of layout 4 or 9: its header's fields within the object, by name
    missing: list[str]  # those header fields that lie past the object's end
    creator_name: str | None  # the creator name's bytes after the header (None: past the object's end)
    fault: str  # why it does not open


@dataclass
class RingStats:
    """One ring (``kickmsg stats``). On layout 4 the owner fields are those
    of a subscriber of this package (its record, updated at most every
    0.1 s); None for Free rings and native subscribers. On layout 9 the owner
    is the pid in the ring header (any implementation), the losses and drops
    the ring's own counters; read_pos and pending are not known there."""

    ring: int
    state: str  # Free, Live, Draining, "invalid (3)"
    in_flight: int  # publishers admitted to it right now
    write_pos: int  # messages ever written into it
    held: int  # committed entries still holding a slot
    locked: int  # entries stuck LOCKED
    owner_pid: int | None
    owner_alive: bool | None
    read_pos: int | None
    pending: int | None  # written, not read yet (at most a ring's worth)
    lost: int | None  # messages the subscriber lost (overwritten unread; layout 9: the ring's lost_count)
    dropped: int | None = None  # layout 9: deliveries publishers dropped on this ring (its dropped_count)


@dataclass
class Participant:
    """A publisher of this package, from its record (``kickmsg.owners``)."""

    pid: int
    pid_starttime: int  # clock ticks after boot
    node_name: str  # the name it gave, or its program's
    role: str  # "publisher"
    alive: bool  # False: it died without leaving (a "stall" in the native tools)
    sent: int  # messages sent, as of its last check-in (every 0.1 s while sending)
    dropped: int  # deliveries it dropped, likewise
    started_at_ns: int  # time.time_ns() when it started
    checked_in_at_ns: int  # time.time_ns() of its last check-in


@dataclass
class BridgeFigures:
    """A bridge forwarding the channel (``kickmsg bridge``), from its record:
    its figures as of its last update (every 0.5 s while it runs)."""

    pid: int
    alive: bool  # False: the bridge died without leaving; its figures stopped then
    direction: str  # "export" (channel -> Zenoh) or "import" (Zenoh -> channel)
    key: str  # the Zenoh key
    messages_in: int  # export: received from the ring; import: received from Zenoh
    messages_out: int  # export: put to Zenoh; import: published into the channel
    bytes_out: int  # payload bytes forwarded
    lost_locally: int  # export: its subscriber lost them; import: could not be published
    lost_on_way: int  # import: gaps in the exporter's sequence numbers
    lost_at_source: int  # import: what the exporting bridge reported losing
    skipped: int  # import: samples not from a bridge, or already passed
    epochs: int  # export: runs of the channel; import: exporter runs seen
    recreated: int  # import: times it re-created the channel for a new description of the key
    matched: bool  # export: an importer's subscriber matches the key; import: an exporter's description does
    peers: int  # Zenoh sessions connected to the bridge's (other bridges, routers)
    bytes_per_s: float  # payload bytes forwarded per second between its last two updates
    started_at_ns: int  # time.time_ns() when it recorded itself
    updated_at_ns: int  # time.time_ns() of its last update


@dataclass
class RegionStats:
    """A region's rings, pool, recorded publishers and bridges (``kickmsg stats``)."""

    name: str
    pool_size: int
    pool_free: int
    rings: list[RingStats]  # every ring but the idle ones, unless every ring was asked for
    idle_rings: int  # idle rings left out of ``rings``: Free, nothing in flight, never written
    live_rings: int
    publishers: list[Participant]  # this package's, live and stalled; native publishers are unrecorded
    unrecorded: str = UNRECORDED_PUBLISHERS
    bridges: list[BridgeFigures] = field(default_factory=list)  # live and dead
    steals: int | None = None  # layout 9: locks publishers or repairs stole into skip markers (the header's steal_count)


@dataclass
class HealthSnapshot:
    """The audit of a region: each kind of problem with its count."""

    name: str
    status: str  # healthy, damaged
    problems: dict[str, int]  # kind -> count, every kind the audit looks for (kickmsg.ops.audit)
    verdict: str  # one line: "clean: ..." or "DAMAGED: ..."
    stall_publishers: int  # recorded publishers that died (not damage: their records are reclaimed)


@dataclass
class RingRate(RingStats):
    """A ring in a ``watch`` snapshot, with what changed since the previous one."""

    msgs_per_s: float | None = None  # None in the first snapshot
    new_lost: int | None = None  # losses since the previous snapshot (None without a record)


@dataclass
class WatchSnapshot:
    """One refresh of ``watch``."""

    name: str
    time: float  # time.time()
    pool_used: int
    pool_size: int
    verdict: str
    rings: list[RingRate]  # every ring but the idle ones
    idle_rings: int  # Free, nothing in flight, never written
    publishers: list[Participant] = field(default_factory=list)
    unrecorded: str = UNRECORDED_PUBLISHERS


def to_json(value: Any) -> Any:
    """A dataclass (or list of them) as plain JSON-ready data."""
    if isinstance(value, list):
        return [to_json(item) for item in value]
    return dataclasses.asdict(value)


# -- attaching -----------------------------------------------------------------------------------


def attach(name: str) -> SharedRegion:
    """Attach read-only; every failure a ``RegionError`` with one line."""
    try:
        return SharedRegion.inspect(name)
    except shm.RegionNotFoundError:
        raise RegionError(f"no such region: {name}") from None
    except shm.RegionPermissionError as error:  # names the mode, the owner and who we are
        raise RegionError(str(error)) from None
    except (RuntimeError, ValueError) as error:
        text = str(error)
        if "bad magic" in text:
            raise RegionError(not_a_channel(name)) from None
        if "Version mismatch" in text:
            raise RegionError(f"unsupported version: {text}") from None
        raise RegionError(text.splitlines()[0] if text else type(error).__name__) from None


def pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    except OverflowError:
        return False
    return pid > 0


def user_name(uid: int) -> str:
    try:
        return pwd.getpwuid(uid).pw_name
    except KeyError:
        return str(uid)


# -- list ----------------------------------------------------------------------------------------


def shm_objects(prefix: str | None) -> Iterator[os.DirEntry[str]]:
    """The regular files in /dev/shm (regions, sidecars, anything else),
    sorted by name, optionally only those whose name starts with /PREFIX."""
    start = prefix.lstrip("/") if prefix else ""
    for entry in sorted(os.scandir(shm.SHM_DIRECTORY), key=lambda e: e.name):
        if entry.is_file(follow_symlinks=False) and entry.name.startswith(start):
            yield entry


def is_sidecar(entry: os.DirEntry[str]) -> bool:
    """A file of ring-owner, publisher or bridge records (``kickmsg.owners``)."""
    return owners.sidecar_kind(entry.name) is not None


def is_orphan_sidecar(entry: os.DirEntry[str]) -> bool:
    """A sidecar whose region is gone (removed by the native unlink_shm, by rm, ...)."""
    return is_sidecar(entry) and not os.path.exists(shm.SHM_DIRECTORY + owners.region_of_sidecar(entry.name))


def read_magic_and_version(path: str) -> tuple[int, int] | None:
    """The first 12 bytes as (magic, version); None if the object is
    shorter, or not a regular file (a FIFO planted there: no hang). OSError
    (e.g. PermissionError) if it cannot be read."""
    head = shm.read_head(path, 12)
    if len(head) < 12:
        return None
    return int.from_bytes(head[:8], "little"), int.from_bytes(head[8:12], "little")


def is_kickmsg(found: tuple[int, int] | None) -> bool:
    return found is not None and found[0] == layout.MAGIC


def list_regions(prefix: str | None = None, everything: bool = False) -> list[RegionSummary]:
    """One summary per Kickmsg region in /dev/shm (whose name starts with
    /``prefix``): channels, participant registries and blackboards, a region
    a registry lists with that registry's namespace; with ``everything``,
    also objects that are not regions and sidecars whose region is gone.
    Objects this process may not read are rows of type ``unreadable``;
    objects removed meanwhile are skipped."""
    rows = []
    for entry in shm_objects(prefix):
        try:
            row = summarize(entry, everything)
        except PermissionError:
            row = RegionSummary(name="/" + entry.name, type="unreadable", mode="", owner="", problem="permission denied")
        except FileNotFoundError:
            continue
        if row is not None:
            rows.append(row)
    account_for_registries(rows)
    return rows


def summarize(entry: os.DirEntry[str], everything: bool) -> RegionSummary | None:
    """The summary of one /dev/shm object; None if it is not listed (not a
    region, a sidecar of a region, unless ``everything``). PermissionError
    if this user cannot read it."""
    status = entry.stat(follow_symlinks=False)
    row = RegionSummary(name="/" + entry.name, type="", mode=f"{status.st_mode & 0o777:04o}", owner=user_name(status.st_uid))
    if is_sidecar(entry):
        if not (everything and is_orphan_sidecar(entry)):
            return None
        return dataclasses.replace(row, type="orphan sidecar", problem=f"{owners.sidecar_kind(entry.name)} records of "
                                   f"{owners.region_of_sidecar(entry.name)}, which is gone (kickmsg clean removes it)")
    found = read_magic_and_version(entry.path)
    kind = object_type(found)
    if found is None or kind is None:
        return dataclasses.replace(row, type="not Kickmsg", problem="no Kickmsg magic") if everything else None
    row.version = found[1]
    if kind == REGISTRY:
        return summarize_registry(row)
    if kind == BLACKBOARD:
        return summarize_blackboard(row)
    if found[1] not in layouts.SUPPORTED_LAYOUTS:
        return dataclasses.replace(row, type=f"unsupported (v{found[1]})",
                                   problem=f"layout version {found[1]}; this tool reads 4 and 9")
    try:
        region = SharedRegion.inspect(row.name)
    except (RuntimeError, ValueError) as error:
        return dataclasses.replace(row, type="damaged", problem=str(error).splitlines()[0])
    g = region.geometry
    creator_pid, _ = region.incarnation()
    report = audit(region)
    schema = region.schema()
    publishers = read_participants(region)
    bridges = read_bridges(region)
    return dataclasses.replace(
        row,
        type=region.channel_type.name,
        creator=creator_name(region),
        pid=creator_pid,
        alive=pid_alive(creator_pid),
        subs_live=sum(r.state == "Live" for r in report.rings),
        subs_max=g.max_subs,
        pubs_live=sum(p.alive for p in publishers),
        pubs_stall=sum(not p.alive for p in publishers),
        bridges_live=sum(b.alive for b in bridges),
        bridges_dead=sum(not b.alive for b in bridges),
        capacity=g.capacity,
        pool_free=report.free_slots,
        pool_size=g.pool_size,
        payload=g.slot_data_size,
        schema=schema.name if schema else "",
        health=report.verdict,
    )


def summarize_registry(row: RegionSummary) -> RegionSummary:
    """A participant registry's row: its namespace and topics."""
    if row.version != registry9.VERSION:
        return dataclasses.replace(row, type=f"unsupported (v{row.version})",
                                   problem=f"registry version {row.version}; this tool reads {registry9.VERSION}")
    try:
        found = registry(row.name)
    except RegionError as error:
        return dataclasses.replace(row, type="damaged", problem=str(error))
    return dataclasses.replace(
        row, type="Registry", capacity=found.capacity, namespace=found.namespace, topics=found.topics,
        health=f"{found.participants} participant{'' if found.participants == 1 else 's'}, {found.stalled} stalled",
    )


def summarize_blackboard(row: RegionSummary) -> RegionSummary:
    """A blackboard's row: its creator, capacity (keys), max value size, keys."""
    if row.version != board9.VERSION:
        return dataclasses.replace(row, type=f"unsupported (v{row.version})",
                                   problem=f"blackboard version {row.version}; this tool reads {board9.VERSION}")
    try:
        found = blackboard(row.name)
    except BoardBusyError as error:
        return dataclasses.replace(row, type="busy", problem=str(error))
    except RegionError as error:
        return dataclasses.replace(row, type="damaged", problem=str(error))
    return dataclasses.replace(
        row, type="Blackboard", pid=found.creator_pid, alive=pid_alive(found.creator_pid), capacity=found.capacity,
        payload=found.max_value_size,
        health=f"{len(found.keys)} key{'' if len(found.keys) == 1 else 's'}"
        + (f", {found.dead_owners} with a dead owner" if found.dead_owners else ""),
    )


def account_for_registries(rows: list[RegionSummary]) -> None:
    """Give each row a registry lists that registry's namespace and the
    row's topic there (the first registry, by name, that lists it)."""
    by_name = {row.name: row for row in rows}
    for row in rows:
        for topic in row.topics or []:
            listed = by_name.get(topic.shm_name)
            if listed is not None and listed.namespace is None:
                listed.namespace, listed.topic = row.namespace, topic.topic


def exists(name: str) -> bool:
    """Whether /dev/shm holds an object of that name (a name from a
    registry row is untrusted text: one that no object can have is not)."""
    try:
        shm.check_existing_name(name)
    except (TypeError, ValueError):
        return False
    return shm.object_size(name) is not None


# -- info ----------------------------------------------------------------------------------------


def creator_name(region: SharedRegion) -> str:
    return region.info().creator_name


def age_s(region: SharedRegion) -> float:
    """Seconds since the region was created: its ``created_at_ns`` is
    CLOCK_MONOTONIC on layout 4, CLOCK_REALTIME on layout 9."""
    now_ns = time.time_ns() if region.layout == layouts.LAYOUT_9 else time.monotonic_ns()
    return round((now_ns - region.incarnation()[1]) / 1e9, 3)


def info(name: str) -> RegionInfo:
    """Every header field of region ``name``, decoded."""
    return region_info(attach(name))


def damaged_info(name: str, fault: str) -> DamagedInfo | None:
    """What can be read of object ``name``, which does not open (``fault``
    says why): its type and version by magic, and for a channel of layout 4
    or 9 the header fields within the object and the creator name. None if
    it cannot be read, is not a regular file, or has no Kickmsg magic. Reads
    the header's bytes with pread, never maps: any bytes are safe."""
    try:
        fd = os.open(shm.SHM_DIRECTORY + name, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)  # a FIFO: no hang
    except (OSError, ValueError):
        return None
    try:
        status = os.fstat(fd)
        if not stat.S_ISREG(status.st_mode):
            return None
        head = os.pread(fd, layout9.HEADER_SIZE + layout.U16_MAX, 0)  # the header and the longest creator name
    finally:
        os.close(fd)
    kind = OBJECT_TYPES.get(int.from_bytes(head[:8], "little")) if len(head) >= 8 else None
    if kind is None:
        return None
    version = int.from_bytes(head[8:12], "little") if len(head) >= 12 else None
    headers: dict[int | None, type[ctypes.Structure]] = {layouts.LAYOUT_4: layout.Header, layouts.LAYOUT_9: layout9.Header}
    header = headers.get(version) if kind == CHANNEL else None
    fields, missing = {}, []
    for field_name, _ in getattr(header, "_fields_", []):
        if field_name.startswith("_") or field_name == "schema_data":  # padding; the schema has its own command
            continue
        place = getattr(header, field_name)
        if place.offset + place.size <= len(head):
            fields[field_name] = int.from_bytes(head[place.offset:place.offset + place.size], "little")
        else:
            missing.append(field_name)
    creator = None
    if header is not None and "creator_name_len" in fields:
        start = ctypes.sizeof(header)
        name_bytes = head[start:start + fields["creator_name_len"]]
        creator = name_bytes.decode("utf-8", errors="replace") if len(name_bytes) == fields["creator_name_len"] else None
    return DamagedInfo(name=name, type=kind, size=status.st_size, version=version, fields=fields, missing=missing,
                       creator_name=creator, fault=fault)


def region_info(region: SharedRegion) -> RegionInfo:
    h = region.core.header
    words = region.core.header_words()
    free_top, schema_state = words.free_top, words.schema_state
    return RegionInfo(
        name=region.name,
        magic=f"0x{words.magic:016x}",
        version=h.version,
        channel_type=CHANNEL_TYPES.get(h.channel_type, h.channel_type),
        total_size=h.total_size,
        sub_rings_offset=h.sub_rings_offset,
        pool_offset=h.pool_offset,
        max_subs=h.max_subs,
        sub_ring_capacity=h.sub_ring_capacity,
        sub_ring_mask=h.sub_ring_mask,
        pool_size=h.pool_size,
        slot_data_size=h.slot_data_size,
        slot_stride=h.slot_stride,
        sub_ring_stride=h.sub_ring_stride,
        commit_timeout_us=h.commit_timeout_us,
        config_hash=f"0x{h.config_hash:016x}",
        creator_pid=h.creator_pid,
        creator_alive=pid_alive(h.creator_pid),
        created_at_ns=h.created_at_ns,
        age_s=age_s(region),
        creator_name=creator_name(region),
        creator_name_len=h.creator_name_len,
        schema_state=SCHEMA_STATES.get(schema_state, schema_state),
        schema=None if (found := region.schema()) is None else schema_to_json(found),
        free_top={"generation": free_top >> 32, "slot": free_top & layout.U32_MAX},
        hazards=region.geometry.hazards(),
    )


# -- stats ---------------------------------------------------------------------------------------


def read_participants(region: SharedRegion) -> list[Participant]:
    """The recorded publishers of this instance of a region, live and dead."""
    return [
        Participant(
            pid=record.pid,
            pid_starttime=record.process_start,
            node_name=record.name.decode("utf-8", errors="replace"),
            role="publisher",
            alive=held,
            sent=record.sent,
            dropped=record.dropped,
            started_at_ns=record.started_at_ns,
            checked_in_at_ns=record.checked_in_at_ns,
        )
        for record, held in owners.read_publishers(region)
    ]


def read_bridges(region: SharedRegion) -> list[BridgeFigures]:
    """The recorded bridges of this instance of a region, live and dead."""
    return [
        BridgeFigures(
            pid=record.pid,
            alive=held,
            direction=owners.BRIDGE_DIRECTIONS.get(record.direction, f"unknown ({record.direction})"),
            key=record.key.decode("utf-8", errors="replace"),
            messages_in=record.messages_in,
            messages_out=record.messages_out,
            bytes_out=record.bytes_out,
            lost_locally=record.lost_locally,
            lost_on_way=record.lost_on_way,
            lost_at_source=record.lost_at_source,
            skipped=record.skipped,
            epochs=record.epochs,
            recreated=record.recreated,
            matched=bool(record.matched),
            peers=record.peers,
            bytes_per_s=round(record.bytes_per_s, 1),
            started_at_ns=record.started_at_ns,
            updated_at_ns=record.updated_at_ns,
        )
        for record, held in owners.read_bridges(region)
    ]


def ring_stats(region: SharedRegion, report: AuditReport, every_ring: bool = False) -> list[RingStats]:
    """Per ring that is not idle (``every_ring``: per ring): state,
    in-flight publishers, write position, entries still holding a slot,
    and its subscriber (``owned_ring_stats``). An idle ring's row is known
    without reading anything more (Free, zeros)."""
    audited = {ring.index: ring for ring in report.rings}
    shown = range(region.geometry.max_subs) if every_ring else list(audited)
    rows = []
    for index in shown:
        ring = audited.get(index)
        if ring is None:
            rows.append(RingStats(index, "Free", 0, 0, 0, 0, None, None, None, None, None))
            continue
        rows.append(RingStats(ring.index, ring.state, ring.in_flight, ring.write_pos, ring.references,
                              len(ring.locked_entries), None, None, None, None, None))
    (owned_ring_stats9 if region.layout == layouts.LAYOUT_9 else owned_ring_stats4)(region, audited, rows)
    return rows


def owned_ring_stats4(region: SharedRegion, audited: dict[int, RingAudit], rows: list[RingStats]) -> None:
    """Layout 4: a Live ring's owner, read position, pending messages and
    losses from its subscriber's record, if it keeps one (ours)."""
    records = (owners.read_owners(region.name, region.geometry.max_subs) if region.mapping.shared else None) or []
    _, created = region.incarnation()
    for row in rows:
        record, held = records[row.ring] if row.ring < len(records) else (None, False)
        if row.state == "Live" and record is not None and record.region_created_at_ns == created:
            row.owner_pid, row.owner_alive = record.pid, held
            row.read_pos, row.lost = record.read_pos, record.lost
            row.pending = min(max(0, audited[row.ring].write_pos - record.read_pos), region.geometry.capacity)


def owned_ring_stats9(region: SharedRegion, audited: dict[int, RingAudit], rows: list[RingStats]) -> None:
    """Layout 9: each ring's owner from its header (as the audit read it)
    and its shm-resident lost and dropped counters (B.18)."""
    counted = region.stats().rings
    for row in rows:
        if row.ring in audited:
            row.owner_pid, row.owner_alive = audited[row.ring].owner_pid, audited[row.ring].owner_alive
            row.lost, row.dropped = counted[row.ring].lost_count, counted[row.ring].dropped_count


def stats(name: str, every_ring: bool = False) -> RegionStats:
    """Rings, pool and recorded publishers of region ``name``; idle rings
    are counted, not listed, unless ``every_ring``."""
    region = attach(name)
    return region_stats(region, audit(region), every_ring)


def region_stats(region: SharedRegion, report: AuditReport, every_ring: bool = False) -> RegionStats:
    rings = ring_stats(region, report, every_ring)
    return RegionStats(
        name=region.name,
        pool_size=region.geometry.pool_size,
        pool_free=report.free_slots,
        rings=rings,
        idle_rings=region.geometry.max_subs - len(rings),
        live_rings=sum(ring.state == "Live" for ring in rings),
        publishers=read_participants(region),
        bridges=read_bridges(region),
        steals=region.stats().total_steals if region.layout == layouts.LAYOUT_9 else None,
    )


# -- health --------------------------------------------------------------------------------------


def health(name: str) -> HealthSnapshot:
    """The audit of region ``name`` (read-only)."""
    region = attach(name)
    return health_of(region, audit(region))


def health_of(region: SharedRegion, report: AuditReport) -> HealthSnapshot:
    return HealthSnapshot(
        name=region.name,
        status="healthy" if report.clean else "damaged",
        problems=report.damage(),
        verdict=report.verdict,
        stall_publishers=sum(not p.alive for p in read_participants(region)),
    )


# -- watch ---------------------------------------------------------------------------------------


IDLE_RATE = RingRate(0, "Free", 0, 0, 0, 0, None, None, None, None, None)  # an idle ring in a previous snapshot


def watch(name: str, interval: float = 1.0, stop: threading.Event | None = None) -> Iterator[WatchSnapshot]:
    """A snapshot now, then one every ``interval`` seconds, with messages
    per second and new losses per ring (idle rings counted, not listed)
    since the previous one; ends when ``stop`` is set (checked while
    waiting). A region re-created under the name is followed (its rates
    start afresh); one removed raises ``RegionError``."""
    if not interval > 0:
        raise ValueError(f"watch interval must be > 0 seconds, not {interval!r}")
    region = attach(name)
    stop = stop or threading.Event()
    previous: tuple[float, dict[int, RingRate]] | None = None
    while True:
        if shm.object_size(region.name) is None:
            raise RegionError(f"{region.name} was removed")
        if region.replaced():
            region, previous = attach(region.name), None
        now = time.monotonic()
        report = audit(region)
        rings = [RingRate(**dataclasses.asdict(ring)) for ring in ring_stats(region, report)]
        if previous is not None:
            elapsed = now - previous[0]
            for ring in rings:
                before = previous[1].get(ring.ring, IDLE_RATE)  # idle then: never written
                ring.msgs_per_s = round((ring.write_pos - before.write_pos) / elapsed, 1)
                ring.new_lost = None if ring.lost is None or before.lost is None else ring.lost - before.lost
        yield WatchSnapshot(
            name=region.name,
            time=time.time(),
            pool_used=region.geometry.pool_size - report.free_slots,
            pool_size=region.geometry.pool_size,
            verdict=report.verdict,
            rings=rings,
            idle_rings=report.idle_rings,
            publishers=read_participants(region),
        )
        previous = (now, {ring.ring: ring for ring in rings})
        if stop.wait(interval):
            return


# -- registries and blackboards (layout 9) -------------------------------------------------------


@dataclass
class RegistryParticipant:
    """A row of a participant registry (WIRE9.md C.2): a process of either
    implementation using a channel or a board."""

    pid: int
    node_name: str
    role: str  # Publisher, Subscriber, Both (the number if unknown)
    stalled: bool  # its process is gone (kill(pid, 0)): a "stall" in the native tools


@dataclass
class RegistryTopic:
    """The rows of one shm name, as ``Registry.list_topics`` groups them."""

    topic: str  # the logical path, with its leading /
    shm_name: str
    kind: str  # Pubsub, Broadcast, Mailbox, Blackboard (the number if unknown)
    channel_type: int  # 0 none (a board), 1 PubSub, 2 Broadcast
    producers: list[RegistryParticipant]  # roles Publisher and Both, live then stalled
    consumers: list[RegistryParticipant]  # roles Subscriber and Both, live then stalled


@dataclass
class RegistryInfo:
    """A namespace's participant registry (``kickmsg registry``)."""

    name: str  # /NS_registry
    namespace: str  # NS, as in the shm name
    capacity: int  # rows
    participants: int  # rows in use (a Both row counted once; one of a role no topic list takes too)
    stalled: int  # of them, rows whose process is gone
    topics: list[RegistryTopic]  # sorted by shm name


@dataclass
class BoardKey:
    """One key of a blackboard (``kickmsg blackboard``)."""

    key: str
    size: int  # bytes of its value
    updates: int  # writes so far (kept across owners)
    age_s: float | None  # since its last write (CLOCK_MONOTONIC); None: never written
    owner: str  # the owner's node name
    pid: int  # the owner's pid, 0 once released
    state: str  # live, dead (its owner died without releasing it), unowned (released)


@dataclass
class BoardInfo:
    """A blackboard and its keys (``kickmsg blackboard``)."""

    name: str  # /NS_bb_NAME
    capacity: int  # keys it can hold
    max_value_size: int
    creator_pid: int
    keys: list[BoardKey]  # in entry order
    updates: int  # the keys' writes, summed
    dead_owners: int  # keys whose owner died without releasing them
    oldest_age_s: float | None  # age of the oldest value; None: no value written


def object_type(found: tuple[int, int] | None) -> str | None:
    """``CHANNEL``, ``REGISTRY``, ``BLACKBOARD`` by the magic of
    ``read_magic_and_version``; None for any other object."""
    return None if found is None else OBJECT_TYPES.get(found[0])


def not_a_channel(name: str) -> str:
    """What to say of object ``name``, whose magic is not a channel's: a
    participant registry or a Blackboard is named as such, with the command
    that reads it; anything else is not a Kickmsg region."""
    try:
        kind = object_type(read_magic_and_version(shm.SHM_DIRECTORY + name))
    except OSError:
        kind = None
    reader = f"kickmsg info {shlex.quote(name)}"  # for a name no naming rule gives
    if kind == REGISTRY:
        namespace = name[1:].removesuffix(REGISTRY_SUFFIX)
        if _names(layout9.registry_shm_name, name, namespace):
            reader = f"kickmsg registry {shlex.quote(namespace)}"
        return f"{name} is a participant registry (layout 9), not a channel: {reader} reads it"
    if kind == BLACKBOARD:
        namespace, _, board = name[1:].partition("_bb_")
        if _names(layout9.blackboard_shm_name, name, namespace, board):
            reader = f"kickmsg bb {shlex.quote(board)} -n {shlex.quote(namespace)}"
        return f"{name} is a Blackboard (layout 9), not a channel: {reader} reads it"
    return f"not a Kickmsg region: {name}"


def _names(compose: Callable[..., str], name: str, *components: str) -> bool:
    """Whether ``compose(*components)`` (a 0.9.2 naming rule) gives ``name``."""
    try:
        return compose(*components) == name
    except (OSError, ValueError, RuntimeError):
        return False


def _open_typed(open_it: Callable[[], Any], name: str) -> Any:
    """Run an opener; every failure a ``RegionError`` with one line, but a
    ``PermissionError`` stays one (``list`` shows it as unreadable)."""
    try:
        return open_it()
    except shm.RegionNotFoundError:
        raise RegionError(f"no such region: {name}") from None
    except shm.RegionPermissionError:
        raise
    except (RuntimeError, ValueError, OSError) as error:
        text = str(error)
        if isinstance(error, VersionMismatchError):
            text = f"unsupported version: {text}"
        raise RegionError(text.splitlines()[0] if text else type(error).__name__) from None


def open_registry(name: str) -> registry9.Registry:
    """The participant registry of shm name ``name`` (any namespace text)."""
    opened: registry9.Registry = _open_typed(lambda: registry9.Registry._open(name, HARDWARE), name)
    return opened


def open_blackboard(name: str) -> board9.Blackboard:
    """The blackboard of shm name ``name``, of any config and identity."""
    never = "Blackboard region exists but was never initialized"
    opened: board9.Blackboard = _open_typed(
        lambda: board9.Blackboard._open(name, 0, 0, "", HARDWARE, never_initialised=never), name)
    return opened


def _named(value: int) -> str:
    """A role's or kind's name; a number no member has, in text."""
    return value.name if isinstance(value, enum.IntEnum) else str(value)


def registry(name: str) -> RegistryInfo:
    """The participants of registry ``name`` (/NS_registry), by topic."""
    return registry_info(open_registry(name))


def registry_info(found: registry9.Registry) -> RegistryInfo:
    def rows(live: list[registry9.Participant], stalled: list[registry9.Participant]) -> list[RegistryParticipant]:
        return ([RegistryParticipant(p.pid, p.node_name, _named(p.role), False) for p in live]
                + [RegistryParticipant(p.pid, p.node_name, _named(p.role), True) for p in stalled])

    topics = [
        RegistryTopic(topic.topic_name, topic.shm_name, _named(topic.kind), topic.channel_type,
                      rows(topic.producers, topic.stall_producers), rows(topic.consumers, topic.stall_consumers))
        for topic in found.list_topics()
    ]
    everyone = found.snapshot()  # every row, those of roles no topic list takes included
    return RegistryInfo(
        name=found.name,
        namespace=found.name[1:].removesuffix(REGISTRY_SUFFIX),
        capacity=found.capacity,
        participants=len(everyone),
        stalled=sum(not registry9.process_exists(row.pid) for row in everyone),
        topics=topics,
    )


def blackboard(name: str) -> BoardInfo:
    """The keys of blackboard ``name`` (/NS_bb_NAME), read under its lock."""
    return board_info(open_blackboard(name))


def board_key(status: board9.KeyStatus) -> BoardKey:
    """A key's status; its age from the monotonic clock, as its writer stamps it."""
    return BoardKey(
        key=status.key, size=status.value_len, updates=status.update_count,
        age_s=round((time.monotonic_ns() - status.updated_at_ns) / 1e9, 3) if status.update_count else None,
        owner=status.owner_node, pid=status.owner_pid,
        state="live" if status.owner_alive else "dead" if status.owner_pid else "unowned",
    )


def board_info(board: board9.Blackboard) -> BoardInfo:
    """``BoardBusyError`` when the board's lock stayed busy (its keys unread)."""
    statuses = board.snapshot()
    if not statuses and board.keys():
        raise BoardBusyError(f"{board.name}: its lock stayed busy, the keys could not be read")
    keys = [board_key(status) for status in statuses]
    ages = [key.age_s for key in keys if key.age_s is not None]
    return BoardInfo(
        name=board.name,
        capacity=board.capacity,
        max_value_size=board.max_value_size,
        creator_pid=board.creator_pid(),
        keys=keys,
        updates=sum(key.updates for key in keys),
        dead_owners=sum(key.state == "dead" for key in keys),
        oldest_age_s=max(ages) if ages else None,
    )
