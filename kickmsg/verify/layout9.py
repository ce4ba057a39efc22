"""The explorer on layout 9: the real flows of ``kickmsg.protocol.v9``.

Publishers (``Publisher.allocate``, the payload, ``Publisher.publish``:
admission, position-tagged lock, wait for commit, steal of a stable lock
into a skip marker, meta takeover, commit by CAS, the seq_cst fence and the
wake) and subscribers (``Subscriber``: join, ``try_receive_view`` or the
blocking ``receive_view`` on the futex, leave and drain) run on a region in
private memory, one atomic step at a time (``kickmsg.verify.scheduler``),
under sequential consistency or the release/acquire model. Idle
subscribers (``Scenario9.idle``) join before the run and leave after it,
reading nothing: a Live ring for the publishers at no cost in steps.

Time is modelled (``ModelledClock``, read by the flows through
``Region.monotonic_ns``): it stands still while anyone can make progress,
and moves on by one commit timeout when the explorer chooses so (a stalled
actor: a preemption) or when every actor waits. A steal thus needs a lock
that stayed the same while a whole timeout passed, as B.8 wants. Publishers
and subscribers may die at any step (``deaths``, ``subscriber_deaths``):
each actor owns rings as a process of its own (``Region.process_identity``)
and is dead to ``Region.owner_is_dead`` once it died. The operator's repairs
may race the traffic: ``repair_locked_entries`` (``repairer``; its sleep of
a commit timeout is modelled, ``Region.sleep_ns``) and
``reclaim_dead_rings`` (``reclaimers``). Once every actor is done or dead,
the repairs for a quiet region run (``reclaim_dead_rings``,
``reset_retired_rings``, ``reclaim_orphaned_slots``) and the region must
be whole again.

The invariants, checked before every step and at the end:

1. the free stack has no cycle and links only to slots of the pool; a slot
   on it has refcount 0, no claim names it, nobody holds or pins it;
2. every other slot (not being published) has a refcount at least its
   claims plus its pins, and at most max_subs plus the subscribers' pins;
3. a commit replaces its own publisher's lock (a commit after a steal
   fails), a skip marker its own stealer's repairer lock; a steal takes a
   lock the stealer first saw one whole timeout before (B.8's proof: lock
   values are unique per position, so that lock stayed all along), or a
   commit more than one wrap behind its position; a claim only replaces an
   older position's claim; no ring counts more publishers in flight than
   there are; no actor but a ring's owner clears its owner_pid or frees it
   while the owner lives;
4. every sample a subscriber gets is the message committed at that ring
   position (not a skip marker, not a recycled slot), positions rising, each
   publisher's messages in order;
5. at the end: every ring Free with nobody in flight; a slot on the free
   stack has refcount 0 and no claim, any other one a refcount equal to its
   claims (> 0: else it leaked); received + lost is exactly the positions
   each live subscriber went past, and its ring's lost_count its losses (a
   ring left Live or Draining with no owner recorded by a subscriber that
   died is noted: no repair can reclaim it); under sc, if no publisher
   died, each live subscriber went past every position of its ring (its
   last look came after the publishers and the repairer had finished);
6. no lost wake-up: a subscriber asleep on the futex, with everyone else
   done, must have been woken if write_pos moved (unless the word's last
   writer died, maybe before its wake-up: the sleeper is woken by its
   timeout instead);
7. after the end: nothing lost beyond the bound (``lost``): at most one
   ring no repair reclaims per subscriber that died, and only the slots
   its entries claim (at most its capacity); every other ring can really
   be joined by a fresh subscriber, and is Free again once it left;
8. under sc, when nobody died: a position committed and never overwritten
   is received by every subscriber that went past it (a loss without cause);
9. under sc, when nobody died and every leave quiesced: every slot is back
   on the free stack at the end (each leave gave back its window's claims);
10. a subscriber whose join returned is its ring's recorded owner
    (owner_pid) while the ring is Live;
11. at the end a Free ring records no owner and no waiter;
12. under sc, a publish claims a position on every ring Live for the whole
    call (a subscriber's joined before it began); at the end an entry is
    left locked only by an actor that died, and steal_count counts every
    steal (one whose stealer died may be left out);
13. under sc, a publisher that finds the pool dry finds no slot on the
    free stack;
14. a leave gives up waiting for the publishers in flight (leaves its ring
    retired) only past its deadline: not before one commit timeout of
    modelled time has passed.
"""
import collections
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from kickmsg import shm
from kickmsg.atomics import HARDWARE
from kickmsg.errors import CapacityError
from kickmsg.protocol.v9 import publish as publish_module
from kickmsg.protocol.v9 import repair
from kickmsg.protocol.v9.layout import (
    CHANNEL_PUBSUB,
    DROPPED_COUNT_OFFSET,
    INVALID_SLOT,
    META_OFFSET,
    NEXT_FREE_OFFSET,
    REFCOUNT_OFFSET,
    RING_HEADER_SIZE,
    SEQ_REPAIR_BIT,
    SEQUENCE_OFFSET,
    SLOT_HEADER_SIZE,
    STATE_FLIGHT_OFFSET,
    LOST_COUNT_OFFSET,
    ENTRY_SIZE,
    HAS_WAITER_OFFSET,
    OWNER_PID_OFFSET,
    OWNER_STARTTIME_OFFSET,
    RING_DRAINING,
    RING_FREE,
    RING_LIVE,
    RING_STATE_MASK,
    U32_MAX,
    WRITE_POS_OFFSET,
)
from kickmsg.protocol.v9.publish import Publisher
from kickmsg.protocol.v9.receive import Subscriber
from kickmsg.protocol.v9.region import ChannelConfig, Region
from kickmsg.protocol.v9.words import (
    meta_precedes,
    meta_slot_field,
    meta_tag,
    publisher_lock,
    repairer_lock,
    seq_locked,
    seq_pos,
    seq_skip,
)
from kickmsg.verify import invariants
from kickmsg.verify.traces import describe_address, describe_meta, describe_sequence, describe_value
from kickmsg.verify.scheduler import (
    MAX_STEPS, Actor, Chooser, Execution, Mishaps, ModelledClock, Outcome, ScheduledAtomics, Step,
)
from kickmsg.verify.memory import SequentialMemory

