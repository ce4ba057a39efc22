"""One publisher or subscriber process of the soak test (scripts/soak.py).

Run by the soak supervisor, never by hand, as

    python -I [-S] scripts/soak_worker.py '<json parameters>'

with ``impl`` "ours" (this repository's package) or "native" (the native
wheel of the soak's layout: kickmsg 0.1.0 for layout 4, 0.9.2 for layout 9).
The worker puts that implementation's directory first on ``sys.path``,
imports ``kickmsg`` and checks it got the one from that directory; it
imports nothing else of this repository, so the two implementations never
share a process.

The worker talks to the supervisor through the soak's control file (a small
file of u64 words that both map): the supervisor sets the pause, leave and
stop requests there, and the worker writes its state and its running counts
into its own record, after every message, so the counts survive a SIGKILL.

Roles:

- ``create``: create the channel (config from the parameters) and exit;
- ``publisher``: publish numbered, self-checking messages in bursts, by
  ``send`` and by ``allocate`` + ``publish`` at random (0.1.0's
  ``allocate(len)`` + ``publish()``, 0.9.2's ``allocate()`` +
  ``publish(len)``: ours takes either, at random);
- ``subscriber``: receive by copy and by zero-copy view, blocking and not,
  and check every message: its content, no duplicate, each publisher's
  messages in increasing order.
"""
import ctypes
import json
import mmap
import os
import random
import signal
import struct
import sys
import time
import zlib

# -- the control file (the supervisor imports these names too) ----------------

WORDS_PER_RECORD = 16  # u64 words; record 0 is the control header
MAX_RECORDS = 8192

# Record 0, written by the supervisor.
PAUSE_EPOCH, PAUSED, STOP = 0, 1, 2

# Worker records. The supervisor writes ROLE, IMPL, CHANNEL and LEAVE; the
# worker writes the rest. BUSY is 1 while a publisher is in a burst, or while
# a subscriber holds a zero-copy view: the supervisor aims its kills there.
ROLE, IMPL, CHANNEL, STATE, LEAVE, ACK_EPOCH, BUSY = range(7)
# publisher counts
PUBLISHED, ZERO_COPY, POOL_DRY, DROPPED = range(7, 11)
# subscriber counts
FROM_OURS, FROM_NATIVE, LOST, GAPS, CORRUPT, DUPLICATES, OUT_OF_ORDER, VIEWS, DRAIN_TIMEOUTS = range(7, 16)

HOLD_VIEW_ONE_IN = 50  # a subscriber holds one view in this many a little longer
HOLD_VIEW_S = 0.002

ROLE_CODES = {"publisher": 1, "subscriber": 2, "create": 3}
IMPL_CODES = {"ours": 1, "native": 2}
STATE_STARTING, STATE_READY, STATE_DONE, STATE_NO_RING = 0, 1, 2, 3

EXIT_NO_FREE_RING = 3  # a subscriber found every ring taken

# -- messages -------------------------------------------------------------------

HEAD = struct.Struct("<IIQI")  # publisher id, implementation code, sequence, body length
CRC = struct.Struct("<I")  # crc32 of head + body, at the end
OVERHEAD = HEAD.size + CRC.size


def body_length(publisher_id: int, sequence: int, max_payload: int) -> int:
    """The body length of a message: varies with (publisher id, sequence)."""
    return (sequence * 97 + publisher_id * 31) % (max_payload - OVERHEAD + 1)


