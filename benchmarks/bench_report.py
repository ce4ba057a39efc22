"""Text report of bench_core.py: the summary table of each layout (also as
markdown for the README), the detailed tables, layout 9 against layout 4,
issue 37's targets met or missed on both layouts, and the scaling tables in
markdown. Pure formatting of the results dictionary; nothing is measured
here.

A peer's entry in a result table is its measurement, ``{"error": ...}`` when
it failed (shown "failed"), or absent when not run (shown "n/a")."""
import operator
from collections.abc import Callable, Sequence
from typing import Any

PEERS = ("ours", "ours9", "native", "native9", "mp_pipe", "mp_queue", "zmq", "faster_fifo", "iceoryx2", "zenoh")
KICKMSG_PEERS = ("ours", "native", "ours9", "native9")
PYTHON_PEERS = ("mp_pipe", "mp_queue", "zmq", "faster_fifo", "iceoryx2", "zenoh")  # all but the kickmsg ones
# Each layout's (ours, native) pair: ours on that layout's channels, the native version that speaks it.
LAYOUTS = {4: ("ours", "native"), 9: ("ours9", "native9")}


def layout_peers(peers: Sequence[str], layout: int) -> list[str]:
    """The peers of one layout's summary: that layout's ours and native,
    then every other peer of ``peers`` but the other layout's kickmsg ones."""
    pair = LAYOUTS[layout]
    return [peer for peer in pair if peer in peers] + [peer for peer in peers if peer not in KICKMSG_PEERS]
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


LATENCY_MODES = (
    ("block", "blocking receive"),
    ("pinned", "blocking receive, publisher and subscriber pinned to cores 0 and 1"),
    ("spin", "spinning receive (non-blocking receive in a loop)"),
)


