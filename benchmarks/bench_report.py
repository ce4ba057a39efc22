"""Text report of bench_core.py: the summary table (also as markdown for the
README), the detailed tables, issue 17's targets met or missed, and the
scaling table in markdown. Pure formatting of the results dictionary;
nothing is measured here.

A peer's entry in a result table is its measurement, ``{"error": ...}`` when
it failed (shown "failed"), or absent when not run (shown "n/a")."""
import operator
from collections.abc import Callable, Sequence
from typing import Any

PEERS = ("ours", "native", "mp_pipe", "mp_queue", "zmq", "faster_fifo", "iceoryx2", "zenoh")
PYTHON_PEERS = ("mp_pipe", "mp_queue", "zmq", "faster_fifo", "iceoryx2", "zenoh")  # all but the two kickmsg
SIZE_LABELS = {64: "64 B", 1024: "1 KB", 4096: "4 KB", 16384: "16 KB", 65536: "64 KB", 262144: "256 KB",
               1 << 20: "1 MB", 8 << 20: "8 MB"}


def size_label(size) -> str:
    return SIZE_LABELS.get(int(size), f"{int(size)} B")


def format_ns(ns: float) -> str:
    if ns != ns:  # nan
        return "-"
    if ns < 1_000:
        return f"{ns:.0f} ns"
    if ns < 100_000:
        return f"{ns / 1e3:.2f} µs"
    if ns < 1_000_000:
        return f"{ns / 1e3:.0f} µs"
    return f"{ns / 1e6:.2f} ms"


def format_us(us: float) -> str:
    return format_ns(us * 1000)


def format_rate(per_s: float) -> str:
    if per_s >= 1e6:
        return f"{per_s / 1e6:.2f} M/s"
    if per_s >= 1e3:
        return f"{per_s / 1e3:.1f} k/s"
    return f"{per_s:.1f} /s"


def format_ratio(ratio: float | None) -> str:
    if ratio is None:
        return "-"
    return f"{ratio:.3g}x" if ratio < 1000 else f"{ratio:.0f}x"


def format_fraction(fraction: float) -> str:
    return "0" if fraction == 0 else f"{fraction:.1%}"


def ratio(value, reference):
    return value / reference if value is not None and reference else None


def machine_line(machine: dict) -> str:
    versions = machine.get("versions", {})
    return (
        f"Machine: {machine['cpu']}, {machine['cores']} cores ({machine['cores_usable']} usable), "
        f"{machine['machine']}; {machine['python']}; {machine['kernel']}; numpy {versions.get('numpy')}, "
        f"pyzmq {versions.get('pyzmq')} (libzmq {versions.get('libzmq')}), faster-fifo {versions.get('faster-fifo')}, "
        f"iceoryx2 {versions.get('iceoryx2')}, eclipse-zenoh {versions.get('eclipse-zenoh')}"
    )


def usable(entry: dict | None) -> dict | None:
    """The measurement of a table entry, or None when it failed or was not run."""
    return None if entry is None or "error" in entry else entry


def print_table(title: str, note: str, header: list[str], rows: list[list[str]]) -> None:
    print(title)
    if note:
        print(note)
    widths = [max(len(row[i]) for row in [header] + rows) for i in range(len(header))]

    def line(cells):
        return "  ".join([cells[0].ljust(widths[0])] + [cell.rjust(width) for cell, width in zip(cells[1:], widths[1:])])

    print(line(header))
    print("  ".join("-" * width for width in widths))
    for row in rows:
        print(line(row))
    print()


# -- the tables ------------------------------------------------------------------------


def peer_rows(results: dict, keys: list, cells, width: int) -> list[list[str]]:
    """One row per peer: its name, then ``cells(measured, ours)`` (``width``
    cells) for each of ``keys`` of ``results``, or "failed" / "n/a"."""
    rows = []
    for peer in PEERS:
        row = [peer]
        for key in keys:
            entry, ours = results[key].get(peer), usable(results[key].get("ours"))
            if usable(entry) is None:
                row += ["failed" if entry else "n/a"] + [""] * (width - 1)
            else:
                row += cells(entry, ours)
        rows.append(row)
    return rows


