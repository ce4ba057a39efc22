"""Who owns which ring: records beside a region (beyond 0.1.0, layout unchanged).

A subscriber killed with SIGKILL leaves its ring Live forever; after
max_subscribers such deaths nobody can subscribe. The region has no room to
say who owns a ring, so each subscriber of this package records itself in a
sidecar file next to the region, ``/dev/shm/<name>.kickmsg-subscribers``: one
``OwnerRecord`` per ring, and an open-file-description lock
(``F_OFD_SETLK``) on that record for as long as the subscriber lives. The
kernel drops the lock when its holder dies, so a record whose lock can be
taken belongs to a dead owner. A Live ring without a record belongs to a
subscriber that does not record itself (such as the native library) and is
left alone.

The record also carries the subscriber's read position and loss count,
which only the subscriber knows, so that tools (``kickmsg stats``,
``kickmsg watch``) can show pending messages and losses per ring. The file
is only ever read and written with pread/pwrite, never mapped, so whatever
another process does to it cannot fault a subscriber.

Publishers of this package record themselves too, in a second file,
``/dev/shm/<name>.kickmsg-publishers``, and bridges in a third,
``/dev/shm/<name>.kickmsg-bridges``. The files are named for what they hold,
and no region can have such a name: region names never end in these
suffixes (``shm.NAME_RULE``), and the ``kickmsg-`` in them says whose files
they are to anyone listing ``/dev/shm``. (A file name holds 255 bytes: a
region name of more than 235 has no room for a record file beside it, and
its users go unrecorded, as told below.) One ``PublisherRecord``
per live ``Publisher``, locked the same way, with the messages it sent and
the deliveries it dropped as of its last check-in (every 0.1 s while it
sends, never per message). A record nobody holds the lock of is a dead
publisher's ("stall"); the next publisher to record itself, or
``reclaim_dead_publishers``, takes its place. Native publishers record
nothing and cannot be seen.

A record belongs to one instance of its region: the region made under that
name by one create. A file can outlive its region (a native process removes
a region without its sidecars), and a new region of the same name must not
show a process of the old one as its own. Each record says which instance
it is of by the creation stamp of the region's header
(``region_created_at_ns``: written by whoever creates the region, native or
ours, and changed by a re-create in place, which these records follow), and
tools show a record only beside the instance it names (``is_of``). A writer
records itself only while the region's name leads to the object it uses
(not on a region whose name was unlinked), and records itself anew when it
follows its region to another instance. Publisher and bridge records
written by an older version of this package carry no stamp (0): they count
as the region's if their writer started after the region was created.

The previous release named the files ``<name>.owners``,
``<name>.owners.owners`` and ``<name>.owners.owners.owners``. For one
release, since a process of that release may still write them beside ours,
the tools read those too (``read_owners``, ``read_publishers``,
``read_bridges``), a dead subscriber's ring recorded only there is
reclaimed (``Sidecar.open``), and they are removed with ours (``unlink``,
``sidecar_paths``: ``kickmsg rm`` and ``kickmsg clean``) and restarted with
ours on a re-create in place. We write only the new names.

The records are bookkeeping beyond the 0.1.0 layout: they never stop a
publisher or subscriber from working on its (preallocated) region. A record
that cannot be written (``/dev/shm`` full, a file we may not write, ...) is
told once per file and per process (``RuntimeWarning``), and its writer goes
on unrecorded, as a native one would.
"""
import ctypes
import errno
import fcntl
import os
import stat
import struct
import time
import warnings
from typing import Protocol

from kickmsg import layouts, process, shm


