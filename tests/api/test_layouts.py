"""Both layouts through one API: choosing the layout of a new region, open
and inspect reading the version word, identities, info/stats, and 0.9.2's
Python API (allocate() and AllocatedSlot, ChannelType.NoChannel,
current_pid/process_exists, Node naming) on layout 4 and layout 9."""
import os
import stat
import struct
import subprocess
import sys

import pytest

import kickmsg
import rawregion
from nativepeer import run_native, run_native9, run_ours
from kickmsg import ChannelType, Config, Node, Publisher, SharedRegion, Subscriber, layouts, shm
from kickmsg.protocol.v9 import layout as layout9
from kickmsg.protocol.common import MAGIC

SMALL = dict(max_subscribers=2, sub_ring_capacity=8, pool_size=16, max_payload_size=32)


def version_word(name: str) -> int:
    return struct.unpack_from("<I", rawregion.read_bytes(name), 8)[0]


# -- which layout a new region gets ---------------------------------------------------------


def test_the_default_is_layout_9_as_native_0_9_2(shm_name, prefix, monkeypatch):
    """Without layout= or $KICKMSG_LAYOUT: the API, Node and kickmsg create
    make layout 9, what today's native library speaks."""
    monkeypatch.delenv("KICKMSG_LAYOUT", raising=False)
    assert layouts.DEFAULT_LAYOUT == 9
    region = SharedRegion.create(shm_name, ChannelType.PubSub, Config(**SMALL))
    assert (region.layout, version_word(shm_name)) == (9, 9)
    node = Node("n", prefix)
    assert node.advertise("t").region.layout == 9
    made = subprocess.run([sys.executable, "-m", "kickmsg", "create", f"/{prefix}_cli", "--json"], capture_output=True,
                          text=True, timeout=60, env={k: v for k, v in os.environ.items() if k != "KICKMSG_LAYOUT"})
    assert made.returncode == 0, made.stderr
    assert version_word(f"/{prefix}_cli") == 9


@pytest.mark.parametrize("made, asked", [(4, 9), (9, 4)])
def test_create_or_open_of_the_other_layout_says_which_layout_joins_it(shm_name, made, asked):
    """Not 0.9.2's "stop its users and unlink it": the channel is fine, the
    layout asked for is not."""
    SharedRegion.create(shm_name, ChannelType.PubSub, Config(**SMALL), layout=made)
    with pytest.raises(RuntimeError, match=rf"it has layout {made}, create_or_open was asked for layout {asked} "
                                           rf"\(layout={made} or KICKMSG_LAYOUT={made} joins it\)"):
        SharedRegion.create_or_open(shm_name, ChannelType.PubSub, Config(**SMALL), layout=asked)
    assert version_word(shm_name) == made


@pytest.mark.parametrize("env, wanted", [("4", 4), ("9", 9)])
def test_kickmsg_layout_chooses_and_the_keyword_overrides_it(shm_name, monkeypatch, env, wanted):
    monkeypatch.setenv("KICKMSG_LAYOUT", env)
    region = SharedRegion.create(shm_name, ChannelType.PubSub, Config(**SMALL))
    assert (region.layout, version_word(shm_name)) == (wanted, wanted)
    other = 13 - wanted
    region = SharedRegion.create(shm_name, ChannelType.PubSub, Config(**SMALL), layout=other)
    assert (region.layout, version_word(shm_name)) == (other, other)
    with pytest.raises(RuntimeError, match=f"{shm_name}.*layout {other}.*layout {wanted}|version {other}, this layout speaks {wanted}"):
        SharedRegion.create_or_open(shm_name, ChannelType.PubSub, Config(**SMALL))  # the other layout exists


@pytest.mark.parametrize("value", ["5", "nine", "", "4.0"])
def test_a_bad_kickmsg_layout_is_a_value_error_naming_it(shm_name, monkeypatch, value):
    monkeypatch.setenv("KICKMSG_LAYOUT", value)
    with pytest.raises(ValueError, match=f"KICKMSG_LAYOUT must be 4 or 9, got {value!r}"):
        SharedRegion.create(shm_name, ChannelType.PubSub, Config(**SMALL))
    with pytest.raises(ValueError, match="KICKMSG_LAYOUT"):
        Node("n", "x")
    assert not os.path.exists("/dev/shm" + shm_name)


