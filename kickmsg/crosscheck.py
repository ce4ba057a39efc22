"""Differential cross-check of another Kickmsg implementation against this one.

``crosscheck(other_python)`` generates a random (seeded, reproducible)
sequence of single-threaded operations and runs each one on this package,
in-process, and on the other implementation, driven in a subprocess
(``other_python -I -S`` with ``other_path`` first on ``sys.path``, or
``other_python -I`` and its own ``kickmsg``). Each side works on its own
region: same config and creator string, different shm names. After every
operation it compares the return values and the raw bytes of the two
regions, all of them but ``creator_pid`` and ``created_at_ns``:
deterministic single-threaded use must leave identical bytes. It stops at
the first divergence and reports the operation, what differed (decoded:
which header field, ring, entry or slot), and a sequence that reproduces it,
which ``replay`` runs again.

Operations (JSON lists, see ``kickmsg.crossdriver``): create a region (1-4
subscribers, ring capacity 2/4/8, pool capacity+1 to 16, payload 8-64, PubSub or
Broadcast), publishers, ``send`` (also too long, or with the pool dry),
``allocate``/fill/``publish``, subscribers joining and leaving, copy and
view receives (views held, released later), ``lost``, ``dropped``,
``diagnose``, ``repair_locked_entries``, ``reset_retired_rings``,
``reclaim_orphaned_slots`` (only while no view is held, its contract), and
damage that a crashed publisher leaves (``poke_*``: poked into both regions'
bytes by this process, identically, so that the repair paths run too).

Left out on purpose, because the implementations differ there (README,
"Compatibility"): dropping an unpublished slot on its own; using a slot that
a newer ``allocate`` of its publisher replaced (0.1.0 lets it alias the new
one); ``send`` on a publisher that has an unpublished slot (0.1.0 gives
that slot back first, so it may then hold the sent message, which writing
through the old slot would change; this package keeps the two apart); and
dropping a subscriber while views it received are alive (0.1.0
keeps the subscriber, so its ring stays Live, until those view objects are
collected; this package leaves the ring at once).
"""
import json
import os
import random
import secrets
import select
import shlex
import subprocess
import tempfile
import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any

import kickmsg
from kickmsg import crossdriver, jsontext
from kickmsg.protocol.v4 import layout
from kickmsg.protocol.v4.layout import field_at
from kickmsg.region import unlink_shm
from kickmsg.userfiles import read_at_most

IGNORED = range(112, 128)  # creator_pid and created_at_ns differ by nature
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

Operation = list[Any]  # [kind, *args], JSON values
Difference = dict[str, str | int]  # a region field that differs: field, offset, ours, other


class SetupError(RuntimeError):
    """The cross-check could not run: bad input, or the other implementation
    does not start."""


# -- the operation sequence ------------------------------------------------------


