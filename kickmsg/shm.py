"""POSIX shared-memory objects (``/dev/shm``) and their mappings.

A ``Mapping`` maps a whole object read-write and stays mapped while anything
refers to it: every object that points into a region (publisher, subscriber,
view, slot, memoryview) keeps its ``Mapping`` alive.
"""
import errno
import mmap
import os
import pwd
import stat

import posix_ipc

from kickmsg._atomics_cffi import ffi
from kickmsg.errors import CorruptRegionError, EmptyObjectError, NoRoomError, RegionNotFoundError, RegionPermissionError

__all__ = [
    "DEFAULT_MODE", "MADV_POPULATE_WRITE", "MODE_VARIABLE", "Mapping", "NAME_RULE", "SHM_DIRECTORY", "SIDECAR_SUFFIXES",
    "allocated_bytes", "check_existing_name", "check_may_remove", "check_name", "create_exclusive", "create_or_map",
    "creation_mode", "object_size", "open_existing", "processes_mapping", "read_head", "room_for_new_object", "unlink",
]

# The record files beside region /x (kickmsg.owners) are /x + one of these: its subscribers, publishers,
# bridges; ".owners" ends each name the release before gave them (x.owners, x.owners.owners, ...).
SIDECAR_SUFFIXES = (".kickmsg-subscribers", ".kickmsg-publishers", ".kickmsg-bridges", ".owners")
NAME_RULE = (
    "a shared-memory name is '/' followed by 1 to 254 bytes of UTF-8 text without '/' or control characters "
    f"(NUL, newline, ...), other than '.' and '..', and not ending in '{"', '".join(SIDECAR_SUFFIXES)}' "
    "(the suffixes of the record files beside a region)"
)
DEFAULT_MODE = 0o600  # only the creating user may map a new region (as native 0.9; 0.1.0 used 0666)
MODE_VARIABLE = "KICKMSG_SHM_MODE"  # octal permission bits for new regions, as in native 0.9
SHM_DIRECTORY = "/dev/shm"  # where Linux keeps POSIX shared-memory objects


def check_name(name: str) -> None:
    """Raise ``ValueError`` unless ``name`` follows the naming rule: every
    name this package creates does."""
    fault = _shape_fault(name) or _text_fault(name)
    if fault:
        raise ValueError(f"invalid shared-memory name {name!r} ({fault}): {NAME_RULE}")


def check_existing_name(name: str) -> None:
    """Raise ``ValueError`` unless ``name`` follows the naming rule, its text
    aside: removal takes the names other programs gave their objects (bytes
    that are not UTF-8, as ``os.fsdecode`` gives them, or control characters)."""
    fault = _shape_fault(name)
    if fault:
        raise ValueError(f"invalid shared-memory name {name!r} ({fault}): {NAME_RULE}")


def _shape_fault(name: str) -> str | None:
    """What in ``name`` no object of /dev/shm could be named by the rule, if anything."""
    if not isinstance(name, str):
        raise TypeError(f"shared-memory name must be a str, got {name!r}")
    try:
        size = len(os.fsencode(name)) - 1
    except UnicodeEncodeError:
        return "it holds characters that no file name can hold"
    if not name.startswith("/"):
        return "it does not start with '/'"
    if not 1 <= size <= 254:
        return f"{size} bytes after '/'"
    if "/" in name[1:]:
        return "a '/' after the first"
    if "\0" in name:
        return "a NUL character"
    if name in ("/.", "/.."):
        return f"'{name[1:]}' names a directory"
    suffix = next((suffix for suffix in SIDECAR_SUFFIXES if name.endswith(suffix)), None)
    if suffix:
        return f"it ends in '{suffix}'"
    return None


def _text_fault(name: str) -> str | None:
    """What in ``name`` is not UTF-8 text without control characters, if anything."""
    try:
        name.encode("utf-8")
    except UnicodeEncodeError:
        return "it is not valid UTF-8"
    control = next((character for character in name if ord(character) < 0x20 or 0x7F <= ord(character) <= 0x9F), None)
    return None if control is None else f"control character U+{ord(control):04X}"