@pytest.mark.parametrize("value", [5, 0, -9])
def test_a_bad_layout_keyword_is_a_value_error_naming_it(shm_name, value):
    with pytest.raises(ValueError, match=f"layout must be 4 or 9, got {value!r}"):
        SharedRegion.create(shm_name, ChannelType.PubSub, Config(**SMALL), layout=value)
    assert not os.path.exists("/dev/shm" + shm_name)


@pytest.mark.parametrize("value", [True, "9", 4.0])
def test_a_layout_keyword_that_is_no_int_is_a_type_error_naming_it(shm_name, value):
    with pytest.raises(TypeError, match=f"layout must be an int, 4 or 9, got {value!r}"):
        SharedRegion.create(shm_name, ChannelType.PubSub, Config(**SMALL), layout=value)
    with pytest.raises(TypeError, match=f"layout must be an int, 4 or 9, got {value!r}"):
        Node("n", shm_name[1:], layout=value)
    assert not os.path.exists("/dev/shm" + shm_name)


# -- open and inspect read the version word -----------------------------------------------------


@pytest.mark.parametrize("layout", [4, 9])
def test_open_and_inspect_attach_to_either_layout(shm_name, layout):
    SharedRegion.create(shm_name, ChannelType.Broadcast, Config(**SMALL), "maker", layout=layout)
    for region in (SharedRegion.open(shm_name), SharedRegion.inspect(shm_name)):
        assert region.layout == layout
        assert region.channel_type == ChannelType.Broadcast
        info = region.info()
        assert (info.version, info.shm_name, info.creator_name, info.pool_size) == (layout, shm_name, "maker", 16)
        assert (info.max_subs, info.sub_ring_capacity, info.max_payload_size) == (2, 8, 32)
        assert info.creator_pid == os.getpid()
    assert SharedRegion.inspect(shm_name).read_only


TRY_OPEN = r"""
try:
    region = kickmsg.SharedRegion.open(P["name"])
    done("opened")
except Exception as error:
    done(type(error).__name__ + ": " + str(error))
"""


@pytest.mark.parametrize("layout, other_native", [(4, run_native9), (9, run_native)], ids=["layout4-0.9.2", "layout9-0.1.0"])
def test_the_native_of_the_other_layout_fails_cleanly_where_ours_opens_both(shm_name, layout, other_native):
    SharedRegion.create(shm_name, ChannelType.PubSub, Config(**SMALL), layout=layout)
    refusal = {4: "RuntimeError: Region version mismatch", 9: "RuntimeError: Version mismatch"}[layout]
    assert other_native(TRY_OPEN, name=shm_name) == refusal
    region = SharedRegion.open(shm_name)
    subscriber = Subscriber(region)
    Publisher(region).send(b"still works")
    assert (region.layout, subscriber.try_receive()) == (layout, b"still works")


@pytest.mark.parametrize("version", [0, 5, 8, 10])
def test_any_other_version_is_refused_naming_it_and_the_versions_read(shm_name, version):
    SharedRegion.create(shm_name, ChannelType.PubSub, Config(**SMALL), layout=4)
    with open("/dev/shm" + shm_name, "r+b") as file:
        file.seek(8)
        file.write(struct.pack("<I", version))
    for attach in (SharedRegion.open, SharedRegion.inspect):
        with pytest.raises(RuntimeError, match=f"{shm_name} has layout version {version}, this library reads layouts 4 and 9"):
            attach(shm_name)


def test_a_corrupt_layout_9_region_is_refused_by_its_validation(shm_name):
    SharedRegion.create(shm_name, ChannelType.PubSub, Config(**SMALL), layout=9)
    with open("/dev/shm" + shm_name, "r+b") as file:
        file.seek(rawregion.HEADER_OFFSETS["sub_ring_capacity"][0])
        file.write(struct.pack("<Q", 6))
    with pytest.raises(RuntimeError, match="sub_ring_capacity not a power of 2"):
        SharedRegion.open(shm_name)


# -- identity (layout 9 stamps one; layout 4 has none) ------------------------------------------


def test_expected_identity_is_checked_on_layout_9(shm_name):
    SharedRegion.create(shm_name, ChannelType.PubSub, Config(**SMALL, identity=0x1234), layout=9)
    assert SharedRegion.open(shm_name, 0x1234).layout == 9
    assert SharedRegion.open(shm_name).layout == 9  # 0: any
    with pytest.raises(RuntimeError, match="0x0000000000001234.*0x0000000000004321"):
        SharedRegion.open(shm_name, expected_identity=0x4321)


