"""kickmsg clean among users: a region is removed only once it is proven
that no process has it open or mapped, whoever runs clean and whoever holds
it; a region goes with its sidecars as a whole or not at all.

Commands "as nobody" run in a spawned child that drops root first (as in
test_security), with umask 0 so that ``--mode 0666`` gives 0666.
"""
import contextlib
import io
import json
import multiprocessing
import os
import pwd
import shutil
import subprocess
import sys

import pytest

from conftest import on_layout4
from kickmsg import cli
from nativepeer import run_ours, start_native, start_ours

# These tests check layout 4's own: owner records in sidecar files and native 0.1.0 holders.
pytestmark = on_layout4

NOBODY = pwd.getpwnam("nobody")
SUBSCRIBER = """
subscriber = kickmsg.Subscriber(kickmsg.SharedRegion.open(P["name"]))
ready()
wait_go()
subscriber.close()
done("ok")
"""
PUBLISHER = """
publisher = kickmsg.Publisher(kickmsg.SharedRegion.open(P["name"]), name="root-publisher")
publisher.send(b"x")
ready()
wait_go()
done("ok")
"""
NATIVE_HOLDER = """
region = kickmsg.SharedRegion.open(P["name"])
ready()
wait_go()
done("ok")
"""
CREATE = """
kickmsg.SharedRegion.create(P["name"], kickmsg.ChannelType.PubSub, make_config({}), "child", mode=0o644)
done(os.getpid())
"""


def command_as_nobody(argv: list[str], results) -> None:
    """In a spawned child (root): become nobody with umask 0, run ``kickmsg
    ARGV``; put its exit status, stdout and stderr on ``results``. The
    commands are imported first, as root: the interpreter and the checkout
    may sit in directories only root can read."""
    cli.build_parser()
    os.setgroups([])
    os.setgid(NOBODY.pw_gid)
    os.setuid(NOBODY.pw_uid)
    os.umask(0)
    stdout, stderr = io.StringIO(), io.StringIO()
    try:
        with contextlib.redirect_stdout(stdout), contextlib.redirect_stderr(stderr):
            status = cli.main(argv)
        results.put({"status": status, "stdout": stdout.getvalue(), "stderr": stderr.getvalue()})
    except BaseException as error:  # reported to the test, which fails on it
        results.put({"error": repr(error)})


def as_nobody(*argv: str) -> dict:
    """``kickmsg ARGV`` run by user nobody: {"status", "stdout", "stderr"}."""
    context = multiprocessing.get_context("spawn")
    results = context.Queue()
    child = context.Process(target=command_as_nobody, args=(list(argv), results))
    child.start()
    try:
        return results.get(timeout=60)
    finally:
        child.join(10)
        if child.is_alive():
            child.kill()


def as_root(*argv: str, drop_lease: bool = False) -> dict:
    """``kickmsg ARGV`` run by root in a subprocess (without the capability
    to take leases on others' files, CAP_LEASE, if ``drop_lease``)."""
    command = [sys.executable, "-m", "kickmsg", *argv]
    if drop_lease:
        command = [shutil.which("setpriv") or "setpriv", "--bounding-set=-lease", *command]
    done = subprocess.run(command, capture_output=True, text=True, stdin=subprocess.DEVNULL, timeout=60)
    return {"status": done.returncode, "stdout": done.stdout, "stderr": done.stderr}


def files_of(name: str) -> list[str]:
    """Which of the region and its three sidecars exist, with their owners."""
    found = []
    for suffix in ("", ".kickmsg-subscribers", ".kickmsg-publishers", ".kickmsg-bridges"):
        with contextlib.suppress(FileNotFoundError):
            found.append(f"{name}{suffix} {pwd.getpwuid(os.stat(f'/dev/shm{name}{suffix}').st_uid).pw_name}")
    return found


def made_by_nobody_for_everyone(prefix: str) -> str:
    """A region nobody made with ``kickmsg create --mode 0666`` (its creator,
    that command, is dead)."""
    name = f"/{prefix}_shared"
    assert as_nobody("create", name, "--mode", "0666")["status"] == 0
    assert files_of(name) == [f"{name} nobody"] and os.stat(f"/dev/shm{name}").st_mode & 0o777 == 0o666
    return name


def test_clean_by_another_user_leaves_a_region_that_root_processes_hold(prefix):
    """The report: nobody's clean unlinked nobody's 0666 region that a root
    subscriber held (then failed on its sidecar), and its --dry-run listed
    one a root publisher mapped. Both are in use: left, and said so, with
    --force too."""
    name = made_by_nobody_for_everyone(prefix)
    in_use = f"left {name}: its creator is dead, but a process has it open or mapped\n"
    with start_ours(SUBSCRIBER, name=name) as subscriber:
        subscriber.wait_ready()
        dry = as_nobody("clean", "--prefix", prefix, "--dry-run", "--json")
        assert dry["status"] == 0, dry
        assert {key: json.loads(dry["stdout"])[key] for key in ("removed", "in_use", "failed")} == {
            "removed": [], "in_use": [name], "failed": []}
        for force in ([], ["--force"]):
            assert as_nobody("clean", "--prefix", prefix, *force) == {"status": 0, "stdout": in_use, "stderr": ""}
        assert files_of(name) == [f"{name} nobody", f"{name}.kickmsg-subscribers root"]
        subscriber.tell()
        assert subscriber.result() == "ok"
    with start_ours(PUBLISHER, name=name) as publisher:
        publisher.wait_ready()
        assert as_nobody("clean", "--prefix", prefix, "--dry-run") == {"status": 0, "stdout": in_use, "stderr": ""}
        assert as_nobody("clean", "--prefix", prefix) == {"status": 0, "stdout": in_use, "stderr": ""}
        publisher.tell()
        assert publisher.result() == "ok"
    assert files_of(name) == [f"{name} nobody", f"{name}.kickmsg-subscribers root", f"{name}.kickmsg-publishers root"]


