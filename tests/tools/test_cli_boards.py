"""``kickmsg registry``, ``kickmsg blackboard``/``bb`` and ``kickmsg bbwatch``
against regions of the native kickmsg 0.9.2 wheel (run in subprocesses,
tests/nativepeer.py) and of this package.

Everything lives under the test's ``prefix`` namespace (registry and boards
included) and is removed whatever the outcome; waits are on a child's
``ready`` line or on a command's output line, bounded by a deadline.
"""
import base64
import contextlib
import json
import os
import select
import signal
import subprocess

import pytest

from kickmsg import Blackboard, BlackboardConfig, ChannelType, Config, Node, Registry, SharedRegion
from kickmsg.ops import diagnostics
from kickmsg.protocol.v9.registry import Kind, NodeRows, Role
from nativepeer import run_native9, start_native9
from test_cli import Running, assert_one_line_error, cli, cli_json, command_line

NATIVE_NODE = r'''
n = kickmsg.Node(P["name"], P["ns"])
pub = n.advertise("robot/arm")
sub = n.subscribe_or_create("cmd", kickmsg.Config())
board = n.blackboard("state", kickmsg.BlackboardConfig())
w = board.declare(P["key"])
w.write(P["key"].encode())
ready()
wait_go()
done(0)
'''


@contextlib.contextmanager
def two_native_nodes(prefix):
    """Native nodes "alive" (key "a") and "killed" (key "k"), each ready,
    started one after the other: 0.9.2's advertise unlinks the topic and
    creates it exclusively (WIRE9.md B.1), so two advertising at once can
    fail with "File exists"."""
    with start_native9(NATIVE_NODE, ns=prefix, name="alive", key="a") as alive:
        alive.wait_ready()
        with start_native9(NATIVE_NODE, ns=prefix, name="killed", key="k") as killed:
            killed.wait_ready()
            yield alive, killed


def read_line(proc, seconds: float = 20) -> str:
    """The next stdout line of a running command, failing after ``seconds``."""
    line = b""
    while not line.endswith(b"\n"):
        readable, _, _ = select.select([proc.stdout], [], [], seconds)
        assert readable, f"no output line within {seconds} s (got {line!r})"
        chunk = os.read(proc.stdout.fileno(), 1)
        assert chunk, f"the command ended (got {line!r})"
        line += chunk
    return line.decode()


def participants(topic: dict, side: str) -> list:
    return sorted((p["node_name"], p["stalled"]) for p in topic[side])


def test_registry_shows_native_and_our_rows_marks_the_dead_and_sweeps(prefix):
    """A native node alive, a native node killed, our node: `kickmsg
    registry` lists all three by topic, the killed one stalled; --sweep frees it."""
    with two_native_nodes(prefix) as (alive, killed):
        os.kill(killed.proc.pid, signal.SIGKILL)
        killed.kill()
        sub = Node("py", namespace=prefix, layout=9).subscribe("robot/arm")
        got = cli_json("registry", prefix)
        assert (got["name"], got["namespace"], got["swept"]) == (f"/{prefix}_registry", prefix, None)
        assert (got["participants"], got["stalled"]) == (7, 3)  # the killed node's three rows
        topics = {t["topic"]: t for t in got["topics"]}
        assert sorted(topics) == ["/cmd", "/robot/arm", "/state"]
        arm = topics["/robot/arm"]
        assert (arm["shm_name"], arm["kind"], arm["channel_type"]) == (f"/{prefix}_robot.arm", "Pubsub", 1)
        assert participants(arm, "producers") == [("alive", False), ("killed", True)]
        assert participants(arm, "consumers") == [("py", False)]
        assert topics["/state"]["kind"] == "Blackboard"
        text = cli("registry", "-n", prefix)
        assert text.code == 0 and "killed[" in text.text and "stalled" in text.text
        swept = cli_json("registry", prefix, "--sweep")
        assert swept["swept"] == 3  # the killed node's three rows
        assert participants({t["topic"]: t for t in swept["topics"]}["/robot/arm"], "producers") == [("alive", False)]
        alive.tell()
        alive.result()
        del sub


