"""The ``kickmsg`` command, run as a real subprocess.

Every subcommand runs as the installed console script against regions made
by this package (in this process or in short-lived children) and by the
native kickmsg 0.1.0 (in children, see ``nativepeer``). Expected values come
from what the test did and from ``rawregion`` (an independent decoder), never
from the package's own inspection code. Damage is poked into /dev/shm through
a separate mmap. Every child is bounded in time; every name lives under the
session prefix. No timing assertions: rates are only checked to be positive.
"""
import importlib.metadata
import json
import mmap
import os
import pathlib
import pwd
import select
import signal
import struct
import subprocess
import sys
import threading
import time
from dataclasses import dataclass

import pytest

import kickmsg
import rawregion
from conftest import SESSION_PREFIX, on_layout4
from kickmsg import ChannelType, Config, Node, Publisher, SchemaInfo, SharedRegion, Subscriber, typed
from kickmsg import atomics, owners
from nativepeer import run_native, run_native9, run_ours, start_native, start_native9, start_ours

KICKMSG = pathlib.Path(sys.executable).with_name("kickmsg")
COMMANDS = (
    "list info stats watch echo hz bw pub create rm schema schema-diff diagnose audit repair clean".split()
)
SMALL = dict(max_subscribers=3, sub_ring_capacity=8, pool_size=16, max_payload_size=64)
ROOMY = dict(max_subscribers=3, sub_ring_capacity=64, pool_size=80, max_payload_size=64)  # no loss for <= 64 messages
CREATOR = "cli-test"
MAGIC = 0x4B49434B4D534721
LOCKED = 0xFFFFFFFFFFFFFFFF
FREE, LIVE = 0, 1
SCHEMA = {
    "identity": bytes(range(1, 65)).hex(),
    "layout": bytes(range(65, 129)).hex(),
    "name": "demo.Pose",
    "version": 3,
    "identity_algo": 7,
    "layout_algo": 8,
    "flags": 9,
}

pytestmark = pytest.mark.timeout(120)


# -- running the command ---------------------------------------------------------------------


@dataclass
class Result:
    code: int
    out: bytes
    err: bytes

    @property
    def text(self) -> str:
        return self.out.decode()

    @property
    def error_lines(self) -> list[str]:
        return self.err.decode().splitlines()

    def json(self):
        return json.loads(self.out)

    def json_lines(self) -> list:
        return [json.loads(line) for line in self.text.splitlines()]


def command_line(args) -> list[str]:
    return [str(KICKMSG), *map(str, args)]


def cli(*args, timeout: float = 20, input: bytes | None = None) -> Result:
    """Run ``kickmsg ARGS`` to completion; stdin is not a terminal."""
    done = subprocess.run(
        command_line(args),
        input=input,
        stdin=None if input is not None else subprocess.DEVNULL,
        capture_output=True,
        timeout=timeout,
    )
    return Result(done.returncode, done.stdout, done.stderr)


def cli_json(*args, code: int = 0):
    """Run ``kickmsg ARGS --json``, check its exit status, parse its output."""
    result = cli(*args, "--json")
    assert result.code == code, (result.code, result.err.decode())
    return result.json()


class Running:
    """``kickmsg ARGS`` running in the background; killed if still running on exit."""

    def __init__(self, *args):
        self.args = args
        self.proc = subprocess.Popen(
            command_line(args), stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE
        )

    def finish(self, timeout: float = 20) -> Result:
        try:
            out, err = self.proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            out = None
        if out is None:
            self.proc.kill()
            _, err = self.proc.communicate(timeout=10)
            pytest.fail(f"kickmsg {' '.join(map(str, self.args))} still ran after {timeout} s\n{err.decode()}")
        return Result(self.proc.returncode, out, err)

    def __enter__(self):
        return self

    def __exit__(self, *exc_info):
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.communicate(timeout=10)


def assert_one_line_error(result: Result, command: str, *phrases: str) -> None:
    """Exit status 2, nothing on stdout, one line on stderr naming the command."""
    assert result.code == 2, (result.code, result.err.decode())
    assert result.out == b""
    lines = result.error_lines
    assert len(lines) == 1, lines
    assert lines[0].startswith(f"kickmsg {command}: error: "), lines
    for phrase in phrases:
        assert phrase in lines[0], lines


# -- regions, pokes and snapshots ------------------------------------------------------------------


def make(name: str, creator: str = CREATOR, **changes) -> SharedRegion:
    """Our small PubSub region (this process is its creator)."""
    return SharedRegion.create(name, ChannelType.PubSub, Config(**dict(SMALL, **changes)), creator)


def schema_info(fields: dict = SCHEMA) -> SchemaInfo:
    return SchemaInfo(**{k: bytes.fromhex(v) if k in ("identity", "layout") else v for k, v in fields.items()})


CREATE = r"""
region = kickmsg.SharedRegion.create(
    P["name"], getattr(kickmsg.ChannelType, P.get("type", "PubSub")), make_config(P["config"]), P["creator"])
done(os.getpid())
"""


def create_in_child(impl: str, name: str, creator: str = "child", **config) -> int:
    """Create a region from a short-lived child (ours or native); its pid."""
    run = run_native if impl == "native" else run_ours
    return run(CREATE, name=name, config=dict(SMALL, **config), creator=creator)


def poke(name: str, offset: int, fmt: str, *values) -> None:
    """Write into the region's bytes through a separate mapping."""
    with open(f"/dev/shm{name}", "r+b") as file, mmap.mmap(file.fileno(), 0) as memory:
        struct.pack_into(fmt, memory, offset, *values)


def ring_offset(name: str, index: int) -> int:
    h = rawregion.header(rawregion.read_bytes(name))
    return h["sub_rings_offset"] + index * h["sub_ring_stride"]


def slot_offset(name: str, index: int) -> int:
    h = rawregion.header(rawregion.read_bytes(name))
    return h["pool_offset"] + index * h["slot_stride"]


def poke_locked_entry(name: str, ring: int) -> None:
    """Ring ``ring`` at write_pos 1 whose entry 0 was left LOCKED by a crashed writer."""
    poke(name, ring_offset(name, ring) + 64, "<Q", 1)
    poke(name, ring_offset(name, ring) + 128, "<QII", LOCKED, 0xFFFFFFFF, 0)


def poke_leaked_slot(name: str) -> int:
    """Take the top slot off a fresh free stack and give it a refcount no
    ring entry explains (the pin of a view whose process died)."""
    data = rawregion.read_bytes(name)
    free_top = rawregion.header(data)["free_top"]
    top = free_top & 0xFFFFFFFF
    below = struct.unpack_from("<I", data, slot_offset(name, top) + 4)[0]
    poke(name, 768, "<Q", ((free_top >> 32) + 1) << 32 | below)
    poke(name, slot_offset(name, top), "<I", 1)
    return top


def live_rings(name: str) -> list[int]:
    data = rawregion.read_bytes(name)
    return [i for i in range(rawregion.header(data)["max_subs"]) if rawregion.ring(data, i).state == LIVE]


def waiting_rings(name: str) -> list[int]:
    """The Live rings whose subscriber waits for messages (has_waiter set)."""
    data = rawregion.read_bytes(name)
    return [i for i in range(rawregion.header(data)["max_subs"])
            if (ring := rawregion.ring(data, i)).state == LIVE and ring.has_waiter != 0]


def wait_live(name: str, count: int, *running: Running, timeout: float = 15) -> None:
    """Wait until ``count`` commands have joined: their rings are Live and
    they wait for messages (has_waiter set), so each gets every message
    published from now on. Live alone is not enough: on layout 9 a ring is
    Live before its subscriber has chosen its start position (WIRE9.md B.4)."""
    wait_rings(name, lambda: len(waiting_rings(name)) >= count,
               lambda: f"{count} joined and waiting ring(s) expected, found live {live_rings(name)}, waiting {waiting_rings(name)}",
               *running, timeout=timeout)


def wait_parked(name: str, ring: int, *running: Running, timeout: float = 15) -> None:
    """Wait until the subscriber of ring ``ring`` waits for messages
    (has_waiter set): its join is over, so it gets every message published
    from now on. On layout 9 a ring is Live before its subscriber has
    chosen its start position (WIRE9.md B.4), so Live is not enough."""
    parked = lambda: rawregion.ring(rawregion.read_bytes(name), ring).has_waiter != 0
    wait_rings(name, parked, lambda: f"a subscriber waiting on ring {ring} expected", *running, timeout=timeout)