def latency_tables(results: dict) -> None:
    for mode, title in LATENCY_MODES:
        keys = [key for key in results if key.endswith("_" + mode)]
        if not keys:
            continue
        header = ["peer"]
        for key in keys:
            header += [f"{size_label(key.split('_')[0])} median", "p99", "vs ours", "waited", "send"]
        rows = peer_rows(results, keys, lambda measured, ours: [
            format_us(measured["median_us"]),
            format_us(measured["p99_us"]),
            format_ratio(ratio(measured["median_us"], ours and ours["median_us"])),
            f"{measured['waited_fraction']:.0%}",
            format_us(measured["send_median_us"]) if "send_median_us" in measured else "-",
        ], 5)
        print_table(
            f"3. Cross-process one-way latency, one message per ms, {title} (lower is better)",
            "   Median and p99 of each repeat, medians over repeats. vs ours = peer / ours.\n"
            "   waited: messages stamped after the subscriber had started waiting for them.\n"
            "   send: the median time of the publisher's send call (the cold send, after an idle millisecond).",
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
        header += [f"{size_label(size)} median", "p99", "max", "vs ours", "CPU ping / pong", "CPU per trip"]
    rows = peer_rows(results, list(results), lambda measured, ours: [
        format_us(measured["median_us"]),
        format_us(measured["p99_us"]),
        format_us(measured["max_us"]),
        format_ratio(ratio(measured["median_us"], ours and ours["median_us"])),
        f"{measured['ping_cpu_fraction']:.0%} / {measured['pong_cpu_fraction']:.0%}" if "ping_cpu_fraction" in measured else "-",
        format_us(measured["cpu_us_per_trip"]) if "cpu_us_per_trip" in measured else "-",
    ], 6)
    print_table(
        "2. Cross-process ping-pong: one-way latency with a blocking receive, processes pinned to cores 0 and 1"
        " (lower is better)",
        "   Half of each round trip (send, the other side's blocking receive and send back, our blocking receive).\n"
        "   vs ours = peer / ours. CPU: each side's CPU time / wall time while the trips ran (near 100 %: its\n"
        "   receive spins rather than sleeps); CPU per trip: both sides' CPU time per round trip.",
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


def scaling_cell(scaling: dict, peer: str, rings, size) -> dict | None:
    return usable((scaling.get(peer) or {}).get(str(rings), {}).get(str(size)))


def scaling_markdown(scaling: dict, settings: dict, layout: int = 4) -> str:
    """One layout's scaling, ours / native (ratio), as markdown."""
    mine, native_peer = LAYOUTS[layout]
    sizes, rings_list = settings["sizes"], settings["rings"]
    lines = [
        "| subscriber rings | " + " | ".join(size_label(size) for size in sizes) + " |",
        "|---|" + "---|" * len(sizes),
    ]
    for rings in rings_list:
        cells = []
        for size in sizes:
            ours, native = scaling_cell(scaling, mine, rings, size), scaling_cell(scaling, native_peer, rings, size)
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
        for index, peer in enumerate(peer for peer in KICKMSG_PEERS if peer in scaling):
            row = [str(rings) if index == 0 else "", peer]
            for size in settings["sizes"]:
                measured = scaling_cell(scaling, peer, rings, size)
                row.append(f"{format_ns(measured['median_ns'])} ({format_ns(measured['p99_ns'])})" if measured else "-")
            rows.append(row)
    print_table(
        "8. Publish scaling: one send to every subscriber ring (time per send; rings full, nobody reading)",
        "   Median over repeats of the mean; p99 of 8-send batches.",
        header,
        rows,
    )


# -- summary ------------------------------------------------------------------------------

# (label, table, key, field, format, lower is better)
SUMMARY_ROWS = (
    ("in-process send + receive, 64 B", "inproc", "64", "median_ns", format_ns, True),
    ("in-process send + receive, 4 KB", "inproc", "4096", "median_ns", format_ns, True),
    ("one-way latency 64 B, blocking receive, ping-pong pinned", "pingpong", "64", "median_us", format_us, True),
    ("ping-pong, CPU time per round trip (both processes)", "pingpong", "64", "cpu_us_per_trip", format_us, True),
    ("one-way latency 64 B, blocking receive, one message per ms", "latency", "64_block", "median_us", format_us, True),
    ("the same, publisher and subscriber pinned to cores 0 and 1", "latency", "64_pinned", "median_us", format_us, True),
    ("the cold send: the send call, one message per ms", "latency", "64_block", "send_median_us", format_us, True),
    ("streaming 4 KB, 1 subscriber process, msgs/s", "throughput", "1", "median_msgs_s", format_rate, False),
    ("fan-out 64 B to 4 subscriber processes, msgs/s received", "fanout", "4", "median_msgs_s", format_rate, False),
    ("1 MB frames/s", "frames", str(1 << 20), "median_fps", lambda value: f"{value:,.0f}", False),
    ("8 MB frames/s", "frames", str(8 << 20), "median_fps", lambda value: f"{value:,.0f}", False),
    ("8 MB frames/s, first pass", "frames", str(8 << 20), "first_pass_fps", lambda value: f"{value:,.0f}", False),
)


def summary_cell(results: dict, table: str, key: str, field: str, peer: str, show: Callable[[float], str],
                 reference: str = "ours") -> str:
    """``value (ratio to the reference peer)``, with the share lost where a
    peer lost messages; "failed" or "n/a"."""
    entries = results.get(table, {}).get(key, {})
    entry = entries.get(peer)
    if usable(entry) is None:
        return "failed" if entry else "n/a"
    value = entry.get(field)
    if value is None:
        return "n/a"
    lost = entry.get("loss_fraction") or 0.0
    shown = show(value) + (f", {format_fraction(lost)} lost" if lost >= 0.0005 else "")
    mine = (usable(entries.get(reference)) or {}).get(field)
    return shown if peer == reference or not mine else f"{shown} ({format_ratio(value / mine)})"


def summary_rows(results: dict, peers: Sequence[str]) -> list[list[str]]:
    """One row per benchmark; ratios to the first of ``peers``."""
    return [
        [label] + [summary_cell(results, table, key, field, peer, show, peers[0]) for peer in peers]
        for label, table, key, field, show, _ in SUMMARY_ROWS
        if key in results.get(table, {})
    ]


def summary_markdown(results: dict, peers: Sequence[str] = PEERS) -> str:
    """The summary table as markdown, for the README; ratios to the first of ``peers``."""
    if not peers:
        return "(no peer of this layout in this run)"
    lines = [f"| median (× {peers[0]}) | " + " | ".join(peers) + " |", "|---|" + "---|" * len(peers)]
    lines += ["| " + " | ".join(row) + " |" for row in summary_rows(results, peers)]
    return "\n".join(lines)


# -- layout 9 against layout 4 --------------------------------------------------------------


def cost_ratio(results: dict, table: str, key: str, field: str, lower_is_better: bool, nine: str, four: str):
    """Layout 9's cost as a ratio to layout 4's in one summary row (time 9 /
    time 4, or rate 4 / rate 9): above 1, layout 9 costs more."""
    on_9, on_4 = _get(results, table, key, nine, field), _get(results, table, key, four, field)
    return ratio(on_9, on_4) if lower_is_better else ratio(on_4, on_9)


def layouts_rows(results: dict) -> list[list[str]]:
    """Per summary row: ours on layout 9 against ours on layout 4, and the
    same for the two native versions (layout 9's cost / layout 4's)."""
    return [
        [label] + [format_ratio(cost_ratio(results, table, key, field, lower, nine, four))
                   for four, nine in (("ours", "ours9"), ("native", "native9"))]
        for label, table, key, field, _, lower in SUMMARY_ROWS
        if key in results.get(table, {})
    ]


LAYOUTS_HEADER = ["ours: layout 9 / layout 4", "native: 0.9.2 / 0.1.0"]


def layouts_markdown(results: dict) -> str:
    lines = ["| cost, layout 9 / layout 4 | " + " | ".join(LAYOUTS_HEADER) + " |", "|---|" + "---|" * len(LAYOUTS_HEADER)]
    lines += ["| " + " | ".join(row) + " |" for row in layouts_rows(results)]
    return "\n".join(lines)


def layouts_table(results: dict) -> None:
    print_table(
        "9. Layout 9 against layout 4: the cost of each summary row on layout 9 as a ratio to layout 4's",
        "   Times: layout 9's / layout 4's; rates: layout 4's / layout 9's (above 1: layout 9 costs more).",
        ["benchmark"] + LAYOUTS_HEADER,
        layouts_rows(results),
    )


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


def judged(target: str, layout: str, value: float | None, comparison: str, threshold: float, **details: Any) -> dict:
    met = None if value is None else COMPARISONS[comparison](value, threshold)
    return {
        "target": target, "layout": layout, "value": value, "comparison": comparison, "threshold": threshold,
        "met": met, "by": shortfall(value, comparison, threshold) if met is False else "", **details,
    }


def peers_measured(results: dict) -> set[str]:
    """Every peer with a cell (measured or failed) in the results."""
    return {peer for table in results.values() if isinstance(table, dict) for row in table.values()
            if isinstance(row, dict) for peer in row}


def targets(results: dict) -> list[dict]:
    """Issue 37's targets on each layout (ours on that layout against the
    other peer; in-process and frames also against the native version that
    speaks the layout; publishing to idle rings per ring), then layout 9
    against layout 4 in every summary row; each judged on a ratio of medians
    from this run. A target against a peer this run did not measure is left
    out."""
    found = []
    measured = peers_measured(results)
    for layout, (mine, native) in LAYOUTS.items():
        if mine not in measured:
            continue

        def add(target: str, table: str, key: str, field: str, peer: str, comparison: str, threshold: float) -> None:
            if peer not in measured:
                return
            ours, other = _get(results, table, key, mine, field), _get(results, table, key, peer, field)
            found.append(judged(
                target, str(layout), ratio(ours, other), comparison, threshold, peer=peer, ours=ours, other=other,
                field=field, lost=_get(results, table, key, mine, "loss_fraction"),
                other_lost=_get(results, table, key, peer, "loss_fraction"),
            ))

        add("in-process 64 B send + receive: within 1.5x mp.Pipe's (ours/Pipe <= 1.5)",
            "inproc", "64", "median_ns", "mp_pipe", "<=", 1.5)
        add(f"in-process 64 B send + receive: within 15x {native} (ours/{native} <= 15)",
            "inproc", "64", "median_ns", native, "<=", 15.0)
        add("streaming 4 KB: at least 0.8x mp.Pipe's msgs/s received (ours/Pipe >= 0.8)",
            "throughput", "1", "median_msgs_s", "mp_pipe", ">=", 0.8)
        add("fan-out 64 B to 4 processes: at least 0.8x mp.Pipe's msgs/s received (ours/Pipe >= 0.8)",
            "fanout", "4", "median_msgs_s", "mp_pipe", ">=", 0.8)
        add("one message per ms, receiver parked: within 1.3x mp.Pipe's latency (ours/Pipe <= 1.3)",
            "latency", "64_block", "median_us", "mp_pipe", "<=", 1.3)
        add("the same, pinned to cores 0 and 1: within 1.3x mp.Pipe's latency (ours/Pipe <= 1.3)",
            "latency", "64_pinned", "median_us", "mp_pipe", "<=", 1.3)
        for peer in PYTHON_PEERS:
            add(f"ping-pong one-way 64 B: ahead of {peer} (ours/{peer} < 1)",
                "pingpong", "64", "median_us", peer, "<", 1.0)
        add(f"8 MB frames >= 0.9x {native} (frames/s ours/{native} >= 0.9)",
            "frames", str(8 << 20), "median_fps", native, ">=", 0.9)
        add(f"8 MB frames, first pass, >= 0.9x {native} (frames/s ours/{native} >= 0.9)",
            "frames", str(8 << 20), "first_pass_fps", native, ">=", 0.9)
        for rings, by_size in sorted((results.get("scaling", {}).get(mine) or {}).items(), key=lambda item: int(item[0])):
            send = usable(by_size.get("64"))
            per_ring_us = None if send is None else send["median_ns"] / int(rings) / 1000
            found.append(judged(f"publishing 64 B to {rings} idle rings: at most 1 us per ring (us per ring <= 1)",
                                str(layout), per_ring_us, "<=", 1.0, peer="-", field="median_ns"))
    for label, table, key, field, _, lower in SUMMARY_ROWS:
        if key in results.get(table, {}) and {"ours", "ours9"} <= measured:
            found.append(judged(
                f"layout 9 within 1.2x of layout 4: {label} (cost 9/4 <= 1.2)", "9/4",
                cost_ratio(results, table, key, field, lower, "ours9", "ours"), "<=", 1.2, peer="ours", field=field,
            ))
    return found


def print_targets(found: list[dict], build: str = "compiled") -> None:
    rows = []
    for target in found:
        verdict = {True: "MET", False: f"MISSED ({target['by']})", None: "NO DATA"}[target["met"]]
        losses = [f"{who} lost {format_fraction(max(0.0, lost))}"
                  for who, lost in (("ours", target.get("lost")), (target["peer"], target.get("other_lost")))
                  if lost is not None]
        rows.append([target["target"], target["layout"], format_ratio(target["value"]), verdict, ", ".join(losses)])
    print_table(f"Targets (issue 37), ratios of medians from this run; ours: the {build} build", "",
                ["target", "layout", "ratio", "verdict", "losses"], rows)


def print_report(report: dict) -> None:
    print(machine_line(report["machine"]))
    busy = report["cpu_busy_before"]
    if busy is not None:
        warning = "  (WARNING: other work is running, results will be noisy)" if busy > 0.15 else ""
        after = report.get("cpu_busy_after")
        after_text = f", {after:.0%} right after" if after is not None else ""
        print(f"Load:    CPUs {busy:.0%} busy just before the run{after_text}; load average {report['load_average']}{warning}")
    print(f"Run:     {report['mode']} mode, {report.get('build', 'compiled')} build, started {report['date']}, "
          f"{report['duration_s']} s")
    print()
    results = report["results"]
    peers = report.get("peers", PEERS)
    for layout in LAYOUTS:
        shown = layout_peers(peers, layout)
        if not shown:
            continue
        print_table(f"Summary, layout {layout}: medians; (x {shown[0]}) = peer's figure / {shown[0]}", "",
                    ["benchmark"] + shown, summary_rows(results, shown))
    inproc_table(results["inproc"])
    pingpong_table(results["pingpong"])
    latency_tables(results["latency"])
    fanout_table(results["throughput"], f"Streaming throughput, {size_label(report['settings']['throughput']['size'])}", 4)
    fanout_table(results["fanout"], f"Fan-out throughput, {size_label(report['settings']['fanout']['size'])}", 5)
    frames_table(results["frames"])
    rss_table(results["rss"])
    scaling_table(results["scaling"], report["settings"]["scaling"])
    layouts_table(results)
    for layout in LAYOUTS:
        print(f"Scaling for the README, layout {layout} (median time per send, ours / native (ratio)):")
        print()
        print(report["scaling_markdown"][str(layout)])
        print()
    print("Layout 9 against layout 4 for the README:")
    print()
    print(report["layouts_markdown"])
    print()
    for layout in LAYOUTS:
        print(f"Summary for the README, layout {layout}:")
        print()
        print(report["summary_markdown"][str(layout)])
        print()
    print_targets(report["targets"], report.get("build", "compiled"))
    for error in report["errors"]:
        print(f"ERROR {error}")