def test_blackboard_shows_keys_owners_and_dead_ones_and_sweeps(prefix):
    with two_native_nodes(prefix) as (alive, killed):
        os.kill(killed.proc.pid, signal.SIGKILL)
        killed.kill()
        for command in ("blackboard", "bb"):
            got = cli_json(command, "state", "-n", prefix)
            assert (got["name"], got["capacity"], got["max_value_size"], got["swept"]) == (f"/{prefix}_bb_state", 256, 1008, None)
            assert (got["updates"], got["dead_owners"]) == (2, 1)
            assert got["creator_pid"] in (alive.proc.pid, killed.proc.pid)  # whichever node came first
            keys = {k["key"]: k for k in got["keys"]}
            assert {k: (v["size"], v["updates"], v["owner"], v["state"]) for k, v in keys.items()} == {
                "a": (1, 1, "alive", "live"), "k": (1, 1, "killed", "dead")}
            assert keys["a"]["pid"] == alive.proc.pid and keys["a"]["age_s"] >= 0
        text = cli("bb", "state", prefix)  # the namespace positionally, as `registry NS` takes it
        assert text.code == 0 and text.text.startswith(f"/{prefix}_bb_state: capacity 256, max value 1008 bytes, 2 keys")
        swept = cli_json("bb", "state", "-n", prefix, "--sweep")
        assert swept["swept"] == 1 and [k["key"] for k in swept["keys"]] == ["a"]
        alive.tell()
        alive.result()


def test_absent_registry_and_board_are_exit_status_1(prefix):
    for args, what in ((("registry", prefix), f"no participant registry for namespace '{prefix}'"),
                       (("bb", "nothing", "-n", prefix), f"no blackboard /{prefix}_bb_nothing"),
                       (("bb", "nothing", prefix), f"no blackboard /{prefix}_bb_nothing")):
        result = cli(*args)
        assert (result.code, result.error_lines) == (1, [f"kickmsg {args[0]}: {what}"])
    for args in (("registry", prefix, "-n", "other"), ("bb", "nothing", prefix, "-n", "other"),
                 ("bbwatch", "nothing", prefix, "-n", "other")):
        result = cli(*args)
        assert result.code == 2 and "give the namespace once" in result.err.decode()
    assert Registry.try_open(prefix) is None and Blackboard.try_open(prefix, "nothing") is None


def test_an_empty_namespace_is_refused_not_replaced_by_the_default():
    for args in (("registry", ""), ("registry", "-n", ""), ("bb", "state", "-n", ""), ("bb", "state", ""),
                 ("bbwatch", "state", "-n", ""), ("bbwatch", "state", "")):
        assert_one_line_error(cli(*args), args[0], "namespace name is empty after sanitization (input: '')")


def test_bbwatch_follows_a_native_writer(prefix):
    """The board's key first, then the native writer's next value, as it happens."""
    code = r'''
board = kickmsg.Blackboard.open_or_create(P["ns"], "state", kickmsg.BlackboardConfig(), "nat")
w = board.declare("pose")
w.write(b"x=1")
ready()
wait_go()
w.write(b"x=2")
done(0)
'''
    with start_native9(code, ns=prefix) as writer, Running("bbwatch", "state", "-n", prefix, "--json", "--count", "2") as watch:
        writer.wait_ready()
        first = json.loads(read_line(watch.proc))
        assert (first["event"], first["key"], first["updates"], first["owner"], first["state"]) == ("key", "pose", 1, "nat", "live")
        assert base64.b64decode(first["value"]) == b"x=1"
        writer.tell()
        writer.result()
        second = json.loads(read_line(watch.proc))
        assert (second["event"], second["updates"], base64.b64decode(second["value"])) == ("value", 2, b"x=2")
        assert watch.finish().code == 0


def test_bbwatch_text_shows_a_released_key(prefix):
    """Our writer, in text: its key, then the key released (owner pid 0)."""
    board = Node("py", namespace=prefix, layout=9).blackboard("state")
    writer = board.declare("mode")
    writer.write(b"idle")
    with Running("bbwatch", "state", prefix, "--count", "2") as watch:  # the namespace positionally
        assert read_line(watch.proc).startswith(f"mode: key #1 4 bytes owner py[{os.getpid()}] live: idle")
        writer.release()
        assert read_line(watch.proc).startswith("mode: owner #1 4 bytes owner py[0] unowned: idle")
        assert watch.finish().code == 0


def test_bbwatch_shows_a_killed_owners_key_gone_when_swept(prefix):
    code = r'''
b = kickmsg.Blackboard.open_or_create(P["ns"], "state", kickmsg.BlackboardConfig(), "nat")
w = b.declare("pose")
w.write(b"x=1")
ready()
wait_go()
'''
    with start_native9(code, ns=prefix) as writer, Running("bbwatch", "state", "-n", prefix, "--count", "2") as watch:
        writer.wait_ready()
        assert read_line(watch.proc).startswith(f"pose: key #1 3 bytes owner nat[{writer.proc.pid}] live: x=1")
        os.kill(writer.proc.pid, signal.SIGKILL)
        writer.kill()
        assert Blackboard.try_open(prefix, "state").sweep_stale() == 1
        assert read_line(watch.proc) == "pose: gone\n"
        assert watch.finish().code == 0


