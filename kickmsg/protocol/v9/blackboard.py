"""The Blackboard, region version 2 (WIRE9.md section D): a shared-memory
key/value store of state, ``/{namespace}_bb_{name}``, byte-compatible with
native ``kickmsg==0.9.2``.

One writer owns a key (``declare`` → ``BlackboardWriter``); any number of
readers (``observe`` → ``BlackboardReader``) read its latest value, stamp and
update count. Each key has two value cells: write number k goes into cell
k & 1, the one readers of write k − 1 are not on, and ``publish`` (2k, odd
while writing) lets a reader detect an overtaken copy (D.9, D.10). Declare,
release and sweep run under the board lock (D.7), whose token names its
holder so that a dead holder's lock is taken over. ``change_seq`` counts
changes and is the futex word readers sleep on (D.14).

Every word D names as atomic goes through ``kickmsg.atomics``, except value
and key bytes, copied as plain bytes: a torn copy is caught by the publish /
tenancy re-check and retried, and the bytes stored are the same (the last
partial word of a value is zero-filled as 0.9.2 writes it). atomics.py has no
release or acquire fence: the seq_cst fence stands in for both. The region is
untrusted: its geometry is validated once and copied, every length read from
it is bounded.
"""
import atexit
import errno
import os
import time
import weakref
from dataclasses import dataclass
from datetime import timedelta

from kickmsg import shm
from kickmsg.atomics import FUTEX_TIMED_OUT, HARDWARE, Atomics
from kickmsg.errors import BoardBusyError, BoardKeyOwnedError, CapacityError, ConfigMismatchError
from kickmsg.hash import fnv1a_64
from kickmsg.protocol.v9.layout import (
    U32_MAX,
    U64_MAX,
    CorruptRegionError,
    VersionMismatchError,
    align64,
    blackboard_identity,
    blackboard_shm_name,
    realtime_ns,
    shm_mode,
)
from kickmsg.protocol.v9.region import OPEN_ATTEMPTS, OPEN_RETRY_S, RegionInitTimeout
from kickmsg.protocol.v9.liveness import owner_is_dead, process_start_time

__all__ = [
    "ACTIVE", "Blackboard", "BlackboardConfig", "BlackboardReader", "BlackboardWriter", "BoardGeometry",
    "CAPACITY_OFFSET", "CELL_HEADER_SIZE", "CELL_UPDATED_AT_OFFSET", "CELL_VALUE_LEN_OFFSET", "CHANGE_SEQ_OFFSET",
    "CLAIMING", "CONFIG_HASH_OFFSET", "CREATED_AT_OFFSET", "CREATOR_PID_OFFSET", "DECLARED_AT_OFFSET",
    "DEFAULT_CAPACITY", "DEFAULT_MAX_VALUE_SIZE", "ENTRY_SIZE", "FREE", "HEADER_SIZE", "IDENTITY_OFFSET",
    "KEY_HASH_OFFSET", "KEY_MAX", "KEY_OFFSET", "KeyStatus", "LOCK_SECONDS_RELEASE", "LOCK_TOKEN_OFFSET",
    "LOCK_TRIES_DECLARE", "LOCK_TRIES_SNAPSHOT", "MAGIC", "MAGIC_OFFSET", "MAX_CAPACITY", "MAX_VALUE_SIZE",
    "MAX_VALUE_SIZE_OFFSET", "NODE_NAME_MAX", "OWNER_NODE_OFFSET", "OWNER_PID_OFFSET", "OWNER_STARTTIME_OFFSET",
    "PUBLISH_OFFSET", "READ_RETRY_BUDGET", "ReadOutcome", "STATE_OFFSET", "TENANCY_OFFSET", "TOTAL_SIZE_OFFSET",
    "VERSION", "VERSION_OFFSET", "WAITERS_OFFSET", "lock_holder_is_dead", "lock_token",
]

# -- D.1 Constants ----------------------------------------------------------------------

MAGIC = 0x214B4C424B43494B  # "KICKBLK!", stored last (release)
VERSION = 2
KEY_MAX = 128  # keys of 1..127 bytes
NODE_NAME_MAX = 64
DEFAULT_CAPACITY = 256
MAX_CAPACITY = 65_536
DEFAULT_MAX_VALUE_SIZE = 1008
MAX_VALUE_SIZE = 1 << 20
READ_RETRY_BUDGET = 64
LOCK_TRIES_DECLARE = 4096  # D.7 budgets: declare and sweep...
LOCK_TRIES_SNAPSHOT = 1024  # ...snapshot...
LOCK_SECONDS_RELEASE = 2.0  # ...and release (wall clock)

# -- D.2 Header (192 bytes) ---------------------------------------------------------------

HEADER_SIZE = 192
MAGIC_OFFSET = 0
VERSION_OFFSET = 8
CAPACITY_OFFSET = 12
MAX_VALUE_SIZE_OFFSET = 16
TOTAL_SIZE_OFFSET = 24
CONFIG_HASH_OFFSET = 32
IDENTITY_OFFSET = 40
CREATOR_PID_OFFSET = 48
CREATED_AT_OFFSET = 56
CHANGE_SEQ_OFFSET = 64
WAITERS_OFFSET = 72
LOCK_TOKEN_OFFSET = 128

