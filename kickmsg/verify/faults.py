"""Fault injection for crash tests: stop a publisher at a crash point of the spec.

``crash_at(region, point)`` gives the region a watched copy of the hardware
atomics. When a publisher on that region reaches ``point``, the process calls
``notify(point)`` and stops itself with SIGSTOP, frozen exactly there, so a
test can SIGKILL it and look at what it left behind. The publish code has no
hook of its own: with the switch off, a region uses the plain hardware
atomics and pays nothing.

Crash points (spec, "Crash scenarios"):

- ``after_pop``: a slot was popped from the free stack (not yet published);
- ``after_refcount``: its refcount was pre-set to max_subs, no ring visited;
- ``mid_ring_loop``: delivered to some rings (their admission released),
  not to the rest;
- ``after_claim``: a ring position was claimed (write_pos fetch_add), the
  entry not locked yet;
- ``holding_lock``: the entry is LOCKED, its commit not stored.

``skip`` lets that many occurrences pass first (to crash in mid-stream).
"""
import os
import signal
import sys
from collections.abc import Callable

from kickmsg.atomics import Atomics
from kickmsg.protocol.v4 import layout
from kickmsg.protocol.v4.region import Region
from kickmsg.region import SharedRegion

__all__ = ["CRASH_POINTS", "CrashingAtomics", "crash_at"]

CRASH_POINTS = ("after_pop", "after_refcount", "mid_ring_loop", "after_claim", "holding_lock")


def _print_to_stderr(point: str) -> None:
    print(f"kickmsg.verify.faults: process {os.getpid()} stopped at {point}", file=sys.stderr, flush=True)


class CrashingAtomics(Atomics):
    """Hardware atomics that stop the process at one crash point."""

    def __init__(
        self, region: Region, point: str, skip: int = 0, notify: Callable[[str], object] = _print_to_stderr
    ) -> None:
        if point not in CRASH_POINTS:
            raise ValueError(f"unknown crash point {point!r}; choose one of {', '.join(CRASH_POINTS)}")
        self.point = point
        self.skip = skip
        self.notify = notify
        self._free_top = region.free_top_address
        self._write_positions = {ring.write_pos for ring in region.rings}
        self._state_flights = {ring.state_flight for ring in region.rings}
        self._pool = (region.slot_addresses.start, region.slot_addresses.stop)
        self._slot_stride = region.geometry.slot_stride

    def _reached(self, point: str) -> None:
        if point != self.point:
            return
        if self.skip:
            self.skip -= 1
            return
        self.notify(point)
        os.kill(os.getpid(), signal.SIGSTOP)

    def cas_acq_rel_u64(self, address: int, expected: int, desired: int) -> int:
        found = super().cas_acq_rel_u64(address, expected, desired)
        if found == expected and address == self._free_top:
            self._reached("after_pop")  # pops use cas_acq_rel; pushes use cas_release
        elif found == expected and desired == layout.LOCKED_SEQUENCE:
            self._reached("holding_lock")
        return found

    def store_release_u32(self, address: int, value: int) -> None:
        super().store_release_u32(address, value)
        start, end = self._pool
        if start <= address < end and (address - start) % self._slot_stride == layout.REFCOUNT_OFFSET:
            self._reached("after_refcount")  # the publish flow's step 3 (the pre-set is a release store)

    def fetch_add_acq_rel_u64(self, address: int, operand: int) -> int:
        previous = super().fetch_add_acq_rel_u64(address, operand)
        if address in self._write_positions:
            self._reached("after_claim")
        return previous

    def fetch_sub_release_u32(self, address: int, operand: int) -> int:
        previous = super().fetch_sub_release_u32(address, operand)
        if address in self._state_flights:
            self._reached("mid_ring_loop")  # one ring done, admission released
        return previous


def crash_at(
    region: SharedRegion, point: str, skip: int = 0, notify: Callable[[str], object] = _print_to_stderr
) -> None:
    """Arm ``point`` on ``region``, a layout-4 one (test-only; see the module docstring)."""
    if not isinstance(region.core, Region):
        raise ValueError(f"crash points are layout 4's: {region.name} is a layout-{region.layout} region")
    region.core.atomics = CrashingAtomics(region.core, point, skip, notify)