__all__ = [
    "EVICTION", "MUTANT_SCENARIOS9", "RECEIVE_TIMEOUT_NS", "Scenario9", "TIMEOUT_US", "World9", "lost", "observed",
    "run_schedule",
]

TIMEOUT_US = 1000  # the commit timeout of the explored regions (modelled time)
OWNER_PIDS = 1000  # the pid an actor owns rings under: this plus its index
RECEIVE_TIMEOUT_NS = 1_000_000_000  # a blocking subscriber's receive timeout (modelled time)


@dataclass(frozen=True)
class Scenario9:
    """Who runs on a layout-9 region, and what may befall them."""

    publishers: int = 2
    messages: int = 1  # each publisher's
    sends: tuple[int, ...] = ()  # each publisher's message count, if given (overrides messages)
    subscribers: int = 1  # each joins, receives until the publishers (and the repairer) are over, leaves (drains)
    idle: int = 0  # rings joined before the run by subscribers that read nothing and leave after it
    capacity: int = 1
    pool: int = 3
    blocking: bool = False  # subscribers sleep on the futex (receive_view) instead of polling
    deaths: int = 0  # publishers that may die at any step
    subscriber_deaths: int = 0  # subscribers that may die at any step (their rings stay Live for reclaim_dead_rings);
    # with deaths too, at most deaths + subscriber_deaths actors die, publishers or subscribers
    repairer: bool = False  # an actor that runs repair_locked_entries() once, concurrently
    reclaimers: int = 0  # actors that each run reclaim_dead_rings() once, concurrently (a subscriber's join that
    # finds no Free ring runs it too)
    rings: int = 0  # max_subscribers (0: one per subscriber, idle ones too)
    payload: int = max(invariants.MESSAGE_SIZES)
    layout: int = 9
    leavers: int = 0  # subscribers that join and leave at once, while the publishers run (they read nothing)

    def config(self) -> ChannelConfig:
        return ChannelConfig(max_subscribers=self.rings or self.subscribers + self.idle + self.leavers,
                             sub_ring_capacity=self.capacity, pool_size=self.pool, max_payload_size=self.payload,
                             commit_timeout_us=TIMEOUT_US)

    def describe(self) -> str:
        mishaps = f", {self.deaths} publisher(s) may die" if self.deaths else ""
        mishaps += f", {self.subscriber_deaths} subscriber(s) may die" if self.subscriber_deaths else ""
        mishaps += ", a concurrent repair_locked_entries" if self.repairer else ""
        mishaps += f", {self.reclaimers} concurrent reclaim_dead_rings" if self.reclaimers else ""
        messages = "+".join(map(str, self.sends)) if self.sends else f"{self.publishers} x {self.messages}"
        idle = f", {self.idle} idle subscriber(s) (joined before, left after)" if self.idle else ""
        idle += f", {self.leavers} subscriber(s) joining and leaving at once" if self.leavers else ""
        return (f"layout 9: {self.publishers} publishers sending {messages} messages, {self.subscribers} "
                f"{'blocking' if self.blocking else 'polling'} subscriber(s){idle}, "
                f"{self.config().max_subscribers} ring(s) of {self.capacity}, pool {self.pool}, "
                f"stalls of a commit timeout{mishaps}")


# Two reclaimers, a subscriber that may die, another that joins the ring once
# it is given back (one ring; a join finding none Free reclaims too) and
# sleeps on it: 0.9.2's reclaim_dead_rings (the reclaim-0.9.2 mutant) evicts
# the live owner; ours does not (docs/explanation/verification.md, Layout 9).
EVICTION = Scenario9(publishers=0, subscribers=2, rings=1, blocking=True, subscriber_deaths=1, reclaimers=2)

# The small configuration, preemptions and stale reads at which the explorer
# finds each layout-9 mutant (kickmsg.verify.mutants.MUTANTS9). The steal
# and takeover mutants need no reader: an idle ring keeps the steps few.
# steal-unproven needs three unusual choices: the victim stopped between its
# claim and its lock, time passing while the stealer waits, and the victim
# stopped again right after its lock (the stealer first sees it then).
MUTANT_SCENARIOS9: dict[str, tuple[Scenario9, int, int]] = {
    "no-meta-tag-check": (Scenario9(publishers=1, messages=2), 2, 1),
    "steal-unproven": (Scenario9(subscribers=0, idle=1, pool=2), 3, 0),
    "meta-takeover-any": (Scenario9(subscribers=0, idle=1, sends=(1, 2), pool=2), 2, 0),
    "commit-plain-store": (Scenario9(subscribers=0, idle=1), 2, 0),
    "no-publisher-fence": (Scenario9(publishers=1, blocking=True), 1, 1),
    "no-subscriber-fence": (Scenario9(publishers=1, blocking=True), 1, 1),
    "pin-fetch-add": (Scenario9(), 1, 0),
    "repair-unproven": (Scenario9(publishers=1, subscribers=0, idle=1, repairer=True), 1, 0),
    "reclaim-no-recheck": (EVICTION, 2, 0),
    "reclaim-0.9.2": (EVICTION, 2, 0),
}


