"""The operation driver of ``kickmsg.crosscheck`` (internal).

``Driver`` runs one cross-check operation at a time on a Kickmsg
implementation given as a module, and returns a JSON-ready result. The same
code runs on both sides: in-process with this package, and in the other
implementation's interpreter, which gets this file's source through ``-c``
and talks JSON lines over stdin/stdout (``main``). So the file imports no
part of kickmsg, and uses only the API that the native 0.1.0 binding has too.

Operations are JSON lists ``[kind, *args]``; handles (publishers ``p``,
slots ``s``, subscribers ``u``, views ``v``) are numbered by the operations
that make them, so a sequence replays exactly. An operation naming a handle
that does not exist returns ``"absent"``.
"""
import gc
import json
import os
import sys
from types import ModuleType
from typing import Any

CREATOR = "crosscheck"


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
    """One side of a cross-check: a region and the handles made on it."""

    def __init__(self, kickmsg: ModuleType) -> None:
        self.kickmsg = kickmsg  # either implementation: its objects are typed Any here
        self.region: Any = None
        self.publishers: dict[int, Any] = {}
        self.slots: dict[int, Any] = {}  # AllocatedSlot handles
        self.slot_owner: dict[int, int] = {}  # slot id -> publisher id
        self.pending: dict[int, int] = {}  # publisher id -> its unpublished slot id
        self.subscribers: dict[int, Any] = {}
        self.views: dict[int, Any] = {}

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
        for table in (self.views, self.slots, self.slot_owner, self.pending, self.subscribers, self.publishers):
            table.clear()
        self.region = None
        gc.collect()

    @staticmethod
    def get(table: dict[int, Any], key: int) -> Any:
        if key not in table:
            raise Absent
        return table[key]

    # -- region -------------------------------------------------------------

    def op_create(
        self, name: str, channel_type: str, max_subscribers: int, capacity: int, pool_size: int, max_payload: int
    ) -> None:
        self.drop_all()
        cfg = self.kickmsg.Config()
        cfg.max_subscribers = max_subscribers
        cfg.sub_ring_capacity = capacity
        cfg.pool_size = pool_size
        cfg.max_payload_size = max_payload
        kind = getattr(self.kickmsg.ChannelType, channel_type)
        self.region = self.kickmsg.SharedRegion.create(name, kind, cfg, CREATOR)

    def op_diagnose(self) -> list[int]:
        h = self.region.diagnose()
        return [h.locked_entries, h.retired_rings, h.draining_rings, h.live_rings, bool(h.schema_stuck)]

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
        """A successful allocate replaces the publisher's unpublished slot;
        that handle is dropped (0.1.0 lets it alias the new slot)."""
        slot = self.get(self.publishers, p).allocate(length)
        if slot is None:
            return None
        replaced = self.pending.pop(p, None)
        if replaced is not None:
            del self.slots[replaced], self.slot_owner[replaced]
        self.slots[s], self.slot_owner[s], self.pending[p] = slot, p, s
        return len(slot)

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
        self.views[v] = view
        return [len(view), view.ring_pos, bytes(view).hex()]

    def op_release(self, v: int) -> None:
        self.get(self.views, v).release()
        del self.views[v]

    def op_lost(self, u: int) -> int:
        return self.get(self.subscribers, u).lost


def main() -> None:
    """The child side: ``python -I [-S] -c SOURCE [SEARCH_PATH]``. Prints a
    hello line naming the kickmsg it imported, then answers one JSON line
    per request line ``{"op": [...], "name": ...}`` until stdin closes."""
    search_path = sys.argv[1] if len(sys.argv) > 1 else ""
    if search_path:
        sys.path[0:0] = search_path.split(os.pathsep)
    import kickmsg

    print(json.dumps({"kickmsg": getattr(kickmsg, "__file__", None), "python": sys.version.split()[0]}), flush=True)
    driver = Driver(kickmsg)
    for line in sys.stdin:
        request = json.loads(line)
        print(json.dumps(driver.run(request["op"], request.get("name"))), flush=True)
    driver.drop_all()


if __name__ == "__main__":
    main()