class Generator:
    """Yields random operations that make sense in the current state; it
    learns the state from this package's results (``observe``)."""

    def __init__(self, seed: int, count: int) -> None:
        self.random = random.Random(seed)
        self.count = count
        self.next_id = 0
        self.reset(None)

    def reset(self, geometry: tuple[Any, ...] | None) -> None:
        """A new region (or none): no handles yet."""
        self.geometry = geometry  # (type, max_subs, capacity, pool, payload)
        self.publishers: dict[int, int | None] = {}  # id -> its unpublished slot id, or None
        self.slot_owner: dict[int, int] = {}  # slot id -> publisher id, for slot handles held
        self.published: set[int] = set()  # slot handles already published
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
        if kind in ("drop_publisher", "allocate", "dropped"):
            return bool(self.publishers)
        if kind == "send":
            return bool(self.idle_publishers())
        if kind in ("fill", "publish"):
            return bool(self.pending_slots())
        if kind == "drop_slot":
            return bool(self.published)
        if kind in ("recv", "recv_view", "lost"):
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

    def idle_publishers(self) -> list[int]:
        """Publishers without an unpublished slot."""
        return [p for p, pending in self.publishers.items() if pending is None]

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
        return [
            "create",
            r.choice(["PubSub", "Broadcast"]),
            r.randint(1, 4),
            capacity,
            r.randint(capacity + 1, 16),  # this package refuses a pool no larger than a ring (0.1.0 does not)
            r.randint(8, 64),
        ]

    def next_operation(self) -> Operation:
        if self.geometry is None:
            return self.create_operation()
        _, max_subs, _, _, payload = self.geometry
        kinds = [kind for kind in WEIGHTS if self.possible(kind)]
        weights = [WEIGHTS[kind] for kind in kinds]
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
            return [kind, self.pick(self.idle_publishers()), self.length(payload), r.randrange(256)]
        if kind == "allocate":
            return [kind, self.pick(self.publishers), self.length(payload), self.new_id()]
        if kind in ("fill", "publish"):
            # An unpublished slot; sometimes a published one (refused).
            slot = self.pick(self.published) if self.published and r.random() < 0.1 else self.pick(self.pending_slots())
            return [kind, slot, r.randrange(256)] if kind == "fill" else [kind, slot]
        if kind == "drop_slot":
            return [kind, self.pick(self.published)]
        if kind == "leave":
            return [kind, self.pick(self.subscribers - set(self.views.values()))]
        if kind in ("recv", "lost"):
            return [kind, self.pick(self.subscribers)]
        if kind == "recv_view":
            return [kind, self.pick(self.subscribers), self.new_id()]
        if kind == "release":
            return [kind, self.pick(self.views)]
        if kind in POKES:
            return [kind, r.randrange(max_subs)]
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
        elif kind == "allocate" and isinstance(result, int):
            publisher, _, slot = args
            replaced = self.publishers[publisher]
            if replaced is not None:
                self.slot_owner.pop(replaced, None)  # replaced: its handle is dropped
            self.publishers[publisher] = slot
            self.slot_owner[slot] = publisher
        elif kind == "publish" and isinstance(result, int):
            owner = self.slot_owner[args[0]]
            if self.publishers.get(owner) == args[0]:
                self.publishers[owner] = None
            self.published.add(args[0])
        elif kind == "drop_slot":
            self.published.discard(args[0])
            self.slot_owner.pop(args[0], None)
        elif kind == "join" and result is None:
            self.subscribers.add(args[0])
        elif kind == "leave":
            self.subscribers.discard(args[0])
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


class OtherFailed(Exception):
    """The other side died or stopped answering during an operation."""


class OtherSide:
    """The other implementation running ``kickmsg.crossdriver`` in a child."""

    def __init__(self, python: str, path: str | None) -> None:
        with open(crossdriver.__file__, encoding="utf-8") as file:
            source = file.read()
        if path:
            command = [python, "-I", "-S", "-c", source, path]
        else:
            command = [python, "-I", "-c", source]
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


def describe_value(label: str, value: int) -> str:
    """A field's integer value, with its meaning where it has one."""
    if label == "header.free_top":
        top = value & layout.U32_MAX
        return f"0x{value:016x} (generation {value >> 32}, top {'empty' if top == layout.INVALID_SLOT else f'slot {top}'})"
    if label.endswith(".state_flight"):
        state = layout.RING_STATE_NAMES.get(value & layout.RING_STATE_MASK, "?")
        return f"{value} ({state}, in_flight {value >> 2})"
    if label.endswith(".sequence") and value == layout.LOCKED_SEQUENCE:
        return "LOCKED"
    if label.endswith((".slot_idx", ".next_free")) and value == layout.INVALID_SLOT:
        return "INVALID_SLOT"
    return str(value)


