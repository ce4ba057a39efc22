"""Hardening, on both layouts: on a corrupt or hostile region every call
works, raises a clear exception (the RuntimeError family, CorruptRegionError
included, or BlockingIOError; ValueError only for a bad argument; OSError
with an errno from a blackboard write) or counts a loss. The interpreter
never crashes, no call loops forever, and no IndexError, struct.error,
OverflowError, ZeroDivisionError or KeyError leaks out of the package.

Hypothesis property tests corrupt the shared words, then run the public
calls in a random order, in a subprocess (this file run as a script), so
that a segfault or a hang fails the test instead of killing pytest; a worker
that hangs in one example dumps its stacks (faulthandler) and dies.

- channel, both layouts: ring entries (layout 4: sequence words, slot
  indexes, payload lengths; layout 9: sequence words with commits,
  position-tagged publisher and repairer locks, skip markers, and meta claim
  words with tags and slot fields out of range), ring headers (state_flight,
  write_pos; layout 9: owner pid and start time, has_waiter, dropped/lost
  counters), free_top and free-stack chains (cycles, out of range; layout
  9: generations), slot refcounts (layout 9: payload lengths), the schema
  state (layout 9: its steal count), header fields read at open, and
  layout 4's ring-owner sidecar records, under live subscribers, views
  (layout 9: a pending allocation) and dead subscribers; then open, send,
  allocate, publish, receive, diagnose, audit and every repair call
  (layout 9: receive through a WaitSet, stats, info, following a re-created
  region, and the tools' kickmsg.ops.diagnostics reports);
- layout 4's header alone: geometry, free_top, schema and creator fields
  changed before or after open;
- layout 9: the same channel calls while another process keeps storing
  hostile words into the rings and the pool (timing-dependent: it can only
  fail on a real bug, but not always on the same example);
- layout 9's registry: the header (version, capacity), rows (state,
  generation, pid, start time, type/role/kind, names without NUL or not
  UTF-8); then open, snapshot, list_topics, sweep_stale, register,
  deregister;
- layout 9's blackboard: the header (version, capacity, max_value_size,
  total_size, change_seq, waiters, lock token), entries (state, publish,
  tenancy, owner, key hash, key and node text), value cells (value_len
  beyond max_value_size); then open, declare, write, release,
  observe/read, snapshot, keys, read_all, sweep_stale, wait.

The offsets come from WIRE.md (through ``rawregion``) and WIRE9.md (A.2-A.5,
C.1-C.2, D.2-D.4) through the small decoder below, not from the package's
layout constants; a channel's geometry words sit at the same offsets on both
layouts.

Each property runs DEFAULT_EXAMPLES examples (derandomized: reproducible in
CI); ``KICKMSG_HARDENING_EXAMPLES=500`` runs that many per property instead.
"""
import errno
import faulthandler
import itertools
import json
import mmap
import os
import signal
import struct
import subprocess
import sys
import time
from collections import Counter

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import rawregion
from conftest import TESTS, on_layout4
from hardening_session import ChannelSession, Harness, read_bytes
from kickmsg import (
    Blackboard,
    BlackboardConfig,
    ChannelType,
    Config,
    Publisher,
    Registry,
    SharedRegion,
    Subscriber,
    WaitSet,
    owners,
    unlink_shm,
)
from kickmsg.ops import diagnostics
from kickmsg.protocol.v9.registry import Kind, Role
from kickmsg.region import DeadSubscriberReport, HealthReport

INVALID_SLOT = 0xFFFFFFFF
U32 = 2**32 - 1
U64 = 2**64 - 1
LOCKED = U64  # layout 4: an entry claimed and not committed
LOCK_BIT, REPAIR_BIT, VALUE_MASK = 1 << 63, 1 << 62, (1 << 62) - 1  # layout 9's sequence words
# commit_timeout 1 ms bounds every wait on a stuck entry or an in-flight publisher.
SMALL = dict(max_subscribers=3, sub_ring_capacity=8, pool_size=16, max_payload_size=56, commit_timeout=0.001)
EXAMPLES = int(os.environ.get("KICKMSG_HARDENING_EXAMPLES", 0)) or None
# Per worker mode: layout 4's "header" and "state", layout 9's others.
DEFAULT_EXAMPLES = {"header": 1000, "state": 700, "channel": 200, "noise": 15, "registry": 40, "blackboard": 40}
EXAMPLE_WATCHDOG_S = 20
# Whole-worker bounds: generous per example (a loaded machine; layout 4's
# examples are quicker: its 1000 take seconds), scaled with the count asked for.
WORKER_TIMEOUT_S = 60 + 2 * (EXAMPLES or DEFAULT_EXAMPLES["channel"])
TEST_TIMEOUT_S = WORKER_TIMEOUT_S + 30


def examples(mode):
    return EXAMPLES or DEFAULT_EXAMPLES[mode]


# -- the pytest side ---------------------------------------------------------------------------


def run_worker(mode, name, workdir):
    """Run this file's fuzz loop in a fresh interpreter; return its summary."""
    count = examples(mode)
    result = subprocess.run(
        [sys.executable, __file__, mode, name, str(count)],
        capture_output=True,
        text=True,
        timeout=WORKER_TIMEOUT_S,
        cwd=workdir,  # hypothesis writes its cache into the working directory
        env=dict(os.environ, OPENBLAS_NUM_THREADS="1", PYTHONPATH=str(TESTS)),  # no BLAS threads: the worker forks
    )
    assert result.returncode == 0, (
        f"fuzz worker exited with {result.returncode} (negative: killed by signal)\n"
        f"stdout:\n{result.stdout[-8000:]}\nstderr:\n{result.stderr[-8000:]}"
    )
    summary = Counter(json.loads(result.stdout.strip().splitlines()[-1]))
    assert summary["examples"] == count
    return summary


# Per layout: the worker mode that fuzzes a channel's rings, pool and free
# stack, and every call it must have seen succeed at least once.
CHANNEL_FUZZ = {
    4: ("state", (
        "send send_too_large allocate publish join leave try_receive receive latest receive_latest iterate view "
        "release_view diagnose audit repair reset reset_drain reclaim_orphaned reclaim_dead reopen schema "
        "claim_schema reset_schema_claim").split()),
    9: ("channel", (
        "send allocate publish join try_receive view stats info diagnose audit repair reset_drain reclaim_orphaned "
        "reclaim_dead_rings reopen tools_stats").split()),
}


@pytest.mark.timeout(TEST_TIMEOUT_S)
def test_corrupt_rings_pool_and_free_stack(layout, shm_name, tmp_path):
    """Rings, entries, refcounts, free_top, free-stack chains (and layout 4's
    sidecar records) corrupted under live subscribers, views and dead
    subscribers: every call in any order behaves."""
    mode, calls = CHANNEL_FUZZ[layout]
    summary = run_worker(mode, shm_name, tmp_path)
    for call in calls:
        assert summary[f"{call}:ok"] > 0, (call, summary)
    assert summary["lost"] > 0 and summary["received"] > 0
    assert summary["reclaimed dead rings"] > 0
    errors = {key: count for key, count in summary.items() if key.endswith("Error")}
    assert errors, "no corruption was ever detected"


@on_layout4
@pytest.mark.timeout(TEST_TIMEOUT_S)
def test_corrupt_header(shm_name, tmp_path):
    """Layout 4's header fields (geometry, free_top, schema, creator) changed
    before or after open: open refuses with CorruptRegionError (a
    RuntimeError), or every call behaves. (Layout 9's channel fuzz changes
    the header words read at open.)"""
    summary = run_worker("header", shm_name, tmp_path)
    assert summary["open:ok"] > 0 and summary["open:CorruptRegionError"] > 0, summary
    for call in CHANNEL_FUZZ[4][1]:
        assert summary[f"{call}:ok"] > 0, call


