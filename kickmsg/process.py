"""The id of this process, read without a system call.

Received views and allocated slots note the process that made them, so a
forked child's copy never releases what belongs to its parent. glibc does
not cache ``getpid()``: each ``os.getpid()`` is a system call, twice per
message on those paths. ``pid`` is read once, and again in every child
forked through ``os.fork`` (``multiprocessing`` included).
"""
import os

__all__ = ["command_name", "current_pid", "pid", "process_exists"]

pid = os.getpid()


def _note_child_pid() -> None:
    global pid
    pid = os.getpid()


os.register_at_fork(after_in_child=_note_child_pid)


def current_pid() -> int:
    """This process's id (0.9.2's ``kickmsg.current_pid``)."""
    return pid


def process_exists(process_id: int) -> bool:
    """Whether a process of that id exists (0.9.2's ``kickmsg.process_exists``):
    signal 0 reaches it, or it exists but is another user's (EPERM)."""
    if not isinstance(process_id, int) or isinstance(process_id, bool):
        raise TypeError(f"process_exists needs an int pid, got {process_id!r}")
    if process_id <= 0:
        raise ValueError(f"process_exists needs a positive pid, got {process_id}")
    try:
        os.kill(process_id, 0)
    except PermissionError:
        return True
    except ProcessLookupError:
        return False
    return True


def command_name(process_id: int | str) -> str | None:
    """A process's command name (/proc/PID/comm; ``"self"``: this
    process's), None if it cannot be read (the process is gone)."""
    try:
        with open(f"/proc/{process_id}/comm", "rb") as comm:
            return comm.read().strip().decode("utf-8", errors="replace")
    except OSError:
        return None
