"""Analysis of Kickmsg recordings (the Parquet files of ``kickmsg record``).

Per channel: message count, rate, inter-arrival times, ring gaps and losses,
payload sizes, throughput, publish-to-receive latency (for channels whose
payloads carry a ``kickmsg.recording.stamp`` time) and messages per second.

The module is self-contained: it imports only PySpark and the standard
library (plus matplotlib for the HTML report), and uses DataFrame functions
only (no Python UDFs), so it runs unchanged on a cluster::

    spark-submit analysis.py 'hdfs:///recordings/*/*.parquet' --json out.json --html report.html
    python -m kickmsg.spark.analysis recordings/ --html report.html   # local mode

Definitions (rows grouped by ``channel``; times compared only within one
``recording``, since monotonic clocks differ between runs and hosts):

- ``duration_s``: sum over recordings of last minus first ``recv_mono_ns``;
  ``rate_hz``: intervals / duration, intervals = messages - 1 per recording.
- ``interarrival_ms``: differences of consecutive ``recv_mono_ns`` within
  each (recording, channel); percentiles approximate, max exact.
- ``gaps``: sum over consecutive ``ring_pos`` within each (recording,
  channel, rejoined) of max(0, difference - 1) (``ring_pos`` starts over
  in a re-created region); ``lost``: sum of the ``lost`` column;
  ``loss_ratio``: lost / (messages + lost).
- ``restarts``: re-created regions the recorder followed between a
  channel's first and last row, summed over recordings (the ``rejoined``
  column; 0 for files recorded before it existed).
- ``stamped``: at least 99 % of the rows have 0 <= recv_mono_ns - stamp_ns
  <= 60 s; ``latency_us`` is then computed over those rows.
- ``per_second``: messages and bytes in second k = floor((recv_mono_ns -
  first recv_mono_ns of the recording) / 1e9), summed over recordings.
"""
import argparse
import base64
import contextlib
import html
import io
import json
import os
import signal
import sys
from collections.abc import Iterator, Sequence
from types import ModuleType
from typing import TYPE_CHECKING, Any

from pyspark.sql import DataFrame, SparkSession, Window
from pyspark.sql import functions as F
from pyspark.sql.types import DoubleType, StringType, StructField, StructType

if TYPE_CHECKING:
    from matplotlib.figure import Figure  # imported when a report is written

__all__ = [
    "ACCURACY", "COLUMNS", "Figures", "HISTOGRAM_BINS", "STAMPED_PERCENT", "STAMP_WINDOW_NS", "analyze", "format_table",
    "main", "read_recordings", "run", "write_html",
]

COLUMNS = ["recording", "channel", "ring_pos", "recv_mono_ns", "size", "lost", "stamp_ns", "rejoined"]
ACCURACY = 100_000          # percentile_approx: rank error at most 1/ACCURACY of the rows
STAMP_WINDOW_NS = 60 * 10**9  # a latency outside [0, 60 s] is not a stamp
STAMPED_PERCENT = 99          # of the rows, for a channel to count as stamped
HISTOGRAM_BINS = 50

Figures = dict[str, Any]  # one channel's figures (or Spark aggregates), JSON values


def read_recordings(spark: SparkSession, paths: Sequence[str]) -> DataFrame:
    """The recording rows of ``paths`` (directories, files or globs), with
    the columns the analysis uses (``payload`` is never read)."""
    frame = (
        spark.read.option("mergeSchema", "true")   # files with and without payload
        .option("pathGlobFilter", "*.parquet")     # skip files being written, notes, ...
        .parquet(*paths)
    )
    if "rejoined" not in frame.columns:  # every file recorded before the column existed
        frame = frame.withColumn("rejoined", F.lit(0))
    return frame.select(*COLUMNS).fillna(0, subset=["rejoined"])  # null in such files merged with newer ones


