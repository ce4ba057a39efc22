"""What the ``kickmsg`` command writes: JSON that strict parsers read,
text that cannot drive the terminal, inputs read within bounds, and the
framings of hz/bw --json and echo --format frames.

Every command runs as a real subprocess against regions of the test
process; every wait is bounded. No timing assertions.
"""
import json
import math
import shutil
import subprocess

import pytest

from kickmsg import Config, Node, jsontext, typed
from test_cli import SMALL, Running, wait_live
from test_cli import prefix  # noqa: F401  (fixture)

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
