"""The naming rule: names with control characters, that are not UTF-8, or
that are '.' and '..' are refused wherever a channel is made; objects that
other programs named so can still be removed (unlink_shm, rm, clean)."""
import json
import os
import pathlib
import re
import subprocess
import sys

import pyarrow.parquet
import pytest

import kickmsg
from conftest import on_layout4
from kickmsg import cli, shm
from kickmsg.bridge import options as bridge_options
from kickmsg.description import describe
from kickmsg.ops import diagnostics
from kickmsg.recording.files import COLUMNS, SCHEMA_KEY
from kickmsg.recording.record import play
from nativepeer import run_ours

KICKMSG = str(pathlib.Path(sys.executable).with_name("kickmsg"))
SMALL = kickmsg.Config(max_subscribers=2, sub_ring_capacity=4, pool_size=8, max_payload_size=32)
# label -> (the text after the prefix, the fault the error names)
BAD_TEXTS = {
    "newline": ("_nl\nfake_row", "control character U+000A"),
    "tab": ("_tab\tx", "control character U+0009"),
    "delete": ("_del\x7f", "control character U+007F"),
    "c1": ("_nel\x85", "control character U+0085"),
    "not_utf8": ("_\udcff", "it is not valid UTF-8"),
}
CREATORS = {
    "create": lambda name: kickmsg.SharedRegion.create(name, kickmsg.ChannelType.PubSub, SMALL),
    "create_or_open": lambda name: kickmsg.SharedRegion.create_or_open(name, kickmsg.ChannelType.PubSub, SMALL),
}
OPENERS = {"open": kickmsg.SharedRegion.open, "inspect": kickmsg.SharedRegion.inspect}


def objects_under(prefix: str) -> list[bytes]:
    """The raw names of every object in /dev/shm under ``prefix``."""
    return sorted(name for name in os.listdir(b"/dev/shm") if name.startswith(prefix.encode()))


def kickmsg_command(*args: str | bytes) -> subprocess.CompletedProcess[bytes]:
    return subprocess.run([KICKMSG, *args], capture_output=True, stdin=subprocess.DEVNULL, timeout=60)


@pytest.mark.parametrize("label", BAD_TEXTS)
@pytest.mark.parametrize("call", CREATORS)
def test_a_name_with_control_characters_or_not_utf8_is_refused_naming_the_rule(prefix, label, call):
    text, fault = BAD_TEXTS[label]
    name = f"/{prefix}{text}"
    with pytest.raises(ValueError) as raised:
        CREATORS[call](name)
    assert str(raised.value) == f"invalid shared-memory name {name!r} ({fault}): {shm.NAME_RULE}"
    assert objects_under(prefix) == []


@pytest.mark.parametrize("label", ["newline", "not_utf8"])
@pytest.mark.parametrize("call", OPENERS)
def test_a_region_another_program_named_outside_the_rule_opens(prefix, call, label):
    """The rule binds what this package creates: a native program may have
    named its region with control characters or bytes that are not UTF-8,
    and it opens (the tools show the name escaped)."""
    made = f"/{prefix}_made"
    kickmsg.SharedRegion.create(made, kickmsg.ChannelType.PubSub, SMALL)
    named = f"/{prefix}{BAD_TEXTS[label][0]}"
    os.rename(os.fsencode(f"/dev/shm{made}"), os.fsencode(f"/dev/shm{named}"))
    region = OPENERS[call](named)
    assert region.name == named


@pytest.mark.parametrize("name", ["/.", "/.."])
@pytest.mark.parametrize("call", [*CREATORS, *OPENERS, "unlink_shm"])
def test_dot_and_dot_dot_are_refused_by_the_rule(name, call):
    every = {**CREATORS, **OPENERS, "unlink_shm": kickmsg.unlink_shm}
    with pytest.raises(ValueError, match=r"names a directory\): a shared-memory name is '/' followed by"):
        every[call](name)


def test_the_rule_is_stated(prefix):
    assert shm.NAME_RULE == (
        "a shared-memory name is '/' followed by 1 to 254 bytes of UTF-8 text without '/' or control characters "
        "(NUL, newline, ...), other than '.' and '..', and not ending in '.kickmsg-subscribers', '.kickmsg-publishers', "
        "'.kickmsg-bridges', '.owners' (the suffixes of the record files beside a region)")


@pytest.mark.parametrize("label", BAD_TEXTS)
@on_layout4
def test_a_node_refuses_to_create_such_topics_mailboxes_and_broadcasts(prefix, label):
    text, fault = BAD_TEXTS[label]
    node = kickmsg.Node("n", prefix=prefix)
    for make in (lambda: node.advertise(text[1:]),
                 lambda: node.join_broadcast(text[1:]), lambda: node.create_mailbox(text[1:]),
                 lambda: kickmsg.Node(text[1:], prefix=prefix).create_mailbox("tag")):
        with pytest.raises(ValueError, match="invalid shared-memory name .*" + re.escape(f"({fault})")):
            make()
    assert objects_under(prefix) == []


@pytest.mark.parametrize("label", BAD_TEXTS)
def test_the_commands_refuse_to_create_such_names(prefix, label):
    """kickmsg create and pub --create: exit 2, one line stating the rule,
    nothing made (the name given as raw bytes, as a shell passes it)."""
    name = os.fsencode(f"/{prefix}{BAD_TEXTS[label][0]}")
    for command in (["create", name], ["pub", name, "hello", "--create"]):
        done = kickmsg_command(*command)
        assert done.returncode == 2 and done.stdout == b""
        lines = done.stderr.decode().splitlines()
        assert len(lines) == 1 and lines[0].endswith(f"({BAD_TEXTS[label][1]}): {shm.NAME_RULE}")
    assert objects_under(prefix) == []


