"""Hardening: on a corrupt region every call works, raises a clear exception
(the RuntimeError family or BlockingIOError; ValueError only for a bad
argument) or counts a loss. The interpreter never crashes and no call loops
forever.

The property tests corrupt header fields, offsets, ring entries, free_top,
free-stack chains (cycles included), refcounts, state_flight words and the
ring-owner sidecar, then run open, publish, receive, diagnose, audit and
every repair call in a random order. They run in a subprocess (this file run
as a script), so a segfault or a hang fails the test instead of killing
pytest; a worker that hangs in one example dumps its stacks (faulthandler)
and dies.
"""
import faulthandler
import itertools
import json
import mmap
import os
import signal
import struct
import subprocess
import sys
from collections import Counter

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import rawregion
from conftest import on_layout4
from hardening_session import ChannelSession, Harness
from kickmsg import ChannelType, Config, Publisher, SharedRegion, Subscriber, unlink_shm
from kickmsg import owners
from kickmsg.region import DeadSubscriberReport, HealthReport

# These tests check layout 4's own: its byte offsets and its ring-owner sidecar.
pytestmark = on_layout4

INVALID_SLOT = 0xFFFFFFFF
LOCKED = 0xFFFFFFFFFFFFFFFF
U64 = 2**64 - 1
# commit_timeout 1 ms bounds every wait on a stuck entry or in-flight publisher.
SMALL = dict(max_subscribers=3, sub_ring_capacity=8, pool_size=16, max_payload_size=56, commit_timeout=0.001)
EXAMPLES = {"header": 1000, "state": 700}
WORKER_TIMEOUT_S = 100  # the whole worker; each example also has its own watchdog
EXAMPLE_WATCHDOG_S = 20


# -- the pytest side ---------------------------------------------------------------------------


def run_worker(mode, name, workdir):
    """Run this file's fuzz loop in a fresh interpreter; return its summary."""
    result = subprocess.run(
        [sys.executable, __file__, mode, name, str(EXAMPLES[mode])],
        capture_output=True,
        text=True,
        timeout=WORKER_TIMEOUT_S,
        cwd=workdir,  # hypothesis writes its cache into the working directory
        env=dict(os.environ, OPENBLAS_NUM_THREADS="1"),  # no BLAS threads: the worker forks
    )
    assert result.returncode == 0, (
        f"fuzz worker exited with {result.returncode} (negative: killed by signal)\n"
        f"stdout:\n{result.stdout[-8000:]}\nstderr:\n{result.stderr[-8000:]}"
    )
    return Counter(json.loads(result.stdout.strip().splitlines()[-1]))


@pytest.mark.timeout(WORKER_TIMEOUT_S + 20)
def test_corrupt_header(shm_name, tmp_path):
    """Header fields (geometry, free_top, schema, creator) changed before or
    after open: open refuses with RuntimeError, or every call behaves."""
    summary = run_worker("header", shm_name, tmp_path)
    assert summary["examples"] == EXAMPLES["header"]
    assert summary["open:ok"] > 0 and summary["open:RuntimeError"] > 0
    for call in CALLS:
        assert summary[f"{call}:ok"] > 0, call


@pytest.mark.timeout(WORKER_TIMEOUT_S + 20)
def test_corrupt_rings_pool_and_free_stack(shm_name, tmp_path):
    """Rings, entries, refcounts, free_top, free-stack chains and sidecar
    records corrupted under live subscribers, views and dead subscribers:
    every call in any order behaves."""
    summary = run_worker("state", shm_name, tmp_path)
    assert summary["examples"] == EXAMPLES["state"]
    for call in CALLS:
        assert summary[f"{call}:ok"] > 0, call
    assert summary["lost"] > 0 and summary["received"] > 0
    assert summary["reclaimed dead rings"] > 0
    errors = {key: count for key, count in summary.items() if key.endswith("Error")}
    assert errors, "no corruption was ever detected"


