"""What the ``kickmsg`` command writes: JSON that strict parsers read,
text that cannot drive the terminal, inputs read within bounds, and the
framings of hz/bw --json and echo --format frames.

Every command runs as a real subprocess against regions of the test
process; every wait is bounded. No timing assertions.
"""
import json
import math
import os
import shutil
import subprocess
import sys

import pytest

from kickmsg import Config, Node, Publisher, Subscriber, jsontext, typed
from kickmsg.protocol.v4 import layout
from kickmsg.terminal import printable
from test_cli import ROOMY, SMALL, Running, cli, command_line, create_in_child, make, wait_live
from test_cli import name, prefix  # noqa: F401  (fixtures)

pytestmark = pytest.mark.timeout(120)


def refuse_constant(word: str) -> None:
    raise ValueError(f"not strict JSON: bare {word}")


def strict_loads(text: str):
    """json.loads that refuses NaN, Infinity and -Infinity, as JSON.parse does."""
    return json.loads(text, parse_constant=refuse_constant)


# -- item 8: strict JSON ---------------------------------------------------------------------


def test_non_finite_floats_are_written_as_strings_everywhere_in_the_data():
    data = {"a": math.nan, "b": [math.inf, (-math.inf, 1.5)], "c": {"d": math.nan}, "e": 2}
    assert strict_loads(jsontext.dumps(data)) == {
        "a": "NaN", "b": ["Infinity", ["-Infinity", 1.5]], "c": {"d": "NaN"}, "e": 2,
    }


def test_a_non_finite_float_json_cannot_hold_is_refused_rather_than_written():
    """allow_nan=False guards what the conversion does not reach (here what ``default`` returns)."""
    with pytest.raises(ValueError):
        jsontext.dumps({"x": object()}, default=lambda value: math.nan)


IMU = typed.RecordType("Imu", [("ax", "<f4"), ("ay", "<f4"), ("n", "<u4")])


def test_echo_json_of_non_finite_fields_parses_with_strict_parsers(prefix):
    """NaN and the infinities in a typed message are the strings "NaN",
    "Infinity", "-Infinity": Python's strict parse and node's JSON.parse read
    every line (a bare NaN made JSON.parse throw)."""
    publisher = typed.advertise(Node("imu-node", prefix=prefix), "imu", IMU, Config(**SMALL))
    with Running("echo", "--topic", "imu", "--prefix", prefix, "--count", "2", "--timeout", "10",
                 "--format", "json") as echo:
        wait_live(f"/{prefix}_imu", 1, echo)
        publisher.send((math.nan, math.inf, 7))
        publisher.send((-math.inf, 0.5, 8))
        result = echo.finish()
    assert (result.code, result.err) == (0, b"")
    lines = result.text.splitlines()
    assert [strict_loads(line)["fields"] for line in lines] == [
        [{"ax": "NaN", "ay": "Infinity", "n": 7}], [{"ax": "-Infinity", "ay": 0.5, "n": 8}],
    ]
    node = shutil.which("node")
    if node is None:
        return
    script = "const lines = require('fs').readFileSync(0, 'utf8').trim().split('\\n');" \
             "console.log(JSON.stringify(lines.map(line => JSON.parse(line).fields[0].ax)));"
    parsed = subprocess.run([node, "-e", script], input=result.out, capture_output=True, timeout=30)
    assert parsed.returncode == 0, parsed.stderr.decode()
    assert json.loads(parsed.stdout) == ["NaN", "-Infinity"]


# -- item 7: control characters in text output ----------------------------------------------


HOSTILE = "\x1b]0;pwned\x07\x1b[31m\r\n\x9b2J"  # retitle, recolour, return, new line, C1 CSI clear


def assert_inert(output: bytes) -> None:
    """No control character but the newlines that end lines."""
    text = output.decode()
    assert [c for c in text if c != "\n" and (ord(c) < 0x20 or 0x7F <= ord(c) < 0xA0)] == []


def test_printable_escapes_every_control_character_and_nothing_else():
    assert printable("a\x00b\x1b[31mc\nd\te\rf\x7fg\x9bh é €") == "a\\x00b\\x1b[31mc\\nd\\te\\rf\\x7fg\\x9bh é €"


