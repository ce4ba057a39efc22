"""Forwarding channels across hosts over Eclipse Zenoh: a bridge's exports and imports.

A bridge process forwards chosen local channels out to Zenoh (exports) and
chosen Zenoh keys into local channels (imports). Local channel ``/x`` is
published on key ``P/x`` (``P`` the key prefix, default
``kickmsg/<hostname>``).

What travels, and where:

- each message is one Zenoh sample: the payload bytes unchanged, and a
  40-byte attachment (``ATTACHMENT``): the exporter's epoch (a random number
  drawn when it starts exporting the channel, and again when the channel is
  re-created), a sequence number it assigns (0, 1, 2... within the epoch),
  the message's ring position, the wall-clock time it was forwarded, and how
  many messages the exporter has lost locally so far;
- the channel's geometry and schema descriptor (which holds the record type
  of a typed channel) are answered by a queryable on ``P/x/@description``,
  which an importer asks once per epoch it sees. Per message that costs
  nothing; a late importer gets it as well as an early one.

Losses: the exporter's own subscriber counts what it lost locally (its ring
overflowed, or the channel was re-created: see *Re-created regions*); an
importer counts gaps in the sequence numbers of each epoch (lost on the way)
and what it could not publish locally. A new epoch (the exporter restarted)
starts counting afresh at its first message received, so a restart is not
mistaken for a loss. An epoch the exporter started because its channel was
re-created names the epoch it follows and how many messages that one sent
(``follows``, ``follows_sent`` in its description): an importer that
followed that epoch counts what went missing between the two, at the source
(the exporter's rejoin) and on the way. Delivery is at most once.

A new epoch whose description differs from the local channel the importer
made re-creates that channel (``recreated``) and, before publishing into
it, waits for the subscribers attached to it to follow (``REJOIN_WAIT_S``
at most).

Threads: one per exported channel, blocked in ``Subscriber.receive_view``
(on a futex, without the GIL) and sending with Zenoh's blocking congestion
control, so a slow link overflows the local ring, where the loss is counted
(a channel re-created with no ring to spare is warned about once and tried
again every ``JOIN_RETRY_S``, the other channels going on); one per
imported key, blocked on a bounded queue that Zenoh's callback fills (a
full queue holds Zenoh back). An idle bridge sleeps.

Peers: a Zenoh transport listener follows the sessions connected to ours
(other bridges, routers); the bridge says when one arrives or leaves, and
warns each time it has none (at start too). Each channel's ``matched``
says whether the other side is there.

Figures for other processes: one more thread writes each channel's figures
every 0.5 s (never per message) into a record of the bridge's own beside
the local channel (``kickmsg.owners.BridgeEntry``, in
``/dev/shm/<name>.kickmsg-bridges``), locked for as long as the bridge
lives, so ``kickmsg.ops.diagnostics``, ``kickmsg stats`` and ``kickmsg
exporter`` show them and a killed bridge's record shows as dead. The
region's bytes never change. A record apart from the publisher records
because an exporting bridge is a subscriber of the channel, not a
publisher; an import is recorded once its channel exists.
"""
import dataclasses
import json
import queue
import secrets
import struct
import sys
import threading
import time
from typing import Any, TextIO

from kickmsg import jsontext
from kickmsg.bridge.options import (
    BridgeOptions,
    ImportSpec,
    check_options,
    export_key,
    zenoh_config,
    zenoh_module,
    zenoh_text,
)
from kickmsg.config import ChannelType, Config
from kickmsg.description import channel_config, describe, described_layout
from kickmsg.errors import BridgeError, RegionNotFoundError
from kickmsg.layouts import LAYOUT_9
from kickmsg import owners
from kickmsg.publisher import Publisher, send_retrying
from kickmsg.region import SharedRegion
from kickmsg.shm import object_size
from kickmsg.subscriber import Subscriber
from kickmsg.terminal import printable

