"""Prometheus metrics of every channel in /dev/shm (``kickmsg exporter``).

Every ``interval`` seconds the exporter attaches read-only to each Kickmsg
region (optionally only those named /PREFIX...), audits it, and keeps the
figures; ``/metrics`` (served by prometheus_client) shows the latest ones.
Labels: ``channel`` (the shm name) and ``ring``. A region that vanishes
stops being shown; one re-created under the same name is read afresh; one
that cannot be read is shown as a health problem (kind ``corrupt``,
``unsupported`` or ``unreadable``), never a crash. Bridges forwarding a
channel (``kickmsg bridge``) show with labels ``channel``, ``direction``
and ``key``, from their records (``diagnostics.BridgeFigures``).
Blackboards (label ``board``) and participant registries (label
``registry``), both layout 9's, show their keys and participants
(``diagnostics.BoardInfo``, ``RegistryInfo``); one that cannot be read is a
health problem under its name, as a channel is.
"""
import os
import sys
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass

from prometheus_client import start_http_server
from prometheus_client.core import CollectorRegistry, CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from kickmsg.ops import diagnostics
from kickmsg.ops.audit import audit

__all__ = [
    "ChannelCollector", "ChannelSample", "DEFAULT_INTERVAL_S", "DEFAULT_PORT", "gather", "one_bridge_per_label",
    "sample", "serve",
]

DEFAULT_PORT = 9464
DEFAULT_INTERVAL_S = 5.0


@dataclass
class ChannelSample:
    """One region at one refresh: a channel's figures, a registry's or a
    board's, or why there are none."""

    name: str
    stats: diagnostics.RegionStats | None = None
    health: diagnostics.HealthSnapshot | None = None
    registry: diagnostics.RegistryInfo | None = None
    board: diagnostics.BoardInfo | None = None
    unusable: str | None = None  # corrupt, unsupported, unreadable, busy (a board's lock)


def gather(prefix: str | None) -> list[ChannelSample]:
    """Read every Kickmsg region under ``prefix`` once: channels (read-only),
    participant registries and blackboards."""
    samples: list[ChannelSample] = []
    for entry in diagnostics.shm_objects(prefix):
        if diagnostics.is_sidecar(entry):
            continue
        name = "/" + entry.name
        try:
            kind = diagnostics.object_type(diagnostics.read_magic_and_version(entry.path))
        except FileNotFoundError:  # removed meanwhile
            continue
        except OSError:
            samples.append(ChannelSample(name, unusable="unreadable"))
            continue
        if kind is None:
            continue
        found = sample(name, entry.path, kind)
        if found is not None:
            samples.append(found)
    return samples


def sample(name: str, path: str, kind: str) -> ChannelSample | None:
    """One region's figures; None if it vanished meanwhile."""
    try:
        if kind == diagnostics.REGISTRY:
            return ChannelSample(name, registry=diagnostics.registry(name))
        if kind == diagnostics.BLACKBOARD:
            return ChannelSample(name, board=diagnostics.blackboard(name))
        region = diagnostics.attach(name)
        report = audit(region)
        return ChannelSample(name, diagnostics.region_stats(region, report), diagnostics.health_of(region, report))
    except diagnostics.BoardBusyError:
        return ChannelSample(name, unusable="busy")
    except diagnostics.RegionError as error:
        if not os.path.exists(path):
            return None
        return ChannelSample(name, unusable="unsupported" if str(error).startswith("unsupported") else "corrupt")
    except PermissionError:
        return ChannelSample(name, unusable="unreadable")
    except Exception as error:  # whatever a hostile region does to the audit, the exporter carries on
        print(f"kickmsg exporter: {name}: {type(error).__name__}: {error}", file=sys.stderr, flush=True)
        return ChannelSample(name, unusable="corrupt")


