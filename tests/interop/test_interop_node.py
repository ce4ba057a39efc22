"""Interop with the native kickmsg 0.1.0 (layout 4) and 0.9.2 (layout 9:
the ``layout`` fixture) for the Node patterns, the schema descriptor and
typed channels.

The same snippets run under either implementation (see ``nativepeer``), so
each pattern is tested in both directions: topics (advertise on one side,
subscribe on the other), mailboxes, broadcast channels joined by one native
node and one of ours, schemas baked in at creation or claimed later, and a
typed channel of ours read by a plain native subscriber. Each test uses a
node prefix of its own under the session prefix.
"""

import numpy as np
import pytest

from kickmsg import ChannelType, Config, Node, SchemaInfo, SharedRegion, Subscriber
from kickmsg import typed
import rawregion
from conftest import new_shm_name
from nativepeer import CLAIM_SCHEMA, publish, race, start_native_of_layout, start_ours

DIRECTIONS = [("native", "ours"), ("ours", "native")]
CONFIG = {"max_subscribers": 4, "sub_ring_capacity": 128, "pool_size": 256, "max_payload_size": 256}
COUNT = 60

# Every test on layout 4 against 0.1.0, and on layout 9 against 0.9.2.
pytestmark = pytest.mark.usefixtures("layout")

SCHEMA = {
    "identity": bytes(range(1, 65)).hex(),
    "layout": bytes(range(65, 129)).hex(),
    "name": "demo.Pose",
    "version": 4,
    "identity_algo": 7,
    "layout_algo": 8,
    "flags": 9,
}

# -- snippets, run by either implementation ---------------------------------------------

SCHEMA_DICT = """
def schema_dict(info):
    if info is None:
        return None
    return {"identity": info.identity.hex(), "layout": info.layout.hex(), "name": info.name,
            "version": info.version, "identity_algo": info.identity_algo,
            "layout_algo": info.layout_algo, "flags": info.flags}
"""

COMMON = SCHEMA_DICT + """
node = kickmsg.Node(P["node"], P["prefix"])  # positional: 0.1.0 calls it prefix, 0.9.2 namespace
cfg = make_config(P.get("config", {}))
"""

# Receives make_payload messages up to P["last"].
READER = COMMON + """
if P["how"] == "subscribe":
    sub = node.subscribe(P["topic"])
elif P["how"] == "subscribe_or_create":
    sub = node.subscribe_or_create(P["topic"], cfg)
elif P["how"] == "create_mailbox":
    sub = node.create_mailbox(P["topic"], cfg)
ready()
result = receive_until(sub, P["last"], "mixed")
result["more"] = sub.try_receive() is not None
done(result)
"""

# Publishes make_payload(0 .. count-1) once told to go.
WRITER = COMMON + """
if P["how"] == "advertise":
    pub = node.advertise(P["topic"], cfg)
elif P["how"] == "advertise_or_join":
    pub = node.advertise_or_join(P["topic"], cfg)
elif P["how"] == "open_mailbox":
    pub = node.open_mailbox(P["owner"], P["topic"])
ready()
wait_go()
done(publish(pub, range(P["count"]), "mixed"))
"""

# Joins a broadcast channel, then (told to go) publishes its own messages
# and reads until it has the last of everyone's.
BROADCAST = COMMON + """
handle = node.join_broadcast(P["channel"], cfg)
assert handle.pub is not None and handle.sub is not None
ready()
wait_go()
publish(handle.pub, range(P["first"], P["first"] + P["count"]), "mixed")
result = receive_until(handle.sub, P["last"], "mixed")
result["more"] = handle.sub.try_receive() is not None
done(result)
"""

# Creates a topic (optionally with a schema) and exits; the region stays.
ADVERTISE_ONLY = COMMON + """
node.advertise(P["topic"], cfg)
done(schema_dict(node.topic_schema(P["topic"])))
"""