def wait_rings(name: str, done, expected, *running: Running, timeout: float = 15) -> None:
    """Poll until ``done()``; fail naming ``expected()`` after ``timeout``
    or as soon as a command exits."""
    deadline = time.monotonic() + timeout
    while not done():
        for command in running:
            if command.proc.poll() is not None:
                result = command.finish()
                pytest.fail(f"kickmsg {command.args} exited ({result.code}) before joining: {result.err.decode()}")
        if time.monotonic() > deadline:
            pytest.fail(f"{name}: {expected()}")
        time.sleep(0.01)


def snapshot(name: str) -> tuple[bytes, bytes | None]:
    """The region's bytes and its owner sidecar's bytes (None if absent)."""
    try:
        sidecar = pathlib.Path(owners.sidecar_path(name)).read_bytes()
    except FileNotFoundError:
        sidecar = None
    return rawregion.read_bytes(name), sidecar


def free_slots(name: str) -> int:
    return len(rawregion.pool(rawregion.read_bytes(name)).free_slots)


# -- fixtures ----------------------------------------------------------------------------------


_prefixes = iter(range(10**6))


def remove_under(prefix: str) -> None:
    """Remove every /dev/shm object named /PREFIX_..."""
    for path in pathlib.Path("/dev/shm").glob(f"{prefix}_*"):
        path.unlink(missing_ok=True)


@pytest.fixture
def prefix():
    """A Node prefix of this test alone (no leading '/'); its objects are removed after."""
    chosen = f"{SESSION_PREFIX}_cli{next(_prefixes)}"
    yield chosen
    remove_under(chosen)


@pytest.fixture
def name(shm_name):
    """A fresh region name (conftest's shm_name: removed with its sidecars after the test)."""
    return shm_name


@pytest.fixture(scope="module")
def broken():
    """Objects that look like regions by name but are not usable ones."""
    base = f"{SESSION_PREFIX}_broken"
    names = {
        "missing": f"/{base}_missing",
        "garbage": f"/{base}_garbage",
        "empty": f"/{base}_empty",
        "old_version": f"/{base}_old",
        "bad_geometry": f"/{base}_geometry",
    }
    pathlib.Path(f"/dev/shm{names['garbage']}").write_bytes(bytes((i * 97 + 13) & 0xFF for i in range(4096)))
    pathlib.Path(f"/dev/shm{names['empty']}").write_bytes(b"")
    SharedRegion.create(names["old_version"], ChannelType.PubSub, Config(**SMALL), CREATOR, layout=4)
    poke(names["old_version"], 8, "<I", 5)
    SharedRegion.create(names["bad_geometry"], ChannelType.PubSub, Config(**SMALL), CREATOR, layout=4)
    poke(names["bad_geometry"], 64, "<Q", 10**6)  # layout 4's pool_size, far beyond the object
    yield names
    remove_under(base)


# -- --version and --help ------------------------------------------------------------------------


def test_version():
    """--version names the package, its own version, and both layouts with
    the native release of each."""
    result = cli("--version")
    assert result.code == 0
    assert result.text.startswith(f"kickmsg-py {kickmsg.__version__} ")
    assert "own version, not the native kickmsg's" in result.text
    build = ("Python, compiled: atomics, protocol.freestack, protocol.v4.publish, protocol.v4.receive, protocol.v4.region, "
             "protocol.v9.layout, protocol.v9.publish, protocol.v9.receive, protocol.v9.region, protocol.v9.words"
             if atomics.COMPILED else "pure Python")
    assert result.text.startswith(f"kickmsg-py {kickmsg.__version__} ({build}; ")
    assert "layouts 9, as native kickmsg 0.9.2 (the default), and 4, as native kickmsg 0.1.0" in result.text


def test_help_and_metadata_name_both_native_generations():
    """--help and the package's metadata (what `pip show` prints) speak of
    both native releases and their layouts, not of 0.1.0 alone."""
    text = " ".join(cli("--help").text.split())
    assert "0.9.2 (layout 9, what new channels get by default) and 0.1.0 (layout 4)" in text
    summary = importlib.metadata.metadata("kickmsg-py")["Summary"]
    assert "0.9.2 (layout 9, the default) and 0.1.0 (layout 4)" in summary
    assert "its version is its own" in summary


def test_top_level_help_lists_every_command():
    """kickmsg --help names every subcommand."""
    result = cli("--help")
    assert result.code == 0
    for command in COMMANDS:
        assert command in result.text


@pytest.mark.parametrize("command", COMMANDS)
def test_command_help_shows_examples(command):
    """COMMAND --help ends with runnable examples of that command."""
    result = cli(command, "--help")
    assert result.code == 0
    assert "--json" in result.text
    examples = result.text.split("examples:", 1)[1]
    assert f"kickmsg {command}" in examples


def test_no_command_is_an_error():
    """A command is required (argparse usage error, exit status 2)."""
    result = cli()
    assert result.code == 2


# -- list -----------------------------------------------------------------------------------


@on_layout4
def test_list_shows_our_native_and_unsupported_regions(prefix):
    """Rows for our region, a native one, an old-version one and one that
    does not fit its object (garbage and sidecars are skipped), with the
    right values in every column."""
    ours, native, old, unfit = (f"/{prefix}_{label}" for label in ("a_ours", "b_native", "c_old", "e_unfit"))
    region = make(ours)
    subscriber = Subscriber(region)
    publisher = Publisher(region)
    publisher.send(b"one")
    publisher.send(b"two")
    native_pid = run_native(
        CREATE, name=native, creator="native-node", config=dict(SMALL, max_subscribers=2, pool_size=8, schema=SCHEMA)
    )
    make(old)
    poke(old, 8, "<I", 7)
    pathlib.Path(f"/dev/shm/{prefix}_d_garbage").write_bytes(b"\x00garbage" * 64)
    make(unfit)
    poke(unfit, 64, "<Q", 10**6)  # pool_size far beyond the object
    assert os.path.exists(owners.sidecar_path(ours))

    rows = cli_json("list", "--prefix", prefix)
    assert [row["name"] for row in rows] == [ours, native, old, unfit]
    assert rows[0] == dict(
        access(ours), name=ours, type="PubSub", version=4, creator=CREATOR, pid=os.getpid(), alive=True,
        subs_live=1, subs_max=3, pubs_live=1, pubs_stall=0, bridges_live=0, bridges_dead=0, capacity=8, pool_free=14, pool_size=16, payload=64,
        schema="", health="clean: 14 of 16 slots free, 1 live rings", problem=None, namespace=None, topic=None, topics=None,
    )
    assert rows[1] == dict(
        access(native), name=native, type="PubSub", version=4, creator="native-node", pid=native_pid, alive=False,
        subs_live=0, subs_max=2, pubs_live=0, pubs_stall=0, bridges_live=0, bridges_dead=0, capacity=8, pool_free=8, pool_size=8, payload=64,
        schema="demo.Pose", health="DAMAGED: pools too small for their rings: 1; 8 of 8 slots free, 0 live rings",
        problem=None, namespace=None, topic=None, topics=None,
    )
    assert rows[2]["type"] == "unsupported (v7)" and rows[2]["version"] == 7
    assert rows[2]["creator"] is None and rows[2]["pool_free"] is None and rows[2]["subs_max"] is None
    assert rows[2]["problem"] == "layout version 7; this tool reads 4 and 9"
    assert (rows[3]["type"], rows[3]["version"], rows[3]["pool_size"]) == ("damaged", 4, None)
    assert rows[3]["problem"].startswith(f"Region {unfit} does not fit its mapping")
    assert all(row[key] == access(row["name"])[key] for row in rows for key in ("mode", "owner"))
    subscriber.close()


def access(name: str) -> dict:
    """The mode (octal text) and owner (user name) of a /dev/shm object, for list."""
    status = os.stat(f"/dev/shm{name}")
    return {"mode": f"{status.st_mode & 0o777:04o}", "owner": pwd.getpwuid(status.st_uid).pw_name}


@on_layout4
def test_list_text_table_and_column_selection(prefix):
    """A table with an upper-case header; -o picks and orders columns."""
    first, second = f"/{prefix}_one", f"/{prefix}_two"
    make(first)
    create_in_child("native", second, creator="nat")

    table = cli("list", "--prefix", prefix)
    assert table.code == 0
    lines = table.text.splitlines()
    assert lines[0].split() == "NAME TYPE VERSION CREATOR PID ALIVE SUBS PUBS CAPACITY POOL PAYLOAD SCHEMA HEALTH MODE OWNER".split()
    assert lines[1].split()[:4] == [first, "PubSub", "4", CREATOR]
    assert lines[1].split()[-2:] == [access(first)["mode"], access(first)["owner"]]
    assert lines[2].split()[:4] == [second, "PubSub", "4", "nat"]

    chosen = cli("list", "--prefix", prefix, "-o", "pool,name")
    assert chosen.code == 0
    assert [line.split() for line in chosen.text.splitlines()] == [["POOL", "NAME"], ["16/16", first], ["16/16", second]]
    assert cli_json("list", "--prefix", prefix, "-o", "name,subs") == [
        {"name": first, "subs_live": 0, "subs_max": 3},
        {"name": second, "subs_live": 0, "subs_max": 3},
    ]


