"""The operation driver of ``kickmsg.verify.crosscheck`` (internal).

``Driver`` runs one cross-check operation at a time on a Kickmsg
implementation given as a module, and returns a JSON-ready result. The same
code runs on both sides: in-process with this package, and in the other
implementation's interpreter, which gets this file's source through ``-c``
and talks JSON lines over stdin/stdout (``main``). So the file imports no
part of kickmsg, and uses only the API that the native binding of the
layout under test has too: 0.1.0's on layout 4 (``allocate(len)``,
``publish()``), 0.9.2's on layout 9 (``allocate()``, ``publish(len)``).

Operations are JSON lists ``[kind, *args]``; handles (publishers ``p``,
slots ``s``, subscribers ``u``, views ``v``) are numbered by the operations
that make them, so a sequence replays exactly. An operation naming a handle
that does not exist returns ``"absent"``.
"""
import datetime
import gc
import json
import os
import sys
from types import ModuleType
from typing import Any

__all__ = [
    "Absent", "CREATOR", "Driver", "RING_STATES", "error_result", "main",
    "pattern",
]

CREATOR = "crosscheck"
RING_STATES = ("Free", "Live", "Draining", "Reclaiming")  # 0.9.2's RingStats.state values 0-3


def pattern(length: int, fill: int) -> bytes:
    """The payload bytes an operation writes: ``length`` bytes from ``fill``."""
    return bytes((fill + 7 * i) & 0xFF for i in range(length))


def error_result(error: BaseException) -> dict[str, str]:
    """An exception as a result: its nearest built-in class (implementations
    may raise subclasses of their own)."""
    for cls in type(error).__mro__:
        if cls.__module__ == "builtins":
            return {"error": cls.__name__}
    return {"error": type(error).__name__}


class Absent(Exception):
    """The operation names a handle that does not exist."""