@pytest.mark.timeout(TEST_TIMEOUT_S)
def test_channel_corrupted_while_in_use(shm_name, tmp_path):
    """Another process keeps storing hostile words into the rings and the pool
    while the calls run: values change between a call's reads."""
    summary = run_worker("noise", shm_name, tmp_path)
    for call in ("send", "try_receive", "view", "stats", "diagnose"):
        assert summary[f"{call}:ok"] > 0, (call, summary)


@pytest.mark.timeout(TEST_TIMEOUT_S)
def test_hostile_registry(prefix, tmp_path):
    summary = run_worker("registry", prefix, tmp_path)
    for call in ("open", "snapshot", "list_topics", "sweep_stale", "register", "tools_registry"):
        assert summary[f"{call}:ok"] > 0, (call, summary)


@pytest.mark.timeout(TEST_TIMEOUT_S)
def test_hostile_blackboard(prefix, tmp_path):
    summary = run_worker("blackboard", prefix, tmp_path)
    for call in ("open", "declare", "write", "read", "snapshot", "keys", "read_all", "sweep_stale", "tools_blackboard"):
        assert summary[f"{call}:ok"] > 0, (call, summary)


# -- directed cases: bad arguments are ValueError, also on a corrupt region, and the smallest
# -- reproductions of what the properties found ------------------------------------------------


def test_bad_arguments_are_value_errors_and_a_corrupt_head_an_empty_pool(shm_name):
    """On a region whose free-stack head lies outside the pool and whose ring
    0 holds publisher locks: the head reads as an empty pool (B.5, B.14: a
    corrupt head must not fault; layout 4 raises CorruptRegionError there),
    bad arguments stay ValueErrors, the locks are neither samples nor
    losses until repaired."""
    region = SharedRegion.create(shm_name, ChannelType.PubSub, Config(**SMALL), layout=9)
    subscriber = Subscriber(region)
    memory = Channel(shm_name)
    memory.put(768, "<Q", (memory.get(768, "<Q") >> 32) << 32 | 16)  # A.2 free_top: index 16 of a 16-slot pool
    for position in range(5):
        memory.put(memory.entry(0, position), "<Q", LOCK_BIT | position)  # A.4: publisher lock at pos
    memory.put(memory.ring(0) + 64, "<Q", 5)  # A.3 write_pos
    memory.close()
    publisher = Publisher(region)
    with pytest.raises(ValueError, match="max_payload_size"):
        publisher.send(b"x" * 57)
    with pytest.raises(ValueError):
        publisher.allocate(-1)
    with pytest.raises(ValueError):
        subscriber.receive(-1.0)
    with pytest.raises(BlockingIOError, match=shm_name):
        publisher.send(b"x")
    assert publisher.allocate() is None
    assert subscriber.try_receive() is None and subscriber.lost == 0  # locked: not ready, not lost
    assert region.repair_locked_entries() == 5
    assert region.diagnose().locked_entries == 0
    assert subscriber.try_receive() is None and subscriber.lost == 5  # skip markers: losses
    subscriber.close()


def test_a_registry_generation_at_the_u32_limit_wraps(prefix):
    """A row's generation word 0xFFFFFFFF: opening it for writing stores
    (g + 1) | 1 in u32 arithmetic (1), as the wheel does, instead of an
    OverflowError out of deregister."""
    registry = Registry.open_or_create(prefix, 4)
    row = registry.register(1, Role.Publisher, Kind.Pubsub, "/x", "/x", "node")
    memory = Raw(registry.name)
    memory.put(64 + 512 * row + 16, "<I", U32)  # C.2: generation at row + 16
    registry.deregister(row)
    assert memory.get(64 + 512 * row, "<I") == 0  # Free
    assert memory.get(64 + 512 * row + 16, "<I") == 2  # opened to 1, settled to 2
    memory.close()
    assert registry.register(1, Role.Publisher, Kind.Pubsub, "/x", "/x", "node") == row


def test_a_blackboard_write_after_taking_over_a_huge_publish_count_wraps(prefix):
    """A takeover continues the entry's write count (publish >> 1): a hostile
    publish word 2^64 - 2 gives a count of 2^63 - 1, whose next write stores
    2k - 1 = 2^64 - 1 and then 2k, which wraps to 0 in u64 arithmetic as in the
    wheel (readers see no value yet), instead of an OverflowError."""
    board = Blackboard.open_or_create(prefix, "board", BlackboardConfig(capacity=4, max_value_size=40), "me")
    board.declare("a").release()
    memory = Raw(board.name)
    memory.put(192 + 8, "<Q", U64 - 1)  # D.3: entry 0's publish word
    writer = board.declare("a")  # takeover: the count continues from publish >> 1
    writer.write(b"y")
    assert memory.get(192 + 8, "<Q") == 0
    memory.close()
    assert board.observe("a").read().errno == errno.ENOMSG
    writer.write(b"z")  # and the count goes on from there
    assert board.observe("a").read().data == b"z"
    writer.release()


@pytest.fixture
def corrupt(shm_name):
    """A layout-4 region whose free stack is a cycle and whose ring 0 is poked
    full of LOCKED entries, with a subscriber on it."""
    region = SharedRegion.create(shm_name, ChannelType.PubSub, Config(**SMALL))
    subscriber = Subscriber(region)
    h = rawregion.header(rawregion.read_bytes(shm_name))
    with open(f"/dev/shm{shm_name}", "r+b") as file, mmap.mmap(file.fileno(), 0) as memory:
        top = h["free_top"] & 0xFFFFFFFF
        struct.pack_into("<I", memory, h["pool_offset"] + top * h["slot_stride"] + 4, top)
        ring = h["sub_rings_offset"]
        struct.pack_into("<Q", memory, ring + 64, 5)
        for index in range(8):
            struct.pack_into("<Q", memory, ring + 128 + 16 * index, LOCKED)
    yield region, subscriber
    subscriber.close()


@on_layout4
def test_bad_arguments_are_value_errors_on_a_corrupt_region(corrupt):
    region, subscriber = corrupt
    publisher = Publisher(region)
    with pytest.raises(ValueError, match="max_payload_size"):
        publisher.send(b"x" * 57)
    with pytest.raises(ValueError):
        publisher.allocate(-1)
    assert publisher.allocate(57) is None
    with pytest.raises(ValueError):
        subscriber.receive(-1.0)
    slot = publisher.allocate(3)
    slot.publish()
    with pytest.raises(ValueError, match="more than once"):
        slot.publish()
    assert subscriber.try_receive() is None  # LOCKED entries: not ready, not lost
    assert region.repair_locked_entries() == 5
    assert region.diagnose().locked_entries == 0


@on_layout4
def test_a_closed_subscriber_raises_value_error(corrupt):
    _, subscriber = corrupt
    subscriber.close()
    for call in (subscriber.try_receive, subscriber.try_receive_view, subscriber.try_receive_latest):
        with pytest.raises(ValueError, match="closed"):
            call()


SIDECAR_TRUNCATED = """
import os, sys
from kickmsg import ChannelType, Config, Publisher, SharedRegion, Subscriber
name = sys.argv[1]
region = SharedRegion.create(name, ChannelType.PubSub, Config(max_subscribers=2, sub_ring_capacity=8, pool_size=16))
subscriber = Subscriber(region)
Publisher(region).send(b"x")
os.truncate("/dev/shm" + name + ".kickmsg-subscribers", 0)  # any process may write the sidecar (mode 0666)
assert subscriber.try_receive() == b"x"
subscriber.close()
"""


@on_layout4
@pytest.mark.timeout(60)
def test_a_truncated_sidecar_does_not_crash_a_subscriber(shm_name):
    result = subprocess.run([sys.executable, "-c", SIDECAR_TRUNCATED, shm_name], capture_output=True, timeout=30)
    assert result.returncode == 0, f"exit {result.returncode} (negative: killed by signal): {result.stderr[-2000:]!r}"