def test_list_rejects_unknown_columns(prefix):
    """-o with a column that does not exist: one line, exit 2."""
    assert_one_line_error(cli("list", "--prefix", prefix, "-o", "name,colour"), "list", "colour")


def test_list_with_nothing_under_the_prefix(prefix):
    """An empty listing says so (and is [] in JSON)."""
    result = cli("list", "--prefix", prefix)
    assert (result.code, result.text.strip()) == (0, "no Kickmsg regions")
    assert cli_json("list", "--prefix", prefix) == []


# -- info and naming ----------------------------------------------------------------------------


HEADER_KEYS = (
    "version total_size sub_rings_offset pool_offset max_subs sub_ring_capacity sub_ring_mask pool_size "
    "slot_data_size slot_stride sub_ring_stride commit_timeout_us creator_pid created_at_ns creator_name "
    "creator_name_len"
).split()


def assert_header_matches(info: dict, name: str) -> None:
    raw = rawregion.header(rawregion.read_bytes(name))
    assert info["name"] == name
    assert info["magic"] == f"0x{MAGIC:016x}"
    assert {key: info[key] for key in HEADER_KEYS} == {key: raw[key] for key in HEADER_KEYS}
    assert info["config_hash"] == f"0x{raw['config_hash']:016x}"
    assert info["free_top"] == {"generation": raw["free_top"] >> 32, "slot": raw["free_top"] & 0xFFFFFFFF}


def test_info_of_our_region(name):
    """Every header field, decoded, for a region this process created."""
    make(name)
    info = cli_json("info", name)
    assert_header_matches(info, name)
    assert info["channel_type"] == "PubSub"
    assert (info["max_subs"], info["sub_ring_capacity"], info["pool_size"], info["slot_data_size"]) == (3, 8, 16, 64)
    assert (info["creator_name"], info["creator_pid"], info["creator_alive"]) == (CREATOR, os.getpid(), True)
    assert (info["schema_state"], info["schema"]) == ("Unset", None)
    assert info["free_top"] == {"generation": 16, "slot": 15}
    assert info["age_s"] >= 0

    text = cli("info", name)
    assert text.code == 0
    fields = dict(line.split(None, 1) for line in text.text.splitlines())
    assert fields["creator_name"] == CREATOR
    assert fields["pool_size"] == "16"
    assert fields["free_top"] == "generation=16, slot=15"


def test_info_of_a_native_broadcast_region_with_schema(name):
    """A region created by the native library (its creator has exited)."""
    pid = run_native(CREATE, name=name, type="Broadcast", creator="native-node", config=dict(SMALL, schema=SCHEMA))
    info = cli_json("info", name)
    assert_header_matches(info, name)
    assert info["channel_type"] == "Broadcast"
    assert (info["creator_name"], info["creator_pid"], info["creator_alive"]) == ("native-node", pid, False)
    assert info["schema_state"] == "Set"
    assert info["schema"] == {
        "name": "demo.Pose", "version": 3, "identity": SCHEMA["identity"], "layout": SCHEMA["layout"],
        "identity_algo": 7, "layout_algo": 8, "flags": 9,
    }


def test_naming_options_designate_node_channels(prefix):
    """--topic/--broadcast/--mailbox follow the Node naming rules under --prefix."""
    node = Node("owner", prefix=prefix)
    node.advertise("imu", Config(**SMALL))
    node.join_broadcast("chat", Config(**SMALL))
    node.create_mailbox("inbox", Config(**SMALL))

    topic = cli_json("info", "--topic", "imu", "--prefix", prefix)
    assert (topic["name"], topic["channel_type"], topic["creator_name"]) == (f"/{prefix}_imu", "PubSub", "owner")
    broadcast = cli_json("info", "--broadcast", "chat", "--prefix", prefix)
    assert (broadcast["name"], broadcast["channel_type"]) == (f"/{prefix}_broadcast_chat", "Broadcast")
    mailbox = cli_json("info", "--mailbox", "owner", "inbox", "--prefix", prefix)
    assert (mailbox["name"], mailbox["max_subs"]) == (f"/{prefix}_owner_mbx_inbox", 1)
    without_slash = cli_json("info", f"{prefix}_imu")
    assert without_slash["name"] == f"/{prefix}_imu"


def test_default_prefix_is_kickmsg():
    """Without --prefix, --topic T means /kickmsg_T (here: one that does not exist)."""
    topic = f"{SESSION_PREFIX}_absent"
    assert_one_line_error(cli("info", "--topic", topic), "info", f"no such region: /kickmsg_{topic}")


# -- error paths ---------------------------------------------------------------------------------


ERROR_KINDS = {
    "missing": "no such region",
    "garbage": "not a Kickmsg region",
    "empty": "not a Kickmsg region",
    "old_version": "unsupported version",
    "bad_geometry": "does not fit its mapping",
    "invalid_name": "invalid shared-memory name",
    "two_channels": "name exactly one channel",
    "no_channel": "name exactly one channel",
}
COMMAND_ARGS = {  # what each channel command needs besides the channel
    "info": [],
    "stats": [],
    "watch": ["--count", "1", "--interval", "0.01"],
    "echo": ["--count", "1", "--timeout", "0.1"],
    "hz": ["--count", "1", "--duration", "0.1"],
    "bw": ["--count", "1", "--duration", "0.1"],
    "pub": ["hello"],
    "schema": [],
    "diagnose": [],
    "audit": [],
    "repair": [],
}


def error_argv(command: str, kind: str, broken: dict) -> list[str]:
    positional = COMMAND_ARGS[command][:1] if command == "pub" else []
    options = COMMAND_ARGS[command][len(positional):]
    if kind == "no_channel":
        return [command, *positional, *options]
    target = {"invalid_name": "bad/name", "two_channels": broken["missing"]}.get(kind) or broken[kind]
    extra = ["--topic", "imu"] if kind == "two_channels" else []
    return [command, target, *positional, *options, *extra]


@pytest.mark.parametrize(
    "command, kind",
    [(command, kind) for command in ("info", "echo", "pub", "repair") for kind in ERROR_KINDS
     if not (command == "info" and kind in ("old_version", "bad_geometry"))]  # info shows those (test_region_kinds)
    + [(command, "missing") for command in ("stats", "watch", "hz", "bw", "schema", "diagnose", "audit")]
    + [("audit", "old_version"), ("watch", "garbage")],
)
@on_layout4
def test_errors_are_one_line_and_exit_2(broken, command, kind):
    """Missing, garbage, empty or old-version regions, invalid names and
    ambiguous naming: one line on stderr, exit status 2, nothing changed."""
    before = {key: pathlib.Path(f"/dev/shm{path}").read_bytes() for key, path in broken.items() if key != "missing"}
    result = cli(*error_argv(command, kind, broken))
    assert_one_line_error(result, command, ERROR_KINDS[kind])
    if kind == "missing":
        assert broken["missing"] in result.error_lines[0]
    after = {key: pathlib.Path(f"/dev/shm{path}").read_bytes() for key, path in broken.items() if key != "missing"}
    assert after == before
    assert not os.path.exists(f"/dev/shm{broken['missing']}")


@pytest.mark.parametrize("kind", ["missing", "garbage", "old_version", "invalid_name"])
def test_schema_diff_errors(broken, name, kind):
    """schema-diff reports an unusable second region on one line, exit 2."""
    make(name)
    other = "bad/name" if kind == "invalid_name" else broken[kind]
    assert_one_line_error(cli("schema-diff", name, other), "schema-diff", ERROR_KINDS[kind])


def test_echo_when_every_ring_is_taken(prefix):
    """A mailbox's single ring belongs to its owner: echo cannot join."""
    inbox = Node("owner", prefix=prefix).create_mailbox("inbox", Config(**SMALL))
    result = cli("echo", "--mailbox", "owner", "inbox", "--prefix", prefix, "--timeout", "0.1")
    assert_one_line_error(result, "echo", "No free subscriber slots")
    inbox.close()


