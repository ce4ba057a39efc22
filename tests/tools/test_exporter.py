"""``kickmsg exporter``: scraped over HTTP on 127.0.0.1 while real publisher
and subscriber processes run, parsed with prometheus_client's parser, the
numbers checked against what was sent and read; regions vanishing, being
re-created and corrupt under it; stopped by SIGTERM and SIGINT."""
import signal
import subprocess
import sys
import time
import urllib.request

import pytest
from prometheus_client.parser import text_string_to_metric_families

from conftest import ROOT
from kickmsg import Blackboard, BlackboardConfig, ChannelType, Config, SharedRegion, unlink_shm
from kickmsg import owners
from nativepeer import start_native9, start_ours
from test_cli import assert_one_line_error, cli, poke
from test_cli_boards import two_native_nodes

pytestmark = pytest.mark.timeout(120)

CONFIG = Config(max_subscribers=4, sub_ring_capacity=64, pool_size=128, max_payload_size=64)
WAIT_S = 20  # bound on waiting for the exporter to show a state

SUBSCRIBER = r"""
import time
region = kickmsg.SharedRegion.open(P["name"])
subscriber = kickmsg.Subscriber(region)
ready()
wait_go()
for _ in range(P["count"] - 1):
    if subscriber.receive(5.0) is None:
        raise SystemExit("nothing arrived")
time.sleep(0.15)  # past its check-in interval: the last receive's check-in records its read position
if subscriber.receive(5.0) is None:
    raise SystemExit("nothing arrived")
ready()
wait_go()
done("ok")
"""

PUBLISHER = r"""
import time
region = kickmsg.SharedRegion.open(P["name"])
publisher = kickmsg.Publisher(region, name="exporter-test")
for _ in range(P["count"]):
    publisher.send(b"m")
time.sleep(0.15)
publisher.send(b"last")  # its check-in records the first P["count"]
ready()
wait_go()
done("ok")
"""


class Exporter:
    """``kickmsg exporter`` on a free loopback port, for one prefix."""

    def __init__(self, prefix: str, interval: float = 0.1):
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "kickmsg", "exporter", "--port", "0", "--prefix", prefix, "--interval", str(interval)],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, cwd=ROOT,
        )
        line = self.proc.stdout.readline().decode()
        assert line.startswith("serving http://127.0.0.1:"), (line, self.proc.stderr.read().decode())
        self.url = line.split()[1]

    def scrape(self) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
        """Every sample, keyed by (name, sorted labels)."""
        with urllib.request.urlopen(self.url, timeout=10) as response:
            text = response.read().decode()
        return {
            (s.name, tuple(sorted(s.labels.items()))): s.value
            for family in text_string_to_metric_families(text) for s in family.samples
        }

    def wait_for(self, expected: dict) -> dict:
        """Scrape until every expected sample has its value (a key mapped to
        None: until it is absent); the last scrape."""
        deadline = time.monotonic() + WAIT_S
        while True:
            found = self.scrape()
            if all(found.get(key) == value for key, value in expected.items()):
                return found
            if time.monotonic() > deadline:
                pytest.fail(f"the exporter never showed {expected}; last scrape: {found}")
            time.sleep(0.05)

    def stop(self, number: int) -> int:
        self.proc.send_signal(number)
        _, err = self.proc.communicate(timeout=20)
        assert err == b"", err.decode()
        return self.proc.returncode

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.communicate(timeout=10)


@pytest.fixture
def exporter_for(prefix):
    started = []

    def start(interval: float = 0.1) -> Exporter:
        started.append(Exporter(prefix, interval))
        return started[-1]

    yield start
    for exporter in started:
        exporter.kill()


def channel(name: str) -> tuple[tuple[str, str], ...]:
    return (("channel", name),)


def ring(name: str, index: int) -> tuple[tuple[str, str], ...]:
    return (("channel", name), ("ring", str(index)))


