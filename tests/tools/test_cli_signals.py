"""Stopping the ``kickmsg`` command: SIGTERM and SIGHUP end every command
that holds a ring or runs until stopped exactly as Ctrl-C does (ring left,
files closed, summary printed, exit status 0); a second signal forces it out
(130); output into a closed pipe ends it quietly; a re-created channel is
followed with a notice.

Every command runs as a real subprocess, fed by another real process; every
wait is bounded. No timing assertions.
"""
import fcntl
import json
import os
import pathlib
import signal
import subprocess
import sys
import time

import pyarrow.parquet
import pytest

from conftest import on_layout4
import rawregion
from kickmsg import ChannelType, Config, Publisher, SharedRegion, Subscriber, audit, unlink_shm
from kickmsg import atomics, owners
from nativepeer import start_ours
from test_cli import SMALL, Running, command_line, first_line, live_rings, make, wait_live
from test_cli import name  # noqa: F401  (fixture)

# These tests check layout 4's own: subscribers followed through their owner records.
pytestmark = [pytest.mark.timeout(120), on_layout4]

FEEDER = r"""
import select
region = kickmsg.SharedRegion.open(P["name"])
publisher = kickmsg.Publisher(region)
ready()
sent = 0
while not select.select([sys.stdin], [], [], 0.002)[0]:  # until told to stop, a message every 2 ms
    try:
        publisher.send(b"tick %d" % sent)
        sent += 1
    except BlockingIOError:
        pass
done(sent)
"""


def assert_ring_left(name: str) -> None:
    """No Live ring, no owner record, and a clean audit (the channel is quiescent)."""
    assert live_rings(name) == []
    assert all(record is None for record, _ in owners.read_owners(name, SMALL["max_subscribers"]) or [])
    report = audit(SharedRegion.inspect(name))
    assert report.clean, report.verdict


def wait_read(name: str, count: int, timeout: float = 20) -> None:
    """Wait until a subscriber of ours records (in its owner record, brought
    up to date at least every 0.1 s) that it has read ``count`` messages."""
    deadline = time.monotonic() + timeout
    while not any(record is not None and record.read_pos - record.start_pos >= count
                  for record, _ in owners.read_owners(name, SMALL["max_subscribers"]) or []):
        assert time.monotonic() < deadline, f"no subscriber of {name} read {count} message(s)"
        time.sleep(0.01)


def stop_while_fed(name: str, command: Running, number: int, subscribes: bool = True):
    """Let ``command`` run on a channel fed by another process (until it has
    read a few messages, if it subscribes), send it ``number``, and return
    its result once it has ended (the feeder stopped)."""
    with start_ours(FEEDER, name=name, timeout=60) as feeder:
        feeder.wait_ready()
        if subscribes:
            wait_live(name, 1, command)
            wait_read(name, 3)
        command.proc.send_signal(number)
        result = command.finish()
        feeder.tell()
        assert feeder.result() > 0
    return result


@pytest.mark.parametrize("number", [signal.SIGTERM, signal.SIGHUP, signal.SIGINT], ids=lambda n: signal.Signals(n).name)
@pytest.mark.parametrize("command", ["echo", "hz", "bw"])
def test_stop_signal_ends_a_subscribing_command_cleanly(name, command, number):
    """echo, hz and bw end with exit status 0 on SIGTERM, SIGHUP or SIGINT,
    print their final report, and leave their ring Free with no owner record."""
    make(name)
    with Running(command, name, "--json") as running:
        result = stop_while_fed(name, running, number)
    assert result.code == 0, result.err
    if command == "echo":
        lines = result.json_lines()
        assert lines and all(line["text"].startswith("tick ") for line in lines)
    else:
        report = result.json_lines()[-1]
        assert (report["final"], report["stopped"]) == (True, "signal")
        assert report["messages"] > 0
    assert_ring_left(name)


@pytest.mark.parametrize("number", [signal.SIGTERM, signal.SIGHUP], ids=lambda n: signal.Signals(n).name)
def test_stop_signal_closes_a_recording(name, tmp_path, number):
    """record ends with exit status 0: its ring is left, its summary
    printed, and every file complete (no .partial) with every message counted."""
    make(name)
    with Running("record", name, "--out", tmp_path, "--json") as running:
        result = stop_while_fed(name, running, number)
    assert result.code == 0, result.err
    summary = result.json()
    messages = summary["channels"][name]["messages"]
    assert messages > 0
    assert sorted(os.listdir(tmp_path)) == sorted(os.path.basename(file) for file in summary["files"])
    assert not any(file.endswith(".partial") for file in os.listdir(tmp_path))
    assert pyarrow.parquet.read_table(tmp_path).num_rows == messages
    assert_ring_left(name)