def test_echo_escapes_control_characters_of_a_payload(name):
    """The payload 00ff1b5b33316d41 printed a NUL and ESC[31m to the
    terminal; a newline split one message over two lines."""
    region = make(name)
    with Running("echo", name, "--count", "2", "--timeout", "10") as echo:
        wait_live(name, 1, echo)
        publisher = Publisher(region)
        publisher.send(bytes.fromhex("00ff1b5b33316d41"))
        publisher.send(b"one\ntwo\r")
        result = echo.finish()
    assert (result.code, result.err) == (0, b"")
    assert_inert(result.out)
    assert result.text.splitlines() == ["[0] \\x00\\xff\\x1b[31mA", "[1] one\\ntwo\\r"]


def test_names_and_header_texts_with_control_characters_are_escaped_in_every_text_output(prefix):
    """A region made by another program may have any name and creator: list,
    info, stats, watch, audit, diagnose, schema, clean and the errors print
    them escaped, one line each."""
    name, creator = f"/{prefix}_{HOSTILE}", ("c" + HOSTILE).encode()
    plain = f"/{prefix}_plain"
    create_in_child("ours", plain, creator="c" * len(creator))  # a creator that is gone: clean removes the region
    with open(f"/dev/shm{plain}", "r+b") as region:  # as another program could have made it (this package refuses such names)
        region.seek(layout.HEADER_SIZE)
        region.write(creator)
    os.rename(f"/dev/shm{plain}", f"/dev/shm{name}")
    shown = printable(name)
    outputs = {command: cli(command, name, *extra) for command, extra in (
        ("info", ()), ("stats", ()), ("watch", ("--count", "1")), ("audit", ()), ("diagnose", ()), ("schema", ()),
        ("schema-diff", (name,)), ("echo", ("--timeout", "0.1")), ("hz", ("--duration", "0.1")),
    )}
    outputs["list"] = cli("list", "--prefix", prefix)
    outputs["missing"] = cli("info", name + "x")
    for command, result in outputs.items():
        assert_inert(result.out + result.err)
    assert shown in outputs["list"].text and printable("c" + HOSTILE) in outputs["list"].text
    assert printable("c" + HOSTILE) in outputs["info"].text
    assert outputs["stats"].text.startswith(shown + ": pool ")
    assert outputs["watch"].text.startswith(shown + "  ")
    assert outputs["schema"].text == shown + ": no schema descriptor\n"
    assert outputs["missing"].error_lines == [f"kickmsg info: error: no such region: {shown}x"]
    clean = cli("clean", "--prefix", prefix, "--dry-run")
    assert clean.text.splitlines()[0] == f"would remove {shown}"  # then perhaps processes it could not check


# -- item 1: files a user names are read within a bound -------------------------------------


GUARD_BYTES = 1536 * 1024**2  # address space of the measured command: a regression fails, it does not OOM the machine
MEASURE = """
import resource, subprocess, sys
def guard():
    resource.setrlimit(resource.RLIMIT_AS, ({guard}, {guard}))
done = subprocess.run(sys.argv[1:], preexec_fn=guard, stdin=subprocess.DEVNULL, capture_output=True, timeout=60)
sys.stderr.buffer.write(done.stderr)
print(done.returncode, resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss)
"""


def run_measuring_peak_rss(*args) -> tuple[int, str, int]:
    """``kickmsg ARGS`` run by a fresh interpreter whose only child it is:
    its exit status, its stderr and its peak resident set size in bytes."""
    done = subprocess.run([sys.executable, "-c", MEASURE.format(guard=GUARD_BYTES), *command_line(args)],
                          capture_output=True, timeout=90)
    code, peak_kb = map(int, done.stdout.split())
    return code, done.stderr.decode(), peak_kb * 1024


def test_pub_reads_no_more_of_a_file_than_the_payload_limit(name, tmp_path):
    """pub @/dev/zero grew until the kernel killed processes, and a 1 GiB file
    was read whole (1.08 GB resident) before its size was checked: now at
    most max_payload_size + 1 bytes are read, and the error names the file's
    size and the limit. Peak memory stays near that of a one-byte pub."""
    make(name, max_payload_size=4096)
    sparse = tmp_path / "sparse.bin"
    with open(sparse, "wb") as file:
        file.truncate(1024**3)  # 1 GiB that takes no disk
    code, err, baseline = run_measuring_peak_rss("pub", name, "x")
    assert (code, err) == (0, "")
    code, err, from_zero = run_measuring_peak_rss("pub", name, "@/dev/zero")
    assert code == 2 and err == f"kickmsg pub: error: /dev/zero: more than 4096 bytes, above max_payload_size of {name} (4096 bytes)\n"
    code, err, from_sparse = run_measuring_peak_rss("pub", name, f"@{sparse}")
    assert code == 2 and err == f"kickmsg pub: error: {sparse}: 1073741824 bytes, above max_payload_size of {name} (4096 bytes)\n"
    assert max(from_zero, from_sparse) < baseline + 64 * 1024**2, (baseline, from_zero, from_sparse)


