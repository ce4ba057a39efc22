"""The ``kickmsg`` command: list, inspect, watch, export, echo, measure,
create, remove, repair, clean, record and bridge channels.

This module holds the parser (every command's options and examples, in
``build_parser``) and ``main``; the commands live by family in
``inspecting`` (list, info, stats, watch, schema, diagnose, audit,
exporter: renderers of ``kickmsg.ops.diagnostics``), ``receiving`` (echo, hz,
bw), ``managing`` (pub, create, rm, repair, clean), ``recording`` (record,
play, convert, analyze), ``bridging`` (bridge) and ``checking`` (crosscheck,
verify), ``boards`` (registry, blackboard/bb, bbwatch: layout 9's registry
and boards); ``common`` has what they share.

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
from collections.abc import Callable, Mapping
import signal
import sys
from typing import NoReturn
import warnings

import kickmsg
from kickmsg.protocol.v4 import layout
from kickmsg.cli.common import (
    EXIT_ERROR,
    EXIT_OK,
    NODE_NAMING,
    CommandError,
    add_geometry_options,
    discard_stdout,
    port_number,
    positive_int,
    positive_number,
    print_warnings_on_one_line,
    remapping,
    shm_name,
)
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
    """Every command's options and examples (importing the commands: a few
    tenths of a second, after ``main`` has taken the stop signals)."""
    from kickmsg.cli import bridging
    from kickmsg.cli.checking import cmd_crosscheck, cmd_verify
    from kickmsg.cli.inspecting import (
        LIST_COLUMNS,
        cmd_audit,
        cmd_diagnose,
        cmd_exporter,
        cmd_info,
        cmd_list,
        cmd_schema,
        cmd_schema_diff,
        cmd_stats,
        cmd_watch,
    )
    from kickmsg.cli.managing import cmd_clean, cmd_create, cmd_pub, cmd_repair, cmd_rm
    from kickmsg.cli.receiving import DEFAULT_SILENCE_S, cmd_bw, cmd_echo, cmd_hz
    from kickmsg.cli.recording import cmd_analyze, cmd_convert, cmd_play, cmd_record

    parser = CommandLineParser(
        prog="kickmsg",
        description="Inspect, watch, measure and repair Kickmsg shared-memory channels: regions of this package "
        "and of the native kickmsg, 0.9.2 (layout 9, what new channels get by default) and 0.1.0 (layout 4).",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog="Run 'kickmsg COMMAND --help' for a command's options and examples.",
    )
    parser.add_argument(
        "--version", action="version",
        version=f"kickmsg-py {kickmsg.__version__} (pure Python; this package's own version, not the native kickmsg's): "
        f"Kickmsg layouts 9, as native kickmsg 0.9.2 (the default), and {layout.VERSION}, as native kickmsg 0.1.0",
    )
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    parser.commands = commands.choices

    def command(name: str, function: Callable[[argparse.Namespace], int], summary: str, examples: str,
                channel: bool = True, json_flag: bool = True) -> argparse.ArgumentParser:
        sub = commands.add_parser(
            name, help=summary, description=summary, epilog="examples:\n" + examples,
            formatter_class=argparse.RawDescriptionHelpFormatter,
        )
        sub.set_defaults(run=function, naming=NODE_NAMING)
        if json_flag:
            sub.add_argument("--json", action="store_true", help="machine-readable output")
        if channel:
            sub.add_argument("name", nargs="?", help="shm name, e.g. /kickmsg_imu")
            sub.add_argument("--topic", help="PubSub topic (Node naming: /{prefix}_{topic})")
            sub.add_argument("--broadcast", metavar="CH", help="broadcast channel (/{prefix}_broadcast_{CH})")
            sub.add_argument("--mailbox", nargs=2, metavar=("OWNER", "TAG"), help="mailbox (/{prefix}_{OWNER}_mbx_{TAG})")
            sub.add_argument("--prefix", default="kickmsg", help="Node prefix (default: kickmsg)")
        return sub

    sub = command("list", cmd_list, "list the Kickmsg regions in /dev/shm",
                  "  kickmsg list\n  kickmsg list --prefix kickmsg -o name,subs,pool\n  kickmsg list --json\n"
                  "  kickmsg list --all          # also orphan sidecars and objects of other programs", channel=False)
    sub.add_argument("--prefix", help="only names starting with /PREFIX")
    sub.add_argument("-o", dest="columns", metavar="COLUMNS", help=f"comma-separated columns of {','.join(LIST_COLUMNS)}")
    sub.add_argument("--all", action="store_true", help="also list orphan sidecars and objects that are not Kickmsg regions")

    command("info", cmd_info, "every header field, decoded", "  kickmsg info /kickmsg_imu\n  kickmsg info --topic imu --json")
    sub = command("stats", cmd_stats, "rings (state, in-flight, write position, pending, losses) and pool use",
                  "  kickmsg stats --topic imu\n  kickmsg stats /kickmsg_imu --all-rings   # idle rings too, one line each")
    sub.add_argument("--all-rings", action="store_true",
                     help="a line for every ring (by default idle rings, Free and never written, are counted in one line)")

    sub = command("watch", cmd_watch, "a live view: messages/s per ring, pool use, new losses (Ctrl-C stops)",
                  "  kickmsg watch --topic imu\n  kickmsg watch /kickmsg_imu --interval 0.5 --count 10 --json")
    sub.add_argument("--interval", type=positive_number, default=1.0, help="seconds between refreshes (default 1)")
    sub.add_argument("--count", type=positive_int, help="stop after this many refreshes")

    sub = command("echo", cmd_echo, "subscribe and print messages (typed channels print their fields)",
                  "  kickmsg echo --topic imu --count 5\n  kickmsg echo /kickmsg_imu --format hex\n"
                  "  kickmsg echo --topic imu --format raw --count 1 > frame.bin\n"
                  "  kickmsg echo --topic imu --format frames > dump.frames")
    sub.add_argument("--count", type=positive_int, help="stop after this many messages")
    sub.add_argument("--format", choices=("text", "hex", "json", "raw", "frames"), default="text",
                     help="text (control characters escaped), hex, json (one object a line), raw (the payloads' bytes "
                          "back to back: --count N takes N messages), frames (each payload after its length, 8 bytes "
                          "unsigned little-endian)")
    sub.add_argument("--timeout", type=positive_number, metavar="S",
                     help="stop when nothing arrives for S seconds (exit 1 if --count was not reached; default: wait)")

    for name, function, summary in (
        ("hz", cmd_hz, "publish rate seen by a subscriber: mean, min/max/std of intervals"),
        ("bw", cmd_bw, "bandwidth seen by a subscriber: bytes/s and message sizes"),
    ):
        sub = command(name, function, summary, f"  kickmsg {name} --topic imu\n  kickmsg {name} /kickmsg_imu --count 100 --json")
        sub.add_argument("--window", type=positive_int, default=1000, help="messages kept for the statistics (default 1000)")
        sub.add_argument("--every", type=positive_number, default=1.0, help="seconds between reports (default 1)")
        sub.add_argument("--count", type=positive_int, help="stop after this many messages")
        sub.add_argument("--duration", type=positive_number, help="stop after this many seconds")
        sub.add_argument("--timeout", type=positive_number, metavar="S",
                         help=f"stop when nothing arrives for S seconds (default with --count: {DEFAULT_SILENCE_S:g}; "
                              f"exit 1 if --count was not reached)")

    sub = command("pub", cmd_pub, "publish from the shell: text, hex (--hex) or a file (@path)",
                  "  kickmsg pub --topic cmd 'hello'\n  kickmsg pub /kickmsg_cmd --hex 01ff --rate 10 --count 50\n"
                  "  kickmsg pub --topic blob @frame.bin\n  kickmsg pub /kickmsg_cmd 'hello' --create --pool 512")
    sub.add_argument("data", help="text, hex digits with --hex, or @path")
    sub.add_argument("--hex", action="store_true", help="DATA is hexadecimal")
    sub.add_argument("--rate", type=positive_number, help="messages per second (default: as fast as possible)")
    sub.add_argument("--count", type=positive_int, default=1, help="how many times to publish (default 1)")
    sub.add_argument("--create", action="store_true",
                     help="create the channel if it does not exist (a Broadcast one if named by --broadcast), "
                          "with the options below; an existing channel is used as it is")
    add_geometry_options(sub, creator="kickmsg-pub")

    sub = command("create", cmd_create, "create a channel (refuses an existing name unless --replace)",
                  "  kickmsg create /kickmsg_imu\n  kickmsg create --topic imu --ring 128 --pool 1024 --payload 256\n"
                  "  kickmsg create /kickmsg_chat --broadcast --mode 0660 --json", channel=False)
    sub.set_defaults(naming="NAME or --topic T", broadcast=None, mailbox=None)
    sub.add_argument("name", nargs="?", help="shm name, e.g. /kickmsg_imu")
    sub.add_argument("--topic", help="topic (Node naming: /{prefix}_{topic})")
    sub.add_argument("--prefix", default="kickmsg", help="Node prefix (default: kickmsg)")
    sub.add_argument("--broadcast", dest="broadcast_type", action="store_true",
                     help="a Broadcast channel (default: PubSub)")
    add_geometry_options(sub, creator="kickmsg-create")
    sub.add_argument("--replace", action="store_true", help="replace an existing object of that name")

    sub = command("rm", cmd_rm, "remove regions (and their owner sidecars)",
                  "  kickmsg rm /kickmsg_imu /kickmsg_camera\n  kickmsg rm /not_a_region --force", channel=False)
    sub.add_argument("names", nargs="+", metavar="NAME", help="shm names")
    sub.add_argument("--force", action="store_true", help="also remove objects that are not Kickmsg regions")

    command("schema", cmd_schema, "the channel's schema descriptor", "  kickmsg schema --topic imu")
    sub = command("schema-diff", cmd_schema_diff, "compare two channels' schema descriptors (exit 1 if they differ)",
                  "  kickmsg schema-diff /kickmsg_imu /kickmsg_imu_replay", channel=False)
    sub.add_argument("a")
    sub.add_argument("b")

    command("diagnose", cmd_diagnose, "health counts (read-only; exit 1 if damage is found)", "  kickmsg diagnose --topic imu")
    command("audit", cmd_audit, "check every invariant (read-only; exit 1 unless clean)", "  kickmsg audit /kickmsg_imu --json")

    sub = command("repair", cmd_repair, "repair a channel (without options: the repairs safe under traffic)",
                  "  kickmsg repair --topic imu\n  kickmsg repair --topic imu --retired --orphans --yes\n"
                  "  kickmsg repair --topic imu --ring 3 --force   # ring 3: no record says who holds it")
    sub.add_argument("--locked", action="store_true", help="commit entries left locked by crashed publishers (safe)")
    sub.add_argument("--dead-subscribers", action="store_true",
                     help="free rings of subscribers that died, give back the slots Free rings still hold, and clear "
                          "records of publishers that died (safe)")
    sub.add_argument("--retired", action="store_true", help="reset and drain rings left by crashed publishers (unsafe)")
    sub.add_argument("--orphans", action="store_true", help="reclaim unreferenced slots (needs quiescence)")
    sub.add_argument("--ring", type=int, metavar="N",
                     help="with --force: free ring N that no owner record accounts for (refused if a live process "
                          "holds its record; only once no process reads it)")
    sub.add_argument("--force", action="store_true", help="confirm --ring N")
    sub.add_argument("--yes", action="store_true", help="do not ask for confirmation")

    sub = command("record", cmd_record, "record channels to Parquet (or MCAP) files (SIGINT/SIGTERM/SIGHUP close them cleanly)",
                  "  kickmsg record /kickmsg_imu /kickmsg_camera --out rec/ --duration 60\n"
                  "  kickmsg record /kickmsg_camera --out rec/ --no-payload --rotate-mb 256\n"
                  "  kickmsg record /kickmsg_imu --out rec/ --format mcap\n"
                  "  kickmsg record --prefix kickmsg_robot --out rec/   # and the channels created later\n"
                  "  kickmsg record --recover rec/     # the .partial files of a killed recorder", channel=False)
    sub.add_argument("names", nargs="*", metavar="NAME", help="shm names of the channels")
    discovering = sub.add_mutually_exclusive_group()
    discovering.add_argument("--all", action="store_true",
                             help="record every channel, those created while recording included")
    discovering.add_argument("--prefix", metavar="P",
                             help="record every channel named /P..., those created while recording included")
    sub.add_argument("--out", metavar="DIR", help="directory for the recording's files")
    sub.add_argument("--recover", metavar="PATH",
                     help="instead of recording: turn the .partial files a killed recorder left (a file or a directory) "
                          "into complete files")
    sub.add_argument("--flush-interval", type=positive_number, default=1.0, metavar="S",
                     help="seconds between writes to the file: what a killed recorder loses at most (default 1)")
    sub.add_argument("--duration", type=positive_number, help="stop after this many seconds")
    sub.add_argument("--rotate-mb", type=positive_number, default=64, help="start a new file past this size (default 64)")
    sub.add_argument("--no-payload", action="store_true", help="keep sizes and stamps, not the payloads")
    sub.add_argument("--format", choices=("parquet", "mcap"), default="parquet",
                     help="parquet (default; for Spark) or mcap (for Foxglove; needs the payloads)")

    sub = command("convert", cmd_convert, "convert a Parquet recording to one MCAP file (open it in Foxglove)",
                  "  kickmsg convert rec/ rec.mcap\n  kickmsg convert rec/ rec.mcap --force   # overwrite rec.mcap",
                  channel=False)
    sub.add_argument("path", metavar="REC_DIR", help="a Parquet recording directory (or one .parquet file)")
    sub.add_argument("out", metavar="OUT.mcap", help="the MCAP file to write (refused if it exists, unless --force)")
    sub.add_argument("--force", action="store_true", help="overwrite OUT.mcap if it exists")

    sub = command("play", cmd_play, "republish a recording with its original timing",
                  "  kickmsg play rec/\n  kickmsg play rec/ --rate 2 --loop\n  kickmsg play rec.mcap\n"
                  "  kickmsg play rec/ --only /kickmsg_imu --remap /kickmsg_imu=/kickmsg_imu_replay", channel=False)
    sub.add_argument("path", metavar="PATH", help="a recording directory, or one .parquet or .mcap file")
    sub.add_argument("--only", action="append", type=shm_name, metavar="NAME",
                     help="play only this recorded channel (repeat for more; default: all)")
    sub.add_argument("--remap", action="append", type=remapping, default=[], metavar="OLD=NEW",
                     help="publish recorded channel OLD into channel NEW (repeat for more)")
    sub.add_argument("--rate", type=positive_number, default=1.0, help="speed factor (default 1: real time)")
    sub.add_argument("--loop", action="store_true", help="start over at the end, until interrupted")
    sub.add_argument("--layout", type=int, choices=(4, 9),
                     help="layout of the channels play creates (default: each as recorded)")

    sub = command("analyze", cmd_analyze, "analyse recordings with Spark: rates, gaps, losses, sizes, latency",
                  "  kickmsg analyze rec/ --html report.html\n"
                  "  kickmsg analyze rec/ --json                # the figures as JSON on stdout\n"
                  "  kickmsg analyze 'runs/*/' --master 'local[2]' --json out.json\n"
                  "on a cluster, the same module unchanged:\n"
                  "  spark-submit $(python -c 'import kickmsg.spark.analysis as a; print(a.__file__)') \\\n"
                  "      'hdfs:///recordings/*/*.parquet' --json out.json --html report.html",
                  channel=False, json_flag=False)
    sub.add_argument("paths", nargs="*", metavar="DIR_OR_GLOB", help="recording directories, files or globs")
    sub.add_argument("--master", default="local[*]", help="Spark master (default local[*])")
    sub.add_argument("--json", dest="json_path", nargs="?", const="-", metavar="FILE",
                     help="print the figures as JSON on stdout instead of the table; with FILE, write them to FILE "
                          "and print the table")
    sub.add_argument("--html", dest="html_path", metavar="FILE", help="write an HTML report with plots")

    bridging.add_arguments(command("bridge", bridging.cmd_bridge, bridging.SUMMARY, bridging.EXAMPLES, channel=False))

    sub = command("clean", cmd_clean, "remove regions whose creator is dead and that no process has open or mapped",
                  "  kickmsg clean --dry-run\n  kickmsg clean --prefix kickmsg", channel=False)
    sub.add_argument("--dry-run", action="store_true", help="only list what would be removed")
    sub.add_argument("--force", action="store_true",
                     help="also remove regions of dead creators that could not be proven unused (never one in use)")
    sub.add_argument("--prefix", help="only names starting with /PREFIX")

    sub = command("exporter", cmd_exporter, "serve Prometheus metrics of every channel on /metrics (read-only)",
                  "  kickmsg exporter\n  kickmsg exporter --port 9464 --bind 127.0.0.1 --prefix kickmsg --interval 5",
                  channel=False, json_flag=False)
    sub.add_argument("--port", type=port_number, default=9464, help="TCP port (default 9464; 0: any free port)")
    sub.add_argument("--bind", default="127.0.0.1", metavar="ADDRESS", help="address to listen on (default 127.0.0.1)")
    sub.add_argument("--prefix", help="only channels whose name starts with /PREFIX")
    sub.add_argument("--interval", type=positive_number, default=5.0, help="seconds between readings (default 5)")

    sub = command("crosscheck", cmd_crosscheck,
                  "run random operations on this package and another implementation, compare results and region "
                  "bytes (exit 1 at the first divergence, printing a sequence that reproduces it)",
                  "  kickmsg crosscheck --other-python python3 --other-path .native/kickmsg-0.1.0\n"
                  "  kickmsg crosscheck --other-python python3 --other-path .native/kickmsg-0.9.2 --layout 9\n"
                  "  kickmsg crosscheck --other-python /opt/py/bin/python --ops 5000 --seed 7 --json\n"
                  "  kickmsg crosscheck --other-python python3 --other-path .native/kickmsg-0.1.0 --replay repro.jsonl",
                  channel=False)
    sub.add_argument("--other-python", required=True, metavar="PY", help="interpreter of the other implementation")
    sub.add_argument("--other-path", metavar="DIR", help="put DIR (or DIR:DIR...) first on its sys.path, run it with "
                     "-I -S (default: -I and its own kickmsg)")
    sub.add_argument("--ops", type=int, default=1000, help="number of random operations (default 1000; 1 to 1000000)")
    sub.add_argument("--seed", type=int, default=0, help="seed of the random sequence (default 0)")
    sub.add_argument("--replay", metavar="FILE", help="run the operations in FILE (one JSON list per line) instead")
    sub.add_argument("--layout", type=int, choices=(4, 9), default=4,
                     help="channel layout compared: 4 (native 0.1.0's API, the default) or 9 (native 0.9.2's)")

    sub = command("verify", cmd_verify,
                  "run the package's publish, receive, join and leave code under a controlled scheduler, checking "
                  "the protocol's invariants after every atomic step (exit 1 at a violation, printing the trace)",
                  "  kickmsg verify                                  # every schedule with <= 2 preemptions\n"
                  "  kickmsg verify --mutant release-before-lock     # break a rule of the spec: a trace is printed\n"
                  "  kickmsg verify --seed 7 --runs 5000             # seeded random schedules instead\n"
                  "  kickmsg verify --publishers 3 --capacity 4 --preemptions 1\n"
                  "  kickmsg verify --repair-pass --preemptions 1        # a repair pass racing live traffic\n"
                  "  kickmsg verify --memory-model ra                # C11 release/acquire: <= 2 preemptions + stale reads\n"
                  "  kickmsg verify --mutant spec-seqlock-orders     # the spec's seqlock orders: a stale re-check (ra)\n"
                  "  kickmsg verify --mutant commit-relaxed          # a memory-order mutant (explored under ra)\n"
                  "  kickmsg verify --orders                         # weaken each order one step: which are needed?\n"
                  "  kickmsg verify --layout 9                       # layout 9 (0.9.2): stalls, steals, <= 1 preemption\n"
                  "  kickmsg verify --layout 9 --deaths 1 --blocking # a publisher may die; subscribers sleep on the futex\n"
                  "  kickmsg verify --layout 9 --repair-pass --publishers 1 --preemptions 2   # repair_locked_entries racing\n"
                  "  kickmsg verify --layout 9 --subscriber-deaths 1 --reclaimers 1   # reclaim_dead_rings racing\n"
                  "  kickmsg verify --layout 9 --mutant no-meta-tag-check   # 0.9's receive: the bug 0.9.2 fixed (ra)",
                  channel=False)
    from kickmsg.verify import BOUNDS, SIZES
    from kickmsg.verify.mutants import MUTANTS, MUTANTS9

    def within(name: str) -> str:  # the range a number is refused beyond
        least, most = {**SIZES, **BOUNDS}[name]
        return f"{least} to {most}"

    sub.add_argument("--layout", type=int, choices=(4, 9), default=4,
                     help="the flows explored: layout 4 (kickmsg 0.1.0, default) or layout 9 (kickmsg.protocol.v9)")
    sub.add_argument("--mutant", choices=sorted({**MUTANTS, **MUTANTS9}),
                     help="break one rule of the spec (default: none; layout 9's mutants need --layout 9)")
    sub.add_argument("--preemptions", type=int, metavar="K",
                     help="explore every schedule with at most K preemptions (default 2; 1 with --orders or "
                          f"--layout 9, or the mutant's; {within('preemptions')})")
    sub.add_argument("--memory-model", choices=("sc", "ra"),
                     help="sc: sequential consistency; ra: the C11 release/acquire/relaxed model, with data races "
                          "on payloads (default: sc, or ra for a memory-order mutant)")
    sub.add_argument("--stale", type=int, metavar="W",
                     help="under ra, at most W loads per schedule read an older store than the newest (default 2; "
                          f"{within('stale')})")
    sub.add_argument("--budget", type=int, metavar="B",
                     help="at most B preemptions and stale reads together (default: 2 under ra, no limit under sc; "
                          f"{within('budget')})")
    sub.add_argument("--orders", action="store_true",
                     help="weaken every memory order of the flows one step in turn and explore under ra (at most "
                          "1 preemption); print which orders a counter-example shows necessary")
    sub.add_argument("--max-schedules", type=int, default=1_000_000, metavar="N",
                     help=f"stop an exhaustive exploration after N schedules (default 1000000; {within('max_schedules')})")
    sub.add_argument("--seed", type=int, help="run seeded random schedules instead of the exhaustive exploration")
    sub.add_argument("--runs", type=int, default=1000,
                     help=f"random schedules to run with --seed (default 1000; {within('runs')})")
    for field, meaning in (("publishers", "publishers"), ("messages", "messages per publisher"),
                          ("subscribers", "subscribers (each with its own ring)"), ("capacity", "ring capacity"),
                          ("pool", "pool slots")):
        sub.add_argument(f"--{field}", type=int, metavar="N",
                         help=f"{meaning} (default: the mutant's scenario; {within(field)})")
    sub.add_argument("--rings", type=int, metavar="N",
                     help="max_subscribers (default: one per subscriber; with fewer, a subscriber retries its join "
                          f"on layout 9; 1 to {SIZES['rings'][1]})")
    sub.add_argument("--repair-pass", action="store_true",
                     help="add an actor that runs repair_locked_entries() once, concurrently")
    sub.add_argument("--deaths", type=int, metavar="N",
                     help="layout 9: at most N publishers die, each at any step (default 0; at most the publishers)")
    sub.add_argument("--subscriber-deaths", type=int, metavar="N",
                     help="layout 9: at most N subscribers die, each at any step (default 0; at most the subscribers)")
    sub.add_argument("--reclaimers", type=int, metavar="N",
                     help="layout 9: add N actors that each run reclaim_dead_rings() once, concurrently (default 0; "
                          f"{within('reclaimers')})")
    sub.add_argument("--blocking", action="store_true",
                     help="subscribers receive with the core's blocking receive, asleep on the futex, instead of polling")
    from kickmsg.cli.boards import add_board_commands

    add_board_commands(command)
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
    try:
        args = parse(sys.argv[1:] if argv is None else argv)
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