__all__ = [
    "ATTACHMENT", "Bridge", "CREATOR", "ChannelFigures", "DESCRIPTION_CHUNK", "DESCRIPTION_RETRY_S",
    "DESCRIPTION_TIMEOUT_S", "EPOCHS_KEPT", "EpochState", "Exporter", "FigureRecords", "IMPORT_QUEUE_SIZE", "Importer",
    "JOIN_RETRY_S", "MAGIC", "RECEIVE_SLICE_S", "RECORD_INTERVAL_S", "REJOIN_POLL_S", "REJOIN_WAIT_S", "SEND_TIMEOUT_S",
    "SequenceTracker", "VERSION", "channel_changes", "channel_made_for", "figures_table", "followers",
    "open_local_channel", "recorded_subscribers", "recreate_local_channel", "report", "run",
]

ATTACHMENT = struct.Struct("<4sB3xQQQqQ")  # magic, version, epoch, sequence, ring_pos, forwarded_wall_ns, source_lost
MAGIC, VERSION = b"KMBR", 1
DESCRIPTION_CHUNK = "@description"  # a verbatim chunk: wildcards never match it
RECEIVE_SLICE_S = 0.1  # threads look at the stop flag at least this often
IMPORT_QUEUE_SIZE = 1024  # samples waiting for an import thread; a full queue holds Zenoh back
DESCRIPTION_TIMEOUT_S = 2.0
DESCRIPTION_RETRY_S = 1.0  # an importer without a description asks again at most this often
JOIN_RETRY_S = 1.0  # an exporter whose re-created channel has no ring to spare tries again this often
SEND_TIMEOUT_S = 0.1  # an importer waits at most this long for a free slot, then counts the message lost
REJOIN_WAIT_S = 5.0  # an importer that re-created its channel waits at most this long for its subscribers to follow
REJOIN_POLL_S = 0.01
EPOCHS_KEPT = 16  # per imported key: epochs whose sequence numbers are followed
RECORD_INTERVAL_S = 0.5  # how often the figures are written beside each channel for other processes
CREATOR = "kickmsg-bridge"


# -- descriptions: what an importer needs to create the channel -------------------------


def open_local_channel(
    name: str, key: str, description: dict[str, Any], override: Config | None, layout: int | None
) -> tuple[SharedRegion, list[str]]:
    """The local channel of an import: created as described (with
    ``override``'s geometry and ``layout`` when given) unless it exists; an
    existing one must have that layout, geometry and schema, unless a bridge
    made it for this key (its creator name says so): that one is re-created
    as described (the exported channel was re-created with another geometry
    or schema). Returns the channel and, if it was re-created, what changed."""
    try:
        channel_type, config = channel_config(description, override)
        wanted_layout = described_layout(description) if layout is None else layout
    except (KeyError, TypeError, ValueError) as error:  # another program answering on the key
        raise BridgeError(f"cannot import {key} into {name}: the description it sent is invalid ({error!r})") from None
    creator = f"{CREATOR} {key}"[:60]
    try:
        ours = channel_made_for(name, creator)
        changes = [] if ours is None else channel_changes(ours, channel_type, config, wanted_layout)
        if ours is not None and changes:
            region = recreate_local_channel(ours, channel_type, config, creator, wanted_layout)
        else:
            region = SharedRegion.create_or_open(name, channel_type, config, creator, layout=wanted_layout)
    except (RuntimeError, ValueError, OSError) as error:
        raise BridgeError(f"cannot import {key} into {name}: {str(error).splitlines()[0]}") from None
    if config.schema is not None:
        region.try_claim_schema(config.schema)
        if region.schema() != config.schema:
            raise BridgeError(
                f"cannot import {key} into {name}: the channel's schema is {region.schema()!r}, "
                f"{key} carries {config.schema!r}"
            )
    return region, changes


def channel_made_for(name: str, creator: str) -> SharedRegion | None:
    """Channel ``name`` (read-only) if a bridge made it for this import: its
    creator name is ``creator``. None for any other, or none."""
    try:
        region = SharedRegion.inspect(name)
    except (RuntimeError, OSError):  # no such channel, or not a usable one: create_or_open says why
        return None
    return region if region.info().creator_name == creator else None


