"""The participant registry of a namespace, version 4 (WIRE9.md section C):
``/{namespace}_registry``, where every Node records which channels it
publishes and subscribes, byte-compatible with native ``kickmsg==0.9.2``.

``Registry`` opens or creates the region (C.1) and runs the row flows (C.3):
``register`` / ``deregister`` (what a Node calls, through ``NodeRows``, C.4),
``snapshot``, ``sweep_stale`` and ``list_topics``. Every row word named in
C.3 as atomic goes through ``kickmsg.atomics``; the region is untrusted, so
every value read from it is bounded before use. atomics.py has no release or
acquire fence: the seq_cst fence stands in for both (it is stronger).
"""
import enum
import errno
import os
import sys
import time
from dataclasses import dataclass, field

from kickmsg import shm
from kickmsg.atomics import HARDWARE, Atomics
from kickmsg.protocol.v9.layout import (
    CHANNEL_BROADCAST,
    CHANNEL_NONE,
    CHANNEL_PUBSUB,
    CorruptRegionError,
    VersionMismatchError,
    realtime_ns,
    registry_shm_name,
    shm_mode,
)
from kickmsg.protocol.v9.region import OPEN_ATTEMPTS, OPEN_RETRY_S, RegionInitTimeout
from kickmsg.protocol.v9.liveness import owner_is_dead, process_start_time

__all__ = [
    "ACTIVE", "CAPACITY_OFFSET", "CHANNEL_OF_KIND", "CHANNEL_TYPE_OFFSET", "CLAIMING", "CREATED_AT_OFFSET",
    "DEFAULT_CAPACITY", "FREE", "GENERATION_OFFSET", "HEADER_SIZE", "KIND_OFFSET", "Kind", "MAGIC", "MAGIC_OFFSET",
    "NODE_NAME_OFFSET", "NODE_NAME_SIZE", "NodeRows", "PADDING_OFFSET", "PID_OFFSET", "PID_STARTTIME_OFFSET",
    "Participant", "RECLAIMING", "REGISTER_ATTEMPTS", "ROLE_OFFSET", "ROW_SIZE", "Registry", "Role",
    "SHM_NAME_OFFSET", "SHM_NAME_SIZE", "STATE_OFFSET", "TOPIC_NAME_OFFSET", "TOPIC_NAME_SIZE", "TopicSummary",
    "VERSION", "VERSION_OFFSET", "process_exists",
]

# -- C.1 Region ----------------------------------------------------------------------

MAGIC = 0x214745524B43494B  # "KICKREG!", stored last (release)
VERSION = 4
HEADER_SIZE = 64
ROW_SIZE = 512
DEFAULT_CAPACITY = 4096
MAGIC_OFFSET = 0
VERSION_OFFSET = 8
CAPACITY_OFFSET = 12

# -- C.2 Row -------------------------------------------------------------------------

FREE = 0
CLAIMING = 1
ACTIVE = 2
RECLAIMING = 3

STATE_OFFSET = 0
CHANNEL_TYPE_OFFSET = 4
ROLE_OFFSET = 8
KIND_OFFSET = 12
GENERATION_OFFSET = 16
PADDING_OFFSET = 20
PID_OFFSET = 24
PID_STARTTIME_OFFSET = 32
CREATED_AT_OFFSET = 40
SHM_NAME_OFFSET, SHM_NAME_SIZE = 48, 128
TOPIC_NAME_OFFSET, TOPIC_NAME_SIZE = 176, 128
NODE_NAME_OFFSET, NODE_NAME_SIZE = 304, 64

REGISTER_ATTEMPTS = 3  # C.3: full → sweep_stale and retry, at most this often


class Role(enum.IntEnum):
    Publisher = 1
    Subscriber = 2
    Both = 3


class Kind(enum.IntEnum):
    Pubsub = 1
    Broadcast = 2
    Mailbox = 3
    Blackboard = 4


def process_exists(pid: int) -> bool:
    """``kill(pid, 0)`` succeeds or fails with EPERM (C.3 list_topics). A pid
    no kernel can hold (a corrupt row) does not exist."""
    if not 0 < pid <= 0x7FFFFFFF:
        return False
    try:
        os.kill(pid, 0)
    except OSError as error:
        return error.errno == errno.EPERM
    return True


def _role(value: int) -> Role | int:
    """Readers accept unknown values (C.2): those stay plain ints."""
    return Role(value) if value in Role._value2member_map_ else value


def _kind(value: int) -> Kind | int:
    return Kind(value) if value in Kind._value2member_map_ else value