class ChannelCollector(Collector):
    """The latest samples as Prometheus metric families."""

    def __init__(self, prefix: str | None):
        self._prefix = prefix
        self._lock = threading.Lock()
        self._samples: list[ChannelSample] = []

    def refresh(self) -> None:
        samples = gather(self._prefix)
        with self._lock:
            self._samples = samples

    def collect(self) -> Iterator[Metric]:
        with self._lock:
            samples = list(self._samples)
        channel = ["channel"]
        ring = ["channel", "ring"]
        pool_slots = GaugeMetricFamily("kickmsg_pool_slots", "Slots in the channel's pool", labels=channel)
        free_slots = GaugeMetricFamily("kickmsg_pool_free_slots", "Slots on the free stack", labels=channel)
        live_rings = GaugeMetricFamily("kickmsg_live_rings", "Rings in state Live", labels=channel)
        publishers = GaugeMetricFamily(
            "kickmsg_publishers", "Live publishers of kickmsg-py (native publishers are not recorded)", labels=channel)
        subscribers = GaugeMetricFamily(
            "kickmsg_subscribers", "Live rings not held by a subscriber known to be dead", labels=channel)
        problems = GaugeMetricFamily(
            "kickmsg_health_problems", "Problems of each kind the audit found (0: none)", labels=["channel", "kind"])
        write_position = GaugeMetricFamily(
            "kickmsg_ring_write_position", "Messages ever written into the ring", labels=ring)
        lost = CounterMetricFamily(
            "kickmsg_ring_lost", "Messages the ring's subscriber lost (layout 4: subscribers of kickmsg-py only; "
            "layout 9: every ring)", labels=ring)
        dropped = CounterMetricFamily(
            "kickmsg_ring_dropped", "Deliveries publishers dropped on the ring (layout 9)", labels=ring)
        steals = CounterMetricFamily(
            "kickmsg_steals", "Locks publishers or repairs stole into skip markers (layout 9)", labels=channel)
        pending = GaugeMetricFamily(
            "kickmsg_ring_pending", "Messages written and not read yet (subscribers of kickmsg-py only)", labels=ring)
        bridge = ["channel", "direction", "key"]
        bridge_messages = CounterMetricFamily(
            "kickmsg_bridge_messages", "Messages a bridge forwarded: into Zenoh (export) or into the channel (import)",
            labels=bridge)
        bridge_bytes = CounterMetricFamily("kickmsg_bridge_bytes", "Payload bytes a bridge forwarded", labels=bridge)
        bridge_lost = CounterMetricFamily(
            "kickmsg_bridge_lost", "Messages a bridge counted lost: where=local (its ring or its publishing), "
            "way (gaps between the bridges, import), source (reported by the exporting bridge, import)",
            labels=[*bridge, "where"])
        bridge_up = GaugeMetricFamily("kickmsg_bridge_up", "1: the bridge runs; 0: its record is a dead bridge's",
                                      labels=bridge)
        bridge_peers = GaugeMetricFamily(
            "kickmsg_bridge_peers", "Zenoh sessions (other bridges, routers) connected to the bridge's", labels=bridge)
        bridge_matched = GaugeMetricFamily(
            "kickmsg_bridge_matched", "1: the other side is there (export: an importer subscribes to the key; "
            "import: an exporter describes it)", labels=bridge)
        board_keys = GaugeMetricFamily("kickmsg_blackboard_keys", "Keys on the blackboard", labels=["board"])
        board_updates = CounterMetricFamily(
            "kickmsg_blackboard_updates", "Writes of the board's present keys, summed (a swept key's go with it)",
            labels=["board"])
        board_oldest = GaugeMetricFamily(
            "kickmsg_blackboard_oldest_value_age_seconds", "Age of the board's oldest value (absent: no value written)",
            labels=["board"])
        board_dead = GaugeMetricFamily(
            "kickmsg_blackboard_dead_owners", "Keys whose owner died without releasing them", labels=["board"])
        registry_rows = GaugeMetricFamily(
            "kickmsg_registry_participants", "Rows of the namespace's participant registry in use", labels=["registry"])
        registry_stalled = GaugeMetricFamily(
            "kickmsg_registry_stalled", "Of them, rows whose process is gone", labels=["registry"])
        registry_topics = GaugeMetricFamily(
            "kickmsg_registry_topics", "Channels and boards the registry lists", labels=["registry"])
        for found in samples:
            if found.unusable is not None:
                problems.add_metric([found.name, found.unusable], 1)
                continue
            if found.board is not None:
                board = found.board
                board_keys.add_metric([found.name], len(board.keys))
                board_updates.add_metric([found.name], board.updates)
                board_dead.add_metric([found.name], board.dead_owners)
                if board.oldest_age_s is not None:
                    board_oldest.add_metric([found.name], board.oldest_age_s)
                continue
            if found.registry is not None:
                registry_rows.add_metric([found.name], found.registry.participants)
                registry_stalled.add_metric([found.name], found.registry.stalled)
                registry_topics.add_metric([found.name], len(found.registry.topics))
                continue
            stats, health = found.stats, found.health
            if stats is None or health is None:
                continue
            pool_slots.add_metric([found.name], stats.pool_size)
            free_slots.add_metric([found.name], stats.pool_free)
            live_rings.add_metric([found.name], stats.live_rings)
            publishers.add_metric([found.name], sum(p.alive for p in stats.publishers))
            subscribers.add_metric([found.name], sum(r.state == "Live" and r.owner_alive is not False for r in stats.rings))
            if stats.steals is not None:
                steals.add_metric([found.name], stats.steals)
            for kind, count in health.problems.items():
                problems.add_metric([found.name, kind], count)
            problems.add_metric([found.name, "stall publishers"], health.stall_publishers)
            for row in stats.rings:
                if row.state == "Free" and row.write_pos == 0:
                    continue  # never used
                labels = [found.name, str(row.ring)]
                write_position.add_metric(labels, row.write_pos)
                if row.lost is not None:
                    lost.add_metric(labels, row.lost)
                if row.pending is not None:
                    pending.add_metric(labels, row.pending)
                if row.dropped is not None:
                    dropped.add_metric(labels, row.dropped)
            for figures in one_bridge_per_label(stats.bridges):
                labels = [found.name, figures.direction, figures.key]
                bridge_messages.add_metric(labels, figures.messages_out)
                bridge_bytes.add_metric(labels, figures.bytes_out)
                bridge_up.add_metric(labels, 1 if figures.alive else 0)
                bridge_peers.add_metric(labels, figures.peers)
                bridge_matched.add_metric(labels, 1 if figures.matched else 0)
                bridge_lost.add_metric([*labels, "local"], figures.lost_locally)
                if figures.direction == "import":
                    bridge_lost.add_metric([*labels, "way"], figures.lost_on_way)
                    bridge_lost.add_metric([*labels, "source"], figures.lost_at_source)
        yield from (pool_slots, free_slots, live_rings, publishers, subscribers, steals, problems, write_position, lost,
                    dropped, pending,
                    bridge_messages, bridge_bytes, bridge_lost, bridge_up, bridge_peers, bridge_matched,
                    board_keys, board_updates, board_oldest, board_dead, registry_rows, registry_stalled, registry_topics)