@pytest.mark.parametrize("label", BAD_TEXTS)
def test_the_bridge_refuses_such_channel_names(label):
    text, fault = BAD_TEXTS[label]
    for make in (lambda: bridge_options.parse_import(f"kickmsg/robot/imu=/imu{text}"), lambda: bridge_options.shm_name(f"imu{text}")):
        with pytest.raises(ValueError, match="invalid shared-memory name .*" + re.escape(f"({fault})")):
            make()


def test_play_refuses_a_recording_whose_channel_breaks_the_rule(prefix, tmp_path):
    """A recording naming a channel '/...\\nfake_row' (hand-made: no recorder
    can open such a channel) is refused before anything is created."""
    good = f"/{prefix}_good"
    bad = f"/{prefix}_nl\nfake_row"
    description = describe(kickmsg.SharedRegion.create(good, kickmsg.ChannelType.PubSub, SMALL))
    kickmsg.unlink_shm(good)
    metadata = {"recording": "r", "host": "h", "started_wall_ns": 0, "channels": {bad: description}}
    row = {"recording": "r", "channel": bad, "ring_pos": 0, "recv_mono_ns": 1, "recv_wall_ns": 1, "size": 2,
           "lost": 0, "stamp_ns": 0, "payload": b"hi"}
    schema = pyarrow.schema(COLUMNS, metadata={SCHEMA_KEY: json.dumps(metadata).encode()})
    pyarrow.parquet.write_table(pyarrow.Table.from_pylist([row], schema=schema), tmp_path / "bad.parquet")
    with pytest.raises(ValueError, match=r"\(control character U\+000A\)"):
        play(str(tmp_path))
    assert objects_under(prefix) == []


# -- objects other programs named: removed all the same --------------------------------------------


CREATE = """
kickmsg.SharedRegion.create(P["name"], kickmsg.ChannelType.PubSub, make_config(P["config"]), "child")
done(os.getpid())
"""


def region_renamed(prefix: str, raw_name: bytes) -> bytes:
    """A Kickmsg region of a dead creator, with its ring-owner sidecar,
    renamed in /dev/shm to ``raw_name`` (any bytes): its path."""
    made = f"/{prefix}_made"
    run_ours(CREATE, name=made, config={"max_subscribers": 2, "sub_ring_capacity": 4, "pool_size": 8,
                                        "max_payload_size": 32})
    kickmsg.Subscriber(kickmsg.SharedRegion.open(made)).close()  # leaves its sidecar
    path = b"/dev/shm/" + raw_name
    os.rename(f"/dev/shm{made}", path)
    os.rename(f"/dev/shm{made}.kickmsg-subscribers", path + b".kickmsg-subscribers")
    return path


@on_layout4
def test_unlink_shm_removes_an_object_whose_name_is_not_utf8_with_its_sidecar(prefix):
    path = region_renamed(prefix, prefix.encode() + b"_\xff")
    kickmsg.unlink_shm(os.fsdecode(path.removeprefix(b"/dev/shm")))
    assert objects_under(prefix) == []


@on_layout4
def test_rm_removes_objects_named_with_any_bytes(prefix):
    """A region named by raw bytes (not UTF-8, a newline), and a foreign
    object so named (os.open on the bytes path): rm removes them, given as
    a shell passes them."""
    region = region_renamed(prefix, prefix.encode() + b"_\xff\nrow")
    foreign = b"/dev/shm/" + prefix.encode() + b"_\xfe"
    os.close(os.open(foreign, os.O_CREAT | os.O_WRONLY, 0o600))
    refused = kickmsg_command("rm", foreign.removeprefix(b"/dev/shm"))
    assert refused.returncode == 2 and b"not a Kickmsg region" in refused.stderr
    done = kickmsg_command("rm", region.removeprefix(b"/dev/shm"))
    assert (done.returncode, done.stderr) == (0, b"")
    forced = kickmsg_command("rm", "--force", foreign.removeprefix(b"/dev/shm"))
    assert (forced.returncode, forced.stderr) == (0, b"")
    assert objects_under(prefix) == []


@on_layout4
def test_clean_removes_a_dead_region_whose_name_is_not_utf8_and_goes_on(prefix):
    """One object named by bytes that are not UTF-8 made clean exit 2 having
    removed nothing; now it is removed like any other, and a foreign
    object so named is left alone."""
    region = region_renamed(prefix, prefix.encode() + b"_\xff")
    other = region_renamed(prefix, prefix.encode() + b"_zz")
    foreign = b"/dev/shm/" + prefix.encode() + b"_\xfe"
    os.close(os.open(foreign, os.O_CREAT | os.O_WRONLY, 0o600))
    done = kickmsg_command("clean", "--prefix", prefix, "--json")
    assert (done.returncode, done.stderr) == (0, b"")
    assert json.loads(done.stdout)["removed"] == [os.fsdecode(path.removeprefix(b"/dev/shm")) for path in (other, region)]
    assert objects_under(prefix) == [foreign.removeprefix(b"/dev/shm/")]


@on_layout4
def test_list_shows_a_region_whose_name_breaks_the_rule_as_any_other(prefix):
    """Another program may name its region outside the rule: it is listed
    (and can be opened and removed) like any region."""
    region = region_renamed(prefix, prefix.encode() + b"_\xff")
    name = os.fsdecode(region.removeprefix(b"/dev/shm"))
    rows = diagnostics.list_regions(prefix)
    assert [(row.name, row.type, row.problem) for row in rows] == [(name, "PubSub", None)]
    assert cli.main(["rm", name]) == 0