def test_a_native_holder_keeps_a_region_from_clean(prefix):
    """A native process records nothing, but holds the region all the same."""
    name = made_by_nobody_for_everyone(prefix)
    with start_native(NATIVE_HOLDER, name=name) as holder:
        holder.wait_ready()
        assert json.loads(as_root("clean", "--prefix", prefix, "--json")["stdout"])["in_use"] == [name]
        holder.tell()
        assert holder.result() == "ok"
    assert as_root("clean", "--prefix", prefix) == {"status": 0, "stdout": f"removed {name}\n", "stderr": ""}
    assert files_of(name) == []


def test_a_region_goes_with_its_sidecars_or_not_at_all(prefix):
    """Once unused, nobody's region still has root's sidecars (made by root's
    subscriber and publisher): nobody may not remove them from sticky
    /dev/shm, so clean checks every file first, removes none and says
    which file stops it (exit 2); root's clean then removes all four."""
    name = made_by_nobody_for_everyone(prefix)
    for holder in (SUBSCRIBER, PUBLISHER):
        with start_ours(holder, name=name) as peer:
            peer.wait_ready()
            peer.tell()
            assert peer.result() == "ok"
    before = files_of(name)
    assert before == [f"{name} nobody", f"{name}.kickmsg-subscribers root", f"{name}.kickmsg-publishers root"]
    refused = as_nobody("clean", "--prefix", prefix)
    assert refused == {"status": 2, "stderr": "", "stdout": (
        f"cannot remove {name}: {name}.kickmsg-subscribers belongs to root, and in /dev/shm (sticky) only a file's owner may "
        "remove it (this process runs as nobody); nothing was removed\n")}
    assert files_of(name) == before
    rm = as_nobody("rm", name)
    assert rm["status"] == 2 and rm["stderr"].startswith(f"kickmsg rm: error: cannot remove {name}: {name}.kickmsg-subscribers belongs to root")
    assert files_of(name) == before
    assert as_root("clean", "--prefix", prefix) == {"status": 0, "stdout": f"removed {name}\n", "stderr": ""}
    assert files_of(name) == []


def test_a_region_that_cannot_be_proven_unused_is_left_unless_forced(prefix):
    """Who may not take a lease on a region (neither its owner nor holding
    CAP_LEASE) cannot tell whether a process has it open: clean leaves it,
    says why, and removes it with --force."""
    if shutil.which("setpriv") is None:
        pytest.fail("setpriv (util-linux) is needed to run clean without CAP_LEASE")
    name = made_by_nobody_for_everyone(prefix)
    left = (f"left {name}: could not prove it unused (only its owner, nobody, or a process with CAP_LEASE can tell "
            "whether a process has it open); --force removes it\n")
    assert as_root("clean", "--prefix", prefix, drop_lease=True) == {"status": 0, "stdout": left, "stderr": ""}
    assert as_root("clean", "--prefix", prefix, "--dry-run", "--force", drop_lease=True) == {
        "status": 0, "stdout": f"would remove {name}\n", "stderr": ""}
    assert files_of(name) == [f"{name} nobody"]
    assert as_root("clean", "--prefix", prefix, "--force", drop_lease=True) == {
        "status": 0, "stdout": f"removed {name}\n", "stderr": ""}
    assert files_of(name) == []


def test_nobody_cannot_prove_roots_region_unused_nor_force_its_removal(prefix):
    """A root region readable by all (0644), its creator dead: nobody cannot
    tell whether it is in use, and --force cannot remove what only root may."""
    name = f"/{prefix}_roots"
    run_ours(CREATE, name=name)
    left = (f"left {name}: could not prove it unused (only its owner, root, or a process with CAP_LEASE can tell "
            "whether a process has it open); --force removes it\n")
    assert as_nobody("clean", "--prefix", prefix) == {"status": 0, "stdout": left, "stderr": ""}
    forced = as_nobody("clean", "--prefix", prefix, "--force")
    assert forced == {"status": 2, "stderr": "", "stdout": (
        f"cannot remove {name}: {name} belongs to root, and in /dev/shm (sticky) only a file's owner may remove it "
        "(this process runs as nobody); nothing was removed\n")}
    assert files_of(name) == [f"{name} root"]


def test_clean_reports_what_it_cannot_read_and_goes_on(prefix):
    """An object nobody may not read (root's, 0600) is reported; nobody's
    own dead region is removed all the same."""
    unreadable = f"/dev/shm/{prefix}_a_private"
    os.close(os.open(unreadable, os.O_CREAT | os.O_WRONLY, 0o600))
    name = made_by_nobody_for_everyone(prefix)
    assert as_nobody("clean", "--prefix", prefix) == {"status": 0, "stderr": "", "stdout": (
        f"removed {name}\nskipped /{prefix}_a_private: cannot read it (Permission denied)\n")}
    assert os.path.exists(unreadable) and files_of(name) == []