@pytest.mark.parametrize("number", [signal.SIGTERM, signal.SIGHUP], ids=lambda n: signal.Signals(n).name)
def test_stop_signal_ends_watch(name, number):
    """watch ends between refreshes: whole JSON lines, exit status 0."""
    make(name)
    with Running("watch", name, "--interval", "0.05", "--json") as running:
        assert json.loads(first_line(running))["name"] == name
        result = stop_while_fed(name, running, number, subscribes=False)
    assert result.code == 0, result.err
    assert all(refresh["name"] == name for refresh in result.json_lines())


@pytest.mark.parametrize("number", [signal.SIGTERM, signal.SIGHUP], ids=lambda n: signal.Signals(n).name)
def test_stop_signal_ends_pub_between_sends(name, number):
    """pub --rate --count stops between two sends and says how many it published."""
    region = make(name)
    with Subscriber(region) as subscriber, Running("pub", name, "beat", "--rate", "50", "--count", "100000", "--json") as pub:
        assert subscriber.receive(20) == b"beat"
        pub.proc.send_signal(number)
        result = pub.finish()
        assert result.code == 0, result.err
        published = result.json()["published"]
        assert 0 < published < 100000
        received = 1 + sum(1 for _ in iter(subscriber.try_receive, None))
    assert received + subscriber.lost == published


def test_stop_signal_ends_play(name, tmp_path):
    """play --loop ends on SIGTERM with its summary and exit status 0."""
    region = make(name)
    with Running("record", name, "--out", tmp_path, "--duration", "1") as recording:
        wait_live(name, 1, recording)
        publisher = Publisher(region)
        for index in range(20):
            publisher.send(b"recorded %d" % index)
        assert recording.finish().code == 0
    with Subscriber(region) as listener, Running("play", tmp_path, "--loop", "--json") as play:
        assert listener.receive(20).startswith(b"recorded ")
        play.proc.send_signal(signal.SIGTERM)
        result = play.finish()
    assert result.code == 0, result.err
    summary = result.json()
    assert summary["channels"] == [name] and summary["messages"] > 0


def pipe_write_blocked(pid: int) -> bool:
    """Whether the process sleeps in a write to a full pipe (its kernel wait channel)."""
    return "pipe_write" in pathlib.Path(f"/proc/{pid}/wchan").read_text()


def test_second_signal_forces_out(name):
    """echo blocked writing into a full pipe (seen in its kernel wait
    channel): the first SIGTERM asks it to stop, which it cannot do before
    the write completes; a later one forces it out at once with exit status
    130, as a crash: its ring stays Live, held by a dead subscriber (the
    next join or kickmsg repair reclaims it)."""
    region = make(name)
    reader, writer = os.pipe()
    fcntl.fcntl(reader, fcntl.F_SETPIPE_SZ, 4096)
    echo = subprocess.Popen(command_line(["echo", name, "--format", "hex"]), stdout=writer, stderr=subprocess.PIPE)
    os.close(writer)
    try:
        wait_live(name, 1)
        publisher = Publisher(region)
        deadline = time.monotonic() + 30
        while not pipe_write_blocked(echo.pid):
            assert time.monotonic() < deadline and echo.poll() is None, "echo never blocked on its full pipe"
            publisher.send(bytes(64))
            time.sleep(0.002)
        while echo.poll() is None and time.monotonic() < deadline:  # signals do not queue: repeat until one forces it
            echo.send_signal(signal.SIGTERM)
            time.sleep(0.2)
        assert echo.wait(timeout=10) == 130
        assert echo.stderr.read() == b""
    finally:
        if echo.poll() is None:
            echo.kill()
        echo.wait(timeout=10)
        echo.stderr.close()
        os.close(reader)
    assert region.dead_subscriber_rings() == [(0, echo.pid)]


# -- closed pipes -----------------------------------------------------------------------------