def body_of(publisher_id: int, sequence: int, length: int) -> bytes:
    """A body whose bytes depend on publisher id and sequence."""
    word = struct.pack("<Q", ((publisher_id << 40) ^ (sequence * 0x9E3779B97F4A7C15)) & 0xFFFFFFFFFFFFFFFF)
    return (word * (length // 8 + 1))[:length]


def make_message(publisher_id: int, impl_code: int, sequence: int, max_payload: int) -> bytes:
    length = body_length(publisher_id, sequence, max_payload)
    head_and_body = HEAD.pack(publisher_id, impl_code, sequence, length) + body_of(publisher_id, sequence, length)
    return head_and_body + CRC.pack(zlib.crc32(head_and_body))


def check_message(data, max_payload: int) -> tuple[int, int, int] | None:
    """(publisher id, implementation code, sequence), or None if the message
    is damaged in any way. ``data`` may be a memoryview over a slot."""
    if len(data) < OVERHEAD:
        return None
    publisher_id, impl_code, sequence, length = HEAD.unpack_from(data)
    if len(data) != OVERHEAD + length or length != body_length(publisher_id, sequence, max_payload):
        return None
    (crc,) = CRC.unpack_from(data, HEAD.size + length)
    if zlib.crc32(data[: HEAD.size + length]) != crc:
        return None
    if data[HEAD.size : HEAD.size + length] != body_of(publisher_id, sequence, length):
        return None
    return publisher_id, impl_code, sequence


# -- the worker -------------------------------------------------------------------


class Control:
    """The mapped control file: ``header`` (record 0) and ``mine`` (this
    worker's record), as arrays of u64."""

    def __init__(self, path: str, record: int):
        with open(path, "r+b") as file:
            self._map = mmap.mmap(file.fileno(), WORDS_PER_RECORD * 8 * MAX_RECORDS)
        words = memoryview(self._map).cast("Q")
        self.header = words[:WORDS_PER_RECORD]
        self.mine = words[record * WORDS_PER_RECORD : (record + 1) * WORDS_PER_RECORD]

    def checkpoint(self) -> None:
        """Between two operations: if the supervisor asked for a pause,
        acknowledge it and wait until it ends."""
        if self.header[PAUSED]:
            self.mine[ACK_EPOCH] = self.header[PAUSE_EPOCH]
            while self.header[PAUSED]:
                time.sleep(0.001)

    def should_end(self) -> bool:
        return bool(self.header[STOP] or self.mine[LEAVE])


def import_kickmsg(params: dict):
    """Import the implementation named by params["impl"] and check it."""
    sys.path.insert(0, params["impl_path"])
    import kickmsg

    # 0.1.0 is kickmsg.abi3.so; 0.9.2 and ours are kickmsg/__init__.py
    wanted = os.path.join(params["impl_path"], "kickmsg")
    assert kickmsg.__file__.startswith(wanted), f"expected the {params['impl']} kickmsg in {wanted}: {kickmsg.__file__}"
    return kickmsg


def die_with_parent() -> None:
    """Ask the kernel to SIGKILL us if the supervisor dies, and leave Ctrl-C
    to the supervisor (it stops us in order)."""
    PR_SET_PDEATHSIG = 1
    ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
    if os.getppid() == 1:  # the supervisor is already gone
        os._exit(1)
    signal.signal(signal.SIGINT, signal.SIG_IGN)


def create(kickmsg, params: dict) -> None:
    cfg = kickmsg.Config()
    for key, value in params["config"].items():
        setattr(cfg, key, value)
    kickmsg.SharedRegion.create(params["channel"], kickmsg.ChannelType.PubSub, cfg, params["creator"])


def publisher(kickmsg, params: dict, control: Control) -> None:
    rng = random.Random(params["seed"])
    me = control.mine
    publisher_id, impl_code = params["record"], IMPL_CODES[params["impl"]]
    region = kickmsg.SharedRegion.open(params["channel"])
    max_payload = params["max_payload"]
    pub = kickmsg.Publisher(region)
    # Zero-copy forms, "sized" or not: allocate(len) + publish() is 0.1.0's only
    # form, allocate() + publish(len) is 0.9.2's (its AllocatedSlot has max_size); ours takes both.
    if params["impl"] == "ours":
        sized_forms = (True, False)
    else:
        sized_forms = (not hasattr(kickmsg.AllocatedSlot, "max_size"),)
    sequence = 0
    me[STATE] = STATE_READY
    while not control.should_end():
        me[BUSY] = 1
        for _ in range(rng.randint(1, params["max_burst"])):
            control.checkpoint()
            message = make_message(publisher_id, impl_code, sequence, max_payload)
            if rng.random() < 0.5:
                try:
                    pub.send(message)
                except BlockingIOError:
                    me[POOL_DRY] += 1
                    time.sleep(0.001)
                    break  # end the burst; the same sequence is tried again
            else:
                sized = rng.choice(sized_forms)
                slot = pub.allocate(len(message)) if sized else pub.allocate()
                if slot is None:
                    me[POOL_DRY] += 1
                    time.sleep(0.001)
                    break
                with memoryview(slot) as view:
                    view[: len(message)] = message
                if sized:
                    slot.publish()
                else:
                    slot.publish(len(message))
                me[ZERO_COPY] += 1
            sequence += 1
            me[PUBLISHED] = sequence
            me[DROPPED] = pub.dropped
        me[BUSY] = 0
        time.sleep(rng.uniform(0.0005, params["max_pause"]))
    me[STATE] = STATE_DONE


class StreamCheck:
    """What one subscriber verifies, counted into its record."""

    def __init__(self, record, max_payload: int):
        self.me = record
        self.max_payload = max_payload
        self.last = {}  # publisher id -> last sequence received
        self.complaints = 0

    def add(self, data) -> None:
        me = self.me
        parsed = check_message(data, self.max_payload)
        if parsed is None:
            me[CORRUPT] += 1
            self.complain(f"corrupt message ({len(data)} bytes): {bytes(data[:32]).hex()}")
            return
        publisher_id, impl_code, sequence = parsed
        me[FROM_NATIVE if impl_code == IMPL_CODES["native"] else FROM_OURS] += 1
        last = self.last.get(publisher_id)
        if last is not None:
            if sequence == last:
                me[DUPLICATES] += 1
                self.complain(f"duplicate: publisher {publisher_id} sequence {sequence}")
                return
            if sequence < last:
                me[OUT_OF_ORDER] += 1
                self.complain(f"out of order: publisher {publisher_id} sequence {sequence} after {last}")
                return
            me[GAPS] += sequence - last - 1
        self.last[publisher_id] = sequence

    def complain(self, text: str) -> None:
        self.complaints += 1
        if self.complaints <= 20:
            print(f"PROBLEM: {text}", file=sys.stderr, flush=True)


def receive_one(sub, rng: random.Random, check: StreamCheck, me) -> bool:
    """Receive (at most) one message in a randomly chosen way; False if none
    came."""
    way = rng.randrange(4)
    if way == 0:
        data = sub.try_receive()
    elif way == 1:
        data = sub.receive(0.01)
    else:
        view = sub.try_receive_view() if way == 2 else sub.receive_view(0.01)
        if view is None:
            return False
        try:
            me[BUSY] = 1
            with memoryview(view) as data:
                check.add(data)
            if rng.randrange(HOLD_VIEW_ONE_IN) == 0:
                time.sleep(HOLD_VIEW_S)  # a slow consumer: the slot stays pinned meanwhile
        finally:
            view.release()
            me[BUSY] = 0
        me[VIEWS] += 1
        return True
    if data is None:
        return False
    check.add(data)
    return True


def subscriber(kickmsg, params: dict, control: Control) -> int:
    rng = random.Random(params["seed"])
    me = control.mine
    region = kickmsg.SharedRegion.open(params["channel"])
    try:
        sub = kickmsg.Subscriber(region)
    except RuntimeError as error:
        if "No free subscriber slots" not in str(error):
            raise
        me[STATE] = STATE_NO_RING
        return EXIT_NO_FREE_RING
    check = StreamCheck(me, params["max_payload"])
    me[STATE] = STATE_READY
    while not control.should_end():
        control.checkpoint()
        receive_one(sub, rng, check, me)
        me[LOST] = sub.lost
    if control.header[STOP]:
        # The end of the run: publishers are gone; read what is left. A None
        # with no new loss means the ring is empty (a None after lost entries
        # only means the call gave up early).
        while True:
            lost_before = sub.lost
            if not receive_one(sub, rng, check, me) and sub.lost == lost_before:
                break
    me[LOST] = sub.lost
    if hasattr(sub, "close"):  # ours; the native subscriber leaves when destroyed
        sub.close()
        me[DRAIN_TIMEOUTS] = sub.drain_timeouts
    del sub
    me[STATE] = STATE_DONE
    return 0


def main() -> int:
    params = json.loads(sys.argv[1])
    die_with_parent()
    kickmsg = import_kickmsg(params)
    if params["role"] == "create":
        create(kickmsg, params)
        return 0
    control = Control(params["control"], params["record"])
    if params["role"] == "publisher":
        publisher(kickmsg, params, control)
        return 0
    return subscriber(kickmsg, params, control)


if __name__ == "__main__":
    sys.exit(main())