def test_mode_chooses_the_bits_of_a_new_layout_9_region_as_on_layout_4(shm_name):
    """Our extension on layout 9: ``mode=`` wins over 0.9.2's
    $KICKMSG_SHM_MODE / 0600 for create and create_or_open, the umask
    applying as to any file; a bad one is refused by name before anything
    is made."""
    previous = os.umask(0o022)
    try:
        SharedRegion.create(shm_name, ChannelType.PubSub, Config(**SMALL), mode=0o666, layout=9)
        assert stat.S_IMODE(os.stat("/dev/shm" + shm_name).st_mode) == 0o644  # the umask took the write bits
        shm.unlink(shm_name)
        os.umask(0)
        region = SharedRegion.create_or_open(shm_name, ChannelType.PubSub, Config(**SMALL), mode=0o660, layout=9)
    finally:
        os.umask(previous)
    assert region.layout == 9 and stat.S_IMODE(os.stat("/dev/shm" + shm_name).st_mode) == 0o660
    shm.unlink(shm_name)
    with pytest.raises(ValueError, match="mode=0o1777 is not a permission mode"):
        SharedRegion.create(shm_name, ChannelType.PubSub, Config(**SMALL), mode=0o1777, layout=9)
    with pytest.raises(TypeError, match="mode must be an int"):
        SharedRegion.create_or_open(shm_name, ChannelType.PubSub, Config(**SMALL), mode="0600", layout=9)
    assert not os.path.exists("/dev/shm" + shm_name)


def test_reset_with_drain_gives_a_retired_layout_9_rings_claims_back(shm_name):
    """Our extension on layout 9: a leave that timed out (a publisher still
    counted) leaves the ring retired with its claims; reset_retired_rings(
    drain=True) frees it and gives every claim back, once each: the entries
    an earlier owner drained are skipped, and the pool ends whole."""
    region = SharedRegion.create(shm_name, ChannelType.PubSub, Config(**SMALL, commit_timeout=0.001), layout=9)
    publisher = Publisher(region)
    earlier = Subscriber(region)  # ring 0
    for i in range(3):
        publisher.send(bytes([i]))
    earlier.close()  # a normal leave: drains positions 0..2
    subscriber = Subscriber(region)  # ring 0 again
    for i in range(5):
        publisher.send(bytes([i]))
    assert len(list(subscriber)) == 5  # consumed: the entries' claims remain until a drain
    state_flight = region.core.ring_address(0) + layout9.STATE_FLIGHT_OFFSET
    region.core.atomics.fetch_add_relaxed_u32(state_flight, layout9.IN_FLIGHT_ONE)  # a publisher died admitted
    subscriber.close()
    assert subscriber.drain_timeouts == 1
    assert (region.stats().rings[0].state, region.stats().rings[0].in_flight) == ("Free", 1)  # retired
    assert region.stats().pool_free == SMALL["pool_size"] - 5
    assert region.reset_retired_rings(drain=True) == 1
    assert (region.stats().rings[0].state, region.stats().rings[0].in_flight) == ("Free", 0)
    assert region.stats().pool_free == SMALL["pool_size"]
    assert region.reclaim_orphaned_slots() == 0  # no claim left, no refcount off
    assert region.stats().pool_free == SMALL["pool_size"]
    assert region.reset_retired_rings(drain=True) == 0


def test_layout_4_stamps_no_identity_and_says_so(shm_name):
    with pytest.raises(ValueError, match="Config.identity 0x0000000000000007: layout 4 stamps no identity"):
        SharedRegion.create(shm_name, ChannelType.PubSub, Config(**SMALL, identity=7), layout=4)
    SharedRegion.create(shm_name, ChannelType.PubSub, Config(**SMALL), layout=4)
    with pytest.raises(RuntimeError, match="layout-4 region, which stamps no identity"):
        SharedRegion.open(shm_name, expected_identity=7)
    with pytest.raises(ValueError, match="Config.identity must be an unsigned 64-bit integer, got -1"):
        Config(identity=-1)