# -- D.3 Entry (384 bytes) ----------------------------------------------------------------

ENTRY_SIZE = 384
FREE = 0
CLAIMING = 1
ACTIVE = 2
STATE_OFFSET = 0
PUBLISH_OFFSET = 8
TENANCY_OFFSET = 16
OWNER_PID_OFFSET = 24
OWNER_STARTTIME_OFFSET = 32
KEY_HASH_OFFSET = 40
DECLARED_AT_OFFSET = 48
KEY_OFFSET = 64
OWNER_NODE_OFFSET = 192

# -- D.4 Value cells ----------------------------------------------------------------------

CELL_HEADER_SIZE = 16
CELL_UPDATED_AT_OFFSET = 0
CELL_VALUE_LEN_OFFSET = 8


@dataclass
class BlackboardConfig:
    """As 0.9.2's: fields may be assigned one by one."""

    capacity: int = DEFAULT_CAPACITY
    max_value_size: int = DEFAULT_MAX_VALUE_SIZE
    identity: int = 0  # 0: derived from (namespace, name)

    def config_hash(self) -> int:
        """D.5: FNV-1a of capacity (4 LE bytes) then max_value_size (8 LE bytes)."""
        return fnv1a_64(self.capacity.to_bytes(4, "little") + self.max_value_size.to_bytes(8, "little"))


@dataclass(frozen=True)
class BoardGeometry:
    """The validated geometry every address is computed from (D.6)."""

    capacity: int
    max_value_size: int
    stride: int
    values_offset: int
    total_size: int

    @classmethod
    def of(cls, capacity: int, max_value_size: int) -> "BoardGeometry":
        stride = align64(CELL_HEADER_SIZE + max_value_size)
        values_offset = HEADER_SIZE + ENTRY_SIZE * capacity
        return cls(capacity, max_value_size, stride, values_offset, values_offset + 2 * capacity * stride)


@dataclass(frozen=True)
class ReadOutcome:
    """0.9.2's ReadOutcome: errno 0 (true) with the value, else the reason."""

    errno: int
    data: bytes = b""
    updated_at_ns: int = 0
    update_count: int = 0

    @property
    def error(self) -> str:
        return os.strerror(self.errno)

    def __bool__(self) -> bool:
        return self.errno == 0

    def __len__(self) -> int:
        return len(self.data)


@dataclass(frozen=True)
class KeyStatus:
    """One Active key (D.15 snapshot), as 0.9.2's KeyStatus."""

    key: str
    value_len: int
    updated_at_ns: int
    update_count: int
    owner_pid: int
    owner_node: str
    owner_alive: bool


def lock_token(pid: int, start_time: int) -> int:
    """D.5: (FNV-1a of the start time as 8 LE bytes) >> 32, 0 → 1, above pid's low 32 bits."""
    fingerprint = (fnv1a_64(start_time.to_bytes(8, "little")) >> 32) or 1
    return (fingerprint << 32) | (pid & U32_MAX)


def lock_holder_is_dead(token: int) -> bool:
    """D.7: the pid of the token's low 32 bits is gone, a zombie, or now
    another process (its current start time gives another token); a start
    time of 0 (unknown) means alive."""
    pid = token & U32_MAX
    if owner_is_dead(pid, 0):  # gone or a zombie (pid-only verdict otherwise)
        return True
    start = process_start_time(pid)
    return start != 0 and lock_token(pid, start) != token


def _key_bytes(key: str) -> bytes:
    """D.8 step 1: 1..127 bytes."""
    data = key.encode("utf-8")
    if not data:
        raise ValueError("Blackboard key must not be empty")
    if len(data) >= KEY_MAX:
        raise ValueError(f"Blackboard key exceeds KEY_MAX ({len(data)} bytes, at most {KEY_MAX - 1}): {key!r}")
    return data


def _key_hash(data: bytes) -> int:
    return fnv1a_64(data) or 1


def _padded(data: bytes, size: int) -> bytes:
    return data[:size] + bytes(max(0, size - len(data)))