@dataclass
class World9:
    """One execution's region, actors, and what the checks follow."""

    region: Region
    actors: list[Actor]
    clock: ModelledClock
    execution: Execution | None = None
    sending: dict[str, bytes] = field(default_factory=dict)  # publisher -> the message it publishes now
    held: dict[str, int] = field(default_factory=dict)  # publisher -> the slot it allocated and publishes
    pins: collections.Counter[int] = field(default_factory=collections.Counter)  # slot -> views held
    subscribers: dict[str, Subscriber] = field(default_factory=dict)
    idle: list[Subscriber] = field(default_factory=list)  # joined before the run, leave after it
    rings: dict[str, int] = field(default_factory=dict)  # subscriber -> the ring it joined
    first_pos: dict[str, int] = field(default_factory=dict)  # subscriber -> where it began reading
    received: dict[str, list[tuple[int, int, bytes]]] = field(default_factory=dict)  # subscriber -> (ring, pos, bytes)
    committed: dict[tuple[int, int], bytes] = field(default_factory=dict)  # (ring, pos) -> the message committed
    sequences: dict[int, int] = field(default_factory=dict)  # sequence word -> value
    seen: dict[tuple[str, int, int], int] = field(default_factory=dict)  # (actor, sequence word, value) -> when the
    # actor first read that value there
    claims: dict[int, int] = field(default_factory=dict)  # meta word -> value
    owners: dict[int, str] = field(default_factory=dict)  # ring -> the actor whose pid its owner_pid holds
    lost_before: dict[str, int] = field(default_factory=dict)  # subscriber -> its ring's lost_count when it joined
    most_in_flight: int = 0  # publishers that may be in flight on a ring at once
    checked_steps: int = 0
    repaired: str = ""  # what the repairs at the end did
    unowned: list[int] = field(default_factory=list)  # rings left Live with no owner recorded (B.4's window)
    dry: str | None = None  # under sc, a publisher that found the pool dry with slots on the free stack
    gave_up: str | None = None  # a leave that gave up before its deadline (rule 14)
    lockers: dict[int, str] = field(default_factory=dict)  # sequence word -> the actor that stored its last lock
    steals: list[str] = field(default_factory=list)  # the actor of each steal (a repairer lock stored), in order
    broken: str | None = None  # the first publish that broke rule 12, as it returned
    left: list[Subscriber] = field(default_factory=list)  # the leavers' subscriptions, once they left


def _private_region(scenario: Scenario9) -> Region:
    config = scenario.config()
    geometry = config.geometry(CHANNEL_PUBSUB, len(b"verify"))
    region = Region(shm.Mapping.private("/kickmsg_verify9", geometry.total_size), geometry)
    region._initialise(b"verify", config)
    return region


def _world(scenario: Scenario9) -> World9:
    clock = ModelledClock()
    region = _private_region(scenario)
    region.monotonic_ns = clock.monotonic_ns
    world = World9(region, [], clock, most_in_flight=scenario.publishers)

    def sleep_ns(ns: int) -> None:
        assert world.execution is not None
        world.execution.sleep(ns)

    def process_identity() -> tuple[int, int]:
        """Each actor is a process of its own (the explorer, joining the idle rings: pid 1, never dead)."""
        actor = world.execution.current_actor() if world.execution else None
        return (OWNER_PIDS + actor.index if actor else 1), 1

    def owner_is_dead(pid: int, recorded_start: int) -> bool:
        actor = pid - OWNER_PIDS
        assert world.execution is not None
        return 0 <= actor < len(world.actors) and world.execution.looks_at([world.actors[actor]]) == ["dead"]

    region.sleep_ns = sleep_ns
    region.process_identity = process_identity
    region.owner_is_dead = owner_is_dead
    world.idle = [Subscriber(region) for _ in range(scenario.idle)]
    writers: list[Actor] = []  # the publishers, and the repairer (its skip markers are positions to go past)

    def writers_over() -> bool:
        assert world.execution is not None
        return all(state in ("done", "dead") for state in world.execution.looks_at(writers))

    def live_all_along() -> set[int]:
        """The rings that stay Live for a whole publish begun now: the idle
        subscribers' and those of the subscribers that joined (they leave
        once the publishers are over). None under ra (its relaxed pre-check
        may read a ring's state from before the join: nothing orders the
        join before the publish) or when a subscriber may die (a reclaim
        may then free its ring)."""
        assert world.execution is not None
        if scenario.subscriber_deaths or not isinstance(world.execution.memory, SequentialMemory):
            return set()
        return {receiver.ring_index for receiver in world.idle} | {world.rings[name] for name in world.subscribers}

    def payload_access(kind: str, slot: int, length: int) -> None:
        assert world.execution is not None
        address = region.base + region.geometry.slot_offset(slot) + SLOT_HEADER_SIZE
        world.execution.access_payload(kind, slot, address, length)

    def publisher(index: int) -> Callable[[Region], None]:
        name = f"pub{index}"

        def publish(region: Region) -> None:
            sender = Publisher(region)
            for sequence in range(scenario.sends[index] if scenario.sends else scenario.messages):
                data = invariants.message(index, sequence)
                slot = sender.allocate()
                if slot == INVALID_SLOT:
                    _found_dry(world, name)
                    continue  # this message is not published
                world.sending[name] = data
                world.held[name] = slot
                payload_access("write", slot, len(data))
                sender.payload(slot, len(data))[:] = data
                assert world.execution is not None
                live, first_step = live_all_along(), len(world.execution.outcome.steps)
                dropped = sender.dropped
                delivered = sender.publish(slot, len(data))
                del world.held[name]
                _note_publish(world, name, sequence, live, first_step, delivered, sender.dropped - dropped)
        return publish

    def joined(region: Region) -> Subscriber | None:
        """A subscription; every ring taken (fewer rings than subscribers): try
        again until one is given back, or None once the writers are over."""
        while True:
            try:
                return Subscriber(region)
            except RuntimeError:
                if writers_over():
                    return None

    def subscriber(name: str) -> Callable[[Region], None]:
        def subscribe(region: Region) -> None:
            receiver = joined(region)
            if receiver is None:
                return
            world.subscribers[name] = receiver
            world.rings[name] = receiver.ring_index
            world.first_pos[name] = receiver.read_pos
            world.lost_before[name] = HARDWARE.load_relaxed_u64(receiver.ring + LOST_COUNT_OFFSET)  # a dead one's
            while True:
                over = writers_over()  # before the last look: nothing is written after it
                if scenario.blocking:
                    view = receiver.receive_view_until(region.monotonic_ns() + RECEIVE_TIMEOUT_NS)
                else:
                    view = receiver.try_receive_view()
                if view is None:
                    if over:
                        break
                    continue
                slot = view.slot
                world.pins[slot] += 1
                payload_access("read", slot, len(view))
                world.received[name].append((receiver.ring_index, view.ring_pos, bytes(view)))
                world.pins[slot] -= 1  # before the release: the reference is dropped in it
                view.release()
            _leave(world, name, receiver)
        return subscribe

    def leaver(name: str) -> Callable[[Region], None]:
        def join_and_leave(region: Region) -> None:
            receiver = joined(region)
            if receiver is not None:
                world.left.append(receiver)
                _leave(world, name, receiver)
        return join_and_leave

    world.actors.extend(Actor(f"leaver{index}", leaver(f"leaver{index}")) for index in range(scenario.leavers))
    for index in range(scenario.subscribers):
        world.received[f"sub{index}"] = []
        world.actors.append(Actor(f"sub{index}", subscriber(f"sub{index}")))
    writers.extend(Actor(f"pub{index}", publisher(index)) for index in range(scenario.publishers))
    if scenario.repairer:
        writers.append(Actor("repair", repair.repair_locked_entries))
    world.actors.extend(writers)
    world.actors.extend(Actor(f"reclaim{index}", repair.reclaim_dead_rings) for index in range(scenario.reclaimers))
    return world


