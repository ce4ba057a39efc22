"""Forwarding channels to and from other hosts: bridge (``kickmsg.bridge``)."""
import argparse
import dataclasses

from kickmsg.bridge import BridgeOptions, run
from kickmsg.bridge.options import MODES, default_key_prefix, load_file, parse_import, shm_name
from kickmsg.cli.common import Commands, add_command, stop_on_signals

__all__ = ["EXAMPLES", "SUMMARY", "add_commands", "cmd_bridge", "options_from_args"]

SUMMARY = "forward channels to and from other hosts over Zenoh (the bridge extra)"
EXAMPLES = (
    "  kickmsg bridge --export /kickmsg_imu --listen tcp/0.0.0.0:7447 --key-prefix kickmsg/robot\n"
    "  kickmsg bridge --import kickmsg/robot/kickmsg_imu=/kickmsg_imu --connect tcp/robot.local:7447\n"
    "  kickmsg bridge --config bridge.toml --stats-interval 5 --json"
)


def add_commands(commands: Commands) -> None:
    """bridge: its options and examples."""
    parser = add_command(commands, "bridge", cmd_bridge, SUMMARY, EXAMPLES, channel=False)
    parser.add_argument("--export", action="append", default=[], metavar="NAME",
                        help="forward local channel NAME to key PREFIX/NAME (repeatable)")
    parser.add_argument("--import", dest="imports", action="append", default=[], metavar="KEY=NAME",
                        help="write Zenoh key KEY into local channel NAME, created as the exporter describes it (repeatable)")
    parser.add_argument("--layout", type=int, choices=(4, 9),
                        help="layout of the channels --import creates (default: the exported channel's)")
    parser.add_argument("--key-prefix", metavar="P", help="prefix of exported keys (default kickmsg/<hostname>)")
    parser.add_argument("--listen", action="append", default=[], metavar="ENDPOINT",
                        help="Zenoh endpoint to accept other bridges on, e.g. tcp/0.0.0.0:7447 (repeatable)")
    parser.add_argument("--connect", action="append", default=[], metavar="ENDPOINT",
                        help="Zenoh endpoint of another bridge or router, e.g. tcp/robot.local:7447 (repeatable)")
    parser.add_argument("--mode", choices=MODES, help="Zenoh mode (default peer)")
    parser.add_argument("--scout", action="store_true", help="find peers by multicast scouting (default: off)")
    parser.add_argument("--config", metavar="FILE.toml", help="options in a TOML file; the command line adds to them")
    parser.add_argument("--stats-interval", type=float, metavar="S", help="print the figures every S seconds")


def options_from_args(args: argparse.Namespace) -> BridgeOptions:
    """The config file's options, with the command line's added (lists) or
    replacing them (single values)."""
    options = load_file(args.config) if args.config else BridgeOptions()
    options.exports += [shm_name(name) for name in args.export]
    options.imports += [dataclasses.replace(parse_import(text), layout=args.layout) for text in args.imports]
    options.listen += args.listen
    options.connect += args.connect
    options.key_prefix = args.key_prefix or options.key_prefix or default_key_prefix()
    options.mode = args.mode or options.mode
    options.multicast_scouting = args.scout or options.multicast_scouting
    if args.stats_interval is not None:
        options.stats_interval = args.stats_interval
    return options


def cmd_bridge(args: argparse.Namespace) -> int:
    """``kickmsg bridge``: run until SIGINT/SIGTERM."""
    run(options_from_args(args), stop_on_signals(), as_json=args.json)
    return 0
