"""Publisher and AllocatedSlot: publishing, the API of both layouts.

Each holds its layout's core (``kickmsg.protocol.v4.publish.Publisher``,
``kickmsg.protocol.v9.publish.Publisher``: allocate -> publish -> send,
the spec's publish flow whole), chosen when the publisher is made, and
adds policy only: argument checks, following a re-created region, the
publisher's record beside the region (``kickmsg.owners``), the ``sent``,
``rejoined`` and ``dropped`` counts, and the slot handed out by
``allocate`` (its buffer, giving it back when it is abandoned).
"""
import time
import weakref
from typing import Self
from collections.abc import Buffer

from kickmsg import layouts, process
from kickmsg import owners
from kickmsg.errors import PoolEmptyError
from kickmsg.protocol.cores import PublisherCore
from kickmsg.protocol.v4 import publish as publish4
from kickmsg.protocol.v4.layout import INVALID_SLOT
from kickmsg.protocol import v9
from kickmsg.region import SharedRegion

__all__ = ["AllocatedSlot", "Publisher", "send_retrying"]


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
    """

    def __init__(self, region: SharedRegion, name: str | None = None):
        if not isinstance(region, SharedRegion):
            raise TypeError(f"Publisher needs a SharedRegion, got {region!r}")
        region.require_writable("publish")
        self._use(region.reopen_if_recreated() or region)  # a stale region object: use what the name leads to
        self._next_check_in_ns = self._region.next_check_in_ns()
        self._dropped = 0  # slots published after their region was re-created, and the drops of cores left behind
        self._rejoined = 0
        self._pending: weakref.ref[AllocatedSlot] | None = None  # the last allocate()'s slot, maybe not yet published
        self._sent = 0
        self._record = self._record_ourselves(name)
        self._closed = False

    def _use(self, region: SharedRegion) -> None:
        """Publish into ``region`` from now on, through a core of its layout."""
        core = region.core
        self._region = region
        self._core: PublisherCore = v9.Publisher(core) if isinstance(core, v9.Region) else publish4.Publisher(core)
        self._send_supersedes = region.layout == layouts.LAYOUT_9  # 0.9.2's send gives back an allocated slot

    @property
    def region(self) -> SharedRegion:
        """The region this publisher writes into."""
        return self._region

    @property
    def dropped(self) -> int:
        """Deliveries abandoned because the ring entry could not be locked
        (contention, or a crashed writer's entry; on layout 9 also a lock
        taken over by a repairer: B.9); each is one message lost for one
        subscriber, or a slot allocated in a region that was re-created
        before it was published. A dry pool is not counted here."""
        return self._dropped + self._core.dropped

    @property
    def rejoined(self) -> int:
        """Times this publisher followed its region's name to a re-created
        region (beyond 0.1.0)."""
        return self._rejoined

    def send(self, data: Buffer) -> int:
        """Copy ``data`` (any C-contiguous bytes-like object) into a slot and
        publish it. Returns its length.

        Raises ``ValueError`` if it exceeds max_payload_size and
        ``kickmsg.PoolEmptyError`` (a ``BlockingIOError``, EAGAIN, as the
        native bindings raise) if the slot pool is empty; ``kickmsg audit
        NAME`` shows who holds the slots. On a layout-9 region a slot still
        pending from ``allocate`` is given back first, superseded (0.9.2).
        """
        if self._closed:
            raise self._closed_error()
        if time.monotonic_ns() >= self._next_check_in_ns:
            self._follow_if_recreated()
        # Bytes are copied as they are; any other buffer as its raw bytes.
        payload = data if isinstance(data, (bytes, bytearray)) else memoryview(data).cast("B")
        if self._pending is not None and self._send_supersedes and len(payload) <= self._region.geometry.slot_data_size:
            self._supersede_pending()  # (a message too long is refused with the slot left alone, as 0.9.2)
        size = self._core.send(payload)
        self._sent += 1
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
        if self._closed:
            raise self._closed_error()
        if time.monotonic_ns() >= self._next_check_in_ns:
            self._follow_if_recreated()
        max_size = self._region.geometry.slot_data_size
        if len is not None and len > max_size:
            return None
        if self._pending is not None:
            self._supersede_pending()
        slot = self._core.allocate()
        if slot == INVALID_SLOT:
            return None
        allocated = AllocatedSlot(self, slot, max_size if len is None else len,
                                  replaced_silently=len is not None and self._region.layout == layouts.LAYOUT_4)
        self._pending = weakref.ref(allocated)
        return allocated

    def _supersede_pending(self) -> None:
        """The last ``allocate``'s slot, if not yet published, is given up."""
        pending = self._pending() if self._pending is not None else None
        self._pending = None
        if pending is not None:
            pending._abandon()

    def close(self) -> None:
        """Stop publishing: give back a slot allocated and not published
        (publishing it afterwards delivers nothing) and clear this
        publisher's record, so tools no longer list it. ``send`` and
        ``allocate`` then raise ValueError. Also done by garbage collection."""
        if self._closed:
            return
        self._closed = True
        self._supersede_pending()
        if self._record is not None:
            self._record.release()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def _closed_error(self) -> ValueError:
        return ValueError(f"this publisher of {self._region.name} is closed")

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
            self._dropped += self._core.dropped
            self._use(new_region)
            self._rejoined += 1
        if self._record is not None:
            self._record.check_in(self._region, self._sent, self.dropped)

    def __repr__(self) -> str:
        return f"Publisher(region={self._region.name!r}, layout={self._region.layout}, dropped={self.dropped})"


def send_retrying(publisher: Publisher, data: Buffer, timeout_s: float) -> bool:
    """``publisher.send(data)``, retrying while the slot pool is empty (a
    pause of 1 ms, doubling up to 100 ms) for up to ``timeout_s`` seconds.
    False if the pool stayed empty that long. A retry reads only the free
    stack's top."""
    deadline = time.monotonic() + timeout_s
    pause = 0.001
    while True:
        try:
            publisher.send(data)
            return True
        except PoolEmptyError:
            if time.monotonic() >= deadline:
                return False
        time.sleep(pause)
        pause = min(pause * 2, 0.1)


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
        self._core = publisher._core  # the reservation is its: publish or give back through it
        self._region_name = publisher._region.name
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
        if self._core is not self._publisher._core:
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
        self._publisher._sent += 1
        return self._core.publish(self._slot, len)

    def __buffer__(self, flags: int) -> memoryview:
        if self._abandoned and not self._published:
            raise BufferError(
                "AllocatedSlot was superseded by a later Publisher.allocate(); its slot is back in the pool "
                "and writing through it would corrupt another reservation"
            )
        if self._published:
            raise BufferError("AllocatedSlot has already been published; its buffer is no longer writable")
        self._exports += 1
        return self._core.payload(self._slot, self._length)

    def __release_buffer__(self, view: memoryview) -> None:
        self._exports -= 1
        self._give_back_if_abandoned()

    def _abandon(self) -> None:
        """Give up an unpublished slot: it goes back to the pool once no
        buffer of it is alive (until then the core keeps it aside)."""
        if not (self._published or self._abandoned):
            self._abandoned = True
            self._core.set_aside(self._slot)
            self._give_back_if_abandoned()

    def _give_back_if_abandoned(self) -> None:
        if self._abandoned and not self._returned and self._exports == 0:
            self._returned = True
            self._core.give_back(self._slot)

    def __del__(self) -> None:
        if process.pid == self._owner_pid:  # not a forked child's copy
            self._abandon()

    def __repr__(self) -> str:
        return f"AllocatedSlot(len={self._length}, published={self._published}, region={self._region_name!r})"