# -- the invariants ------------------------------------------------------------------------------


def _entry_word(region: Region, address: int) -> tuple[int, int, int] | None:
    """(ring, entry index, offset in the entry) if ``address`` is in an entry."""
    g = region.geometry
    offset = address - region.base - g.sub_rings_offset
    if not 0 <= offset < g.max_subs * g.ring_stride:
        return None
    ring, in_ring = divmod(offset, g.ring_stride)
    if in_ring < RING_HEADER_SIZE:
        return None
    entry, in_entry = divmod(in_ring - RING_HEADER_SIZE, ENTRY_SIZE)
    return ring, entry, in_entry


def _ring_word(region: Region, address: int) -> tuple[int, int] | None:
    """(ring, offset in its header) if ``address`` is in a ring header."""
    g = region.geometry
    offset = address - region.base - g.sub_rings_offset
    if not 0 <= offset < g.max_subs * g.ring_stride:
        return None
    ring, in_ring = divmod(offset, g.ring_stride)
    return (ring, in_ring) if in_ring < RING_HEADER_SIZE else None


def _stored(step: Step) -> int | None:
    """The value a step stored, if it stored one."""
    if step.operation.startswith("store_"):
        return step.operands[0]
    if step.operation.startswith("cas_") and step.result == step.operands[0]:
        return step.operands[1]
    return None


def _follow_owner(world: World9, step: Step, ring: int, offset: int) -> str | None:
    """Rule 3, on a ring header's step: a live owner is never evicted."""
    value = _stored(step)
    if value is None or offset not in (OWNER_PID_OFFSET, STATE_FLIGHT_OFFSET):
        return None
    owner = world.owners.get(ring)
    evicted = owner is not None and owner != step.actor and owner not in world.execution.died  # type: ignore[union-attr]
    if offset == OWNER_PID_OFFSET:
        if value:
            world.owners[ring] = step.actor
            return None
        world.owners.pop(ring, None)
        if evicted:
            return f"{step.actor} clears the owner of ring {ring}: {owner}, alive (a live owner is never evicted)"
    elif evicted and value & RING_STATE_MASK == RING_FREE:
        return (f"{step.actor} sets ring {ring} {describe_value('.state_flight', value, 9)} while {owner} owns it, "
                f"alive (a live owner is never evicted)")
    return None


