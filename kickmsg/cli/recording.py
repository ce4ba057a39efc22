"""Recording, replay, conversion and Spark analysis: record, play, convert,
analyze."""
import argparse
import glob
import os
import re
import sys
import tempfile
from types import ModuleType

from kickmsg import jsontext, shm
from kickmsg.cli.common import (
    EXIT_OK,
    CommandError,
    Commands,
    add_command,
    emit,
    import_extra,
    open_writable,
    positive_number,
    remapping,
    shm_name,
    stop_on_signals,
)
from kickmsg.cli.receiving import tell_rejoined
from kickmsg.subscriber import Subscriber
from kickmsg.terminal import printable

__all__ = [
    "GLOB_CHARACTERS", "MCAP_MAGIC", "PARQUET_MAGIC", "URI_SCHEME", "add_commands", "cmd_analyze", "cmd_convert", "cmd_play",
    "cmd_record", "is_mcap", "is_parquet", "parquet_of_mcap", "recover_partial_files", "spark_paths",
]

URI_SCHEME = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]*://")  # hdfs://, s3a://, file://: Spark's to resolve
GLOB_CHARACTERS = "*?["
PARQUET_MAGIC = b"PAR1"
MCAP_MAGIC = b"\x89MCAP0\r\n"


def add_commands(commands: Commands) -> None:
    """record, convert, play, analyze: their options and examples."""
    sub = add_command(commands, "record", cmd_record,
                      "record channels to Parquet (or MCAP) files (SIGINT/SIGTERM/SIGHUP close them cleanly)",
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

    sub = add_command(commands, "convert", cmd_convert, "convert a Parquet recording to one MCAP file (open it in Foxglove)",
                      "  kickmsg convert rec/ rec.mcap\n  kickmsg convert rec/ rec.mcap --force   # overwrite rec.mcap",
                      channel=False)
    sub.add_argument("path", metavar="REC_DIR", help="a Parquet recording directory (or one .parquet file)")
    sub.add_argument("out", metavar="OUT.mcap", help="the MCAP file to write (refused if it exists, unless --force)")
    sub.add_argument("--force", action="store_true", help="overwrite OUT.mcap if it exists")

    sub = add_command(commands, "play", cmd_play, "republish a recording with its original timing",
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

    sub = add_command(commands, "analyze", cmd_analyze, "analyse recordings with Spark: rates, gaps, losses, sizes, latency",
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


def cmd_record(args: argparse.Namespace) -> int:
    record = import_extra("kickmsg.recording.record")
    if args.recover is not None:
        return recover_partial_files(args, record)
    discover = "" if args.all else None if args.prefix is None else args.prefix.lstrip("/")
    if not args.names and discover is None:
        raise CommandError("record needs the channels to record (NAME ..., --prefix P or --all; see kickmsg record --help)")
    if args.out is None:
        raise CommandError("record needs --out DIR, the directory for the recording's files (see kickmsg record --help)")
    stop = stop_on_signals()
    names = [shm_name(name) for name in args.names]
    for name in names:  # a name that is no channel is refused as the channel commands do (a Blackboard, a registry: what reads it)
        open_writable(name)

    def tell_rejoin(name: str, subscriber: Subscriber) -> None:  # from that channel's thread; the rows so far carry its earlier losses
        tell_rejoined("record", name, subscriber.lost - recorder.summary.channels[name].lost)

    skipped: set[str] = set()

    def tell_found(name: str) -> None:
        found = "could be joined at last" if name in skipped else "appeared"
        print(f"kickmsg record: {printable(name)} {found}; recording it", file=sys.stderr, flush=True)

    def tell_skipped(name: str, reason: str) -> None:  # from the main thread, or that channel's
        skipped.add(name)
        print(f"kickmsg record: warning: not recording {printable(name)} for now ({printable(reason)}); "
              f"recording the others, trying it again every {args.flush_interval:g} s", file=sys.stderr, flush=True)

    try:
        recorder = record.Recorder(names, args.out, rotate_mb=args.rotate_mb, payload=not args.no_payload,
                                   on_rejoin=tell_rejoin, format=args.format, flush_interval=args.flush_interval,
                                   discover=discover, on_found=tell_found, on_skipped=tell_skipped)
    except shm.RegionNotFoundError as error:
        raise CommandError(str(error)) from None
    if not args.json:
        later = "" if discover is None else f" and every channel named /{printable(discover)}* created later"
        print(f"recording {printable(', '.join(recorder.regions)) or 'nothing yet'}{later} into {args.out} (Ctrl-C stops)", flush=True)
    summary = recorder.run(duration=args.duration, stop=stop)
    channels = {name: vars(counts) for name, counts in summary.channels.items()}
    data = {"recording": summary.recording, "files": summary.files, "channels": channels, "skipped": summary.skipped}
    lines = [f"{printable(name)}: {c['messages']} messages, {c['bytes']} bytes, lost {c['lost']}" for name, c in channels.items()]
    lines += [f"{printable(name)}: not recorded ({printable(reason)})" for name, reason in summary.skipped.items()]
    emit(args, data, "\n".join(lines + [f"files: {', '.join(summary.files) or 'none'}"]))
    return EXIT_OK


def recover_partial_files(args: argparse.Namespace, record: ModuleType) -> int:
    """``record --recover PATH``: the .partial files of a killed recorder made complete."""
    if args.names or args.out is not None or args.all or args.prefix is not None:
        raise CommandError("record --recover PATH takes no channels and no --out: the files are recovered where they are")
    recovered = record.recover(args.recover)
    data = [vars(item) for item in recovered]
    emit(args, data, "\n".join(f"recovered {item.file}: {item.messages} messages" for item in recovered))
    return EXIT_OK


def cmd_play(args: argparse.Namespace) -> int:
    record = import_extra("kickmsg.recording.record")
    stop = stop_on_signals()
    summary = record.play(args.path, rate=args.rate, loop=args.loop, stop=stop, remap=dict(args.remap), only=args.only,
                         layout=args.layout)
    data = {"messages": summary.messages, "dropped": summary.dropped, "channels": sorted(summary.channels)}
    emit(args, data, f"played {summary.messages} messages into {printable(', '.join(sorted(summary.channels)))}"
         + (f" ({summary.dropped} dropped: the pool stayed full)" if summary.dropped else ""))
    return EXIT_OK


def cmd_convert(args: argparse.Namespace) -> int:
    record = import_extra("kickmsg.recording.record")
    summary = record.mcap_module().convert(args.path, args.out, overwrite=args.force)
    emit(args, vars(summary), f"wrote {summary.messages} messages of {printable(', '.join(summary.channels))} to {summary.out}")
    return EXIT_OK


def cmd_analyze(args: argparse.Namespace) -> int:
    """The figures of the recordings: a table, or JSON on stdout (``--json``)
    or in a file (``--json FILE``, then the table too)."""
    if not args.paths:
        raise CommandError("name the recordings to analyse (DIR_OR_GLOB)" + (
            f"; --json took {args.json_path!r} as its FILE: put --json after the recordings to print JSON"
            if args.json_path not in (None, "-") else ""))
    to_stdout = args.json_path == "-"
    with tempfile.TemporaryDirectory(prefix="kickmsg-analyze-") as scratch:
        paths = [spark_path for path in args.paths for spark_path in spark_paths(path, scratch)]
        analysis = import_extra("kickmsg.spark.analysis")
        if args.html_path:
            import_extra("matplotlib")
        errors = import_extra("pyspark.errors")
        try:
            result = analysis.run(paths, master=args.master, json_path=None if to_stdout else args.json_path,
                                  html_path=args.html_path)
        except errors.PySparkException as error:
            raise CommandError(str(error).strip().splitlines()[0]) from None
    if to_stdout:
        print(jsontext.dumps(result, indent=2))
        return EXIT_OK
    print(analysis.format_table(result))
    if args.html_path:
        print(f"report: {os.path.abspath(args.html_path)}")
    return EXIT_OK


def spark_paths(path: str, scratch: str) -> list[str]:
    """What Spark reads for one path given to analyze. URIs (hdfs://,
    s3a://) and globs are Spark's to resolve (Parquet only; a glob that
    matches nothing is refused). A local directory or file is checked before
    Spark starts: it must hold Parquet or MCAP files (by their magic); its
    MCAP files are written as Parquet files into ``scratch``."""
    if URI_SCHEME.match(path):
        return [path]
    if any(character in path for character in GLOB_CHARACTERS):
        if not glob.glob(path):
            raise CommandError(f"nothing matches {path}")
        return [path]
    if os.path.isdir(path):
        files = [os.path.join(top, name) for top, _, names in os.walk(path) for name in names
                 if name.endswith((".parquet", ".mcap"))]
        if not files:
            raise CommandError(f"no .parquet or .mcap files in {path}")
    elif os.path.exists(path):
        files = [path]
    else:
        raise CommandError(f"no such file or directory: {path}")
    parquet, mcap = [], []
    for file in files:
        if is_mcap(file):
            mcap.append(file)
        elif is_parquet(file):
            parquet.append(file)
        else:
            raise CommandError(f"not a Parquet or MCAP file: {file} (neither {PARQUET_MAGIC.decode()} at its start and "
                               "end nor the MCAP magic)")
    return ([path] if parquet else []) + [parquet_of_mcap(file, scratch) for file in mcap]


def parquet_of_mcap(file: str, scratch: str) -> str:
    """Write an MCAP recording file as a Parquet one (without payloads) into ``scratch``; its path."""
    record = import_extra("kickmsg.recording.record")
    parquet = import_extra("pyarrow.parquet")
    out = os.path.join(scratch, f"{len(os.listdir(scratch)):04d}.parquet")
    parquet.write_table(record.mcap_module().analysis_table(file), out)
    return out


def is_mcap(path: str) -> bool:
    """Whether the file starts with the MCAP magic."""
    with open(path, "rb") as file:
        return file.read(len(MCAP_MAGIC)) == MCAP_MAGIC


def is_parquet(path: str) -> bool:
    """Whether the file starts and ends with the Parquet magic."""
    with open(path, "rb") as file:
        head = file.read(4)
        if file.seek(0, os.SEEK_END) < 8:
            return False
        file.seek(-4, os.SEEK_END)
        return head == PARQUET_MAGIC and file.read(4) == PARQUET_MAGIC