def released_key(prefix: str, key: str, value: bytes, capacity: int = 256) -> None:
    """A board ``state`` of ours holding ``key`` = ``value``, released (no live writer)."""
    board = Blackboard.open_or_create(prefix, "state", BlackboardConfig(capacity=capacity))
    writer = board.declare(key)
    writer.write(value)
    writer.release()


def test_bbwatch_follows_a_re_created_board_and_ends_when_it_is_removed(prefix):
    """A board the native side re-creates under the name is followed (said
    on stderr, its keys reported); once the name is removed, bbwatch ends
    with exit status 2 and says so, as ``watch`` does for a channel."""
    released_key(prefix, "old", b"1")
    with Running("bbwatch", "state", "-n", prefix) as watch:
        assert read_line(watch.proc).startswith("old: key #1 1 bytes")
        watch.proc.send_signal(signal.SIGSTOP)  # it looks again only once the new board's key is released
        run_native9(r'''
kickmsg.Blackboard.unlink(P["ns"], "state")
cfg = kickmsg.BlackboardConfig()
cfg.capacity = 4
w = kickmsg.Blackboard.open_or_create(P["ns"], "state", cfg, "nat").declare("new")
w.write(b"2")
done(0)
''', ns=prefix)
        watch.proc.send_signal(signal.SIGCONT)
        assert {read_line(watch.proc), read_line(watch.proc)} == {"old: gone\n", "new: key #1 1 bytes owner nat[0] unowned: 2\n"}
        Blackboard.unlink(prefix, "state")
        result = watch.finish()
    assert result.code == 2
    assert result.error_lines == [f"kickmsg bbwatch: /{prefix}_bb_state was re-created; following it",
                                  f"kickmsg bbwatch: error: /{prefix}_bb_state was removed"]


@pytest.mark.parametrize("number", [signal.SIGTERM, signal.SIGINT], ids=lambda number: number.name)
def test_a_stop_signal_ends_bbwatch_quietly(prefix, number):
    released_key(prefix, "k", b"v")
    with Running("bbwatch", "state", "-n", prefix) as watch:
        assert read_line(watch.proc).startswith("k: key #1")
        watch.proc.send_signal(number)
        result = watch.finish()
    assert (result.code, result.out, result.err) == (0, b"", b"")


def test_bbwatch_into_a_closed_pipe_ends_quietly(prefix):
    """``kickmsg bbwatch ... | head`` with head gone: exit status 0, nothing on stderr."""
    released_key(prefix, "k", b"v")
    reader, writer = os.pipe()
    os.close(reader)
    try:
        done = subprocess.run(command_line(["bbwatch", "state", "-n", prefix]), stdout=writer, stderr=subprocess.PIPE,
                              stdin=subprocess.DEVNULL, timeout=30)
    finally:
        os.close(writer)
    assert (done.returncode, done.stderr) == (0, b"")


def without_ages(board: dict) -> dict:
    """A board's JSON without what moves between two reads (the keys' ages)."""
    return dict(board, oldest_age_s=None, keys=[dict(key, age_s=None) for key in board["keys"]])