# -- the worker side: everything below runs in the subprocess ---------------------------------------

class Raw:
    """Pokes into one shm object: the bytes as the file holds them."""

    def __init__(self, name):
        self._file = open(f"/dev/shm{name}", "r+b")
        self.memory = mmap.mmap(self._file.fileno(), 0)

    def close(self):
        self.memory.close()
        self._file.close()

    def get(self, offset, fmt):
        return struct.unpack_from(fmt, self.memory, offset)[0]

    def put(self, offset, fmt, value):
        """Store ``value`` cut to the width of ``fmt``, if it lies inside the object."""
        size = struct.calcsize(fmt)
        if 0 <= offset <= len(self.memory) - size:
            struct.pack_into(fmt, self.memory, offset, value & (2 ** (8 * size) - 1))

    def put_bytes(self, offset, data):
        if 0 <= offset <= len(self.memory) - len(data):
            self.memory[offset : offset + len(data)] = data


class Channel(Raw):
    """A channel's bytes, geometry read from the header: its words, rings and
    entries, and slots lie at the same offsets on both layouts (WIRE.md;
    WIRE9.md A.2-A.5)."""

    def __init__(self, name):
        super().__init__(name)
        self.rings_offset = self.get(24, "<Q")
        self.pool_offset = self.get(32, "<Q")
        self.max_subs = self.get(40, "<Q")
        self.capacity = self.get(48, "<Q")
        self.pool_size = self.get(64, "<Q")
        self.slot_data_size = self.get(72, "<Q")
        self.slot_stride = self.get(80, "<Q")
        self.ring_stride = self.get(88, "<Q")

    def ring(self, index):  # A.3: the ring header, 128 bytes
        return self.rings_offset + (index % self.max_subs) * self.ring_stride

    def entry(self, ring, position):  # A.4: 16-byte entries after the ring header
        return self.ring(ring) + 128 + 16 * (position % self.capacity)

    def slot(self, index):  # A.5: refcount @0, next_free @4, payload_len @8, payload @16
        return self.pool_offset + (index % self.pool_size) * self.slot_stride

    def write_pos(self, ring):
        return self.get(self.ring(ring) + 64, "<Q")


def u64_words():
    return st.one_of(st.integers(0, 40), st.sampled_from([INVALID_SLOT, U64, 2**63, 2**62, 2**32]), st.integers(0, U64))


def u32_words():
    return st.one_of(st.integers(0, 40), st.sampled_from([INVALID_SLOT, 2**31, 0xFFFFFFFD]), st.integers(0, U32))


def start_time(pid):
    """Field 22 of /proc/<pid>/stat (B.16), 0 if unknown."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as stat:
            return int(stat.read().rpartition(b")")[2].split()[19])
    except (OSError, IndexError, ValueError):
        return 0


def dead_pid():
    """A pid that just exited (reaped)."""
    pid = os.fork()
    if pid == 0:
        os._exit(0)
    os.waitpid(pid, 0)
    return pid


def pids():
    """Owner words: none, this process, a dead one, a huge one, anything."""
    return st.one_of(st.sampled_from(["self", "dead", 0, 2**31, 2**40, U64]), st.integers(0, U64))


def resolve_pid(value, dead):
    return os.getpid() if value == "self" else dead if value == "dead" else value


def watched(function):
    """The per-example watchdog: a hang dumps every stack and dies (see main)."""
    def example(*args, **kwargs):
        signal.alarm(EXAMPLE_WATCHDOG_S)
        try:
            function(*args, **kwargs)
        finally:
            signal.alarm(0)
    return example


def fuzz_settings(count):
    return settings(max_examples=count, deadline=None, database=None, derandomize=True, print_blob=True,
                    suppress_health_check=list(HealthCheck))


# -- channels ----------------------------------------------------------------------------------------


def spawn_dead_subscribers(region, count):
    """Subscribers in forked children that die without leaving: their rings
    stay Live with a dead owner (layout 4: in its sidecar records; layout 9:
    in the ring header)."""
    for _ in range(count):
        pid = os.fork()
        if pid == 0:
            try:
                subscriber = Subscriber(region)  # noqa: F841 (kept until the exit)
                Publisher(region).send(b"from a subscriber about to die")
            finally:
                os._exit(0)  # no teardown: finalizers do not run
        os.waitpid(pid, 0)


def free_chains(generations=st.one_of(st.none(), st.sampled_from([0, U32]))):
    """A free stack to install: slots linked in list order (out-of-range
    indexes allowed), ending in INVALID_SLOT or looping back (a cycle), and
    the generation of the new top (None: keep the generation)."""
    return st.tuples(
        st.lists(st.one_of(st.integers(0, 15), st.sampled_from([16, 5000, INVALID_SLOT - 1])), min_size=1, max_size=20),
        st.one_of(st.none(), st.integers(0, 19)),  # None: ends; k: last links back to element k
        generations,
    )


def install_free_chain(memory, chain, loop_to, generation):
    slots, pool = chain, memory.pool_size
    ends = slots[loop_to % len(slots)] if loop_to is not None else INVALID_SLOT
    for upper, lower in zip(slots, slots[1:] + [ends]):
        if upper < pool:
            memory.put(memory.slot(upper) + 4, "<I", lower)
    if generation is None:
        generation = memory.get(768, "<Q") >> 32
    memory.put(768, "<Q", generation << 32 | slots[0])


# -- layout 4's channel (WIRE.md) ----------------------------------------------------------------

class Session4(ChannelSession):
    """Layout 4's own operations beside the shared ones (hardening_session)."""

    def op_allocate(self):
        slot = self.harness.call("allocate", self.publisher.allocate, 5)
        if slot is not None:
            with memoryview(slot) as buffer:
                buffer[:] = b"alloc"
            self.pending = slot

    def op_publish(self):
        if self.pending is not None:
            slot, self.pending = self.pending, None
            delivered = self.harness.call("publish", slot.publish)
            assert delivered is None or 0 <= delivered <= self.geometry.max_subs

    def op_diagnose(self):
        report = super().op_diagnose()
        assert report is None or isinstance(report, HealthReport)

    def op_audit(self):
        report = super().op_audit()
        if report is not None:
            assert len(report.rings) + report.idle_rings == self.geometry.max_subs

    def _entries_stuck_at_u64_limit(self):
        """Window entries that read as stuck even when committed correctly:
        within a ring's capacity of the u64 limit, sequence position + 1 is
        LOCKED itself or wraps past 2**64 in 0.1.0's u64 test (read at the
        offsets this region was opened with: the header may have changed)."""
        data, g = rawregion.read_bytes(self.name), self.geometry
        count = 0
        for index in range(g.max_subs):
            write_pos = struct.unpack_from("<Q", data, g.sub_rings_offset + index * g.ring_stride + 64)[0]
            for position in range(max(0, write_pos - g.capacity), write_pos):
                sequence = (position + 1) % 2**64
                count += sequence == U64 or (sequence + g.capacity) % 2**64 < sequence
        return count

    def op_repair(self):
        repaired = self.harness.call("repair", self.region.repair_locked_entries)
        if repaired is not None:
            g = self.geometry
            assert 0 <= repaired <= g.max_subs * g.capacity
            # Nothing stuck is left, except at the u64 limit.
            assert self.region.diagnose().locked_entries <= self._entries_stuck_at_u64_limit()

    def op_reclaim_dead(self):
        report = self.harness.call("reclaim_dead", self.region.reclaim_dead_subscribers)
        if report is not None:
            assert isinstance(report, DeadSubscriberReport)
            self.harness["reclaimed dead rings"] += len(report.reclaimed)

    def op_reopen(self):
        region = self.harness.call("reopen", SharedRegion.open, self.name)
        if region is not None:
            self.harness.call("diagnose", region.diagnose)