def inproc_table(results: dict) -> None:
    sizes = list(results)
    header = ["peer"]
    for size in sizes:
        label = size_label(size)
        header += [f"{label} median", "p99", "vs ours"]
    rows = peer_rows(results, sizes, lambda measured, ours: [
        format_ns(measured["median_ns"]),
        format_ns(measured["p99_ns"]),
        format_ratio(ratio(measured["median_ns"], ours and ours["median_ns"])),
    ], 3)
    print_table(
        "1. In-process send + receive, one process (time per message; lower is better)",
        "   kickmsg: send + try_receive; others: send + their blocking receive. Median over repeats of the mean;\n"
        "   p99 of 16-message batches. vs ours = peer time / our time.",
        header,
        rows,
    )


def latency_tables(results: dict) -> None:
    for mode, title in (("block", "blocking receive"), ("spin", "spinning receive (non-blocking receive in a loop)")):
        keys = [key for key in results if key.endswith("_" + mode)]
        if not keys:
            continue
        header = ["peer"]
        for key in keys:
            header += [f"{size_label(key.split('_')[0])} median", "p99", "vs ours", "waited"]
        rows = peer_rows(results, keys, lambda measured, ours: [
            format_us(measured["median_us"]),
            format_us(measured["p99_us"]),
            format_ratio(ratio(measured["median_us"], ours and ours["median_us"])),
            f"{measured['waited_fraction']:.0%}",
        ], 4)
        print_table(
            f"3. Cross-process one-way latency, one message per ms, {title} (lower is better)",
            "   Median and p99 of each repeat, medians over repeats. vs ours = peer / ours.\n"
            "   waited: messages stamped after the subscriber had started waiting for them.",
            header,
            rows,
        )
        for peer in PEERS:
            for key in keys:
                measured = usable(results[key].get(peer))
                if measured and (measured["lost_by_sequence"] or measured["timeouts"] or measured["wrong_size"]):
                    print(
                        f"   note: {peer} {key}: lost {measured['lost_by_sequence']}, timeouts {measured['timeouts']}, "
                        f"wrong size {measured['wrong_size']}"
                    )


def pingpong_table(results: dict) -> None:
    header = ["peer"]
    for size in results:
        header += [f"{size_label(size)} median", "p99", "max", "vs ours"]
    rows = peer_rows(results, list(results), lambda measured, ours: [
        format_us(measured["median_us"]),
        format_us(measured["p99_us"]),
        format_us(measured["max_us"]),
        format_ratio(ratio(measured["median_us"], ours and ours["median_us"])),
    ], 4)
    print_table(
        "2. Cross-process ping-pong: one-way latency with a blocking receive, processes pinned to cores 0 and 1"
        " (lower is better)",
        "   Half of each round trip (send, the other side's blocking receive and send back, our blocking receive).\n"
        "   vs ours = peer / ours.",
        header,
        rows,
    )


def fanout_table(results: dict, title: str, number: int) -> None:
    header = ["peer"]
    for subscribers in results:
        label = f"{subscribers} sub" + ("s" if int(subscribers) > 1 else "")
        header += [f"{label}: msgs/s", "worst", "vs ours", "lost", "sent/s"]
    rows = peer_rows(results, list(results), lambda measured, ours: [
        format_rate(measured["median_msgs_s"]),
        format_rate(measured["worst_msgs_s"]),
        format_ratio(ratio(measured["median_msgs_s"], ours and ours["median_msgs_s"])),
        format_fraction(max(0.0, measured["loss_fraction"])),
        format_rate(measured["published_msgs_s"]),
    ], 5)
    print_table(
        f"{number}. {title}, one publisher process to N subscriber processes (higher is better)",
        "   msgs/s: messages received per second, summed over the subscribers (median over rounds; worst round).\n"
        "   lost: share of the sent messages a subscriber missed (kickmsg rings and 0MQ PUB drop; pipe and queue\n"
        "   block the publisher). sent/s: the publisher's rate. vs ours = peer msgs/s / ours.",
        header,
        rows,
    )