__all__ = [
    "BRIDGES_SUFFIX", "BRIDGE_DIRECTIONS", "BRIDGE_KEY_SIZE", "BRIDGE_RECORD_SIZE", "BridgeEntry", "BridgeRecord",
    "CHECK_IN_OFFSET", "CLAIM_ATTEMPTS", "CLAIM_RETRY_S", "FLOCK", "MAX_BRIDGE_PEERS", "MAX_BRIDGE_RECORDS",
    "MAX_PUBLISHER_RECORDS", "OLD_SUFFIX", "OLD_SUFFIXES", "OwnerRecord", "PROGRESS_OFFSET", "PUBLISHERS_SUFFIX",
    "PUBLISHER_NAME_SIZE", "PUBLISHER_RECORD_SIZE", "PublisherEntry", "PublisherRecord", "RECORD_FILES", "RECORD_SIZE",
    "RecordEntry", "RegionInstance", "SUBSCRIBERS_SUFFIX", "Sidecar", "UNRECORDED_CONSEQUENCES", "bridges_path", "is_of", "old_path",
    "process_start_time", "program_name", "publishers_path", "read_bridges", "read_owners", "read_publishers",
    "reclaim_dead_bridges", "reclaim_dead_publishers", "region_of_sidecar", "restart", "sidecar_kind", "sidecar_path",
    "sidecar_paths", "unlink",
]


class RegionInstance(Protocol):
    """What a record needs of its region (a ``SharedRegion`` or a core
    ``Region`` of either layout): its name, layout, mapping and the stamp
    of this instance of the name."""

    @property
    def name(self) -> str: ...

    @property
    def layout(self) -> int: ...

    @property
    def mapping(self) -> shm.Mapping: ...

    @property
    def created_at_ns(self) -> int: ...

SUBSCRIBERS_SUFFIX, PUBLISHERS_SUFFIX, BRIDGES_SUFFIX, OLD_SUFFIX = shm.SIDECAR_SUFFIXES
OLD_SUFFIXES = {"ring-owner": OLD_SUFFIX, "publisher": OLD_SUFFIX * 2, "bridge": OLD_SUFFIX * 3}  # the previous release's names
RECORD_FILES = (  # (suffix, kind) of every record file; the previous release's names end in one another: longest first
    (SUBSCRIBERS_SUFFIX, "ring-owner"), (PUBLISHERS_SUFFIX, "publisher"), (BRIDGES_SUFFIX, "bridge"),
    (OLD_SUFFIXES["bridge"], "bridge"), (OLD_SUFFIXES["publisher"], "publisher"), (OLD_SUFFIXES["ring-owner"], "ring-owner"),
)
MAX_PUBLISHER_RECORDS = 1024  # a publisher that finds no free record among these goes unrecorded
MAX_BRIDGE_RECORDS = 64  # likewise for a bridge forwarding the channel
PUBLISHER_NAME_SIZE = 24  # 32 before records were stamped: the stamp took the last 8 bytes (records kept their size)
BRIDGE_KEY_SIZE = 136  # the Zenoh key, UTF-8, NUL-padded (a longer one is cut); 144 before records were stamped
BRIDGE_DIRECTIONS = {1: "export", 2: "import"}
MAX_BRIDGE_PEERS = 0xFFFF  # a bridge's record says at most this many peers
FLOCK = struct.Struct("hhqqi4x")  # struct flock: type, whence, start, length, pid (0 for OFD locks)
CLAIM_ATTEMPTS = 100  # a reclaimer holds a record's lock only briefly: retry 1 ms apart
CLAIM_RETRY_S = 0.001
UNRECORDED_CONSEQUENCES = {  # by sidecar_kind: what goes without records; {region} is the region's name
    "ring-owner": "subscribers in this process go on without an owner record: tools do not show them, and the "
                  "ring of one that is killed stays taken until kickmsg repair {region} --ring N --force frees it",
    "publisher": "publishers in this process go on unrecorded: kickmsg stats and list do not show them",
    "bridge": "bridges in this process go on unrecorded: kickmsg stats and list do not show them",
}
_warned_paths: set[str] = set()  # record files this process has warned about


class OwnerRecord(ctypes.Structure):
    """One ring's owner, as written by the subscriber that holds its lock."""

    _fields_ = [
        ("pid", ctypes.c_uint64),
        ("process_start", ctypes.c_uint64),  # clock ticks after boot (/proc/<pid>/stat field 22)
        ("start_pos", ctypes.c_uint64),  # write_pos when it joined: the start of its drain window
        ("region_created_at_ns", ctypes.c_uint64),  # which incarnation of the region it joined
        ("read_pos", ctypes.c_uint64),  # reported by the subscriber as it reads
        ("lost", ctypes.c_uint64),  # likewise
    ]