class Blackboard:
    """One mapped board and its validated geometry."""

    def __init__(self, mapping: shm.Mapping, geometry: BoardGeometry, owner_name: str, atomics: Atomics = HARDWARE) -> None:
        if mapping.size < geometry.total_size:
            raise CorruptRegionError(f"{mapping.name}: mapping of {mapping.size} bytes < total_size {geometry.total_size}")
        self.mapping = mapping
        self.geometry = geometry
        self.owner_name = owner_name
        self.atomics = atomics
        self.base = mapping.address
        self._pid = 0  # whose start time is cached (a forked child re-reads its own)
        self._start_time = 0

    def owner(self) -> tuple[int, int]:
        """This process's pid and start time: what it stamps as an owner."""
        pid = os.getpid()
        if pid != self._pid:
            self._pid, self._start_time = pid, process_start_time(pid)
        return self._pid, self._start_time

    @property
    def name(self) -> str:
        return self.mapping.name

    @property
    def capacity(self) -> int:
        return self.geometry.capacity

    @property
    def max_value_size(self) -> int:
        return self.geometry.max_value_size

    def creator_pid(self) -> int:
        """The header's creator pid (relaxed: written before MAGIC's release), for the tools."""
        return self.atomics.load_relaxed_u64(self.base + CREATOR_PID_OFFSET)

    @staticmethod
    def shm_name(namespace: str, name: str) -> str:
        return blackboard_shm_name(namespace, name)

    @staticmethod
    def unlink(namespace: str, name: str) -> None:
        shm.unlink(blackboard_shm_name(namespace, name))

    def entry_address(self, index: int) -> int:
        return self.base + HEADER_SIZE + ENTRY_SIZE * index

    def cell_offset(self, index: int, write_number: int) -> int:
        """D.4: cell 2i + (k & 1)."""
        g = self.geometry
        return g.values_offset + (2 * index + (write_number & 1)) * g.stride

    # -- D.6 Open / create ------------------------------------------------------------------

    @classmethod
    def open_or_create(
        cls, namespace: str, name: str, config: BlackboardConfig | None = None, owner_name: str = "",
        atomics: Atomics = HARDWARE,
    ) -> "Blackboard":
        """Create the board of (namespace, name), or open it: the existing
        one must have this config and identity (D.6)."""
        config = BlackboardConfig() if config is None else config
        for field in ("capacity", "max_value_size", "identity"):
            value = getattr(config, field)
            if not isinstance(value, int) or isinstance(value, bool):
                raise TypeError(f"BlackboardConfig.{field} must be an int, got {value!r}")
        if not 1 <= config.capacity <= MAX_CAPACITY:
            raise ValueError(f"Blackboard capacity out of range: {config.capacity} (1..{MAX_CAPACITY})")
        if not 1 <= config.max_value_size <= MAX_VALUE_SIZE:
            raise ValueError(f"Blackboard max_value_size out of range: {config.max_value_size} (1..{MAX_VALUE_SIZE})")
        shm_name = blackboard_shm_name(namespace, name)
        identity = config.identity or blackboard_identity(namespace, name)
        geometry = BoardGeometry.of(config.capacity, config.max_value_size)
        try:
            mapping = shm.create_exclusive(shm_name, geometry.total_size, shm_mode())
        except FileExistsError:
            return cls._open(shm_name, identity, config.config_hash(), owner_name, atomics, never_initialised="Timed out waiting for blackboard init")
        # exclusive create: (zeroed) version, capacity, max_value_size, total_size,
        # config_hash, identity, creator_pid, created_at_ns, then MAGIC (release)
        base = mapping.address
        atomics.store_relaxed_u32(base + VERSION_OFFSET, VERSION)
        atomics.store_relaxed_u32(base + CAPACITY_OFFSET, config.capacity)
        atomics.store_relaxed_u64(base + MAX_VALUE_SIZE_OFFSET, config.max_value_size)
        atomics.store_relaxed_u64(base + TOTAL_SIZE_OFFSET, geometry.total_size)
        atomics.store_relaxed_u64(base + CONFIG_HASH_OFFSET, config.config_hash())
        atomics.store_relaxed_u64(base + IDENTITY_OFFSET, identity)
        atomics.store_relaxed_u64(base + CREATOR_PID_OFFSET, os.getpid())
        atomics.store_relaxed_u64(base + CREATED_AT_OFFSET, realtime_ns())
        atomics.store_release_u64(base + MAGIC_OFFSET, MAGIC)
        return cls(mapping, geometry, owner_name, atomics)

    @classmethod
    def try_open(cls, namespace: str, name: str, atomics: Atomics = HARDWARE) -> "Blackboard | None":
        """The existing board, or None when there is none (any config; the derived identity)."""
        shm_name = blackboard_shm_name(namespace, name)
        try:
            return cls._open(
                shm_name, blackboard_identity(namespace, name), 0, "", atomics,
                never_initialised="Blackboard region exists but was never initialized",
            )
        except shm.RegionNotFoundError:
            return None

    @classmethod
    def _open(
        cls, name: str, identity: int, config_hash: int, owner_name: str, atomics: Atomics, never_initialised: str
    ) -> "Blackboard":
        """Up to 200 × 10 ms until MAGIC (acquire), then validate (D.6);
        ``config_hash`` 0 accepts any config."""
        for _ in range(OPEN_ATTEMPTS):
            try:
                mapping: shm.Mapping | None = shm.open_existing(name)
            except shm.EmptyObjectError:
                mapping = None
            if mapping is not None:
                if mapping.size < HEADER_SIZE:
                    raise CorruptRegionError(f"Blackboard segment too small: {name} is {mapping.size} bytes (header {HEADER_SIZE})")
                magic = atomics.load_acquire_u64(mapping.address + MAGIC_OFFSET)
                if magic == MAGIC:
                    return cls(mapping, cls._validate(mapping, identity, config_hash, atomics), owner_name, atomics)
                if magic != 0:
                    raise CorruptRegionError(f"Blackboard {name} has a bad magic 0x{magic:016x} (not a kickmsg blackboard)")
            time.sleep(OPEN_RETRY_S)  # the protocol's own poll (D.6)
        raise RegionInitTimeout(f"{never_initialised}: {name}")

    @staticmethod
    def _validate(mapping: shm.Mapping, identity: int, config_hash: int, atomics: Atomics) -> BoardGeometry:
        name = mapping.name
        base = mapping.address
        version = atomics.load_relaxed_u32(base + VERSION_OFFSET)
        if version != VERSION:
            raise VersionMismatchError(
                f"Blackboard version mismatch on {name}: stamped by an incompatible kickmsg build "
                f"(version {version}, this build speaks {VERSION}); stop its users and unlink it"
            )
        total_size = atomics.load_relaxed_u64(base + TOTAL_SIZE_OFFSET)
        if not HEADER_SIZE <= total_size <= mapping.size:
            raise CorruptRegionError(f"Blackboard total_size {total_size} does not fit the {mapping.size}-byte segment {name}")
        capacity = atomics.load_relaxed_u32(base + CAPACITY_OFFSET)
        if not 1 <= capacity <= MAX_CAPACITY:
            raise CorruptRegionError(f"Blackboard capacity {capacity} out of range (1..{MAX_CAPACITY}) on {name}")
        max_value_size = atomics.load_relaxed_u64(base + MAX_VALUE_SIZE_OFFSET)
        if not 1 <= max_value_size <= MAX_VALUE_SIZE:
            raise CorruptRegionError(f"Blackboard max_value_size {max_value_size} out of range (1..{MAX_VALUE_SIZE}) on {name}")
        geometry = BoardGeometry.of(capacity, max_value_size)
        if geometry.total_size > total_size:
            raise CorruptRegionError(
                f"Blackboard value area does not fit on {name}: capacity {capacity} × max_value_size {max_value_size} "
                f"needs {geometry.total_size} bytes, total_size is {total_size}"
            )
        stamped_hash = atomics.load_relaxed_u64(base + CONFIG_HASH_OFFSET)
        if config_hash and stamped_hash != config_hash:
            raise ConfigMismatchError(
                f"Blackboard config mismatch on {name} (capacity {capacity}, max_value_size {max_value_size}; "
                f"config_hash 0x{stamped_hash:016x}, ours 0x{config_hash:016x})"
            )
        stamped_identity = atomics.load_relaxed_u64(base + IDENTITY_OFFSET)
        if identity and stamped_identity and identity != stamped_identity:
            raise ConfigMismatchError(
                f"Blackboard identity mismatch on {name} (stamped 0x{stamped_identity:016x}, expected 0x{identity:016x})"
            )
        return geometry

    # -- D.7 Board lock -----------------------------------------------------------------------

    def _lock(self, tries: int = LOCK_TRIES_DECLARE, seconds: float | None = None) -> bool:
        """Take the board lock within ``tries`` (or ``seconds``), yielding
        between tries; a provably dead holder's token is replaced by ours
        directly, then every entry is normalised."""
        ops = self.atomics
        address = self.base + LOCK_TOKEN_OFFSET
        deadline = None if seconds is None else time.monotonic() + seconds
        mine = lock_token(*self.owner())
        attempt = 0
        while True:
            token = ops.load_acquire_u64(address)
            if token == 0:
                if ops.cas_acq_rel_u64(address, 0, mine) == 0:
                    return True
            elif lock_holder_is_dead(token):
                if ops.cas_acq_rel_u64(address, token, mine) == token:
                    for index in range(self.capacity):
                        self._normalise(index)
                    return True
            attempt += 1
            if (deadline is None and attempt >= tries) or (deadline is not None and time.monotonic() >= deadline):
                return False
            os.sched_yield()

    def _unlock(self) -> None:
        self.atomics.store_release_u64(self.base + LOCK_TOKEN_OFFSET, 0)

    def _clear_identity(self, entry: int) -> None:
        ops = self.atomics
        ops.store_relaxed_u64(entry + KEY_HASH_OFFSET, 0)
        ops.store_relaxed_u64(entry + OWNER_PID_OFFSET, 0)
        ops.store_relaxed_u64(entry + OWNER_STARTTIME_OFFSET, 0)

    def _normalise(self, index: int) -> bool:
        """D.7: a Claiming entry, or an Active one without key hash, becomes
        Free without identity; a Free one loses a leftover identity. Whether
        anything changed."""
        ops = self.atomics
        entry = self.entry_address(index)
        state = ops.load_acquire_u32(entry + STATE_OFFSET)
        key_hash = ops.load_relaxed_u64(entry + KEY_HASH_OFFSET)
        if state == CLAIMING or (state == ACTIVE and key_hash == 0):
            self._clear_identity(entry)
            ops.store_release_u32(entry + STATE_OFFSET, FREE)
            return True
        if state == FREE and (key_hash or ops.load_relaxed_u64(entry + OWNER_PID_OFFSET) or ops.load_relaxed_u64(entry + OWNER_STARTTIME_OFFSET)):
            self._clear_identity(entry)
            return True
        return False

    # -- D.8 Declare ----------------------------------------------------------------------------

    def declare(self, key: str, owner_node: str | None = None) -> "BlackboardWriter":
        """Own ``key``: take over a dead or released owner's entry (its value
        kept) or claim a Free one."""
        # 1. key 1..127 bytes; owner_node defaults to the board's owner name
        data = _key_bytes(key)
        node = (self.owner_name if owner_node is None else owner_node).encode("utf-8")
        # 2. the board lock
        if not self._lock():
            raise BoardBusyError(f"Blackboard is busy: could not take the board lock ({self.name}, key {key!r})")
        try:
            index = self._take_over(key, data, node)
            if index is None:
                index = self._claim_free(data, node)
            if index is None:
                self._sweep_locked()  # 4. none free: sweep under the lock and retry once
                index = self._claim_free(data, node)
            if index is None:
                raise CapacityError(f"Blackboard is at capacity ({self.capacity} keys) on {self.name}: cannot declare {key!r}")
            # the writer's tenancy, and its count continuing the kept value's
            entry = self.entry_address(index)
            writer = BlackboardWriter(
                self, key, index, self.atomics.load_acquire_u64(entry + TENANCY_OFFSET),
                self.atomics.load_relaxed_u64(entry + PUBLISH_OFFSET) >> 1,
            )
        finally:
            self._unlock()
        self._notify()
        return writer

    def _find_active(self, data: bytes) -> int | None:
        """The Active entry holding this key text (hash as a pre-filter)."""
        ops = self.atomics
        wanted_hash = _key_hash(data)
        wanted = _padded(data, KEY_MAX)
        for index in range(self.capacity):
            entry = self.entry_address(index)
            if ops.load_acquire_u32(entry + STATE_OFFSET) != ACTIVE:
                continue
            if ops.load_relaxed_u64(entry + KEY_HASH_OFFSET) != wanted_hash:
                continue
            if self._key_text(index) == wanted:
                return index
        return None

    def _key_text(self, index: int) -> bytes:
        start = HEADER_SIZE + ENTRY_SIZE * index + KEY_OFFSET
        return bytes(self.mapping.buffer[start : start + KEY_MAX])

    def _write_owner_node(self, index: int, node: bytes) -> None:
        start = HEADER_SIZE + ENTRY_SIZE * index + OWNER_NODE_OFFSET
        self.mapping.buffer[start : start + NODE_NAME_MAX] = _padded(node, NODE_NAME_MAX)

    def _take_over(self, key: str, data: bytes, node: bytes) -> int | None:
        """D.8 step 3, pass 1: the Active entry of this key, if its owner is not alive."""
        index = self._find_active(data)
        if index is None:
            return None
        ops = self.atomics
        entry = self.entry_address(index)
        pid = ops.load_acquire_u64(entry + OWNER_PID_OFFSET)
        if pid != 0 and not owner_is_dead(pid, ops.load_relaxed_u64(entry + OWNER_STARTTIME_OFFSET)):
            raise BoardKeyOwnedError(f"Blackboard key already owned by a live process: {key} (pid {pid}, board {self.name})")
        # owner_node, owner_starttime (relaxed), owner_pid (release), tenancy + 1 (release); publish and value kept
        self._write_owner_node(index, node)
        pid, start_time = self.owner()
        ops.store_relaxed_u64(entry + OWNER_STARTTIME_OFFSET, start_time)
        ops.store_release_u64(entry + OWNER_PID_OFFSET, pid)
        ops.fetch_add_release_u64(entry + TENANCY_OFFSET, 1)
        return index

    def _claim_free(self, data: bytes, node: bytes) -> int | None:
        """D.8 step 4, pass 2: the first Free entry."""
        ops = self.atomics
        for index in range(self.capacity):
            entry = self.entry_address(index)
            if ops.load_acquire_u32(entry + STATE_OFFSET) != FREE:
                continue
            # state = Claiming (release); publish = 0; key; owner_node; declared_at_ns
            ops.store_release_u32(entry + STATE_OFFSET, CLAIMING)
            ops.store_relaxed_u64(entry + PUBLISH_OFFSET, 0)
            start = HEADER_SIZE + ENTRY_SIZE * index + KEY_OFFSET
            self.mapping.buffer[start : start + KEY_MAX] = _padded(data, KEY_MAX)
            self._write_owner_node(index, node)
            ops.store_relaxed_u64(entry + DECLARED_AT_OFFSET, time.monotonic_ns())
            # owner_starttime, owner_pid, key_hash (relaxed); tenancy + 1 (release); Active (release)
            pid, start_time = self.owner()
            ops.store_relaxed_u64(entry + OWNER_STARTTIME_OFFSET, start_time)
            ops.store_relaxed_u64(entry + OWNER_PID_OFFSET, pid)
            ops.store_relaxed_u64(entry + KEY_HASH_OFFSET, _key_hash(data))
            ops.fetch_add_release_u64(entry + TENANCY_OFFSET, 1)
            ops.store_release_u32(entry + STATE_OFFSET, ACTIVE)
            return index
        return None

    # -- D.10 / D.11 Read -------------------------------------------------------------------------

    def observe(self, key: str) -> "BlackboardReader":
        """A reader of ``key``; it never creates it (ENOENT until declared)."""
        return BlackboardReader(self, key, _key_bytes(key))

    def _read_cell(self, index: int, tenancy: int) -> ReadOutcome | None:
        """One try of D.10 on a resolved entry: the outcome, or None to retry."""
        ops = self.atomics
        entry = self.entry_address(index)
        # t1 = tenancy (acq) must be the cached one; v1 = publish (acq); k = v1 >> 1
        t1 = ops.load_acquire_u64(entry + TENANCY_OFFSET)
        if t1 != tenancy:
            return None
        v1 = ops.load_acquire_u64(entry + PUBLISH_OFFSET)
        k = v1 >> 1
        if k == 0:
            return ReadOutcome(errno.ENOMSG)
        # cell (k & 1): len bounded by max_value_size; copy; stamp; acquire fence
        cell = self.cell_offset(index, k)
        length = min(ops.load_relaxed_u32(self.base + cell + CELL_VALUE_LEN_OFFSET), self.max_value_size)
        data = bytes(self.mapping.buffer[cell + CELL_HEADER_SIZE : cell + CELL_HEADER_SIZE + length])
        stamp = ops.load_relaxed_u64(self.base + cell + CELL_UPDATED_AT_OFFSET)
        ops.fence_seq_cst()
        # v2, t2 (acq): same tenancy, and the cell not rewritten (v2 − (v1 & ~1) < 3)
        v2 = ops.load_acquire_u64(entry + PUBLISH_OFFSET)
        t2 = ops.load_acquire_u64(entry + TENANCY_OFFSET)
        if t2 != t1 or v2 - (v1 & ~1) >= 3:
            return None
        return ReadOutcome(0, data, stamp, k)

    # -- D.12 Release ------------------------------------------------------------------------------

    def _release(self, index: int, tenancy: int) -> bool:
        """Give the key up, value kept; False when the lock stayed busy for 2 s."""
        if not self._lock(seconds=LOCK_SECONDS_RELEASE):
            return False
        ops = self.atomics
        entry = self.entry_address(index)
        changed = False
        try:
            if ops.load_acquire_u32(entry + STATE_OFFSET) == ACTIVE and ops.load_acquire_u64(entry + TENANCY_OFFSET) == tenancy:
                # pid first, so no one sees a live pid with a zero start
                ops.store_relaxed_u64(entry + OWNER_PID_OFFSET, 0)
                ops.store_relaxed_u64(entry + OWNER_STARTTIME_OFFSET, 0)
                ops.fetch_add_release_u64(entry + TENANCY_OFFSET, 1)
                changed = True
        finally:
            self._unlock()
        if changed:
            self._notify()
        return True

    # -- D.13 Sweep ---------------------------------------------------------------------------------

    def sweep_stale(self) -> int:
        """Free the keys of provably dead owners (their values destroyed) and
        entries left mid-operation; the count (0 when the lock stays busy)."""
        if not self._lock():
            return 0
        try:
            count = self._sweep_locked()
        finally:
            self._unlock()
        if count:
            self._notify()
        return count

    def _sweep_locked(self) -> int:
        ops = self.atomics
        count = 0
        for index in range(self.capacity):
            if self._normalise(index):
                count += 1
                continue
            entry = self.entry_address(index)
            if ops.load_acquire_u32(entry + STATE_OFFSET) != ACTIVE:
                continue
            pid = ops.load_acquire_u64(entry + OWNER_PID_OFFSET)
            if pid == 0 or not owner_is_dead(pid, ops.load_relaxed_u64(entry + OWNER_STARTTIME_OFFSET)):
                continue  # released keys (pid 0) are not residue
            ops.fetch_add_relaxed_u64(entry + TENANCY_OFFSET, 1)
            self._clear_identity(entry)
            ops.store_release_u32(entry + STATE_OFFSET, FREE)
            count += 1
        return count

    # -- D.14 Change notification -------------------------------------------------------------------

    def _notify(self) -> None:
        """change_seq + 1 (release); sc fence; wake every futex waiter if any."""
        ops = self.atomics
        ops.fetch_add_release_u64(self.base + CHANGE_SEQ_OFFSET, 1)
        ops.fence_seq_cst()
        if ops.load_relaxed_u64(self.base + WAITERS_OFFSET) != 0:
            ops.futex_wake_all(self.base + CHANGE_SEQ_OFFSET)

    @property
    def change_seq(self) -> int:
        return self.atomics.load_acquire_u64(self.base + CHANGE_SEQ_OFFSET)

    def wait(self, last_seen: int, timeout: float | timedelta) -> bool:
        """Block until change_seq differs from ``last_seen`` (True) or
        ``timeout`` (seconds or a timedelta) passes (False). The GIL is
        released while asleep."""
        if isinstance(timeout, timedelta):
            timeout = timeout.total_seconds()
        ops = self.atomics
        word = self.base + CHANGE_SEQ_OFFSET
        waiters = self.base + WAITERS_OFFSET
        deadline = time.monotonic_ns() + int(timeout * 1e9)
        while True:
            if ops.load_acquire_u64(word) != last_seen:
                return True
            remaining = deadline - time.monotonic_ns()
            if remaining <= 0:
                return False
            ops.fetch_add_relaxed_u64(waiters, 1)
            ops.fence_seq_cst()
            if ops.load_acquire_u64(word) != last_seen:
                ops.fetch_sub_relaxed_u64(waiters, 1)
                return True
            outcome = ops.futex_wait(word, last_seen & U32_MAX, remaining)
            ops.fetch_sub_relaxed_u64(waiters, 1)
            if outcome < 0:
                raise OSError(-outcome, f"futex_wait on {self.name} change_seq: {os.strerror(-outcome)}")
            if outcome == FUTEX_TIMED_OUT and ops.load_acquire_u64(word) == last_seen:
                return False

    # -- D.15 Other board operations ----------------------------------------------------------------

    def snapshot(self) -> list[KeyStatus]:
        """Every Active key with a coherent copy of its status (under the
        lock, 1024 tries); owners probed after unlocking. A busy lock → []."""
        if not self._lock(tries=LOCK_TRIES_SNAPSHOT):
            return []
        ops = self.atomics
        rows = []
        try:
            for index in range(self.capacity):
                entry = self.entry_address(index)
                if ops.load_acquire_u32(entry + STATE_OFFSET) != ACTIVE:
                    continue
                for _ in range(READ_RETRY_BUDGET):
                    v1 = ops.load_acquire_u64(entry + PUBLISH_OFFSET)
                    k = v1 >> 1
                    cell = self.cell_offset(index, k)
                    length = min(ops.load_relaxed_u32(self.base + cell + CELL_VALUE_LEN_OFFSET), self.max_value_size) if k else 0
                    stamp = ops.load_relaxed_u64(self.base + cell + CELL_UPDATED_AT_OFFSET) if k else 0
                    ops.fence_seq_cst()
                    if ops.load_acquire_u64(entry + PUBLISH_OFFSET) - (v1 & ~1) < 3:
                        start = HEADER_SIZE + ENTRY_SIZE * index
                        node = bytes(self.mapping.buffer[start + OWNER_NODE_OFFSET : start + OWNER_NODE_OFFSET + NODE_NAME_MAX])
                        pid = ops.load_acquire_u64(entry + OWNER_PID_OFFSET)
                        start_time = ops.load_relaxed_u64(entry + OWNER_STARTTIME_OFFSET)
                        rows.append((self._key_text(index), node, pid, start_time, k, length, stamp))
                        break
        finally:
            self._unlock()
        return [
            KeyStatus(
                key=_decode(key), value_len=length, updated_at_ns=stamp, update_count=k, owner_pid=pid,
                owner_node=_decode(node), owner_alive=pid != 0 and not owner_is_dead(pid, start_time),
            )
            for key, node, pid, start_time, k, length, stamp in rows
        ]

    def _active_keys(self, prefix: str) -> list[tuple[str, bytes]]:
        """(text, raw bytes up to NUL) of the Active entries' keys starting
        with ``prefix``, in entry order; a hostile key text is replaced, not fatal."""
        ops = self.atomics
        found = []
        for index in range(self.capacity):
            if ops.load_acquire_u32(self.entry_address(index) + STATE_OFFSET) != ACTIVE:
                continue
            raw = self._key_text(index).split(b"\0", 1)[0]
            key = raw.decode("utf-8", errors="replace")
            if raw and key.startswith(prefix):
                found.append((key, raw))
        return found

    def keys(self, prefix: str = "") -> list[str]:
        """Active keys starting with ``prefix``, in entry order (no lock)."""
        return [key for key, _ in self._active_keys(prefix)]

    def read_all(self, prefix: str = "") -> dict[str, bytes]:
        """Every prefix-matching key holding a value (no lock); a key
        overtaken mid-read is dropped."""
        values = {}
        for key, raw in self._active_keys(prefix):
            outcome = BlackboardReader(self, key, raw).read()
            if outcome:
                values[key] = outcome.data
        return values

    def __repr__(self) -> str:
        return f"Blackboard(name={self.name!r}, capacity={self.capacity}, max_value_size={self.max_value_size})"


