"""Differential cross-check of another Kickmsg implementation against this one.

``crosscheck(other_python, layout=4|9)`` generates a random (seeded,
reproducible) sequence of single-threaded operations and runs each one on
this package, in-process, and on the other implementation, driven in a
subprocess (``other_python -I -S`` with ``other_path`` first on
``sys.path``, or ``other_python -I`` and its own ``kickmsg``). Each side
works on its own region of the layout chosen: same config and creator
string, different shm names. After every operation it compares the return
values and the raw bytes of the two regions: deterministic single-threaded
use must leave identical bytes. It stops at the first divergence and
reports the operation, what differed (decoded: which header field, ring,
entry or slot, and on layout 9 what a tagged sequence or meta word means),
and a sequence that reproduces it, which ``replay`` runs again.

Masked, because they differ by nature (``masked``): the header's
``creator_pid`` and ``created_at_ns`` (each side's process; the monotonic
clock on layout 4, the realtime clock on layout 9); on layout 9 also each
ring's ``owner_pid`` and ``owner_starttime`` when they hold the side's own
subscribing process (this process for ours, the child for the other),
compared as "its driver process's". Nothing else: an owner left 0, or the
dead owner of a killed subscriber, is compared as it is.

Operations (JSON lists, see ``kickmsg.verify.crossdriver``): create a region (1-4
subscribers, ring capacity 2/4/8, pool capacity+1 to 16, payload 8-64, PubSub or
Broadcast; on layout 9 a commit timeout of 0.5, 1 or 2 ms), publishers,
``send`` (also too long, or with the pool dry), allocate/fill/publish in
the layout's API (0.1.0's ``allocate(len)``/``publish()`` on layout 4,
0.9.2's ``allocate()``/``publish(len)`` on layout 9, superseded and
published slots refused there), subscribers joining and leaving, copy and
view receives (views held, released later), ``lost``, ``dropped``,
``diagnose`` (and on layout 9 0.9.2's ``stats`` and the schema claim,
read and reset), ``repair_locked_entries``, ``reset_retired_rings``,
``reclaim_orphaned_slots`` (only while no view is held, its contract).
Crash residue, identical in both regions so that the repair paths run too:
on layout 4 the damage a crashed publisher leaves, poked into the bytes
(``poke_*``); on layout 9 a publisher dying before any one of its
shared-memory writes (``crash_send``, run by this package's layout-9 core
on both regions: a leaked slot, an admission held, a claimed position, a
position-tagged lock, a meta claim under it), a subscriber dying while it
joins or leaves (``crash_subscriber``: a Live ring without owner, a
Draining one, claims partly drained), a reclaim of dead rings dying
(``crash_reclaim_dead_rings``: a ring left Reclaiming), a schema claimer
dying mid-claim (``crash_claim_schema``), and a subscriber killed with
the pins of its views (``kill_subscriber``: both sides keep the objects out
of reach, and its ring records a dead owner), recovered by
``reclaim_dead_rings``: ours, run on both regions (it differs from
0.9.2's on purpose: it drains the claims, as the owner's leave would
have), before each join too (our join reclaims when no ring is Free;
0.9.2's does not).

Left out on purpose, because the implementations differ there (docs/reference/
compatibility.md): dropping a subscriber while views it received are alive
(0.1.0 and 0.9.2 keep the subscriber, so its ring stays Live, until those
view objects are collected; this package leaves the ring at once). On
layout 4 also: dropping an unpublished slot on its own; using a slot that
a newer ``allocate`` of its publisher replaced (0.1.0 lets it alias the new
one); ``send`` on a publisher that has an unpublished slot (0.1.0 gives
that slot back first, so it may then hold the sent message, which writing
through the old slot would change; this package keeps the two apart). On
layout 9 those three are generated: 0.9.2 and this package agree there.
"""
import ctypes
import json
import os
import random
import secrets
import select
import shlex
import subprocess
import tempfile
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any

import kickmsg
from kickmsg import jsontext
from kickmsg.atomics import HARDWARE, Atomics
from kickmsg.errors import KickmsgError
from kickmsg.protocol import v9
from kickmsg.protocol.common import SchemaInfoLayout
from kickmsg.protocol.v4 import layout
from kickmsg.protocol.v4.layout import Field, field_at
from kickmsg.protocol.v9 import layout as v9layout
from kickmsg.protocol.v9 import words as v9words
from kickmsg.protocol.v9 import repair
from kickmsg.protocol.v9.layout import OWNER_PID_OFFSET, OWNER_STARTTIME_OFFSET, STATE_FLIGHT_OFFSET
from kickmsg.protocol.v9.liveness import process_start_time
from kickmsg.region import unlink_shm
from kickmsg.schema import SchemaInfo
from kickmsg.userfiles import read_at_most
from kickmsg.verify import crossdriver

__all__ = [
    "COMMIT_TIMEOUTS_US", "CRASHES", "Crashed", "CrashingAtomics", "DEAD_PID", "DEAD_START", "DRIVER_MARK",
    "Difference", "Divergence", "Generator", "IGNORED", "MAX_DIFFERENCES", "MAX_OPS", "MAX_PUBLISHERS", "OPERATION_TIMEOUT_S",
    "Operation", "OtherFailed", "OtherSide", "POKES", "REPLAY_LIMIT", "Replay", "Result", "START_TIMEOUT_S",
    "SetupError", "WEIGHTS", "WEIGHTS9", "bury", "check_layout", "check_version", "compare_regions", "crash",
    "crash_subscriber", "crosscheck", "describe_value", "field_at9", "load_operations", "masked", "poke", "read_region",
    "replay", "shm_path",
]