def creation_mode(mode: int | None) -> int:
    """The permission bits for a new object: ``mode`` if given, else
    ``$KICKMSG_SHM_MODE`` (octal, e.g. ``0660``), else 0600. As for any new
    file, the process umask then applies."""
    if mode is None:
        text = os.environ.get(MODE_VARIABLE, "")
        if not text:
            return DEFAULT_MODE
        source = f"{MODE_VARIABLE}={text!r}"
        try:
            mode = int(text, 8)
        except ValueError:
            raise ValueError(f"{source} is not an octal permission mode such as 0600 or 0660") from None
    else:
        if not isinstance(mode, int) or isinstance(mode, bool):
            raise TypeError(f"mode must be an int such as 0o600, got {mode!r}")
        source = f"mode={mode:#o}" if mode >= 0 else f"mode={mode}"
    if not 0 <= mode <= 0o777:
        raise ValueError(f"{source} is not a permission mode: it must lie between 0 and 0o777 (e.g. 0o600, 0o660)")
    return mode


def _access_description(name: str) -> str:
    """The object's mode and owner, and who we are, for a permission error."""
    try:
        status = os.stat(SHM_DIRECTORY + name)
    except OSError:
        return f"this process runs as uid {os.geteuid()}"
    return f"mode {status.st_mode & 0o777:04o}, owner {_user_name(status.st_uid)}; this process runs as {_user_name(os.geteuid())}"


def _user_name(uid: int) -> str:
    try:
        return pwd.getpwuid(uid).pw_name
    except KeyError:
        return f"uid {uid}"


def room_for_new_object() -> tuple[int, str]:
    """How many bytes a new object can be given without hurting the machine,
    and what sets that bound: the free space of /dev/shm, the memory the
    kernel reports available (a tmpfs object lives in memory or swap), and
    what is left under this process's cgroup memory limit, if any."""
    shm_fs = os.statvfs(SHM_DIRECTORY)
    limits = [(shm_fs.f_bavail * shm_fs.f_frsize, f"free in {SHM_DIRECTORY}")]
    try:
        with open("/proc/meminfo") as meminfo:
            fields = {line.split(":")[0]: int(line.split()[1]) * 1024 for line in meminfo if line.split()[1:2]}
        limits.append((fields["MemAvailable"] + fields.get("SwapFree", 0), "available in memory (MemAvailable + SwapFree)"))
    except (OSError, KeyError, ValueError):
        pass
    try:
        with open("/proc/self/cgroup") as cgroup:
            path = next(line.strip().partition("::")[2] for line in cgroup if line.startswith("0::"))
        with open(f"/sys/fs/cgroup{path}/memory.max") as limit, open(f"/sys/fs/cgroup{path}/memory.current") as used:
            maximum = limit.read().strip()
            if maximum != "max":
                limits.append((max(0, int(maximum) - int(used.read())), "left under this process's cgroup memory limit"))
    except (OSError, StopIteration, ValueError):
        pass
    return min(limits)


def object_size(name: str) -> int | None:
    """The size of the object of that name, None if there is none."""
    try:
        return os.stat(SHM_DIRECTORY + name).st_size
    except OSError:
        return None


def allocated_bytes(name: str) -> int:
    """The memory an existing object holds now (0 if there is none)."""
    try:
        return os.stat(SHM_DIRECTORY + name).st_blocks * 512
    except OSError:
        return 0


class Mapping:
    """A shared-memory object mapped into this process, read-write or (for
    inspection) read-only.

    ``buffer`` is a memoryview over all of it; ``address`` is the integer
    address of its first byte, for ``kickmsg.atomics``.
    """

    def __init__(
        self, name: str, memory: mmap.mmap, identity: tuple[int, int], writable: bool, shared: bool = True, mode: int = 0o600
    ) -> None:
        self.name = name
        self.identity = identity  # (st_dev, st_ino) of the object mapped
        self.mode = mode  # its permission bits when mapped
        self.writable = writable
        self.shared = shared  # False: ordinary private memory, nothing in /dev/shm
        self.size = len(memory)
        self.buffer = memoryview(memory)
        self._pointer = ffi.from_buffer(memory)  # pins the mapping (it cannot be closed under us)
        self.address = int(ffi.cast("uintptr_t", self._pointer))

    @classmethod
    def private(cls, name: str, size: int) -> "Mapping":
        """Zeroed private memory of ``size`` bytes standing in for a shared
        object (``kickmsg.verify`` runs the real flows over one)."""
        return cls(name, mmap.mmap(-1, size), identity=(0, 0), writable=True, shared=False)

    def is_replaced(self) -> bool:
        """Whether the name now refers to another object than the one mapped
        here (re-created with another size). An unlinked name is not."""
        try:
            status = os.stat(SHM_DIRECTORY + self.name)
        except FileNotFoundError:
            return False
        return (status.st_dev, status.st_ino) != self.identity

    def is_named(self) -> bool:
        """Whether the name leads to the object mapped here (not unlinked,
        not replaced by another object)."""
        try:
            status = os.stat(SHM_DIRECTORY + self.name)
        except OSError:
            return False
        return (status.st_dev, status.st_ino) == self.identity

    def __repr__(self) -> str:
        return f"Mapping(name={self.name!r}, size={self.size}, address=0x{self.address:x})"


