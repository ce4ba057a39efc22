"""The compiled build against the pure one (kickmsg/build.py): the installed
package runs the modules of setup.py's COMPILED compiled (the atomics door,
the free stack, each layout's region, publish and receive, layout 9's
layout and words), KICKMSG_PURE=1 runs them from source (the shim through cffi), and
the same operations through each leave the same bytes in a region.

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
from conftest import ROOT, new_shm_name

pytestmark = pytest.mark.timeout(120)

# setup.py's COMPILED, as modules: what the installed build must run compiled.
COMPILED_MODULES = ["kickmsg.atomics", "kickmsg.protocol.freestack", "kickmsg.protocol.v4.publish",
                    "kickmsg.protocol.v4.receive", "kickmsg.protocol.v4.region", "kickmsg.protocol.v9.layout",
                    "kickmsg.protocol.v9.publish", "kickmsg.protocol.v9.receive", "kickmsg.protocol.v9.region",
                    "kickmsg.protocol.v9.words"]

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
print(json.dumps({"compiled": atomics.COMPILED, "modules": build.compiled_modules(), "stale": build.stale_modules(), "received": [each and each.hex() for each in received]}))
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
    assert compiled["modules"] == COMPILED_MODULES
    assert compiled["stale"] == [], "a compiled module is older than its source: rebuild (make test reinstalls)"
    assert pure["compiled"] is False and pure["modules"] == []
    assert compiled["received"] == pure["received"]
    assert all(compiled["received"])  # every try_receive found a message
    compiled_bytes, pure_bytes = (tmp_path / "compiled").read_bytes(), (tmp_path / "pure").read_bytes()
    assert len(compiled_bytes) == len(pure_bytes)
    differing = [offset for offset in range(len(pure_bytes)) if compiled_bytes[offset] != pure_bytes[offset]]
    assert differing, "the creator's pid differs between two processes: the dumps are not of two processes"
    assert without_identity(layout, compiled_bytes) == without_identity(layout, pure_bytes)


STALE = r"""
import json, sys, warnings
from kickmsg import build
build.SOURCE_DIGESTS = sys.argv[1]
with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    build.warn_if_stale()
print(json.dumps([str(warning.message) for warning in caught if warning.category is RuntimeWarning]))
"""


def test_a_compiled_module_older_than_its_source_is_warned_about(tmp_path):
    """When a compiled module's .py or .pxd differs from what setup.py
    recorded compiling (an edit not rebuilt), importing kickmsg warns,
    naming the module and how to run the edit; a matching record, or none,
    gives no warning."""
    record = json.loads((ROOT / "kickmsg" / "_compiled_sources.json").read_text())
    assert sorted(record) == COMPILED_MODULES
    outcomes = {}
    for case, digests in (("as built", record), ("freestack edited", {**record, "kickmsg.protocol.freestack": {".py": "0" * 64}}),
                          ("no record", None)):
        path = tmp_path / f"{case}.json"
        if digests is not None:
            path.write_text(json.dumps(digests))
        env = {key: value for key, value in os.environ.items() if key != "KICKMSG_PURE"}
        done = subprocess.run([sys.executable, "-c", STALE, str(path)], capture_output=True, text=True, env=env, timeout=60)
        assert done.returncode == 0, done.stderr
        outcomes[case] = json.loads(done.stdout)
    assert outcomes["as built"] == [] and outcomes["no record"] == []
    (message,) = outcomes["freestack edited"]
    assert message.startswith("compiled from an older source than the .py/.pxd beside it, so an edit there does not run: "
                              "kickmsg.protocol.freestack; rebuild") and "KICKMSG_PURE=1" in message
