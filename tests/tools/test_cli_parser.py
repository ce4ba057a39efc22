"""The ``kickmsg`` command line: positionals wherever the options put them,
every example of every ``--help`` accepted, and parser errors on one line."""
import argparse
import re
import shlex

import pytest

from kickmsg import Subscriber
from kickmsg import cli
from kickmsg.cli import boards, bridging, checking, inspecting, managing, receiving, recording
from test_cli import cli as run_cli, make
from test_cli import name  # noqa: F401  (fixture)

pytestmark = pytest.mark.timeout(120)


def help_examples() -> list[str]:
    """Every ``kickmsg ...`` line of the commands' ``--help`` examples."""
    lines = []
    for parser in cli.build_parser().commands.values():
        examples = (parser.epilog or "").split("examples:", 1)[1]
        lines += [line.split("#")[0].strip() for line in examples.splitlines() if line.strip().startswith("kickmsg ")]
    return lines


@pytest.mark.parametrize("example", help_examples())
def test_every_help_example_parses(example):
    """Each example a --help shows is a command line the parser accepts
    (pub's ``/kickmsg_cmd --hex 01ff --rate 10 --count 50`` was refused:
    unrecognized arguments: 01ff)."""
    words = shlex.split(example)[1:]
    words = words[:words.index(">")] if ">" in words else words  # the shell's redirection
    args = cli.parse(words)
    assert args.command == words[0]


@pytest.mark.parametrize("order", [
    ["NAME", "--hex", "01ff", "--rate", "200", "--count", "3"],
    ["--rate", "200", "NAME", "--hex", "--count", "3", "01ff"],
    ["--hex", "--count", "3", "NAME", "01ff", "--rate", "200"],
])
def test_pub_data_wherever_the_options_put_it(name, order):
    """The channel and the data between, before or after the options: the
    same three messages reach a subscriber."""
    region = make(name)
    with Subscriber(region) as subscriber:
        result = run_cli("pub", *[name if word == "NAME" else word for word in order])
        assert result.code == 0, result.err
        assert [subscriber.try_receive() for _ in range(4)] == [b"\x01\xff"] * 3 + [None]


@pytest.mark.parametrize("words, command, fault", [
    (["lst"], "kickmsg", "argument COMMAND: invalid choice: 'lst'"),
    ([], "kickmsg", "the following arguments are required: COMMAND"),
    (["pub", "/x", "data", "--bogus", "5"], "kickmsg pub", "unrecognized arguments: --bogus 5"),
    (["echo", "/x", "--count", "two"], "kickmsg echo", "argument --count: not an integer: 'two'"),
    (["record", "/x"], "kickmsg record", "record needs --out DIR, the directory for the recording's files"),
    (["rm"], "kickmsg rm", "the following arguments are required: NAME"),
    (["echo", "/x", "--format", "yaml"], "kickmsg echo", "argument --format: invalid choice: 'yaml'"),
])
def test_parser_errors_are_one_line(words, command, fault):
    """Exit status 2 and one line: the command, the fault, where to see the
    usage; no usage block."""
    result = run_cli(*words)
    assert result.code == 2 and result.out == b""
    [line] = result.error_lines
    assert line.startswith(f"{command}: error: {fault}") and line.endswith(f"(see {command} --help)"), line


def test_the_families_add_every_command_once_listed_by_family(capsys):
    """Each command comes from exactly one family's add_commands; --help and
    the error naming an unknown command list them all, family by family."""
    added = []
    for family in (inspecting, receiving, managing, recording, bridging, checking, boards):
        commands = argparse.ArgumentParser().add_subparsers()
        family.add_commands(commands)
        added += commands.choices
    assert len(added) == len(set(added))
    parser = cli.build_parser()
    assert list(parser.commands) == added
    text = parser.format_help()
    listed = [re.search(rf"\n    {re.escape(name)}\s", text).start() for name in added]
    assert listed == sorted(listed)
    with pytest.raises(SystemExit):
        cli.parse(["lst"])
    assert f"(choose from {', '.join(map(repr, added))})" in capsys.readouterr().err


def test_analyze_json_prints_like_every_command_and_still_takes_a_file(tmp_path):
    """``analyze ... --json`` prints JSON on stdout as every command's
    --json does; ``--json FILE`` (the older form) still writes FILE; a
    --json that took the recording as its FILE is told so, before Spark."""
    assert (cli.parse(["analyze", "rec/", "--json"]).json_path, cli.parse(["analyze", "rec/"]).json_path) == ("-", None)
    assert cli.parse(["analyze", "rec/", "--json", "out.json"]).json_path == "out.json"
    assert cli.parse(["analyze", "--json", "out.json", "rec/"]).paths == ["rec/"]
    result = run_cli("analyze", "--json", str(tmp_path))
    assert result.code == 2
    assert result.error_lines == [f"kickmsg analyze: error: name the recordings to analyse (DIR_OR_GLOB); --json took "
                                  f"'{tmp_path}' as its FILE: put --json after the recordings to print JSON"]