def _follow(world: World9, step: Step) -> str | None:
    """Rule 3, on one step: commits, steals, claim takeovers, evictions."""
    region = world.region
    header = _ring_word(region, step.address)
    if header is not None:
        return _follow_owner(world, step, *header)
    where = _entry_word(region, step.address)
    if where is None:
        return None
    ring, entry, offset = where
    now = world.clock.now
    if offset == SEQUENCE_OFFSET and step.operation.startswith(("load_", "cas_")) and step.result is not None:
        world.seen.setdefault((step.actor, step.address, step.result), now)
    value = _stored(step)
    if value is None:
        return None
    if offset == SEQUENCE_OFFSET:
        _note_lock(world, step, value)
        before = world.sequences.get(step.address, 0)
        world.sequences[step.address] = value
        if not seq_locked(value) and not seq_skip(value):  # a commit of position value - 1
            if before != publisher_lock(value - 1):
                return (f"{step.actor} commits position {value - 1} of ring {ring} over "
                        f"{describe_sequence(before)}, not over its own lock (a commit after a steal must fail)")
            world.committed[(ring, value - 1)] = world.sending.get(step.actor, b"")
        elif seq_skip(value) and (before != repairer_lock(seq_pos(value) - 1)
                                  or world.lockers.get(step.address) != step.actor):
            return (f"{step.actor} stores {describe_sequence(value)} on ring {ring} entry {entry} over "
                    f"{describe_sequence(before)}, not over its own repairer lock (B.8 3: a steal takes the lock "
                    f"first)")
        elif value & SEQ_REPAIR_BIT and not seq_locked(before):
            # B.8 2, B.13: a commit (or skip) is stolen only when more than one wrap behind the steal's position
            if seq_pos(before) + region.geometry.capacity >= seq_pos(value) + 1:
                return (f"{step.actor} steals {describe_sequence(before)} on ring {ring} entry {entry} for "
                        f"position {seq_pos(value)}: not more than one wrap behind it (only a stale commit may be "
                        f"stolen)")
        elif value & SEQ_REPAIR_BIT and seq_locked(before) and not before & SEQ_REPAIR_BIT:
            # B.8's proof: the stealer saw this very lock (its value is unique to its position) a whole timeout ago
            seen_ns = now - world.seen[(step.actor, step.address, before)]
            if seen_ns < region.geometry.commit_timeout_us * 1000:
                return (f"{step.actor} steals {describe_sequence(before)} on ring {ring} entry {entry}, which it "
                        f"first saw {seen_ns} ns before, within the {region.geometry.commit_timeout_us * 1000} ns "
                        f"commit timeout (only a lock seen to stay a whole timeout may be stolen)")
    elif offset == META_OFFSET:
        before = world.claims.get(step.address, 0)
        world.claims[step.address] = value
        if meta_slot_field(value) and before and not meta_precedes(before, meta_tag(value) - 1):
            return (f"{step.actor} replaces the {describe_meta(before)} on ring {ring} entry {entry} by "
                    f"{describe_meta(value)}: not an older position's")
    return None


def _free_stack(region: Region) -> tuple[list[int], str | None]:
    slots: list[int] = []
    slot = HARDWARE.load_relaxed_u64(region.free_top_address) & U32_MAX
    while slot != INVALID_SLOT:
        if slot >= region.geometry.pool_size:
            return slots, f"the free stack links to slot {slot}, outside the pool"
        if slot in slots:
            return slots, f"the free stack reaches slot {slot} twice (a cycle)"
        slots.append(slot)
        slot = HARDWARE.load_relaxed_u32(region.slot_address(slot) + NEXT_FREE_OFFSET)
    return slots, None


def _claims(region: Region) -> collections.Counter[int]:
    """slot -> how many entries of all rings claim it."""
    g = region.geometry
    counted: collections.Counter[int] = collections.Counter()
    for ring in range(g.max_subs):
        for pos in range(g.capacity):
            field = meta_slot_field(HARDWARE.load_relaxed_u64(region.entry_address(ring, pos) + META_OFFSET))
            if field:
                counted[field - 1] += 1
    return counted


def _memory_violation(world: World9) -> str | None:
    """Rules 1 and 2."""
    region = world.region
    stacked, broken = _free_stack(region)
    if broken:
        return broken
    for ring in range(region.geometry.max_subs):
        in_flight = HARDWARE.load_relaxed_u32(region.ring_address(ring) + STATE_FLIGHT_OFFSET) >> 2
        if in_flight > world.most_in_flight:
            return f"ring {ring} has {in_flight} publishers in flight, of {world.most_in_flight} (an underflow?)"
    claims = _claims(region)
    held = set(world.held.values())  # their references are being handed out: only the end counts them
    most = region.geometry.max_subs + len(world.subscribers)
    for slot in range(region.geometry.pool_size):
        refcount = HARDWARE.load_relaxed_u32(region.slot_address(slot) + REFCOUNT_OFFSET)
        what = f"slot {slot} (refcount {refcount}, {claims[slot]} claim(s), {world.pins[slot]} view(s))"
        if slot in stacked:
            if refcount or claims[slot] or world.pins[slot]:
                return f"{what} is on the free stack"
        elif slot not in held and not claims[slot] + world.pins[slot] <= refcount <= most:
            return f"{what}: a reference was dropped twice or never counted"
    return None


def _found_dry(world: World9, name: str) -> None:
    """Under sc nothing ran since the pop's last look: the free stack must be empty."""
    assert world.execution is not None
    stacked, _ = _free_stack(world.region)
    if isinstance(world.execution.memory, SequentialMemory) and stacked and world.dry is None:
        world.dry = f"{name} found the pool dry with slot(s) {sorted(stacked)} on the free stack"


def _leave(world: World9, name: str, receiver: Subscriber) -> None:
    """The subscriber leaves; rule 14: if it gave up waiting (the ring left
    retired), its deadline, one commit timeout after the leave began, has
    passed: at least one timeout of modelled time."""
    if not receiver.close() and world.clock.now < TIMEOUT_US * 1000 and world.gave_up is None:
        world.gave_up = (f"{name}'s leave gave up waiting for the publishers in flight at {world.clock.now} ns, "
                         f"before its deadline (a commit timeout, {TIMEOUT_US * 1000} ns)")