def test_pub_input_errors(name, tmp_path):
    """Too long a payload, bad hex, an unreadable file: refused, region untouched."""
    make(name)
    before = snapshot(name)
    assert_one_line_error(cli("pub", name, "x" * 65), "pub", "65 bytes exceed max_payload_size 64")
    assert_one_line_error(cli("pub", name, "0g", "--hex"), "pub", "not hexadecimal")
    assert_one_line_error(cli("pub", name, f"@{tmp_path / 'absent.bin'}"), "pub", "cannot read")
    assert snapshot(name) == before


def test_pub_without_data_says_the_data_is_missing(name):
    """`kickmsg pub /c` (argparse takes /c for the data): the error says the
    data is missing and how to give it, not that no channel was named."""
    make(name)
    before = snapshot(name)
    for channel in (name, name.lstrip("/")):
        assert_one_line_error(cli("pub", channel), "pub", f"no data to publish to {channel}",
                              f"kickmsg pub {channel} 'hello'")
    assert_one_line_error(cli("pub", "/absent_kmqa_channel"), "pub", "no data to publish to /absent_kmqa_channel")
    assert snapshot(name) == before


def test_pub_gives_up_when_the_pool_stays_empty(name):
    """This process holds 12 of the 16 slots allocated and a subscriber that
    never reads holds what it was sent: after 4 messages the pool is empty
    for good, and pub reports it on one line, saying who holds the slots."""
    region = make(name)
    with Subscriber(region):
        held = [Publisher(region).allocate(1) for _ in range(12)]
        result = cli("pub", name, "fill", "--count", "6")
        assert_one_line_error(result, "pub", "slot pool", "stayed empty", "4 held by ring entries",
                              "12 allocated or being written")
        assert rawregion.ring(rawregion.read_bytes(name), 0).write_pos == 4
        assert None not in held


# -- stats ---------------------------------------------------------------------------------------


@on_layout4
def test_stats_shows_our_subscribers_positions(name):
    """read_pos, pending and lost per ring come from the owner records
    (which a subscriber updates at most every 0.1 s: the last receive of
    each comes after such a pause, so the records are current)."""
    region = make(name)
    publisher = Publisher(region)
    lapped = Subscriber(region)  # ring 0
    for i in range(12):
        publisher.send(b"m%d" % i)
    assert lapped.try_receive() == b"m4"  # 4 overwritten, 1 read
    assert lapped.try_receive() == b"m5"
    reader = Subscriber(region)  # ring 1, joins at write_pos 0 of its ring
    publisher.send(b"n0")
    publisher.send(b"n1")
    time.sleep(0.15)  # past the report interval
    assert lapped.try_receive() == b"m6"
    assert reader.try_receive() == b"n0"

    stats = cli_json("stats", name)
    assert (stats["name"], stats["pool_size"], stats["pool_free"]) == (name, 16, free_slots(name))
    expected_common = {"in_flight": 0, "locked": 0}
    assert stats["rings"][0] == dict(
        expected_common, ring=0, state="Live", write_pos=14, held=8, owner_pid=os.getpid(), owner_alive=True,
        read_pos=7, pending=7, lost=4, dropped=None,
    )
    assert stats["rings"][1] == dict(
        expected_common, ring=1, state="Live", write_pos=2, held=2, owner_pid=os.getpid(), owner_alive=True,
        read_pos=1, pending=1, lost=0, dropped=None,
    )
    assert len(stats["rings"]) == 2 and stats["idle_rings"] == 1  # ring 2: Free, never written
    every = cli_json("stats", name, "--all-rings")
    assert every["rings"][2] == dict(
        expected_common, ring=2, state="Free", write_pos=0, held=0, owner_pid=None, owner_alive=None,
        read_pos=None, pending=None, lost=None, dropped=None,
    )
    assert every["idle_rings"] == 0

    text = cli("stats", name)
    assert text.code == 0
    lines = text.text.splitlines()
    assert lines[0] == f"{name}: pool {free_slots(name)}/16 slots free"
    assert lines[1].split() == "RING STATE IN_FLIGHT WRITE_POS HELD LOCKED OWNER_PID READ_POS PENDING LOST".split()
    assert lines[2].split() == ["0", "Live", "0", "14", "8", "0", str(os.getpid()), "7", "7", "4"]
    assert lines[4] == "1 idle ring (Free, never written; --all-rings lists them)"
    every_line = cli("stats", name, "--all-rings").text.splitlines()
    assert every_line[4].split() == ["2", "Free", "0", "0", "0", "0", "-", "-", "-", "-"]
    lapped.close()
    reader.close()


NATIVE_SUBSCRIBER = r"""
region = kickmsg.SharedRegion.open(P["name"])
subscriber = kickmsg.Subscriber(region)
ready()
wait_go()
done("ok")
"""


def test_stats_native_subscriber_rings_show_no_owner(name):
    """A native subscriber records no owner: its ring is Live with no
    read position, beside our recorded one."""
    create_in_child("native", name, creator="native-node")
    region = SharedRegion.open(name)
    with start_native(NATIVE_SUBSCRIBER, name=name) as native:
        native.wait_ready()  # ring 0
        ours = Subscriber(region)  # ring 1
        Publisher(region).send(b"both")
        rings = cli_json("stats", name)["rings"]
        assert (rings[0]["state"], rings[0]["write_pos"], rings[0]["owner_pid"], rings[0]["read_pos"]) == ("Live", 1, None, None)
        assert (rings[0]["pending"], rings[0]["lost"]) == (None, None)
        assert (rings[1]["state"], rings[1]["owner_pid"], rings[1]["read_pos"], rings[1]["pending"]) == ("Live", os.getpid(), 0, 1)
        ours.close()
        native.tell()
        assert native.result() == "ok"


DYING_SUBSCRIBER = r"""
region = kickmsg.SharedRegion.open(P["name"])
subscriber = kickmsg.Subscriber(region)
ready()
wait_go()
got = 0
while got < P["count"]:
    if subscriber.receive(5.0) is None:
        raise SystemExit("nothing arrived")
    got += 1
subscriber.receive(0.01)  # idle, waiting for more: its owner record is current
ready()
wait_go()
"""


@on_layout4
def test_stats_and_repair_of_a_subscriber_killed_with_sigkill(name):
    """A dead subscriber of ours shows as not alive; the default repair
    reclaims its ring, leaves live ones (ours: alive; native: unrecorded)."""
    region = make(name)
    with start_ours(DYING_SUBSCRIBER, name=name, count=3) as dying:
        dying.wait_ready()  # ring 0 (the native subscriber joins only after)
        with start_native(NATIVE_SUBSCRIBER, name=name) as native:
            native.wait_ready()  # ring 1
            alive = Subscriber(region)  # ring 2
            publisher = Publisher(region)
            for i in range(3):
                publisher.send(b"x%d" % i)
            dying.tell()
            dying.wait_ready()  # read all 3
            pid = dying.proc.pid
            os.kill(pid, signal.SIGKILL)
            dying.proc.wait(timeout=10)

            rings = cli_json("stats", name)["rings"]
            assert [(r["state"], r["owner_pid"], r["owner_alive"]) for r in rings] == [
                ("Live", pid, False), ("Live", None, None), ("Live", os.getpid(), True),
            ]
            assert (rings[0]["read_pos"], rings[0]["pending"], rings[0]["lost"]) == (3, 0, 0)
            diagnosis = cli_json("diagnose", name, code=1)
            assert (diagnosis["live_rings"], diagnosis["dead_subscriber_rings"], diagnosis["healthy"]) == (3, 1, False)
            assert [(r["owner_pid"], r["owner_alive"]) for r in cli_json("audit", name, code=1)["rings"]] == [
                (pid, False), (None, None), (os.getpid(), True)]

            repaired = cli_json("repair", name)
            assert repaired == {
                "name": name,
                "dead_subscribers": {"reclaimed": [[0, pid]], "unrecorded": [1], "timed_out": []},
                "dead_publishers_reclaimed": [],
                "locked_entries_repaired": 0,
                "free_rings_drained": [],  # layout 4's reclaim drains the ring itself
            }
            rings = cli_json("stats", name)["rings"]
            assert [r["state"] for r in rings] == ["Free", "Live", "Live"]
            assert rings[0]["held"] == 0  # the dead subscriber's references were drained
            alive.close()
            native.tell()
            assert native.result() == "ok"
    assert cli("audit", name).code == 0
    rawregion.assert_pool_whole(name)


# -- watch ---------------------------------------------------------------------------------------


