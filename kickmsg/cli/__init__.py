"""The ``kickmsg`` command: list, inspect, watch, export, echo, measure,
create, remove, repair, clean, record and bridge channels.

This module holds ``main`` and ``build_parser``, which lists the families
of commands; each family adds its commands, with their options and
examples (its ``add_commands``): ``inspecting`` (list, info, stats, watch,
schema, diagnose, audit, exporter: renderers of ``kickmsg.ops.diagnostics``),
``receiving`` (echo, hz, bw), ``managing`` (pub, create, rm, repair,
clean), ``recording`` (record, play, convert, analyze), ``bridging``
(bridge), ``checking`` (crosscheck, verify) and ``boards`` (registry,
blackboard/bb, bbwatch: layout 9's registry and boards); ``common`` has
what they share.

Works on regions made by this package and by the native library. Channels
are named by shm name (``/kickmsg_imu``) or with the Node naming rules
(``--topic imu [--prefix kickmsg]``, ``--broadcast CH``, ``--mailbox OWNER
TAG``). Every subcommand but ``exporter`` takes ``--json`` (JSON on stdout;
``analyze --json FILE`` writes a file). Inspection commands attach
read-only (``SharedRegion.inspect``), so they cannot modify a region; only
``create``, ``rm``, ``pub``, ``repair`` and ``clean`` write, and
``echo``/``hz``/``bw``/``record`` join a ring as a subscriber while they run.

Commands that run until stopped end cleanly on SIGINT, SIGTERM or SIGHUP
(they leave their ring, close their files and print their summary); a second
signal forces them out at once (exit status 130). Any other command, and any
command while it starts or shuts down, ends on them with status 130 and no
traceback. Output into a closed pipe ends a
command quietly, as it does a Unix filter.

Exit status: 0 success; 1 a check found something (``diagnose``, ``audit``,
``schema-diff``, ``crosscheck``, ``verify``) or ``echo``/``hz``/``bw`` stopped
for silence before ``--count`` messages arrived; 2 an error, reported on one
line.
"""
import argparse
from collections.abc import Mapping
import os
import signal
import sys
from typing import NoReturn
import warnings

import kickmsg
from kickmsg import atomics, build
from kickmsg.protocol.v4 import layout
from kickmsg.cli.common import EXIT_ERROR, EXIT_OK, CommandError, discard_stdout, print_warnings_on_one_line
from kickmsg.stopsignals import EXIT_FORCED, STOP_SIGNALS, exit_on_signals, interrupt_on_ctrl_c
from kickmsg.terminal import printable

__all__ = ["CommandLineParser", "build_parser", "main", "parse", "run"]

class CommandLineParser(argparse.ArgumentParser):
    """argparse's parser, its errors on one line: the command, the fault,
    and where to see the usage (not the usage block)."""

    commands: Mapping[str, argparse.ArgumentParser]  # each command's parser, by name (on the top-level parser)

    def error(self, message: str) -> NoReturn:
        self.exit(EXIT_ERROR, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


def build_parser() -> CommandLineParser:
    """Every command's options and examples, each family adding its own
    (importing the commands: a few tenths of a second, after ``main`` has
    taken the stop signals)."""
    from kickmsg.cli import boards, bridging, checking, inspecting, managing, receiving, recording

    parser = CommandLineParser(
        prog="kickmsg",
        description="Inspect, watch, measure and repair Kickmsg shared-memory channels: regions of this package "
        "and of the native kickmsg, 0.9.2 (layout 9, what new channels get by default) and 0.1.0 (layout 4).",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog="Run 'kickmsg COMMAND --help' for a command's options and examples.",
    )
    parser.add_argument(
        "--version", action="version",
        version=f"kickmsg-py {kickmsg.__version__} ({build.describe()}; this package's own version, not the "
        f"native kickmsg's): "
        f"Kickmsg layouts 9, as native kickmsg 0.9.2 (the default), and {layout.VERSION}, as native kickmsg 0.1.0",
    )
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for family in (inspecting, receiving, managing, recording, bridging, checking, boards):
        family.add_commands(commands)
    parser.commands = commands.choices
    return parser


def main(argv: list[str] | None = None) -> int:
    """Run a ``kickmsg`` command; its exit status. SIGINT, SIGTERM and
    SIGHUP exit 130 at once while it starts (the imports of the commands);
    while it runs, a command that runs until stopped stops cleanly and any
    other ends at Ctrl-C with status 130. Without ``argv`` (the process's
    own command line: the ``kickmsg`` script, ``python -m kickmsg``) the
    signals keep exiting at once through the interpreter's shutdown; with
    ``argv`` (a call from a program) its handlers are given back."""
    callers = {number: signal.getsignal(number) for number in STOP_SIGNALS}
    exit_on_signals()
    if argv is None:  # a signal held back across the re-execution below arrives now, to the handlers just taken
        signal.pthread_sigmask(signal.SIG_UNBLOCK, STOP_SIGNALS)
    try:
        args = parse(sys.argv[1:] if argv is None else argv)
        if argv is None and args.command == "verify" and atomics.COMPILED:
            # The explorer schedules the flows' source: the same command on the pure build (kickmsg.build).
            # The stop signals stay blocked through the new interpreter's start and imports (execve keeps
            # the mask) until its main has taken them: a Ctrl-C meanwhile ends it quietly, with 130.
            signal.pthread_sigmask(signal.SIG_BLOCK, STOP_SIGNALS)
            os.execve(sys.executable, [sys.executable, "-m", "kickmsg", *sys.argv[1:]], build.pure_environment())
        interrupt_on_ctrl_c()
        try:
            return run(args)
        except KeyboardInterrupt:  # in a command that does not stop on signals; `with` blocks closed what it held
            exit_on_signals()
            discard_stdout()
            return EXIT_FORCED
    finally:
        if argv is None:
            exit_on_signals()
        else:
            for number, handler in callers.items():
                signal.signal(number, handler)


def parse(words: list[str]) -> argparse.Namespace:
    """The command line, with a command's positionals wherever its options
    put them (``pub /c --hex 01ff --rate 10``: argparse alone takes no
    positional after the first option)."""
    parser = build_parser()
    command = parser.commands.get(words[0]) if words else None
    if command is None:  # --version, --help, or an error naming the fault
        return parser.parse_args(words)
    args = command.parse_intermixed_args(words[1:])
    args.command = words[0]
    return args


def run(args: argparse.Namespace) -> int:
    """Run the parsed command: its exit status, an error reported on one line."""
    with warnings.catch_warnings():
        print_warnings_on_one_line(args.command)
        try:
            status = args.run(args)
            sys.stdout.flush()  # here, where a closed pipe is handled below
            return status
        except BrokenPipeError:  # the reader went away (e.g. `| head`): end quietly, as a Unix filter does
            discard_stdout()
            return EXIT_OK
        except CommandError as error:
            print(f"kickmsg {args.command}: error: {printable(str(error))}", file=sys.stderr)
            return EXIT_ERROR
        except (RuntimeError, ValueError, OSError) as error:
            print(f"kickmsg {args.command}: error: {printable(str(error).splitlines()[0]) if str(error) else type(error).__name__}",
                  file=sys.stderr)
            return EXIT_ERROR
