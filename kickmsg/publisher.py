"""Publisher and AllocatedSlot: publishing, the API of both layouts.

Publish flow (spec, "Publisher"): 1. pop a free slot; 2. write the payload;
3. pre-set its refcount to max_subs; 4. push it into every Live ring with a
two-phase commit; 5. give back, in one step, the references of the rings it
was not delivered to. ``send`` and ``allocate`` do steps 1-2;
``Publisher._publish`` hands steps 3-5 to the layout-4 core
(``kickmsg.protocol.v4.publish``); ``Publisher9`` hands each message to the
layout-9 core (``kickmsg.protocol.v9.publish``).
"""
import errno
import time
import weakref
from typing import Self
from collections.abc import Buffer

from kickmsg import layouts, process
from kickmsg import owners
from kickmsg.protocol import freestack
from kickmsg.ops.audit import explain_empty_pool
from kickmsg.protocol.v4 import publish as publish4
from kickmsg.protocol.v4 import region as region4
from kickmsg.protocol.v4.layout import INVALID_SLOT
from kickmsg.protocol import v9
from kickmsg.region import CHECK_IN_INTERVAL_NS, SharedRegion

__all__ = ["AllocatedSlot", "Publisher", "Publisher9", "send_retrying"]


class Publisher:
    """Publishes messages into every subscriber ring of a region.

    Any number of publishers, in any processes, may share a region. A
    publisher is used by one thread at a time.

    Beyond 0.1.0: if the region is re-created under it (in place, or
    unlinked and replaced), the publisher notices within 0.1 s of sending,
    publishes into the new region from then on, and counts it in
    ``rejoined``; a slot allocated in the old region and published after
    that is not delivered and counts in ``dropped``.

    Also beyond 0.1.0: it records itself beside the region (``name``, by
    default the program's; ``kickmsg.owners``) so that tools see it, with
    its counts as of its last check-in, until it is garbage-collected or
    its process ends.

    On a layout-9 region the object is a ``Publisher9``, which hands each
    message to the layout-9 core (``kickmsg.protocol.v9.publish``).
    """

    def __new__(cls, region: SharedRegion, name: str | None = None) -> "Publisher":
        if cls is Publisher and isinstance(region, SharedRegion) and region.layout == layouts.LAYOUT_9:
            return super().__new__(Publisher9)
        return super().__new__(cls)

    def __init__(self, region: SharedRegion, name: str | None = None):
        if not isinstance(region, SharedRegion):
            raise TypeError(f"Publisher needs a SharedRegion, got {region!r}")
        region.require_writable("publish")
        self._region = region.reopen_if_recreated() or region  # a stale region object: use what the name leads to
        self._next_check_in_ns = self._region.next_check_in_ns()
        self._dropped = 0
        self._rejoined = 0
        self._pending: weakref.ref[AllocatedSlot] | None = None  # weak reference to the AllocatedSlot not yet published
        self._sent = 0
        self._empty_pool_why: tuple[int, str] | None = None  # (until when, explanation) of the last empty pool
        self._record = self._record_ourselves(name)
        self._closed = False

    @property
    def region(self) -> SharedRegion:
        """The region this publisher writes into."""
        return self._region

    @property
    def dropped(self) -> int:
        """Deliveries abandoned because the ring entry could not be locked
        (contention, or a crashed writer's entry); each is one message lost
        for one subscriber, or a slot allocated in a region that was
        re-created before it was published. A dry pool is not counted here."""
        return self._dropped

    @property
    def rejoined(self) -> int:
        """Times this publisher followed its region's name to a re-created
        region (beyond 0.1.0)."""
        return self._rejoined

    def send(self, data: Buffer) -> int:
        """Copy ``data`` (any C-contiguous bytes-like object) into a slot and
        publish it. Returns its length.

        Raises ``ValueError`` if it exceeds max_payload_size and
        ``BlockingIOError`` (EAGAIN) if the slot pool is empty, saying why.
        """
        size = self._send_unless_pool_empty(data)
        if size is None:
            raise BlockingIOError(errno.EAGAIN, self._why_pool_empty())
        return size

    def _why_pool_empty(self) -> str:
        """Why the slot pool is empty (``explain_empty_pool``: one look at
        the whole region), worked out at most once per check-in interval: a
        caller retrying ``send`` on an empty pool meanwhile gets the last
        explanation, not a look at every slot and ring per retry."""
        now_ns = time.monotonic_ns()
        if self._empty_pool_why is None or now_ns >= self._empty_pool_why[0]:
            self._empty_pool_why = (now_ns + CHECK_IN_INTERVAL_NS, explain_empty_pool(self._region))
        return self._empty_pool_why[1]

    def _send_unless_pool_empty(self, data: Buffer) -> int | None:
        """``send`` without the explanation of an empty pool (one look at
        the whole region): None then. For callers that retry."""
        self._check_open()
        if time.monotonic_ns() >= self._next_check_in_ns:
            self._follow_if_recreated()
        region = self._region
        core: region4.Region = region.core  # type: ignore[assignment]  # a layout-4 publisher's
        # Bytes are copied as they are; any other buffer as its raw bytes.
        payload = data if isinstance(data, (bytes, bytearray)) else memoryview(data).cast("B")
        size = len(payload)
        if size > region.geometry.slot_data_size:
            raise ValueError(
                f"message too large: {size} bytes exceeds max_payload_size "
                f"{region.geometry.slot_data_size} of {region.name}"
            )
        # 1. Pop a free slot.
        slot = freestack.pop(core, empty_on_corrupt_head=False)
        if slot == INVALID_SLOT:
            return None
        # 2. Write the payload into it.
        start = core.payload_offsets[slot]
        region.mapping.buffer[start : start + size] = payload
        self._publish(slot, size)
        return size

    def allocate(self, len: int | None = None) -> "AllocatedSlot | None":
        """Reserve a slot for a message to be written in place
        (``memoryview(slot)``, ``numpy.frombuffer(slot, ...)``), then
        publish it. Returns None if the pool is empty. A slot still pending
        from an earlier ``allocate`` is given back first: that slot object
        is superseded (its ``publish`` raises ValueError, as 0.9.2's), or,
        for ``allocate(len)`` on a layout-4 region, replaced (its
        ``publish()`` delivers nothing and returns 0).

        0.9.2's form, ``allocate()``: the slot's buffer is ``max_size``
        (max_payload_size) bytes; ``slot.publish(n)`` publishes its first n.
        0.1.0's form, ``allocate(len)``: a buffer of ``len`` bytes, None if
        ``len`` exceeds max_payload_size; ``slot.publish()`` publishes it.
        A ``len`` that is not an int is a TypeError, a negative one a ValueError.
        """
        if len is not None:
            check_length("allocate", len)
        self._check_open()
        if time.monotonic_ns() >= self._next_check_in_ns:
            self._follow_if_recreated()
        max_size = self._region.geometry.slot_data_size
        if len is not None and len > max_size:
            return None
        pending = self._pending() if self._pending else None
        if pending is not None:
            pending._abandon()
        # 1. Pop a free slot; step 2 is the caller's, through the buffer.
        slot = self._reserve_slot()
        if slot == INVALID_SLOT:
            return None
        allocated = AllocatedSlot(self, slot, max_size if len is None else len,
                                  replaced_silently=len is not None and self._region.layout == layouts.LAYOUT_4)
        self._pending = weakref.ref(allocated)
        return allocated

    def _reserve_slot(self) -> int:
        """Publish flow step 1 for ``allocate``: pop a free slot (INVALID_SLOT: none)."""
        return freestack.pop(self._region.core, empty_on_corrupt_head=False)

    def _give_back(self, region: SharedRegion, slot: int) -> None:
        """Return an unpublished slot of ``region`` to its free stack."""
        freestack.push(region.core, slot)

    def close(self) -> None:
        """Stop publishing: give back a slot allocated and not published
        (publishing it afterwards delivers nothing) and clear this
        publisher's record, so tools no longer list it. ``send`` and
        ``allocate`` then raise ValueError. Also done by garbage collection."""
        if self._closed:
            return
        self._closed = True
        pending = self._pending() if self._pending else None
        if pending is not None:
            pending._abandon()
        if self._record is not None:
            self._record.release()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def _check_open(self) -> None:
        if self._closed:
            raise ValueError(f"this publisher of {self._region.name} is closed")

    def _record_ourselves(self, name: str | None) -> "owners.PublisherEntry | None":
        """Our publisher record, released when this object goes (None in
        private memory)."""
        if not self._region.mapping.shared:
            return None
        record = owners.PublisherEntry(self._region, owners.program_name() if name is None else name)
        weakref.finalize(self, record.release)
        return record

    def _follow_if_recreated(self) -> None:
        """Publish into the region now under our region's name, if it was
        re-created (beyond 0.1.0); update our record's counters."""
        self._next_check_in_ns = self._region.next_check_in_ns()
        new_region = self._region.reopen_if_recreated()
        if new_region is not None:
            self._region = new_region
            self._rejoined += 1
        if self._record is not None:
            self._record.check_in(self._region, self._sent, self._dropped)

    def _publish(self, slot: int, payload_len: int) -> int:
        """Publish flow steps 3-5 for a written slot (``kickmsg.protocol.v4.
        publish``). Returns the number of rings it was committed to."""
        self._sent += 1
        delivered, dropped = publish4.publish(self._region.core, slot, payload_len)  # type: ignore[arg-type]  # a layout-4 publisher's
        self._dropped += dropped
        return delivered

    def __repr__(self) -> str:
        return f"Publisher(region={self._region.name!r}, dropped={self._dropped})"


