"""The ``kickmsg`` command's stop signals outside a command's own handling:
while it starts (the package and its commands import) and once it has
finished. Standard library only: ``import kickmsg`` calls
``exit_while_the_command_starts`` before anything heavy is imported."""
import _signal as signal  # what the signal module wraps: importing it costs nothing, where signal's enums take milliseconds
import os
import sys
from types import FrameType

__all__ = [
    "EXIT_FORCED", "STOP_SIGNALS", "exit_forced", "exit_on_signals", "exit_while_the_command_starts",
    "interrupt_on_ctrl_c", "is_the_kickmsg_command",
]

EXIT_FORCED = 130  # a signal ended the command before or after its work, or a second one forced it out
STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)


def exit_on_signals() -> None:
    """Make SIGINT, SIGTERM and SIGHUP end the process at once with status
    130: while the command starts (its imports run) and once it has finished
    (the interpreter shuts down) nothing is held, and an exception raised
    there would print a traceback."""
    for number in STOP_SIGNALS:
        signal.signal(number, exit_forced)


def exit_forced(number: int, frame: FrameType | None) -> None:
    """A signal handler: exit 130 now, without unwinding (as a crash: a ring
    held stays Live until reclaimed, an open recording stays .partial)."""
    os._exit(EXIT_FORCED)


def interrupt_on_ctrl_c() -> None:
    """While a command runs: Ctrl-C raises KeyboardInterrupt (``main`` turns
    it into status 130 once ``with`` blocks have closed what they hold)."""
    signal.signal(signal.SIGINT, signal.default_int_handler)


def is_the_kickmsg_command(argv0: str, orig_argv: list[str]) -> bool:
    """Whether this process is the ``kickmsg`` command: its console script,
    or ``python [options] -m kickmsg``."""
    if os.path.basename(argv0) == "kickmsg":
        return True
    return any(word == "-m" and following == "kickmsg" or word == "-mkickmsg"
               for word, following in zip(orig_argv, orig_argv[1:] + [""]))


def exit_while_the_command_starts() -> None:
    """In the ``kickmsg`` command only, make the stop signals exit 130 at
    once from the first line of ``import kickmsg`` on (its imports take
    tenths of a second, and an interrupt there printed a traceback);
    ``kickmsg.cli.main`` takes them over next. Other programs importing
    the package keep their own handlers."""
    if is_the_kickmsg_command(sys.argv[0] if sys.argv else "", sys.orig_argv):
        exit_on_signals()