def analyze(spark: SparkSession, paths: str | Sequence[str]) -> dict[str, Figures]:
    """Figures of the recordings under ``paths``, ``{channel: {figure: value}}``
    in channel order, as plain JSON-serialisable values."""
    if isinstance(paths, str):
        paths = [paths]
    by_time = Window.partitionBy("recording", "channel").orderBy("recv_mono_ns")
    latency = F.col("recv_mono_ns") - F.col("stamp_ns")
    in_window = latency.between(0, STAMP_WINDOW_NS)   # null when stamp_ns is null
    rows = (
        read_recordings(spark, paths)
        .withColumn("interarrival_ns", F.col("recv_mono_ns") - F.lag("recv_mono_ns").over(by_time))
        .withColumn("stamp_ok", F.coalesce(in_window, F.lit(False)))
        .withColumn("latency_ns", F.when(in_window, latency))
    )
    rows.persist()
    try:
        spans = _spans(rows)
        figures = _channel_figures(rows)
        per_second = _per_second(rows)
        channels: dict[str, Figures] = {}
        for name in sorted(figures):
            channel = _finish(figures[name], spans[name])
            channel["per_second"] = per_second.get(name, [])
            channels[name] = channel
        _add_histograms(spark, rows, figures, channels)
    finally:
        rows.unpersist()
    return channels


def _spans(rows: DataFrame) -> dict[str, Figures]:
    """Per channel: summed duration (ns), intervals, ring gaps and restarts over recordings."""
    per_region = rows.groupBy("recording", "channel", "rejoined").agg(
        # The sum of max(0, step - 1) over the sorted distinct positions is
        # (last - first) - (distinct - 1); repeated positions add nothing.
        (F.max("ring_pos") - F.min("ring_pos") - (F.countDistinct("ring_pos") - 1)).alias("gaps"),
    )
    per_run = rows.groupBy("recording", "channel").agg(
        (F.max("recv_mono_ns") - F.min("recv_mono_ns")).alias("duration_ns"),
        (F.count("*") - 1).alias("intervals"),
        (F.max("rejoined") - F.min("rejoined")).alias("restarts"),
    ).join(per_region.groupBy("recording", "channel").agg(F.sum("gaps").alias("gaps")), ["recording", "channel"])
    totals = per_run.groupBy("channel").agg(
        F.sum("duration_ns").alias("duration_ns"),
        F.sum("intervals").alias("intervals"),
        F.sum("gaps").alias("gaps"),
        F.sum("restarts").alias("restarts"),
    )
    return {r["channel"]: r.asDict() for r in totals.collect()}


def _channel_figures(rows: DataFrame) -> dict[str, Figures]:
    """Per channel: the aggregates computed over all its rows."""
    quantiles = [0.5, 0.95, 0.99]
    totals = rows.groupBy("channel").agg(
        F.count("*").alias("messages"),
        F.countDistinct("recording").alias("recordings"),
        F.sum("lost").alias("lost"),
        F.min("size").alias("size_min"),
        F.percentile_approx("size", [0.5, 0.95], ACCURACY).alias("size_q"),
        F.max("size").alias("size_max"),
        F.avg("size").alias("size_mean"),
        F.sum("size").alias("bytes"),
        F.percentile_approx("interarrival_ns", quantiles, ACCURACY).alias("interarrival_q"),
        F.max("interarrival_ns").alias("interarrival_max"),
        F.sum(F.col("stamp_ok").cast("long")).alias("stamped_rows"),
        F.percentile_approx("latency_ns", quantiles, ACCURACY).alias("latency_q"),
        F.max("latency_ns").alias("latency_max"),
    )
    return {r["channel"]: r.asDict() for r in totals.collect()}


def _per_second(rows: DataFrame) -> dict[str, list[dict[str, int]]]:
    """Per channel: [{second, messages, bytes}] for every second from 0 to
    the last one with a message (seconds without messages count 0)."""
    starts = rows.groupBy("recording").agg(F.min("recv_mono_ns").alias("start_ns"))
    counts = (
        rows.join(F.broadcast(starts), "recording")
        .withColumn("second", F.expr("(recv_mono_ns - start_ns) div 1000000000"))
        .groupBy("channel", "second")
        .agg(F.count("*").alias("messages"), F.sum("size").alias("bytes"))
    )
    found: dict[str, dict[int, tuple[int, int]]] = {}  # channel -> second -> (messages, bytes)
    for r in counts.collect():
        found.setdefault(r["channel"], {})[r["second"]] = (r["messages"], r["bytes"])
    result = {}
    for channel, seconds in found.items():
        result[channel] = [
            {"second": k, "messages": seconds.get(k, (0, 0))[0], "bytes": seconds.get(k, (0, 0))[1]}
            for k in range(max(seconds) + 1)
        ]
    return result


