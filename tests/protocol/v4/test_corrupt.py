"""A corrupt or hostile region never crashes the interpreter: it gives a clear
exception or a counted loss.

Regions are damaged by writing into /dev/shm/<name> through a separate mmap.
The fuzz loops run in a subprocess (this file run as a script), so a segfault
or a hang shows up as a failed test instead of killing pytest.
"""
import json
import mmap
import os
import random
import struct
import subprocess
import sys
from collections import Counter

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import rawregion
from conftest import TESTS, on_layout4
from kickmsg import ChannelType, Config, Publisher, SharedRegion, Subscriber, unlink_shm
from kickmsg.protocol.v4.layout import CorruptRegionError

INVALID_SLOT = 0xFFFFFFFF
LOCKED = 0xFFFFFFFFFFFFFFFF
# commit_timeout 1 ms bounds every wait on a stuck entry or in-flight publisher.
SMALL = dict(max_subscribers=3, sub_ring_capacity=8, pool_size=16, max_payload_size=56, commit_timeout=0.001)

# These tests check layout 4's own: its byte offsets (layout 9's hostile bytes: test_v9_layout.py).
pytestmark = on_layout4



def shm_path(name):
    return f"/dev/shm{name}"


def poke(name, offset, fmt, value):
    """Write one value into the shm object at ``offset``."""
    with open(shm_path(name), "r+b") as file, mmap.mmap(file.fileno(), 0) as memory:
        struct.pack_into(fmt, memory, offset, value)


def poke_field(name, field, value):
    offset, fmt = rawregion.HEADER_OFFSETS[field]
    poke(name, offset, fmt, value)


def create(name, **changes):
    """Create a region (not kept) and return its header as rawregion reads it."""
    SharedRegion.create(name, ChannelType.PubSub, Config(**dict(SMALL, **changes)))
    return rawregion.header(rawregion.read_bytes(name))


def ring_offset(h, index):
    return h["sub_rings_offset"] + index * h["sub_ring_stride"]


def entry_offset(h, ring, position):
    return ring_offset(h, ring) + 128 + 16 * (position % h["sub_ring_capacity"])


def slot_offset(h, slot):
    return h["pool_offset"] + slot * h["slot_stride"]


# -- truncated and empty objects ----------------------------------------------------------


def test_zero_size_object(shm_name):
    open(shm_path(shm_name), "wb").close()
    with pytest.raises(RuntimeError, match="empty"):
        SharedRegion.open(shm_name)


def test_smaller_than_magic(shm_name):
    create(shm_name)
    os.truncate(shm_path(shm_name), 4)
    with pytest.raises(RuntimeError, match="bad magic"):
        SharedRegion.open(shm_name)


def test_smaller_than_header(shm_name):
    create(shm_name)
    os.truncate(shm_path(shm_name), 500)
    with pytest.raises(RuntimeError, match="832-byte header") as info:
        SharedRegion.open(shm_name)
    assert shm_name in str(info.value) and "500" in str(info.value)


@pytest.mark.parametrize("missing", [1, 64, 1000])
def test_smaller_than_total_size(shm_name, missing):
    h = create(shm_name)
    size = h["total_size"] - missing
    os.truncate(shm_path(shm_name), size)
    with pytest.raises(RuntimeError, match="total_size") as info:
        SharedRegion.open(shm_name)
    assert str(size) in str(info.value) and shm_name in str(info.value)


def test_larger_object_is_fine(shm_name):
    h = create(shm_name)
    os.truncate(shm_path(shm_name), h["total_size"] + 4096)
    region = SharedRegion.open(shm_name)
    with Subscriber(region) as subscriber:
        Publisher(region).send(b"ok")
        assert subscriber.try_receive() == b"ok"


SHRINK_SCRIPT = """
import os, sys
from kickmsg import ChannelType, Config, Publisher, SharedRegion, Subscriber

name = sys.argv[1]
cfg = Config(max_subscribers=2, sub_ring_capacity=8, pool_size=64, max_payload_size=4000)
region = SharedRegion.create(name, ChannelType.PubSub, cfg)
subscriber = Subscriber(region)
os.truncate("/dev/shm" + name, 1000)  # another process shrinks the object
try:
    Publisher(region).send(b"x")
except RuntimeError:
    pass
"""