MADV_POPULATE_WRITE = 23  # <linux/mman.h>, Linux >= 5.14; Python's mmap module does not name it


def _map_every_page(name: str, memory: mmap.mmap) -> None:
    """Enter every page of a writable mapping in this process's page tables
    now, so that the first messages through the pool take no page faults
    (a fault per 4 KiB page made the first pass of 8 MB frames several times
    slower than the next). A kernel before 5.14 refuses the advice (EINVAL);
    its pages fault on first touch instead, as they did before. A sparse
    object (not made by this package) whose pages cannot all be backed
    fails here with ``NoRoomError`` rather than with SIGBUS later."""
    try:
        memory.madvise(MADV_POPULATE_WRITE)
    except OSError as error:
        if error.errno == errno.EINVAL:
            return
        memory.close()
        raise NoRoomError(
            error.errno, f"cannot back every page of shared memory {name}: no room left for it ({error.strerror})"
        ) from None


def _map(name: str, shared_memory: posix_ipc.SharedMemory, writable: bool) -> Mapping:
    try:
        status = os.fstat(shared_memory.fd)
        if status.st_size == 0:
            raise EmptyObjectError(f"shared memory {name} is empty (0 bytes)")
        protection = mmap.PROT_READ | (mmap.PROT_WRITE if writable else 0)
        memory = mmap.mmap(shared_memory.fd, status.st_size, prot=protection)
        if writable:
            _map_every_page(name, memory)
        return Mapping(name, memory, (status.st_dev, status.st_ino), writable, mode=status.st_mode & 0o777)
    finally:
        shared_memory.close_fd()


def create_exclusive(name: str, size: int, mode: int) -> Mapping:
    """Create a new object of ``size`` zero bytes, its memory reserved, and
    map it; raise ``FileExistsError`` if the name is taken, ``NoRoomError``
    (removing the new object) if its memory cannot be reserved."""
    check_name(name)
    try:
        shared_memory = posix_ipc.SharedMemory(name, posix_ipc.O_CREX, mode)  # 0 bytes for now
    except posix_ipc.ExistentialError:
        raise FileExistsError(f"shared memory {name} already exists") from None
    except posix_ipc.PermissionsError as error:
        raise RegionPermissionError(f"cannot create shared memory {name}: {error}") from None
    try:
        # Reserve every page now: a region that cannot be backed fails here
        # with ENOSPC, not later with SIGBUS (or the OOM killer) on first touch.
        os.posix_fallocate(shared_memory.fd, 0, size)
    except OSError as error:
        shared_memory.close_fd()
        posix_ipc.unlink_shared_memory(name)
        if error.errno in (errno.ENOSPC, errno.ENOMEM, errno.EFBIG):
            raise NoRoomError(error.errno, error.strerror) from None
        raise
    return _map(name, shared_memory, writable=True)


def create_or_map(name: str, size: int, mode: int) -> tuple[Mapping | None, bool]:
    """Create a new zero-filled object of ``size`` bytes, its memory
    reserved, and map it (returns ``(mapping, True)``), or map the object
    already named (``(mapping, False)``; ``(None, False)`` if it vanished
    meanwhile or is still empty)."""
    try:
        return create_exclusive(name, size, mode), True
    except FileExistsError:
        pass
    try:
        return open_existing(name), False
    except (RegionNotFoundError, EmptyObjectError):
        return None, False