def _finish(agg: Figures, span: Figures) -> Figures:
    """The published figures of one channel from its Spark aggregates."""
    messages, lost = agg["messages"], agg["lost"] or 0
    duration_ns = span["duration_ns"]
    duration_s = duration_ns / 1e9
    stamped = 100 * agg["stamped_rows"] >= STAMPED_PERCENT * messages
    return {
        "messages": messages,
        "recordings": agg["recordings"],
        "duration_s": duration_s,
        "rate_hz": span["intervals"] / duration_s if duration_ns else None,
        "interarrival_ms": _stats(agg["interarrival_q"], agg["interarrival_max"], 1e6),
        "gaps": span["gaps"],
        "restarts": span["restarts"],
        "lost": lost,
        "loss_ratio": lost / (messages + lost),
        "size_bytes": {
            "min": agg["size_min"],
            "p50": agg["size_q"][0],
            "p95": agg["size_q"][1],
            "max": agg["size_max"],
            "mean": agg["size_mean"],
        },
        "bytes_per_s": agg["bytes"] / duration_s if duration_ns else None,
        "stamped": stamped,
        "latency_us": _stats(agg["latency_q"], agg["latency_max"], 1e3) if stamped else None,
    }


def _stats(quantiles: Sequence[float], maximum: float | None, unit_ns: float) -> dict[str, float] | None:
    """{p50, p95, p99, max} in units of ``unit_ns`` nanoseconds, or None without values."""
    if maximum is None:
        return None
    p50, p95, p99 = quantiles
    return {"p50": p50 / unit_ns, "p95": p95 / unit_ns, "p99": p99 / unit_ns, "max": maximum / unit_ns}


def _add_histograms(
    spark: SparkSession, rows: DataFrame, figures: dict[str, Figures], channels: dict[str, Figures]
) -> None:
    """Add ``histograms`` to each channel: bucketed counts (computed by
    Spark) of inter-arrival and latency times for the plots, in
    HISTOGRAM_BINS equal bins over [0, min(max, 2 * p99)], plus the number
    of values above; None where a channel has no such values."""
    kinds = [("interarrival_ms", "interarrival_ns", 1e6), ("latency_us", "latency_ns", 1e3)]
    for key, column, unit_ns in kinds:
        upper_ns: dict[str, float] = {}
        for name, channel in channels.items():
            channel.setdefault("histograms", {})[key] = None
            if channel[key] is not None:
                agg, prefix = figures[name], column.removesuffix("_ns")   # interarrival_max, ...
                maximum, p99 = agg[prefix + "_max"], agg[prefix + "_q"][2]
                upper_ns[name] = float(max(min(maximum, 2 * p99), 1))
        if not upper_ns:
            continue
        schema = StructType([StructField("channel", StringType()), StructField("upper_ns", DoubleType())])
        limits = spark.createDataFrame(list(upper_ns.items()), schema)
        value, upper = F.col(column), F.col("upper_ns")
        counts = (
            rows.where(value.isNotNull())
            .join(F.broadcast(limits), "channel")
            .withColumn(
                "bin",
                F.when(value > upper, F.lit(-1))   # -1: above the plotted range
                .otherwise(F.least(F.floor(value * HISTOGRAM_BINS / upper), F.lit(HISTOGRAM_BINS - 1))),
            )
            .groupBy("channel", "bin")
            .count()
        )
        for name, limit in upper_ns.items():
            channels[name]["histograms"][key] = {
                "width": limit / HISTOGRAM_BINS / unit_ns,
                "counts": [0] * HISTOGRAM_BINS,
                "above": 0,
            }
        for r in counts.collect():
            histogram = channels[r["channel"]]["histograms"][key]
            if r["bin"] < 0:
                histogram["above"] = r["count"]
            else:
                histogram["counts"][r["bin"]] = r["count"]


