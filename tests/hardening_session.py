"""What the hardening fuzzers of both layouts share
(tests/protocol/test_hardening.py): the outcome counter and the channel
session whose operations hypothesis runs in a random order on a corrupt
region. Each layout subclasses ``ChannelSession`` there with the operations
that differ (allocate and publish, repairs, re-opening)."""
import itertools
from collections import Counter

from kickmsg import Publisher, SchemaInfo, Subscriber, audit

ALLOWED = (RuntimeError, BlockingIOError)  # CorruptRegionError is a RuntimeError


def read_bytes(name):
    with open(f"/dev/shm{name}", "rb") as file:
        return file.read()


class Harness(Counter):
    """Counts outcomes. An allowed error gives None (and must name the
    region, unless ``named`` is false); any other exception propagates and
    fails the example (hypothesis then shrinks it)."""

    region_name = ""

    def call(self, label, function, *args, allowed=ALLOWED, named=True):
        try:
            result = function(*args)
        except allowed as error:
            if named:
                assert self.region_name in str(error), f"{label}: the error does not name the region: {error!r}"
            self[f"{label}:{type(error).__name__}"] += 1
            return None
        self[f"{label}:ok"] += 1
        return result


class ChannelSession:
    """A region and what a process does with it: one publisher, some
    subscribers, views and a pending allocated slot. Each operation checks
    what a caller may rely on even when the region is corrupt. ``noisy``:
    another process writes into the region meanwhile, so no check compares
    the bytes before and after a call."""

    def __init__(self, harness, region, name, noisy=False):
        self.harness = harness
        self.noisy = noisy
        self.region = region
        self.name = name
        self.geometry = region.geometry
        self.publisher = Publisher(region)
        self.subscribers = []
        self.views = []
        self.pending = None
        self.counter = itertools.count()

    @classmethod
    def operations(cls):
        """The names of every ``op_`` method, sorted (what hypothesis draws from)."""
        return sorted(name[3:] for name in dir(cls) if name.startswith("op_"))

    def run(self, operation):
        getattr(self, "op_" + operation)()

    def subscriber(self):
        return self.subscribers[next(self.counter) % len(self.subscribers)] if self.subscribers else None

    def check_data(self, data, subscriber, lost_before):
        assert subscriber.lost >= lost_before, "lost went down"
        if data is not None:
            assert len(data) <= self.geometry.slot_data_size
            self.harness["received"] += 1

    # publishing
    def op_send(self):
        size = next(self.counter) % (self.geometry.slot_data_size + 1)
        sent = self.harness.call("send", self.publisher.send, b"s" * size)
        assert sent in (None, size)

    def op_send_too_large(self):
        try:
            self.publisher.send(b"x" * (self.geometry.slot_data_size + 1))
        except ValueError:
            self.harness["send_too_large:ok"] += 1
        else:
            raise AssertionError("an oversized send was accepted")

    def op_allocate_publish(self):
        self.op_allocate()
        self.op_publish()

    # subscribing
    def op_join(self):
        subscriber = self.harness.call("join", Subscriber, self.region)
        if subscriber is not None:
            self.subscribers.append(subscriber)

    def op_leave(self):
        if self.subscribers:
            subscriber = self.subscribers.pop(next(self.counter) % len(self.subscribers))
            self.harness.call("leave", subscriber.close)
            self.harness["lost"] += subscriber.lost

    def _receive(self, label, method, *args):
        subscriber = self.subscriber()
        if subscriber is not None:
            lost = subscriber.lost
            data = self.harness.call(label, getattr(subscriber, method), *args)
            self.check_data(data, subscriber, lost)

    def op_try_receive(self):
        self._receive("try_receive", "try_receive")

    def op_receive(self):
        self._receive("receive", "receive", 0.001)

    def op_latest(self):
        self._receive("latest", "try_receive_latest")

    def op_receive_latest(self):
        self._receive("receive_latest", "receive_latest", 0.001)

    def op_iterate(self):
        subscriber = self.subscriber()
        if subscriber is not None:
            lost = subscriber.lost
            try:
                received = list(itertools.islice(subscriber, 10_000))
            except ALLOWED as error:
                assert self.name in str(error), f"iterate: the error does not name the region: {error!r}"
                self.harness[f"iterate:{type(error).__name__}"] += 1
                return
            assert len(received) < 10_000, "iteration over a ring did not end"
            for data in received:
                self.check_data(data, subscriber, lost)
            self.harness["iterate:ok"] += 1

    def op_view(self):
        subscriber = self.subscriber()
        if subscriber is not None:
            view = self.harness.call("view", subscriber.receive_view, 0.001)
            if view is not None:
                assert len(bytes(view)) <= self.geometry.slot_data_size
                self.views.append(view)

    def op_release_view(self):
        if self.views:
            self.harness.call("release_view", self.views.pop(0).release)

    # reports: read-only
    def _read_only(self, label, function, *args):
        before = read_bytes(self.name)
        result = self.harness.call(label, function, *args)
        assert self.noisy or read_bytes(self.name) == before, f"{label} wrote into the region"
        return result

    def op_diagnose(self):
        report = self._read_only("diagnose", self.region.diagnose)
        if report is not None:
            g = self.geometry
            assert 0 <= report.locked_entries <= g.max_subs * g.capacity
            assert report.retired_rings + report.draining_rings + report.live_rings <= g.max_subs
        return report

    def op_audit(self):
        report = self._read_only("audit", audit, self.region)
        if report is not None:
            assert report.verdict.startswith("clean: " if report.clean else "DAMAGED: ")
            assert 0 <= report.free_slots <= self.geometry.pool_size
        return report

    # repairs
    def _reset(self, label, drain):
        reset = self.harness.call(label, self.region.reset_retired_rings, drain)
        if reset is not None:
            assert 0 <= reset <= self.geometry.max_subs
            assert self.noisy or self.region.diagnose().retired_rings == 0

    def op_reset(self):
        self._reset("reset", False)

    def op_reset_drain(self):
        self._reset("reset_drain", True)

    def op_reclaim_orphaned(self):
        reclaimed = self.harness.call("reclaim_orphaned", self.region.reclaim_orphaned_slots)
        assert reclaimed is None or 0 <= reclaimed <= self.geometry.pool_size

    # schema
    def op_schema(self):
        self.harness.call("schema", self.region.schema)
        info = SchemaInfo()
        info.name = "hardening"
        self.harness.call("claim_schema", self.region.try_claim_schema, info)
        self.harness.call("reset_schema_claim", self.region.reset_schema_claim)

    def close(self):
        """Release everything this session holds (allowed errors only)."""
        self.pending = None
        while self.views:
            self.harness.call("release_view", self.views.pop().release)
        while self.subscribers:
            subscriber = self.subscribers.pop()
            self.harness.call("leave", subscriber.close)
            self.harness["lost"] += subscriber.lost