def test_watch_json_lines_while_a_thread_publishes(name, layout):
    """One JSON object per refresh; msgs_per_s and new_lost from the second
    on, consistent with how write_pos moved."""
    region = make(name)
    subscriber = Subscriber(region)  # never reads: the publisher just wraps its ring
    stop = threading.Event()

    def publish():
        publisher = Publisher(region)
        while not stop.is_set():
            publisher.send(b"tick")
            time.sleep(0.002)

    thread = threading.Thread(target=publish, daemon=True)
    thread.start()
    try:
        result = cli("watch", name, "--count", "4", "--interval", "0.2", "--json")
    finally:
        stop.set()
        thread.join(10)
    assert result.code == 0, result.err
    refreshes = result.json_lines()
    assert len(refreshes) == 4
    positions = [refresh["rings"][0]["write_pos"] for refresh in refreshes]
    assert positions == sorted(positions) and positions[-1] > positions[0]
    for index, refresh in enumerate(refreshes):
        assert refresh["name"] == name and 0 <= refresh["pool_used"] <= 16
        assert refresh["verdict"].startswith(("clean:", "DAMAGED:"))
        assert [ring["state"] for ring in refresh["rings"]] == ["Live"] and refresh["idle_rings"] == 2
        assert refresh["rings"][0]["owner_pid"] == os.getpid()
        if index == 0:
            assert all(ring["msgs_per_s"] is None and ring["new_lost"] is None for ring in refresh["rings"])
            continue
        assert refresh["time"] > refreshes[index - 1]["time"]
        live, *free = refresh["rings"]
        moved = positions[index] - positions[index - 1]
        assert live["msgs_per_s"] >= 0 and (live["msgs_per_s"] > 0) == (moved > 0)
        assert live["new_lost"] == 0  # the subscriber never read, so its record never changed
        assert all(ring["msgs_per_s"] == 0 and ring["new_lost"] is None for ring in free)
    subscriber.close()


def test_watch_text_screens(name):
    """Plain screens (no terminal: no escape codes): header, verdict, table."""
    region = make(name)
    quiet = cli("watch", name, "--count", "2", "--interval", "0.05")
    assert quiet.code == 0
    assert "\x1b" not in quiet.text
    assert quiet.text.count(f"{name}  ") == 2 and quiet.text.count("no active rings") == 2
    assert "pool 0/16 in use" in quiet.text and "clean: 16 of 16 slots free, 0 live rings" in quiet.text

    with Subscriber(region):
        busy = cli("watch", name, "--count", "2", "--interval", "0.05")
    assert busy.code == 0
    header = "RING STATE IN_FLIGHT WRITE_POS MSGS_PER_S PENDING LOST NEW_LOST".split()
    lines = [line.split() for line in busy.text.splitlines()]
    assert lines.count(header) == 2
    assert lines[lines.index(header) + 1][:2] == ["0", "Live"]


# -- echo ----------------------------------------------------------------------------------------


MESSAGES = [b"hello 0", b"\xff\xfebin", "café".encode()]
EXPECTED_ECHO = {
    "text": ["[0] hello 0", "[1] \\xff\\xfebin", "[2] café"],
    "hex": ["[0] " + MESSAGES[0].hex(), "[1] " + MESSAGES[1].hex(), "[2] " + MESSAGES[2].hex()],
}


@pytest.mark.parametrize("form", ["text", "hex", "json", "json-flag", "raw"])
def test_echo_prints_messages_in_each_format(name, form, layout):
    """echo --count 3 prints the three messages published after it joined, then leaves its ring."""
    region = make(name)
    options = ["--json"] if form == "json-flag" else ["--format", form]
    with Running("echo", name, "--count", "3", "--timeout", "10", *options) as echo:
        wait_parked(name, 0, echo)
        publisher = Publisher(region)
        for message in MESSAGES:
            publisher.send(message)
        result = echo.finish()
    assert result.code == 0 and result.err == b""
    if form == "raw":
        assert result.out == b"".join(MESSAGES)
    elif form in ("json", "json-flag"):
        assert result.json_lines() == [
            {"ring_pos": i, "size": len(m), "text": m.decode(errors="backslashreplace"), "hex": m.hex()}
            for i, m in enumerate(MESSAGES)
        ]
    else:
        assert result.text.splitlines() == EXPECTED_ECHO[form]
    assert live_rings(name) == []  # echo left its ring
    rawregion.assert_pool_whole(name)


def test_echo_timeout_stops_before_count(name):
    """--timeout ends echo when nothing more arrives, with what it printed
    (exit status 1 if that was before --count messages)."""
    region = make(name)
    idle = cli("echo", name, "--timeout", "0.2")
    assert (idle.code, idle.out, idle.err) == (0, b"", b"")
    with Running("echo", name, "--count", "5", "--timeout", "0.5") as echo:
        wait_live(name, 1, echo)
        Publisher(region).send(b"only")
        Publisher(region).send(b"two")
        result = echo.finish()
    assert result.code == 1  # --count was not reached
    assert result.text.splitlines() == ["[0] only", "[1] two"]
    assert result.error_lines == ["kickmsg echo: stopped: no message for 0.5 s (2 of 5 messages arrived)"]


IMU = typed.RecordType("Imu", [("ax", "<f4"), ("ay", "<f4"), ("n", "<u4")])


def test_echo_typed_channel_prints_fields(prefix):
    """A kickmsg.typed channel: echo decodes each record's fields; a message
    that is not whole records falls back to text and hex."""
    name = f"/{prefix}_imu"
    publisher = typed.advertise(Node("imu-node", prefix=prefix), "imu", IMU, Config(**SMALL))
    with Running("echo", "--topic", "imu", "--prefix", prefix, "--count", "3", "--timeout", "10", "--json") as as_json, \
            Running("echo", "--topic", "imu", "--prefix", prefix, "--count", "3", "--timeout", "10") as as_text:
        wait_live(name, 2, as_json, as_text)
        publisher.send((1.5, -2.0, 7))
        publisher.send([(0.25, 0.5, 1), (0.75, 1.0, 2)])
        Publisher(SharedRegion.open(name)).send(b"abc")  # untyped bytes on the typed channel
        json_result, text_result = as_json.finish(), as_text.finish()
    assert json_result.code == 0 and text_result.code == 0
    assert json_result.json_lines() == [
        {"ring_pos": 0, "size": 12, "fields": [{"ax": 1.5, "ay": -2.0, "n": 7}]},
        {"ring_pos": 1, "size": 24, "fields": [{"ax": 0.25, "ay": 0.5, "n": 1}, {"ax": 0.75, "ay": 1.0, "n": 2}]},
        {"ring_pos": 2, "size": 3, "text": "abc", "hex": "616263"},
    ]
    assert text_result.text.splitlines() == [
        "[0] ax=1.5 ay=-2.0 n=7",
        "[1] ax=0.25 ay=0.5 n=1; ax=0.75 ay=1.0 n=2",
        "[2] abc",
    ]


def test_echo_json_of_a_typed_channel_with_a_bytes_field(prefix):
    """A record with an S8 field still gives one JSON line per message."""
    tagged = typed.RecordType("Tagged", [("tag", "S8"), ("x", "<f4")])
    publisher = typed.advertise(Node("tag-node", prefix=prefix), "tagged", tagged, Config(**SMALL))
    with Running("echo", "--topic", "tagged", "--prefix", prefix, "--count", "1", "--timeout", "10", "--json") as echo:
        wait_live(f"/{prefix}_tagged", 1, echo)
        publisher.send((b"abc", 1.5))
        result = echo.finish()
    assert (result.code, result.err) == (0, b"")
    [line] = result.json_lines()
    assert line["size"] == 12 and line["fields"][0]["x"] == 1.5
    assert line["fields"][0]["tag"] in ("abc", "616263")  # as text or as hex


NATIVE_PUBLISHER = r"""
if P.get("create"):
    region = kickmsg.SharedRegion.create(P["name"], kickmsg.ChannelType.PubSub, make_config(P["config"]), "native-pub")
else:
    region = kickmsg.SharedRegion.open(P["name"])
publisher = kickmsg.Publisher(region)
ready()
wait_go()
import time
for payload in P["payloads"]:
    publisher.send(bytes.fromhex(payload))
    time.sleep(0.001)
done(len(P["payloads"]))
"""


def test_echo_a_channel_created_and_fed_by_native(name):
    """A region created by native, messages published by native, echoed as hex."""
    payloads = [b"native %d" % i for i in range(3)]
    with start_native(NATIVE_PUBLISHER, name=name, create=True, config=SMALL, payloads=[p.hex() for p in payloads]) as native:
        native.wait_ready()
        with Running("echo", name, "--count", "3", "--timeout", "10", "--format", "hex") as echo:
            wait_live(name, 1, echo)
            native.tell()
            assert native.result() == 3
            result = echo.finish()
    assert result.code == 0
    assert result.text.splitlines() == [f"[{i}] {p.hex()}" for i, p in enumerate(payloads)]


