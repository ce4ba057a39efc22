"""Who may map a channel: file modes of regions and sidecars (beyond 0.1.0).

Regions and their ``.owners`` sidecars are created 0600 (only the creating
user) unless ``mode=`` or ``$KICKMSG_SHM_MODE`` (octal, as the native
library from 0.9 reads it) asks for another; the process umask applies to a
region as to any new file, and a sidecar gets exactly its region's bits.
A second user is a spawned child of this (root) test process that switches
to ``nobody`` before it touches the region.
"""
import contextlib
import io
import multiprocessing
import os
import pwd
import stat

import pytest

from conftest import on_layout4
from kickmsg import ChannelType, Config, SharedRegion, Subscriber, cli, shm
from kickmsg.ops import diagnostics

SMALL = dict(max_subscribers=2, sub_ring_capacity=8, pool_size=16, max_payload_size=64)
NOBODY = pwd.getpwnam("nobody")


def mode_of(path: str) -> int:
    return stat.S_IMODE(os.stat(path).st_mode)


@contextlib.contextmanager
def umask(value: int):
    previous = os.umask(value)
    try:
        yield
    finally:
        os.umask(previous)


def act_as_nobody(action: str, name: str, results) -> None:
    """In a spawned child (single-threaded, root): become user nobody, then
    do ``action`` on region ``name``; put its result, or the exception it
    raised, on ``results``.

    What the action imports is imported first, as root: the checkout (and
    the virtualenv in it) may sit in a directory only root can read."""
    cli.build_parser()  # imports what the commands import lazily
    os.setgroups([])
    os.setgid(NOBODY.pw_gid)
    os.setuid(NOBODY.pw_uid)
    try:
        if action == "open":
            outcome = {"result": SharedRegion.open(name).name}
        elif action == "inspect":
            outcome = {"result": SharedRegion.inspect(name).geometry.pool_size}
        elif action == "diagnostics":
            outcome = {"result": diagnostics.stats(name).pool_size}
        elif action.startswith("kickmsg "):  # a command, the region last: its exit status and its stderr
            stderr = io.StringIO()
            with contextlib.redirect_stderr(stderr):
                outcome = {"status": cli.main([*action.split()[1:], name]), "stderr": stderr.getvalue()}
        else:  # "subscribe": join, say whether the ring's owner was recorded, leave
            subscriber = Subscriber(SharedRegion.open(name))
            outcome = {"result": subscriber._sidecar is not None}
            subscriber.close()
    except Exception as error:  # reported to the test, which asserts on it
        outcome = {"error": type(error).__name__, "message": str(error),
                   "is_permission_error": isinstance(error, PermissionError)}
    results.put(outcome)


def as_nobody(action: str, name: str) -> dict:
    """``act_as_nobody`` in a spawned child; what it reported."""
    context = multiprocessing.get_context("spawn")
    results = context.Queue()
    child = context.Process(target=act_as_nobody, args=(action, name, results))
    child.start()
    try:
        return results.get(timeout=60)
    finally:
        child.join(10)
        if child.is_alive():
            child.kill()


@on_layout4
def test_a_new_region_and_its_sidecar_are_0600_by_default(shm_name, monkeypatch):
    monkeypatch.delenv(shm.MODE_VARIABLE, raising=False)
    with umask(0):  # 0600 is the default itself, not an effect of the umask
        region = SharedRegion.create(shm_name, ChannelType.PubSub, Config(**SMALL))
        Subscriber(region).close()
    assert mode_of(f"/dev/shm{shm_name}") == 0o600
    assert mode_of(f"/dev/shm{shm_name}.kickmsg-subscribers") == 0o600


@on_layout4
def test_the_environment_and_the_keyword_choose_the_mode(shm_name, monkeypatch):
    """KICKMSG_SHM_MODE sets the mode of new regions; mode= wins over it;
    the umask applies as to any file; the sidecar gets the region's bits
    exactly, whatever the umask of the subscriber that makes it."""
    monkeypatch.setenv(shm.MODE_VARIABLE, "0640")
    with umask(0o022):
        region = SharedRegion.create(shm_name, ChannelType.PubSub, Config(**SMALL))
    assert mode_of(f"/dev/shm{shm_name}") == 0o640
    with umask(0o077):
        Subscriber(region).close()
    assert mode_of(f"/dev/shm{shm_name}.kickmsg-subscribers") == 0o640
    with umask(0o022):
        SharedRegion.create(shm_name + "_k", ChannelType.PubSub, Config(**SMALL), mode=0o666)
    assert mode_of(f"/dev/shm{shm_name}_k") == 0o644  # the umask took the write bits of group and others
    shm.unlink(shm_name + "_k")
    with umask(0):
        SharedRegion.create_or_open(shm_name + "_o", ChannelType.PubSub, Config(**SMALL), mode=0o660)
    assert mode_of(f"/dev/shm{shm_name}_o") == 0o660
    shm.unlink(shm_name + "_o")