class InterpreterCrash(Exception):
    """A subprocess was killed by a signal."""


@pytest.mark.xfail(
    strict=True, raises=InterpreterCrash, reason="LIMITATION: an object shrunk under a live mapping raises SIGBUS"
)
@pytest.mark.timeout(60)
def test_object_shrunk_after_open(shm_name):
    """Truncating a region that is already mapped must not kill the process."""
    result = subprocess.run([sys.executable, "-c", SHRINK_SCRIPT, shm_name], capture_output=True, timeout=30)
    if result.returncode < 0:
        raise InterpreterCrash(f"killed by signal {-result.returncode}")
    assert result.returncode == 0, f"exit {result.returncode}: {result.stderr.decode()[-2000:]}"


# -- corrupt geometry ----------------------------------------------------------------------

# (pokes: field -> value computed from the header, words the message must contain)
GEOMETRY_CASES = {
    "rings_offset_misaligned": ({"sub_rings_offset": lambda h: h["sub_rings_offset"] + 4}, ["sub_rings_offset"]),
    "rings_offset_in_header": ({"sub_rings_offset": lambda h: 64}, ["sub_rings_offset"]),
    "pool_offset_misaligned": ({"pool_offset": lambda h: h["pool_offset"] + 4}, ["pool_offset"]),
    "pool_offset_in_rings": ({"pool_offset": lambda h: h["sub_rings_offset"]}, ["pool_offset"]),
    "pool_offset_beyond_end": ({"pool_offset": lambda h: 2**40}, ["pool"]),
    "pool_offset_huge": ({"pool_offset": lambda h: 2**64 - 64}, ["pool"]),
    "ring_stride_small": ({"sub_ring_stride": lambda h: 64}, ["sub_ring_stride"]),
    "ring_stride_misaligned": ({"sub_ring_stride": lambda h: h["sub_ring_stride"] + 4}, ["sub_ring_stride"]),
    "slot_stride_small": ({"slot_stride": lambda h: 8}, ["slot_stride"]),
    "slot_stride_misaligned": ({"slot_stride": lambda h: h["slot_stride"] + 4}, ["slot_stride"]),
    "mask_wrong": ({"sub_ring_mask": lambda h: 5}, ["sub_ring_mask"]),
    "capacity_not_power_of_two": ({"sub_ring_capacity": lambda h: 6}, ["sub_ring_capacity"]),
    "capacity_zero": ({"sub_ring_capacity": lambda h: 0}, ["sub_ring_capacity"]),
    "capacity_huge": (
        {"sub_ring_capacity": lambda h: 2**40, "sub_ring_mask": lambda h: 2**40 - 1},
        ["sub_ring_stride"],
    ),
    "pool_size_zero": ({"pool_size": lambda h: 0}, ["pool_size"]),
    "pool_size_invalid_slot": ({"pool_size": lambda h: INVALID_SLOT}, ["pool_size"]),
    "pool_size_beyond_end": ({"pool_size": lambda h: 10**6}, ["pool"]),
    "max_subs_zero": ({"max_subs": lambda h: 0}, ["max_subs"]),
    "max_subs_huge": ({"max_subs": lambda h: 2**40}, ["max_subs"]),
    "max_subs_overlaps_pool": ({"max_subs": lambda h: 1000}, ["rings"]),
    "slot_data_size_zero": ({"slot_data_size": lambda h: 0}, ["slot_data_size"]),
    "slot_data_size_beyond_stride": ({"slot_data_size": lambda h: 10**6}, ["slot_stride"]),
    "total_size_beyond_object": ({"total_size": lambda h: h["total_size"] + 64}, ["total_size"]),
    "total_size_before_pool_end": ({"total_size": lambda h: h["pool_offset"]}, ["total_size"]),
    "channel_type": ({"channel_type": lambda h: 3}, ["channel_type"]),
    "creator_name_len": ({"creator_name_len": lambda h: 0xFFFF}, ["sub_rings_offset"]),
    "commit_timeout_endless": ({"commit_timeout_us": lambda h: 2**64 - 1}, ["commit_timeout_us"]),
}