# -- hz and bw ---------------------------------------------------------------------------------------


def test_hz_counts_messages_of_this_process(name, layout):
    """hz --count 20 --json: a final report over the 20 messages (its last JSON line)."""
    region = make(name, **ROOMY)
    with Running("hz", name, "--count", "20", "--json") as hz:
        wait_parked(name, 0, hz)
        publisher = Publisher(region)
        for i in range(20):
            publisher.send(b"beat %d" % i)
            time.sleep(0.001)
        result = hz.finish()
    assert result.code == 0, result.err
    report = result.json_lines()[-1]
    assert (report["messages"], report["window"], report["final"]) == (20, 19, True)
    assert report["rate_hz"] > 0
    assert 0 <= report["min_s"] <= report["max_s"] and report["std_s"] >= 0


@on_layout4
def test_bw_counts_sizes_from_a_native_publisher(name):
    """bw --count 20 --json: sizes 1..20 bytes published by native."""
    make(name, **ROOMY)
    payloads = [bytes([i]) * i for i in range(1, 21)]
    with start_native(NATIVE_PUBLISHER, name=name, payloads=[p.hex() for p in payloads]) as native:
        native.wait_ready()
        with Running("bw", name, "--count", "20", "--json") as bw:
            wait_live(name, 1, bw)
            native.tell()
            assert native.result() == 20
            result = bw.finish()
    assert result.code == 0, result.err
    report = result.json_lines()[-1]
    assert (report["messages"], report["window"], report["final"]) == (20, 20, True)
    assert (report["min_size"], report["max_size"], report["mean_size"]) == (1, 20, 10.5)
    assert report["bytes_per_s"] > 0


def test_hz_and_bw_text_reports(name):
    """Without --json: the rosbag-style summary lines."""
    region = make(name, **ROOMY)
    with Running("hz", name, "--count", "5") as hz, Running("bw", name, "--count", "5") as bw:
        wait_live(name, 2, hz, bw)
        publisher = Publisher(region)
        for i in range(5):
            publisher.send(b"12345678")
            time.sleep(0.001)
        hz_result, bw_result = hz.finish(), bw.finish()
    assert hz_result.code == 0 and bw_result.code == 0
    assert hz_result.text.splitlines()[-2].startswith("average rate: ")
    assert "window: 4" in hz_result.text.splitlines()[-1]
    assert bw_result.text.splitlines()[-2].endswith(" B/s")
    assert bw_result.text.splitlines()[-1].split() == "mean: 8.0 B min: 8 B max: 8 B window: 5".split()


def test_hz_and_bw_duration_without_messages(name):
    """--duration ends a silent measurement with an empty final report."""
    make(name)
    with Running("hz", name, "--duration", "0.3", "--json") as hz, Running("bw", name, "--duration", "0.3", "--json") as bw:
        hz_result, bw_result = hz.finish(), bw.finish()
    assert hz_result.json_lines()[-1] == {"messages": 0, "rate_hz": None, "final": True, "stopped": "duration"}
    assert bw_result.json_lines()[-1] == {"messages": 0, "bytes_per_s": None, "final": True, "stopped": "duration"}
    assert (hz_result.code, bw_result.code) == (0, 0)
    assert live_rings(name) == []


def test_hz_and_bw_count_larger_than_window_stop(name):
    """--count 12 --window 5: both stop after the 12th message."""
    region = make(name, **ROOMY)
    with Running("hz", name, "--count", "12", "--window", "5", "--json") as hz, \
            Running("bw", name, "--count", "12", "--window", "5", "--json") as bw:
        wait_live(name, 2, hz, bw)
        publisher = Publisher(region)
        for i in range(12):
            publisher.send(b"m%02d" % i)
        hz_result, bw_result = hz.finish(timeout=3), bw.finish(timeout=3)  # a working one ends at once
    assert hz_result.code == 0 and bw_result.code == 0
    assert hz_result.json_lines()[-1]["window"] == 5 and bw_result.json_lines()[-1]["window"] == 5


# -- pub -------------------------------------------------------------------------------------------


def test_pub_text_hex_and_file_reach_our_subscriber(name, tmp_path, layout):
    """pub TEXT --count --rate, pub HEX --hex and pub @FILE, read by our subscriber."""
    region = make(name)
    subscriber = Subscriber(region)
    assert cli_json("pub", name, "hello", "--count", "3", "--rate", "200") == {
        "name": name, "published": 3, "size": 5, "dropped": 0}
    hexed = cli("pub", name, "01ff", "--hex")
    assert (hexed.code, hexed.text.strip()) == (0, f"published 1 message(s) of 2 bytes to {name}")
    blob = tmp_path / "frame.bin"
    blob.write_bytes(bytes(range(40)))
    assert cli("pub", name, f"@{blob}").code == 0
    assert list(subscriber) == [b"hello"] * 3 + [b"\x01\xff", bytes(range(40))]
    subscriber.close()
    rawregion.assert_pool_whole(name)


NATIVE_RECEIVER = r"""
region = kickmsg.SharedRegion.create(P["name"], kickmsg.ChannelType.PubSub, make_config(P["config"]), "native-sub")
subscriber = kickmsg.Subscriber(region)
ready()
import time
got, deadline = [], time.monotonic() + 20
while len(got) < P["count"] and time.monotonic() < deadline:
    data = subscriber.receive(0.1)
    if data is not None:
        got.append(bytes(data).hex())
done(got)
"""


def test_pub_reaches_a_native_subscriber(prefix):
    """pub --topic/--prefix into a native topic, read by a native subscriber."""
    name = f"/{prefix}_cmd"
    with start_native(NATIVE_RECEIVER, name=name, config=SMALL, count=4) as native:
        native.wait_ready()
        assert cli_json("pub", "go native", "--count", "3", "--topic", "cmd", "--prefix", prefix)["published"] == 3
        assert cli_json("pub", "00ff10", "--hex", "--topic", "cmd", "--prefix", prefix)["size"] == 3
        assert native.result() == [b"go native".hex()] * 3 + ["00ff10"]


# -- schema and schema-diff ----------------------------------------------------------------------


def test_schema_of_our_native_typed_and_bare_regions(prefix):
    """The descriptor as stored by us, by native and by kickmsg.typed; none on a bare region."""
    ours, native, bare = f"/{prefix}_ours", f"/{prefix}_native", f"/{prefix}_bare"
    make(ours, schema=schema_info())
    run_native(CREATE, name=native, creator="n", config=dict(SMALL, schema=dict(SCHEMA, name="native.Pose")))
    make(bare)
    typed.advertise(Node("imu-node", prefix=prefix), "imu", IMU)

    expected = {k: v for k, v in SCHEMA.items()}
    assert cli_json("schema", ours) == {"name": ours, "schema": expected}
    assert cli_json("schema", native)["schema"] == dict(expected, name="native.Pose")
    assert cli_json("schema", bare) == {"name": bare, "schema": None}
    bare_text = cli("schema", bare)
    assert (bare_text.code, bare_text.text.strip()) == (0, f"{bare}: no schema descriptor")

    typed_schema = cli_json("schema", "--topic", "imu", "--prefix", prefix)
    assert typed_schema["schema"]["name"] == IMU.description
    assert typed_schema["schema"]["identity"] == IMU.schema.identity.hex()
    assert typed_schema["record_dtype"] == str(IMU.dtype)
    text = cli("schema", "--topic", "imu", "--prefix", prefix)
    fields = dict(line.split(None, 1) for line in text.text.splitlines() if not line.startswith("record dtype"))
    assert fields["name"] == IMU.description and fields["version"] == "0"
    assert f"record dtype   {IMU.dtype}" in text.text.splitlines()