class Driver:
    """One side of a cross-check: a region and the handles made on it, on
    channels of ``layout`` (4 or 9)."""

    def __init__(self, kickmsg: ModuleType, layout: int = 4) -> None:
        self.kickmsg = kickmsg  # either implementation: its objects are typed Any here
        self.layout = layout
        self.region: Any = None
        self.name = ""
        self.publishers: dict[int, Any] = {}
        self.slots: dict[int, Any] = {}  # AllocatedSlot handles
        self.slot_owner: dict[int, int] = {}  # slot id -> publisher id
        self.pending: dict[int, int] = {}  # publisher id -> its unpublished slot id
        self.subscribers: dict[int, Any] = {}
        self.views: dict[int, Any] = {}
        self.view_owner: dict[int, int] = {}  # view id -> subscriber id
        self.killed: list[Any] = []  # subscribers and views of killed subscribers: never used, never dropped

    def run(self, op: list[Any], name: str | None = None) -> Any:
        """Run one operation (``name``: the shm name for ``create``)."""
        kind, *args = op
        method = getattr(self, "op_" + kind, None)
        if method is None:
            return {"error": "UnknownOperation"}
        if kind == "create":
            args = [name, *args]
        elif self.region is None:
            return "no region"
        try:
            return method(*args)
        except Absent:
            return "absent"
        except Exception as error:
            return error_result(error)

    def drop_all(self) -> None:
        """Forget every handle and the region."""
        for table in (self.views, self.view_owner, self.slots, self.slot_owner, self.pending, self.subscribers,
                      self.publishers):
            table.clear()
        self.killed.clear()
        self.region = None
        gc.collect()

    @staticmethod
    def get(table: dict[int, Any], key: int) -> Any:
        if key not in table:
            raise Absent
        return table[key]

    # -- region -------------------------------------------------------------

    def op_create(
        self, name: str, channel_type: str, max_subscribers: int, capacity: int, pool_size: int, max_payload: int,
        commit_timeout_us: int | None = None,
    ) -> None:
        """A region of the driver's layout: this package is told which
        (``layout=``); a native binding has only its own."""
        self.drop_all()
        cfg = self.kickmsg.Config()
        cfg.max_subscribers = max_subscribers
        cfg.sub_ring_capacity = capacity
        cfg.pool_size = pool_size
        cfg.max_payload_size = max_payload
        if commit_timeout_us is not None:
            cfg.commit_timeout = datetime.timedelta(microseconds=commit_timeout_us)
        kind = getattr(self.kickmsg.ChannelType, channel_type)
        chosen = {"layout": self.layout} if hasattr(self.kickmsg, "layouts") else {}
        self.region = self.kickmsg.SharedRegion.create(name, kind, cfg, CREATOR, **chosen)
        self.name = name

    def op_diagnose(self) -> list[int]:
        h = self.region.diagnose()
        return [h.locked_entries, h.retired_rings, h.draining_rings, h.live_rings, bool(h.schema_stuck)]

    def op_stats(self) -> list[Any]:
        """0.9.2's ``stats()`` (layout 9): a ring's state as 0.9.2's int
        (this package gives its name)."""
        st = self.region.stats()
        rings = [
            [RING_STATES.index(r.state) if isinstance(r.state, str) else r.state, r.in_flight, r.write_pos,
             r.dropped_count, r.lost_count]
            for r in st.rings
        ]
        totals = [st.total_writes, st.total_drops, st.total_losses, st.total_steals, st.live_rings, st.pool_free, st.pool_size]
        return totals + [rings]

    def op_claim_schema(self, name: str, version: int) -> bool:
        info = self.kickmsg.SchemaInfo()
        info.name, info.version = name, version
        return self.region.try_claim_schema(info)

    def op_schema(self) -> list[Any] | None:
        info = self.region.schema()
        return None if info is None else [info.name, info.version]

    def op_reset_schema_claim(self) -> bool:
        return self.region.reset_schema_claim()

    def op_repair_locked_entries(self) -> int:
        return self.region.repair_locked_entries()

    def op_reset_retired_rings(self) -> int:
        return self.region.reset_retired_rings()  # the no-drain form: 0.1.0's only one

    def op_reclaim_orphaned_slots(self) -> int:
        return self.region.reclaim_orphaned_slots()

    # -- publishing ---------------------------------------------------------

    def op_publisher(self, p: int) -> None:
        self.publishers[p] = self.kickmsg.Publisher(self.region)

    def op_drop_publisher(self, p: int) -> None:
        """Drop the publisher and every slot handle it made: its unpublished
        slot goes back to the pool then in both implementations (0.1.0 gives
        it back when the publisher goes, which its slot handles keep alive)."""
        self.get(self.publishers, p)
        del self.publishers[p]
        self.pending.pop(p, None)
        for s in [s for s, owner in self.slot_owner.items() if owner == p]:
            self.slots.pop(s, None)
            del self.slot_owner[s]
        gc.collect()

    def op_send(self, p: int, length: int, fill: int) -> int:
        return self.get(self.publishers, p).send(pattern(length, fill))

    def op_allocate(self, p: int, length: int, s: int) -> int | None:
        """0.1.0's ``allocate(len)``. A successful allocate replaces the
        publisher's unpublished slot; that handle is dropped (0.1.0 lets it
        alias the new slot)."""
        slot = self.get(self.publishers, p).allocate(length)
        if slot is None:
            return None
        replaced = self.pending.pop(p, None)
        if replaced is not None:
            del self.slots[replaced], self.slot_owner[replaced]
        self.slots[s], self.slot_owner[s], self.pending[p] = slot, p, s
        return len(slot)

    def op_allocate_max(self, p: int, s: int) -> int | None:
        """0.9.2's ``allocate()``: a slot of max_size bytes. The slot it
        replaces goes back to the pool and is kept as a handle, superseded:
        0.9.2 refuses its buffer and its publish."""
        slot = self.get(self.publishers, p).allocate()
        if slot is None:
            return None
        self.pending.pop(p, None)
        self.slots[s], self.slot_owner[s], self.pending[p] = slot, p, s
        return slot.max_size

    def op_fill(self, s: int, fill: int) -> None:
        slot = self.get(self.slots, s)
        with memoryview(slot) as view:
            view[:] = pattern(len(view), fill)

    def op_publish(self, s: int) -> int:
        delivered = self.get(self.slots, s).publish()
        owner = self.slot_owner[s]
        if self.pending.get(owner) == s:
            del self.pending[owner]
        return delivered

    def op_publish_len(self, s: int, length: int) -> int:
        """0.9.2's ``publish(len)``: the first ``length`` bytes."""
        delivered = self.get(self.slots, s).publish(length)
        owner = self.slot_owner[s]
        if self.pending.get(owner) == s:
            del self.pending[owner]
        return delivered

    def op_drop_slot(self, s: int) -> None:
        self.get(self.slots, s)
        del self.slots[s]
        owner = self.slot_owner.pop(s)
        if self.pending.get(owner) == s:
            del self.pending[owner]
        gc.collect()

    def op_dropped(self, p: int) -> int:
        return self.get(self.publishers, p).dropped

    # -- subscribing --------------------------------------------------------

    def op_join(self, u: int) -> None:
        self.subscribers[u] = self.kickmsg.Subscriber(self.region)

    def op_leave(self, u: int) -> None:
        self.get(self.subscribers, u)
        del self.subscribers[u]
        gc.collect()

    def op_recv(self, u: int) -> str | None:
        data = self.get(self.subscribers, u).try_receive()
        return None if data is None else bytes(data).hex()

    def op_recv_view(self, u: int, v: int) -> list[int | str] | None:
        view = self.get(self.subscribers, u).try_receive_view()
        if view is None:
            return None
        self.views[v], self.view_owner[v] = view, u
        return [len(view), view.ring_pos, bytes(view).hex()]

    def op_release(self, v: int) -> None:
        self.get(self.views, v).release()
        del self.views[v], self.view_owner[v]

    def op_kill_subscriber(self, u: int) -> None:
        """The subscriber's process dies (layout 9): the subscriber and its
        views are kept out of reach, neither leaving the ring nor releasing
        their pins, until the region is dropped. The cross-check then
        records a dead owner in its ring (``crosscheck.bury``)."""
        self.killed.append(self.get(self.subscribers, u))
        del self.subscribers[u]
        for v in [v for v, owner in self.view_owner.items() if owner == u]:
            self.killed.append(self.views.pop(v))
            del self.view_owner[v]

    def op_lost(self, u: int) -> int:
        return self.get(self.subscribers, u).lost


def main() -> None:
    """The child side: ``python -I [-S] -c SOURCE LAYOUT [SEARCH_PATH]``.
    Prints a hello line naming the kickmsg it imported and its pid, then
    answers one JSON line per request line ``{"op": [...], "name": ...}``
    until stdin closes."""
    layout = int(sys.argv[1])
    search_path = sys.argv[2] if len(sys.argv) > 2 else ""
    if search_path:
        sys.path[0:0] = search_path.split(os.pathsep)
    import kickmsg

    hello = {"kickmsg": getattr(kickmsg, "__file__", None), "python": sys.version.split()[0], "pid": os.getpid()}
    print(json.dumps(hello), flush=True)
    driver = Driver(kickmsg, layout)
    for line in sys.stdin:
        request = json.loads(line)
        print(json.dumps(driver.run(request["op"], request.get("name"))), flush=True)
    driver.drop_all()


if __name__ == "__main__":
    main()
