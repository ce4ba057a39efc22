"""Workers and a process harness for test_crash.py, test_dead_subscribers.py
and test_multiprocess.py (the ``procs`` fixture of conftest.py).

The workers run in spawned processes through ``mpworkers.main`` and report
like the workers of ``mpworkers``: ``report("ready")`` once they have joined
the channel, then whatever they have to say; an exception is reported as
``("error", label, traceback)``. ``Processes`` (used by the tests, never by
the workers) starts them, collects their reports, and kills what is left.
Each worker reports on a pipe of its own, so that killing one never blocks
the others.

Messages are ``mpworkers.numbered_message(publisher id, sequence)``.
"""
import multiprocessing
import multiprocessing.connection
import os
import signal
import time

import mpworkers
from kickmsg import Publisher, SharedRegion, Subscriber
from kickmsg.verify import faults

CTX = multiprocessing.get_context("spawn")
STARTUP_S = 60  # for a spawned interpreter to import kickmsg and join, on a loaded machine
RUN_S = 90  # for any phase of a test to finish
RECEIVE_SLICE_S = 0.05  # how long a subscriber blocks before checking `done`
VICTIM_MESSAGE_LIMIT = 1_000  # a crashing publisher that gets this far never reached its crash point


# -- workers (run in spawned processes) -------------------------------------------


def _wait_for_event(event, what: str) -> None:
    if not event.wait(mpworkers.GIVE_UP_S):
        raise RuntimeError(f"never told to {what}")


def wait_for_room(gates, capacity: int, index: int) -> None:
    """Before message ``index``, wait until it cannot lap a gated subscriber.

    ``gates`` holds ``(progress, first_position, stuck_at)`` per subscriber:
    its shared count of ring positions passed, the ring position of our
    message 0, and the position it is stuck at for good (an entry a crashed
    publisher claimed and never committed; -1 if none). Only the publisher
    that wraps onto that entry can unstick it, so that one message may go.
    """
    for progress, first_position, stuck_at in gates:
        position = first_position + index

        def has_room(progress=progress, position=position, stuck_at=stuck_at):
            passed = progress.value
            return position - passed < capacity or (passed == stuck_at and position == stuck_at + capacity)

        mpworkers.wait_until(has_room, f"room at ring position {position} (subscriber at {progress.value})")


def _read(number) -> int:
    """The value of an int or of a shared value."""
    return number.value if hasattr(number, "value") else number


def crashing_publisher(
    report, name, publisher_id, point, skip, go, stopped, gates=(), capacity=0, count=VICTIM_MESSAGE_LIMIT
):
    """Publish up to ``count`` numbered messages once ``go`` is set (gated,
    see ``wait_for_room``), with ``point`` armed: after ``skip`` occurrences
    of it the process sets ``stopped`` and stops itself (SIGSTOP), to be
    killed there by the test, or let go on (SIGCONT) as a slow publisher."""
    region = SharedRegion.open(name)

    def notify(reached):
        stopped.value = 1  # shared memory: visible at once, unlike a queue

    faults.crash_at(region, point, skip, notify)
    pub = Publisher(region)
    report("ready")
    _wait_for_event(go, "start")
    for sequence in range(count):
        wait_for_room(gates, capacity, sequence)
        mpworkers.send_retrying(pub, mpworkers.numbered_message(publisher_id, sequence))
    if not stopped.value:
        raise RuntimeError(f"published {count} messages without stopping at {point}")
    report("result", {"published": count, "dropped": pub.dropped})


def gated_publisher(report, name, publisher_id, count, go, gates, capacity):
    """Publish ``count`` numbered messages once ``go`` is set, none of them
    lapping a gated subscriber (``wait_for_room``). A gate's first position
    and stuck position may be shared values, read when ``go`` is set.
    Reports ``dropped``."""
    pub = Publisher(SharedRegion.open(name))
    report("ready")
    _wait_for_event(go, "start")
    gates = [(progress, _read(first), _read(stuck_at)) for progress, first, stuck_at in gates]
    for sequence in range(count):
        wait_for_room(gates, capacity, sequence)
        mpworkers.send_retrying(pub, mpworkers.numbered_message(publisher_id, sequence))
    report("result", {"dropped": pub.dropped})