def frames_table(results: dict) -> None:
    header = ["peer"]
    for size in results:
        header += [f"{size_label(size)}: frames/s", "first pass", "GB/s", "p99 gap", "vs ours", "lost"]
    rows = peer_rows(results, list(results), lambda measured, ours: [
        f"{measured['median_fps']:,.0f}",
        "n/a" if measured.get("first_pass_fps") is None else f"{measured['first_pass_fps']:,.0f}",
        f"{measured['gb_s']:.2f}",
        f"{measured['p99_interval_ms']:.2f} ms",
        format_ratio(ratio(measured["median_fps"], ours and ours["median_fps"])),
        format_fraction(max(0.0, measured["loss_fraction"])),
    ], 6)
    print_table(
        "6. Large frames, one publisher process to one subscriber process, received as numpy arrays (higher is better)",
        "   Each frame copied from a prepared image into the buffer sent (kickmsg: the slot, published in place);\n"
        "   kickmsg subscribers get a view over the slot. Median over rounds; p99 gap: p99 of the time between\n"
        "   received frames. first pass: frames/s until the subscriber has 8 frames, on a fresh channel (the\n"
        "   pool's first pass). vs ours = peer frames/s / ours.",
        header,
        rows,
    )


def rss_table(results: dict) -> None:
    rows = []
    for peer, measured in results.items():
        if usable(measured) is None:
            rows.append([peer, "failed", "", "", "", ""])
            continue
        parts = measured["parts_mb"]
        rows.append(
            [
                peer,
                f"{measured['import_mb']:.1f} MB",
                f"{measured['open_mb']:.1f} MB",
                f"{measured['total_mb']:.1f} MB",
                " / ".join(f"{parts.get(key, 0):.1f}" for key in ("RssAnon", "RssFile", "RssShmem")),
                "yes" if measured["numpy_imported"] else "no",
            ]
        )
    print_table(
        "7. Resident memory added in a fresh process (VmRSS)",
        "   open channel: create a default-config PubSub region, a Publisher and a Subscriber, one message.",
        ["peer", "import kickmsg", "open channel", "total", "anon / file / shmem MB", "numpy loaded"],
        rows,
    )


def scaling_cells(scaling: dict, rings, size) -> tuple:
    ours = (scaling.get("ours") or {}).get(str(rings), {}).get(str(size))
    native = (scaling.get("native") or {}).get(str(rings), {}).get(str(size))
    return ours, native


