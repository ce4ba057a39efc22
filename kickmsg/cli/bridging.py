"""Forwarding channels to and from other hosts: bridge (kickmsg.bridge)."""
import argparse

from kickmsg import bridge
from kickmsg.cli.common import stop_on_signals


def cmd_bridge(args: argparse.Namespace) -> int:
    return bridge.run_command(args, stop_on_signals())
