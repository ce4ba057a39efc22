"""POSIX shared-memory objects (``/dev/shm``) and their mappings.

A ``Mapping`` maps a whole object read-write and stays mapped while anything
refers to it: every object that points into a region (publisher, subscriber,
view, slot, memoryview) keeps its ``Mapping`` alive.
"""
import mmap
import os

import posix_ipc

from kickmsg._atomics_cffi import ffi

NAME_RULE = "a shared-memory name is '/' followed by 1 to 254 bytes (UTF-8), none of them '/' or NUL"
CREATE_MODE = 0o666  # as 0.1.0; the process umask applies
SHM_DIRECTORY = "/dev/shm"  # where Linux keeps POSIX shared-memory objects


class RegionNotFoundError(FileNotFoundError, RuntimeError):
    """No shared-memory object has this name."""


class RegionPermissionError(PermissionError, RuntimeError):
    """The shared-memory object exists but this process may not map it."""


class EmptyObjectError(RuntimeError):
    """The object exists but has no bytes yet (a creator between shm_open
    and ftruncate, or not a Kickmsg region)."""


def check_name(name: str) -> None:
    """Raise ``ValueError`` unless ``name`` is a portable POSIX shm name."""
    if not isinstance(name, str):
        raise TypeError(f"shared-memory name must be a str, got {name!r}")
    size = len(name.encode("utf-8", "surrogatepass"))
    if not (2 <= size <= 255 and name[0] == "/" and "/" not in name[1:] and "\0" not in name):
        raise ValueError(f"invalid shared-memory name {name!r}: {NAME_RULE}")


class Mapping:
    """A shared-memory object mapped into this process, read-write or (for
    inspection) read-only.

    ``buffer`` is a memoryview over all of it; ``address`` is the integer
    address of its first byte, for ``kickmsg.atomics``.
    """

    def __init__(self, name: str, memory: mmap.mmap, identity: tuple[int, int], writable: bool, shared: bool = True):
        self.name = name
        self.identity = identity  # (st_dev, st_ino) of the object mapped
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

    def __repr__(self):
        return f"Mapping(name={self.name!r}, size={self.size}, address=0x{self.address:x})"


def _map(name: str, shared_memory: posix_ipc.SharedMemory, writable: bool) -> Mapping:
    try:
        status = os.fstat(shared_memory.fd)
        if status.st_size == 0:
            raise EmptyObjectError(f"shared memory {name} is empty (0 bytes)")
        protection = mmap.PROT_READ | (mmap.PROT_WRITE if writable else 0)
        memory = mmap.mmap(shared_memory.fd, status.st_size, prot=protection)
        return Mapping(name, memory, (status.st_dev, status.st_ino), writable)
    finally:
        shared_memory.close_fd()


def create_exclusive(name: str, size: int) -> Mapping:
    """Create a new object of ``size`` zero bytes and map it; raise
    ``FileExistsError`` if the name is taken."""
    check_name(name)
    try:
        shared_memory = posix_ipc.SharedMemory(name, posix_ipc.O_CREX, CREATE_MODE, size)
    except posix_ipc.ExistentialError:
        raise FileExistsError(f"shared memory {name} already exists") from None
    except posix_ipc.PermissionsError as error:
        raise RegionPermissionError(f"cannot create shared memory {name}: {error}") from None
    return _map(name, shared_memory, writable=True)


def create_or_map(name: str, size: int) -> tuple[Mapping | None, bool]:
    """Create a new zero-filled object of ``size`` bytes and map it (returns
    ``(mapping, True)``), or map the object already named (``(mapping,
    False)``; ``(None, False)`` if it vanished meanwhile or is still empty)."""
    try:
        return create_exclusive(name, size), True
    except FileExistsError:
        pass
    try:
        return open_existing(name), False
    except (RegionNotFoundError, EmptyObjectError):
        return None, False


def open_existing(name: str, writable: bool = True) -> Mapping:
    """Map an existing object at its current size."""
    check_name(name)
    try:
        shared_memory = posix_ipc.SharedMemory(name, 0, read_only=not writable)
    except posix_ipc.ExistentialError:
        raise RegionNotFoundError(f"no shared memory named {name}") from None
    except posix_ipc.PermissionsError as error:
        raise RegionPermissionError(f"cannot open shared memory {name}: {error}") from None
    return _map(name, shared_memory, writable)


def unlink(name: str) -> None:
    """Remove the name (mappings stay valid); no error if it is absent."""
    check_name(name)
    try:
        posix_ipc.unlink_shared_memory(name)
    except posix_ipc.ExistentialError:
        pass
    except posix_ipc.PermissionsError as error:
        raise RegionPermissionError(f"cannot unlink shared memory {name}: {error}") from None