def test_schema_diff_exit_status(prefix):
    """0 when equal, 1 with the differing fields otherwise."""
    names = {key: f"/{prefix}_{key}" for key in ("a", "native_a", "version", "renamed", "bare", "bare2")}
    make(names["a"], schema=schema_info())
    run_native(CREATE, name=names["native_a"], creator="n", config=dict(SMALL, schema=SCHEMA))
    make(names["version"], schema=schema_info(dict(SCHEMA, version=4)))
    make(names["renamed"], schema=schema_info(dict(SCHEMA, name="other", identity="ff" * 64)))
    make(names["bare"])
    make(names["bare2"])

    same = cli("schema-diff", names["a"], names["native_a"])
    assert (same.code, same.text.strip()) == (0, "equal")
    assert cli_json("schema-diff", names["a"], names["native_a"]) == {"equal": True, "differences": []}
    assert cli_json("schema-diff", names["a"], names["version"], code=1) == {"equal": False, "differences": ["Version"]}
    renamed = cli("schema-diff", names["a"], names["renamed"])
    assert (renamed.code, renamed.text.strip()) == (1, "differ: Identity, Name")
    assert cli_json("schema-diff", names["a"], names["bare"], code=1) == {
        "equal": False, "differences": [], "without_schema": [names["bare"]],
    }
    assert cli_json("schema-diff", names["bare"], names["bare2"].lstrip("/"))["equal"] is True


# -- diagnose, audit and repair -------------------------------------------------------------------------


NATIVE_TRAFFIC = r"""
region = kickmsg.SharedRegion.create(P["name"], kickmsg.ChannelType.PubSub, make_config(P["config"]), "native")
subscribers = [kickmsg.Subscriber(region) for _ in range(2)]
publisher = kickmsg.Publisher(region)
for i in range(5):
    publisher.send(bytes([i]) * 10)
subscribers[0].try_receive()
ready()
wait_go()
done("ok")
"""


def test_diagnose_and_audit_pass_clean_regions(name, prefix):
    """Ours after traffic, and a native one with live native subscribers."""
    region = make(name)
    with Subscriber(region) as subscriber:
        for i in range(10):
            Publisher(region).send(b"%d" % i)
        subscriber.try_receive()
        diagnosis = cli_json("diagnose", name)
        assert diagnosis == {"locked_entries": 0, "retired_rings": 0, "draining_rings": 0, "live_rings": 1,
                             "schema_stuck": False, "dead_subscriber_rings": 0, "pool_too_small": False,
                             "stranded_slots": 0, "healthy": True}
        report = cli_json("audit", name)
        assert report["clean"] is True and report["verdict"] == f"clean: {free_slots(name)} of 16 slots free, 1 live rings"
        assert [(r["state"], r["write_pos"], r["references"]) for r in report["rings"]] == [("Live", 10, 8)]
        assert report["idle_rings"] == 2
    native = f"/{prefix}_native"
    with start_native(NATIVE_TRAFFIC, name=native, config=SMALL) as peer:
        peer.wait_ready()
        assert cli("diagnose", native).code == 0
        text = cli("audit", native)
        assert (text.code, text.text.strip()) == (0, "clean: 11 of 16 slots free, 2 live rings")
        peer.tell()
        assert peer.result() == "ok"


NATIVE9_SUBSCRIBED_REGION = r"""
config = make_config(P["config"])
region = kickmsg.SharedRegion.create(P["name"], kickmsg.ChannelType.PubSub, config, "native-0.9.2")
subscriber = kickmsg.Subscriber(region)
publisher = kickmsg.Publisher(region)
for i in range(3):
    publisher.send(b"n%d" % i)
ready()
wait_go()
"""


def test_tools_on_a_region_made_by_native_0_9_2(name):
    """A layout-9 region native 0.9.2 made, with its live subscriber: list,
    info, stats, diagnose and audit see it as it is (the subscriber's pid
    from its ring header); once that subscriber is killed, stats and audit
    show it dead and repair reclaims its ring (reclaim_dead_rings); pub and
    echo then carry messages across the implementations."""
    with start_native9(NATIVE9_SUBSCRIBED_REGION, name=name, config=SMALL) as native:
        native.wait_ready()
        pid = native.proc.pid
        [row] = cli_json("list", "--prefix", name[1:])
        assert (row["type"], row["version"], row["creator"], row["pid"], row["alive"]) == ("PubSub", 9, "native-0.9.2", pid, True)
        assert (row["subs_live"], row["pool_free"], row["health"]) == (1, 13, "clean: 13 of 16 slots free, 1 live rings")
        info = cli_json("info", name)
        assert (info["version"], info["creator_pid"], info["creator_name"], info["pool_size"]) == (9, pid, "native-0.9.2", 16)
        [ring] = cli_json("stats", name)["rings"]
        assert (ring["state"], ring["write_pos"], ring["held"], ring["owner_pid"], ring["owner_alive"]) == ("Live", 3, 3, pid, True)
        assert (ring["lost"], ring["dropped"]) == (0, 0)
        assert cli_json("diagnose", name)["healthy"] is True
        assert cli_json("audit", name)["clean"] is True
        os.kill(pid, signal.SIGKILL)
        native.proc.wait(timeout=10)
    [ring] = cli_json("stats", name)["rings"]
    assert (ring["state"], ring["owner_pid"], ring["owner_alive"]) == ("Live", pid, False)
    assert cli_json("diagnose", name, code=1)["dead_subscriber_rings"] == 1
    assert cli_json("audit", name, code=1)["verdict"].startswith("DAMAGED: rings held by dead subscribers: 1;")
    repaired = cli_json("repair", name)
    assert repaired["dead_subscribers"] == {"reclaimed": [[0, pid]], "unrecorded": [], "timed_out": [],
                                            "claims_given_back": {"0": 3}}  # its claims went back with it
    assert cli_json("stats", name)["rings"][0]["state"] == "Free"
    assert cli_json("audit", name)["clean"] is True
    with Running("echo", name, "--count", "1", "--timeout", "20") as echo:
        wait_parked(name, 0, echo)
        run_native9('publisher = kickmsg.Publisher(kickmsg.SharedRegion.open(P["name"]))\n'
                    'done(publisher.send(b"from native"))', name=name)
        result = echo.finish()
    assert (result.code, result.text) == (0, "[3] from native\n")  # the reclaimed ring kept its write position
    assert cli("pub", name, "to native").code == 0  # no subscriber: dropped by nobody, nothing breaks
    assert cli_json("audit", name)["clean"] is True


@on_layout4
def test_locked_entry_is_found_and_repaired(name):
    """diagnose/audit exit 1 on a LOCKED entry; the default repair commits it."""
    make(name)
    poke_locked_entry(name, 1)
    diagnosis = cli("diagnose", name)
    assert diagnosis.code == 1
    assert ["locked_entries", "1"] in [line.split() for line in diagnosis.text.splitlines()]
    assert cli_json("diagnose", name, code=1)["healthy"] is False
    audited = cli("audit", name)
    assert audited.code == 1
    assert audited.text.splitlines()[0].startswith("DAMAGED: locked entries: 1;")
    assert "  ring 1 locked_entries: [0]" in audited.text.splitlines()
    [ring] = cli_json("audit", name, code=1)["rings"]  # ring 0 is idle: counted, not listed
    assert (ring["index"], ring["locked_entries"]) == (1, [0])

    repaired = cli_json("repair", name)
    assert repaired["locked_entries_repaired"] == 1
    assert rawregion.ring(rawregion.read_bytes(name), 1).entries[0] == (1, 0xFFFFFFFF, 0)
    assert cli("diagnose", name).code == 0
    assert cli("audit", name).code == 0


def test_leaked_slot_needs_orphans_with_yes(name):
    """A leaked refcount: audit exits 1 (diagnose does not see leaks);
    --orphans refuses without --yes off a terminal, reclaims with it."""
    make(name)
    leaked = poke_leaked_slot(name)
    report = cli_json("audit", name, code=1)
    assert (report["leaked_slots"], report["free_slots"]) == ([leaked], 15)
    assert cli("diagnose", name).code == 0

    before = snapshot(name)
    assert_one_line_error(cli("repair", name, "--orphans"), "repair", "--yes", "not a terminal")
    assert_one_line_error(cli("repair", name, "--orphans", input=b"y\n"), "repair", "--yes")
    assert snapshot(name) == before
    assert cli_json("repair", name, "--orphans", "--yes") == {
        "name": name, "orphaned_slots_reclaimed": 1, "orphaned_slots_given_back": [leaked], "refcounts_corrected": [],
    }
    assert cli("audit", name).code == 0
    rawregion.assert_pool_whole(name)


def test_retired_ring_needs_retired_with_yes(name):
    """A Free ring with a publisher in flight: only --retired --yes resets it."""
    make(name)
    poke(name, ring_offset(name, 2), "<I", 1 << 2 | FREE)
    assert cli_json("diagnose", name, code=1)["retired_rings"] == 1

    before = snapshot(name)
    assert_one_line_error(cli("repair", name, "--retired"), "repair", "--retired", "--yes")
    assert snapshot(name) == before
    safe = cli_json("repair", name)  # the default repairs leave retired rings alone
    assert safe["locked_entries_repaired"] == 0
    assert cli("diagnose", name).code == 1

    assert cli_json("repair", name, "--retired", "--yes") == {
        "name": name, "free_rings_drained": [], "retired_rings_reset": 1,
        "retired_rings_drained": [{"ring": 2, "in_flight": 1, "slots": []}],
    }
    ring = rawregion.ring(rawregion.read_bytes(name), 2)
    assert (ring.state, ring.in_flight) == (FREE, 0)
    assert cli("diagnose", name).code == 0
    assert cli("audit", name).code == 0