def send_retrying(publisher: Publisher, data: Buffer, timeout_s: float) -> bool:
    """``publisher.send(data)``, retrying while the slot pool is empty (a
    pause of 1 ms, doubling up to 100 ms) for up to ``timeout_s`` seconds.
    False if the pool stayed empty that long. A retry reads only the free
    stack's top: why the pool is empty is never worked out."""
    deadline = time.monotonic() + timeout_s
    pause = 0.001
    while publisher._send_unless_pool_empty(data) is None:
        if time.monotonic() >= deadline:
            return False
        time.sleep(pause)
        pause = min(pause * 2, 0.1)
    return True


def check_length(call: str, length: object) -> None:
    """A length given to ``call``: TypeError if it is not an int,
    ValueError if it is negative, each naming the value."""
    if not isinstance(length, int) or isinstance(length, bool):
        raise TypeError(f"{call} needs an int length, got {length!r}")
    if length < 0:
        raise ValueError(f"{call} needs a non-negative length, got {length}")


class AllocatedSlot:
    """A slot reserved by ``Publisher.allocate``: a writable buffer of
    ``len(slot)`` bytes in shared memory, published by ``publish()``.

    Once published (or replaced by a newer ``allocate``), new buffers are
    refused with ``BufferError``. Memoryviews taken before stay usable, but
    writing through them after ``publish()`` changes a message that
    subscribers may be reading. A slot that is never published goes back to
    the pool when it is garbage collected, or replaced, and no buffer of it
    is alive.

    A slot of ``allocate()`` (0.9.2's form) publishes with ``publish(n)``
    (n <= ``max_size``; no n: all of it), and ``publish()`` after a newer
    ``allocate`` raises ValueError as in 0.9.2. A slot of ``allocate(len)``
    (0.1.0's form) publishes its ``len`` bytes; superseded, it raises the
    same ValueError on a layout-9 region, and on a layout-4 one it is
    replaced: it delivers nothing and returns 0 (0.1.0 would publish the
    newer slot's bytes instead: docs/reference/compatibility.md).
    """

    def __init__(self, publisher: Publisher, slot: int, length: int, replaced_silently: bool = False):
        self._publisher = publisher
        self._region = publisher._region
        self._slot = slot
        self._length = length
        self._replaced_silently = replaced_silently  # allocate(len) on layout 4: superseded, publish() returns 0
        self._published = False
        self._abandoned = False  # replaced by a newer allocate() before publish()
        self._returned = False  # given back to the free stack
        self._exports = 0  # buffers handed out and not yet released
        self._owner_pid = process.pid

    def __len__(self) -> int:
        return self._length

    @property
    def published(self) -> bool:
        return self._published

    @property
    def max_size(self) -> int:
        """The bytes the buffer holds: the most ``publish(len)`` takes."""
        return self._length

    @property
    def valid(self) -> bool:
        """Neither published nor replaced by a newer ``allocate``."""
        return not (self._published or self._abandoned)

    def publish(self, len: int | None = None) -> int:
        """Deliver the first ``len`` bytes (default: all ``max_size``) to
        every Live ring; returns how many rings."""
        if self._published:
            raise ValueError("AllocatedSlot.publish() called more than once")
        if len is None:
            len = self._length
        else:
            check_length("publish", len)
        if len > self._length:
            raise ValueError(f"publish(len) exceeds slot max_size: {len} > {self._length}")
        if self._region is not self._publisher._region:
            # The region was re-created since allocate(): the slot belongs
            # to the old one. Give it back there; the message is dropped.
            self._abandon()
            self._publisher._dropped += 1
            self._published = True
            return 0
        if self._abandoned and not self._replaced_silently and not self._publisher._closed:
            raise ValueError(
                "AllocatedSlot was superseded by a later Publisher.allocate(); publishing it would commit the newer reservation"
            )
        self._published = True
        if self._abandoned:
            return 0
        return self._publisher._publish(self._slot, len)

    def __buffer__(self, flags: int) -> memoryview:
        if self._abandoned and not self._published:
            raise BufferError(
                "AllocatedSlot was superseded by a later Publisher.allocate(); its slot is back in the pool "
                "and writing through it would corrupt another reservation"
            )
        if self._published:
            raise BufferError("AllocatedSlot has already been published; its buffer is no longer writable")
        self._exports += 1
        core = self._region.core
        return core.payload_view(self._slot, self._length) if isinstance(core, region4.Region) else core.payload(self._slot, self._length)

    def __release_buffer__(self, view: memoryview) -> None:
        self._exports -= 1
        self._give_back_if_abandoned()

    def _abandon(self) -> None:
        """Give up an unpublished slot (once no buffer of it is alive)."""
        if not self._published:
            self._abandoned = True
            self._give_back_if_abandoned()

    def _give_back_if_abandoned(self) -> None:
        if self._abandoned and not self._returned and self._exports == 0:
            self._returned = True
            self._publisher._give_back(self._region, self._slot)

    def __del__(self) -> None:
        if process.pid == self._owner_pid:  # not a forked child's copy
            self._abandon()

    def __repr__(self) -> str:
        return f"AllocatedSlot(len={self._length}, published={self._published}, region={self._region.name!r})"