def _delivery_violation(world: World9) -> str | None:
    """Rule 4."""
    for name, received in world.received.items():
        last_pos = -1
        last_of: dict[int, int] = {}  # publisher -> its last message's sequence
        for ring, pos, data in received:
            committed = world.committed.get((ring, pos))
            if committed != data:
                sent = "nothing was committed there" if committed is None else f"the commit there was {committed.hex()}"
                return f"{name} got {data.hex()} at ring {ring} position {pos}, but {sent}"
            if pos <= last_pos:
                return f"{name} got position {pos} after position {last_pos} (twice or out of order)"
            last_pos = pos
            publisher, sequence, _ = invariants.MESSAGE.unpack_from(data)
            if sequence <= last_of.get(publisher, -1):
                return f"{name} got pub{publisher}'s message {sequence} after its message {last_of[publisher]}"
            last_of[publisher] = sequence
    return None


def _let_time_pass(world: World9) -> None:
    """Once the run is over nobody else runs: time passes by one commit
    timeout at each look at the clock, so a leave (or a reclaim) waiting
    for a dead publisher's admission gives up (the ring is left retired,
    for the repairs)."""
    clock = world.clock

    def passing() -> int:
        clock.now += TIMEOUT_US * 1000
        return clock.now

    world.region.monotonic_ns = passing


def _leave_idle(world: World9) -> None:
    """The idle subscribers leave (drain) once the run is over."""
    _let_time_pass(world)
    for receiver in world.idle:
        receiver.close()


def _end_violation(world: World9, died: list[str]) -> str | None:
    """Rule 5, once every actor is done or dead (after the repairs if one died)."""
    region = world.region
    if world.idle:
        _leave_idle(world)
    if died:  # the operator's repairs, as the spec prescribes once no publisher runs
        _let_time_pass(world)
        dead = repair.reclaim_dead_rings(region)
        retired = repair.reset_retired_rings(region)
        pushed = repair.reclaim_orphaned_slots(region)
        world.repaired = (f"after {', '.join(died)} died: reclaim_dead_rings -> {dead}, reset_retired_rings -> "
                          f"{retired}, reclaim_orphaned_slots -> {pushed}")
    for ring in range(region.geometry.max_subs):
        state_flight = HARDWARE.load_relaxed_u32(region.ring_address(ring) + STATE_FLIGHT_OFFSET)
        owner_pid = HARDWARE.load_relaxed_u64(region.ring_address(ring) + OWNER_PID_OFFSET)
        state = state_flight & RING_STATE_MASK
        if state in (RING_LIVE, RING_DRAINING) and not owner_pid and any(name.startswith("sub") for name in died):
            # Its subscriber died between its claim and its owner_pid store (B.4 2-3), or between clearing
            # the owner and freeing the ring (B.12 3-4): pid 0 is never dead (B.16), so no repair reclaims
            # the ring. A leak the protocol allows, noted (docs: Layout 9), not a violation.
            world.unowned.append(ring)
            world.repaired += (f"; ring {ring} stays {describe_value('.state_flight', state_flight, 9)} with no owner "
                               f"recorded (a subscriber died at its claim or its leave): no repair reclaims it")
            continue
        if state_flight:
            return f"at the end ring {ring} is not Free with nobody in flight: state_flight {state_flight}"
        found = _owner_left_behind(region, ring)
        if found:
            return found
    stacked, broken = _free_stack(region)
    if broken:
        return broken
    claims = _claims(region)
    for slot in range(region.geometry.pool_size):
        if slot in stacked:
            continue
        refcount = HARDWARE.load_relaxed_u32(region.slot_address(slot) + REFCOUNT_OFFSET)
        if refcount != claims[slot] or not refcount:
            return f"at the end slot {slot} is off the free stack with refcount {refcount} and {claims[slot]} claim(s)"
    sequential = world.execution is not None and isinstance(world.execution.memory, SequentialMemory)
    for name, receiver in world.subscribers.items():
        if name in died:
            continue  # stopped anywhere: what it had counted is gone with it
        received = len(world.received[name])
        went_past = receiver.read_pos - world.first_pos[name]
        if received + receiver.lost != went_past:
            return (f"{name} received {received} and lost {receiver.lost}, but went past {went_past} positions "
                    f"({world.first_pos[name]} to {receiver.read_pos})")
        counted = HARDWARE.load_relaxed_u64(region.ring_address(world.rings[name]) + LOST_COUNT_OFFSET)
        counted -= world.lost_before[name]
        if counted != receiver.lost:
            return f"{name} lost {receiver.lost}, but its ring's lost_count says {counted}"
        write_pos = HARDWARE.load_relaxed_u64(region.ring_address(world.rings[name]) + WRITE_POS_OFFSET)
        if sequential and not any(name.startswith("pub") for name in died) and receiver.read_pos != write_pos:
            # Its last look came after every publisher had finished, each position committed or skipped
            # (under ra that one look may read older stores: a later one would see the commits).
            return f"{name} stopped at position {receiver.read_pos}, but its ring's write_pos is {write_pos}: unread"
    if sequential and not died:
        found = _loss_without_cause(world) or _pool_not_whole(world)
        if found:
            return found
    return _lost_violation(world, died) or _unjoinable(world) or _lock_violation(world, died)


def _unrecorded_owner(world: World9) -> str | None:
    """Rule 10: a subscriber whose join returned is its ring's recorded
    owner (its owner_pid) while the ring is Live: a reclaimer can tell
    whether it died (B.16)."""
    assert world.execution is not None
    for name, receiver in world.subscribers.items():
        if receiver.ring_index < 0 or world.owners.get(receiver.ring_index) == name or name in world.execution.died:
            continue
        state_flight = HARDWARE.load_relaxed_u32(receiver.ring + STATE_FLIGHT_OFFSET)
        if state_flight & RING_STATE_MASK == RING_LIVE:
            return (f"{name} joined ring {receiver.ring_index}, which is Live, but its owner_pid does not record it "
                    f"(no reclaimer could tell it died)")
    return None