def test_repair_text_output(name):
    """Without --json: one sentence per repair done."""
    make(name)
    result = cli("repair", name)
    assert result.code == 0
    assert result.text.splitlines() == ["no ring is held by a dead subscriber", "repaired 0 locked entries"]
    poke_locked_entry(name, 1)
    poke(name, ring_offset(name, 2), "<I", 1 << 2 | FREE)
    result = cli("repair", name, "--locked", "--retired", "--yes")
    assert (result.code, result.text.splitlines()) == (0, ["repaired 1 locked entry", "reset 1 retired ring"])


def test_repair_asks_on_a_terminal(name):
    """On a terminal, --retired asks: 'n' cancels, 'y' repairs."""
    make(name)
    poke(name, ring_offset(name, 0), "<I", 1 << 2 | FREE)
    before = snapshot(name)
    for answer, code in ((b"n\n", 2), (b"y\n", 0)):
        controller, terminal = os.openpty()
        try:
            os.write(controller, answer)
            done = subprocess.run(command_line(["repair", name, "--retired"]), stdin=terminal, capture_output=True, timeout=20)
        finally:
            os.close(terminal)
            os.close(controller)
        assert done.returncode == code, done.stderr
        assert "Continue? [y/N]" in done.stdout.decode()
        if code == 2:
            assert done.stderr.decode().strip() == "kickmsg repair: error: cancelled"
            assert snapshot(name) == before
    assert cli("diagnose", name).code == 0


def first_line(command: Running, timeout: float = 15, stream: str = "stdout") -> bytes:
    """The next line of a running command's stdout (or stderr); fail if none comes."""
    fd, line = getattr(command.proc, stream).fileno(), b""
    deadline = time.monotonic() + timeout
    while not line.endswith(b"\n"):
        ready, _, _ = select.select([fd], [], [], max(0.0, deadline - time.monotonic()))
        chunk = os.read(fd, 1) if ready else b""
        if not chunk:
            pytest.fail(f"kickmsg {command.args} printed no line")
        line += chunk
    return line


def test_ctrl_c_ends_watch_echo_and_hz_cleanly(name):
    """SIGINT: exit 0, hz still prints its final report, rings are left."""
    make(name)
    with Running("watch", name, "--interval", "0.05", "--json") as watch, \
            Running("echo", name) as echo, Running("hz", name, "--json") as hz:
        wait_live(name, 2, echo, hz)
        assert json.loads(first_line(watch))["name"] == name
        for command in (watch, echo, hz):
            command.proc.send_signal(signal.SIGINT)
        watched, echoed, measured = watch.finish(), echo.finish(), hz.finish()
    assert (watched.code, echoed.code, measured.code) == (0, 0, 0)
    assert all(refresh["name"] == name for refresh in watched.json_lines())  # whole lines only
    assert echoed.out == b""
    assert measured.json_lines()[-1] == {"messages": 0, "rate_hz": None, "final": True, "stopped": "signal"}
    assert live_rings(name) == []


# -- inspection never writes ------------------------------------------------------------------------


INSPECTIONS = [
    ["info"], ["stats"], ["watch", "--count", "2", "--interval", "0.05"], ["schema"], ["diagnose"], ["audit"],
]


@on_layout4
def test_inspection_commands_do_not_modify_our_region(prefix):
    """Every byte of a quiescent region (and of its owner sidecar) is the
    same after list, info, stats, watch, schema, schema-diff, diagnose, audit."""
    name = f"/{prefix}_quiet"
    region = make(name, schema=schema_info())
    first, second = Subscriber(region), Subscriber(region)
    publisher = Publisher(region)
    for i in range(11):
        publisher.send(b"q%d" % i)
    first.try_receive()
    view = second.try_receive_view()  # a pin held while inspecting
    poke_locked_entry(name, 2)  # and some damage
    before = snapshot(name)
    assert before[1] is not None
    for form in ([], ["--json"]):
        runs = [cli(*command[:1], name, *command[1:], *form) for command in INSPECTIONS]
        runs += [cli("list", "--prefix", prefix, *form), cli("schema-diff", name, name, *form)]
        assert [run.code for run in runs] == [0, 0, 0, 0, 1, 1, 0, 0], [run.err for run in runs]
        assert snapshot(name) == before
    view.release()
    first.close()
    second.close()


def test_inspection_commands_do_not_modify_a_native_region(name):
    """The same for a native region with live native subscribers (no sidecar appears)."""
    with start_native(NATIVE_TRAFFIC, name=name, config=dict(SMALL, schema=SCHEMA)) as peer:
        peer.wait_ready()
        before = snapshot(name)
        assert before[1] is None  # native subscribers keep no owner records
        for command in INSPECTIONS + [["list", "--prefix", name[1:]]]:
            result = cli(*command[:1], *([] if command[0] == "list" else [name]), *command[1:], "--json")
            assert result.code == 0, (command, result.err)
            assert snapshot(name) == before, command
        assert cli("schema-diff", name, name).code == 0
        assert snapshot(name) == before
        peer.tell()
        assert peer.result() == "ok"


# -- clean -----------------------------------------------------------------------------------------------


HOLDER = r"""
region = kickmsg.SharedRegion.open(P["name"])
ready()
wait_go()
done("ok")
"""


def test_clean_removes_only_regions_of_dead_creators_that_nobody_maps(prefix):
    """--dry-run lists, clean removes: regions whose creator died and that no
    process maps, and sidecars whose region is gone; everything else stays,
    and a region of a dead creator still mapped is said to be in use."""
    names = {key: f"/{prefix}_{key}" for key in ("dead", "dead_native", "mapped", "live", "old", "garbage")}
    create_in_child("ours", names["dead"])
    create_in_child("native", names["dead_native"])
    create_in_child("ours", names["mapped"])
    make(names["live"])
    create_in_child("ours", names["old"])
    poke(names["old"], 8, "<I", 5)
    pathlib.Path(f"/dev/shm{names['garbage']}").write_bytes(b"not a region" * 10)
    pathlib.Path(owners.sidecar_path(names["dead"])).write_bytes(bytes(48 * 3))
    orphan_sidecar = f"/{prefix}_gone.owners"
    pathlib.Path(f"/dev/shm{orphan_sidecar}").write_bytes(bytes(48))
    exists = lambda name: os.path.exists(f"/dev/shm{name}")

    with start_ours(HOLDER, name=names["mapped"]) as holder:
        holder.wait_ready()
        dry = cli_json("clean", "--prefix", prefix, "--dry-run")
        assert {key: dry[key] for key in ("dry_run", "removed", "sidecars", "in_use", "unproven", "failed")} == {
            "dry_run": True, "removed": [names["dead"], names["dead_native"]], "sidecars": [orphan_sidecar],
            "in_use": [names["mapped"]], "unproven": [], "failed": []}
        dry_text = cli("clean", "--prefix", prefix, "--dry-run")
        assert dry_text.text.splitlines() == [
            f"would remove {names['dead']}", f"would remove {names['dead_native']}", f"would remove {orphan_sidecar}",
            f"left {names['mapped']}: its creator is dead, but a process has it open or mapped"]
        assert all(exists(name) for name in names.values()) and exists(orphan_sidecar)

        cleaned = cli_json("clean", "--prefix", prefix)
        assert (cleaned["dry_run"], cleaned["removed"], cleaned["sidecars"]) == (
            False, [names["dead"], names["dead_native"]], [orphan_sidecar])
        assert [key for key, name in names.items() if exists(name)] == ["mapped", "live", "old", "garbage"]
        assert not exists(orphan_sidecar)
        assert not os.path.exists(owners.sidecar_path(names["dead"]))  # removed with its region
        holder.tell()
        assert holder.result() == "ok"

    after_holder = cli("clean", "--prefix", prefix)
    assert (after_holder.code, after_holder.text.splitlines()) == (0, [f"removed {names['mapped']}"])
    assert [key for key, name in names.items() if exists(name)] == ["live", "old", "garbage"]
    nothing = cli("clean", "--prefix", prefix)
    assert (nothing.code, nothing.text.splitlines()) == (0, ["nothing to clean"])