def test_pub_takes_a_file_or_a_pipe_up_to_the_payload_limit(name, tmp_path):
    region = make(name, max_payload_size=64)
    exact = tmp_path / "exact.bin"
    exact.write_bytes(bytes(range(64)))
    subscriber = Subscriber(region)
    assert cli("pub", name, f"@{exact}").code == 0
    assert cli("pub", name, "@/dev/stdin", input=b"piped").code == 0
    assert [subscriber.try_receive(), subscriber.try_receive()] == [bytes(range(64)), b"piped"]
    too_long = cli("pub", name, "@/dev/stdin", input=bytes(65))
    assert too_long.error_lines == [f"kickmsg pub: error: /dev/stdin: more than 64 bytes, above max_payload_size of {name} (64 bytes)"]


def test_a_bridge_config_and_a_crosscheck_replay_are_read_within_a_bound():
    """Their fixed limits (1 MiB, 16 MiB) bound what /dev/zero costs."""
    code, err, _ = run_measuring_peak_rss("bridge", "--config", "/dev/zero")
    assert code == 2 and err == ("kickmsg bridge: error: /dev/zero: more than 1048576 bytes, "
                                 "above the limit of a bridge config (1048576 bytes)\n")
    code, err, _ = run_measuring_peak_rss("crosscheck", "--other-python", sys.executable, "--replay", "/dev/zero")
    assert code == 2 and err == ("kickmsg crosscheck: error: /dev/zero: more than 16777216 bytes, "
                                 "above the limit of a crosscheck replay (16777216 bytes)\n")


# -- item 16: hz/bw --json per interval, echo framings ---------------------------------------


@pytest.mark.parametrize("command", ["hz", "bw"])
def test_hz_and_bw_json_print_one_line_per_report(name, command):
    """--json printed nothing until the end: now every --every report is
    one JSON line (final false, new messages, seconds of silence), then the
    final one."""
    region = make(name, **ROOMY)
    with Running(command, name, "--every", "0.2", "--timeout", "1.5", "--json") as running:
        wait_live(name, 1, running)
        publisher = Publisher(region)
        for index in range(3):
            publisher.send(b"%d" % index)
        result = running.finish()
    assert (result.code, result.err) == (0, b"")
    *periodic, final = [strict_loads(line) for line in result.text.splitlines()]
    assert (final["final"], final["stopped"], final["messages"]) == (True, "silence", 3)
    assert periodic and all(report["final"] is False for report in periodic)
    assert sum(report["new_messages"] for report in periodic) <= 3
    quiet = periodic[-1]  # 1.5 s of silence span several reports of 0.2 s
    assert (quiet["new_messages"], quiet["messages"]) == (0, 3) and quiet["silent_s"] > 0


MESSAGES = [b"", b"one\n", bytes(range(64))]


def test_echo_frames_put_each_payload_after_its_length(name):
    region = make(name, **ROOMY)
    with Running("echo", name, "--count", "3", "--timeout", "10", "--format", "frames") as echo:
        wait_live(name, 1, echo)
        publisher = Publisher(region)
        for message in MESSAGES:
            publisher.send(message)
        result = echo.finish()
    assert (result.code, result.err) == (0, b"")
    assert result.out == b"".join(len(m).to_bytes(8, "little") + m for m in MESSAGES)


def test_echo_raw_with_count_ends_after_that_many_messages(name):
    """Raw payloads have no line to end `| head -1`: --count 1 writes the first message's bytes and exits."""
    region = make(name, **ROOMY)
    with Running("echo", name, "--count", "1", "--timeout", "10", "--format", "raw") as echo:
        wait_live(name, 1, echo)
        publisher = Publisher(region)
        publisher.send(MESSAGES[2])
        result = echo.finish()
    assert (result.code, result.out, result.err) == (0, MESSAGES[2], b"")