def open_existing(name: str, writable: bool = True) -> Mapping:
    """Map an existing object at its current size. Its name may hold any
    bytes another program gave it (``check_existing_name``)."""
    check_existing_name(name)
    try:
        mode = os.stat(SHM_DIRECTORY + name).st_mode
    except OSError:
        mode = stat.S_IFREG  # shm_open says why
    if not stat.S_ISREG(mode):  # a FIFO planted there would block shm_open
        raise CorruptRegionError(f"Invalid shared memory (bad magic): {name} is not a regular file")
    try:
        shared_memory = posix_ipc.SharedMemory(name, 0, read_only=not writable)
    except posix_ipc.ExistentialError:
        raise RegionNotFoundError(f"no shared memory named {name}") from None
    except posix_ipc.PermissionsError:
        raise RegionPermissionError(
            f"cannot open shared memory {name} {'read-write' if writable else 'read-only'}: permission denied "
            f"({_access_description(name)})"
        ) from None
    return _map(name, shared_memory, writable)


def check_may_remove(name: str, paths: list[str]) -> None:
    """Raise ``RegionPermissionError`` (removing nothing) unless this process
    may remove every one of ``paths`` that exists, the files of region
    ``name``: /dev/shm is sticky, so only a file's owner, the directory's
    owner or root may remove it."""
    euid = os.geteuid()
    if euid == 0:
        return
    directory = os.stat(SHM_DIRECTORY)
    if not os.access(SHM_DIRECTORY, os.W_OK | os.X_OK):
        raise RegionPermissionError(f"cannot remove {name}: {SHM_DIRECTORY} is not writable by {_user_name(euid)}; nothing was removed")
    for path in paths:
        try:
            owner = os.stat(path, follow_symlinks=False).st_uid
        except FileNotFoundError:
            continue
        if directory.st_mode & stat.S_ISVTX and euid not in (owner, directory.st_uid):
            raise RegionPermissionError(
                f"cannot remove {name}: {path.removeprefix(SHM_DIRECTORY)} belongs to {_user_name(owner)}, and in "
                f"{SHM_DIRECTORY} (sticky) only a file's owner may remove it (this process runs as {_user_name(euid)}); "
                f"nothing was removed"
            )


def unlink(name: str) -> None:
    """Remove the name (mappings stay valid); no error if it is absent. Any
    name an object of /dev/shm can have is taken (``check_existing_name``)."""
    check_existing_name(name)
    try:
        os.unlink(SHM_DIRECTORY + name)
    except FileNotFoundError:
        pass
    except PermissionError:
        raise RegionPermissionError(f"cannot unlink shared memory {name}: permission denied ({_access_description(name)})") from None


def read_head(path: str, size: int) -> bytes:
    """The first ``size`` bytes of the object at ``path`` (fewer if it is
    shorter), read without mapping it; empty if it is not a regular file (a
    FIFO planted in /dev/shm: no hang). OSError if it cannot be opened."""
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    try:
        return os.pread(fd, size, 0) if stat.S_ISREG(os.fstat(fd).st_mode) else b""
    finally:
        os.close(fd)


def processes_mapping(name: str) -> list[int]:
    """The ids of the other processes that map object ``name``, found in
    /proc/PID/maps by the object's device and inode (so whatever name or
    mount they see it under), among the processes whose maps this process
    may read (its own user's; every one as root). Empty if there is no such
    object. Reads every readable maps file: a few milliseconds per hundred
    processes, for the rare call that needs it."""
    try:
        status = os.stat(SHM_DIRECTORY + name)
    except OSError:
        return []
    device = f"{os.major(status.st_dev):02x}:{os.minor(status.st_dev):02x}".encode()
    inode = str(status.st_ino).encode()
    found = []
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            with open(f"/proc/{entry.name}/maps", "rb") as maps:
                text = maps.read()
        except OSError:  # gone meanwhile, or another user's
            continue
        if inode not in text:
            continue
        for line in text.splitlines():
            fields = line.split(maxsplit=5)  # address, perms, offset, device, inode, path
            if len(fields) >= 5 and fields[3] == device and fields[4] == inode:
                found.append(int(entry.name))
                break
    return sorted(found)