@pytest.mark.parametrize("pokes, words", GEOMETRY_CASES.values(), ids=GEOMETRY_CASES.keys())
def test_corrupt_geometry_refused_on_open(shm_name, pokes, words):
    h = create(shm_name)
    for field, value in pokes.items():
        poke_field(shm_name, field, value(h))
    with pytest.raises(RuntimeError) as info:
        SharedRegion.open(shm_name)
    message = str(info.value)
    assert shm_name in message
    for word in words:
        assert word in message


def test_config_hash_is_not_geometry(shm_name):
    """A wrong config_hash only matters to create_or_open."""
    h = create(shm_name)
    poke(shm_name, 104, "<Q", h["config_hash"] ^ 1)
    SharedRegion.open(shm_name)
    with pytest.raises(RuntimeError, match="Config mismatch"):
        SharedRegion.create_or_open(shm_name, ChannelType.PubSub, Config(**SMALL))


# -- free stack --------------------------------------------------------------------------------


@pytest.mark.parametrize("index", [16, 1000, INVALID_SLOT - 1])
def test_free_top_out_of_range(shm_name, index):
    h = create(shm_name)
    region = SharedRegion.open(shm_name)
    poke_field(shm_name, "free_top", (h["free_top"] & ~0xFFFFFFFF) | index)
    publisher = Publisher(region)
    with pytest.raises(CorruptRegionError) as info:
        publisher.send(b"x")
    assert isinstance(info.value, RuntimeError)
    assert shm_name in str(info.value) and str(index) in str(info.value)
    with pytest.raises(CorruptRegionError):
        publisher.allocate(4)


def test_free_top_invalid_slot_is_an_empty_pool(shm_name):
    h = create(shm_name)
    region = SharedRegion.open(shm_name)
    poke_field(shm_name, "free_top", (h["free_top"] & ~0xFFFFFFFF) | INVALID_SLOT)
    with pytest.raises(BlockingIOError):
        Publisher(region).send(b"x")


def test_next_free_out_of_range(shm_name):
    h = create(shm_name)
    region = SharedRegion.open(shm_name)
    top = h["free_top"] & 0xFFFFFFFF
    poke(shm_name, slot_offset(h, top) + 4, "<I", 5000)
    subscriber = Subscriber(region)  # holds the first message's slot
    publisher = Publisher(region)
    assert publisher.send(b"first") == 5  # pops `top`, installs the bad link
    with pytest.raises(CorruptRegionError, match="5000"):
        publisher.send(b"second")
    assert subscriber.try_receive() == b"first"
    subscriber.close()


def test_free_stack_cycle_does_not_hang(shm_name):
    """A cycle in the links hands out the same slots again; no hang, no crash."""
    h = create(shm_name)
    region = SharedRegion.open(shm_name)
    top = h["free_top"] & 0xFFFFFFFF
    poke(shm_name, slot_offset(h, top) + 4, "<I", top)
    subscriber = Subscriber(region)
    publisher = Publisher(region)
    for i in range(40):
        publisher.send(bytes([i]))
    # Every message is either received or counted lost.
    assert len(list(subscriber)) + subscriber.lost == 40
    subscriber.close()


# -- garbage ring entries ------------------------------------------------------------------------


def write_entry(name, h, ring, position, sequence, slot, length):
    with open(shm_path(name), "r+b") as file, mmap.mmap(file.fileno(), 0) as memory:
        struct.pack_into("<QII", memory, entry_offset(h, ring, position), sequence, slot, length)


def test_impossible_entries_are_counted_lost(shm_name):
    h = create(shm_name)
    region = SharedRegion.open(shm_name)
    subscriber = Subscriber(region)  # ring 0, start position 0
    write_entry(shm_name, h, 0, 0, 1, 9999, 1)  # slot index outside the pool
    write_entry(shm_name, h, 0, 1, 2, 3, 57)  # longer than slot_data_size (56)
    write_entry(shm_name, h, 0, 2, 3, 4, 5)  # slot with refcount 0: freed
    write_entry(shm_name, h, 0, 3, 4, 5, 5)  # a readable message
    poke(shm_name, slot_offset(h, 5), "<I", 1)
    poke(shm_name, slot_offset(h, 5) + 8, "5s", b"hello")
    poke(shm_name, ring_offset(h, 0) + 64, "<Q", 4)  # write_pos
    assert subscriber.try_receive() == b"hello"
    assert subscriber.lost == 3
    assert subscriber.try_receive() is None
    subscriber.close()