# ---------------------------------------------------------------- report

def write_html(result: dict[str, Figures], path: str) -> None:
    """Write a one-file HTML report: per channel a table of the figures and
    PNG plots (rate over time, inter-arrival and latency histograms)."""
    import matplotlib

    matplotlib.use("Agg")
    from matplotlib import pyplot

    parts = [
        "<!DOCTYPE html>",
        "<html><head><meta charset='utf-8'><title>Kickmsg recordings</title>",
        "<style>body{font-family:sans-serif;margin:2em}table{border-collapse:collapse}"
        "td,th{border:1px solid #ccc;padding:2px 8px;text-align:right}th{text-align:left}"
        "img{max-width:32%;margin:4px}</style></head><body>",
        "<h1>Kickmsg recordings</h1>",
        f"<p>channels: {html.escape(', '.join(result))}</p>",
    ]
    for name, channel in result.items():
        parts.append(f"<h2>{html.escape(name)}</h2>")
        parts.append(_figure_table(channel))
        images = [_rate_plot(pyplot, name, channel["per_second"])]
        histograms = channel.get("histograms", {})
        if histograms.get("interarrival_ms"):
            images.append(_histogram_plot(pyplot, f"{name}: inter-arrival", "ms", histograms["interarrival_ms"]))
        if histograms.get("latency_us"):
            images.append(_histogram_plot(pyplot, f"{name}: latency", "µs", histograms["latency_us"]))
        parts.append("<div>" + "".join(f'<img src="data:image/png;base64,{png}">' for png in images) + "</div>")
    parts.append("</body></html>")
    with open(path, "w", encoding="utf-8") as out:
        out.write("\n".join(parts))


def _figure_table(channel: Figures) -> str:
    """The figures of one channel as an HTML table (one row per figure)."""
    lines = ["<table>"]
    for key, value in channel.items():
        if key in ("per_second", "histograms"):
            continue
        if isinstance(value, dict):
            value = ", ".join(f"{k} {_fmt(v)}" for k, v in value.items())
        else:
            value = _fmt(value)
        lines.append(f"<tr><th>{html.escape(key)}</th><td>{html.escape(value)}</td></tr>")
    lines.append("</table>")
    return "\n".join(lines)


def _png(pyplot: ModuleType, figure: "Figure") -> str:
    """``figure`` as base64 PNG text; the figure is closed."""
    buffer = io.BytesIO()
    figure.savefig(buffer, format="png", dpi=80, bbox_inches="tight")
    pyplot.close(figure)
    return base64.b64encode(buffer.getvalue()).decode("ascii")


def _rate_plot(pyplot: ModuleType, name: str, per_second: list[dict[str, int]]) -> str:
    figure, axes = pyplot.subplots(figsize=(5, 3))
    axes.stairs([s["messages"] for s in per_second], range(len(per_second) + 1))   # second k spans [k, k+1)
    axes.set(title=f"{name}: rate", xlabel="second of recording", ylabel="messages per second")
    axes.set_ylim(bottom=0)
    return _png(pyplot, figure)


def _histogram_plot(pyplot: ModuleType, title: str, unit: str, histogram: dict[str, Any]) -> str:
    figure, axes = pyplot.subplots(figsize=(5, 3))
    width = histogram["width"]
    lefts = [i * width for i in range(len(histogram["counts"]))]
    axes.bar(lefts, histogram["counts"], width=width, align="edge")
    if histogram["above"]:
        title += f" ({histogram['above']} above {len(lefts) * width:.5g} {unit})"
    axes.set_yscale("log")   # tails are often a few messages beside thousands
    axes.set(title=title, xlabel=unit, ylabel="messages")
    return _png(pyplot, figure)


