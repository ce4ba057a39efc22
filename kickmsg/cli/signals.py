"""The ``kickmsg`` command's stop signals outside a command's own handling:
while it starts (imports its commands) and once it has finished. Standard
library only, so that ``main`` takes them before anything heavy is imported."""
import os
import signal
from types import FrameType

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
