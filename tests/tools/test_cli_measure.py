"""hz, bw and echo when messages stop (reports that say so, --timeout, the
default silence timeout of --count, exit status 1 when --count was not
reached), and the validation of numeric options in the parser.

Every command runs as a real subprocess; every wait is bounded. No timing
assertions: only what the reports say, never how fast they came.
"""
import pytest

from kickmsg import Publisher
from test_cli import ROOMY, Running, cli, make, wait_live
from test_cli import name  # noqa: F401  (fixture)

pytestmark = pytest.mark.timeout(120)


@pytest.mark.parametrize("command", ["hz", "bw"])
def test_reports_say_when_messages_stopped(name, command):
    """After the last message, each report says for how long nothing came
    instead of repeating the last figures; --timeout ends the run, and the
    final report says why (exit status 0: no --count to reach)."""
    region = make(name, **ROOMY)
    with Running(command, name, "--every", "0.2", "--timeout", "1.5") as running:
        wait_live(name, 1, running)
        publisher = Publisher(region)
        for index in range(3):
            publisher.send(b"%d" % index)
        result = running.finish()
    assert result.code == 0, result.err
    lines = result.text.splitlines()
    *periodic, final_figures, final_details, final_stop = lines
    assert final_stop == "stopped: no message for 1.5 s"
    assert final_figures.startswith("average rate: " if command == "hz" else "average: ")
    figures = [index for index, line in enumerate(periodic) if line.startswith("average")]
    assert figures, lines
    after_messages = periodic[figures[-1] + 2:]  # after the last figures (two lines)
    assert after_messages and all(line.startswith("no new messages for ") for line in after_messages), lines
    seconds = [float(line.split()[4]) for line in after_messages]
    assert seconds == sorted(seconds) and all(line.endswith(" s") for line in after_messages)


@pytest.mark.parametrize("command", ["hz", "bw"])
def test_count_with_timeout_stops_for_silence_with_exit_1(name, command):
    """--count 5 --timeout 0.5 with two messages: the final report says 2 of
    5 arrived; exit status 1 (the count was not reached)."""
    region = make(name, **ROOMY)
    with Running(command, name, "--count", "5", "--timeout", "0.5") as text, \
            Running(command, name, "--count", "5", "--timeout", "0.5", "--json") as as_json:
        wait_live(name, 2, text, as_json)
        publisher = Publisher(region)
        publisher.send(b"one")
        publisher.send(b"two")
        text_result, json_result = text.finish(), as_json.finish()
    assert text_result.code == 1 and json_result.code == 1
    assert text_result.text.splitlines()[-1] == "stopped: no message for 0.5 s (2 of 5 messages arrived)"
    report = json_result.json_lines()[-1]
    assert (report["messages"], report["final"], report["stopped"]) == (2, True, "silence")


def test_count_without_timeout_gives_up_after_the_default_silence(name):
    """hz/bw --count on a channel nobody publishes to cannot wait forever:
    they stop after the default 10 s of silence, exit status 1."""
    make(name)
    with Running("hz", name, "--count", "3", "--every", "5") as hz, Running("bw", name, "--count", "3", "--json") as bw:
        hz_result, bw_result = hz.finish(timeout=60), bw.finish(timeout=60)
    assert (hz_result.code, bw_result.code) == (1, 1)
    assert hz_result.text.splitlines()[-2:] == [
        "received 0 message(s): no rate yet", "stopped: no message for 10 s (0 of 3 messages arrived)"]
    assert bw_result.json_lines()[-1] == {"messages": 0, "bytes_per_s": None, "final": True, "stopped": "silence"}


def test_count_reached_exits_0_with_no_silence_line(name):
    """--count reached before any timeout: exit status 0, stopped for count."""
    region = make(name, **ROOMY)
    with Running("hz", name, "--count", "3", "--timeout", "30", "--json") as hz:
        wait_live(name, 1, hz)
        publisher = Publisher(region)
        for index in range(3):
            publisher.send(b"%d" % index)
        result = hz.finish()
    assert result.code == 0
    assert (result.json_lines()[-1]["messages"], result.json_lines()[-1]["stopped"]) == (3, "count")


def test_echo_timeout_without_count_exits_0(name):
    """echo --timeout without --count: silence is the normal end (exit 0, no note)."""
    region = make(name)
    with Running("echo", name, "--timeout", "0.5") as echo:
        wait_live(name, 1, echo)
        Publisher(region).send(b"only")
        result = echo.finish()
    assert (result.code, result.text, result.err) == (0, "[0] only\n", b"")


# -- option validation ---------------------------------------------------------------


INVALID_OPTIONS = [
    ("echo", "--count", "0"), ("echo", "--count", "-3"), ("echo", "--timeout", "0"), ("echo", "--timeout", "-1"),
    ("hz", "--window", "0"), ("hz", "--every", "-0.5"), ("hz", "--duration", "0"), ("hz", "--count", "-1"),
    ("hz", "--timeout", "nan"), ("bw", "--every", "0"), ("bw", "--timeout", "-2"), ("bw", "--count", "0"),
    ("watch", "--interval", "0"), ("watch", "--count", "-1"), ("pub", "--rate", "0"), ("pub", "--rate", "-5"),
    ("pub", "--count", "0"), ("play", "--rate", "0"), ("record", "--duration", "-1"), ("record", "--rotate-mb", "0"),
    ("record", "--flush-interval", "0"), ("record", "--flush-interval", "nan"),
    ("create", "--pool", "0"), ("create", "--ring", "-8"),
]
POSITIONALS = {"pub": ["/x", "data"], "play": ["dir"], "record": ["/x", "--out", "dir"]}


@pytest.mark.parametrize("command, option, value", INVALID_OPTIONS)
def test_non_positive_values_are_refused_by_the_parser(command, option, value):
    """Zero, negative or non-finite counts, rates and durations: argparse's
    error naming the option and the value, exit status 2, nothing run."""
    result = cli(command, *POSITIONALS.get(command, ["/x"]), f"{option}={value}")
    assert result.code == 2
    assert result.out == b""
    assert result.error_lines == [
        f"kickmsg {command}: error: argument {option}: must be "
        + ("greater than 0" if option in ("--count", "--window", "--pool", "--ring") else "a finite number greater than 0")
        + f", not {value} (see kickmsg {command} --help)"
    ]


@pytest.mark.parametrize("command, option, value", [
    ("watch", "--interval", "1e308"), ("exporter", "--interval", "1e7"), ("pub", "--rate", "1e-308"),
    ("echo", "--timeout", "1e308"), ("record", "--duration", "1e308"), ("play", "--rate", "1e-9"),
])
def test_absurdly_large_or_small_values_are_refused_by_the_parser(command, option, value):
    """Values whose waits would overflow the platform's timeouts (an
    OverflowError traceback): argparse's error naming the value, exit 2."""
    result = cli(command, *POSITIONALS.get(command, [] if command == "exporter" else ["/x"]), f"{option}={value}")
    assert result.code == 2 and result.out == b""
    assert result.error_lines[-1] == (f"kickmsg {command}: error: argument {option}: must be from 1e-06 to 1e+06, "
                                      f"not {value} (see kickmsg {command} --help)")


@pytest.mark.parametrize("command, option, value", [("echo", "--count", "two"), ("hz", "--every", "soon")])
def test_values_that_are_not_numbers_are_refused(command, option, value):
    result = cli(command, "/x", option, value)
    assert result.code == 2
    assert result.error_lines[-1].startswith(f"kickmsg {command}: error: argument {option}: not ")
    assert repr(value) in result.error_lines[-1]
