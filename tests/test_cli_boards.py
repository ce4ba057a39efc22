"""``kickmsg registry``, ``kickmsg blackboard``/``bb`` and ``kickmsg bbwatch``
against regions of the native kickmsg 0.9.2 wheel (run in subprocesses,
tests/nativepeer.py) and of this package.

Everything lives under the test's ``prefix`` namespace (registry and boards
included) and is removed whatever the outcome; waits are on a child's
``ready`` line or on a command's output line, bounded by a deadline.
"""
import base64
import json
import os
import select
import signal

from kickmsg import Blackboard, Node, Registry
from nativepeer import start_native9
from test_cli import Running, cli, cli_json

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
    return sorted((p["node"], p["stalled"]) for p in topic[side])


def test_registry_shows_native_and_our_rows_marks_the_dead_and_sweeps(prefix):
    """A native node alive, a native node killed, our node: `kickmsg
    registry` lists all three by topic, the killed one stalled; --sweep frees it."""
    with start_native9(NATIVE_NODE, ns=prefix, name="alive", key="a") as alive, \
            start_native9(NATIVE_NODE, ns=prefix, name="killed", key="k") as killed:
        alive.wait_ready()
        killed.wait_ready()
        os.kill(killed.proc.pid, signal.SIGKILL)
        killed.kill()
        sub = Node("py", namespace=prefix, layout=9).subscribe("robot/arm")
        got = cli_json("registry", prefix)
        assert got["registry"] == f"/{prefix}_registry" and got["swept"] is None
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
    with start_native9(NATIVE_NODE, ns=prefix, name="alive", key="a") as alive, \
            start_native9(NATIVE_NODE, ns=prefix, name="killed", key="k") as killed:
        alive.wait_ready()
        killed.wait_ready()
        os.kill(killed.proc.pid, signal.SIGKILL)
        killed.kill()
        for command in ("blackboard", "bb"):
            got = cli_json(command, "state", "-n", prefix)
            assert (got["board"], got["capacity"], got["max_value_size"], got["swept"]) == (f"/{prefix}_bb_state", 256, 1008, None)
            keys = {k["key"]: k for k in got["keys"]}
            assert {k: (v["size"], v["updates"], v["owner"], v["state"]) for k, v in keys.items()} == {
                "a": (1, 1, "alive", "live"), "k": (1, 1, "killed", "dead")}
            assert keys["a"]["pid"] == alive.proc.pid and keys["a"]["age_s"] >= 0
        text = cli("bb", "state", "-n", prefix)
        assert text.code == 0 and text.text.startswith(f"/{prefix}_bb_state: capacity 256, max value 1008 bytes, 2 keys")
        swept = cli_json("bb", "state", "-n", prefix, "--sweep")
        assert swept["swept"] == 1 and [k["key"] for k in swept["keys"]] == ["a"]
        alive.tell()
        alive.result()


def test_absent_registry_and_board_are_exit_status_1(prefix):
    for args, what in ((("registry", prefix), f"no participant registry for namespace '{prefix}'"),
                       (("bb", "nothing", "-n", prefix), f"no blackboard /{prefix}_bb_nothing")):
        result = cli(*args)
        assert (result.code, result.error_lines) == (1, [f"kickmsg {args[0]}: {what}"])
    result = cli("registry", prefix, "-n", "other")
    assert result.code == 2 and "give the namespace once" in result.err.decode()
    assert Registry.try_open(prefix) is None and Blackboard.try_open(prefix, "nothing") is None


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
    with Running("bbwatch", "state", "-n", prefix, "--count", "2") as watch:
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