MAX_OPS = 1_000_000  # operations of one run: each is kept for the reproducer a divergence prints
IGNORED = range(112, 128)  # creator_pid and created_at_ns differ by nature (both layouts)
DRIVER_MARK = (1 << 64) - 1  # a ring owner word holding its side's own subscribing process (layout 9, see masked)
START_TIMEOUT_S = 30.0  # for the other side to import its kickmsg
OPERATION_TIMEOUT_S = 30.0  # for one operation on the other side
MAX_DIFFERENCES = 16  # fields listed in a report
REPLAY_LIMIT = 16 * 1024 * 1024  # bytes of a --replay file (a few hundred thousand operations)

# Relative frequencies of the operations (the first one is always "create").
WEIGHTS = {
    "create": 1,
    "publisher": 3,
    "drop_publisher": 1,
    "send": 24,
    "allocate": 8,
    "fill": 6,
    "publish": 8,
    "drop_slot": 2,
    "dropped": 2,
    "join": 6,
    "leave": 4,
    "recv": 16,
    "recv_view": 6,
    "release": 5,
    "lost": 3,
    "diagnose": 3,
    "repair_locked_entries": 2,
    "reset_retired_rings": 2,
    "reclaim_orphaned_slots": 2,
    "poke_admit": 0.7,
    "poke_claim": 0.7,
    "poke_lock": 0.7,
}
POKES = {"poke_admit", "poke_claim", "poke_lock"}
MAX_PUBLISHERS = 3

# Layout 9 (0.9.2's API): allocate() and publish(len), superseded slots
# used too; crashes forged by this process (``crash_*``) instead of pokes,
# and the dead-ring reclaim.
WEIGHTS9 = {
    **{kind: weight for kind, weight in WEIGHTS.items() if kind not in POKES | {"allocate", "publish"}},
    "allocate_max": 8,
    "publish_len": 8,
    "reclaim_dead_rings": 2,
    "stats": 2,
    "claim_schema": 0.5,
    "schema": 0.5,
    "reset_schema_claim": 0.5,
    "crash_send": 1.5,
    "crash_claim_schema": 0.3,
    "crash_subscriber": 0.7,
    "crash_reclaim_dead_rings": 0.5,
    "kill_subscriber": 1,
}
# Run by this package's layout-9 core on both regions: the forged crashes,
# and our reclaim of dead rings, which differs from 0.9.2's on purpose (it
# drains the claims, and takes a Reclaiming ring only after a commit timeout).
CRASHES = {"crash_send", "crash_claim_schema", "crash_subscriber", "crash_reclaim_dead_rings", "reclaim_dead_rings"}
COMMIT_TIMEOUTS_US = (500, 1000, 2000)  # layout 9's creates: short, so that the waits on crash residue stay short
# The owner a killed subscriber's ring records: no process can have this
# pid (pid_max is at most 2^22), so every owner check finds it dead.
DEAD_PID = 0x7FFFFFFE
DEAD_START = 1

Operation = list[Any]  # [kind, *args], JSON values
Difference = dict[str, str | int]  # a region field that differs: field, offset, ours, other


class SetupError(KickmsgError, RuntimeError):
    """The cross-check could not run: bad input, or the other implementation
    does not start."""


# -- the operation sequence ------------------------------------------------------


