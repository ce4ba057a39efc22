"""Code run by user nobody: a spawned child (single-threaded, root) drops
root first, and its one result comes back over a queue."""
import multiprocessing
import os
import pwd

from kickmsg import cli

NOBODY = pwd.getpwnam("nobody")


def become_nobody() -> None:
    """Import what the commands import lazily, as root (the interpreter and
    the checkout may sit in directories only root can read), then become
    user nobody."""
    cli.build_parser()
    os.setgroups([])
    os.setgid(NOBODY.pw_gid)
    os.setuid(NOBODY.pw_uid)


def in_a_spawned_child(target, *args) -> dict:
    """``target(*args, results)`` in a spawned child; the dict it put on
    ``results``. The child is killed if it is still running after that."""
    context = multiprocessing.get_context("spawn")
    results = context.Queue()
    child = context.Process(target=target, args=(*args, results))
    child.start()
    try:
        return results.get(timeout=60)
    finally:
        child.join(10)
        if child.is_alive():
            child.kill()