def test_uncommitted_and_future_entries(shm_name):
    h = create(shm_name)
    region = SharedRegion.open(shm_name)
    subscriber = Subscriber(region)
    poke(shm_name, ring_offset(h, 0) + 64, "<Q", 3)
    write_entry(shm_name, h, 0, 0, LOCKED, 0, 0)  # locked: not ready, not lost
    assert subscriber.try_receive() is None and subscriber.lost == 0
    write_entry(shm_name, h, 0, 0, 0, 0, 0)  # uncommitted: not ready
    assert subscriber.try_receive() is None and subscriber.lost == 0
    for position in range(3):  # overwritten by a later lap: lost
        write_entry(shm_name, h, 0, position, 100 + position, 0, 0)
    assert subscriber.try_receive() is None
    assert subscriber.lost == 3
    subscriber.close()


def test_write_pos_far_ahead(shm_name):
    h = create(shm_name)
    region = SharedRegion.open(shm_name)
    subscriber = Subscriber(region)
    poke(shm_name, ring_offset(h, 0) + 64, "<Q", 2**62)
    assert subscriber.try_receive() is None
    assert subscriber.lost >= 2**62 - 8
    subscriber.close()


# -- values at the limits of their wire types ----------------------------------------------------


def test_write_pos_at_u64_limit(shm_name):
    h = create(shm_name)
    region = SharedRegion.open(shm_name)
    subscriber = Subscriber(region)
    poke(shm_name, ring_offset(h, 0) + 64, "<Q", 2**64 - 1)
    try:
        Publisher(region).send(b"x")
    except RuntimeError:
        pass
    # Whatever happened, the publisher's admission to the ring was released.
    assert rawregion.ring(rawregion.read_bytes(shm_name), 0).in_flight == 0
    subscriber.close()
    assert subscriber.drain_timeouts == 0


def test_in_flight_at_u32_limit(shm_name):
    """Admission adds one publisher to an in_flight already at its 30-bit
    maximum: the word wraps within 32 bits (no OverflowError), the message is
    delivered, and the release puts the word back exactly as it was."""
    h = create(shm_name)
    region = SharedRegion.open(shm_name)
    poke(shm_name, ring_offset(h, 0), "<I", 0xFFFFFFFD)  # Live, in_flight at its maximum
    publisher = Publisher(region)
    assert publisher.send(b"x") == 1
    assert publisher.dropped == 0
    ring = rawregion.ring(rawregion.read_bytes(shm_name), 0)
    assert (ring.state, ring.in_flight, ring.write_pos) == (1, 2**30 - 1, 1)  # Live, as poked; one message written
    sequence, slot, length = ring.entries[0]
    assert (sequence, length) == (1, 1)  # committed at position 0
    assert rawregion.pool(rawregion.read_bytes(shm_name)).refcounts[slot] == 1  # held by that entry only


def test_refcount_at_u32_limit(shm_name):
    h = create(shm_name)
    region = SharedRegion.open(shm_name)
    subscriber = Subscriber(region)
    Publisher(region).send(b"pinned")
    _, slot, _ = rawregion.ring(rawregion.read_bytes(shm_name), 0).entries[0]
    poke(shm_name, slot_offset(h, slot), "<I", 0xFFFFFFFF)
    # A saturated count can only be corruption: the pin is refused (one more
    # would wrap it to 0 and free a slot an entry still names) and the
    # message counted lost.
    assert subscriber.try_receive() is None
    assert subscriber.lost == 1
    pool = rawregion.pool(rawregion.read_bytes(shm_name))
    assert pool.refcounts[slot] == 0xFFFFFFFF
    assert slot not in pool.free_slots
    # Leaving drains the entry: one reference dropped, the slot still not freed.
    subscriber.close()
    assert subscriber.drain_timeouts == 0
    pool = rawregion.pool(rawregion.read_bytes(shm_name))
    assert pool.refcounts[slot] == 0xFFFFFFFE
    assert slot not in pool.free_slots


# -- fuzzing, in a subprocess ---------------------------------------------------------------------

FUZZ_EXAMPLES = {"entries": 400, "area": 400}