def scaling_markdown(scaling: dict, settings: dict) -> str:
    sizes, rings_list = settings["sizes"], settings["rings"]
    lines = [
        "| subscriber rings | " + " | ".join(size_label(size) for size in sizes) + " |",
        "|---|" + "---|" * len(sizes),
    ]
    for rings in rings_list:
        cells = []
        for size in sizes:
            ours, native = scaling_cells(scaling, rings, size)
            if ours is None or native is None:
                cells.append("-")
                continue
            cells.append(
                f"{format_ns(ours['median_ns'])} / {format_ns(native['median_ns'])} "
                f"({format_ratio(ours['median_ns'] / native['median_ns'])})"
            )
        lines.append(f"| {rings} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def scaling_table(scaling: dict, settings: dict) -> None:
    header = ["rings", "peer"] + [f"{size_label(size)} median (p99)" for size in settings["sizes"]]
    rows = []
    for rings in settings["rings"]:
        for index, peer in enumerate(("ours", "native")):
            row = [str(rings) if index == 0 else "", peer]
            for size in settings["sizes"]:
                measured = scaling_cells(scaling, rings, size)[index]
                row.append(f"{format_ns(measured['median_ns'])} ({format_ns(measured['p99_ns'])})" if measured else "-")
            rows.append(row)
    print_table(
        "8. Publish scaling: one send to every subscriber ring (time per send; rings full, nobody reading)",
        "   Median over repeats of the mean; p99 of 8-send batches.",
        header,
        rows,
    )


def layouts_cells(layouts: dict, size: str) -> list[str]:
    """Layout 4's and layout 9's medians and their ratio (9 / 4), then the
    ratio of their median batches; "failed" / "n/a" where one is missing."""
    both = layouts.get(size, {})
    four, nine = usable(both.get("4")), usable(both.get("9"))
    cells = [format_ns(measured["median_ns"]) if measured else ("failed" if both.get(key) else "n/a")
             for key, measured in (("4", four), ("9", nine))]
    return cells + [format_ratio(ratio(nine and nine.get(field), four and four.get(field)))
                    for field in ("median_ns", "median_batch_ns")]


LAYOUTS_HEADER = ["layout 4 median", "layout 9 median", "layout 9 / layout 4", "the same, median batches"]


def layouts_markdown(layouts: dict) -> str:
    lines = ["| ours, in-process send + receive | " + " | ".join(LAYOUTS_HEADER) + " |", "|---|" + "---|" * len(LAYOUTS_HEADER)]
    lines += [f"| {size_label(size)} | " + " | ".join(layouts_cells(layouts, size)) + " |" for size in layouts]
    return "\n".join(lines)


def layouts_table(layouts: dict) -> None:
    print_table(
        "9. Layout 9 against layout 4: ours, in-process send + receive (time per message; lower is better)",
        "   Scenario 1 on a layout-9 channel (KICKMSG_LAYOUT=9), run right after ours on layout 4 (scenario 1).\n"
        "   Median batches: the median 16-pair batch of each, which the machine's other work rarely reaches.",
        ["size"] + LAYOUTS_HEADER,
        [[size_label(size)] + layouts_cells(layouts, size) for size in layouts],
    )


# -- summary ------------------------------------------------------------------------------

# (label, table, key, field, format, lower is better)
SUMMARY_ROWS = (
    ("in-process send + receive, 64 B", "inproc", "64", "median_ns", format_ns, True),
    ("in-process send + receive, 4 KB", "inproc", "4096", "median_ns", format_ns, True),
    ("one-way latency 64 B, blocking receive, ping-pong pinned", "pingpong", "64", "median_us", format_us, True),
    ("one-way latency 64 B, blocking receive, one message per ms", "latency", "64_block", "median_us", format_us, True),
    ("streaming 4 KB, 1 subscriber process, msgs/s", "throughput", "1", "median_msgs_s", format_rate, False),
    ("fan-out 64 B to 4 subscriber processes, msgs/s received", "fanout", "4", "median_msgs_s", format_rate, False),
    ("1 MB frames/s", "frames", str(1 << 20), "median_fps", lambda value: f"{value:,.0f}", False),
    ("8 MB frames/s", "frames", str(8 << 20), "median_fps", lambda value: f"{value:,.0f}", False),
    ("8 MB frames/s, first pass", "frames", str(8 << 20), "first_pass_fps", lambda value: f"{value:,.0f}", False),
)


def summary_cell(results: dict, table: str, key: str, field: str, peer: str, show: Callable[[float], str]) -> str:
    """``value (ratio to ours)``, "failed" or "n/a"."""
    entries = results.get(table, {}).get(key, {})
    entry = entries.get(peer)
    if usable(entry) is None:
        return "failed" if entry else "n/a"
    value = entry.get(field)
    if value is None:
        return "n/a"
    ours = (usable(entries.get("ours")) or {}).get(field)
    return show(value) if peer == "ours" or not ours else f"{show(value)} ({format_ratio(value / ours)})"


def summary_rows(results: dict, peers: Sequence[str]) -> list[list[str]]:
    return [
        [label] + [summary_cell(results, table, key, field, peer, show) for peer in peers]
        for label, table, key, field, show, _ in SUMMARY_ROWS
        if key in results.get(table, {})
    ]


def summary_markdown(results: dict, peers: Sequence[str] = PEERS) -> str:
    """The summary table as markdown, for the README."""
    lines = ["| median (× ours) | " + " | ".join(peers) + " |", "|---|" + "---|" * len(peers)]
    lines += ["| " + " | ".join(row) + " |" for row in summary_rows(results, peers)]
    return "\n".join(lines)


# -- targets ------------------------------------------------------------------------------


COMPARISONS = {"<": operator.lt, "<=": operator.le, ">=": operator.ge, ">": operator.gt}


def _get(results: Any, *path: str) -> Any:
    for key in path:
        if not isinstance(results, dict) or "error" in results:
            return None
        results = results.get(key)
    return results


def shortfall(value: float, comparison: str, threshold: float) -> str:
    """How far a missed target is from its threshold, in words."""
    if comparison in ("<", "<="):
        return f"{value / threshold - 1:.0%} over"
    return f"{1 - value / threshold:.0%} short"


def targets(results: dict) -> list[dict]:
    """Issue 17's targets, each judged on a ratio of medians from this run
    (ours / the other peer)."""
    found = []

    def add(target: str, table: str, key: str, field: str, peer: str, comparison: str, threshold: float) -> None:
        ours, other = _get(results, table, key, "ours", field), _get(results, table, key, peer, field)
        value = ratio(ours, other)
        met = None if value is None else COMPARISONS[comparison](value, threshold)
        found.append({
            "target": target, "peer": peer, "value": value, "comparison": comparison, "threshold": threshold,
            "met": met, "by": shortfall(value, comparison, threshold) if met is False else "",
            "ours": ours, "other": other, "field": field,
        })

    add("in-process 64 B send+receive within 25x native (time ours/native <= 25)",
        "inproc", "64", "median_ns", "native", "<=", 25.0)
    add("blocking one-way 64 B latency below mp.Pipe (ping-pong, ours/Pipe < 1)",
        "pingpong", "64", "median_us", "mp_pipe", "<", 1.0)
    add("blocking one-way 64 B latency within 1.5x native (ping-pong, ours/native <= 1.5)",
        "pingpong", "64", "median_us", "native", "<=", 1.5)
    add("8 MB frames >= 0.9x native (frames/s ours/native >= 0.9)",
        "frames", str(8 << 20), "median_fps", "native", ">=", 0.9)
    add("8 MB frames, first pass, >= 0.9x native (frames/s ours/native >= 0.9)",
        "frames", str(8 << 20), "first_pass_fps", "native", ">=", 0.9)
    for peer in ("mp_queue", "zmq", "faster_fifo"):
        add(f"fan-out 64 B to 4 processes ahead of {peer} (msgs/s ours/{peer} > 1)",
            "fanout", "4", "median_msgs_s", peer, ">", 1.0)
    for peer in ("mp_queue", "zmq", "faster_fifo"):
        add(f"4 KB streaming throughput ahead of {peer} (msgs/s ours/{peer} > 1)",
            "throughput", "1", "median_msgs_s", peer, ">", 1.0)
    for peer in PYTHON_PEERS:
        add(f"cross-process 64 B latency ahead of {peer} (ping-pong, ours/{peer} < 1)",
            "pingpong", "64", "median_us", peer, "<", 1.0)
    return found


def print_targets(found: list[dict]) -> None:
    rows = []
    for target in found:
        verdict = {True: "MET", False: f"MISSED ({target['by']})", None: "NO DATA"}[target["met"]]
        rows.append([target["target"], format_ratio(target["value"]), verdict])
    print_table("Targets (issue 17), ratios of medians from this run", "", ["target", "ours / peer", "verdict"], rows)


def print_report(report: dict) -> None:
    print(machine_line(report["machine"]))
    busy = report["cpu_busy_before"]
    if busy is not None:
        warning = "  (WARNING: other work is running, results will be noisy)" if busy > 0.15 else ""
        after = report.get("cpu_busy_after")
        after_text = f", {after:.0%} right after" if after is not None else ""
        print(f"Load:    CPUs {busy:.0%} busy just before the run{after_text}; load average {report['load_average']}{warning}")
    print(f"Run:     {report['mode']} mode, started {report['date']}, {report['duration_s']} s")
    print()
    results = report["results"]
    peers = report.get("peers", PEERS)
    print_table("Summary: medians; (x ours) = peer's figure / ours", "", ["benchmark"] + list(peers),
                summary_rows(results, peers))
    inproc_table(results["inproc"])
    pingpong_table(results["pingpong"])
    latency_tables(results["latency"])
    fanout_table(results["throughput"], f"Streaming throughput, {size_label(report['settings']['throughput']['size'])}", 4)
    fanout_table(results["fanout"], f"Fan-out throughput, {size_label(report['settings']['fanout']['size'])}", 5)
    frames_table(results["frames"])
    rss_table(results["rss"])
    scaling_table(results["scaling"], report["settings"]["scaling"])
    layouts_table(results.get("layouts", {}))
    print("Scaling for the README (median time per send, ours / native (ratio)):")
    print()
    print(report["scaling_markdown"])
    print()
    if "layouts_markdown" in report:
        print("Layout 9 against layout 4 for the README:")
        print()
        print(report["layouts_markdown"])
        print()
    print("Summary for the README:")
    print()
    print(report["summary_markdown"])
    print()
    print_targets(report["targets"])
    for error in report["errors"]:
        print(f"ERROR {error}")