def one_bridge_per_label(bridges: list[diagnostics.BridgeFigures]) -> list[diagnostics.BridgeFigures]:
    """One record per (direction, key), as the labels require: a live
    bridge's over a dead one's (a restarted bridge beside the record of its
    killed run), else the latest updated."""
    chosen: dict[tuple[str, str], diagnostics.BridgeFigures] = {}
    for figures in sorted(bridges, key=lambda b: (b.alive, b.updated_at_ns)):
        chosen[(figures.direction, figures.key)] = figures
    return list(chosen.values())


def serve(port: int, bind: str, prefix: str | None, interval: float, stop: threading.Event,
          on_ready: Callable[[str], None] | None = None) -> None:
    """Serve /metrics on ``bind``:``port`` (0: any free port), refreshing
    every ``interval`` seconds, until ``stop`` is set. ``on_ready`` gets the
    URL once the server listens."""
    collector = ChannelCollector(prefix)
    collector.refresh()
    registry = CollectorRegistry(auto_describe=False)
    registry.register(collector)
    try:
        server, thread = start_http_server(port, addr=bind, registry=registry)
    except OSError as error:  # an address not on this host, a port in use, a name that does not resolve
        raise OSError(f"cannot serve on {bind}:{port}: {error.strerror or error}") from None
    try:
        if on_ready is not None:
            host, bound_port = server.server_address[:2]
            on_ready(f"http://{host!s}:{bound_port}/metrics")
        while not stop.wait(interval):
            collector.refresh()
    finally:
        server.shutdown()
        server.server_close()
        thread.join()
