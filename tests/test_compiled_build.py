"""The compiled build against the pure one (kickmsg/build.py): the installed
package runs its atomics door and its free stack compiled, KICKMSG_PURE=1
runs them from source (the shim through cffi), and the same operations
through each leave the same bytes in a region.

Each build runs in a process of its own (a process imports one build). The
operations wrap the ring, evict unread messages, drop a subscriber and hold
a reservation, on both layouts; the comparison leaves out only the words
that name the process or the time (the creator's pid and creation time, a
layout-9 ring owner's pid and start time)."""
import json
import os
import subprocess
import sys

import pytest

from kickmsg import shm
from kickmsg.protocol.v4 import layout as layout4
from kickmsg.protocol.v9 import layout as layout9
from conftest import new_shm_name

pytestmark = pytest.mark.timeout(120)

OPERATIONS = r"""
import json, os, sys
import kickmsg
from kickmsg import atomics, build
name, layout, dump = sys.argv[1], sys.argv[2], sys.argv[3]
os.environ["KICKMSG_LAYOUT"] = layout
config = kickmsg.Config(max_subscribers=4, sub_ring_capacity=8, pool_size=16, max_payload_size=96)
region = kickmsg.SharedRegion.create(name, kickmsg.ChannelType.PubSub, config, "compiled-or-pure")
publisher = kickmsg.Publisher(region)
subscribers = [kickmsg.Subscriber(region) for _ in range(3)]
received = []
for index in range(40):
    publisher.send(bytes([index]) * (index % 90 + 1))
    if index % 3 == 0:
        received.append(subscribers[0].try_receive())
    if index % 7 == 0:
        received.append(subscribers[1].try_receive())
subscribers[2].close()
held = publisher.allocate(50)
received.append(subscribers[0].try_receive())
with open("/dev/shm" + name, "rb") as file:
    open(dump, "wb").write(file.read())
print(json.dumps({"compiled": atomics.COMPILED, "modules": build.compiled_modules(), "received": [each and each.hex() for each in received]}))
"""


def run_operations(name: str, layout: int, dump: str, pure: bool) -> dict:
    environment = {key: value for key, value in os.environ.items() if key != "KICKMSG_PURE"}
    if pure:
        environment["KICKMSG_PURE"] = "1"
    done = subprocess.run([sys.executable, "-c", OPERATIONS, name, str(layout), dump], env=environment,
                          capture_output=True, text=True, timeout=100)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout)


def identity_words(layout: int, data: bytes) -> list[int]:
    """Offsets of the 8-byte words that name the process or the time."""
    module = layout4 if layout == 4 else layout9
    offsets = [module.Header.creator_pid.offset, module.CREATED_AT_OFFSET]
    if layout == 9:
        header = layout9.Header.from_buffer_copy(data)
        for ring in range(header.max_subs):
            start = header.sub_rings_offset + ring * header.sub_ring_stride
            offsets += [start + layout9.OWNER_PID_OFFSET, start + layout9.OWNER_STARTTIME_OFFSET]
    return offsets


def without_identity(layout: int, data: bytes) -> bytes:
    masked = bytearray(data)
    for offset in identity_words(layout, data):
        masked[offset:offset + 8] = bytes(8)
    return bytes(masked)


@pytest.mark.parametrize("layout", [4, 9])
def test_the_compiled_and_the_pure_build_leave_the_same_bytes(layout, tmp_path):
    names = [new_shm_name(f"build{layout}"), new_shm_name(f"build{layout}")]
    try:
        compiled = run_operations(names[0], layout, str(tmp_path / "compiled"), pure=False)
        pure = run_operations(names[1], layout, str(tmp_path / "pure"), pure=True)
    finally:
        for name in names:
            shm.unlink(name)
    assert compiled["compiled"] is True, "the installed build does not run its atomics door compiled (setup.py's COMPILED)"
    assert compiled["modules"] == ["kickmsg.atomics", "kickmsg.protocol.freestack"]
    assert pure["compiled"] is False and pure["modules"] == []
    assert compiled["received"] == pure["received"]
    assert all(compiled["received"])  # every try_receive found a message
    compiled_bytes, pure_bytes = (tmp_path / "compiled").read_bytes(), (tmp_path / "pure").read_bytes()
    assert len(compiled_bytes) == len(pure_bytes)
    differing = [offset for offset in range(len(pure_bytes)) if compiled_bytes[offset] != pure_bytes[offset]]
    assert differing, "the creator's pid differs between two processes: the dumps are not of two processes"
    assert without_identity(layout, compiled_bytes) == without_identity(layout, pure_bytes)