def compare_regions(ours: bytes | None, other: bytes | None, geometry: layout.Geometry) -> list[Difference]:
    """The fields in which two regions differ (creator_pid and
    created_at_ns ignored), each with both values."""
    if ours is None or other is None:
        return [{"field": "shared-memory object", "offset": 0, "ours": "present" if ours is not None else "missing",
                 "other": "present" if other is not None else "missing"}]
    if len(ours) != len(other):
        return [{"field": "object size", "offset": 0, "ours": str(len(ours)), "other": str(len(other))}]
    ours_bytes, other_bytes = bytearray(ours), bytearray(other)
    ours_bytes[IGNORED.start : IGNORED.stop] = other_bytes[IGNORED.start : IGNORED.stop] = bytes(len(IGNORED))
    if ours_bytes == other_bytes:
        return []
    found: dict[int, tuple[layout.Field, int, int]] = {}  # field start -> (field, first and last differing offsets)
    for offset in (i for i in range(len(ours_bytes)) if ours_bytes[i] != other_bytes[i]):
        where = field_at(geometry, offset)
        first = found.get(where.start, (where, offset, offset))[1]
        found[where.start] = (where, first, offset)
    differences: list[Difference] = []
    for where, first, last in found.values():
        if where.scalar:
            span = slice(where.start, where.start + where.size)
            values = [describe_value(where.label, int.from_bytes(side[span], "little")) for side in (ours_bytes, other_bytes)]
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
    divergence: Divergence | None = None
    replay_command: list[str] = field(default_factory=list)  # argv of ``kickmsg crosscheck`` without --replay

    def report(self) -> str:
        """A readable summary, or the divergence with its reproducer."""
        where = f"seed {self.seed}" if self.seed is not None else "replay"
        head = f"ours:  {self.ours}\nother: {self.other}\n"
        d = self.divergence
        if d is None:  # agreed
            return head + f"agreed: {self.compared} operations ({where}), return values and region bytes identical, {self.elapsed_s:.1f} s"
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
            "elapsed_s": round(self.elapsed_s, 3),
            "ours": self.ours,
            "other": self.other,
        }
        if self.divergence is not None:
            data["divergence"] = vars(self.divergence)
        return data


# -- running ---------------------------------------------------------------------


def crosscheck(other_python: str, other_path: str | None = None, ops: int = 1000, seed: int = 0) -> Result:
    """Run ``ops`` random operations (from ``seed``) on this package and on
    the implementation that ``other_python`` imports (from ``other_path``, a
    directory or several joined with ``os.pathsep``, when given), comparing
    results and region bytes after each. Raises ``SetupError`` if the other
    side does not start."""
    if not isinstance(ops, int) or ops < 1:
        raise SetupError(f"the number of operations must be a positive integer, got {ops!r}")
    return _run(Generator(seed, ops), other_python, other_path, seed)


def replay(other_python: str, operations: list[Operation], other_path: str | None = None) -> Result:
    """Run a given operation sequence (e.g. a divergence's reproducer)."""
    for op in operations:
        if not (isinstance(op, list) and op and isinstance(op[0], str)):
            raise SetupError(f"not an operation: {op!r} (expected a JSON list such as [\"send\", 0, 12, 7])")
    return _run(Replay(operations), other_python, other_path, None)


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


def _run(source: Generator | Replay, other_python: str, other_path: str | None, seed: int | None) -> Result:
    ours = crossdriver.Driver(kickmsg)
    other = OtherSide(other_python, other_path)
    replay_command = ["kickmsg", "crosscheck", "--other-python", other_python]
    if other_path:
        replay_command += ["--other-path", other_path]
    result = Result(
        agreed=True, compared=0, seed=seed, elapsed_s=0.0, ours=kickmsg.__file__,
        other=f"{other.kickmsg_file} (Python {other.python_version})", replay_command=replay_command,
    )
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
            if op[0] in POKES:
                if ours.region is None or names is None:
                    ours_result = other_result = "no region"
                else:
                    ours_result = poke(op, names[0], ours.region.geometry)
                    other_result = poke(op, names[1], ours.region.geometry)
            else:
                ours_result = json.loads(json.dumps(ours.run(op, names and names[0])))
                try:
                    other_result = other.run(op, names and names[1])
                except OtherFailed as failure:
                    result.divergence = Divergence(index, op, ours_result, None, [], executed[last_create:], str(failure))
                    break
            if op[0] == "create":
                for name in previous:
                    unlink_shm(name)
            source.observe(op, ours_result)
            result.compared += 1
            differences = []
            if ours.region is not None and names is not None:
                differences = compare_regions(read_region(names[0]), read_region(names[1]), ours.region.geometry)
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