@dataclass(frozen=True)
class Participant:
    """One settled Active row, as 0.9.2's ``Participant``."""

    channel_type: int
    role: Role | int
    kind: Kind | int
    pid: int
    pid_starttime: int
    created_at_ns: int
    shm_name: str
    topic_name: str
    node_name: str


@dataclass
class TopicSummary:
    """The rows of one shm name (C.3 list_topics), as 0.9.2's ``TopicSummary``."""

    shm_name: str
    topic_name: str
    channel_type: int
    kind: Kind | int
    producers: list[Participant] = field(default_factory=list)
    consumers: list[Participant] = field(default_factory=list)
    stall_producers: list[Participant] = field(default_factory=list)
    stall_consumers: list[Participant] = field(default_factory=list)


def _name_field(text: str, size: int) -> bytes:
    """UTF-8, cut to size - 1 bytes, NUL-padded to size."""
    data = text.encode("utf-8")[: size - 1]
    return data + bytes(size - len(data))


def _text(raw: bytes) -> str:
    return raw.split(b"\0", 1)[0].decode("utf-8", errors="replace")


class Registry:
    """One mapped registry region (C.1)."""

    def __init__(self, mapping: shm.Mapping, capacity: int, atomics: Atomics = HARDWARE) -> None:
        if not 0 < capacity <= (mapping.size - HEADER_SIZE) // ROW_SIZE:
            raise CorruptRegionError(
                f"Registry capacity exceeds segment on {mapping.name} (capacity {capacity}, {mapping.size} bytes mapped)"
            )
        self.mapping = mapping
        self.capacity = capacity
        self.atomics = atomics
        self.base = mapping.address

    @property
    def name(self) -> str:
        return self.mapping.name

    def row_address(self, row: int) -> int:
        return self.base + HEADER_SIZE + ROW_SIZE * row

    # -- C.1 Create / open --------------------------------------------------------------

    @classmethod
    def open_or_create(cls, namespace: str, capacity: int = DEFAULT_CAPACITY, atomics: Atomics = HARDWARE) -> "Registry":
        """Create exclusively (zeroed; version, capacity, then MAGIC with
        release), or open the existing one, which keeps its creator's capacity."""
        if capacity <= 0:
            raise ValueError(f"Registry capacity must be > 0 (got {capacity})")
        if capacity > 0xFFFFFFFF:
            raise ValueError(f"Registry capacity must fit 32 bits (got {capacity})")
        name = registry_shm_name(namespace)
        try:
            mapping = shm.create_exclusive(name, HEADER_SIZE + ROW_SIZE * capacity, shm_mode())
        except FileExistsError:
            return cls._open(name, atomics)
        atomics.store_relaxed_u32(mapping.address + VERSION_OFFSET, VERSION)
        atomics.store_relaxed_u32(mapping.address + CAPACITY_OFFSET, capacity)
        atomics.store_release_u64(mapping.address + MAGIC_OFFSET, MAGIC)
        return cls(mapping, capacity, atomics)

    @classmethod
    def try_open(cls, namespace: str, atomics: Atomics = HARDWARE) -> "Registry | None":
        """The namespace's registry, or None when there is none."""
        try:
            return cls._open(registry_shm_name(namespace), atomics)
        except shm.RegionNotFoundError:
            return None

    @classmethod
    def _open(cls, name: str, atomics: Atomics) -> "Registry":
        """Up to 200 × 10 ms until MAGIC (acquire); then version and capacity."""
        for _ in range(OPEN_ATTEMPTS):
            try:
                mapping: shm.Mapping | None = shm.open_existing(name)
            except shm.EmptyObjectError:
                mapping = None
            if mapping is not None and mapping.size >= HEADER_SIZE:
                magic = atomics.load_acquire_u64(mapping.address + MAGIC_OFFSET)
                if magic == MAGIC:
                    version = atomics.load_relaxed_u32(mapping.address + VERSION_OFFSET)
                    if version != VERSION:
                        raise VersionMismatchError(
                            f"Registry version mismatch on {name}: stamped by an incompatible kickmsg build "
                            f"(version {version}, this build speaks {VERSION}); stop its users and remove it with "
                            f"Registry.unlink()"
                        )
                    return cls(mapping, atomics.load_relaxed_u32(mapping.address + CAPACITY_OFFSET), atomics)
                if magic != 0:
                    raise CorruptRegionError(f"Registry {name} has a bad magic 0x{magic:016x} (not a kickmsg registry)")
            elif mapping is not None:
                raise CorruptRegionError(f"Registry {name} is {mapping.size} bytes, smaller than its {HEADER_SIZE}-byte header")
            time.sleep(OPEN_RETRY_S)  # the protocol's own poll (C.1)
        raise RegionInitTimeout(f"Timed out waiting for registry init: {name}")

    @staticmethod
    def unlink(namespace: str) -> None:
        shm.unlink(registry_shm_name(namespace))

    # -- C.3 Generation protocol --------------------------------------------------------

    def _open_generation(self, row: int) -> None:
        """Store (g + 1) | 1, relaxed: the row is being written (u32
        arithmetic, as the wheel's: a hostile 0xFFFFFFFF wraps to 1)."""
        address = self.row_address(row) + GENERATION_OFFSET
        ops = self.atomics
        ops.store_relaxed_u32(address, ((ops.load_relaxed_u32(address) + 1) | 1) & 0xFFFFFFFF)

    def _settle(self, row: int) -> None:
        """Store (g + 2) with bit 0 cleared, relaxed: the row is settled."""
        address = self.row_address(row) + GENERATION_OFFSET
        ops = self.atomics
        ops.store_relaxed_u32(address, ((ops.load_relaxed_u32(address) + 2) & ~1) & 0xFFFFFFFF)

    # -- C.3 Register ---------------------------------------------------------------------

    def register(
        self, channel_type: int, role: Role, kind: Kind, shm_name: str, topic_name: str, node_name: str
    ) -> int | None:
        """Claim a Free row for this process; its index, or None when the
        registry stays full after ``REGISTER_ATTEMPTS`` sweeps."""
        row = self._try_register(channel_type, role, kind, shm_name, topic_name, node_name)
        for _ in range(REGISTER_ATTEMPTS):
            if row is not None:
                return row
            self.sweep_stale()
            row = self._try_register(channel_type, role, kind, shm_name, topic_name, node_name)
        return row

    def _try_register(
        self, channel_type: int, role: Role, kind: Kind, shm_name: str, topic_name: str, node_name: str
    ) -> int | None:
        ops = self.atomics
        for row in range(self.capacity):
            address = self.row_address(row)
            # 1. claim: CAS(strong, acq_rel/relaxed) state Free → Claiming
            if ops.cas_acq_rel_u32(address + STATE_OFFSET, FREE, CLAIMING) != FREE:
                continue
            # 2. open generation; release fence
            self._open_generation(row)
            ops.fence_seq_cst()
            # 3. pid_starttime (relaxed) then pid (release)
            pid = os.getpid()
            ops.store_relaxed_u64(address + PID_STARTTIME_OFFSET, process_start_time(pid))
            ops.store_release_u64(address + PID_OFFSET, pid)
            # 4. channel_type, role, kind, created_at_ns (relaxed)
            ops.store_relaxed_u32(address + CHANNEL_TYPE_OFFSET, channel_type)
            ops.store_relaxed_u32(address + ROLE_OFFSET, int(role))
            ops.store_relaxed_u32(address + KIND_OFFSET, int(kind))
            ops.store_relaxed_u64(address + CREATED_AT_OFFSET, realtime_ns())
            # 5. zero-fill and copy the three names; zero the padding
            start = HEADER_SIZE + ROW_SIZE * row
            buffer = self.mapping.buffer
            buffer[start + SHM_NAME_OFFSET : start + SHM_NAME_OFFSET + SHM_NAME_SIZE] = _name_field(shm_name, SHM_NAME_SIZE)
            buffer[start + TOPIC_NAME_OFFSET : start + TOPIC_NAME_OFFSET + TOPIC_NAME_SIZE] = _name_field(
                topic_name, TOPIC_NAME_SIZE
            )
            buffer[start + NODE_NAME_OFFSET : start + NODE_NAME_OFFSET + NODE_NAME_SIZE] = _name_field(node_name, NODE_NAME_SIZE)
            ops.store_relaxed_u32(address + PADDING_OFFSET, 0)
            # 6. state = Active (release); release fence; settle
            ops.store_release_u32(address + STATE_OFFSET, ACTIVE)
            ops.fence_seq_cst()
            self._settle(row)
            return row
        return None

    # -- C.3 Deregister -------------------------------------------------------------------

    def deregister(self, row: int) -> None:
        """Give a row back (a no-op unless it is Active). The descriptive
        fields stay; pid and start time are cleared."""
        if not 0 <= row < self.capacity:
            raise IndexError(f"registry row {row} out of range (capacity {self.capacity})")
        ops = self.atomics
        address = self.row_address(row)
        # 1. CAS(strong, acq_rel/relaxed) Active → Reclaiming
        if ops.cas_acq_rel_u32(address + STATE_OFFSET, ACTIVE, RECLAIMING) != ACTIVE:
            return
        # 2. release fence; open generation; clear pid and start; settle
        ops.fence_seq_cst()
        self._open_generation(row)
        ops.store_relaxed_u64(address + PID_OFFSET, 0)
        ops.store_relaxed_u64(address + PID_STARTTIME_OFFSET, 0)
        self._settle(row)
        # 3. release fence; CAS Reclaiming → Free (release)
        ops.fence_seq_cst()
        ops.cas_release_u32(address + STATE_OFFSET, RECLAIMING, FREE)

    # -- C.3 Snapshot ----------------------------------------------------------------------

    def snapshot(self) -> list[Participant]:
        """Every settled Active row (whatever its process's liveness)."""
        ops = self.atomics
        rows = []
        for row in range(self.capacity):
            address = self.row_address(row)
            # 1. state (acq) Active, generation g1 (acq) even
            if ops.load_acquire_u32(address + STATE_OFFSET) != ACTIVE:
                continue
            g1 = ops.load_acquire_u32(address + GENERATION_OFFSET)
            if g1 & 1:
                continue
            # 2. copy the fields (relaxed) and the names up to NUL
            start = HEADER_SIZE + ROW_SIZE * row
            buffer = self.mapping.buffer
            participant = Participant(
                channel_type=ops.load_relaxed_u32(address + CHANNEL_TYPE_OFFSET),
                role=_role(ops.load_relaxed_u32(address + ROLE_OFFSET)),
                kind=_kind(ops.load_relaxed_u32(address + KIND_OFFSET)),
                pid=ops.load_relaxed_u64(address + PID_OFFSET),
                pid_starttime=ops.load_relaxed_u64(address + PID_STARTTIME_OFFSET),
                created_at_ns=ops.load_relaxed_u64(address + CREATED_AT_OFFSET),
                shm_name=_text(bytes(buffer[start + SHM_NAME_OFFSET : start + SHM_NAME_OFFSET + SHM_NAME_SIZE])),
                topic_name=_text(bytes(buffer[start + TOPIC_NAME_OFFSET : start + TOPIC_NAME_OFFSET + TOPIC_NAME_SIZE])),
                node_name=_text(bytes(buffer[start + NODE_NAME_OFFSET : start + NODE_NAME_OFFSET + NODE_NAME_SIZE])),
            )
            # 3. acquire fence; keep the row only if still Active with generation g1
            ops.fence_seq_cst()
            if ops.load_acquire_u32(address + GENERATION_OFFSET) == g1 and ops.load_acquire_u32(address + STATE_OFFSET) == ACTIVE:
                rows.append(participant)
        return rows

    # -- C.3 Sweep ---------------------------------------------------------------------------

    def sweep_stale(self) -> int:
        """Free the settled rows whose process is provably dead; their count.
        Odd or Reclaiming rows are never touched."""
        ops = self.atomics
        freed = 0
        for row in range(self.capacity):
            address = self.row_address(row)
            # 1. Active or Claiming, g1 even; pid (acq), start (relaxed); acquire fence; g unchanged
            if ops.load_acquire_u32(address + STATE_OFFSET) not in (ACTIVE, CLAIMING):
                continue
            g1 = ops.load_acquire_u32(address + GENERATION_OFFSET)
            if g1 & 1:
                continue
            pid = ops.load_acquire_u64(address + PID_OFFSET)
            start = ops.load_relaxed_u64(address + PID_STARTTIME_OFFSET)
            ops.fence_seq_cst()
            if ops.load_acquire_u32(address + GENERATION_OFFSET) != g1:
                continue
            # 2. pid ≠ 0 and its owner provably dead (B.16)
            if pid == 0 or not owner_is_dead(pid, start):
                continue
            # 3. acquire tenancy: CAS(strong, acq_rel/relaxed) generation g1 → g1 + 1
            if ops.cas_acq_rel_u32(address + GENERATION_OFFSET, g1, g1 + 1) != g1:
                continue
            # 4. state = Reclaiming (release); release fence; clear pid and start; settle
            ops.store_release_u32(address + STATE_OFFSET, RECLAIMING)
            ops.fence_seq_cst()
            ops.store_relaxed_u64(address + PID_OFFSET, 0)
            ops.store_relaxed_u64(address + PID_STARTTIME_OFFSET, 0)
            self._settle(row)
            # 5. release fence; CAS Reclaiming → Free (release); count
            ops.fence_seq_cst()
            ops.cas_release_u32(address + STATE_OFFSET, RECLAIMING, FREE)
            freed += 1
        return freed

    # -- C.3 list_topics ------------------------------------------------------------------------

    def list_topics(self) -> list[TopicSummary]:
        """The snapshot grouped by shm name (its first row names the topic),
        rows of vanished pids in the stall lists; sorted by shm name."""
        topics: dict[str, TopicSummary] = {}
        for participant in self.snapshot():
            summary = topics.get(participant.shm_name)
            if summary is None:
                summary = TopicSummary(participant.shm_name, participant.topic_name, participant.channel_type, participant.kind)
                topics[participant.shm_name] = summary
            alive = process_exists(participant.pid)
            if participant.role in (Role.Publisher, Role.Both):
                (summary.producers if alive else summary.stall_producers).append(participant)
            if participant.role in (Role.Subscriber, Role.Both):
                (summary.consumers if alive else summary.stall_consumers).append(participant)
        return [topics[name] for name in sorted(topics)]

    def __repr__(self) -> str:
        return f"Registry(name={self.name!r}, capacity={self.capacity})"