# -- directed cases: bad arguments are ValueError, also on a corrupt region ------------------------


@pytest.fixture
def corrupt(shm_name):
    """A region whose free stack is a cycle and whose ring 0 is poked full of
    LOCKED entries, with a subscriber on it."""
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


@pytest.mark.timeout(60)
def test_a_truncated_sidecar_does_not_crash_a_subscriber(shm_name):
    result = subprocess.run([sys.executable, "-c", SIDECAR_TRUNCATED, shm_name], capture_output=True, timeout=30)
    assert result.returncode == 0, f"exit {result.returncode} (negative: killed by signal): {result.stderr[-2000:]!r}"


# -- the worker side: everything below runs in the subprocess ---------------------------------------



class Memory:
    """Pokes into one region's shm object, offsets from WIRE.md."""

    def __init__(self, name):
        self.name = name
        self.h = rawregion.header(rawregion.read_bytes(name))
        self._file = open(f"/dev/shm{name}", "r+b")
        self.memory = mmap.mmap(self._file.fileno(), 0)

    def close(self):
        self.memory.close()
        self._file.close()

    def put(self, offset, fmt, value):
        """Store ``value`` cut to the width of ``fmt``, if it lies inside the object."""
        size = struct.calcsize(fmt)
        if 0 <= offset <= len(self.memory) - size:
            struct.pack_into(fmt, self.memory, offset, value & (2 ** (8 * size) - 1))

    def ring(self, index):
        return self.h["sub_rings_offset"] + (index % self.h["max_subs"]) * self.h["sub_ring_stride"]

    def entry(self, ring, position):
        return self.ring(ring) + 128 + 16 * (position % self.h["sub_ring_capacity"])

    def slot(self, index):
        return self.h["pool_offset"] + (index % self.h["pool_size"]) * self.h["slot_stride"]


def u64_words():
    return st.one_of(st.integers(0, 40), st.sampled_from([INVALID_SLOT, LOCKED, 2**63, 2**32]), st.integers(0, U64))


def u32_words():
    return st.one_of(st.integers(0, 40), st.sampled_from([INVALID_SLOT, 2**31, 0xFFFFFFFD]), st.integers(0, 2**32 - 1))


class Session(ChannelSession):
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


OPERATIONS = Session.operations()
# Every call the fuzz must have seen succeed at least once.
CALLS = (
    "send send_too_large allocate publish join leave try_receive receive latest receive_latest iterate view "
    "release_view diagnose audit repair reset reset_drain reclaim_orphaned reclaim_dead reopen schema claim_schema "
    "reset_schema_claim"
).split()


def fresh_region(harness, base, counter):
    """A new small region under a fresh name (so that nothing left over from
    an earlier example can touch it); errors from now on must name it."""
    name = f"{base}_{next(counter)}"
    harness.region_name = name
    return name, SharedRegion.create(name, ChannelType.PubSub, Config(**SMALL))


def spawn_dead_subscribers(region, count):
    """Subscribers in forked children that die without leaving: their rings
    stay Live, their sidecar records name a dead owner."""
    for _ in range(count):
        pid = os.fork()
        if pid == 0:
            try:
                subscriber = Subscriber(region)  # noqa: F841 (kept until the exit)
                Publisher(region).send(b"from a subscriber about to die")
            finally:
                os._exit(0)  # no teardown: finalizers do not run
        os.waitpid(pid, 0)


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
        memory.put(offset, fmt, struct.unpack_from(fmt, memory.memory, offset)[0] + delta)
    elif kind == "schema_data":
        memory.memory[256:768] = value
        memory.put(192, "<I", 2)  # Set
    else:
        offset, fmt = rawregion.HEADER_OFFSETS[kind]
        memory.put(offset, fmt, value)