def run_fuzz(mode, name, workdir):
    """Run this file's fuzz loop in a fresh interpreter; return its summary."""
    result = subprocess.run(
        [sys.executable, __file__, mode, name, str(FUZZ_EXAMPLES[mode])],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=workdir,  # hypothesis writes its cache into the working directory
        env=dict(os.environ, PYTHONPATH=str(TESTS)),
    )
    assert result.returncode == 0, (
        f"fuzz worker exited with {result.returncode} (negative: killed by signal)\n"
        f"stdout:\n{result.stdout[-5000:]}\nstderr:\n{result.stderr[-5000:]}"
    )
    return Counter(json.loads(result.stdout.strip().splitlines()[-1]))


@pytest.mark.timeout(150)
def test_fuzz_ring_entries(shm_name, tmp_path):
    """Random write_pos, entries and refcounts in a subscriber's ring:
    receive returns data or None and counts losses, never crashes."""
    summary = run_fuzz("entries", shm_name, tmp_path)
    assert summary["examples"] == FUZZ_EXAMPLES["entries"]
    assert summary["received"] > 0 and summary["lost"] > 0 and summary["none"] > 0


@pytest.mark.timeout(150)
def test_fuzz_random_area(shm_name, tmp_path):
    """Random bytes and patched words over the rings and the pool: every call
    works, returns None, counts losses or raises RuntimeError/BlockingIOError;
    the interpreter neither crashes nor hangs."""
    summary = run_fuzz("area", shm_name, tmp_path)
    assert summary["examples"] == FUZZ_EXAMPLES["area"]
    assert summary["send:ok"] > 0 and summary["receive:ok"] > 0 and summary["lost"] > 0
    assert sum(count for key, count in summary.items() if key.endswith("Error")) > 0


# The worker side: everything below runs in the subprocess.

ALLOWED = (RuntimeError, BlockingIOError)  # CorruptRegionError is a RuntimeError


def u32_words():
    """Small values, limits, and anything."""
    return st.one_of(st.integers(0, 20), st.sampled_from([INVALID_SLOT, 2**31]), st.integers(0, 2**32 - 1))


class Outcomes(Counter):
    def call(self, label, function, *args):
        """Call ``function``; count its outcome; allowed errors give None."""
        try:
            result = function(*args)
        except ALLOWED as error:
            self[f"{label}:{type(error).__name__}"] += 1
            return None
        self[f"{label}:ok"] += 1
        return result


def fuzz_entries(name, examples):
    outcomes = Outcomes()
    # The sequence is drawn relative to the entry's position, so that committed,
    # overwritten, uncommitted and locked entries all come up often.
    sequence = st.one_of(
        st.sampled_from(["committed", "later lap", "uncommitted", "locked"]), st.integers(0, 2**64 - 1)
    )
    slot = st.one_of(st.integers(0, 15), u32_words())
    entry = st.tuples(sequence, slot, st.one_of(st.integers(0, 60), st.integers(0, 2**32 - 1)))

    @settings(max_examples=examples, deadline=None, database=None, suppress_health_check=list(HealthCheck))
    @given(
        write_pos=st.one_of(st.integers(0, 24), st.integers(0, 2**64 - 1)),
        entries=st.lists(entry, min_size=8, max_size=8),
        refcounts=st.lists(st.integers(0, 3), min_size=16, max_size=16),
    )
    def example(write_pos, entries, refcounts):
        h = create(name)
        region = SharedRegion.open(name)
        subscriber = Subscriber(region)
        with open(shm_path(name), "r+b") as file, mmap.mmap(file.fileno(), 0) as memory:
            struct.pack_into("<Q", memory, ring_offset(h, 0) + 64, write_pos)
            for index, (kind, slot, length) in enumerate(entries):
                # The latest position below write_pos that maps to this entry.
                position = write_pos - 1 - (write_pos - 1 - index) % 8 if write_pos > index else index
                seq = {
                    "committed": position + 1,
                    "later lap": position + 9,
                    "uncommitted": position,
                    "locked": LOCKED,
                }.get(kind, kind)
                struct.pack_into("<QII", memory, entry_offset(h, 0, index), seq % 2**64, slot, length)
            for slot, refcount in enumerate(refcounts):
                struct.pack_into("<I", memory, slot_offset(h, slot), refcount)
                struct.pack_into("4s", memory, slot_offset(h, slot) + 8, b"data")
        lost = 0
        for _ in range(20):
            data = subscriber.try_receive()
            assert subscriber.lost >= lost
            lost = subscriber.lost
            if data is None:
                outcomes["none"] += 1
            else:
                assert len(data) <= 56
                outcomes["received"] += 1
        view = subscriber.try_receive_view()
        if view is not None:
            assert len(bytes(view)) <= 56
            view.release()
        outcomes["lost"] += subscriber.lost
        subscriber.close()
        outcomes["examples"] += 1

    example()
    return outcomes