def channel_changes(region: SharedRegion, channel_type: ChannelType, config: Config, layout: int) -> list[str]:
    """How an import's channel differs from what a description asks for
    (``pool_size 2048 -> 4096``); empty if it does not."""
    there = describe(region)
    wanted = {
        "layout": layout, "channel_type": int(channel_type), "max_subscribers": config.max_subscribers,
        "sub_ring_capacity": config.sub_ring_capacity, "pool_size": config.pool_size,
        "max_payload_size": config.max_payload_size, "commit_timeout_us": config.commit_timeout_us,
    }
    changes = [f"{field} {there[field]} -> {value}" for field, value in wanted.items() if there[field] != value]
    schema = region.schema()
    if config.schema is not None and schema is not None and schema != config.schema:
        changes.append(f"schema {schema.name!r} -> {config.schema.name!r}")
    return changes


def recreate_local_channel(old: SharedRegion, channel_type: ChannelType, config: Config, creator: str, layout: int) -> SharedRegion:
    """Re-create an import's channel as ``config`` says (in either layout,
    from either layout), then wait (at most REJOIN_WAIT_S) until the
    subscribers of this package that were attached to it have joined the
    new one (they follow a re-created region within 0.1 s), so that they
    miss nothing published next."""
    subscribers = followers(old, layout)
    region = SharedRegion.create(old.name, channel_type, config, creator, layout=layout)
    deadline = time.monotonic() + REJOIN_WAIT_S
    while recorded_subscribers(region) < subscribers and time.monotonic() < deadline:
        time.sleep(REJOIN_POLL_S)
    return region


def followers(old: SharedRegion, layout: int) -> int:
    """How many subscribers will follow ``old`` into a channel of ``layout``
    made under its name: its recorded subscribers, and none when the layout
    changes (a subscriber cannot follow a region re-created with the other
    layout: nothing to wait for)."""
    return recorded_subscribers(old) if old.layout == layout else 0


def recorded_subscribers(region: SharedRegion) -> int:
    """Live subscribers attached to the region that record themselves. On
    layout 4, those of this package (their owner records are locked; native
    subscribers record nothing). On layout 9, every Live ring whose owner
    has recorded itself in its header and is alive: a native 0.9.2
    subscriber records itself too but does not follow a re-created region,
    so with one attached the wait runs out (REJOIN_WAIT_S). A ring counts
    once its owner's pid is there (B.4 step 3), not as soon as it is Live
    (step 2): in between, the subscriber reads its start time from /proc,
    and only after step 3 does it read where it starts (step 4); what is
    published before that it never reads."""
    if region.layout == LAYOUT_9:
        dead = {index for index, _ in region.dead_subscriber_rings()}
        live = [index for index, ring in enumerate(region.stats().rings) if ring.state == "Live" and index not in dead]
        return sum(region.core.ring_words(index).owner_pid != 0 for index in live)
    records = owners.read_owners(region.name, region.geometry.max_subs) or []
    return sum(held and record is not None and record.region_created_at_ns == region.created_at_ns
               for record, held in records)


# -- figures ------------------------------------------------------------------------


@dataclasses.dataclass
class ChannelFigures:
    """What one forwarded channel did so far (counters only grow)."""

    direction: str  # "export" or "import"
    channel: str
    key: str
    messages_in: int = 0  # export: received from the ring; import: received from Zenoh
    messages_out: int = 0  # export: put to Zenoh; import: published into the channel
    bytes_out: int = 0
    lost_locally: int = 0  # export: the bridge's subscriber lost them; import: could not be published
    lost_on_way: int = 0  # import: gaps in the sequence numbers
    lost_at_source: int = 0  # import: what the exporting bridge reported losing locally meanwhile
    skipped: int = 0  # import: samples not from a bridge, or with a sequence number already passed
    epochs: int = 0  # import: exporter runs seen; export: epochs started (1, +1 per re-created channel)
    recreated: int = 0  # import: times the local channel was re-created for a new description of the key
    matched: bool = False  # export: an importer's subscriber matches the key; import: an exporter's description does
    error: str | None = None  # import: why the channel cannot be written; export: why it cannot be read now