def _fmt(value: object) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:.4g}" if value == 0 or 1e-3 <= abs(value) < 1e7 else f"{value:.3e}"
    return str(value)


def format_table(result: dict[str, Figures]) -> str:
    """A plain-text table of the main figures, one line per channel."""
    header = ["channel", "messages", "rate Hz", "p50 ms", "p99 ms", "lost", "loss",
              "bytes/s", "lat p50 us", "lat p99 us"]
    lines = []
    for name, c in result.items():
        ia, lat = c["interarrival_ms"] or {}, c["latency_us"] or {}
        lines.append([
            name, str(c["messages"]), _fmt(c["rate_hz"]), _fmt(ia.get("p50")), _fmt(ia.get("p99")),
            str(c["lost"]), f"{c['loss_ratio']:.2%}", _fmt(c["bytes_per_s"]),
            _fmt(lat.get("p50")), _fmt(lat.get("p99")),
        ])
    widths = [max(len(row[i]) for row in [header, *lines]) for i in range(len(header))]
    return "\n".join(
        "  ".join(cell.ljust(w) if i == 0 else cell.rjust(w) for i, (cell, w) in enumerate(zip(row, widths)))
        for row in [header, *lines]
    )


# ---------------------------------------------------------------- entry points

def _under_spark_submit() -> bool:
    """True when this Python process was started by spark-submit (or the
    pyspark shell): a JVM with its configured session is already waiting."""
    return "PYSPARK_GATEWAY_PORT" in os.environ


@contextlib.contextmanager
def _ctrl_c_held() -> Iterator[None]:
    """Ctrl-C (SIGINT) waits until the block ends: a session whose start is
    interrupted leaves its JVM running, orphaned, printing a Java stack
    trace; once started, it is stopped on the way out."""
    previous = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, previous)


def _local_session(master: str) -> SparkSession:
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    log_config = os.path.join(os.path.dirname(os.path.abspath(__file__)), "log4j2.properties")
    spark = (
        SparkSession.builder.master(master)
        .appName("kickmsg-analysis")
        .config("spark.driver.extraJavaOptions", f"-Dlog4j2.configurationFile={log_config}")
        .config("spark.pyspark.python", sys.executable)
        .config("spark.pyspark.driver.python", sys.executable)
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.sql.shuffle.partitions", str(2 * (os.cpu_count() or 1)))   # not 200 on one host
        .getOrCreate()
    )
    spark.sparkContext.setLogLevel("ERROR")
    return spark


def run(
    paths: str | Sequence[str], master: str | None = "local[*]", json_path: str | None = None,
    html_path: str | None = None, spark: SparkSession | None = None,
) -> dict[str, Figures]:
    """Analyse ``paths``, write the JSON and HTML reports if asked, and
    return the result. Without ``spark``: the session of spark-submit when
    run by it, else a local session on ``master`` (stopped at the end if
    this call started it)."""
    started_here = spark is None and SparkSession.getActiveSession() is None
    try:
        if spark is None:
            with _ctrl_c_held():
                spark = SparkSession.builder.getOrCreate() if _under_spark_submit() else _local_session(master or "local[*]")
        result = analyze(spark, paths)
    finally:
        if started_here and spark is not None:
            spark.stop()
    if json_path:
        with open(json_path, "w", encoding="utf-8") as out:
            json.dump(result, out, indent=2, allow_nan=False)  # strict JSON, as kickmsg.jsontext (not imported: this module stands alone)
    if html_path:
        write_html(result, html_path)
    return result


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="analysis.py", description="Rates, gaps, losses, sizes and latency of Kickmsg recordings."
    )
    parser.add_argument("paths", nargs="+", help="Parquet directories, files or globs")
    parser.add_argument("--master", default=None,
                        help="Spark master in local use (default local[*]; under spark-submit, its --master)")
    parser.add_argument("--json", dest="json_path", help="write the result as JSON")
    parser.add_argument("--html", dest="html_path", help="write an HTML report with plots")
    args = parser.parse_args(argv)
    result = run(args.paths, master=args.master, json_path=args.json_path, html_path=args.html_path)
    print(format_table(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