def fuzz_area(name, examples):
    outcomes = Outcomes()
    patch = st.tuples(
        st.sampled_from(["state_flight", "write_pos", "sequence", "slot_idx", "payload_len", "refcount", "next_free"]),
        st.integers(0, 1000),
        st.one_of(st.integers(0, 40), st.sampled_from([INVALID_SLOT, LOCKED, 1, 2, 5, 6]), st.integers(0, 2**64 - 1)),
    )

    @settings(max_examples=examples, deadline=None, database=None, suppress_health_check=list(HealthCheck))
    @given(
        traffic=st.integers(0, 12),
        read=st.integers(0, 12),
        fill=st.one_of(st.none(), st.binary(min_size=1, max_size=64), st.integers(0, 2**32)),
        patches=st.lists(patch, max_size=12),
    )
    def example(traffic, read, fill, patches):
        h = create(name)
        region = SharedRegion.open(name)
        publisher = Publisher(region)
        first = Subscriber(region)
        # Some real traffic first, so patches land on a region in use.
        for i in range(traffic):
            publisher.send(bytes([i]) * (i + 1))
        for _ in range(read):
            first.try_receive()
        start, end = h["sub_rings_offset"], h["total_size"]
        with open(shm_path(name), "r+b") as file, mmap.mmap(file.fileno(), 0) as memory:
            if isinstance(fill, bytes):  # a repeated pattern, e.g. all 0xFF
                memory[start:end] = (fill * (end - start))[: end - start]
            elif isinstance(fill, int):  # seeded random bytes
                memory[start:end] = random.Random(fill).randbytes(end - start)
            for kind, index, value in patches:
                apply_patch(memory, h, kind, index, value)

        call = outcomes.call
        for _ in range(18):
            data = call("receive", first.try_receive)
            outcomes["received" if data is not None else "none"] += 1
        view = call("receive_view", first.try_receive_view)
        if view is not None:
            assert len(bytes(view)) <= 56
            view.release()
        call("receive_timeout", first.receive, 0.001)
        second = call("join", Subscriber, region)
        for i in range(5):
            call("send", publisher.send, b"fuzz" * i)
        slot = call("allocate", publisher.allocate, 8)
        if slot is not None:
            memoryview(slot)[:] = b"allocate"
            call("publish", slot.publish)
        if second is not None:
            for _ in range(10):
                call("receive", second.try_receive)
            call("close", second.close)
        call("close", first.close)
        outcomes["lost"] += first.lost
        reopened = call("reopen", SharedRegion.open, name)
        if reopened is not None:
            third = call("join", Subscriber, reopened)
            if third is not None:
                call("close", third.close)
        outcomes["examples"] += 1

    example()
    return outcomes


def apply_patch(memory, h, kind, index, value):
    """Write ``value`` into one word of the rings or the pool."""
    ring = index % h["max_subs"]
    position = index // h["max_subs"]
    slot = index % h["pool_size"]
    offset, fmt = {
        "state_flight": (ring_offset(h, ring), "<I"),
        "write_pos": (ring_offset(h, ring) + 64, "<Q"),
        "sequence": (entry_offset(h, ring, position), "<Q"),
        "slot_idx": (entry_offset(h, ring, position) + 8, "<I"),
        "payload_len": (entry_offset(h, ring, position) + 12, "<I"),
        "refcount": (slot_offset(h, slot), "<I"),
        "next_free": (slot_offset(h, slot) + 4, "<I"),
    }[kind]
    struct.pack_into(fmt, memory, offset, value & (2 ** (8 * struct.calcsize(fmt)) - 1))


if __name__ == "__main__":
    mode, shm_name_arg, count = sys.argv[1], sys.argv[2], int(sys.argv[3])
    try:
        summary = {"entries": fuzz_entries, "area": fuzz_area}[mode](shm_name_arg, count)
    finally:
        unlink_shm(shm_name_arg)
    print(json.dumps(summary))