@pytest.mark.parametrize("text", ["0999", "rw-r--r--", "01777", "-1"])
@on_layout4
def test_an_invalid_mode_in_the_environment_is_refused_by_name(shm_name, monkeypatch, text):
    monkeypatch.setenv(shm.MODE_VARIABLE, text)
    with pytest.raises(ValueError, match=f"KICKMSG_SHM_MODE={text!r} is not"):
        SharedRegion.create(shm_name, ChannelType.PubSub, Config(**SMALL))
    assert not os.path.exists(f"/dev/shm{shm_name}")


def test_an_invalid_mode_keyword_is_refused_by_name(shm_name):
    with pytest.raises(ValueError, match="mode=0o1777 is not a permission mode"):
        SharedRegion.create(shm_name, ChannelType.PubSub, Config(**SMALL), mode=0o1777)
    with pytest.raises(TypeError, match="mode must be an int"):
        SharedRegion.create(shm_name, ChannelType.PubSub, Config(**SMALL), mode="0600")
    assert not os.path.exists(f"/dev/shm{shm_name}")


def test_another_user_cannot_map_a_0600_region(shm_name, monkeypatch):
    """User nobody gets a PermissionError (that is also a RuntimeError)
    naming the region, its mode and its owner, from open and from inspect."""
    monkeypatch.delenv(shm.MODE_VARIABLE, raising=False)
    SharedRegion.create(shm_name, ChannelType.PubSub, Config(**SMALL))
    for action in ("open", "inspect"):
        outcome = as_nobody(action, shm_name)
        assert outcome["error"] == "RegionPermissionError" and outcome["is_permission_error"]
        assert shm_name in outcome["message"]
        assert "permission denied (mode 0600, owner root; this process runs as nobody)" in outcome["message"]


def test_the_tools_tell_another_user_the_mode_and_owner(shm_name, monkeypatch):
    """For user nobody, kickmsg's commands and kickmsg.ops.diagnostics refuse a
    0600 region in one line naming it, its mode and its owner."""
    monkeypatch.delenv(shm.MODE_VARIABLE, raising=False)
    SharedRegion.create(shm_name, ChannelType.PubSub, Config(**SMALL))
    denied = f"{shm_name} read-only: permission denied (mode 0600, owner root; this process runs as nobody)"
    outcome = as_nobody("diagnostics", shm_name)
    assert outcome["error"] == "RegionError" and denied in outcome["message"]
    for command in ("info", "stats", "audit", "watch --count 1"):
        outcome = as_nobody(f"kickmsg {command}", shm_name)
        assert outcome["status"] == 2 and outcome["stderr"].count("\n") == 1, outcome
        assert outcome["stderr"].startswith(f"kickmsg {command.split()[0]}: error: ") and denied in outcome["stderr"]
    outcome = as_nobody("kickmsg echo --count 1 --timeout 0.1", shm_name)
    assert outcome["status"] == 2 and "read-write: permission denied (mode 0600, owner root" in outcome["stderr"]


@on_layout4
def test_another_user_may_subscribe_to_a_region_made_for_everyone(shm_name):
    """With mode 0666 (and a umask that keeps it), user nobody maps the
    region, subscribes (recording itself in the sidecar, made 0666 too)
    and receives; a root process can then record itself as well."""
    with umask(0):
        region = SharedRegion.create(shm_name, ChannelType.PubSub, Config(**SMALL), mode=0o666)

    assert as_nobody("subscribe", shm_name) == {"result": True}
    sidecar = os.stat(f"/dev/shm{shm_name}.kickmsg-subscribers")
    assert (stat.S_IMODE(sidecar.st_mode), sidecar.st_uid) == (0o666, NOBODY.pw_uid)
    with Subscriber(region) as ours:
        assert ours._sidecar is not None  # root records itself in nobody's sidecar too


def test_another_user_may_inspect_a_region_readable_to_all(shm_name):
    """Mode 0644: nobody may look (inspect, read-only) but not subscribe."""
    with umask(0):
        SharedRegion.create(shm_name, ChannelType.PubSub, Config(**SMALL), mode=0o644)
    assert as_nobody("inspect", shm_name) == {"result": 16}
    outcome = as_nobody("open", shm_name)
    assert outcome["is_permission_error"] and "mode 0644, owner root" in outcome["message"]