class Generator:
    """Yields random operations that make sense in the current state; it
    learns the state from this package's results (``observe``)."""

    def __init__(self, seed: int, count: int, layout: int = 4) -> None:
        self.random = random.Random(seed)
        self.count = count
        self.layout = layout
        self.weights = WEIGHTS9 if layout == 9 else WEIGHTS
        self.next_id = 0
        self.reset(None)

    def reset(self, geometry: tuple[Any, ...] | None) -> None:
        """A new region (or none): no handles yet."""
        self.geometry = geometry  # (type, max_subs, capacity, pool, payload[, commit timeout])
        self.publishers: dict[int, int | None] = {}  # id -> its unpublished slot id, or None
        self.slot_owner: dict[int, int] = {}  # slot id -> publisher id, for slot handles held
        self.published: set[int] = set()  # slot handles already published
        self.superseded: set[int] = set()  # layout 9: slot handles a newer allocate() replaced
        self.subscribers: set[int] = set()
        self.views: dict[int, int] = {}  # view id -> subscriber id

    def __iter__(self) -> Iterator[Operation]:
        for _ in range(self.count):
            yield self.next_operation()

    def new_id(self) -> int:
        self.next_id += 1
        return self.next_id - 1

    def possible(self, kind: str) -> bool:
        if kind == "publisher":
            return len(self.publishers) < MAX_PUBLISHERS
        if kind in ("drop_publisher", "allocate", "allocate_max", "dropped"):
            return bool(self.publishers)
        if kind == "send":
            return bool(self.senders())
        if kind in ("fill", "publish", "publish_len"):
            return bool(self.pending_slots())
        if kind == "drop_slot":
            return bool(self.droppable_slots())
        if kind in ("recv", "recv_view", "lost", "kill_subscriber"):
            return bool(self.subscribers)
        if kind == "leave":
            return bool(self.subscribers - set(self.views.values()))
        if kind == "release":
            return bool(self.views)
        if kind == "reclaim_orphaned_slots":
            return not self.views  # its contract: no view alive
        return True

    def pending_slots(self) -> list[int]:
        return [s for s in self.publishers.values() if s is not None]

    def senders(self) -> list[int]:
        """Publishers that may send: on layout 4 those without an
        unpublished slot; on layout 9 all (a send supersedes that slot, as
        a newer allocate() does)."""
        return [p for p, pending in self.publishers.items() if pending is None or self.layout == 9]

    def droppable_slots(self) -> set[int]:
        """Slot handles that may be dropped: published or superseded ones;
        on layout 9 unpublished ones too (back to the pool in both)."""
        return self.published | self.superseded | (set(self.pending_slots()) if self.layout == 9 else set())

    def length(self, payload: int) -> int:
        """A payload length: mostly fitting, sometimes exactly full or too long."""
        roll = self.random.random()
        if roll < 0.1:
            return payload
        if roll < 0.2:
            return payload + self.random.randint(1, 8)
        return self.random.randint(0, payload)

    def pick(self, items: Iterable[int]) -> int:
        return self.random.choice(sorted(items))

    def create_operation(self) -> Operation:
        r = self.random
        capacity = r.choice([2, 4, 8])
        op = [
            "create",
            r.choice(["PubSub", "Broadcast"]),
            r.randint(1, 4),
            capacity,
            r.randint(capacity + 1, 16),  # this package refuses a pool no larger than a ring (0.1.0 does not)
            r.randint(8, 64),
        ]
        if self.layout == 9:
            op.append(r.choice(COMMIT_TIMEOUTS_US))
        return op

    def refused_slot(self) -> int | None:
        """Now and then a slot its operation refuses: published, or (layout 9) superseded."""
        refused = self.published | self.superseded
        return self.pick(refused) if refused and self.random.random() < 0.1 else None

    def next_operation(self) -> Operation:
        if self.geometry is None:
            return self.create_operation()
        max_subs, payload = self.geometry[1], self.geometry[4]
        kinds = [kind for kind in self.weights if self.possible(kind)]
        weights = [self.weights[kind] for kind in kinds]
        if len(self.subscribers) >= max_subs:  # every ring taken: joins mostly fail
            weights[kinds.index("join")] /= 4
        kind = self.random.choices(kinds, weights)[0]
        r = self.random
        if kind == "create":
            return self.create_operation()
        if kind in ("publisher", "join"):
            return [kind, self.new_id()]
        if kind in ("drop_publisher", "dropped"):
            return [kind, self.pick(self.publishers)]
        if kind == "send":
            return [kind, self.pick(self.senders()), self.length(payload), r.randrange(256)]
        if kind == "allocate":
            return [kind, self.pick(self.publishers), self.length(payload), self.new_id()]
        if kind == "allocate_max":
            return [kind, self.pick(self.publishers), self.new_id()]
        if kind in ("fill", "publish", "publish_len"):
            slot = self.refused_slot()
            if slot is None:
                slot = self.pick(self.pending_slots())
            if kind == "fill":
                return [kind, slot, r.randrange(256)]
            return [kind, slot, self.length(payload)] if kind == "publish_len" else [kind, slot]
        if kind == "drop_slot":
            return [kind, self.pick(self.droppable_slots())]
        if kind == "leave":
            return [kind, self.pick(self.subscribers - set(self.views.values()))]
        if kind in ("recv", "lost", "kill_subscriber"):
            return [kind, self.pick(self.subscribers)]
        if kind == "recv_view":
            return [kind, self.pick(self.subscribers), self.new_id()]
        if kind == "release":
            return [kind, self.pick(self.views)]
        if kind in POKES:
            return [kind, r.randrange(max_subs)]
        if kind in ("claim_schema", "crash_claim_schema"):
            return [kind, r.choice(["imu", "camera/frame"]), r.randrange(4)]
        if kind == "crash_subscriber":  # 3 writes to join, then leave: Draining, the owner cleared, the drain, Free
            return [kind, r.randint(0, 8 + 2 * self.geometry[2])]
        if kind == "crash_reclaim_dead_rings":  # per dead ring: Reclaiming, the owner cleared, Free
            return [kind, r.randint(0, 5)]
        if kind == "crash_send":  # dies before one of its writes: 4 before the rings, up to 9 in each Live ring
            return [kind, r.randint(0, 3 + 9 * max(1, len(self.subscribers))), r.randint(0, payload), r.randrange(256)]
        return [kind]

    def observe(self, op: Operation, result: object) -> None:
        """Track the handles that exist after ``op`` returned ``result`` here."""
        kind, *args = op
        if kind == "create":
            self.reset(tuple(args) if result is None else None)
        elif kind == "publisher" and result is None:
            self.publishers[args[0]] = None
        elif kind == "drop_publisher":  # with every slot handle it made
            del self.publishers[args[0]]
            for slot in [s for s, owner in self.slot_owner.items() if owner == args[0]]:
                del self.slot_owner[slot]
                self.published.discard(slot)
                self.superseded.discard(slot)
        elif kind in ("allocate", "allocate_max") and isinstance(result, int):
            publisher, slot = args[0], args[-1]
            replaced = self.publishers[publisher]
            if replaced is not None and kind == "allocate":
                self.slot_owner.pop(replaced, None)  # replaced: its handle is dropped
            elif replaced is not None:
                self.superseded.add(replaced)  # replaced: its handle is kept, superseded
            self.publishers[publisher] = slot
            self.slot_owner[slot] = publisher
        elif kind in ("publish", "publish_len") and isinstance(result, int):
            owner = self.slot_owner[args[0]]
            if self.publishers.get(owner) == args[0]:
                self.publishers[owner] = None
            self.published.add(args[0])
        elif kind == "send" and isinstance(result, int) and (unpublished := self.publishers.get(args[0])) is not None:
            self.superseded.add(unpublished)  # layout 9: the send superseded the unpublished slot
            self.publishers[args[0]] = None
        elif kind == "drop_slot":
            self.published.discard(args[0])
            self.superseded.discard(args[0])
            owner = self.slot_owner.pop(args[0], -1)
            if self.publishers.get(owner) == args[0]:
                self.publishers[owner] = None  # layout 9: an unpublished slot dropped
        elif kind == "join" and result is None:
            self.subscribers.add(args[0])
        elif kind == "leave":
            self.subscribers.discard(args[0])
        elif kind == "kill_subscriber":  # with its views: a dead process's pins stay, but count as no view alive
            self.subscribers.discard(args[0])
            self.views = {view: owner for view, owner in self.views.items() if owner != args[0]}
        elif kind == "recv_view" and isinstance(result, list):
            self.views[args[1]] = args[0]
        elif kind == "release":
            self.views.pop(args[0], None)