def test_list_groups_a_namespace_by_its_registry_native_and_ours(prefix):
    """A native node alive, one killed, our node and a row whose region is
    gone: `kickmsg list` shows them under the namespace by topic, the killed
    one stalled, the gone region missing; a channel no registry lists stays
    in the table. `info`, `registry` and `bb` are kickmsg.ops.diagnostics."""
    plain, registry, board = f"/{prefix}_plain", f"/{prefix}_registry", f"/{prefix}_bb_state"
    SharedRegion.create(plain, ChannelType.PubSub, Config(max_subscribers=2, sub_ring_capacity=8, pool_size=16), "plain")
    with two_native_nodes(prefix) as (alive, killed):
        os.kill(killed.proc.pid, signal.SIGKILL)
        killed.kill()
        sub = Node("py", namespace=prefix, layout=9).subscribe("robot/arm")
        ghost = NodeRows(prefix, "ghost")
        ghost.register(f"/{prefix}_ghost", "ghost", Kind.Pubsub, Role.Publisher)

        rows = {row["name"]: row for row in cli_json("list", "--prefix", prefix)}
        assert sorted(rows) == [board, f"/{prefix}_cmd", plain, registry, f"/{prefix}_robot.arm"]
        assert (rows[registry]["type"], rows[registry]["namespace"], rows[registry]["health"]) == (
            "Registry", prefix, "8 participants, 3 stalled")
        topics = {t["topic"]: t for t in rows[registry]["topics"]}
        assert sorted(topics) == ["/cmd", "/ghost", "/robot/arm", "/state"]
        arm = topics["/robot/arm"]
        assert sorted((p["node_name"], p["pid"], p["role"], p["stalled"]) for p in arm["producers"]) == [
            ("alive", alive.proc.pid, "Publisher", False), ("killed", killed.proc.pid, "Publisher", True)]
        assert [(p["node_name"], p["pid"], p["role"]) for p in arm["consumers"]] == [("py", os.getpid(), "Subscriber")]
        assert {name: (row["namespace"], row["topic"]) for name, row in rows.items() if name != registry} == {
            board: (prefix, "/state"), f"/{prefix}_cmd": (prefix, "/cmd"), f"/{prefix}_robot.arm": (prefix, "/robot/arm"),
            plain: (None, None)}
        assert (rows[board]["type"], rows[board]["capacity"], rows[board]["payload"], rows[board]["health"]) == (
            "Blackboard", 256, 1008, "2 keys, 1 with a dead owner")

        lines = cli("list", "--prefix", prefix).text.splitlines()
        assert lines[0] == f"namespace {prefix} ({registry}): 4 topics, 8 participants, 3 stalled"
        assert lines[1].split() == ["TOPIC", "KIND", "SHM_NAME", "REGION", "PRODUCERS", "CONSUMERS"]
        shown = {line.split()[0]: " ".join(line.split()) for line in lines[2:6]}
        assert shown["/ghost"] == f"/ghost Pubsub /{prefix}_ghost missing ghost[{os.getpid()}] -"
        assert shown["/robot/arm"] == (f"/robot/arm Pubsub /{prefix}_robot.arm PubSub clean "
                                       f"alive[{alive.proc.pid}], killed[{killed.proc.pid}] stalled py[{os.getpid()}]")
        both = f"alive[{alive.proc.pid}] Both, killed[{killed.proc.pid}] Both stalled"
        assert shown["/state"] == f"/state Blackboard {board} Blackboard 2 keys, 1 with a dead owner {both} {both}"
        assert lines[7].startswith("NAME ") and lines[8].startswith(plain) and len(lines) == 11  # then the footers

        info = diagnostics.registry(registry)
        assert cli_json("info", registry) == diagnostics.to_json(info)
        assert cli_json("registry", prefix) == dict(diagnostics.to_json(info), swept=None)
        assert without_ages(cli_json("info", board)) == without_ages(diagnostics.to_json(diagnostics.blackboard(board)))
        ghost.deregister_all()
        del sub
        alive.tell()
        alive.result()


def test_clean_and_rm_know_registries_and_boards(prefix):
    """clean leaves a registry some process maps; once the native node that
    made it and its board is killed, it removes both, named by type, with
    its channels. rm removes ours, saying what each was."""
    registry, board = f"/{prefix}_registry", f"/{prefix}_bb_state"
    with start_native9(NATIVE_NODE, ns=prefix, name="n", key="a") as native:
        native.wait_ready()
        held = cli("clean", "--prefix", prefix)
        assert (held.code, held.text.splitlines()) == (0, [f"left {registry} (registry): a process has it open or mapped"])
        os.kill(native.proc.pid, signal.SIGKILL)
        native.kill()
    planned = cli_json("clean", "--prefix", prefix, "--dry-run")
    assert planned["types"] == {board: "blackboard", f"/{prefix}_cmd": "channel", registry: "registry",
                                f"/{prefix}_robot.arm": "channel"}
    cleaned = cli("clean", "--prefix", prefix)
    assert (cleaned.code, cleaned.text.splitlines()) == (0, [
        f"removed {board} (blackboard)", f"removed /{prefix}_cmd", f"removed {registry} (registry)",
        f"removed /{prefix}_robot.arm"])
    assert not any(os.path.exists("/dev/shm" + name) for name in planned["types"])
    assert Registry.try_open(prefix) is None and Blackboard.try_open(prefix, "state") is None

    Registry.open_or_create(prefix, capacity=2)
    Blackboard.open_or_create(prefix, "state")
    removed = cli("rm", registry, board)
    assert (removed.code, removed.text.splitlines()) == (0, [f"removed {registry} (registry)", f"removed {board} (blackboard)"])
    Registry.open_or_create(prefix, capacity=2)
    assert cli_json("rm", registry) == {"removed": [registry], "errors": {}, "types": {registry: "registry"}}