class Publisher9(Publisher):
    """``Publisher`` on a layout-9 region: each message goes through the
    layout-9 core (``kickmsg.protocol.v9.Publisher``: B.5-B.9, B.15).
    Re-created regions are followed and the publisher is recorded beside
    the region, as on layout 4."""

    def __init__(self, region: SharedRegion, name: str | None = None):
        super().__init__(region, name)
        self._core = self._core_of(self._region)
        self._old_dropped = 0  # dropped by the cores of regions we followed away from

    @staticmethod
    def _core_of(region: SharedRegion) -> v9.Publisher:
        if not isinstance(region.core, v9.Region):
            raise TypeError(f"{region.name} is not a layout-9 region")  # the name now leads to a layout-4 one
        return v9.Publisher(region.core)

    @property
    def dropped(self) -> int:
        """Deliveries abandoned (B.9: no lock within its attempts, the
        entry taken over, a late commit after a steal), plus slots allocated
        in a region that was re-created before they were published."""
        return self._dropped + self._old_dropped + self._core.dropped

    def _send_unless_pool_empty(self, data: Buffer) -> int | None:
        self._check_open()
        if time.monotonic_ns() >= self._next_check_in_ns:
            self._follow_if_recreated()
        payload = data if isinstance(data, (bytes, bytearray)) else memoryview(data).cast("B")
        size = len(payload)
        max_size = self._region.geometry.slot_data_size
        if size > max_size:
            raise ValueError(
                f"message too large: exceeds max_payload_size: {size} bytes > {max_size} of {self._region.name}"
            )
        # B.5 allocate, step 1: a slot still pending from allocate() goes back
        # to the pool first, superseded, as 0.9.2's send does (the core's own
        # pending slot is always none: AllocatedSlot keeps the reservation)
        pending = self._pending() if self._pending else None
        if pending is not None:
            pending._abandon()
        slot = self._core.allocate()
        if slot == INVALID_SLOT:
            return None
        self._core.region.payload(slot, size)[:] = payload
        self._sent += 1
        self._core.publish(slot, size)  # B.6
        return size

    def send(self, data: Buffer) -> int:
        """As on layout 4; an empty pool raises 0.9.2's BlockingIOError."""
        size = self._send_unless_pool_empty(data)
        if size is None:
            raise BlockingIOError(
                errno.EAGAIN, f"slot pool exhausted; try again after subscribers drain ({self._region.name}, "
                f"pool_size {self._region.geometry.pool_size})",
            )
        return size

    def _reserve_slot(self) -> int:
        slot = self._core.allocate()  # B.5
        self._core.pending = INVALID_SLOT  # the reservation is the AllocatedSlot's from now on
        return slot

    def _publish(self, slot: int, payload_len: int) -> int:
        self._sent += 1
        self._core.pending = slot  # the AllocatedSlot's reservation, handed back to the core to publish
        return self._core.publish(slot, payload_len)

    def _follow_if_recreated(self) -> None:
        region = self._region
        super()._follow_if_recreated()
        if self._region is not region:
            self._old_dropped += self._core.dropped
            self._core = self._core_of(self._region)

    def __repr__(self) -> str:
        return f"Publisher(region={self._region.name!r}, layout=9, dropped={self.dropped})"