def test_scraped_numbers_are_what_real_processes_sent_and_read(prefix, exporter_for, layout):
    name = f"/{prefix}_imu"
    SharedRegion.create(name, ChannelType.PubSub, CONFIG, "exporter-test")
    sent, read = 20, 5
    with start_ours(SUBSCRIBER, name=name, count=read) as subscriber:
        subscriber.wait_ready()  # joined ring 0, before the publisher starts
        with start_ours(PUBLISHER, name=name, count=sent) as publisher:
            publisher.wait_ready()  # sent sent + 1 messages
            subscriber.tell()
            subscriber.wait_ready()  # read `read` of them
            exporter = exporter_for()
            written = sent + 1
            if layout == 4:  # pending from the subscriber's record; no counters in the region
                expected = {("kickmsg_ring_pending", ring(name, 0)): written - read,
                            ("kickmsg_ring_dropped_total", ring(name, 0)): None, ("kickmsg_steals_total", channel(name)): None}
            else:  # the region's own counters; the read position is the subscriber's alone
                expected = {("kickmsg_ring_pending", ring(name, 0)): None,
                            ("kickmsg_ring_dropped_total", ring(name, 0)): 0, ("kickmsg_steals_total", channel(name)): 0}
            found = exporter.wait_for({("kickmsg_ring_write_position", ring(name, 0)): written, **expected})
            assert found[("kickmsg_ring_lost_total", ring(name, 0))] == 0
            assert found[("kickmsg_pool_slots", channel(name))] == 128
            assert found[("kickmsg_pool_free_slots", channel(name))] == 128 - written  # all still in the ring
            assert found[("kickmsg_live_rings", channel(name))] == 1
            assert found[("kickmsg_publishers", channel(name))] == 1
            assert found[("kickmsg_subscribers", channel(name))] == 1
            problems = {dict(labels)["kind"]: value for (metric, labels), value in found.items()
                        if metric == "kickmsg_health_problems"}
            assert "leaked slots" in problems and "stall publishers" in problems and set(problems.values()) == {0}
            assert ("kickmsg_ring_write_position", ring(name, 1)) not in found  # never used
            publisher.tell()
            publisher.result()
        subscriber.tell()
        subscriber.result()
    # Both processes ended: their records went with them.
    exporter.wait_for({("kickmsg_publishers", channel(name)): 0, ("kickmsg_subscribers", channel(name)): 0})
    assert exporter.stop(signal.SIGTERM) == 0
    owners.unlink(name)


def test_regions_vanishing_re_created_and_corrupt(prefix, exporter_for):
    name, broken = f"/{prefix}_a", f"/{prefix}_b_broken"
    SharedRegion.create(name, ChannelType.PubSub, CONFIG, "exporter-test")
    exporter = exporter_for()
    exporter.wait_for({("kickmsg_pool_slots", channel(name)): 128})

    SharedRegion.create(broken, ChannelType.PubSub, CONFIG, "exporter-test")
    poke(broken, 64, "<Q", 10**6)  # pool_size far beyond the object
    exporter.wait_for({
        ("kickmsg_health_problems", (("channel", broken), ("kind", "corrupt"))): 1,
        ("kickmsg_pool_slots", channel(broken)): None,
    })

    unlink_shm(name)
    exporter.wait_for({("kickmsg_pool_slots", channel(name)): None})
    SharedRegion.create(name, ChannelType.PubSub, Config(max_subscribers=2, sub_ring_capacity=8, pool_size=32), "again")
    exporter.wait_for({("kickmsg_pool_slots", channel(name)): 32, ("kickmsg_live_rings", channel(name)): 0})
    assert exporter.stop(signal.SIGINT) == 0
    unlink_shm(name)
    unlink_shm(broken)