def _decode(raw: bytes) -> str:
    return raw.split(b"\0", 1)[0].decode("utf-8", errors="replace")


# The writers still holding a key: released at exit while the interpreter is
# whole (a writer's __del__ run during finalization could not reach the board's
# lock checks, which read /proc).
_declared_writers: "weakref.WeakSet[BlackboardWriter]" = weakref.WeakSet()


@atexit.register
def _release_declared_writers() -> None:
    for writer in list(_declared_writers):
        writer.release()


class BlackboardWriter:
    """The owner of one key (D.9, D.12)."""

    def __init__(self, board: Blackboard, key: str, index: int, tenancy: int, writes: int) -> None:
        self.board = board
        self.key = key
        self._index = index
        self._tenancy = tenancy
        self._writes = writes  # completed writes so far (a takeover continues the count)
        self._pid = os.getpid()  # the declaring process
        self.valid = True
        _declared_writers.add(self)

    def write(self, data: bytes) -> None:
        """Publish a new value; OSError EBADF (released), EPERM (another
        process), EMSGSIZE (too long) or ENOTRECOVERABLE (no longer owned)."""
        board = self.board
        ops = board.atomics
        # checks in 0.9.2's order
        if not self.valid:
            raise OSError(errno.EBADF, f"write: {os.strerror(errno.EBADF)} (key {self.key!r} released)")
        if os.getpid() != self._pid:
            raise OSError(errno.EPERM, f"write: {os.strerror(errno.EPERM)} (key {self.key!r} declared by pid {self._pid})")
        if not 0 <= self._index < board.capacity:
            raise OSError(errno.EBADF, f"write: {os.strerror(errno.EBADF)} (entry {self._index})")
        if len(data) > board.max_value_size:
            raise OSError(
                errno.EMSGSIZE, f"write: {os.strerror(errno.EMSGSIZE)} ({len(data)} bytes > max_value_size {board.max_value_size})"
            )
        entry = board.entry_address(self._index)
        if ops.load_acquire_u32(entry + STATE_OFFSET) != ACTIVE or ops.load_acquire_u64(entry + TENANCY_OFFSET) != self._tenancy:
            raise OSError(errno.ENOTRECOVERABLE, f"write: {os.strerror(errno.ENOTRECOVERABLE)} (key {self.key!r} no longer owned)")
        # k = writes + 1; publish = 2k − 1 (relaxed); release fence. u64
        # arithmetic, as the wheel's: a taken-over count near 2^63 (a hostile
        # publish word) wraps instead of overflowing the store.
        k = (self._writes + 1) & U64_MAX
        ops.store_relaxed_u64(entry + PUBLISH_OFFSET, (2 * k - 1) & U64_MAX)
        ops.fence_seq_cst()
        # payload into cell (k & 1), the last partial word zero-filled; value_len; updated_at_ns
        cell = board.cell_offset(self._index, k)
        padded = -(-len(data) // 8) * 8
        board.mapping.buffer[cell + CELL_HEADER_SIZE : cell + CELL_HEADER_SIZE + padded] = _padded(data, padded)
        ops.store_relaxed_u32(board.base + cell + CELL_VALUE_LEN_OFFSET, len(data))
        ops.store_relaxed_u64(board.base + cell + CELL_UPDATED_AT_OFFSET, time.monotonic_ns())
        # release fence; publish = 2k (relaxed); writes = k; notify
        ops.fence_seq_cst()
        ops.store_relaxed_u64(entry + PUBLISH_OFFSET, (2 * k) & U64_MAX)
        self._writes = k
        board._notify()

    def release(self) -> None:
        """Give the key up (value kept) so another process may declare it;
        only in the declaring process, otherwise the handle is just dropped."""
        if self.valid and os.getpid() == self._pid:
            self.board._release(self._index, self._tenancy)
        self.valid = False

    def __del__(self) -> None:
        """Dropping the writer releases the key, as 0.9.2's destructor does."""
        if getattr(self, "valid", False):
            self.release()

    def __repr__(self) -> str:
        return f"BlackboardWriter(key={self.key!r}, valid={self.valid})"


class BlackboardReader:
    """A reader of one key (D.10, D.11), caching where it lives."""

    def __init__(self, board: Blackboard, key: str, data: bytes) -> None:
        self.board = board
        self.key = key
        self._data = data
        self._index: int | None = None
        self._tenancy = 0

    def _resolve(self) -> int | None:
        """D.11: the cached entry while it is Active with the cached tenancy,
        else the key's entry found again (None: no such key)."""
        board = self.board
        ops = board.atomics
        if self._index is not None:
            entry = board.entry_address(self._index)
            if ops.load_acquire_u32(entry + STATE_OFFSET) == ACTIVE and ops.load_acquire_u64(entry + TENANCY_OFFSET) == self._tenancy:
                return self._index
        self._index = board._find_active(self._data)
        if self._index is not None:
            self._tenancy = ops.load_acquire_u64(board.entry_address(self._index) + TENANCY_OFFSET)
        return self._index

    def read(self) -> ReadOutcome:
        """The current value (errno 0), or ENOENT (no such key), ENOMSG (never
        written), EAGAIN (overtaken 64 times in a row)."""
        for _ in range(READ_RETRY_BUDGET):
            index = self._resolve()
            if index is None:
                return ReadOutcome(errno.ENOENT)
            outcome = self.board._read_cell(index, self._tenancy)
            if outcome is not None:
                return outcome
            self._index = None  # tenancy moved or the cell was rewritten: resolve again
        return ReadOutcome(errno.EAGAIN)

    def owner_alive(self) -> bool:
        """Whether the key's owner process exists (one OS call)."""
        index = self._resolve()
        if index is None:
            return False
        ops = self.board.atomics
        entry = self.board.entry_address(index)
        pid = ops.load_acquire_u64(entry + OWNER_PID_OFFSET)
        return pid != 0 and not owner_is_dead(pid, ops.load_relaxed_u64(entry + OWNER_STARTTIME_OFFSET))

    def __repr__(self) -> str:
        return f"BlackboardReader(key={self.key!r})"