class Replay:
    """A fixed sequence, as ``replay`` runs it."""

    def __init__(self, operations: list[Operation]) -> None:
        self.operations = operations

    def __iter__(self) -> Iterator[Operation]:
        return iter(self.operations)

    def observe(self, op: Operation, result: object) -> None:
        pass


# -- the other implementation, in a subprocess ---------------------------------------


class OtherFailed(KickmsgError):
    """The other side died or stopped answering during an operation."""


class OtherSide:
    """The other implementation running ``kickmsg.verify.crossdriver`` in a child."""

    def __init__(self, python: str, path: str | None, layout: int) -> None:
        with open(crossdriver.__file__, encoding="utf-8") as file:
            source = file.read()
        if path:
            command = [python, "-I", "-S", "-c", source, str(layout), path]
        else:
            command = [python, "-I", "-c", source, str(layout)]
        self.stderr = tempfile.TemporaryFile()
        try:
            self.proc = subprocess.Popen(command, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self.stderr)
        except OSError as error:
            self.stderr.close()
            raise SetupError(f"cannot run the other Python {python!r}: {error}") from None
        assert self.proc.stdin is not None and self.proc.stdout is not None  # both are pipes
        self.requests, self.answers = self.proc.stdin, self.proc.stdout
        try:
            hello = self.read_line(START_TIMEOUT_S)
        except OtherFailed as failure:
            self.close()
            raise SetupError(f"the other implementation did not start ({python} {'-I -S' if path else '-I'}): {failure}") from None
        self.kickmsg_file = hello.get("kickmsg") or "?"
        self.python_version = hello.get("python", "?")
        self.pid = hello.get("pid", 0)  # the process that owns its subscribers' rings
        if path and not any(
            os.path.realpath(self.kickmsg_file).startswith(os.path.realpath(d) + os.sep) for d in path.split(os.pathsep) if d
        ):
            self.close()
            raise SetupError(f"the other side imported {self.kickmsg_file}, which is not under {path}")

    def stderr_tail(self) -> str:
        self.stderr.seek(0)
        lines = self.stderr.read().decode(errors="replace").strip().splitlines()
        return " | ".join(lines[-5:]) or "no output on stderr"

    def read_line(self, timeout: float) -> Any:
        """The child's next JSON line, or OtherFailed."""
        ready, _, _ = select.select([self.answers], [], [], timeout)
        if not ready:
            self.proc.kill()
            self.proc.wait()
            raise OtherFailed(f"no answer within {timeout:g} s (killed)")
        line = self.answers.readline()
        if not line:
            code = self.proc.wait()
            raise OtherFailed(f"it exited with status {code}: {self.stderr_tail()}")
        try:
            return json.loads(line)
        except ValueError:
            raise OtherFailed(f"it printed {line[:200]!r}") from None

    def run(self, op: Operation, name: str | None) -> Any:
        try:
            self.requests.write(json.dumps({"op": op, "name": name}).encode() + b"\n")
            self.requests.flush()
        except BrokenPipeError:
            code = self.proc.wait()
            raise OtherFailed(f"it exited with status {code}: {self.stderr_tail()}") from None
        return self.read_line(OPERATION_TIMEOUT_S)

    def close(self) -> None:
        """End the child: close its stdin, then kill it if it lingers."""
        try:
            self.requests.close()
        except OSError:
            pass
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        self.answers.close()
        self.stderr.close()


# -- damage, poked into the bytes ----------------------------------------------------


def poke(op: Operation, name: str, geometry: layout.Geometry) -> str | None:
    """Leave what a publisher that crashed in ring ``op[1]`` leaves:
    ``poke_admit`` died admitted (in_flight + 1), ``poke_claim`` died after
    claiming a position (write_pos + 1), ``poke_lock`` died holding the lock
    of the position it claimed (write_pos + 1, that entry LOCKED)."""
    kind, ring = op
    if not 0 <= ring < geometry.max_subs:
        return "absent"
    base = geometry.sub_rings_offset + ring * geometry.ring_stride
    fd = os.open(shm_path(name), os.O_RDWR)
    try:
        if kind == "poke_admit":
            state_flight = int.from_bytes(os.pread(fd, 4, base), "little")
            os.pwrite(fd, ((state_flight + layout.IN_FLIGHT_ONE) & layout.U32_MAX).to_bytes(4, "little"), base)
            return None
        write_pos_at = base + layout.WRITE_POS_OFFSET
        write_pos = int.from_bytes(os.pread(fd, 8, write_pos_at), "little")
        if kind == "poke_lock":
            entry = base + layout.RING_HEADER_SIZE + (write_pos & geometry.mask) * layout.ENTRY_SIZE
            os.pwrite(fd, layout.LOCKED_SEQUENCE.to_bytes(8, "little"), entry + layout.SEQUENCE_OFFSET)
        os.pwrite(fd, ((write_pos + 1) & layout.U64_MAX).to_bytes(8, "little"), write_pos_at)
        return None
    finally:
        os.close(fd)