def _owner_left_behind(region: Region, ring: int) -> str | None:
    """Rule 11, at the end, on a Free ring: no owner and no waiter recorded
    (B.12 step 3: a leave, or a reclaim for the dead owner, clears them)."""
    header = region.ring_address(ring)
    words = {"owner_pid": HARDWARE.load_relaxed_u64(header + OWNER_PID_OFFSET),
             "owner_starttime": HARDWARE.load_relaxed_u64(header + OWNER_STARTTIME_OFFSET),
             "has_waiter": HARDWARE.load_relaxed_u32(header + HAS_WAITER_OFFSET)}
    kept = [f"{word} {value}" for word, value in words.items() if value]
    if kept:
        return f"at the end ring {ring} is Free but still records {', '.join(kept)} (a leave clears its owner)"
    return None


def _loss_without_cause(world: World9) -> str | None:
    """Rule 8 (under sc, nobody died): a position committed and never
    overwritten (no later lap claimed its entry) is received by every
    subscriber that went past it: its commit, its claim and its slot's
    reference stay until the end, so nothing justifies a loss."""
    region = world.region
    for name, receiver in world.subscribers.items():
        ring = world.rings[name]
        write_pos = HARDWARE.load_relaxed_u64(region.ring_address(ring) + WRITE_POS_OFFSET)
        got = {pos for _, pos, _ in world.received[name]}
        for pos in range(world.first_pos[name], receiver.read_pos):
            if pos not in got and (ring, pos) in world.committed and write_pos <= pos + region.geometry.capacity:
                return (f"{name} lost position {pos} of ring {ring}, committed and never overwritten (write_pos "
                        f"{write_pos}): a loss without cause")
    return None


def _pool_not_whole(world: World9) -> str | None:
    """Rule 9 (under sc, nobody died): when every leave quiesced, each gave
    back its window's claims: at the end every slot is on the free stack."""
    if any(receiver.drain_timeouts for receiver in [*world.subscribers.values(), *world.idle, *world.left]):
        return None  # a ring left retired keeps its claims (reset_retired_rings does not drain)
    stacked, _ = _free_stack(world.region)
    if len(stacked) != world.region.geometry.pool_size:
        held = sorted(set(range(world.region.geometry.pool_size)) - set(stacked))
        return (f"at the end slot(s) {held} are off the free stack, though nobody died and every leave quiesced "
                f"(a leave gives back the claims of its window)")
    return None


def lost(world: World9) -> tuple[int, int]:
    """What the run lost for good, once the repairs at the end ran: the
    rings no repair reclaims (``World9.unowned``), and the slots their
    entries claim (no leave drains them)."""
    region = world.region
    claimed = set()
    for ring in world.unowned:
        for pos in range(region.geometry.capacity):
            field = meta_slot_field(HARDWARE.load_relaxed_u64(region.entry_address(ring, pos) + META_OFFSET))
            if field:
                claimed.add(field - 1)
    return len(world.unowned), len(claimed)


def _lost_violation(world: World9, died: list[str]) -> str | None:
    """Rule 7's bound: a ring and its capacity's slots per dead subscriber,
    nothing for a dead publisher (the repairs give back all it held)."""
    rings, slots = lost(world)
    dead_subscribers = sum(name.startswith("sub") for name in died)
    if rings > dead_subscribers or slots > rings * world.region.geometry.capacity:
        return (f"at the end {rings} ring(s) and {slots} slot(s) are lost for good, beyond the bound of one ring and "
                f"its {world.region.geometry.capacity} slot(s) per dead subscriber ({dead_subscribers} died)")
    return None


def _unjoinable(world: World9) -> str | None:
    """Rule 7: every ring but the lost ones is joined by a fresh subscriber
    (the explorer, pid 1), which then leaves it Free again."""
    region = world.region
    joined: list[Subscriber] = []
    try:
        while len(joined) < region.geometry.max_subs - len(world.unowned):
            joined.append(Subscriber(region))
    except CapacityError as error:
        return f"at the end, after the repairs, a fresh subscriber cannot join: {error}"
    finally:
        rings = [receiver.ring_index for receiver in joined]
        for receiver in joined:
            receiver.close()
    for ring in rings:
        state_flight = HARDWARE.load_relaxed_u32(region.ring_address(ring) + STATE_FLIGHT_OFFSET)
        if state_flight != RING_FREE:
            return (f"at the end ring {ring}, joined and left by a fresh subscriber, is "
                    f"{describe_value('.state_flight', state_flight, 9)}, not Free")
    return None


