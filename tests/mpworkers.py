"""Workers for test_multiprocess.py; each one runs in a spawned process.

``main`` runs a worker with a ``report(kind, value=None)`` callable that puts
``(kind, label, value)`` on the test's queue: "ready" once the worker has
joined the channel, then whatever it has to say ("holding", "result"). If the
worker raises, ``("error", label, traceback)`` is reported instead.

Messages of the numbered streams are ``publisher id, sequence`` (two u32),
``sequence % 48`` filler bytes, then a CRC-32 of all that (u32).
"""
import collections
import struct
import sys
import time
import traceback
import zlib

from kickmsg import Publisher, SharedRegion, Subscriber

RECEIVE_SLICE_S = 0.05  # how long a subscriber blocks before checking `done`
POOL_RETRY_SLEEP_S = 0.0005  # a publisher's pause when the pool is empty
GIVE_UP_S = 60  # a worker stuck this long raises instead of hanging

_kept_until_exit = []  # what the "exit" variant leaves to interpreter shutdown


def main(queue, label, worker, *args):
    """Run ``worker(report, *args)``, reporting an exception as "error"."""

    def report(kind, value=None):
        queue.put((kind, label, value))

    try:
        worker(report, *args)
    except BaseException:
        report("error", traceback.format_exc())
        sys.exit(1)


# -- numbered messages ---------------------------------------------------------


def numbered_message(publisher_id: int, sequence: int) -> bytes:
    body = struct.pack("<II", publisher_id, sequence) + bytes([sequence & 0xFF]) * (sequence % 48)
    return body + struct.pack("<I", zlib.crc32(body))


def parse_numbered(data: bytes) -> tuple[int, int] | None:
    """(publisher id, sequence), or None if the message is damaged."""
    if len(data) < 12:
        return None
    body, (crc,) = data[:-4], struct.unpack("<I", data[-4:])
    if zlib.crc32(body) != crc:
        return None
    publisher_id, sequence = struct.unpack_from("<II", body)
    if body[8:] != bytes([sequence & 0xFF]) * (sequence % 48):
        return None
    return publisher_id, sequence


class StreamCheck:
    """Checks what one subscriber receives: no damaged message, no duplicate,
    each publisher's messages in increasing sequence order."""

    def __init__(self):
        self.received = 0
        self.per_publisher = {}  # publisher id -> messages received
        self.last = {}  # publisher id -> last sequence received
        self.seen = set()
        self.problem_count = 0
        self.problems = []  # the first few, described

    def add(self, data: bytes) -> None:
        self.received += 1
        parsed = parse_numbered(data)
        if parsed is None:
            self._problem(f"damaged message ({len(data)} bytes): {data[:24]!r}")
            return
        publisher_id, sequence = parsed
        if parsed in self.seen:
            self._problem(f"duplicate: publisher {publisher_id} sequence {sequence}")
        elif sequence < self.last.get(publisher_id, -1):
            self._problem(f"out of order: publisher {publisher_id} sequence {sequence} after {self.last[publisher_id]}")
        self.seen.add(parsed)
        self.last[publisher_id] = max(sequence, self.last.get(publisher_id, -1))
        self.per_publisher[publisher_id] = self.per_publisher.get(publisher_id, 0) + 1

    def _problem(self, text: str) -> None:
        self.problem_count += 1
        if len(self.problems) < 10:
            self.problems.append(text)

    def summary(self) -> dict:
        return {
            "received": self.received,
            "per_publisher": self.per_publisher,
            "problem_count": self.problem_count,
            "problems": self.problems,
        }


def drain_rest(sub: Subscriber, try_next, add) -> None:
    """Receive what is left once publishers are gone. A None from
    ``try_next`` with no new loss means the ring is empty (a None after many
    lost entries only means the call gave up early)."""
    while True:
        lost_before = sub.lost
        item = try_next()
        if item is not None:
            add(item)
        elif sub.lost == lost_before:
            return


def send_retrying(pub: Publisher, data: bytes) -> int:
    """Send, sleeping briefly while the pool is empty. Returns the retries."""
    retries = 0
    deadline = time.monotonic() + GIVE_UP_S
    while True:
        try:
            pub.send(data)
            return retries
        except BlockingIOError:
            if time.monotonic() > deadline:
                raise RuntimeError(f"pool stayed empty for {GIVE_UP_S} s ({retries} retries)") from None
            retries += 1
            time.sleep(POOL_RETRY_SLEEP_S)