# -- C.4 Who registers what -------------------------------------------------------------------

CHANNEL_OF_KIND = {Kind.Pubsub: CHANNEL_PUBSUB, Kind.Broadcast: CHANNEL_BROADCAST, Kind.Mailbox: CHANNEL_PUBSUB, Kind.Blackboard: CHANNEL_NONE}


class NodeRows:
    """A Node's rows in its namespace's registry (C.4): at most one per shm
    name, upgraded to Both when the complementary role registers, all given
    back by ``deregister_all``. The registry is opened on the first
    registration; any registry failure latches registration off for this
    Node with one line on stderr, and a full registry gives one warning.

    A Node calls ``register(shm_name, topic, kind, role)`` for advertise
    (Pubsub, Publisher), subscribe (Pubsub, Subscriber), join_broadcast
    (Broadcast, Both), create_mailbox (Mailbox, Subscriber), open_mailbox
    (Mailbox, Publisher) and blackboard (Blackboard, Both, topic "/" + raw
    name); topic paths get a leading '/' here when missing.
    """

    def __init__(self, namespace: str, node_name: str, atomics: Atomics = HARDWARE) -> None:
        self.namespace = namespace
        self.node_name = node_name
        self.atomics = atomics
        self.registry: Registry | None = None
        self.rows: dict[str, tuple[int, Role]] = {}  # shm name → (row, role)
        self.disabled = False  # latched by a registry failure
        self.warned_full = False

    def register(self, shm_name: str, topic: str, kind: Kind, role: Role) -> None:
        if self.disabled:
            return
        try:
            if self.registry is None:
                self.registry = Registry.open_or_create(self.namespace, atomics=self.atomics)
            self._register(self.registry, shm_name, topic if topic.startswith("/") else "/" + topic, kind, role)
        except (OSError, RuntimeError, ValueError) as error:
            self.disabled = True
            print(f"kickmsg: participant registry disabled for node '{self.node_name}': {error}", file=sys.stderr)

    def _register(self, registry: Registry, shm_name: str, topic: str, kind: Kind, role: Role) -> None:
        held = self.rows.get(shm_name)
        if held is not None:
            row, held_role = held
            if held_role in (role, Role.Both):
                return
            # the Both upgrade: deregister, register again with Both, else the previous role
            registry.deregister(row)
            del self.rows[shm_name]
            for wanted in (Role.Both, held_role):
                new_row = registry.register(CHANNEL_OF_KIND[kind], wanted, kind, shm_name, topic, self.node_name)
                if new_row is not None:
                    self.rows[shm_name] = (new_row, wanted)
                    return
            self._warn_full(registry)
            return
        new_row = registry.register(CHANNEL_OF_KIND[kind], role, kind, shm_name, topic, self.node_name)
        if new_row is None:
            self._warn_full(registry)
        else:
            self.rows[shm_name] = (new_row, role)

    def _warn_full(self, registry: Registry) -> None:
        if not self.warned_full:
            self.warned_full = True
            print(
                f"kickmsg: participant registry {registry.name} is full ({registry.capacity} rows); "
                f"node '{self.node_name}' is not listed there",
                file=sys.stderr,
            )

    def deregister_all(self) -> None:
        """Give back every row (when the Node is destroyed)."""
        if self.registry is not None:
            for row, _ in self.rows.values():
                self.registry.deregister(row)
        self.rows.clear()