def test_no_channel_makes_no_region(shm_name, layout):
    assert ChannelType.NoChannel == 0
    with pytest.raises(ValueError, match="got <ChannelType.NoChannel: 0>"):
        SharedRegion.create(shm_name, ChannelType.NoChannel, Config(**SMALL))
    assert not os.path.exists("/dev/shm" + shm_name)


# -- stats ----------------------------------------------------------------------------------------


def test_stats_count_writes_losses_and_the_free_pool(shm_name, layout):
    region = SharedRegion.create(shm_name, ChannelType.PubSub, Config(**SMALL))
    subscriber = Subscriber(region)
    publisher = Publisher(region)
    for number in range(10):  # 10 into an 8-entry ring: 2 overwritten
        publisher.send(bytes([number]))
    assert [message[0] for message in subscriber] == list(range(2, 10))
    stats = region.stats()
    assert (stats.total_writes, stats.live_rings, stats.pool_size, stats.total_steals) == (10, 1, 16, 0)
    assert stats.pool_free == 16 - 8  # the ring keeps its last 8 messages' slots
    assert [ring.state for ring in stats.rings] == ["Live", "Free"]
    assert stats.total_losses == (2 if layout == 9 else 0)  # layout 9 counts them in the ring header
    subscriber.close()
    assert region.stats().pool_free == 16


# -- 0.9.2's allocate() and AllocatedSlot, on both layouts ---------------------------------------


def test_allocate_without_a_length_publishes_what_it_is_told(shm_name, layout):
    region = SharedRegion.create(shm_name, ChannelType.PubSub, Config(**SMALL))
    subscriber = Subscriber(region)
    publisher = Publisher(region)
    slot = publisher.allocate()
    assert (slot.max_size, len(slot), slot.valid, slot.published) == (32, 32, True, False)
    with memoryview(slot) as view:
        view[:5] = b"hello"
    assert slot.publish(5) == 1
    assert (slot.valid, slot.published) == (False, True)
    assert subscriber.try_receive() == b"hello"
    with pytest.raises(ValueError, match=r"AllocatedSlot.publish\(\) called more than once"):
        slot.publish(5)
    with pytest.raises(BufferError, match="already been published"):
        memoryview(slot)
    whole = publisher.allocate()
    memoryview(whole)[:] = bytes(range(32))
    assert whole.publish() == 1  # no length: all max_size bytes
    assert subscriber.try_receive() == bytes(range(32))
    subscriber.close()
    rawregion.assert_pool_whole(shm_name)


def test_a_superseded_slot_refuses_as_0_9_2_and_goes_back(shm_name, layout):
    region = SharedRegion.create(shm_name, ChannelType.PubSub, Config(**SMALL))
    publisher = Publisher(region)
    first = publisher.allocate()
    second = publisher.allocate()
    assert (first.valid, second.valid) == (False, True)
    with pytest.raises(ValueError, match=r"superseded by a later Publisher.allocate\(\); publishing it would commit"):
        first.publish(1)
    with pytest.raises(BufferError, match="superseded by a later Publisher.allocate"):
        memoryview(first)
    with pytest.raises(ValueError, match=r"publish\(len\) exceeds slot max_size: 33 > 32"):
        second.publish(33)
    assert second.valid  # a refused length publishes nothing
    del first, second
    rawregion.assert_pool_whole(shm_name)


def test_allocate_with_a_length_keeps_0_1_0s_semantics(shm_name, layout):
    """allocate(len) over a pending slot: on layout 4 the pending one is
    replaced (its publish() delivers nothing, returns 0: 0.1.0's API); on
    layout 9 it is superseded as 0.9.2's allocate() supersedes (its
    publish() raises 0.9.2's ValueError). Either way its buffer is refused
    and its slot goes back to the pool."""
    region = SharedRegion.create(shm_name, ChannelType.PubSub, Config(**SMALL))
    subscriber = Subscriber(region)
    publisher = Publisher(region)
    assert publisher.allocate(33) is None
    first = publisher.allocate(3)
    assert (len(first), first.max_size) == (3, 3)
    second = publisher.allocate(2)
    assert not first.valid
    with pytest.raises(BufferError, match="superseded by a later Publisher.allocate"):
        memoryview(first)
    if layout == 4:
        assert first.publish() == 0  # replaced: delivers nothing
        assert first.published
    else:
        with pytest.raises(ValueError, match=r"AllocatedSlot was superseded by a later Publisher.allocate\(\)"):
            first.publish()
        assert not first.published
    memoryview(second)[:] = b"ab"
    assert second.publish() == 1
    assert subscriber.try_receive() == b"ab" and subscriber.try_receive() is None
    slot = publisher.allocate(4)
    memoryview(slot)[:] = b"abcd"
    assert slot.publish() == 1
    assert subscriber.try_receive() == b"abcd"
    del first, second, slot
    subscriber.close()
    rawregion.assert_pool_whole(shm_name)