def test_bad_port_and_a_port_in_use_are_one_line_errors(prefix, exporter_for):
    bad = cli("exporter", "--port", "70000")
    assert bad.code == 2 and bad.error_lines == [
        "kickmsg exporter: error: argument --port: must be a port number from 0 to 65535, not 70000 (see kickmsg exporter --help)"]
    running = exporter_for()
    taken = running.url.split(":")[2].split("/")[0]
    assert_one_line_error(cli("exporter", "--port", taken, "--prefix", prefix), "exporter",
                          f"cannot serve on 127.0.0.1:{taken}: ", "in use")
    # An address not on this host (TEST-NET-3: binding sends nothing), a name that does not resolve.
    assert_one_line_error(cli("exporter", "--bind", "203.0.113.7", "--port", "0", "--prefix", prefix), "exporter",
                          "cannot serve on 203.0.113.7:0: Cannot assign requested address")
    assert_one_line_error(cli("exporter", "--bind", "no-such-host.invalid", "--port", "0", "--prefix", prefix),
                          "exporter", "cannot serve on no-such-host.invalid:0: ")


NATIVE9_SUBSCRIBED = r"""
config = make_config(P["config"])
region = kickmsg.SharedRegion.create(P["name"], kickmsg.ChannelType.PubSub, config, "native-0.9.2")
subscriber = kickmsg.Subscriber(region)
publisher = kickmsg.Publisher(region)
for _ in range(P["count"]):
    publisher.send(b"m")
ready()
wait_go()
done("ok")
"""


def test_a_region_of_native_0_9_2_is_scraped(prefix, exporter_for):
    """A layout-9 region native 0.9.2 made and subscribes to: its rings'
    positions and counters from the region, its native subscriber counted,
    no problem, no publisher of ours."""
    name = f"/{prefix}_native9"
    with start_native9(NATIVE9_SUBSCRIBED, name=name, count=7,
                       config=dict(max_subscribers=4, sub_ring_capacity=64, pool_size=128, max_payload_size=64)) as native:
        native.wait_ready()
        found = exporter_for().wait_for({("kickmsg_ring_write_position", ring(name, 0)): 7})
        assert (found[("kickmsg_ring_lost_total", ring(name, 0))], found[("kickmsg_ring_dropped_total", ring(name, 0))]) == (0, 0)
        assert found[("kickmsg_steals_total", channel(name))] == 0
        assert found[("kickmsg_pool_free_slots", channel(name))] == 128 - 7
        assert (found[("kickmsg_live_rings", channel(name))], found[("kickmsg_subscribers", channel(name))]) == (1, 1)
        assert found[("kickmsg_publishers", channel(name))] == 0  # native publishers are unrecorded
        problems = [value for (metric, labels), value in found.items() if metric == "kickmsg_health_problems"]
        assert problems and set(problems) == {0}
        native.tell()
        assert native.result() == "ok"


def test_blackboards_and_registries_of_native_0_9_2_are_scraped(prefix, exporter_for):
    """Two native nodes, one killed: the board's keys, their writes, its
    dead owner and the age of its oldest value; the registry's rows and
    stalled ones. A damaged board is a health problem under its name."""
    board, registry = (("board", f"/{prefix}_bb_state"),), (("registry", f"/{prefix}_registry"),)
    with two_native_nodes(prefix) as (alive, killed):
        killed.proc.kill()
        killed.kill()
        broken = Blackboard.open_or_create(prefix, "broken", BlackboardConfig(capacity=2, max_value_size=40))
        poke(broken.name, 12, "<I", 0)  # capacity 0
        found = exporter_for().wait_for({
            ("kickmsg_blackboard_keys", board): 2, ("kickmsg_blackboard_updates_total", board): 2,
            ("kickmsg_blackboard_dead_owners", board): 1,
            ("kickmsg_registry_participants", registry): 6, ("kickmsg_registry_stalled", registry): 3,
            ("kickmsg_registry_topics", registry): 3,
            ("kickmsg_health_problems", (("channel", broken.name), ("kind", "corrupt"))): 1,
        })
        assert found[("kickmsg_blackboard_oldest_value_age_seconds", board)] >= 0
        alive.tell()
        alive.result()