# Reads a topic's schema through the node and through a region of its own,
# optionally claiming one first.
SCHEMA_VIEW = COMMON + """
before = schema_dict(node.topic_schema(P["topic"]))  # never mapped: None
sub = node.subscribe(P["topic"])
claimed = None
if P.get("claim") is not None:
    info = make_config({"schema": P["claim"]}).schema
    if P.get("via") == "region":
        claimed = kickmsg.SharedRegion.open(P["name"]).try_claim_schema(info)
    else:
        claimed = node.try_claim_topic_schema(P["topic"], info)
done({
    "before": before,
    "claimed": claimed,
    "node": schema_dict(node.topic_schema(P["topic"])),
    "region": schema_dict(kickmsg.SharedRegion.open(P["name"]).schema()),
})
"""

# Collects P["count"] raw messages of a topic, as hex.
RAW_READER = COMMON + """
import time
sub = node.subscribe(P["topic"])
ready()
messages = []
deadline = time.monotonic() + 20
while len(messages) < P["count"] and time.monotonic() < deadline:
    data = sub.receive(0.1)
    if data is not None:
        messages.append(data.hex())
done({"messages": messages, "schema": schema_dict(node.topic_schema(P["topic"]))})
"""

RAW_WRITER = COMMON + """
pub = node.advertise_or_join(P["topic"], cfg)
for message in P["messages"]:
    assert pub.send(bytes.fromhex(message)) == len(message) // 2
done(None)
"""

def start(impl, code, **params):
    return (start_native_of_layout if impl == "native" else start_ours)(code, **params)


def run(impl, code, **params):
    with start(impl, code, **params) as peer:
        return peer.result()


def header(name: str) -> dict:
    return rawregion.header(rawregion.read_bytes(name))