# -- exporting --------------------------------------------------------------------


class Exporter:
    """One local channel forwarded to Zenoh, by a thread of its own."""

    def __init__(self, session: Any, name: str, key: str, stopping: threading.Event):
        zenoh = zenoh_module()
        self.name, self.key, self.stopping = name, key, stopping
        try:
            region = SharedRegion.open(name)
        except RegionNotFoundError:
            raise BridgeError(f"cannot export {name}: no such channel (start its publisher first)") from None
        self.subscriber = Subscriber(region)
        self.figures = ChannelFigures("export", name, key, epochs=1)
        self.epoch = secrets.randbits(64)
        self.description = jsontext.dumps(dict(describe(region), epoch=self.epoch)).encode()
        self.publisher = session.declare_publisher(key, congestion_control=zenoh.CongestionControl.BLOCK)
        self.queryable = session.declare_queryable(f"{key}/{DESCRIPTION_CHUNK}", self._answer)
        self.thread = threading.Thread(target=self._run, name=f"export {name}", daemon=True)

    def _answer(self, query: Any) -> None:
        """The queryable's callback (a Zenoh thread): the current description."""
        query.reply(query.key_expr, self.description)

    def _run(self) -> None:
        """Receive from the ring, put to Zenoh with the attachment."""
        figures, subscriber = self.figures, self.subscriber
        sequence, rejoined = 0, subscriber.rejoined
        while not self.stopping.is_set():
            try:
                view = subscriber.receive_view(RECEIVE_SLICE_S)
            except RuntimeError as error:  # re-created with no ring to spare: the old ring still ours, try again later
                self._cannot_join(str(error).splitlines()[0])
                self.stopping.wait(JOIN_RETRY_S)
                continue
            figures.lost_locally = subscriber.lost
            figures.matched = self.publisher.matching_status.matching
            if subscriber.rejoined != rejoined:  # the channel was re-created: a new epoch, maybe a new geometry
                if figures.error is not None:
                    figures.error = None
                    print(f"kickmsg bridge: {printable(self.name)} could be joined at last; exporting it again",
                          file=sys.stderr, flush=True)
                follows = dict(follows=self.epoch, follows_sent=sequence)  # the importer counts the rejoin's losses
                rejoined, sequence = subscriber.rejoined, 0
                self.epoch = secrets.randbits(64)
                self.description = jsontext.dumps(dict(describe(subscriber.region), epoch=self.epoch, **follows)).encode()
                figures.epochs += 1
            if view is None:
                continue
            with view:
                payload, ring_pos = bytes(view), view.ring_pos
            figures.messages_in += 1
            attachment = ATTACHMENT.pack(MAGIC, VERSION, self.epoch, sequence, ring_pos, time.time_ns(), subscriber.lost)
            self.publisher.put(payload, attachment=attachment)
            sequence += 1
            figures.messages_out += 1
            figures.bytes_out += len(payload)

    def _cannot_join(self, reason: str) -> None:
        """The re-created channel cannot be joined now: say so once."""
        if self.figures.error is None:
            print(f"kickmsg bridge: warning: not exporting {printable(self.name)} for now ({printable(reason)}); "
                  f"bridging the others, trying it again every {JOIN_RETRY_S:g} s", file=sys.stderr, flush=True)
        self.figures.error = reason

    def local_region(self) -> SharedRegion:
        """The channel it reads."""
        return self.subscriber.region

    def close(self) -> None:
        """Leave the ring (after the thread ended; closing the session
        withdraws the publisher and the queryable from Zenoh)."""
        self.subscriber.close()


# -- importing -------------------------------------------------------------------------


@dataclasses.dataclass
class EpochState:
    next_sequence: int
    source_lost: int
    first_sequence: int  # the first ones received: what an epoch it follows hands over to it
    first_source_lost: int
    linked: bool = False  # the losses between the epoch it follows and this one are counted


