"""Resident memory of ``import kickmsg`` plus opening a channel, for bench_core.py.

Run in a fresh process by bench_core.py, never by hand, as

    python    rss_probe.py ours   -          -        SHM_NAME   (ours9 too)
    python -S rss_probe.py native NATIVE_DIR SITE_DIR SHM_NAME   (native9 too)

Reads VmRSS and its parts (RssAnon, RssFile, RssShmem) from
/proc/self/status three times: at start (only the standard library's
``json`` and ``sys`` imported), after ``import kickmsg``, and after creating
a PubSub channel with the default Config, making a Publisher and a
Subscriber, and sending and receiving one 64-byte message. Prints one JSON
object. The region is unlinked before exit.
"""
import json
import sys

impl, native_dir, site_dir, shm_name = sys.argv[1:5]


def memory_kb() -> dict:
    fields = {}
    with open("/proc/self/status") as status:
        for line in status:
            key, _, value = line.partition(":")
            if key in ("VmRSS", "RssAnon", "RssFile", "RssShmem"):
                fields[key] = int(value.split()[0])
    return fields


start = memory_kb()
native = impl in ("native", "native9")
if native:
    assert sys.flags.no_site, "run the native probe with python -S"
    sys.path[0] = native_dir
    sys.path.append(site_dir)
import kickmsg  # noqa: E402

expected = {"native": ".so", "native9": "kickmsg-0.9.2/kickmsg/__init__.py"}.get(impl, "__init__.py")
assert kickmsg.__file__.endswith(expected), f"{impl}: unexpected module {kickmsg.__file__}"
imported = memory_kb()
modules_after_import = len(sys.modules)
region = kickmsg.SharedRegion.create(shm_name, kickmsg.ChannelType.PubSub, kickmsg.Config(), "kmbench")
try:
    publisher = kickmsg.Publisher(region)
    subscriber = kickmsg.Subscriber(region)
    publisher.send(bytes(64))
    assert subscriber.try_receive() == bytes(64)
    opened = memory_kb()
finally:
    region.unlink()
print(
    json.dumps(
        {
            "module": kickmsg.__file__,
            "start_kb": start,
            "imported_kb": imported,
            "opened_kb": opened,
            "modules_after_import": modules_after_import,
            "numpy_imported": "numpy" in sys.modules,
        }
    )
)