def assert_all_received(result, published):
    """Every message once, each publisher's (seq // 1_000_000) in order."""
    seqs = result["seqs"]
    assert not result["timed_out"], f"got {len(seqs)} of {len(published)}"
    assert not result["more"]
    assert result["lost"] == 0
    assert sorted(seqs) == sorted(published)
    for publisher in {seq // 1_000_000 for seq in published}:
        mine = [seq for seq in seqs if seq // 1_000_000 == publisher]
        assert mine == sorted(mine)


def test_snippets_run_the_intended_implementations(prefix, layout):
    native = {4: "kickmsg-0.1.0/kickmsg.abi3.so", 9: "kickmsg-0.9.2/kickmsg/__init__.py"}[layout]
    assert run("native", COMMON + "done(kickmsg.__file__)", node="n", prefix=prefix).endswith(native)
    assert run("ours", COMMON + "done(kickmsg.__file__)", node="n", prefix=prefix).endswith("__init__.py")


# -- topics ---------------------------------------------------------------------------------


@pytest.mark.parametrize("writer, reader", DIRECTIONS)
def test_advertise_on_one_side_subscribe_on_the_other(prefix, writer, reader):
    """advertise creates /{prefix}_{topic} with the node as creator; the
    other implementation's node finds it by topic and receives everything."""
    params = dict(prefix=prefix, topic="imu", config=CONFIG)
    with start(writer, WRITER, node=f"{writer}-pub", how="advertise", count=COUNT, **params) as pub:
        pub.wait_ready()
        name = f"/{prefix}_imu"
        h = header(name)
        assert (h["creator_name"], h["creator_pid"], h["channel_type"]) == (f"{writer}-pub", pub.proc.pid, 1)
        with start(reader, READER, node=f"{reader}-sub", how="subscribe", last=[COUNT - 1], **params) as sub:
            sub.wait_ready()
            pub.tell()
            assert pub.result() == [1]
            assert_all_received(sub.result(), list(range(COUNT)))
    rawregion.assert_pool_whole(name)


@pytest.mark.parametrize("creator, joiner", DIRECTIONS)
def test_subscribe_or_create_and_advertise_or_join_across(prefix, creator, joiner):
    """One side's subscribe_or_create creates the topic, the other side's
    advertise_or_join (same config) joins it rather than replacing it."""
    params = dict(prefix=prefix, topic="t", config=CONFIG)
    with start(creator, READER, node=f"{creator}-sub", how="subscribe_or_create", last=[COUNT - 1], **params) as sub:
        sub.wait_ready()
        with start(joiner, WRITER, node=f"{joiner}-pub", how="advertise_or_join", count=COUNT, **params) as pub:
            pub.wait_ready()
            pub.tell()
            assert pub.result() == [1]
        assert_all_received(sub.result(), list(range(COUNT)))
    assert header(f"/{prefix}_t")["creator_name"] == f"{creator}-sub"


@pytest.mark.parametrize("creator, joiner", DIRECTIONS)
def test_advertise_or_join_with_another_config_is_refused_across(prefix, creator, joiner):
    run(creator, ADVERTISE_ONLY, node="first", prefix=prefix, topic="t", config=CONFIG)
    code = COMMON + """
try:
    node.advertise_or_join(P["topic"], cfg)
except RuntimeError as error:
    done(str(error))
"""
    message = run(joiner, code, node="second", prefix=prefix, topic="t", config=dict(CONFIG, pool_size=512))
    assert message.startswith(f"Config mismatch on existing region: /{prefix}_t")


# -- mailboxes ----------------------------------------------------------------------------------


@pytest.mark.parametrize("owner, sender", DIRECTIONS)
def test_mailbox_across_implementations(prefix, owner, sender):
    """The owner's create_mailbox makes /{prefix}_{owner}_mbx_{tag} with one
    subscriber slot; the other side's open_mailbox(owner, tag) writes to it."""
    owner_node = f"{owner}-owner"
    params = dict(prefix=prefix, topic="inbox", config=dict(CONFIG, max_subscribers=8))
    with start(owner, READER, node=owner_node, how="create_mailbox", last=[COUNT - 1], **params) as inbox:
        inbox.wait_ready()
        name = f"/{prefix}_{owner_node}_mbx_inbox"
        h = header(name)
        assert (h["max_subs"], h["creator_name"], h["pool_size"]) == (1, owner_node, 256)
        with start(sender, WRITER, node=f"{sender}-sender", how="open_mailbox", owner=owner_node,
                   count=COUNT, **params) as pub:
            pub.wait_ready()
            pub.tell()
            assert pub.result() == [1]
        assert_all_received(inbox.result(), list(range(COUNT)))
    rawregion.assert_pool_whole(name)


def test_native_mailbox_has_no_room_for_our_subscriber(prefix):
    """max_subscribers 1 as the native owner made it: our second
    subscriber is refused while the owner reads."""
    params = dict(prefix=prefix, topic="inbox", config=CONFIG)
    with start_native_of_layout(READER, node="owner", how="create_mailbox", last=[0], **params) as inbox:
        inbox.wait_ready()
        region = SharedRegion.open(f"/{prefix}_owner_mbx_inbox")
        with pytest.raises(RuntimeError, match="No free subscriber slots"):
            Subscriber(region)
        publish(Node("sender", prefix=prefix).open_mailbox("owner", "inbox"), [0])
        assert_all_received(inbox.result(), [0])


# -- broadcast ------------------------------------------------------------------------------------


@pytest.mark.parametrize("first, second", DIRECTIONS)
@pytest.mark.parametrize("config", ["default", "small"])
def test_broadcast_between_a_native_and_our_node(prefix, first, second, config):
    """Both join_broadcast the same channel (the first creates it, the
    second joins: same config hash, default config included); each
    receives its own and the other's messages."""
    cfg = {} if config == "default" else CONFIG
    count = 30  # each side publishes before reading: 2 x 30 fit the default ring of 64
    seqs = {"native": [1_000_000 + i for i in range(count)], "ours": [2_000_000 + i for i in range(count)]}
    last = [seqs["native"][-1], seqs["ours"][-1]]
    peers = {}
    try:
        for impl in (first, second):
            peers[impl] = start(impl, BROADCAST, node=f"{impl}-node", prefix=prefix, channel="chat", config=cfg,
                                first=seqs[impl][0], count=count, last=last)
            peers[impl].wait_ready()
        h = header(f"/{prefix}_broadcast_chat")
        assert (h["channel_type"], h["creator_name"]) == (2, f"{first}-node")
        for peer in peers.values():
            peer.tell()
        results = {impl: peer.result() for impl, peer in peers.items()}
    finally:
        for peer in peers.values():
            peer.kill()
    for impl, result in results.items():
        assert_all_received(result, seqs["native"] + seqs["ours"])
    rawregion.assert_pool_whole(f"/{prefix}_broadcast_chat")


# -- schema -----------------------------------------------------------------------------------------


@pytest.mark.parametrize("writer, reader", DIRECTIONS)
def test_schema_baked_in_at_advertise_is_read_across(prefix, writer, reader):
    """A Config.schema given to advertise on one side is what the other
    side's topic_schema and region.schema() return, once it mapped the topic."""
    name = f"/{prefix}_pose"
    assert run(writer, ADVERTISE_ONLY, node="w", prefix=prefix, topic="pose",
               config=dict(CONFIG, schema=SCHEMA)) == SCHEMA
    seen = run(reader, SCHEMA_VIEW, node="r", prefix=prefix, topic="pose", name=name)
    assert seen == {"before": None, "claimed": None, "node": SCHEMA, "region": SCHEMA}
    assert header(name)["schema_state"] == 2


@pytest.mark.parametrize("via", ["node", "region"])
@pytest.mark.parametrize("claimer, reader", DIRECTIONS)
def test_late_claim_is_visible_across(prefix, claimer, reader, via):
    """A topic created without a schema; one side claims it (through
    try_claim_topic_schema or region.try_claim_schema); the other side reads
    it and its own claim loses."""
    name = f"/{prefix}_pose"
    assert run(reader, ADVERTISE_ONLY, node="creator", prefix=prefix, topic="pose", config=CONFIG) is None
    claim = run(claimer, SCHEMA_VIEW, node="claimer", prefix=prefix, topic="pose", name=name, claim=SCHEMA, via=via)
    assert claim == {"before": None, "claimed": True, "node": SCHEMA, "region": SCHEMA}
    loser = dict(SCHEMA, name="too.Late", version=99)
    late = run(reader, SCHEMA_VIEW, node="reader", prefix=prefix, topic="pose", name=name, claim=loser, via=via)
    assert late == {"before": None, "claimed": False, "node": SCHEMA, "region": SCHEMA}


def test_multibyte_schema_name_cut_across(prefix):
    """A 200-byte name of 2-byte characters: ours is cut to 126 bytes (whole
    characters), which native reads back; native cuts at 127 bytes, inside
    a character, and we read the whole characters before it (the half
    character's replacement does not fit in 127 bytes)."""
    long_name = dict(SCHEMA, name="é" * 100)
    run("ours", ADVERTISE_ONLY, node="w", prefix=prefix, topic="ours", config=dict(CONFIG, schema=long_name))
    seen = run("native", SCHEMA_VIEW, node="r", prefix=prefix, topic="ours", name=f"/{prefix}_ours")
    assert seen["node"]["name"] == "é" * 63

    code = COMMON + """
node.advertise(P["topic"], cfg)
done(None)
"""
    run("native", code, node="w", prefix=prefix, topic="native", config=dict(CONFIG, schema=long_name))
    assert rawregion.read_bytes(f"/{prefix}_native")[256 + 128 : 256 + 256] == "é".encode() * 63 + b"\xc3\0"
    node = Node("r", prefix=prefix)
    node.subscribe("native")
    assert node.topic_schema("native").name == "é" * 63


def test_our_node_reads_a_native_schema_in_process(prefix):
    """In this process: topic_schema is None until our node maps the
    native topic, then equal to the SchemaInfo native wrote."""
    run("native", ADVERTISE_ONLY, node="w", prefix=prefix, topic="pose", config=dict(CONFIG, schema=SCHEMA))
    node = Node("reader", prefix=prefix)
    assert node.topic_schema("pose") is None
    node.subscribe("pose")
    expected = SchemaInfo(identity=bytes.fromhex(SCHEMA["identity"]), layout=bytes.fromhex(SCHEMA["layout"]),
                          name="demo.Pose", version=4, identity_algo=7, layout_algo=8, flags=9)
    assert node.topic_schema("pose") == expected
    assert node.try_claim_topic_schema("pose", SchemaInfo(name="other")) is False


def test_claim_race_between_native_and_our_processes():
    """Two native and two of our processes claim one region's schema at
    once: exactly one wins and every side reads the winner."""
    name = new_shm_name("claimrace")
    SharedRegion.create(name, ChannelType.PubSub, Config(**CONFIG))
    impls = ["native", "ours", "native", "ours"]
    won = race([start(impl, CLAIM_SCHEMA, name=name, who=f"{impl}-{index}") for index, impl in enumerate(impls)])
    assert won.count(True) == 1
    winner = won.index(True)
    assert SharedRegion.open(name).schema().name == f"{impls[winner]}-{winner}"
    read_back = SCHEMA_DICT + """
done(schema_dict(kickmsg.SharedRegion.open(P["name"]).schema())["name"])
"""
    assert run("native", read_back, name=name) == f"{impls[winner]}-{winner}"


# -- typed channels -------------------------------------------------------------------------------

Imu = typed.RecordType("Imu", [("stamp_ns", "<u8"), ("accel", "<f4", (3,)), ("ok", "?")])


def test_our_typed_channel_read_by_a_native_plain_subscriber(prefix):
    """Native sees plain bytes, equal to the records' bytes, and the
    descriptor typed baked in."""
    node = Node("typed-pub", prefix=prefix)
    pub = typed.advertise(node, "imu", Imu, Config(max_payload_size=4 * Imu.dtype.itemsize))
    batch = np.zeros(3, Imu.dtype)
    batch["stamp_ns"] = [10, 11, 12]
    batch["accel"] = np.arange(9, dtype="<f4").reshape(3, 3)
    batch["ok"] = [True, False, True]
    single = np.array([(7, (0.5, -0.5, 9.81), True)], dtype=Imu.dtype)
    with start_native_of_layout(RAW_READER, node="native-sub", prefix=prefix, topic="imu", count=3) as reader:
        reader.wait_ready()
        assert pub.send((7, (0.5, -0.5, 9.81), True)) == 1
        assert pub.send(batch) == 3
        slot = pub.allocate(2)
        slot.records[:] = batch[1:]
        slot.publish()
        result = reader.result()
    assert result["messages"] == [single.tobytes().hex(), batch.tobytes().hex(), batch[1:].tobytes().hex()]
    schema = result["schema"]
    assert schema["name"] == Imu.description
    assert bytes.fromhex(schema["identity"]) == Imu.schema.identity
    assert bytes.fromhex(schema["layout"]) == Imu.schema.layout
    assert (schema["identity_algo"], schema["layout_algo"]) == (Imu.schema.identity_algo, Imu.schema.layout_algo)


def test_native_plain_publisher_into_our_typed_channel(prefix):
    """Record bytes sent by a plain native publisher (advertise_or_join with
    the same geometry) arrive as records at our typed subscriber."""
    node = Node("typed-sub", prefix=prefix)
    cfg = Config(max_payload_size=4 * Imu.dtype.itemsize)
    typed.advertise(node, "imu", Imu, cfg)
    sub = typed.subscribe(node, "imu", Imu)
    records = np.zeros(2, Imu.dtype)
    records["stamp_ns"] = [5, 6]
    records["accel"][1] = [1, 2, 3]
    config = {"max_payload_size": cfg.max_payload_size}
    run("native", RAW_WRITER, node="native-pub", prefix=prefix, topic="imu", config=config,
        messages=[records.tobytes().hex(), records[:1].tobytes().hex()])
    first, second = sub.try_receive(), sub.try_receive()
    assert first.tobytes() == records.tobytes()
    assert first["accel"][1].tolist() == [1, 2, 3]
    assert second["stamp_ns"].tolist() == [5]
    assert sub.try_receive() is None