class SequenceTracker:
    """Counts an imported key's messages against the sequence numbers of
    each exporter run (epoch), the most recent ``EPOCHS_KEPT`` of them."""

    def __init__(self, figures: ChannelFigures):
        self.figures = figures
        self.epochs: dict[int, EpochState] = {}

    def admit(self, attachment: bytes | None) -> int | None:
        """Count one sample; its epoch if it is to be forwarded, None if it is
        skipped (not from a bridge, or a sequence number already passed)."""
        figures = self.figures
        if attachment is None or len(attachment) != ATTACHMENT.size or attachment[:5] != MAGIC + bytes([VERSION]):
            figures.skipped += 1
            return None
        _, _, epoch, sequence, _, _, source_lost = ATTACHMENT.unpack(attachment)
        state = self.epochs.get(epoch)
        if state is None:  # a new run: counted from its first message received
            state = self.epochs[epoch] = EpochState(sequence, source_lost, sequence, source_lost)
            figures.epochs += 1
            if len(self.epochs) > EPOCHS_KEPT:
                del self.epochs[next(iter(self.epochs))]
        if sequence < state.next_sequence:
            figures.skipped += 1
            return None
        figures.messages_in += 1
        figures.lost_on_way += sequence - state.next_sequence
        figures.lost_at_source += max(0, source_lost - state.source_lost)
        state.next_sequence, state.source_lost = sequence + 1, max(source_lost, state.source_lost)
        return epoch

    def link(self, epoch: int, previous: int, previous_sent: int) -> None:
        """``epoch`` follows ``previous`` (the exporter's channel was
        re-created), which sent ``previous_sent`` messages: once, count what
        went missing between them if both were followed: at the source
        (what the exporter lost meanwhile, its rejoin included) and on the
        way (the end of one, the start of the other)."""
        state, before = self.epochs.get(epoch), self.epochs.get(previous)
        if state is None or before is None or state.linked:
            return
        state.linked = True
        self.figures.lost_at_source += max(0, state.first_source_lost - before.source_lost)
        self.figures.lost_on_way += max(0, previous_sent - before.next_sequence) + state.first_sequence