OPERATIONS4 = Session4.operations()


def fresh_region(harness, base, counter):
    """A new small region under a fresh name (so that nothing left over from
    an earlier example can touch it); errors from now on must name it."""
    name = f"{base}_{next(counter)}"
    harness.region_name = name
    return name, SharedRegion.create(name, ChannelType.PubSub, Config(**SMALL), layout=4)


def header_edits():
    """One change to the header: a consistent shrink of the geometry (opens
    fine), a small commit timeout, or any value in any field (usually
    refused). commit_timeout_us stays small or beyond the 1-day limit: a
    header may legitimately ask for long waits."""
    any_field = st.sampled_from(sorted(set(rawregion.HEADER_OFFSETS) - {"commit_timeout_us"}))
    geometry_field = st.sampled_from(
        ["total_size", "sub_rings_offset", "pool_offset", "slot_stride", "sub_ring_stride", "pool_size", "max_subs",
         "slot_data_size", "creator_name_len"]
    )
    return st.one_of(
        st.tuples(st.just("relative"), st.tuples(geometry_field, st.sampled_from([-64, -8, -1, 1, 8, 64, 128]))),
        st.tuples(st.just("capacity"), st.integers(0, 3)),
        st.tuples(st.just("pool_size"), st.integers(1, 16)),
        st.tuples(st.just("max_subs"), st.integers(1, 3)),
        st.tuples(st.just("slot_data_size"), st.integers(1, 56)),
        st.tuples(st.just("commit_timeout_us"), st.one_of(st.integers(0, 2000), st.integers(86_400_000_001, U64))),
        st.tuples(st.just("free_top"), u64_words()),
        st.tuples(st.just("schema_data"), st.binary(min_size=512, max_size=512)),
        st.tuples(any_field, u64_words()),
    )


def apply_header_edit(memory, kind, value):
    if kind == "capacity":
        memory.put(48, "<Q", 2**value)
        memory.put(56, "<Q", 2**value - 1)
    elif kind == "relative":
        field, delta = value
        offset, fmt = rawregion.HEADER_OFFSETS[field]
        memory.put(offset, fmt, memory.get(offset, fmt) + delta)
    elif kind == "schema_data":
        memory.put_bytes(256, value)
        memory.put(192, "<I", 2)  # Set
    else:
        offset, fmt = rawregion.HEADER_OFFSETS[kind]
        memory.put(offset, fmt, value)


def fuzz_header(base, count):
    harness = Harness()
    counter = itertools.count()

    @fuzz_settings(count)
    @given(
        edits=st.lists(header_edits(), min_size=1, max_size=3),
        opened_before=st.booleans(),
        traffic=st.integers(0, 12),
        operations=st.lists(st.sampled_from(OPERATIONS4), max_size=25),
    )
    @watched
    def example(edits, opened_before, traffic, operations):
        harness["examples"] += 1
        name, region = fresh_region(harness, base, counter)
        session = None
        try:
            if opened_before:
                session = Session4(harness, region, name)
                session.op_join()
                for _ in range(traffic):
                    session.op_send()
            memory = Channel(name)
            for kind, value in edits:
                apply_header_edit(memory, kind, value)
            memory.close()
            if not opened_before:
                region = harness.call("open", SharedRegion.open, name)
                if region is None:
                    return
                session = Session4(harness, region, name)
            for operation in ["join", "send", "try_receive", "diagnose", "audit", "repair", "reset",
                              "reclaim_orphaned"] + operations:
                session.run(operation)
        finally:
            if session is not None:
                session.close()
            unlink_shm(name)

    example()
    return harness


def state_patches():
    """One word of the rings or the pool, or the header's free_top/schema_state:
    (kind, where, value)."""
    ring, slot = st.integers(0, 2), st.integers(0, 15)
    # An entry by absolute position, or (negative) k entries back from write_pos:
    # the latest entries, those a subscriber is about to read.
    position = st.one_of(st.integers(0, 40), st.integers(-8, -1))
    return st.one_of(
        st.tuples(st.just("state_flight"), ring, st.one_of(st.integers(0, 15), u32_words())),
        st.tuples(st.just("write_pos"), ring, st.one_of(st.integers(0, 40), u64_words())),
        st.tuples(st.just("sequence"), st.tuples(ring, position), u64_words()),
        st.tuples(st.just("slot_idx"), st.tuples(ring, position), st.one_of(slot, u32_words())),
        st.tuples(st.just("payload_len"), st.tuples(ring, position), u32_words()),
        st.tuples(st.just("refcount"), slot, st.one_of(st.integers(0, 4), u32_words())),
        st.tuples(st.just("next_free"), slot, st.one_of(slot, u32_words())),
        st.tuples(st.just("free_top"), st.just(0), u64_words()),
        st.tuples(st.just("schema_state"), st.just(0), st.one_of(st.integers(0, 3), u32_words())),
    )


def apply_state_patch(memory, kind, where, value):
    if kind in ("sequence", "slot_idx", "payload_len"):
        ring, position = where
        if position < 0:
            position = max(0, memory.write_pos(ring) + position)
        offset, fmt = memory.entry(ring, position) + {"sequence": 0, "slot_idx": 8, "payload_len": 12}[kind], {
            "sequence": "<Q", "slot_idx": "<I", "payload_len": "<I"}[kind]
    else:
        offset, fmt = {
            "state_flight": (memory.ring(where), "<I"),
            "write_pos": (memory.ring(where) + 64, "<Q"),
            "refcount": (memory.slot(where), "<I"),
            "next_free": (memory.slot(where) + 4, "<I"),
            "free_top": (768, "<Q"),
            "schema_state": (192, "<I"),
        }[kind]
    memory.put(offset, fmt, value)


def sidecar_records():
    """Records to write into the ring-owner sidecar: (ring, pid, start_pos,
    whether created_at_ns matches the region, read_pos, lost). A matching
    record on a ring whose lock nobody holds names a dead owner."""
    position = st.one_of(st.integers(0, 40), u64_words())
    return st.lists(
        st.tuples(st.integers(0, 2), st.integers(0, 2**63), position, st.booleans(), position, u64_words()),
        max_size=3,
    )


# The sidecar's record (kickmsg.owners.OwnerRecord): pid, process start,
# start_pos, region created_at_ns, read_pos, lost.
SIDECAR_RECORD = struct.Struct("<QQQQQQ")
assert SIDECAR_RECORD.size == owners.RECORD_SIZE


def write_sidecar(name, created_at_ns, records):
    """Overwrite records in place (the file never shrinks: live subscribers map it)."""
    fd = os.open(owners.sidecar_path(name), os.O_RDWR | os.O_CREAT, 0o666)
    try:
        for ring, pid, start_pos, matches, read_pos, lost in records:
            stamp = created_at_ns if matches else created_at_ns ^ 1
            record = SIDECAR_RECORD.pack(pid, 1, start_pos, stamp, read_pos, lost)
            os.pwrite(fd, record, ring * SIDECAR_RECORD.size)
    finally:
        os.close(fd)