def fuzz_header(base, examples):
    harness = Harness()
    counter = itertools.count()

    @settings(max_examples=examples, deadline=None, database=None, print_blob=True,
              suppress_health_check=list(HealthCheck))
    @given(
        edits=st.lists(header_edits(), min_size=1, max_size=3),
        opened_before=st.booleans(),
        traffic=st.integers(0, 12),
        operations=st.lists(st.sampled_from(OPERATIONS), max_size=25),
    )
    def example(edits, opened_before, traffic, operations):
        signal.alarm(EXAMPLE_WATCHDOG_S)  # a hang: dump every stack and die (see main)
        harness["examples"] += 1
        name, region = fresh_region(harness, base, counter)
        session = None
        try:
            if opened_before:
                session = Session(harness, region, name)
                session.op_join()
                for _ in range(traffic):
                    session.op_send()
            memory = Memory(name)
            for kind, value in edits:
                apply_header_edit(memory, kind, value)
            memory.close()
            if not opened_before:
                region = harness.call("open", SharedRegion.open, name)
                if region is None:
                    return
                session = Session(harness, region, name)
            for operation in ["join", "send", "try_receive", "diagnose", "audit", "repair", "reset",
                              "reclaim_orphaned"] + operations:
                session.run(operation)
        finally:
            if session is not None:
                session.close()
            unlink_shm(name)
            signal.alarm(0)

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
            write_pos = struct.unpack_from("<Q", memory.memory, memory.ring(ring) + 64)[0]
            position = max(0, write_pos + position)
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


def free_chains():
    """A free stack to install: slots linked in list order (out-of-range
    indexes allowed), ending in INVALID_SLOT or looping back (a cycle)."""
    return st.tuples(
        st.lists(st.one_of(st.integers(0, 15), st.sampled_from([16, 5000, INVALID_SLOT - 1])), min_size=1, max_size=20),
        st.one_of(st.none(), st.integers(0, 19)),  # None: ends; k: last links back to element k
    )


def install_free_chain(memory, chain, loop_to):
    slots, pool = chain, memory.h["pool_size"]
    ends = slots[loop_to % len(slots)] if loop_to is not None else INVALID_SLOT
    for upper, lower in zip(slots, slots[1:] + [ends]):
        if upper < pool:
            memory.put(memory.slot(upper) + 4, "<I", lower)
    memory.put(768, "<Q", (memory.h["free_top"] >> 32) << 32 | slots[0])


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


def fuzz_state(base, examples):
    harness = Harness()
    counter = itertools.count()

    @settings(max_examples=examples, deadline=None, database=None, print_blob=True,
              suppress_health_check=list(HealthCheck))
    @given(
        subscribers=st.integers(0, 2),
        dead=st.integers(0, 2),
        traffic=st.integers(0, 20),
        reads=st.integers(0, 10),
        views=st.integers(0, 2),
        patches=st.lists(state_patches(), max_size=10),
        header=st.lists(header_edits(), max_size=1),  # seen only by a new open (reopen)
        chain=st.one_of(st.none(), free_chains()),
        sidecar=sidecar_records(),
        operations=st.lists(st.sampled_from(OPERATIONS), min_size=1, max_size=30),
    )
    def example(subscribers, dead, traffic, reads, views, patches, header, chain, sidecar, operations):
        signal.alarm(EXAMPLE_WATCHDOG_S)  # a hang: dump every stack and die (see main)
        name, region = fresh_region(harness, base, counter)
        session = Session(harness, region, name)
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
            memory = Memory(name)
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
            signal.alarm(0)

    example()
    return harness


if __name__ == "__main__":
    # The per-example watchdog: SIGALRM dumps the stacks, then its default
    # action ends the process (no watchdog thread, so forking stays safe).
    faulthandler.register(signal.SIGALRM, chain=True)
    mode, base_name, count = sys.argv[1], sys.argv[2], int(sys.argv[3])
    summary = {"header": fuzz_header, "state": fuzz_state}[mode](base_name, count)
    print(json.dumps(summary))