class Importer:
    """One Zenoh key written into a local channel, by a thread of its own."""

    def __init__(self, session: Any, spec: ImportSpec, stopping: threading.Event):
        self.session, self.spec, self.stopping = session, spec, stopping
        self.figures = ChannelFigures("import", spec.name, spec.key)
        self.samples: queue.Queue[Any] = queue.Queue(IMPORT_QUEUE_SIZE)
        self.tracker = SequenceTracker(self.figures)
        self.described: set[int] = set()  # epochs whose description was checked against the channel
        self.publisher: Publisher | None = None
        self.next_ask = 0.0  # after a description asked in vain, not again before this time
        self.next_existence_check = 0.0
        self.subscriber = session.declare_subscriber(spec.key, self._enqueue)
        self.describer = session.declare_querier(f"{spec.key}/{DESCRIPTION_CHUNK}", timeout=DESCRIPTION_TIMEOUT_S)
        self.thread = threading.Thread(target=self._run, name=f"import {spec.name}", daemon=True)

    def _enqueue(self, sample: Any) -> None:
        """Zenoh's callback: hand the sample to the thread (waiting while the
        queue is full, which holds Zenoh back, unless the bridge stops)."""
        while not self.stopping.is_set():
            try:
                self.samples.put(sample, timeout=RECEIVE_SLICE_S)
                return
            except queue.Full:
                continue

    def _run(self) -> None:
        while not self.stopping.is_set():
            self.figures.matched = self.describer.matching_status.matching
            try:
                sample = self.samples.get(timeout=RECEIVE_SLICE_S)
            except queue.Empty:
                continue
            self._forward(sample)

    def _forward(self, sample: Any) -> None:
        """Count the sample's place in its epoch, then publish it locally."""
        figures = self.figures
        epoch = self.tracker.admit(None if sample.attachment is None else sample.attachment.to_bytes())
        if epoch is None:
            return
        # Publish: the channel as the epoch's description says (made again if it was removed).
        self._forget_a_removed_channel()
        if not self._channel_ready(epoch):
            figures.lost_locally += 1
            return
        payload = sample.payload.to_bytes()
        assert self.publisher is not None
        try:
            sent = send_retrying(self.publisher, payload, SEND_TIMEOUT_S)
        except ValueError:  # larger than the channel's slots (a geometry given in the config)
            sent = False
        if sent:
            figures.messages_out += 1
            figures.bytes_out += len(payload)
        else:
            figures.lost_locally += 1

    def _forget_a_removed_channel(self) -> None:
        """A local channel removed under the bridge (``kickmsg rm``) is created
        again for the next message, rather than written unseen into the
        unlinked memory; looked at every RECEIVE_SLICE_S at most."""
        now = time.monotonic()
        if self.publisher is None or now < self.next_existence_check:
            return
        self.next_existence_check = now + RECEIVE_SLICE_S
        if object_size(self.spec.name) is None:
            self.publisher, self.next_ask = None, 0.0
            self.described.clear()

    def _channel_ready(self, epoch: int) -> bool:
        """Ask the exporter for the epoch's description (once), and create or
        check the local channel; False while that is not possible."""
        if epoch in self.described:
            return self.figures.error is None
        if time.monotonic() < self.next_ask:
            return False
        description = self._ask_description()
        if description is None:
            self.next_ask = time.monotonic() + DESCRIPTION_RETRY_S
            return False
        self.described.add(epoch)
        self._link_epochs(epoch, description)
        try:
            region, changes = open_local_channel(self.spec.name, self.spec.key, description, self.spec.config, self.spec.layout)
        except BridgeError as error:
            if self.figures.error is None:
                print(f"kickmsg bridge: error: {printable(str(error))}", file=sys.stderr, flush=True)
            self.figures.error = str(error)
            return False
        self.figures.error = None
        if changes:
            self.figures.recreated += 1
            print(f"kickmsg bridge: {self.spec.key} is described anew: re-created {self.spec.name} "
                  f"({', '.join(changes)})", file=sys.stderr, flush=True)
        if self.publisher is None or changes:
            self.publisher = Publisher(region, name=CREATOR)  # its publisher record names the bridge
        return True

    def _link_epochs(self, epoch: int, description: Any) -> None:
        """If the epoch's description says which epoch it follows (the
        exporter's channel was re-created), count what went missing between
        the two."""
        if not isinstance(description, dict) or description.get("epoch") != epoch or "follows" not in description:
            return
        try:
            self.tracker.link(epoch, int(description["follows"]), int(description["follows_sent"]))
        except (KeyError, TypeError, ValueError):  # another program answering on the key: nothing to link
            return

    def _ask_description(self) -> dict[str, Any] | None:
        for reply in self.describer.get():
            if reply.ok is not None:
                try:
                    description: dict[str, Any] = json.loads(reply.ok.payload.to_bytes())
                    return description
                except ValueError:
                    continue
        return None

    def local_region(self) -> SharedRegion | None:
        """The channel it writes, once it could be opened."""
        return None if self.publisher is None else self.publisher.region


# -- figures for other processes ---------------------------------------------------------


class FigureRecords:
    """Each channel's figures, in a record of ours beside the channel."""

    def __init__(self) -> None:
        self.entries: dict[str, owners.BridgeEntry] = {}  # by channel (each is forwarded once)
        self.last: dict[str, tuple[float, int]] = {}  # by channel: time and bytes_out of the previous update

    def update(self, workers: list["Exporter | Importer"], peers: int) -> None:
        """Write every channel's figures and the bridge's number of peers now
        (claiming each record first)."""
        for worker in workers:
            region = worker.local_region()
            if region is None:
                continue
            figures = dataclasses.replace(worker.figures)
            entry = self.entries.get(figures.channel)
            if entry is None:
                entry = self.entries[figures.channel] = owners.BridgeEntry(region, figures.direction, figures.key)
            now = time.monotonic()
            then, bytes_then = self.last.get(figures.channel, (now, figures.bytes_out))
            self.last[figures.channel] = (now, figures.bytes_out)
            entry.update(region, owners.BridgeRecord(
                messages_in=figures.messages_in, messages_out=figures.messages_out, bytes_out=figures.bytes_out,
                lost_locally=figures.lost_locally, lost_on_way=figures.lost_on_way,
                lost_at_source=figures.lost_at_source, skipped=figures.skipped, epochs=figures.epochs,
                recreated=figures.recreated,
                bytes_per_s=(figures.bytes_out - bytes_then) / (now - then) if now > then else 0.0,
                matched=figures.matched, peers=min(peers, owners.MAX_BRIDGE_PEERS),
            ))

    def release(self) -> None:
        """Clear our records: the bridge stopped."""
        for entry in self.entries.values():
            entry.release()
        self.entries.clear()


