"""Files a user names (``kickmsg pub @path``, a bridge config, a crosscheck
replay), read within a bound.

A user can name anything: ``/dev/zero`` never ends, a sparse file claims a
terabyte it does not hold, ``/dev/stdin`` may be an endless pipe. Reading
one whole before judging its size made the kernel kill processes for
memory. Here at most ``limit + 1`` bytes are read, whatever the file is.
"""
import os
import stat
from kickmsg.errors import FileTooLarge

__all__ = ["read_at_most"]


def read_at_most(path: str, limit: int, what: str) -> bytes:
    """The bytes of the file at ``path`` (a regular file, a device, a pipe),
    reading at most ``limit + 1`` of them; FileTooLarge if there are more,
    naming the file's size (``more than LIMIT bytes`` when it has none) and
    the limit, ``what`` saying whose it is (``max_payload_size of /c``).
    OSError if it cannot be read."""
    with open(path, "rb") as file:
        data = file.read(limit + 1)
        if len(data) <= limit:
            return data
        status = os.fstat(file.fileno())
    size = f"{status.st_size} bytes" if stat.S_ISREG(status.st_mode) else f"more than {limit} bytes"
    raise FileTooLarge(f"{path}: {size}, above {what} ({limit} bytes)")