def fuzz_state(base, count):
    harness = Harness()
    counter = itertools.count()

    @fuzz_settings(count)
    @given(
        subscribers=st.integers(0, 2),
        dead=st.integers(0, 2),
        traffic=st.integers(0, 20),
        reads=st.integers(0, 10),
        views=st.integers(0, 2),
        patches=st.lists(state_patches(), max_size=10),
        header=st.lists(header_edits(), max_size=1),  # seen only by a new open (reopen)
        chain=st.one_of(st.none(), free_chains(generations=st.none())),
        sidecar=sidecar_records(),
        operations=st.lists(st.sampled_from(OPERATIONS4), min_size=1, max_size=30),
    )
    @watched
    def example(subscribers, dead, traffic, reads, views, patches, header, chain, sidecar, operations):
        name, region = fresh_region(harness, base, counter)
        session = Session4(harness, region, name)
        try:
            # A region in use: dead subscribers, live ones, messages, views.
            spawn_dead_subscribers(region, dead)
            for _ in range(subscribers):
                session.op_join()
            for _ in range(traffic):
                session.op_send()
            for _ in range(reads):
                session.op_try_receive()
            for _ in range(views):
                session.op_view()
            # The damage.
            memory = Channel(name)
            if chain is not None:
                install_free_chain(memory, *chain)
            for kind, where, value in patches:
                apply_state_patch(memory, kind, where, value)
            for kind, value in header:
                apply_header_edit(memory, kind, value)
            memory.close()
            write_sidecar(name, region.created_at_ns, sidecar)
            for operation in operations:
                session.run(operation)
            harness["examples"] += 1
        finally:
            session.close()
            unlink_shm(name)

    example()
    return harness


# -- layout 9's channel (WIRE9.md A, B) -----------------------------------------------------------

RING_FIELDS = {  # A.3
    "state_flight": (0, "<I"), "owner_pid": (8, "<Q"), "owner_starttime": (16, "<Q"), "write_pos": (64, "<Q"),
    "has_waiter": (72, "<I"), "dropped_count": (80, "<Q"), "lost_count": (88, "<Q"),
}
SLOT_FIELDS = {"refcount": (0, "<I"), "next_free": (4, "<I"), "payload_len": (8, "<I")}  # A.5
HEADER_WORDS = {  # A.2
    "magic": (0, "<Q"), "version": (8, "<I"), "channel_type": (12, "<I"), "total_size": (16, "<Q"),
    "sub_rings_offset": (24, "<Q"), "pool_offset": (32, "<Q"), "max_subs": (40, "<Q"), "sub_ring_capacity": (48, "<Q"),
    "pool_size": (64, "<Q"), "slot_data_size": (72, "<Q"), "commit_timeout_us": (96, "<Q"), "creator_pid": (112, "<Q"),
    "created_at_ns": (120, "<Q"), "creator_name_len": (128, "<H"), "schema_state": (192, "<I"), "free_top": (768, "<Q"),
    "steal_count": (776, "<Q"), "identity_hash": (784, "<Q"),
}
# Header words read only at open: a new open (reopen) and following a region
# that looks re-created (magic or created_at_ns changed) see them.
OPEN_ONLY = sorted(set(HEADER_WORDS) - {"free_top", "steal_count", "schema_state"})


def pack_meta(position, slot_field):
    """A.4: [tag = (pos + 1) mod 2^40 : 40 | slot + 1 : 24]."""
    return ((position + 1) & (2**40 - 1)) << 24 | (slot_field & 0xFFFFFF)


class Session9(ChannelSession):
    """Layout 9's own operations beside the shared ones (hardening_session)."""

    def op_allocate(self):
        slot = self.harness.call("allocate", self.publisher.allocate)
        if slot is not None:
            with memoryview(slot) as buffer:
                buffer[:5] = b"alloc"
            self.pending = slot

    def op_publish(self):
        if self.pending is not None:
            slot, self.pending = self.pending, None
            if not slot.valid:  # superseded by a later allocate or send
                return
            delivered = self.harness.call("publish", slot.publish, 5)
            assert delivered is None or 0 <= delivered <= self.geometry.max_subs

    def op_waitset(self):
        """Wait on every subscriber at once (B.11's announce and park), then
        receive from those found ready."""
        if self.subscribers:
            waitset = WaitSet()
            try:
                for subscriber in self.subscribers:
                    waitset.add(subscriber)
                for subscriber in self.harness.call("waitset", waitset.wait, 0.002) or ():
                    self.harness.call("try_receive", subscriber.try_receive)
            finally:
                waitset.close()

    def op_stats(self):
        stats = self._read_only("stats", self.region.stats)
        if stats is not None:
            assert len(stats.rings) == self.geometry.max_subs
            assert 0 <= stats.pool_free <= self.geometry.pool_size

    def op_info(self):
        info = self._read_only("info", self.region.info)
        if info is not None:
            assert info.pool_size == self.geometry.pool_size

    def op_tools(self):
        """What ``kickmsg info``, ``stats`` and ``diagnose`` show (kickmsg.ops.diagnostics)."""
        for label, function in (("tools_info", diagnostics.info), ("tools_stats", diagnostics.stats),
                                ("tools_health", diagnostics.health)):
            self._read_only(label, function, self.name)
        self.harness.call("tools_list", diagnostics.list_regions, self.name[1:])

    # repairs
    def _entries_beyond_the_sequence_range(self):
        """Window entries (read at the offsets this region was opened with)
        whose position + 1 no 62-bit sequence value can hold: even a skip
        marker written there reads as stuck."""
        data, g = read_bytes(self.name), self.geometry
        count = 0
        for index in range(g.max_subs):
            write_pos = struct.unpack_from("<Q", data, g.sub_rings_offset + index * g.ring_stride + 64)[0]
            count += sum(1 for position in range(max(0, write_pos - g.capacity), write_pos) if position + 1 > VALUE_MASK)
        return count

    def op_repair(self):
        repaired = self.harness.call("repair", self.region.repair_locked_entries)
        if repaired is not None:
            assert 0 <= repaired <= self.geometry.max_subs * self.geometry.capacity
            # Nothing stuck is left (no publisher runs meanwhile), except at the sequence limit.
            assert self.noisy or self.region.diagnose().locked_entries <= self._entries_beyond_the_sequence_range()

    def op_reclaim_dead_rings(self):
        reclaimed = self.harness.call("reclaim_dead_rings", self.region.reclaim_dead_rings)
        if reclaimed is not None:
            assert 0 <= reclaimed <= self.geometry.max_subs
            assert self.noisy or self.region.diagnose().dead_subscriber_rings == 0
            self.harness["reclaimed dead rings"] += reclaimed

    def op_reclaim_dead_subscribers(self):
        self.harness.call("reclaim_dead_subscribers", self.region.reclaim_dead_subscribers)

    # opening again, following a region that looks re-created, schema
    def op_check_in(self):
        """The next call of the publisher and of each subscriber looks
        whether the region was re-created (as it does every 0.1 s)."""
        self.publisher._next_check_in_ns = 0
        for subscriber in self.subscribers:
            subscriber._next_check_in_ns = 0

    def op_follow(self):
        region = self.harness.call("follow", self.region.reopen_if_recreated)
        if region is not None:
            assert region.layout == 9

    def op_reopen(self):
        region = self.harness.call("reopen", SharedRegion.open, self.name)
        if region is not None:
            assert region.layout == 9
            self.harness.call("diagnose", region.diagnose)
            self.harness.call("stats", region.stats)


OPERATIONS9 = Session9.operations()


def sequence_words(position):
    """Sequence words around ``position`` (A.4): commits, skips, publisher
    and repairer locks of this position, of the previous and next lap, and
    anything."""
    def of(kind, delta):
        pos = max(0, position + delta)
        return {"commit": pos + 1, "skip": REPAIR_BIT | (pos + 1), "lock": LOCK_BIT | pos,
                "repairer": LOCK_BIT | REPAIR_BIT | pos}[kind]
    return st.one_of(
        st.builds(of, st.sampled_from(["commit", "skip", "lock", "repairer"]), st.sampled_from([0, -8, 8, -1, 1])),
        u64_words(),
    )