def test_arguments_of_a_wrong_type_are_type_errors_and_wrong_values_value_errors(shm_name, layout):
    """One rule across the API's arguments: a wrong type is a TypeError, a
    wrong value a ValueError, each naming the argument and the value."""
    region = SharedRegion.create(shm_name, ChannelType.PubSub, Config(**SMALL))
    publisher = Publisher(region)
    wrong_types = [
        (lambda: SharedRegion.create(shm_name + "_x", ChannelType.PubSub, Config(**SMALL), 5), "creator must be a str"),
        (lambda: SharedRegion.create_or_open(shm_name, ChannelType.PubSub, Config(**SMALL), b"me"), "creator must be a str"),
        (lambda: Config(pool_size="16"), "Config.pool_size must be an int, got '16'"),
        (lambda: publisher.allocate("8"), "allocate needs an int length, got '8'"),
        (lambda: publisher.allocate(8.0), "allocate needs an int length, got 8.0"),
        (lambda: SharedRegion.open(shm_name, "1"), "expected_identity must be an int, got '1'"),
        (lambda: kickmsg.process_exists("1"), "process_exists needs an int pid, got '1'"),
    ]
    for call, words in wrong_types:
        with pytest.raises(TypeError, match=words):
            call()
    slot = publisher.allocate()
    with pytest.raises(TypeError, match="publish needs an int length, got True"):
        slot.publish(True)
    wrong_values = [
        (lambda: Config(pool_size=-16), "Config.pool_size must be an unsigned 64-bit integer, got -16"),
        (lambda: publisher.allocate(-8), "allocate needs a non-negative length, got -8"),
        (lambda: slot.publish(-1), "publish needs a non-negative length, got -1"),
        (lambda: SharedRegion.open(shm_name, -1), "expected_identity must be an unsigned 64-bit int, got -1"),
        (lambda: kickmsg.process_exists(0), "process_exists needs a positive pid, got 0"),
    ]
    for call, words in wrong_values:
        with pytest.raises(ValueError, match=words):
            call()
    assert not os.path.exists(f"/dev/shm{shm_name}_x")


# -- functions ------------------------------------------------------------------------------------


def test_current_pid_and_process_exists():
    assert kickmsg.current_pid() == os.getpid()
    assert kickmsg.process_exists(os.getpid()) and kickmsg.process_exists(1)
    child = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True, check=True)
    assert not kickmsg.process_exists(int(child.stdout))  # exited and reaped
    with pytest.raises(ValueError, match="got 0"):
        kickmsg.process_exists(0)


# -- Node: 0.9.2's naming on layout 9, 0.1.0's on layout 4 ----------------------------------------


def test_node_names_and_identities_of_0_9_2_on_layout_9(prefix):
    namespace = prefix + " ns!"
    node = Node("my node/x", namespace=namespace, layout=9)
    clean = prefix + "_ns_"
    assert (node.name, node.namespace, node.prefix, node.layout) == ("my_node.x", clean, clean, 9)
    publisher = node.advertise("/robot/arm:joint 1", Config(**SMALL))
    broadcast = node.join_broadcast("all", Config(**SMALL))
    mailbox = node.create_mailbox("in box", Config(**SMALL))
    names = {
        f"/{clean}_robot.arm_joint_1": layout9.topic_identity(clean, "/robot/arm:joint 1"),
        f"/{clean}_broadcast_all": layout9.broadcast_identity(clean, "all"),
        f"/{clean}_my_node.x_mbx_in_box": layout9.mailbox_identity(clean, "my_node.x", "in box"),
    }
    for name, identity in names.items():
        data = rawregion.read_bytes(name)
        assert struct.unpack_from("<IQ", data, 8)[0] == 9
        assert struct.unpack_from("<Q", data, 784)[0] == identity  # A.2: identity_hash
    subscriber = Node("reader", clean, layout=9).subscribe("/robot/arm:joint 1")
    Node("writer", clean, layout=9).open_mailbox("my node/x", "in box").send(b"to x")
    publisher.send(b"joint")
    broadcast.pub.send(b"all")
    assert (subscriber.try_receive(), mailbox.try_receive(), broadcast.sub.try_receive()) == (b"joint", b"to x", b"all")