def counting_subscriber(report, name, done, progress):
    """Receive and check numbered messages until ``done`` is set, then take
    the rest and leave. ``progress`` always holds received + lost, the ring
    positions passed so far (the subscriber joined at position 0)."""
    sub = Subscriber(SharedRegion.open(name))
    report("ready")
    check = mpworkers.StreamCheck()
    while not done.is_set():
        data = sub.receive(timeout=RECEIVE_SLICE_S)
        if data is not None:
            check.add(data)
        progress.value = check.received + sub.lost
    mpworkers.drain_rest(sub, sub.try_receive, check.add)
    result = check.summary()
    result["lost"] = sub.lost
    result["last"] = dict(check.last)  # publisher id -> last sequence received
    sub.close()
    result["drain_timeouts"] = sub.drain_timeouts
    report("result", result)


def parked_subscriber(report, name):
    """Subscribe, report ``ready`` with our pid, then wait to be killed."""
    sub = Subscriber(SharedRegion.open(name))
    report("ready", os.getpid())
    time.sleep(mpworkers.GIVE_UP_S)
    raise RuntimeError(f"was not killed (still subscribed: {sub})")


def closing_subscriber(report, name, go):
    """Subscribe, report ``ready`` with our pid; close once ``go`` is set."""
    sub = Subscriber(SharedRegion.open(name))
    report("ready", os.getpid())
    _wait_for_event(go, "close")
    sub.close()
    report("result", sub.drain_timeouts)


def subscriber_stopping_after_leaving(report, name, go, stopped):
    """Subscribe; once ``go`` is set, close, but stop (SIGSTOP, to be killed)
    as soon as the subscriber's core has left (freed) the ring, before the
    rest of the teardown. (Fault injection from outside: the teardown calls
    the core's ``close``, replaced here on this subscriber's core.)"""
    region = SharedRegion.open(name)
    sub = Subscriber(region)
    close = sub.core.close

    def close_then_stop(*args, **kwargs):
        left = close(*args, **kwargs)
        stopped.value = 1
        os.kill(os.getpid(), signal.SIGSTOP)
        return left

    sub.core.close = close_then_stop
    report("ready", os.getpid())
    _wait_for_event(go, "close")
    sub.close()
    raise RuntimeError("the teardown did not go through the core's close: the fault was not injected")


def publish_until_stopped(report, name, publisher_id, go, stop, published):
    """Publish numbered messages from ``go`` until ``stop``; ``published``
    counts them as they go. Reports the count."""
    pub = Publisher(SharedRegion.open(name))
    report("ready")
    _wait_for_event(go, "start")
    deadline = time.monotonic() + mpworkers.GIVE_UP_S
    sequence = 0
    while not stop.is_set():
        if time.monotonic() > deadline:
            raise RuntimeError(f"never told to stop ({sequence} messages published)")
        mpworkers.send_retrying(pub, mpworkers.numbered_message(publisher_id, sequence))
        sequence += 1
        published.value = sequence
    report("result", {"published": sequence, "dropped": pub.dropped})


# -- the test side ------------------------------------------------------------------


def fail(message: str):
    """Fail the test (pytest's own failure, not an AssertionError: a test
    marked xfail(raises=AssertionError) for a known bug still fails when its
    set-up goes wrong). pytest is imported here only, never by workers."""
    import pytest

    pytest.fail(message, pytrace=False)


def require(condition, message: str) -> None:
    """A precondition of a test: ``fail`` unless it holds."""
    if not condition:
        fail(message)