# -- layout 9: crashes, forged by this process in both regions ------------------------


class Crashed(KickmsgError):
    """A forged crash: the process died here."""


class CrashingAtomics(Atomics):
    """Hardware atomics whose write number ``writes`` (counting from 0:
    stores, CASes and read-modify-writes; loads do not count, so a spin
    waiting on the clock cannot move the crash) raises ``Crashed`` instead
    of happening."""

    def __init__(self, writes: int) -> None:
        self.writes_left = writes

    def before_write(self) -> None:
        if self.writes_left == 0:
            raise Crashed
        self.writes_left -= 1


def _counted(name: str) -> Callable[..., int | None]:
    operation = getattr(HARDWARE, name)

    def write(self: CrashingAtomics, *args: int) -> int | None:
        self.before_write()
        return operation(*args)

    return write


# Every writing operation of the atomics door, counted (loads, the fence and the futex calls are inherited as they are).
for _write in [name for name in vars(Atomics) if name.startswith(("store_", "cas_", "fetch_"))]:
    setattr(CrashingAtomics, _write, _counted(_write))


def crash(op: Operation, name: str) -> str | int:
    """A forged crash on the region ``name``, run by this package's
    layout-9 core in this process. The twin regions are identical before,
    so they are after.

    ``crash_send`` [writes, length, fill]: a publisher sends ``length``
    bytes and dies before its shared-memory write number ``writes``. By
    where that falls it leaves a slot popped and never published, its
    refcount pre-set, a ring's admission held, a position claimed, a
    position-tagged lock, a meta claim installed under that lock, or
    nothing (``"completed"``; ``"no free slot"`` when the pool is dry).
    ``crash_claim_schema`` [name, version]: a process claims the schema and
    dies before storing Set (its copy written): the claim stays Claiming
    (``"crashed"``), or someone's claim was there (``"claimed"``).
    ``crash_subscriber`` [writes]: a subscriber joins, then leaves, and
    dies before its write number ``writes``: a Live ring, one Draining,
    its owner cleared or not, its claims partly drained; the owner words it
    wrote then record a dead process (``bury``). ``crash_reclaim_dead_rings``
    [writes]: a reclaim of dead rings dies before its write number
    ``writes``: a ring left Reclaiming, its owner cleared or not."""
    if op[0] == "crash_subscriber":
        return crash_subscriber(name, op[1])
    if op[0] == "reclaim_dead_rings":
        return repair.reclaim_dead_rings(v9.Region.open(name))
    if op[0] == "crash_reclaim_dead_rings":
        try:
            repair.reclaim_dead_rings(v9.Region.open(name, atomics=CrashingAtomics(op[1])))
        except Crashed:
            return "crashed"
        return "completed"
    if op[0] == "crash_claim_schema":
        schema_name, version = op[1:]
        region = v9.Region.open(name, atomics=CrashingAtomics(1))  # the claim's CAS, not the store of Set
        try:
            repair.try_claim_schema(region, SchemaInfo(name=schema_name, version=version))
        except Crashed:
            return "crashed"
        return "claimed"
    writes, length, fill = op[1:]
    region = v9.Region.open(name, atomics=CrashingAtomics(writes))
    try:
        v9.Publisher(region).send(crossdriver.pattern(length, fill))
    except Crashed:
        return "crashed"
    except BlockingIOError:
        return "no free slot"
    return "completed"


def crash_subscriber(name: str, writes: int) -> str:
    region = v9.Region.open(name, atomics=CrashingAtomics(writes))
    ops = HARDWARE
    # the ring its join takes: the first Free one with no publisher in flight (B.4)
    free = [i for i in range(region.geometry.max_subs) if ops.load_acquire_u32(region.ring_address(i) + STATE_FLIGHT_OFFSET) == 0]
    if not free:
        return "no free ring"
    try:
        subscriber = v9.Subscriber(region)
    except Crashed:
        outcome = "crashed joining"
    else:
        subscriber.owner_pid = DEAD_PID  # its process is gone: nothing leaves the ring when the object goes
        try:
            subscriber.close()
        except Crashed:
            outcome = "crashed leaving"
        else:
            return "completed"
    # the owner words it wrote in its ring now name a dead process
    address = region.ring_address(free[0])
    if ops.load_relaxed_u64(address + OWNER_STARTTIME_OFFSET) == process_start_time(os.getpid()):
        ops.store_relaxed_u64(address + OWNER_STARTTIME_OFFSET, DEAD_START)
    if ops.load_acquire_u64(address + OWNER_PID_OFFSET) == os.getpid():
        ops.store_release_u64(address + OWNER_PID_OFFSET, DEAD_PID)
    return outcome


def bury(name: str, ring: int) -> None:
    """Record a dead owner (``DEAD_PID``) in ring ``ring`` of the region
    ``name``: what a subscriber's process leaves when it is killed."""
    region = v9.Region.open(name)
    address = region.ring_address(ring)
    region.atomics.store_relaxed_u64(address + OWNER_STARTTIME_OFFSET, DEAD_START)
    region.atomics.store_release_u64(address + OWNER_PID_OFFSET, DEAD_PID)


# -- comparing regions --------------------------------------------------------------


def shm_path(name: str) -> str:
    return "/dev/shm" + name


def read_region(name: str) -> bytes | None:
    """The region's bytes, or None if there is no such object."""
    try:
        with open(shm_path(name), "rb") as file:
            return file.read()
    except FileNotFoundError:
        return None


