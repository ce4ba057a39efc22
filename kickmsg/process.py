"""The id of this process, read without a system call.

Received views and allocated slots note the process that made them, so a
forked child's copy never releases what belongs to its parent. glibc does
not cache ``getpid()``: each ``os.getpid()`` is a system call, twice per
message on those paths. ``pid`` is read once, and again in every child
forked through ``os.fork`` (``multiprocessing`` included).
"""
import os

pid = os.getpid()


def _note_child_pid() -> None:
    global pid
    pid = os.getpid()


os.register_at_fork(after_in_child=_note_child_pid)