RECORD_SIZE = ctypes.sizeof(OwnerRecord)
PROGRESS_OFFSET = OwnerRecord.read_pos.offset  # read_pos and lost, written together


class PublisherRecord(ctypes.Structure):
    """One live publisher, as written by the publisher that holds its lock."""

    _fields_ = [
        ("pid", ctypes.c_uint64),
        ("process_start", ctypes.c_uint64),  # clock ticks after boot (/proc/<pid>/stat field 22)
        ("started_at_ns", ctypes.c_uint64),  # time.time_ns() when it recorded itself
        ("checked_in_at_ns", ctypes.c_uint64),  # time.time_ns() of its last check-in
        ("sent", ctypes.c_uint64),  # messages sent, as of that check-in
        ("dropped", ctypes.c_uint64),  # deliveries dropped, likewise
        ("name", ctypes.c_char * PUBLISHER_NAME_SIZE),  # its node or program name, UTF-8, NUL-padded
        ("region_created_at_ns", ctypes.c_uint64),  # the instance of the region it publishes into (0: an older version's)
    ]


PUBLISHER_RECORD_SIZE = ctypes.sizeof(PublisherRecord)
CHECK_IN_OFFSET = PublisherRecord.checked_in_at_ns.offset  # checked_in_at_ns, sent and dropped, written together


class BridgeRecord(ctypes.Structure):
    """One bridge forwarding the channel, as written by the bridge that
    holds its lock (``kickmsg.bridge.ChannelFigures`` as of its last update)."""

    _fields_ = [
        ("pid", ctypes.c_uint64),
        ("process_start", ctypes.c_uint64),  # clock ticks after boot (/proc/<pid>/stat field 22)
        ("started_at_ns", ctypes.c_uint64),  # time.time_ns() when it recorded itself
        ("updated_at_ns", ctypes.c_uint64),  # time.time_ns() of its last update
        ("messages_in", ctypes.c_uint64),
        ("messages_out", ctypes.c_uint64),
        ("bytes_out", ctypes.c_uint64),
        ("lost_locally", ctypes.c_uint64),
        ("lost_on_way", ctypes.c_uint64),
        ("lost_at_source", ctypes.c_uint64),
        ("skipped", ctypes.c_uint64),
        ("epochs", ctypes.c_uint64),
        ("bytes_per_s", ctypes.c_double),  # payload bytes forwarded per second between its last two updates
        ("direction", ctypes.c_uint8),  # a key of BRIDGE_DIRECTIONS
        ("matched", ctypes.c_uint8),  # export: an importer's subscriber matches the key; import: an exporter's description does
        ("peers", ctypes.c_uint16),  # Zenoh sessions connected to the bridge's (at most MAX_BRIDGE_PEERS)
        ("recreated", ctypes.c_uint32),  # import: times it re-created the channel for a new description
        ("key", ctypes.c_char * BRIDGE_KEY_SIZE),
        ("region_created_at_ns", ctypes.c_uint64),  # the instance of the region it forwards (0: an older version's)
    ]


BRIDGE_RECORD_SIZE = ctypes.sizeof(BridgeRecord)


