"""Recording, replay, conversion and Spark analysis: record, play, convert,
analyze."""
import argparse
import glob
import os
import re
from types import ModuleType

from kickmsg import shm
from kickmsg.subscriber import Subscriber
from kickmsg.cli.common import EXIT_OK, CommandError, emit, import_extra, shm_name, stop_on_signals
from kickmsg.cli.receiving import tell_rejoined

URI_SCHEME = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]*://")  # hdfs://, s3a://, file://: Spark's to resolve
GLOB_CHARACTERS = "*?["
PARQUET_MAGIC = b"PAR1"


def cmd_record(args: argparse.Namespace) -> int:
    record = import_extra("kickmsg.record")
    if args.recover is not None:
        return recover(args, record)
    discover = "" if args.all else None if args.prefix is None else args.prefix.lstrip("/")
    if not args.names and discover is None:
        raise CommandError("record needs the channels to record (NAME ..., --prefix P or --all)")
    if args.out is None:
        raise CommandError("record needs --out DIR, the directory for the recording's files")
    stop = stop_on_signals()
    names = [shm_name(name) for name in args.names]

    def tell_rejoin(name: str, subscriber: Subscriber) -> None:  # from that channel's thread; the rows so far carry its earlier losses
        tell_rejoined("record", name, subscriber.lost - recorder.summary.channels[name].lost)

    try:
        recorder = record.Recorder(names, args.out, rotate_mb=args.rotate_mb, payload=not args.no_payload,
                                   on_rejoin=tell_rejoin, format=args.format, flush_interval=args.flush_interval,
                                   discover=discover)
    except shm.RegionNotFoundError as error:
        raise CommandError(str(error)) from None
    if not args.json:
        later = "" if discover is None else f" and every channel named /{discover}* created later"
        print(f"recording {', '.join(recorder.regions) or 'nothing yet'}{later} into {args.out} (Ctrl-C stops)", flush=True)
    summary = recorder.run(duration=args.duration, stop=stop)
    channels = {name: vars(counts) for name, counts in summary.channels.items()}
    data = {"recording": summary.recording, "files": summary.files, "channels": channels}
    lines = [f"{name}: {c['messages']} messages, {c['bytes']} bytes, lost {c['lost']}" for name, c in channels.items()]
    emit(args, data, "\n".join(lines + [f"files: {', '.join(summary.files) or 'none'}"]))
    return EXIT_OK


def recover(args: argparse.Namespace, record: ModuleType) -> int:
    """``record --recover PATH``: the .partial files of a killed recorder made complete."""
    if args.names or args.out is not None or args.all or args.prefix is not None:
        raise CommandError("record --recover PATH takes no channels and no --out: the files are recovered where they are")
    recovered = record.recover(args.recover)
    data = [vars(item) for item in recovered]
    emit(args, data, "\n".join(f"recovered {item.file}: {item.messages} messages" for item in recovered))
    return EXIT_OK


def cmd_play(args: argparse.Namespace) -> int:
    record = import_extra("kickmsg.record")
    stop = stop_on_signals()
    summary = record.play(args.path, rate=args.rate, loop=args.loop, stop=stop, remap=dict(args.remap), only=args.only)
    data = {"messages": summary.messages, "dropped": summary.dropped, "channels": sorted(summary.channels)}
    emit(args, data, f"played {summary.messages} messages into {', '.join(sorted(summary.channels))}"
         + (f" ({summary.dropped} dropped: the pool stayed full)" if summary.dropped else ""))
    return EXIT_OK


def cmd_convert(args: argparse.Namespace) -> int:
    record = import_extra("kickmsg.record")
    summary = record.mcap_module().convert(args.path, args.out, overwrite=args.force)
    emit(args, vars(summary), f"wrote {summary.messages} messages of {', '.join(summary.channels)} to {summary.out}")
    return EXIT_OK


def cmd_analyze(args: argparse.Namespace) -> int:
    for path in args.paths:
        check_recording_path(path)
    analysis = import_extra("kickmsg.spark.analysis")
    if args.html_path:
        import_extra("matplotlib")
    errors = import_extra("pyspark.errors")
    try:
        result = analysis.run(args.paths, master=args.master, json_path=args.json_path, html_path=args.html_path)
    except errors.PySparkException as error:
        raise CommandError(str(error).strip().splitlines()[0]) from None
    print(analysis.format_table(result))
    if args.html_path:
        print(f"report: {os.path.abspath(args.html_path)}")
    return EXIT_OK


def check_recording_path(path: str) -> None:
    """Refuse, before Spark starts, a local path that holds no recording: a
    missing path, a directory without *.parquet files, a file without the
    Parquet magic, a glob that matches nothing. URIs (hdfs://, s3a://) are
    Spark's to resolve."""
    if URI_SCHEME.match(path):
        return
    if any(character in path for character in GLOB_CHARACTERS):
        if not glob.glob(path):
            raise CommandError(f"nothing matches {path}")
        return
    if os.path.isdir(path):
        files = [os.path.join(top, name) for top, _, names in os.walk(path) for name in names if name.endswith(".parquet")]
        if not files:
            raise CommandError(f"no .parquet files in {path}")
    elif os.path.exists(path):
        files = [path]
    else:
        raise CommandError(f"no such file or directory: {path}")
    for file in files:
        if not is_parquet(file):
            raise CommandError(f"not a Parquet file: {file} (no {PARQUET_MAGIC.decode()} magic at its start and end)")


def is_parquet(path: str) -> bool:
    """Whether the file starts and ends with the Parquet magic."""
    with open(path, "rb") as file:
        head = file.read(4)
        if file.seek(0, os.SEEK_END) < 8:
            return False
        file.seek(-4, os.SEEK_END)
        return head == PARQUET_MAGIC and file.read(4) == PARQUET_MAGIC