# -- the bridge ----------------------------------------------------------------------


class Bridge:
    """Exports and imports over one Zenoh session; ``start``, then ``stop``."""

    def __init__(self, options: BridgeOptions):
        check_options(options)
        self.options = options
        self.stopping = threading.Event()
        self.session: Any = None
        self.exporters: list[Exporter] = []
        self.importers: list[Importer] = []
        self.records = FigureRecords()
        self.peers: set[str] = set()  # Zenoh ids of the sessions connected to ours (other bridges, routers)
        self.peers_lock = threading.Lock()
        self.peer_listener: Any = None
        self.recorder = threading.Thread(target=self._record, name="bridge figures", daemon=True)
        self.started = time.monotonic()

    def start(self) -> None:
        zenoh = zenoh_module()
        config = zenoh_config(self.options)
        try:
            self.session = zenoh.open(config)
        except Exception as error:  # zenoh's ZError: e.g. an endpoint it cannot listen on
            endpoints = " ".join([f"--listen {e}" for e in self.options.listen] + [f"--connect {e}" for e in self.options.connect])
            raise BridgeError(f"cannot open the Zenoh session ({endpoints or 'scouting only'}): {zenoh_text(error)}") from None
        self.peer_listener = self.session.info.declare_transport_events_listener(self._peer_event, history=True)
        with self.peers_lock:
            if not self.peers:
                self._warn_alone("no Zenoh peer connected yet")
        try:
            for name in self.options.exports:
                self.exporters.append(Exporter(self.session, name, export_key(self.options.key_prefix, name), self.stopping))
            for spec in self.options.imports:
                self.importers.append(Importer(self.session, spec, self.stopping))
        except BaseException:
            self.stop()
            raise
        for worker in self.workers():
            worker.thread.start()
        self.recorder.start()
        self.started = time.monotonic()

    def _peer_event(self, event: Any) -> None:
        """Zenoh's callback: a session connected to ours or left; say so."""
        zid, kind = str(event.transport.zid), str(event.transport.whatami)
        with self.peers_lock:
            if event.kind == zenoh_module().SampleKind.PUT:
                self.peers.add(zid)
                print(f"kickmsg bridge: {kind} {zid} connected ({len(self.peers)} connected)", file=sys.stderr, flush=True)
                return
            self.peers.discard(zid)
            if self.peers:
                print(f"kickmsg bridge: {kind} {zid} left ({len(self.peers)} connected)", file=sys.stderr, flush=True)
            else:
                self._warn_alone(f"{kind} {zid} left, no Zenoh peer connected")

    def _warn_alone(self, situation: str) -> None:
        """Say that nothing crosses: no Zenoh session is connected to ours."""
        reach = ", ".join([f"listening on {e}" for e in self.options.listen] + [f"connecting to {e}" for e in self.options.connect])
        print(f"kickmsg bridge: warning: {situation} ({reach or 'scouting'}): nothing crosses until one connects",
              file=sys.stderr, flush=True)

    def peer_count(self) -> int:
        """How many Zenoh sessions (other bridges, routers) are connected to ours."""
        with self.peers_lock:
            return len(self.peers)

    def _record(self) -> None:
        """The recorder thread: the figures beside each channel, now and
        every ``RECORD_INTERVAL_S`` until the bridge stops."""
        while True:
            self.records.update(self.workers(), self.peer_count())
            if self.stopping.wait(RECORD_INTERVAL_S):
                return

    def workers(self) -> list[Exporter | Importer]:
        return [*self.exporters, *self.importers]

    def figures(self) -> list[ChannelFigures]:
        """A copy of every channel's figures, exports first."""
        return [dataclasses.replace(worker.figures) for worker in self.workers()]

    def stop(self) -> None:
        """End the threads, leave the rings, clear the records, then close
        the Zenoh session (which withdraws every declaration). The session
        is closed even if a step before fails: a Zenoh session left open
        makes the interpreter's exit wait for it forever."""
        self.stopping.set()
        try:
            if self.peer_listener is not None:  # no peer event starts from now on
                self.peer_listener.undeclare()
                self.peer_listener = None
            for worker in self.workers():
                if worker.thread.is_alive():
                    worker.thread.join()
            for exporter in self.exporters:
                exporter.close()
            if self.recorder.is_alive():
                self.recorder.join()
            self.records.release()
        finally:
            if self.session is not None:
                self.session.close()
                self.session = None