def process_start_time(pid: int) -> int:
    """When process ``pid`` started, in clock ticks after boot (0 if unknown)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as stat:
            fields_after_name = stat.read().rpartition(b")")[2].split()
        return int(fields_after_name[19])  # field 22 of the whole line
    except (OSError, IndexError, ValueError):
        return 0


def sidecar_path(region_name: str) -> str:
    """The file of the region's ring owners (its subscribers' records)."""
    return shm.SHM_DIRECTORY + region_name + SUBSCRIBERS_SUFFIX


def publishers_path(region_name: str) -> str:
    return shm.SHM_DIRECTORY + region_name + PUBLISHERS_SUFFIX


def bridges_path(region_name: str) -> str:
    return shm.SHM_DIRECTORY + region_name + BRIDGES_SUFFIX


def old_path(region_name: str, kind: str) -> str:
    """The previous release's name of the region's file of ``kind`` records
    (``x.owners``, ``x.owners.owners``, ``x.owners.owners.owners``)."""
    return shm.SHM_DIRECTORY + region_name + OLD_SUFFIXES[kind]


def _suffix_of(file_name: str) -> tuple[str, str] | None:
    return next(((suffix, kind) for suffix, kind in RECORD_FILES if file_name.endswith(suffix)), None)


def sidecar_kind(file_name: str) -> str | None:
    """What a record file (``x.kickmsg-subscribers``, ``x.kickmsg-publishers``,
    ``x.kickmsg-bridges``, or a previous release's name) holds: ring-owner,
    publisher or bridge records; None for another file."""
    found = _suffix_of(file_name)
    return found[1] if found else None


def region_of_sidecar(file_name: str) -> str:
    """The region name (``/x``) a record file's name belongs to."""
    found = _suffix_of(file_name)
    if found is None:
        raise ValueError(f"{file_name!r} is not the name of a record file (it ends in none of {shm.SIDECAR_SUFFIXES})")
    return "/" + file_name.removesuffix(found[0])


def _warn_unrecorded(path: str, error: OSError) -> None:
    """Say, once per file in this process, that records cannot be written
    into ``path`` and why; its writers go on without them."""
    if path in _warned_paths:
        return
    _warned_paths.add(path)
    file_name = os.path.basename(path)
    region, kind = region_of_sidecar(file_name), sidecar_kind(file_name)
    assert kind is not None  # one of our record files
    consequence = UNRECORDED_CONSEQUENCES[kind].format(region=region)
    warnings.warn(f"{region}: cannot write records in {path}: {error.strerror or error}; {consequence}",
                  RuntimeWarning, stacklevel=3)


def _write_record(path: str, fd: int, data: bytes, offset: int) -> bool:
    """pwrite ``data`` into a record; False (after ``_warn_unrecorded``) if
    it could not be written whole."""
    try:
        if os.pwrite(fd, data, offset) != len(data):  # a short write to a file: its file system is full
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
    except OSError as error:
        _warn_unrecorded(path, error)
        return False
    return True


def sidecar_paths(region_name: str) -> list[str]:
    """The paths of the region's sidecars: ring owners, publishers, bridges;
    then the same under the previous release's names."""
    return [sidecar_path(region_name), publishers_path(region_name), bridges_path(region_name),
            *(old_path(region_name, kind) for kind in OLD_SUFFIXES)]


def unlink(region_name: str) -> None:
    """Remove the region's sidecars, if any."""
    for path in sidecar_paths(region_name):
        try:
            os.unlink(path)
        except OSError as error:
            if error.errno not in (errno.ENOENT, errno.ENAMETOOLONG):  # too long a name never has one
                raise


def _open_file(path: str, create_with_mode: int | None) -> int | None:
    """Open a sidecar read-write; None if it does not exist or cannot be
    opened. With ``create_with_mode``, create it if need be, with exactly
    those permission bits (whatever the umask), to record ourselves in it:
    a failure is then told (``_warn_unrecorded``)."""
    try:
        if create_with_mode is not None:
            try:
                fd = os.open(path, os.O_RDWR | os.O_CLOEXEC | os.O_CREAT | os.O_EXCL, create_with_mode)
                os.fchmod(fd, create_with_mode)
                return fd
            except FileExistsError:
                pass
        return os.open(path, os.O_RDWR | os.O_CLOEXEC)
    except OSError as error:
        if create_with_mode is not None:
            _warn_unrecorded(path, error)
        return None


def _lock_request(lock_type: int, ring: int, size: int = RECORD_SIZE) -> bytes:
    return FLOCK.pack(lock_type, os.SEEK_SET, ring * size, size, 0)


def _try_lock(fd: int, lock_type: int, index: int, size: int) -> bool:
    """Set or clear our lock on record ``index`` without waiting; False if
    another open file description holds it."""
    try:
        fcntl.fcntl(fd, fcntl.F_OFD_SETLK, _lock_request(lock_type, index, size))
    except OSError as error:
        if error.errno in (errno.EAGAIN, errno.EACCES):
            return False
        raise
    return True


def _is_locked(fd: int, index: int, size: int) -> bool:
    """Whether another open file description holds record ``index``'s lock."""
    probe = fcntl.fcntl(fd, fcntl.F_OFD_GETLK, _lock_request(fcntl.F_WRLCK, index, size))
    return FLOCK.unpack(probe)[0] != fcntl.F_UNLCK


def _read_record(fd: int, ring: int) -> OwnerRecord | None:
    data = os.pread(fd, RECORD_SIZE, ring * RECORD_SIZE)
    return OwnerRecord.from_buffer_copy(data) if len(data) == RECORD_SIZE and any(data) else None


class Sidecar:
    """One open description of a region's sidecar: its locks belong to it."""

    def __init__(self, fd: int, path: str):
        self._fd = fd
        self._path = path

    @classmethod
    def open(cls, region_name: str, create_with_mode: int | None = None) -> "Sidecar | None":
        """Open the sidecar; None if it does not exist or cannot be opened.
        With ``create_with_mode`` (the region's permission bits), create it
        if it does not exist yet, with exactly those bits (whatever the
        umask), so whoever may use the region may also record themselves.
        Without, to judge owners: the previous release's file if ours does
        not exist (its subscribers were the only ones recorded)."""
        path = sidecar_path(region_name)
        fd = _open_file(path, create_with_mode)
        if fd is None and create_with_mode is None:
            path = old_path(region_name, "ring-owner")
            fd = _open_file(path, None)
        return None if fd is None else cls(fd, path)

    def _lock(self, ring: int, lock_type: int) -> bool:
        """Set or clear our lock on ring's record without waiting; False if
        another description holds it."""
        return _try_lock(self._fd, lock_type, ring, RECORD_SIZE)

    def claim(self, ring: int, start_pos: int, region_created_at_ns: int) -> bool:
        """Record this process as ring's owner and keep the record's lock;
        False if the lock stayed taken or the record could not be written
        (the ring then goes unrecorded)."""
        for _ in range(CLAIM_ATTEMPTS):
            if self._lock(ring, fcntl.F_WRLCK):
                pid = os.getpid()
                record = OwnerRecord(pid, process_start_time(pid), start_pos, region_created_at_ns, start_pos, 0)
                if _write_record(self._path, self._fd, bytes(record), ring * RECORD_SIZE):
                    return True
                self._lock(ring, fcntl.F_UNLCK)
                return False
            time.sleep(CLAIM_RETRY_S)
        return False

    def report_progress(self, ring: int, read_pos: int, lost: int) -> None:
        """Update our record's read position and loss count."""
        _write_record(self._path, self._fd, struct.pack("<QQ", read_pos, lost), ring * RECORD_SIZE + PROGRESS_OFFSET)

    def owner_if_dead(self, ring: int, region_created_at_ns: int) -> OwnerRecord | str:
        """``"alive"`` if ring's owner holds its lock; ``"unrecorded"`` if
        there is no record for this incarnation of the region; otherwise the
        dead owner's record, whose lock we now hold until ``release``."""
        if not self._lock(ring, fcntl.F_WRLCK):
            return "alive"
        record = _read_record(self._fd, ring)
        if record is None or record.region_created_at_ns != region_created_at_ns:
            self._lock(ring, fcntl.F_UNLCK)
            return "unrecorded"
        return record

    def record(self, ring: int) -> OwnerRecord | None:
        """Ring's record as it is now (None if there is none)."""
        return _read_record(self._fd, ring)

    def records_us(self, ring: int, region_created_at_ns: int) -> bool:
        """Whether ring's record names this process as its owner in that
        incarnation of the region (``restart`` moved it there)."""
        record = _read_record(self._fd, ring)
        return record is not None and record.pid == os.getpid() and record.region_created_at_ns == region_created_at_ns

    def release(self, ring: int) -> None:
        """Clear ring's record and drop our lock on it."""
        _write_record(self._path, self._fd, bytes(RECORD_SIZE), ring * RECORD_SIZE)
        self._lock(ring, fcntl.F_UNLCK)

    def close(self) -> None:
        """Close, dropping every lock of this description."""
        os.close(self._fd)


def restart(region_name: str, kept_rings: list[int], region_created_at_ns: int) -> None:
    """For a region re-created in place: move the records of ``kept_rings``
    to the new incarnation, clear every other record. The owners keep their
    locks: the file stays. The previous release's file likewise."""
    for path in (sidecar_path(region_name), old_path(region_name, "ring-owner")):
        try:
            fd = os.open(path, os.O_RDWR | os.O_CLOEXEC)
        except OSError:
            continue
        try:
            for ring in range(os.fstat(fd).st_size // RECORD_SIZE):
                record = _read_record(fd, ring) if ring in kept_rings else None
                if record is not None:
                    record.region_created_at_ns = region_created_at_ns
                _write_record(path, fd, bytes(record or OwnerRecord()), ring * RECORD_SIZE)
        finally:
            os.close(fd)


def read_owners(region_name: str, rings: int) -> list[tuple[OwnerRecord | None, bool]] | None:
    """For tools, without writing anything: the record of each ring among
    the first ``rings`` that the sidecar holds (None where there is none)
    and whether a live process holds its lock; rings past the file's end
    have none and are left out. None if the region has no sidecar. A ring
    our file has no record of takes the previous release's file's."""
    ours = _read_owners_file(sidecar_path(region_name), rings)
    old = _read_owners_file(old_path(region_name, "ring-owner"), rings)
    if ours is None or old is None:
        return old if ours is None else ours
    merged = []
    for ring in range(max(len(ours), len(old))):
        mine = ours[ring] if ring < len(ours) else (None, False)
        merged.append(mine if mine[0] is not None or ring >= len(old) else old[ring])
    return merged


def _read_owners_file(path: str, rings: int) -> list[tuple[OwnerRecord | None, bool]] | None:
    """``read_owners`` of one file."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC | os.O_NONBLOCK)  # a FIFO planted there: no hang
    except OSError:
        return None
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return None
        held = min(rings, os.fstat(fd).st_size // RECORD_SIZE)
        return [(_read_record(fd, ring), _is_locked(fd, ring, RECORD_SIZE)) for ring in range(held)]
    finally:
        os.close(fd)


def program_name() -> str:
    """This process's command name (/proc/self/comm), for publisher records."""
    return process.command_name("self") or ""


class RecordEntry:
    """A record of ours in a file of fixed-size records (publishers, bridges):
    claimed when we start, rewritten at our updates, cleared when released
    (or by whoever reuses it once our process died). It is stamped with the
    instance of the region we use and claimed only while the region's name
    leads to that region's object: a writer on a region whose name was
    unlinked makes no file. We record ourselves anew as a forked child, once
    our file was removed with its region, and when we use another instance
    (we followed the name to a re-created region), as soon as the name leads
    to the region we use."""

    def __init__(self, region: "RegionInstance", path: str, size: int, limit: int):
        self._path, self._size, self._limit = path, size, limit
        self._region = region  # the instance we record ourselves for
        self._fd: int | None = None
        self._index = 0
        self._pid = 0  # the process that claimed the record
        self._to_claim = True  # to record ourselves (anew) once the name leads to our region
        self._claim_if_named()

    @property
    def recorded(self) -> bool:
        """Whether we have a record (False: none was free, the file could
        not be made, or the region's name does not lead to our region)."""
        return self._fd is not None

    def _new_record(self) -> bytes:
        """The record to write when we claim one."""
        raise NotImplementedError

    def _claim_if_named(self) -> None:
        """If the region's name leads to our region's object: take the first
        record whose lock is free (empty, or left by a dead process) and write
        ours into it."""
        if not self._region.mapping.is_named():
            return
        self._to_claim = False
        fd = _open_file(self._path, self._region.mapping.mode)
        if fd is None:
            return
        for index in range(self._limit):
            if _try_lock(fd, fcntl.F_WRLCK, index, self._size):
                if _write_record(self._path, fd, self._new_record(), index * self._size):
                    self._fd, self._index, self._pid = fd, index, os.getpid()
                    return
                break  # unrecorded: closing drops the lock
        os.close(fd)

    def _write(self, region: "RegionInstance", data: bytes, offset: int) -> None:
        """Write into our record for ``region``, the region we use now; first
        record anew if we are a forked child, our file was removed (its
        region unlinked), or ``region`` is another instance than the one we
        recorded ourselves for."""
        if self._fd is not None and (self._pid != os.getpid() or os.fstat(self._fd).st_nlink == 0
                                     or _instance(region) != _instance(self._region)):
            self.release()
            self._to_claim = True
        self._region = region
        if self._to_claim:
            self._claim_if_named()
        if self._fd is not None:
            _write_record(self._path, self._fd, data, self._index * self._size + offset)

    def release(self) -> None:
        """Clear our record and drop its lock (idempotent). In a forked
        child, only close our copy: the record is the parent's."""
        if self._fd is None:
            return
        fd, self._fd = self._fd, None
        try:
            if self._pid == os.getpid():
                _write_record(self._path, fd, bytes(self._size), self._index * self._size)
        finally:
            os.close(fd)


class PublisherEntry(RecordEntry):
    """The record of one live Publisher."""

    def __init__(self, region: "RegionInstance", name: str):
        self._name = name.encode("utf-8")[:PUBLISHER_NAME_SIZE]
        super().__init__(region, publishers_path(region.name), PUBLISHER_RECORD_SIZE, MAX_PUBLISHER_RECORDS)

    def _new_record(self) -> bytes:
        pid, now = os.getpid(), time.time_ns()
        return bytes(PublisherRecord(pid, process_start_time(pid), now, now, 0, 0, self._name, self._region.created_at_ns))

    def check_in(self, region: "RegionInstance", sent: int, dropped: int) -> None:
        """Write the counters, for ``region``: the region we publish into now."""
        self._write(region, struct.pack("<QQQ", time.time_ns(), sent, dropped), CHECK_IN_OFFSET)


class BridgeEntry(RecordEntry):
    """The record of one bridge forwarding the channel, in one direction
    on one Zenoh key."""

    def __init__(self, region: "RegionInstance", direction: str, key: str):
        self._direction = next(code for code, name in BRIDGE_DIRECTIONS.items() if name == direction)
        self._key = key.encode("utf-8")[:BRIDGE_KEY_SIZE]
        self._started_at_ns = time.time_ns()
        super().__init__(region, bridges_path(region.name), BRIDGE_RECORD_SIZE, MAX_BRIDGE_RECORDS)

    def _new_record(self) -> bytes:
        pid = os.getpid()
        return bytes(BridgeRecord(pid=pid, process_start=process_start_time(pid), started_at_ns=self._started_at_ns,
                                  updated_at_ns=time.time_ns(), direction=self._direction, key=self._key,
                                  region_created_at_ns=self._region.created_at_ns))

    def update(self, region: "RegionInstance", record: BridgeRecord) -> None:
        """Write ``record``'s figures (its identity fields are ours), for
        ``region``: the region we forward now."""
        pid = os.getpid()
        record.pid, record.process_start, record.started_at_ns = pid, process_start_time(pid), self._started_at_ns
        record.updated_at_ns, record.direction, record.key = time.time_ns(), self._direction, self._key
        record.region_created_at_ns = region.created_at_ns
        self._write(region, bytes(record), 0)


def _instance(region: "RegionInstance") -> tuple[tuple[int, int], int]:
    """Which instance of its name a region is: the object mapped and the
    creation stamp it had when mapped (a re-create in place changes it)."""
    return region.mapping.identity, region.created_at_ns


def is_of(region: "RegionInstance", record_stamp: int, started_at_ns: int) -> bool:
    """Whether a publisher or bridge record is of this instance of the
    region: stamped with its creation stamp, or (written by an older version
    of this package, stamp 0) by a writer that started after the region
    was created."""
    if record_stamp:
        return record_stamp == region.created_at_ns
    return started_at_ns >= _created_realtime_ns(region)


def _created_realtime_ns(region: "RegionInstance") -> int:
    """When the region was created, in CLOCK_REALTIME nanoseconds (the
    records' clock): layout 9 stamps it so, layout 4 in CLOCK_MONOTONIC."""
    if region.layout == layouts.LAYOUT_9:
        return region.created_at_ns
    return region.created_at_ns + time.time_ns() - time.monotonic_ns()


def _read_records[R: ctypes.Structure](path: str, record_type: type[R], limit: int) -> list[tuple[R, bool]]:
    """For tools, without writing anything: each record of a file of
    fixed-size records, of any instance of the region, and whether a live
    process holds its lock (False: it died)."""
    size = ctypes.sizeof(record_type)
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC | os.O_NONBLOCK)  # a FIFO planted there: no hang
    except OSError:
        return []
    try:
        status = os.fstat(fd)
        if not stat.S_ISREG(status.st_mode):
            return []
        found = []
        for index in range(min(limit, status.st_size // size)):
            data = os.pread(fd, size, index * size)
            if len(data) == size and any(data):
                found.append((record_type.from_buffer_copy(data), _is_locked(fd, index, size)))
        return found
    finally:
        os.close(fd)


def _reclaim_dead_records[R: ctypes.Structure](path: str, record_type: type[R], limit: int, region: "RegionInstance | None") -> list[R]:
    """Clear the records whose process died, those of ``region``'s
    instance (None: of any instance); returns them."""
    size = ctypes.sizeof(record_type)
    fd = _open_file(path, None)
    if fd is None:
        return []
    reclaimed = []
    try:
        for index in range(min(limit, os.fstat(fd).st_size // size)):
            if not _try_lock(fd, fcntl.F_WRLCK, index, size):
                continue  # alive
            data = os.pread(fd, size, index * size)
            record = record_type.from_buffer_copy(data) if len(data) == size and any(data) else None
            if record is not None and (region is None or is_of(region, record.region_created_at_ns, record.started_at_ns)):
                os.pwrite(fd, bytes(size), index * size)
                reclaimed.append(record)
            _try_lock(fd, fcntl.F_UNLCK, index, size)
        return reclaimed
    finally:
        os.close(fd)


def read_publishers(region: "RegionInstance") -> list[tuple[PublisherRecord, bool]]:
    """Each record of a publisher of this instance of the region (in our
    file, then in the previous release's) and whether its publisher lives
    (False: it died, a "stall")."""
    return [(record, held) for path in (publishers_path(region.name), old_path(region.name, "publisher"))
            for record, held in _read_records(path, PublisherRecord, MAX_PUBLISHER_RECORDS)
            if is_of(region, record.region_created_at_ns, record.started_at_ns)]


def reclaim_dead_publishers(region: "RegionInstance") -> list[int]:
    """Clear the records of this instance's publishers that died (in both
    files); returns their pids."""
    return [record.pid for path in (publishers_path(region.name), old_path(region.name, "publisher"))
            for record in _reclaim_dead_records(path, PublisherRecord, MAX_PUBLISHER_RECORDS, region)]


def read_bridges(region: "RegionInstance") -> list[tuple[BridgeRecord, bool]]:
    """Each record of a bridge forwarding this instance of the region (in
    our file, then in the previous release's) and whether its bridge lives."""
    return [(record, held) for path in (bridges_path(region.name), old_path(region.name, "bridge"))
            for record, held in _read_records(path, BridgeRecord, MAX_BRIDGE_RECORDS)
            if is_of(region, record.region_created_at_ns, record.started_at_ns)]


def reclaim_dead_bridges(region_name: str, dry_run: bool = False) -> list[int]:
    """Clear the records of bridges that died, of any instance of the region
    (``kickmsg clean``: a dead process's record serves nobody), in both
    files; with ``dry_run``, only find them. Their pids."""
    paths = (bridges_path(region_name), old_path(region_name, "bridge"))
    if dry_run:
        return [record.pid for path in paths for record, held in _read_records(path, BridgeRecord, MAX_BRIDGE_RECORDS) if not held]
    return [record.pid for path in paths for record in _reclaim_dead_records(path, BridgeRecord, MAX_BRIDGE_RECORDS, None)]