def masked(data: bytes, layout_version: int, geometry: Any, pid: int, start_time: int) -> bytearray:
    """A region's bytes with what legitimately differs between the twins
    masked: the header's ``creator_pid`` and ``created_at_ns`` (each side's
    own process and clock) zeroed; on layout 9 also each ring's
    ``owner_pid`` and ``owner_starttime`` when they are the subscribing
    process's own (``pid``, ``start_time``: this process for ours, the
    child for the other), replaced by ``DRIVER_MARK``. Any other owner value
    (0, or a forged crash's ``DEAD_PID``) is compared as it is."""
    region = bytearray(data)
    region[IGNORED.start : IGNORED.stop] = bytes(len(IGNORED))
    if layout_version == 9:
        mark = DRIVER_MARK.to_bytes(8, "little")
        for ring in range(geometry.max_subs):
            base = geometry.ring_offset(ring)
            for offset, own in ((OWNER_PID_OFFSET, pid), (OWNER_STARTTIME_OFFSET, start_time)):
                word = slice(base + offset, base + offset + 8)
                if len(region) >= word.stop and int.from_bytes(region[word], "little") == own:
                    region[word] = mark
    return region


def describe_value(label: str, value: int, layout_version: int = 4) -> str:
    """A field's integer value, with its meaning where it has one."""
    if label == "header.free_top":
        top = value & layout.U32_MAX
        return f"0x{value:016x} (generation {value >> 32}, top {'empty' if top == layout.INVALID_SLOT else f'slot {top}'})"
    if label.endswith(".state_flight"):
        state = v9layout.RING_STATE_NAMES.get(value & layout.RING_STATE_MASK, "?")
        return f"{value} ({state}, in_flight {value >> 2})"
    if label.endswith((".owner_pid", ".owner_starttime")) and value == DRIVER_MARK:
        return "its driver process's"
    if layout_version == 9 and label.endswith(".sequence"):
        if v9words.seq_locked(value):
            who = "repairer" if value & v9layout.SEQ_REPAIR_BIT else "publisher"
            return f"0x{value:016x} ({who} lock of position {v9words.seq_pos(value)})"
        if v9words.seq_skip(value):
            return f"0x{value:016x} (skip marker of position {v9words.seq_pos(value) - 1})"
        return f"{value} (committed position {value - 1})" if value else "0 (never written)"
    if layout_version == 9 and label.endswith(".meta"):
        claim = v9words.meta_slot_field(value)
        return f"0x{value:016x} (tag {v9words.meta_tag(value)}, {f'slot {claim - 1}' if claim else 'no claim'})"
    if label.endswith(".sequence") and value == layout.LOCKED_SEQUENCE:
        return "LOCKED"
    if label.endswith((".slot_idx", ".next_free")) and value == layout.INVALID_SLOT:
        return "INVALID_SLOT"
    return str(value)


def _struct_field9(struct_type: type[ctypes.Structure], base: int, rel: int, prefix: str) -> Field:
    """The field of a layout-9 ctypes structure at ``base`` containing ``base + rel``."""
    for name, ctype, *_ in struct_type._fields_:
        info = getattr(struct_type, name)
        if info.offset <= rel < info.offset + info.size:
            if name == "schema_data":
                return _struct_field9(SchemaInfoLayout, base + info.offset, rel - info.offset, prefix + "schema_data.")
            label = prefix + ("padding" if name.startswith("_pad") else name)
            return Field(label, base + info.offset, info.size, not hasattr(ctype, "_length_") and not name.startswith("_pad"))
    return Field(prefix + "padding", base + rel, 1, False)


def field_at9(geometry: v9.Geometry, offset: int) -> Field:
    """Which layout-9 header field, ring, entry or slot field holds byte ``offset`` (WIRE9.md A.2-A.5)."""
    g = geometry
    if offset < v9layout.HEADER_SIZE:
        return _struct_field9(v9layout.Header, 0, offset, "header.")
    if offset < v9layout.HEADER_SIZE + g.creator_name_len:
        return Field("creator name", v9layout.HEADER_SIZE, g.creator_name_len, False)
    if offset < g.sub_rings_offset:
        return Field("header padding", offset, 1, False)
    if offset < g.pool_offset:
        ring, rel = divmod(offset - g.sub_rings_offset, g.ring_stride)
        base = g.ring_offset(ring)
        if rel < v9layout.RING_HEADER_SIZE:
            return _struct_field9(v9layout.SubRingHeader, base, rel, f"ring {ring}.")
        entry, rel = divmod(rel - v9layout.RING_HEADER_SIZE, v9layout.ENTRY_SIZE)
        if entry < g.capacity:
            return _struct_field9(v9layout.Entry, g.entry_offset(ring, entry), rel, f"ring {ring} entry {entry}.")
        return Field(f"ring {ring} padding", offset, 1, False)
    if offset < g.total_size:
        slot, rel = divmod(offset - g.pool_offset, g.slot_stride)
        base = g.slot_offset(slot)
        if rel < v9layout.SLOT_HEADER_SIZE:
            return _struct_field9(v9layout.SlotHeader, base, rel, f"slot {slot}.")
        if rel < v9layout.SLOT_HEADER_SIZE + g.slot_data_size:
            return Field(f"slot {slot} payload", base + v9layout.SLOT_HEADER_SIZE, g.slot_data_size, False)
        return Field(f"slot {slot} padding", offset, 1, False)
    return Field("past total_size", offset, 1, False)