def test_node_refuses_empty_components_and_long_names_as_0_9_2(prefix):
    with pytest.raises(ValueError, match="sanitize_shm_component: topic name is empty after sanitization"):
        Node("n", prefix, layout=9).advertise("///")
    with pytest.raises(RuntimeError, match="shm name exceeds platform limit: .*t: File name too long"):
        Node("n", prefix, layout=9).advertise("t" * 300)


def test_a_node_opening_another_identity_is_refused(prefix):
    """Same shm name, other identity: the topic "a b" and "a_b" sanitize alike."""
    Node("n", prefix, layout=9).advertise("a b", Config(**SMALL))
    with pytest.raises(RuntimeError, match="Identity mismatch on existing region"):
        Node("m", prefix, layout=9).subscribe("a_b")  # 0.9.2: "Identity mismatch on existing region (shm name collision)"


def test_node_keeps_0_1_0s_names_on_layout_4(prefix):
    node = Node("my node", prefix, layout=4)
    node.advertise("a:b", Config(**SMALL))
    assert version_word(f"/{prefix}_a:b") == 4


def test_a_method_only_one_layout_has_is_a_layout_error_naming_the_layout(shm_name):
    """One SharedRegion for both layouts: a method only the other layout has
    raises LayoutError (a RuntimeError, as the tools report them) naming
    the region's layout, not a crash; Layout4Only is its old name."""
    assert kickmsg.Layout4Only is kickmsg.LayoutError
    assert issubclass(kickmsg.LayoutError, kickmsg.KickmsgError) and issubclass(kickmsg.LayoutError, RuntimeError)
    region9 = SharedRegion.create(shm_name, ChannelType.PubSub, Config(**SMALL), layout=9)
    with pytest.raises(kickmsg.LayoutError, match=f"{shm_name} is a layout-9 region: referenced_slots is layout 4's"):
        region9.referenced_slots()
    with pytest.raises(kickmsg.LayoutError, match="not freed by force on a layout-9 region"):
        region9.free_ring(0)
    assert not hasattr(region9, "rings") and not hasattr(region9, "payload_offsets")  # the core's: region.core
    region4 = SharedRegion.create(shm_name, ChannelType.PubSub, Config(**SMALL), layout=4)
    with pytest.raises(kickmsg.LayoutError, match=f"{shm_name} is a layout-4 region: reclaim_dead_rings is layout 9's"):
        region4.reclaim_dead_rings()
    assert type(region4) is type(region9) is SharedRegion
    assert (region4.layout, region9.layout) == (4, 9)


def test_both_layouts_region_cores_have_the_shape_the_api_asks_of_them(shm_name):
    """SharedRegion holds its layout's core by composition; each core has
    every member ``RegionCore`` names, and they report alike."""
    from kickmsg.protocol.cores import RegionCore

    members = {name for name in vars(RegionCore) if not name.startswith("_")} | set(RegionCore.__annotations__)
    assert {"replaced", "rings_in_use", "info", "stats", "schema", "ring_words", "header_words"} <= members
    for chosen in (4, 9):
        region = SharedRegion.create(shm_name, ChannelType.PubSub, Config(**SMALL), layout=chosen)
        core = region.core
        assert type(core).__module__ == f"kickmsg.protocol.v{chosen}.region" and core.layout == chosen
        assert [name for name in sorted(members) if not hasattr(core, name)] == []
        assert core.rings_in_use() == [] and not core.replaced() and core.info() == region.info()
        with Subscriber(region) as subscriber:
            Publisher(region).send(b"x")
            assert core.rings_in_use() == [0] and region.stats().total_writes == 1
            words = core.ring_words(0)
            assert (words.index, words.write_pos, [position for position, _, _ in words.window]) == (0, 1, [0])
            assert subscriber.try_receive() == b"x"
        assert core.header_words().magic == MAGIC and core.incarnation() == region.incarnation()