def channel_patches():
    """One word of the rings, the pool or the header: (kind, where, value)."""
    ring, slot = st.integers(0, 2), st.integers(0, 15)
    # An entry by absolute position, or (negative) k entries back from write_pos:
    # the latest entries, those a subscriber is about to read.
    position = st.one_of(st.integers(0, 40), st.integers(-8, -1))
    slot_field = st.one_of(st.integers(0, 17), st.sampled_from([0xFFFFFF, 5000]))
    meta = st.one_of(
        st.tuples(st.just("tagged"), st.sampled_from([0, -8, 8, -1, 1, 2**39]), slot_field),
        st.tuples(st.just("raw"), st.just(0), u64_words()),
    )
    return st.one_of(
        st.tuples(st.just("state_flight"), ring, st.one_of(st.integers(0, 15), u32_words())),
        st.tuples(st.just("write_pos"), ring, st.one_of(st.integers(0, 40), u64_words(),
                                                        st.sampled_from([VALUE_MASK - 1, VALUE_MASK, 2**63 - 1]))),
        st.tuples(st.sampled_from(["owner_pid", "owner_starttime"]), ring, pids()),
        st.tuples(st.sampled_from(["has_waiter", "dropped_count", "lost_count"]), ring, u64_words()),
        st.tuples(st.just("sequence"), st.tuples(ring, position), st.integers(0, 2**30)),  # value drawn below
        st.tuples(st.just("meta"), st.tuples(ring, position), meta),
        st.tuples(st.sampled_from(["refcount", "next_free", "payload_len"]), slot,
                  st.one_of(st.integers(0, 4), st.integers(55, 58), u32_words())),
        st.tuples(st.sampled_from(["free_top", "steal_count"]), st.just(0), u64_words()),
        st.tuples(st.just("schema_state"), st.just(0), st.one_of(st.integers(0, 3), u32_words())),
        st.tuples(st.just("schema_data"), st.just(0), st.binary(min_size=512, max_size=512)),  # A.6, stored as Set
    )


def header_patches():
    """One header word read at open (A.2), seen by a new open and by a
    publisher or subscriber following a region that looks re-created."""
    any_word = st.tuples(st.sampled_from(sorted(set(OPEN_ONLY) - {"commit_timeout_us"})), st.just(0),
                         st.one_of(st.integers(0, 2000), u64_words()))
    # commit_timeout_us stays small or beyond the 1-day limit: a header may
    # legitimately ask for long waits
    timeout = st.tuples(st.just("commit_timeout_us"), st.just(0),
                        st.one_of(st.integers(0, 2000), st.integers(86_400_000_001, U64)))
    return st.one_of(any_word, timeout)


def apply_channel_patch(memory, kind, where, value, data, dead):
    if kind in ("sequence", "meta"):
        ring, position = where
        if position < 0:
            position = max(0, memory.write_pos(ring) + position)
        entry = memory.entry(ring, position)
        if kind == "sequence":
            memory.put(entry, "<Q", data.draw(sequence_words(position), label="sequence word"))
        else:
            form, delta, field = value
            memory.put(entry + 8, "<Q", pack_meta(max(0, position + delta), field) if form == "tagged" else field)
    elif kind in RING_FIELDS:
        offset, fmt = RING_FIELDS[kind]
        if kind in ("owner_pid", "owner_starttime") and value in ("self", "dead"):
            value = resolve_pid(value, dead) if kind == "owner_pid" else start_time(os.getpid())
        memory.put(memory.ring(where) + offset, fmt, value)
    elif kind == "schema_data":
        memory.put_bytes(256, value)
        memory.put(192, "<I", 2)  # schema_state Set
    elif kind in SLOT_FIELDS:
        offset, fmt = SLOT_FIELDS[kind]
        memory.put(memory.slot(where) + offset, fmt, value)
    else:
        offset, fmt = HEADER_WORDS[kind]
        memory.put(offset, fmt, value)


def fuzz_channel(base, count):
    harness = Harness()
    counter = itertools.count()
    dead = dead_pid()

    @fuzz_settings(count)
    @given(
        subscribers=st.integers(0, 2),
        dead_subscribers=st.integers(0, 1),
        traffic=st.integers(0, 20),
        reads=st.integers(0, 10),
        views=st.integers(0, 2),
        allocated=st.booleans(),
        patches=st.lists(channel_patches(), max_size=10),
        header=st.lists(header_patches(), max_size=2),
        chain=st.one_of(st.none(), free_chains()),
        operations=st.lists(st.sampled_from(OPERATIONS9), min_size=1, max_size=30),
        data=st.data(),
    )
    @watched
    def example(subscribers, dead_subscribers, traffic, reads, views, allocated, patches, header, chain, operations, data):
        name = f"{base}_{next(counter)}"
        harness.region_name = name
        region = SharedRegion.create(name, ChannelType.PubSub, Config(**SMALL), layout=9)
        session = Session9(harness, region, name)
        try:
            # A region in use: dead subscribers, live ones, messages, views, a pending slot.
            spawn_dead_subscribers(region, dead_subscribers)
            for _ in range(subscribers):
                session.op_join()
            for _ in range(traffic):
                session.op_send()
            for _ in range(reads):
                session.op_try_receive()
            for _ in range(views):
                session.op_view()
            if allocated:
                session.op_allocate()
            # The damage.
            memory = Channel(name)
            if chain is not None:
                install_free_chain(memory, *chain)
            for kind, where, value in patches + header:
                apply_channel_patch(memory, kind, where, value, data, dead)
            memory.close()
            for operation in ["send", "try_receive", "stats", "info", "diagnose"] + operations:
                session.run(operation)
            harness["examples"] += 1
        finally:
            session.close()
            unlink_shm(name)

    example()
    return harness


def noise_words(rng, memory, position):
    """A word a hostile peer might store at ``position`` of the rings or the pool."""
    choice = rng.randrange(6)
    if choice == 0:
        return rng.randrange(2**64)
    if choice == 1:
        return rng.choice([0, 1, INVALID_SLOT, U64, LOCK_BIT, REPAIR_BIT, 2**32])
    if choice == 2:  # a sequence word of a nearby position
        pos = max(0, memory.write_pos(rng.randrange(memory.max_subs)) - rng.randrange(10))
        return rng.choice([pos + 1, LOCK_BIT | pos, REPAIR_BIT | (pos + 1), LOCK_BIT | REPAIR_BIT | pos])
    if choice == 3:  # a claim naming any slot
        return pack_meta(rng.randrange(40), rng.randrange(memory.pool_size + 3))
    return rng.randrange(64)


def start_noise(name, seed, seconds):
    """A forked peer that keeps storing hostile words at random places of the
    rings and the pool (u32 or u64, aligned) for ``seconds``; its pid."""
    pid = os.fork()
    if pid:
        return pid
    try:
        import random
        rng = random.Random(seed)
        memory = Channel(name)
        end = time.monotonic() + seconds
        span = len(memory.memory) - memory.rings_offset
        while time.monotonic() < end:
            offset = memory.rings_offset + rng.randrange(span) // 8 * 8
            value = noise_words(rng, memory, offset)
            if rng.random() < 0.5:
                memory.put(offset + rng.choice([0, 4]), "<I", value)
            else:
                memory.put(offset, "<Q", value)
            if rng.random() < 0.01:
                time.sleep(0.0005)
    finally:
        os._exit(0)


def fuzz_noise(base, count):
    """Channel calls while another process keeps corrupting the rings and
    the pool: values change between a call's reads (what a check-then-use
    would get wrong)."""
    harness = Harness()
    counter = itertools.count()

    @fuzz_settings(count)
    @given(
        seed=st.integers(0, 2**32),
        subscribers=st.integers(1, 2),
        traffic=st.integers(0, 20),
        operations=st.lists(st.sampled_from(OPERATIONS9), min_size=5, max_size=40),
    )
    @watched
    def example(seed, subscribers, traffic, operations):
        name = f"{base}_{next(counter)}"
        harness.region_name = name
        region = SharedRegion.create(name, ChannelType.PubSub, Config(**SMALL), layout=9)
        session = Session9(harness, region, name, noisy=True)
        noise = None
        try:
            for _ in range(subscribers):
                session.op_join()
            for _ in range(traffic):
                session.op_send()
            noise = start_noise(name, seed, 0.3)
            for operation in ["send", "try_receive", "view", "stats", "diagnose"] + operations:
                session.run(operation)
            harness["examples"] += 1
        finally:
            if noise is not None:
                os.kill(noise, signal.SIGKILL)
                os.waitpid(noise, 0)
            session.close()
            unlink_shm(name)

    example()
    return harness