def compare_regions(
    ours: bytes | None, other: bytes | None, geometry: Any, layout_version: int = 4,
    owners: tuple[tuple[int, int], tuple[int, int]] = ((0, 0), (0, 0)),
) -> list[Difference]:
    """The fields in which two regions of ``layout_version`` differ, each
    with both values, once ``masked`` (``owners``: each side's subscribing
    process, (pid, start time))."""
    if ours is None or other is None:
        return [{"field": "shared-memory object", "offset": 0, "ours": "present" if ours is not None else "missing",
                 "other": "present" if other is not None else "missing"}]
    if len(ours) != len(other):
        return [{"field": "object size", "offset": 0, "ours": str(len(ours)), "other": str(len(other))}]
    ours_bytes = masked(ours, layout_version, geometry, *owners[0])
    other_bytes = masked(other, layout_version, geometry, *owners[1])
    if ours_bytes == other_bytes:
        return []
    locate = field_at9 if layout_version == 9 else field_at
    found: dict[int, tuple[Field, int, int]] = {}  # field start -> (field, first and last differing offsets)
    for offset in (i for i in range(len(ours_bytes)) if ours_bytes[i] != other_bytes[i]):
        where = locate(geometry, offset)
        first = found.get(where.start, (where, offset, offset))[1]
        found[where.start] = (where, first, offset)
    differences: list[Difference] = []
    for where, first, last in found.values():
        if where.scalar:
            span = slice(where.start, where.start + where.size)
            values = [
                describe_value(where.label, int.from_bytes(side[span], "little"), layout_version)
                for side in (ours_bytes, other_bytes)
            ]
            label = where.label
        else:
            span = slice(first, last + 1)
            values = [side[span].hex() for side in (ours_bytes, other_bytes)]
            label = f"{where.label}[{first - where.start}:{last + 1 - where.start}]"
        differences.append({"field": label, "offset": span.start, "ours": values[0], "other": values[1]})
    return differences


# -- results ---------------------------------------------------------------------


@dataclass
class Divergence:
    """The first operation after which the implementations differed."""

    index: int  # in the sequence run
    operation: Operation
    ours: object  # this package's result
    other: object  # the other implementation's result
    differences: list[Difference]  # region fields that differ
    reproducer: list[Operation]  # from the last create up to this operation: replays the divergence
    failure: str = ""  # set when the other side died or hung


@dataclass
class Result:
    """What a cross-check found."""

    agreed: bool
    compared: int  # operations run and compared
    seed: int | None  # None for a replay
    elapsed_s: float
    ours: str  # this package's kickmsg file
    other: str  # the other side's kickmsg file and Python version
    layout: int = 4  # of the channels compared
    divergence: Divergence | None = None
    replay_command: list[str] = field(default_factory=list)  # argv of ``kickmsg crosscheck`` without --replay

    def report(self) -> str:
        """A readable summary, or the divergence with its reproducer."""
        where = f"seed {self.seed}" if self.seed is not None else "replay"
        head = f"ours:  {self.ours}\nother: {self.other}\n"
        d = self.divergence
        if d is None:  # agreed
            return head + (
                f"agreed: {self.compared} operations ({where}, layout {self.layout}), return values and region bytes "
                f"identical, {self.elapsed_s:.1f} s"
            )
        lines = [head + f"DIVERGENCE at operation {d.index} ({where}, after {self.elapsed_s:.1f} s): {json.dumps(d.operation)}"]
        if d.failure:
            lines.append(f"  the other implementation failed: {d.failure}")
        else:
            mark = "" if d.ours == d.other else "   <-- differ"
            lines.append(f"  result: ours {json.dumps(d.ours)}, other {json.dumps(d.other)}{mark}")
        if d.differences:
            lines.append(f"  region bytes: {len(d.differences)} field(s) differ")
            for diff in d.differences[:MAX_DIFFERENCES]:
                lines.append(f"    {diff['field']} @{diff['offset']}: ours {diff['ours']}, other {diff['other']}")
            if len(d.differences) > MAX_DIFFERENCES:
                lines.append(f"    ... and {len(d.differences) - MAX_DIFFERENCES} more")
        elif not d.failure:
            lines.append("  region bytes: identical")
        command = shlex.join(self.replay_command + ["--replay", "FILE"])
        lines.append(f"reproducer ({len(d.reproducer)} operations; save these lines as FILE, then: {command}):")
        lines += [jsontext.dumps(op) for op in d.reproducer]
        return "\n".join(lines)

    def to_dict(self) -> dict[str, object]:
        data: dict[str, object] = {
            "agreed": self.agreed,
            "compared": self.compared,
            "seed": self.seed,
            "layout": self.layout,
            "elapsed_s": round(self.elapsed_s, 3),
            "ours": self.ours,
            "other": self.other,
        }
        if self.divergence is not None:
            data["divergence"] = vars(self.divergence)
        return data


# -- running ---------------------------------------------------------------------


def crosscheck(other_python: str, other_path: str | None = None, ops: int = 1000, seed: int = 0, layout: int = 4) -> Result:
    """Run ``ops`` random operations (from ``seed``) on this package and on
    the implementation that ``other_python`` imports (from ``other_path``, a
    directory or several joined with ``os.pathsep``, when given), on
    channels of ``layout`` (4: against native 0.1.0's API, 9: 0.9.2's),
    comparing results and region bytes after each. Raises ``SetupError`` if
    the other side does not start or does not make regions of that layout."""
    if isinstance(ops, bool) or not isinstance(ops, int) or not 1 <= ops <= MAX_OPS:
        raise SetupError(f"the number of operations must be a whole number from 1 to {MAX_OPS}, got {ops!r}")
    check_layout(layout)
    return _run(Generator(seed, ops, layout), other_python, other_path, seed, layout)