SLOT_ERRORS = r"""
region = kickmsg.SharedRegion.open(P["name"])
publisher = kickmsg.Publisher(region)
texts = []

def error_of(action):
    try:
        action()
    except Exception as error:
        texts.append([type(error).__name__, str(error)])
    else:
        texts.append(None)

first = publisher.allocate()
second = publisher.allocate()
facts = [first.max_size, len(second), first.valid, second.valid]
error_of(lambda: first.publish(1))
error_of(lambda: memoryview(first))
error_of(lambda: second.publish(second.max_size + 1))
second.publish(2)
facts.append(second.valid)
error_of(lambda: second.publish(2))
error_of(lambda: memoryview(second))
done({"facts": facts, "errors": texts})
"""


@pytest.mark.parametrize("implementation", ["native 0.9.2", "ours"])
def test_allocated_slot_facts_and_errors_are_0_9_2s(shm_name, implementation):
    """The same calls on a layout-9 region by the 0.9.2 wheel and by us:
    the same facts, the same exception types, our texts beginning with
    0.9.2's (ours may add the values at fault)."""
    SharedRegion.create(shm_name, ChannelType.PubSub, Config(**SMALL), layout=9)
    run = run_native9 if implementation == "native 0.9.2" else run_ours
    result = run(SLOT_ERRORS, name=shm_name)
    assert result["facts"] == [32, 32, False, True, False]
    expected = [
        ["ValueError", "AllocatedSlot was superseded by a later Publisher.allocate(); publishing it would commit the newer reservation"],
        ["BufferError", "AllocatedSlot was superseded by a later Publisher.allocate(); its slot is back in the pool and writing through it would corrupt another reservation"],
        ["ValueError", "publish(len) exceeds slot max_size"],
        ["ValueError", "AllocatedSlot.publish() called more than once"],
        ["BufferError", "AllocatedSlot has already been published; its buffer is no longer writable"],
    ]
    assert [kind for kind, _ in result["errors"]] == [kind for kind, _ in expected]
    for (_, text), (_, words) in zip(result["errors"], expected):
        assert text.startswith(words), (text, words)


REPLACED_SLOT = r"""
region = kickmsg.SharedRegion.open(P["name"])
subscriber, publisher = kickmsg.Subscriber(region), kickmsg.Publisher(region)
first = publisher.allocate(8)
memoryview(first)[0:1] = b"A"
second = publisher.allocate(4)                # while first is pending
memoryview(second)[0:1] = b"B"
try:
    shared = bytes(memoryview(first)[0:1]) == b"B"  # second's byte, seen through first
except BufferError:                                 # first refuses new buffers
    shared = False
try:
    first_result = first.publish()
except Exception as error:
    first_result = type(error).__name__
second_result = second.publish()
received = [subscriber.try_receive(), subscriber.try_receive()]
done({"shared": shared, "results": [first_result, second_result],
      "received": [None if r is None else r.hex() for r in received]})
"""


def test_allocate_len_over_a_pending_slot_0_1_0_and_ours_on_layout_4(shm_name):
    """The compatibility page's row, measured on the 0.1.0 wheel: it hands
    the pending slot out again (both objects write the same bytes), the
    first publish() delivers it at the newer length and the other returns
    0. Ours gives the pending slot back: its publish() delivers nothing and
    returns 0, the newer one publishes what it holds. Either way one message
    goes out, with the newer slot's bytes."""
    SharedRegion.create(shm_name, ChannelType.PubSub, Config(**SMALL), layout=4)
    native = run_native(REPLACED_SLOT, name=shm_name)
    assert native == {"shared": True, "results": [1, 0], "received": ["42000000", None]}
    ours = run_ours(REPLACED_SLOT, name=shm_name)
    assert ours == {"shared": False, "results": [0, 1], "received": ["42000000", None]}


@pytest.mark.parametrize("layout", [4, 9])
def test_a_region_re_created_with_the_other_layout_is_not_followed(shm_name, layout):
    region = SharedRegion.create(shm_name, ChannelType.PubSub, Config(**SMALL), layout=layout)
    SharedRegion.create(shm_name, ChannelType.PubSub, Config(**SMALL), layout=13 - layout)
    with pytest.raises(RuntimeError, match=f"re-created with layout {13 - layout}; users of its layout-{layout} region cannot follow it"):
        region.reopen_if_recreated()
    with pytest.raises(RuntimeError, match="cannot follow it"):
        Publisher(region)  # a publisher starts where the name leads