def wait_until(condition, what: str) -> None:
    """Poll ``condition`` with short sleeps, at most GIVE_UP_S seconds."""
    deadline = time.monotonic() + GIVE_UP_S
    while not condition():
        if time.monotonic() > deadline:
            raise RuntimeError(f"gave up waiting for {what}")
        time.sleep(0.0002)


# -- workers ---------------------------------------------------------------------


def numbered_publisher(report, name, publisher_id, count, go, gate=None, published=None):
    """Publish ``count`` numbered messages once ``go`` is set.

    ``gate = (progress, window)``: before message i, wait until
    ``i - progress.value < window`` (to keep a subscriber from being lapped).
    ``published``: a shared counter updated after every message.
    """
    pub = Publisher(SharedRegion.open(name))
    report("ready")
    if not go.wait(GIVE_UP_S):
        raise RuntimeError("never told to start")
    retries = 0
    for sequence in range(count):
        if gate is not None:
            progress, window = gate
            wait_until(lambda: sequence - progress.value < window, f"the gate before message {sequence}")
        retries += send_retrying(pub, numbered_message(publisher_id, sequence))
        if published is not None:
            published.value = sequence + 1
    report("result", {"dropped": pub.dropped, "pool_retries": retries})


def numbered_subscriber(report, name, done, progress=None, pace=None, hold_views=0):
    """Receive and check numbered messages until ``done`` is set (after every
    publisher has exited), then take the rest and leave.

    ``progress``: a shared counter of messages received, updated as they come.
    ``pace = (published, step)``: be slow on purpose: after each message, sleep
    until ``published`` has grown by ``step`` since (or ``done`` is set).
    ``hold_views``: receive zero-copy views and keep the last ``hold_views``
    of them pinned; each is checked only when released, after more traffic,
    so a pinned slot that got reused would show.
    """
    sub = Subscriber(SharedRegion.open(name))
    report("ready")
    check = StreamCheck()
    held = collections.deque()

    def accept(item):
        if not hold_views:
            check.add(item)
            return
        held.append(item)
        while len(held) > hold_views:
            view = held.popleft()
            check.add(bytes(view))
            view.release()

    receive = sub.receive_view if hold_views else sub.receive
    while not done.is_set():
        item = receive(timeout=RECEIVE_SLICE_S)
        if item is None:
            continue
        accept(item)
        if progress is not None:
            progress.value = check.received + len(held)
        if pace is not None:
            published, step = pace
            target = published.value + step
            while published.value < target and not done.is_set():
                time.sleep(0.001)
    drain_rest(sub, sub.try_receive_view if hold_views else sub.try_receive, accept)
    for view in held:
        check.add(bytes(view))
        view.release()
    result = check.summary()
    result["lost"] = sub.lost
    sub.close()
    result["drain_timeouts"] = sub.drain_timeouts
    report("result", result)


def blocking_receiver(report, name, use_view):
    """Block in receive (or receive_view) for up to 30 s; report what came."""
    sub = Subscriber(SharedRegion.open(name))
    report("ready")
    if use_view:
        view = sub.receive_view(timeout=30)
        result = None if view is None else bytes(view)
        if view is not None:
            view.release()
    else:
        result = sub.receive(timeout=30)
    sub.close()
    report("result", result)


def view_holder(report, name, count, ending):
    """Receive ``count`` messages as views and hold them, then end by
    ``ending``: "close" (release and close), "return" (drop everything by
    returning), "exit" (leave them to interpreter shutdown), or "wait" (sleep
    until killed)."""
    sub = Subscriber(SharedRegion.open(name))
    report("ready")
    views = [sub.receive_view(timeout=30) for _ in range(count)]
    if any(view is None for view in views):
        raise RuntimeError(f"timed out receiving: {views}")
    report("holding", [bytes(view) for view in views])
    if ending == "close":
        for view in views:
            view.release()
        sub.close()
    elif ending == "exit":
        _kept_until_exit.extend([sub, *views])
    elif ending == "wait":
        time.sleep(GIVE_UP_S)
        raise RuntimeError("was not killed")
