"""Who owns which ring: records beside a region, to reclaim dead subscribers.

Beyond 0.1.0, with the region's layout unchanged. A subscriber killed with
SIGKILL leaves its ring Live forever; after max_subscribers such deaths
nobody can subscribe. The region has no room to say who owns a ring, so each
subscriber of this package records itself in a sidecar object next to the
region, ``/dev/shm/<name>.owners``: one 32-byte record per ring (pid, process
start time, start position, the region's created_at_ns), and it holds an
open-file-description lock (``F_OFD_SETLK``) on its record for as long as it
lives. The kernel drops the lock when the holder dies, so a record whose lock
can be taken belongs to a dead owner. A Live ring without a record belongs to
a subscriber that does not record itself (such as the native library) and is
left alone.
"""
import errno
import fcntl
import os
import struct
import time
from dataclasses import astuple, dataclass

from kickmsg import shm

SUFFIX = ".owners"
RECORD = struct.Struct("<QQQQ")  # pid, process start time, start_pos, region created_at_ns
FLOCK = struct.Struct("hhqqi4x")  # struct flock: type, whence, start, length, pid (0 for OFD locks)
CLAIM_ATTEMPTS = 100  # a reclaimer holds a record's lock only briefly: retry 1 ms apart
CLAIM_RETRY_S = 0.001


@dataclass(frozen=True)
class OwnerRecord:
    pid: int
    process_start: int  # clock ticks after boot (/proc/<pid>/stat field 22)
    start_pos: int
    region_created_at_ns: int


def process_start_time(pid: int) -> int:
    """When process ``pid`` started, in clock ticks after boot (0 if unknown)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as stat:
            fields_after_name = stat.read().rpartition(b")")[2].split()
        return int(fields_after_name[19])  # field 22 of the whole line
    except (OSError, IndexError, ValueError):
        return 0


def sidecar_path(region_name: str) -> str:
    return shm.SHM_DIRECTORY + region_name + SUFFIX


def unlink(region_name: str) -> None:
    """Remove the region's sidecar, if any."""
    try:
        os.unlink(sidecar_path(region_name))
    except OSError as error:
        if error.errno not in (errno.ENOENT, errno.ENAMETOOLONG):  # too long a name never has one
            raise


class Sidecar:
    """One open description of a region's sidecar (locks belong to it)."""

    def __init__(self, fd: int):
        self._fd = fd

    @classmethod
    def open(cls, region_name: str, rings: int, create: bool) -> "Sidecar | None":
        """Open (or create) the sidecar with room for ``rings`` records; None
        if it does not exist (and ``create`` is False) or cannot be opened."""
        flags = os.O_RDWR | os.O_CLOEXEC | (os.O_CREAT if create else 0)
        try:
            fd = os.open(sidecar_path(region_name), flags, shm.CREATE_MODE)
        except OSError:
            return None
        if os.fstat(fd).st_size < rings * RECORD.size:
            os.ftruncate(fd, rings * RECORD.size)  # only ever grows: records never move
        return cls(fd)

    def _lock(self, ring: int, lock_type: int) -> bool:
        """Set or clear our lock on ring's record without waiting; False if
        another description holds it."""
        request = FLOCK.pack(lock_type, os.SEEK_SET, ring * RECORD.size, RECORD.size, 0)
        try:
            fcntl.fcntl(self._fd, fcntl.F_OFD_SETLK, request)
        except OSError as error:
            if error.errno in (errno.EAGAIN, errno.EACCES):
                return False
            raise
        return True

    def _read(self, ring: int) -> OwnerRecord | None:
        data = os.pread(self._fd, RECORD.size, ring * RECORD.size)
        if len(data) < RECORD.size or not any(data):
            return None
        return OwnerRecord(*RECORD.unpack(data))

    def _write(self, ring: int, record: OwnerRecord | None) -> None:
        data = RECORD.pack(*astuple(record)) if record else bytes(RECORD.size)
        os.pwrite(self._fd, data, ring * RECORD.size)

    def claim(self, ring: int, record: OwnerRecord) -> bool:
        """Record ourselves as the ring's owner and keep its lock. False if
        the lock stayed taken (the ring then just goes unrecorded)."""
        for _ in range(CLAIM_ATTEMPTS):
            if self._lock(ring, fcntl.F_WRLCK):
                self._write(ring, record)
                return True
            time.sleep(CLAIM_RETRY_S)
        return False

    def take_if_owner_dead(self, ring: int, created_at_ns: int) -> OwnerRecord | str:
        """Whether ring's recorded owner is alive: ``"alive"`` (its lock is
        held), ``"unrecorded"`` (no record for this incarnation of the
        region), or the dead owner's record, whose lock we now hold until
        ``release``."""
        if not self._lock(ring, fcntl.F_WRLCK):
            return "alive"
        record = self._read(ring)
        if record is None or record.region_created_at_ns != created_at_ns:
            self._lock(ring, fcntl.F_UNLCK)
            return "unrecorded"
        return record

    def release(self, ring: int) -> None:
        """Clear ring's record and drop our lock on it."""
        self._write(ring, None)
        self._lock(ring, fcntl.F_UNLCK)

    def close(self) -> None:
        os.close(self._fd)