# -- the registry (WIRE9.md C) -------------------------------------------------------------------------

REGISTRY_ROW = {  # C.2
    "state": (0, "<I"), "channel_type": (4, "<I"), "role": (8, "<I"), "kind": (12, "<I"), "generation": (16, "<I"),
    "pid": (24, "<Q"), "pid_starttime": (32, "<Q"), "created_at_ns": (40, "<Q"),
}
REGISTRY_NAMES = {"shm_name": (48, 128), "topic_name": (176, 128), "node_name": (304, 64)}


def name_bytes(size):
    """Name fields: NUL-terminated text, no NUL at all, not UTF-8."""
    return st.one_of(
        st.binary(min_size=size, max_size=size),
        st.builds(lambda text: text.encode()[: size - 1].ljust(size, b"\0"), st.text(max_size=40)),
        st.just(b"\xff" * size),
        st.just(b"/x" * (size // 2)),
    )


def registry_patches():
    row = st.integers(0, 3)
    return st.one_of(
        st.tuples(st.just("header"), st.sampled_from([(8, "<I"), (12, "<I")]), u32_words()),
        # magic 0 reads as "not initialised yet": opens poll 2 s for it (C.1), so only other values
        st.tuples(st.just("header"), st.just((0, "<Q")), st.integers(1, U64)),
        st.tuples(st.sampled_from(["state", "channel_type", "role", "kind"]), row, st.one_of(st.integers(0, 4), u32_words())),
        st.tuples(st.just("generation"), row, st.one_of(st.integers(0, 4), st.sampled_from([U32 - 1, U32]), u32_words())),
        st.tuples(st.just("pid"), row, pids()),
        st.tuples(st.sampled_from(["pid_starttime", "created_at_ns"]), row, u64_words()),
        st.tuples(st.sampled_from(sorted(REGISTRY_NAMES)), row, st.integers(0, 2)),  # which name_bytes form, drawn below
    )


def apply_registry_patch(memory, kind, where, value, data, dead):
    if kind == "header":
        memory.put(where[0], where[1], value)
        return
    row = 64 + 512 * where  # C.1: 64-byte header, 512-byte rows
    if kind in REGISTRY_NAMES:
        offset, size = REGISTRY_NAMES[kind]
        memory.put_bytes(row + offset, data.draw(name_bytes(size), label=kind))
    else:
        offset, fmt = REGISTRY_ROW[kind]
        if kind == "pid" and value in ("self", "dead"):
            value = resolve_pid(value, dead)
        memory.put(row + offset, fmt, value)


REGISTRY_OPERATIONS = ["open", "snapshot", "list_topics", "sweep_stale", "register", "deregister", "tools"]


def fuzz_registry(base, count):
    harness = Harness()
    counter = itertools.count()
    dead = dead_pid()

    @fuzz_settings(count)
    @given(
        rows=st.integers(0, 4),
        dead_rows=st.integers(0, 1),
        patches=st.lists(registry_patches(), max_size=8),
        operations=st.lists(st.sampled_from(REGISTRY_OPERATIONS), min_size=1, max_size=15),
        data=st.data(),
    )
    @watched
    def example(rows, dead_rows, patches, operations, data):
        namespace = f"{base.lstrip('/')}_{next(counter)}"
        name = f"/{namespace}_registry"
        harness.region_name = name
        registry = Registry.open_or_create(namespace, 4)
        held = []
        try:
            for index in range(rows):
                held.append(registry.register(1, Role.Publisher, Kind.Pubsub, f"/{namespace}_t{index}", f"/t{index}", "node"))
            for _ in range(dead_rows):
                pid = os.fork()
                if pid == 0:
                    try:
                        Registry.open_or_create(namespace, 4).register(1, Role.Subscriber, Kind.Pubsub, "/x", "/x", "dying")
                    finally:
                        os._exit(0)
                os.waitpid(pid, 0)
            memory = Raw(name)
            for kind, where, value in patches:
                apply_registry_patch(memory, kind, where, value, data, dead)
            memory.close()
            current = registry
            for operation in operations:
                if operation == "open":
                    opened = harness.call("open", Registry.try_open, namespace)
                    current = opened or current
                elif operation == "snapshot":
                    snapshot = harness.call("snapshot", current.snapshot)
                    for participant in snapshot or ():
                        assert isinstance(participant.shm_name, str) and isinstance(participant.node_name, str)
                elif operation == "list_topics":
                    harness.call("list_topics", current.list_topics)
                elif operation == "tools":  # kickmsg list, registry (kickmsg.ops.diagnostics)
                    harness.call("tools_registry", diagnostics.registry, name)
                    harness.call("tools_list", diagnostics.list_regions, namespace)
                elif operation == "sweep_stale":
                    swept = harness.call("sweep_stale", current.sweep_stale)
                    assert swept is None or 0 <= swept <= current.capacity
                elif operation == "register":
                    row = harness.call("register", current.register, 1, Role.Subscriber, Kind.Pubsub, name + "_r", "/r", "n")
                    if row is not None:
                        held.append(row)
                elif operation == "deregister" and held:
                    row = held.pop()
                    if row is not None and row < current.capacity:
                        harness.call("deregister", current.deregister, row)
            harness["examples"] += 1
        finally:
            unlink_shm(name)

    example()
    return harness


# -- the blackboard (WIRE9.md D) -------------------------------------------------------------------------

BOARD = dict(capacity=4, max_value_size=40)
BOARD_HEADER = {  # D.2 (magic: any but 0, which opens poll 2 s for, D.6)
    "magic": (0, "<Q"), "version": (8, "<I"), "capacity": (12, "<I"), "max_value_size": (16, "<Q"), "total_size": (24, "<Q"),
    "config_hash": (32, "<Q"), "identity_hash": (40, "<Q"), "change_seq": (64, "<Q"), "waiters": (72, "<Q"),
}
BOARD_ENTRY = {  # D.3
    "state": (0, "<I"), "publish": (8, "<Q"), "tenancy": (16, "<Q"), "owner_pid": (24, "<Q"),
    "owner_starttime": (32, "<Q"), "key_hash": (40, "<Q"),
}
BOARD_KEYS = ["a", "b/c", "k3", "k4", "k5"]


def fnv1a(data):
    value = 0xCBF29CE484222325
    for byte in data:
        value = ((value ^ byte) * 0x100000001B3) & U64
    return value


def board_lock_token(pid, start):
    """D.5: (FNV-1a of the start time as 8 LE bytes) >> 32, 0 → 1, above pid's low 32 bits."""
    return ((fnv1a(start.to_bytes(8, "little")) >> 32) or 1) << 32 | (pid & U32)


def board_patches():
    entry = st.integers(0, 3)
    return st.one_of(
        st.tuples(st.just("header"), st.sampled_from(sorted(BOARD_HEADER)), st.one_of(st.integers(0, 5), u64_words())),
        # A token of a live holder (pid 2, kthreadd, has start time 0: alive) keeps
        # the lock busy, each release then waits its 2 s: rarely, not by design here.
        st.tuples(st.just("lock_token"), st.just(0), st.one_of(st.sampled_from([0, "dead"]), st.integers(2**32, U64))),
        st.tuples(st.just("state"), entry, st.one_of(st.integers(0, 3), u32_words())),
        st.tuples(st.sampled_from(["publish", "tenancy"]), entry,
                  st.one_of(st.integers(0, 6), st.sampled_from([U64, U64 - 1, 2**63, 2**63 - 1]), u64_words())),
        # write counts near the u64 limit on the first key's entry (the first re-declared)
        st.tuples(st.just("publish"), st.just(0), st.sampled_from([U64, U64 - 1, U64 - 2, 2**63])),
        st.tuples(st.just("owner_pid"), entry, pids()),
        st.tuples(st.sampled_from(["owner_starttime", "key_hash"]), entry, u64_words()),
        st.tuples(st.just("key"), entry, st.sampled_from(BOARD_KEYS + [None])),  # None: hostile bytes, drawn below
        st.tuples(st.just("owner_node"), entry, st.just(None)),
        st.tuples(st.just("value_len"), st.tuples(entry, st.integers(0, 1)), st.one_of(st.integers(0, 48), u32_words())),
        st.tuples(st.just("updated_at"), st.tuples(entry, st.integers(0, 1)), u64_words()),
    )


def apply_board_patch(memory, kind, where, value, data, dead):
    values_offset, stride = 192 + 384 * BOARD["capacity"], (16 + BOARD["max_value_size"] + 63) // 64 * 64  # D.4
    if kind == "header":
        memory.put(*BOARD_HEADER[where], value or 1 if where == "magic" else value)
    elif kind == "lock_token":
        memory.put(128, "<Q", board_lock_token(dead, 12345) if value == "dead" else value)
    elif kind in ("value_len", "updated_at"):
        index, parity = where
        memory.put(values_offset + (2 * index + parity) * stride + (8 if kind == "value_len" else 0),
                   "<I" if kind == "value_len" else "<Q", value)
    else:
        entry = 192 + 384 * where
        if kind == "key":
            if value is None:
                memory.put_bytes(entry + 64, data.draw(name_bytes(128), label="key"))
            else:
                memory.put_bytes(entry + 64, value.encode().ljust(128, b"\0"))
                memory.put(entry + 40, "<Q", fnv1a(value.encode()) or 1)
        elif kind == "owner_node":
            memory.put_bytes(entry + 192, data.draw(name_bytes(64), label="owner_node"))
        else:
            if kind == "owner_pid" and value in ("self", "dead"):
                value = resolve_pid(value, dead)
            memory.put(entry + BOARD_ENTRY[kind][0], BOARD_ENTRY[kind][1], value)


BOARD_OPERATIONS = ["open", "try_open", "declare", "write", "release", "redeclare", "read", "owner_alive", "snapshot", "keys",
                    "read_all", "sweep_stale", "wait", "tools"]


def fuzz_blackboard(base, count):
    harness = Harness()
    counter = itertools.count()
    dead = dead_pid()

    @fuzz_settings(count)
    @given(
        declared=st.integers(0, 3),
        writes=st.integers(0, 5),
        dead_keys=st.integers(0, 1),
        patches=st.lists(board_patches(), max_size=8),
        operations=st.lists(st.sampled_from(BOARD_OPERATIONS), min_size=1, max_size=15),
        data=st.data(),
    )
    @watched
    def example(declared, writes, dead_keys, patches, operations, data):
        namespace = f"{base.lstrip('/')}_{next(counter)}"
        name = Blackboard.shm_name(namespace, "board")
        harness.region_name = name
        board = Blackboard.open_or_create(namespace, "board", BlackboardConfig(**BOARD), "me")
        writers = []
        try:
            for index in range(declared):
                writers.append(board.declare(BOARD_KEYS[index]))
            for number in range(writes):
                if writers:
                    writers[number % len(writers)].write(b"v" * (number * 7 % 41))
            for _ in range(dead_keys):
                pid = os.fork()
                if pid == 0:
                    try:
                        Blackboard.open_or_create(namespace, "board", BlackboardConfig(**BOARD)).declare("dying").write(b"x")
                    finally:
                        os._exit(0)  # the key stays owned by a dead pid
                os.waitpid(pid, 0)
            memory = Raw(name)
            for kind, where, value in patches:
                apply_board_patch(memory, kind, where, value, data, dead)
            memory.close()
            current = board
            keys = itertools.cycle(BOARD_KEYS + ["dying"])

            def write(writer):
                try:
                    writer.write(b"w" * (len(writers) * 11 % 41))
                    harness["write:ok"] += 1
                except OSError as error:  # D.9: an errno, the documented outcomes of a write
                    assert error.errno in (errno.EBADF, errno.EPERM, errno.EMSGSIZE, errno.ENOTRECOVERABLE), error
                    harness["write:OSError"] += 1

            for operation in ["read", "redeclare", "snapshot"] + operations:
                key = next(keys)
                if operation == "open":
                    current = harness.call("open", Blackboard.open_or_create, namespace, "board",
                                           BlackboardConfig(**BOARD), "me") or current
                elif operation == "try_open":
                    current = harness.call("try_open", Blackboard.try_open, namespace, "board") or current
                elif operation == "declare":
                    writer = harness.call("declare", current.declare, key)
                    if writer is not None:
                        writers.append(writer)
                elif operation == "write" and writers:
                    write(writers[len(operations) % len(writers)])
                elif operation == "release" and writers:
                    harness.call("release", writers.pop(0).release)
                elif operation == "redeclare" and writers:  # a takeover of the kept entry: its count continues
                    harness["redeclare"] += 1
                    writer = writers.pop(0)
                    harness.call("release", writer.release)
                    writer = harness.call("declare", current.declare, writer.key)
                    if writer is not None:
                        writers.append(writer)
                        write(writer)
                elif operation == "read":
                    outcome = harness.call("read", lambda: current.observe(key).read())
                    if outcome is not None:
                        assert outcome.errno in (0, errno.ENOENT, errno.ENOMSG, errno.EAGAIN), outcome
                        assert len(outcome.data) <= current.max_value_size
                elif operation == "owner_alive":
                    harness.call("owner_alive", lambda: current.observe(key).owner_alive())
                elif operation == "snapshot":
                    for status in harness.call("snapshot", current.snapshot) or ():
                        assert 0 <= status.value_len <= current.max_value_size
                elif operation == "keys":
                    harness.call("keys", current.keys)
                elif operation == "tools":  # kickmsg list, blackboard (kickmsg.ops.diagnostics)
                    harness.call("tools_blackboard", diagnostics.blackboard, name)
                    harness.call("tools_list", diagnostics.list_regions, namespace)
                elif operation == "read_all":
                    for value in (harness.call("read_all", current.read_all) or {}).values():
                        assert len(value) <= current.max_value_size
                elif operation == "sweep_stale":
                    swept = harness.call("sweep_stale", current.sweep_stale)
                    assert swept is None or 0 <= swept <= current.capacity
                elif operation == "wait":
                    harness.call("wait", current.wait, current.change_seq, 0.001)
            harness["examples"] += 1
        finally:
            for writer in writers:
                writer.valid = False  # no release at exit into a board that is gone
            unlink_shm(name)

    example()
    return harness


if __name__ == "__main__":
    # The per-example watchdog: SIGALRM dumps the stacks, then its default
    # action ends the process (no watchdog thread, so forking stays safe).
    faulthandler.register(signal.SIGALRM, chain=True)
    mode, base_name, count = sys.argv[1], sys.argv[2], int(sys.argv[3])
    started = time.monotonic()
    fuzz = {"header": fuzz_header, "state": fuzz_state,  # layout 4
            "channel": fuzz_channel, "noise": fuzz_noise, "registry": fuzz_registry, "blackboard": fuzz_blackboard}
    summary = fuzz[mode](base_name, count)
    summary["seconds"] = round(time.monotonic() - started, 1)
    print(json.dumps(summary))