def figures_table(figures: list[ChannelFigures], elapsed: float, rates: dict[str, float], peers: int) -> str:
    """The figures as aligned text columns."""
    head = ("direction", "channel", "key", "matched", "in", "out", "lost_locally", "lost_on_way", "bytes/s")
    rows = [head] + [
        (f.direction, printable(f.channel), printable(f.key), "yes" if f.matched else "no", str(f.messages_in),
         str(f.messages_out), str(f.lost_locally), str(f.lost_on_way) if f.direction == "import" else "-",
         f"{rates[f.key]:.0f}")
        for f in figures
    ]
    widths = [max(len(row[i]) for row in rows) for i in range(len(head))]
    lines = ["  ".join(cell.ljust(width) for cell, width in zip(row, widths)).rstrip() for row in rows]
    notes = [printable(f"{f.channel}: {f.error}") for f in figures if f.error]
    return f"after {elapsed:.1f} s, {peers} Zenoh peer(s) connected:\n" + "\n".join(lines + notes)


def report(figures: list[ChannelFigures], elapsed: float, rates: dict[str, float], peers: int, final: bool,
           as_json: bool, out: TextIO) -> None:
    if as_json:
        channels = [{**dataclasses.asdict(f), "bytes_per_s": rates[f.key]} for f in figures]
        print(jsontext.dumps({"final": final, "elapsed_s": round(elapsed, 3), "peers": peers, "channels": channels}),
              file=out, flush=True)
    else:
        print(figures_table(figures, elapsed, rates, peers), file=out, flush=True)


def run(options: BridgeOptions, stop: threading.Event, as_json: bool = False, out: TextIO = sys.stdout) -> list[ChannelFigures]:
    """Bridge until ``stop`` is set, printing the figures every
    ``options.stats_interval`` seconds and once more at the end."""
    bridge = Bridge(options)
    bridge.start()
    if not as_json:
        keys = [f"{f.channel} -> {f.key}" if f.direction == "export" else f"{f.key} -> {f.channel}" for f in bridge.figures()]
        print(f"bridging {printable(', '.join(keys))} (Ctrl-C stops)", file=out, flush=True)
    last_time, last_bytes = bridge.started, {f.key: 0 for f in bridge.figures()}
    try:
        while not stop.wait(options.stats_interval or 3600.0):
            if options.stats_interval is None:
                continue
            now, figures = time.monotonic(), bridge.figures()
            rates = {f.key: (f.bytes_out - last_bytes[f.key]) / max(now - last_time, 1e-9) for f in figures}
            report(figures, now - bridge.started, rates, bridge.peer_count(), False, as_json, out)
            last_time, last_bytes = now, {f.key: f.bytes_out for f in figures}
    finally:
        bridge.stop()
    elapsed, figures, peers = time.monotonic() - bridge.started, bridge.figures(), bridge.peer_count()
    report(figures, elapsed, {f.key: f.bytes_out / max(elapsed, 1e-9) for f in figures}, peers, True, as_json, out)
    return figures