def replay(other_python: str, operations: list[Operation], other_path: str | None = None, layout: int = 4) -> Result:
    """Run a given operation sequence (e.g. a divergence's reproducer)."""
    check_layout(layout)
    for op in operations:
        if not (isinstance(op, list) and op and isinstance(op[0], str)):
            raise SetupError(f"not an operation: {op!r} (expected a JSON list such as [\"send\", 0, 12, 7])")
    return _run(Replay(operations), other_python, other_path, None, layout)


def check_layout(layout_version: object) -> None:
    if layout_version not in (4, 9):
        raise SetupError(f"the layout must be 4 or 9, got {layout_version!r}")


def load_operations(path: str) -> list[Operation]:
    """Read a sequence: one JSON list per line (as a report prints them; blank
    lines and lines starting with # are skipped), or one JSON list of them."""
    try:
        text = read_at_most(path, REPLAY_LIMIT, "the limit of a crosscheck replay").decode("utf-8")
    except OSError as error:
        raise SetupError(f"cannot read {path}: {error.strerror}") from None
    try:
        if text.lstrip().startswith("[["):
            return json.loads(text)
        return [json.loads(line) for line in text.splitlines() if line.strip() and not line.lstrip().startswith("#")]
    except ValueError as error:
        raise SetupError(f"{path} is not a sequence of JSON operations: {error}") from None


def _run(source: Generator | Replay, other_python: str, other_path: str | None, seed: int | None, layout_version: int) -> Result:
    ours = crossdriver.Driver(kickmsg, layout_version)
    other = OtherSide(other_python, other_path, layout_version)
    replay_command = ["kickmsg", "crosscheck", "--other-python", other_python]
    if other_path:
        replay_command += ["--other-path", other_path]
    if layout_version != 4:
        replay_command += ["--layout", str(layout_version)]
    result = Result(
        agreed=True, compared=0, seed=seed, elapsed_s=0.0, ours=kickmsg.__file__,
        other=f"{other.kickmsg_file} (Python {other.python_version})", layout=layout_version,
        replay_command=replay_command,
    )
    # Each side's subscribing process, whose pid and start time its rings record (layout 9).
    owners = ((os.getpid(), process_start_time(os.getpid())), (other.pid, process_start_time(other.pid)))
    stem = f"/kmcc_{os.getpid()}_{secrets.token_hex(3)}"
    names: tuple[str, str] | None = None  # (ours, other) of the region in use
    made: list[str] = []
    last_create = 0
    executed = []
    ours_result: object  # JSON values
    other_result: object
    start = time.monotonic()
    try:
        for index, op in enumerate(source):
            executed.append(op)
            if op[0] == "create":
                last_create = index
                previous, names = made[:], (f"{stem}_{index}_ours", f"{stem}_{index}_other")
                made += names
            if op[0] in POKES | CRASHES:
                if ours.region is None or names is None:
                    ours_result = other_result = "no region"
                elif op[0] not in (CRASHES if layout_version == 9 else POKES):  # (a replay of the other layout's)
                    ours_result = other_result = f"not on layout {layout_version}"
                elif op[0] in POKES:
                    ours_result = poke(op, names[0], ours.region.geometry)
                    other_result = poke(op, names[1], ours.region.geometry)
                else:
                    ours_result, other_result = crash(op, names[0]), crash(op, names[1])
            else:
                # kill_subscriber: its ring, as our Subscriber's core knows it (the twin's is the same ring, or the
                # regions already differ)
                killed = ours.subscribers.get(op[1]) if op[0] == "kill_subscriber" and layout_version == 9 else None
                if op[0] == "join" and layout_version == 9 and ours.region is not None and names is not None:
                    for name in names:  # our join's own reclaim (0.9.2's join has none), done alike on both
                        repair.reclaim_dead_rings(v9.Region.open(name))
                ours_result = json.loads(json.dumps(ours.run(op, names and names[0])))
                try:
                    other_result = other.run(op, names and names[1])
                except OtherFailed as failure:
                    result.divergence = Divergence(index, op, ours_result, None, [], executed[last_create:], str(failure))
                    break
                if killed is not None and names is not None:
                    for name in names:
                        bury(name, killed._core.ring_index)
            if op[0] == "create":
                for name in previous:
                    unlink_shm(name)
                if ours_result is None and names is not None:
                    check_version(names[1], layout_version, other)
            source.observe(op, ours_result)
            result.compared += 1
            differences = []
            if ours.region is not None and names is not None:
                geometry = ours.region.core.geometry if layout_version == 9 else ours.region.geometry
                differences = compare_regions(
                    read_region(names[0]), read_region(names[1]), geometry, layout_version, owners
                )
            if ours_result != other_result or differences:
                result.divergence = Divergence(index, op, ours_result, other_result, differences, executed[last_create:])
                break
    finally:
        ours.drop_all()
        other.close()
        for name in made:
            unlink_shm(name)
        result.elapsed_s = time.monotonic() - start
    result.agreed = result.divergence is None
    return result


def check_version(name: str, layout_version: int, other: OtherSide) -> None:
    """The other side must have made a region of the layout compared (its
    version word, at offset 8): else ``SetupError``."""
    region = read_region(name)
    version = int.from_bytes(region[8:12], "little") if region is not None and len(region) >= 12 else None
    if version is not None and version != layout_version:
        raise SetupError(
            f"the other implementation ({other.kickmsg_file}) made a layout-{version} region, not layout {layout_version}: "
            f"choose --layout {version}" + (" (native 0.1.0 speaks only layout 4, 0.9.2 only layout 9)" if version in (4, 9) else "")
        )