def test_echo_into_head_ends_quietly(name):
    """kickmsg echo NAME | head -2: head prints two messages and exits; echo
    ends at its next write with exit status 0, no message, its ring left."""
    region = make(name)
    echo = subprocess.Popen(command_line(["echo", name]), stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    head = subprocess.Popen(["head", "-2"], stdin=echo.stdout, stdout=subprocess.PIPE)
    echo.stdout.close()  # head holds the only reading end
    try:
        wait_live(name, 1)
        publisher = Publisher(region)
        deadline = time.monotonic() + 30
        sent = 0
        while echo.poll() is None:
            assert time.monotonic() < deadline, "echo did not notice that head had gone"
            publisher.send(b"m%d" % sent)
            sent += 1
            time.sleep(0.01)
        head_out, _ = head.communicate(timeout=10)
        assert echo.returncode == 0
        assert echo.stderr.read() == b""
        assert head_out == b"[0] m0\n[1] m1\n"
    finally:
        for process in (echo, head):
            if process.poll() is None:
                process.kill()
            process.wait(timeout=10)
        echo.stderr.close()
    assert live_rings(name) == []


@pytest.mark.parametrize("args", [["info", "NAME"], ["hz", "NAME", "--duration", "0.2"], ["list", "--prefix", "NAME"]],
                         ids=lambda args: args[0])
def test_output_into_a_closed_pipe_ends_quietly(name, args):
    """Any command whose reader is gone before it writes: exit status 0, nothing on stderr."""
    make(name)
    reader, writer = os.pipe()
    os.close(reader)
    try:
        done = subprocess.run(command_line([name if arg == "NAME" else arg for arg in args]),
                              stdout=writer, stderr=subprocess.PIPE, stdin=subprocess.DEVNULL, timeout=30)
    finally:
        os.close(writer)
    assert (done.returncode, done.stderr) == (0, b"")
    assert live_rings(name) == []


# -- following a re-created channel ----------------------------------------------------------


def recreate(name: str) -> SharedRegion:
    """Re-create the channel with another geometry (a new object under the name)."""
    return SharedRegion.create(name, ChannelType.PubSub, Config(**dict(SMALL, pool_size=32)), "re-creator")


def test_echo_follows_a_re_created_channel_and_says_so(name):
    """echo notices the new region, joins it, tells it on stderr and prints
    what is published there."""
    old = make(name)
    with Running("echo", name) as echo:
        wait_live(name, 1, echo)
        Publisher(old).send(b"before")
        assert first_line(echo) == b"[0] before\n"
        new = recreate(name)
        wait_live(name, 1, echo)  # joined the new region
        Publisher(new).send(b"after")
        assert first_line(echo) == b"[0] after\n"
        echo.proc.send_signal(signal.SIGTERM)
        result = echo.finish()
    assert result.code == 0
    assert result.error_lines == [f"kickmsg echo: {name} was re-created; following it (0 messages lost: unread, or published before it rejoined)"]
    assert rawregion.header(rawregion.read_bytes(name))["pool_size"] == 32
    assert live_rings(name) == []


def test_record_follows_a_re_created_channel_and_says_so(name, tmp_path):
    """record tells the re-creation on stderr and records on in the new region."""
    old = make(name)
    with Running("record", name, "--out", tmp_path, "--json") as recording:
        wait_live(name, 1, recording)
        Publisher(old).send(b"before")
        new = recreate(name)
        wait_live(name, 1, recording)
        notice = first_line(recording, stream="stderr")
        Publisher(new).send(b"after")
        wait_read(name, 1)
        recording.proc.send_signal(signal.SIGTERM)
        result = recording.finish()
    assert result.code == 0, result.err
    assert notice.decode() == f"kickmsg record: {name} was re-created; following it (0 messages lost: unread, or published before it rejoined)\n"
    assert result.err == b""  # nothing else
    assert result.json()["channels"][name]["rejoined"] == 1
    assert pyarrow.parquet.read_table(tmp_path).column("payload").to_pylist() == [b"before", b"after"]


# -- Ctrl-C at any moment ---------------------------------------------------------------------

SIGTERM_BIT = 1 << (signal.SIGTERM - 1)  # in /proc/PID/status SigCgt: Python itself leaves SIGTERM alone
STARTUP_DELAYS = (0.0, 0.1, 0.3)  # seconds after the command took the stop signals: its imports, then its work
STOPPED_CLEANLY, ERROR = 0, 2
# 130, or killed by SIGINT itself (-2: in the last moments of the interpreter's
# shutdown, Python has given the default disposition back); a shell shows 130 for both
INTERRUPTED = (130, -signal.SIGINT)

EVERY_COMMAND = [  # arguments (NAME: a region of the test, TMP: a directory of it) and the status without Ctrl-C
    (["list", "--prefix", "NAME"], 0), (["info", "NAME"], 0), (["stats", "NAME"], 0), (["schema", "NAME"], 0),
    (["schema-diff", "NAME", "NAME"], 0), (["diagnose", "NAME"], 0), (["audit", "NAME"], 0), (["repair", "NAME"], 0),
    (["clean", "--dry-run", "--prefix", "NAME"], 0), (["create", "NAME_new"], 0), (["rm", "NAME_none"], ERROR),
    (["watch", "NAME", "--interval", "0.05"], STOPPED_CLEANLY), (["echo", "NAME"], STOPPED_CLEANLY),
    (["hz", "NAME"], STOPPED_CLEANLY), (["bw", "NAME"], STOPPED_CLEANLY),
    (["pub", "NAME", "beat", "--rate", "20", "--count", "100000"], STOPPED_CLEANLY),
    (["record", "NAME", "--out", "TMP/rec"], STOPPED_CLEANLY), (["play", "TMP/none"], ERROR),
    (["convert", "TMP/none", "TMP/out.mcap"], ERROR), (["analyze", "TMP/none"], ERROR),
    (["bridge", "--export", "NAME", "--listen", "tcp/127.0.0.1:0"], STOPPED_CLEANLY),
    (["exporter", "--port", "0", "--prefix", "NAME"], STOPPED_CLEANLY),
    (["crosscheck", "--other-python", sys.executable, "--ops", "20"], 0), (["verify", "--seed", "1", "--runs", "5"], 0),
]


def took_stop_signals(pid: int) -> bool:
    """Whether the process catches SIGTERM: the command's ``main`` has begun
    (before it, only the interpreter's own start-up and the import of the
    kickmsg package run, where nothing of the command is in place yet)."""
    status = pathlib.Path(f"/proc/{pid}/status").read_text()
    caught = next(line for line in status.splitlines() if line.startswith("SigCgt:"))
    return bool(int(caught.split()[1], 16) & SIGTERM_BIT)


def interrupt_after(args: list[str], delay: float) -> tuple[int, str, bool]:
    """Run ``kickmsg ARGS``, send it SIGINT ``delay`` seconds after its main
    has begun; its exit status, its stderr, and whether the signal was sent
    (False: the command had ended before)."""
    command = subprocess.Popen(command_line(args), stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                               stderr=subprocess.PIPE, start_new_session=True)
    try:
        deadline = time.monotonic() + 60
        while not took_stop_signals(command.pid):  # it holds them from then to its exit
            assert command.poll() is None, f"kickmsg {args[0]} ended without taking the stop signals"
            assert time.monotonic() < deadline, f"kickmsg {args[0]} never took the stop signals"
            time.sleep(0.001)
        end_of_delay = time.monotonic() + delay
        while command.poll() is None and time.monotonic() < end_of_delay:
            time.sleep(0.005)
        sent = command.poll() is None
        if sent:
            command.send_signal(signal.SIGINT)
        _, err = command.communicate(timeout=60)
        return command.returncode, err.decode(errors="replace"), sent
    finally:
        if command.poll() is None:
            os.killpg(command.pid, signal.SIGKILL)
            command.wait(timeout=10)


@pytest.mark.parametrize("args,status", EVERY_COMMAND, ids=[args[0] for args, _ in EVERY_COMMAND])
def test_ctrl_c_while_a_command_starts_or_works_ends_it_quietly(name, tmp_path, args, status):
    """SIGINT at a few points from the start of the command's main (while it
    imports its commands, then while it works): it ends with status 130, or
    stops cleanly as a command that runs until stopped does (or had ended
    with its usual status), and never prints a traceback."""
    make(name)
    args = [arg.replace("NAME", name).replace("TMP", str(tmp_path)) for arg in args]
    try:
        for delay in STARTUP_DELAYS:
            code, err, sent = interrupt_after(args, delay)
            assert "Traceback" not in err and "Exception ignored" not in err, (delay, err)
            assert code in ({*INTERRUPTED, status} if sent else {status}), (delay, code, err)
    finally:
        unlink_shm(f"{name}_new")


@pytest.mark.parametrize("args", [["record", "NAME", "--out", "TMP"], ["echo", "NAME"],
                                  ["bridge", "--export", "NAME", "--listen", "tcp/127.0.0.1:0", "--json", "--stats-interval", "0.1"]],
                         ids=lambda args: args[0])
def test_two_ctrl_c_end_a_command_that_cannot_stop(name, tmp_path, args):
    """A command blocked writing into a full pipe (its banner, a message,
    its figures) cannot stop on the first SIGINT; a second one ends it with
    status 130 and no traceback."""
    region = make(name)
    reader, writer = os.pipe()
    fcntl.fcntl(reader, fcntl.F_SETPIPE_SZ, 4096)
    os.set_blocking(writer, False)
    try:
        while True:
            os.write(writer, bytes(4096))  # filled: the command's first write blocks
    except BlockingIOError:
        os.set_blocking(writer, True)
    command = subprocess.Popen(command_line([arg.replace("NAME", name).replace("TMP", str(tmp_path)) for arg in args]),
                               stdin=subprocess.DEVNULL, stdout=writer, stderr=subprocess.PIPE)
    os.close(writer)
    try:
        deadline = time.monotonic() + 60
        publisher = Publisher(region)
        while not pipe_write_blocked(command.pid):
            assert command.poll() is None and time.monotonic() < deadline, f"{args[0]} never blocked on its full pipe"
            publisher.send(b"tick")  # what echo prints
            time.sleep(0.01)
        while command.poll() is None and time.monotonic() < deadline:  # signals do not queue: repeat until a second one counts
            command.send_signal(signal.SIGINT)
            try:
                command.wait(timeout=0.2)
            except subprocess.TimeoutExpired:
                pass
        assert command.wait(timeout=10) == 130
        assert b"Traceback" not in command.stderr.read()
    finally:
        if command.poll() is None:
            command.kill()
        command.wait(timeout=10)
        command.stderr.close()
        os.close(reader)


INTERRUPT_AT_IMPORT = r"""
import importlib.abc, os, runpy, signal, sys

MODULE = sys.argv[1]

class InterruptAtImport(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path, target=None):
        if name == MODULE:
            os.kill(os.getpid(), signal.SIGINT)
        return None

sys.meta_path.insert(0, InterruptAtImport())
sys.argv = [os.path.join(os.path.dirname(sys.executable), "kickmsg"), *sys.argv[2:]]  # as the console script
runpy.run_module("kickmsg", run_name="__main__")
"""


@pytest.mark.parametrize("module", ["hashlib", "kickmsg.config", "numpy", "kickmsg.region", "kickmsg.cli",
                                    "kickmsg.cli.inspecting"])
def test_ctrl_c_while_the_package_imports_ends_the_command_quietly(name, tmp_path, module):
    """SIGINT delivered exactly while ``import kickmsg`` (then the commands)
    runs, before the command's main: status 130, no traceback. Only the
    interpreter's own start-up, before the package's first line, is left
    to Python's default handling."""
    make(name)
    done = subprocess.run([sys.executable, "-c", INTERRUPT_AT_IMPORT, module, "list", "--prefix", name],
                          stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=60, cwd=tmp_path)
    assert done.returncode == 130 and "Traceback" not in done.stderr, (done.returncode, done.stderr)


@pytest.mark.skipif(not atomics.COMPILED, reason="only the compiled build runs verify again on the pure build")
def test_ctrl_c_while_verify_starts_again_on_the_pure_build_ends_it_quietly():
    """``kickmsg verify`` replaces itself with the same command on the pure
    build (execve). SIGINT sent as soon as the new image runs (its
    interpreter starting, then importing the package) ends it with 130 and
    no traceback: the stop signals stay blocked across the exec until its
    main has taken them."""
    command = subprocess.Popen(command_line(["verify", "--seed", "1", "--runs", "5"]), stdin=subprocess.DEVNULL,
                               stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, start_new_session=True)
    cmdline = pathlib.Path(f"/proc/{command.pid}/cmdline")
    try:
        deadline = time.monotonic() + 60
        while b"\0-m\0kickmsg\0" not in cmdline.read_bytes():  # the console script, until the exec
            assert command.poll() is None, "kickmsg verify ended without running again on the pure build"
            assert time.monotonic() < deadline, "kickmsg verify never ran again on the pure build"
            time.sleep(0.0005)
        os.kill(command.pid, signal.SIGINT)
        _, err = command.communicate(timeout=60)
    finally:
        if command.poll() is None:
            command.kill()
            command.wait()
    assert command.returncode in INTERRUPTED and "Traceback" not in err.decode(), (command.returncode, err)
