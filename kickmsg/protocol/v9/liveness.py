"""Owner liveness (WIRE9.md B.16), used by rings, registry and blackboard:
this process's identity as an owner records it, and whether a recorded
owner is provably dead."""
import errno
import os

__all__ = ["owner_is_dead", "process_identity", "process_start_time"]


def process_start_time(pid: int) -> int:
    """Field 22 of /proc/<pid>/stat (clock ticks after boot), 0 if unknown (B.16)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as stat:
            fields_after_name = stat.read().rpartition(b")")[2].split()
        return int(fields_after_name[19])
    except (OSError, IndexError, ValueError):
        return 0


def process_identity() -> tuple[int, int]:
    """(pid, start time) of this process, as an owner records them."""
    pid = os.getpid()
    return pid, process_start_time(pid)


def owner_is_dead(pid: int, recorded_start: int) -> bool:
    """Provably dead: gone, a zombie, or another process now under that pid."""
    if pid == 0:
        return False
    if pid > 0x7FFFFFFF:
        return True  # no process can hold it (a corrupt word): os.kill would overflow
    try:
        os.kill(pid, 0)
    except OSError as error:
        if error.errno != errno.EPERM:
            return True
    try:
        with open(f"/proc/{pid}/stat", "rb") as stat:
            after_name = stat.read().rpartition(b")")[2].split()
        if after_name and after_name[0] == b"Z":
            return True
    except OSError:
        pass
    current_start = process_start_time(pid)
    if recorded_start == 0 or current_start == 0:
        return False  # pid-only verdict: alive
    return current_start != recorded_start