def process_state(pid: int) -> str:
    """The state letter of /proc/<pid>/stat ('T' = stopped), '' if gone."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as stat:
            return stat.read().rpartition(b")")[2].split()[0].decode()
    except (OSError, IndexError):
        return ""


def process_start_ticks(pid: int) -> int:
    """Field 22 of /proc/<pid>/stat: when the process started, in clock ticks."""
    with open(f"/proc/{pid}/stat", "rb") as stat:
        return int(stat.read().rpartition(b")")[2].split()[19])


class PipeReports:
    """What ``mpworkers.main`` calls ``queue``: ``put`` sends on a pipe of
    this worker's own. A worker killed halfway through a report only spoils
    its own pipe (a shared multiprocessing.Queue would stay locked by it,
    and block every other worker's reports)."""

    def __init__(self, connection):
        self.connection = connection

    def put(self, item) -> None:
        self.connection.send(item)


class Processes:
    """Workers in spawned processes and their reports. Every wait is bounded
    and fails the test (``fail``) naming what did not happen."""

    def __init__(self):
        self.processes = {}  # label -> Process
        self.pipes = {}  # label -> the reading end of its report pipe, until it is closed
        self.reports = {}  # (kind, label) -> value

    def start(self, label, worker, *args):
        reader, writer = CTX.Pipe(duplex=False)
        process = CTX.Process(
            target=mpworkers.main, args=(PipeReports(writer), label, worker, *args), name=label, daemon=True
        )
        process.start()
        writer.close()  # the child's copy is the only writer: its exit closes the pipe
        self.processes[label] = process
        self.pipes[label] = reader
        return process

    def pid(self, label) -> int:
        return self.processes[label].pid

    def _collect(self, timeout: float) -> bool:
        """Take the reports that are ready (waiting up to ``timeout``); False
        if none came. A worker's error fails the test at once."""
        labels = {pipe: label for label, pipe in self.pipes.items()}
        got = False
        for pipe in multiprocessing.connection.wait(list(labels), timeout):
            try:
                kind, label, value = pipe.recv()
            except (EOFError, OSError):  # exited (or killed mid-report): nothing more from it
                pipe.close()
                del self.pipes[labels[pipe]]
                continue
            if kind == "error":
                fail(f"worker {label} failed:\n{value}")
            self.reports[kind, label] = value
            got = True
        if not labels:
            time.sleep(timeout)
        return got

    def wait_for(self, kind, labels, timeout=RUN_S) -> dict:
        """Wait until each of ``labels`` has reported ``kind``; {label: value}."""
        deadline = time.monotonic() + timeout
        while missing := [label for label in labels if (kind, label) not in self.reports]:
            if self._collect(0.2):
                continue
            silent = [(label, self.processes[label].exitcode) for label in missing if label not in self.pipes]
            if silent:
                fail(f"workers exited before reporting {kind!r} (label, exit code): {silent}")
            if time.monotonic() > deadline:
                fail(f"no {kind!r} report within {timeout} s from {missing}")
        return {label: self.reports[kind, label] for label in labels}

    def start_ready(self, label, worker, *args):
        """Start a worker and wait for its ``ready`` report (its value)."""
        self.start(label, worker, *args)
        return self.wait_for("ready", [label], STARTUP_S)[label]

    def wait_until(self, condition, what: str, timeout=RUN_S) -> None:
        """Poll ``condition`` (collecting reports meanwhile, so that a worker's
        error fails at once), at most ``timeout`` seconds."""
        deadline = time.monotonic() + timeout
        while not condition():
            if time.monotonic() > deadline:
                fail(f"gave up after {timeout} s waiting for {what}")
            self._collect(0.002)

    def wait_stopped(self, label, stopped) -> None:
        """Wait until the worker has said it reached its crash point and the
        kernel shows it stopped."""
        pid = self.pid(label)
        self.wait_until(
            lambda: stopped.value == 1 and process_state(pid) == "T",
            f"{label} (pid {pid}) to stop at its crash point (state {process_state(pid)!r}, flag {stopped.value})",
        )

    def kill(self, label) -> None:
        """SIGKILL a worker (even a stopped one) and reap it."""
        process = self.processes[label]
        os.kill(process.pid, signal.SIGKILL)
        process.join(RUN_S)
        require(process.exitcode == -signal.SIGKILL, f"{label} ended with {process.exitcode}, not by SIGKILL")

    def join(self, labels, timeout=RUN_S) -> None:
        """Wait for these workers to exit with code 0; kill stragglers."""
        deadline = time.monotonic() + timeout
        for label in labels:
            self.processes[label].join(max(0.0, deadline - time.monotonic()))
        stuck = [label for label in labels if self.processes[label].is_alive()]
        for label in stuck:
            self.processes[label].kill()
            self.processes[label].join(5)
        require(not stuck, f"workers still running after {timeout} s (killed): {stuck}")
        failed = {label: self.processes[label].exitcode for label in labels if self.processes[label].exitcode != 0}
        require(not failed, f"workers exited with non-zero codes: {failed}")

    def kill_all(self) -> None:
        """Kill whatever still runs (stopped processes included) and reap it."""
        for process in self.processes.values():
            if process.is_alive():
                process.kill()
            process.join(5)
        for pipe in self.pipes.values():
            pipe.close()