def _note_publish(world: World9, publisher: str, sequence: int, live: set[int], first_step: int, delivered: int,
                  dropped: int) -> None:
    """Rule 12, as a publish returns (its steps from ``first_step`` on): it
    claimed a position (write_pos fetch_add) on every ring Live for the
    whole call (``live``, taken as it began; B.6 3); it returns how many
    rings it committed to; each delivery it abandoned is counted on its
    ring's dropped_count (B.9); under sc it abandoned none (B.9) unless time
    passed (a wait or a lock gave up), an actor died or a repairer ran (a
    steal)."""
    region = world.region
    execution = world.execution
    assert execution is not None
    steps = [step for step in execution.outcome.steps[first_step:] if step.actor == publisher]
    claimed = {step.address for step in steps if step.operation.startswith("fetch_add")}
    counted = 0  # fetch_adds of a ring's dropped_count
    for step in steps:
        header = _ring_word(region, step.address)
        counted += step.operation.startswith("fetch_add") and header is not None and header[1] == DROPPED_COUNT_OFFSET
    missed = sorted(ring for ring in live if region.ring_address(ring) + WRITE_POS_OFFSET not in claimed)
    commits = 0
    for step in steps:
        where, value = _entry_word(region, step.address), _stored(step)
        if where is not None and where[2] == SEQUENCE_OFFSET and value is not None:
            commits += not seq_locked(value) and not seq_skip(value)
    quiet = (isinstance(execution.memory, SequentialMemory) and not world.clock.now and not execution.died
             and not any(actor.name == "repair" for actor in world.actors))
    broken = None
    if missed:
        broken = (f"{publisher}'s message {sequence} claimed no position on ring(s) {', '.join(map(str, missed))}, "
                  f"Live for the whole publish")
    elif delivered != commits:
        broken = (f"{publisher}'s publish of message {sequence} returned {delivered}, but it committed to "
                  f"{commits} ring(s)")
    elif counted != dropped:
        broken = (f"{publisher} abandoned {dropped} deliveries of message {sequence}, but counted {counted} on the "
                  f"rings' dropped_count")
    elif quiet and dropped:
        broken = (f"{publisher} abandoned {dropped} deliveries of message {sequence}, though no time passed, nobody "
                  f"died and no repairer ran")
    if world.broken is None:
        world.broken = broken


def _note_lock(world: World9, step: Step, value: int) -> None:
    """Who stored the last lock of a sequence word, and every steal."""
    if seq_locked(value):
        world.lockers[step.address] = step.actor
        if value & SEQ_REPAIR_BIT:
            world.steals.append(step.actor)


def _lock_violation(world: World9, died: list[str]) -> str | None:
    """Rule 12, at the end: an entry is left locked only by an actor that
    died (every live publisher commits or loses its lock, every live
    stealer turns its repairer lock into a skip marker), and steal_count
    counts every steal (one whose stealer died may be left uncounted)."""
    region = world.region
    g = region.geometry
    for ring in range(g.max_subs):
        for index in range(g.capacity):
            address = region.entry_address(ring, index) + SEQUENCE_OFFSET
            seq = HARDWARE.load_relaxed_u64(address)
            locker = world.lockers.get(address)
            if seq_locked(seq) and locker not in died:
                return (f"at the end ring {ring} entry {index} is left {describe_sequence(seq)} by {locker}, "
                        f"which did not die")
    counted = HARDWARE.load_relaxed_u64(region.steal_count_address)
    by_live = sum(stealer not in died for stealer in world.steals)
    if not by_live <= counted <= len(world.steals):
        return (f"at the end steal_count is {counted}, but {len(world.steals)} steal(s) were made "
                f"({by_live} by live actors)")
    return None


def _check(world: World9) -> Callable[[Execution], str | None]:
    def check(execution: Execution) -> str | None:
        for step in execution.outcome.steps[world.checked_steps :]:
            found = _follow(world, step)
            if found:
                return found
        world.checked_steps = len(execution.outcome.steps)
        found = (world.broken or world.dry or world.gave_up or _memory_violation(world) or _delivery_violation(world)
                 or _unrecorded_owner(world))
        if found is None and all(actor.state in ("done", "dead") for actor in world.actors):
            found = _end_violation(world, execution.died)
        return found
    return check


def run_schedule(scenario: Scenario9, choose: Chooser, memory_model: str = "sc",
                 max_steps: int = MAX_STEPS) -> tuple[World9, Outcome]:
    """Run every actor once, under the choices ``choose`` makes (a livelock
    after ``max_steps`` steps)."""
    world = _world(scenario)
    mortal = tuple(f"pub{i}" for i in range(scenario.publishers) if scenario.deaths)
    mortal += tuple(f"sub{i}" for i in range(scenario.subscribers) if scenario.subscriber_deaths)
    mishaps = Mishaps(world.clock, TIMEOUT_US * 1000, mortal, scenario.deaths + scenario.subscriber_deaths,
                      lambda address: describe_address(world.region, address) + " (low 32 bits)")
    execution = Execution(world.region, world.actors, choose, _check(world), memory_model, max_steps=max_steps,
                          mishaps=mishaps)
    world.execution = execution
    world.region.atomics = ScheduledAtomics(execution)
    # Bounded retry loops, cut short: the modelled clock is read at every
    # spin, and one failed lock attempt exhausts the lock loop (64 reloads
    # take no time: a lock holder stalled over one reload is stalled over 64).
    spins, attempts = publish_module.SPINS_PER_CLOCK_CHECK, publish_module.LOCK_ATTEMPTS
    publish_module.SPINS_PER_CLOCK_CHECK = publish_module.LOCK_ATTEMPTS = 1
    try:
        return world, execution.run()
    finally:
        publish_module.SPINS_PER_CLOCK_CHECK, publish_module.LOCK_ATTEMPTS = spins, attempts
        world.region.atomics = HARDWARE  # for finalizers that run later, outside any schedule
        _leave_idle(world)  # if a violation ended the run early (else done already)


def observed(world: World9) -> dict[str, Any]:
    """What an execution ended with (for tests): received, lost, steals."""
    return {
        "received": {name: [pos for _, pos, _ in got] for name, got in world.received.items()},
        "lost": {name: receiver.lost for name, receiver in world.subscribers.items()},
        "steals": HARDWARE.load_relaxed_u64(world.region.steal_count_address),
        "lost_count": [HARDWARE.load_relaxed_u64(world.region.ring_address(r) + LOST_COUNT_OFFSET)
                       for r in range(world.region.geometry.max_subs)],
    }
