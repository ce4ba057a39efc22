"""Text report of bench_core.py: tables, the issue-8 targets and the scaling
table in markdown. Pure formatting of the results dictionary; nothing is
measured here."""
import operator

PEERS = ("ours", "native", "mp_pipe", "mp_queue", "zmq")
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
        f"pyzmq {versions.get('pyzmq')} (libzmq {versions.get('libzmq')})"
    )


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
    cells) for each of ``keys`` of ``results``, or "failed"."""
    rows = []
    for peer in PEERS:
        row = [peer]
        for key in keys:
            measured, ours = results[key].get(peer), results[key].get("ours")
            row += ["failed"] + [""] * (width - 1) if measured is None else cells(measured, ours)
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
            f"2{'ab'[mode == 'spin']}. Cross-process one-way latency, {title} (lower is better)",
            "   One message per ms; median and p99 of each repeat, medians over repeats. vs ours = peer / ours.\n"
            "   waited: messages stamped after the subscriber had started waiting for them.",
            header,
            rows,
        )
        for peer in PEERS:
            for key in keys:
                measured = results[key].get(peer)
                if measured and (measured["lost_by_sequence"] or measured["timeouts"] or measured["wrong_size"]):
                    print(
                        f"   note: {peer} {key}: lost {measured['lost_by_sequence']}, timeouts {measured['timeouts']}, "
                        f"wrong size {measured['wrong_size']}"
                    )


def fanout_table(results: dict) -> None:
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
        "3. Fan-out throughput, 64 B, one publisher process to N subscriber processes (higher is better)",
        "   msgs/s: messages received per second, summed over the subscribers (median over rounds; worst round).\n"
        "   lost: share of the sent messages a subscriber missed (kickmsg rings and 0MQ PUB drop; pipe and queue\n"
        "   block the publisher). sent/s: the publisher's rate. vs ours = peer msgs/s / ours.",
        header,
        rows,
    )


def frames_table(results: dict) -> None:
    header = ["peer"]
    for size in results:
        header += [f"{size_label(size)}: frames/s", "GB/s", "p99 gap", "vs ours", "lost"]
    rows = peer_rows(results, list(results), lambda measured, ours: [
        f"{measured['median_fps']:,.0f}",
        f"{measured['gb_s']:.2f}",
        f"{measured['p99_interval_ms']:.2f} ms",
        format_ratio(ratio(measured["median_fps"], ours and ours["median_fps"])),
        format_fraction(max(0.0, measured["loss_fraction"])),
    ], 5)
    print_table(
        "4. Large frames, one publisher process to one subscriber process, received as numpy arrays (higher is better)",
        "   Each frame copied from a prepared image into the buffer sent (kickmsg: the slot, published in place);\n"
        "   kickmsg subscribers get a view over the slot. Median over rounds; p99 gap: p99 of the time between\n"
        "   received frames. vs ours = peer frames/s / ours.",
        header,
        rows,
    )


def rss_table(results: dict) -> None:
    rows = []
    for peer, measured in results.items():
        if measured is None:
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
        "5. Resident memory added in a fresh process (VmRSS)",
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
        "6. Publish scaling: one send to every subscriber ring (time per send; rings full, nobody reading)",
        "   Median over repeats of the mean; p99 of 8-send batches.",
        header,
        rows,
    )


# -- targets ------------------------------------------------------------------------------


COMPARISONS = {"<": operator.lt, "<=": operator.le, ">=": operator.ge}


def _get(results: dict, *path):
    for key in path:
        if results is None:
            return None
        results = results.get(key)
    return results


def targets(results: dict) -> list[dict]:
    """The issue-8 targets, each with the ratio it is judged on."""
    found = []

    def add(target: str, value, comparison: str, threshold: float, detail: str, unit: str = "ratio"):
        met = None if value is None else COMPARISONS[comparison](value, threshold)
        found.append({"target": target, "value": value, "threshold": threshold, "met": met, "detail": detail,
                      "unit": unit})

    ours = _get(results, "inproc", "64", "ours", "median_ns")
    native = _get(results, "inproc", "64", "native", "median_ns")
    add(
        "in-process 64 B send+try_receive within 10x of native (time ours/native <= 10)",
        ratio(ours, native), "<=", 10.0,
        f"ours {format_ns(ours)}, native {format_ns(native)}" if ours and native else "",
    )
    latency = _get(results, "latency", "64_block") or {}
    ours = _get(latency, "ours", "median_us")
    for peer, comparison, threshold, wording in (
        ("native", "<=", 1.5, "within 1.5x of native (median ours/native <= 1.5)"),
        ("mp_pipe", "<", 1.0, "below multiprocessing.Pipe (median ours/Pipe < 1)"),
        ("mp_queue", "<", 1.0, "below multiprocessing.Queue (median ours/Queue < 1)"),
        ("zmq", "<", 1.0, "below pyzmq (median ours/zmq < 1)"),
    ):
        other = _get(latency, peer, "median_us")
        add(
            f"cross-process blocking 64 B one-way latency {wording}",
            ratio(ours, other), comparison, threshold,
            f"ours {format_us(ours)}, {peer} {format_us(other)}" if ours and other else "",
        )
    frames = _get(results, "frames", str(8 << 20)) or {}
    ours = _get(frames, "ours", "median_fps")
    for peer, threshold, wording in (
        ("native", 0.8, ">= 0.8x native throughput (frames/s ours/native >= 0.8)"),
        ("mp_pipe", 5.0, ">= 5x multiprocessing.Pipe (frames/s ours/Pipe >= 5)"),
    ):
        other = _get(frames, peer, "median_fps")
        add(
            f"8 MB zero-copy frames {wording}",
            ratio(ours, other), ">=", threshold,
            f"ours {ours:,.0f}/s, {peer} {other:,.0f}/s" if ours and other else "",
        )
    rss = _get(results, "rss", "ours", "total_mb")
    native_rss = _get(results, "rss", "native", "total_mb")
    add(
        "import kickmsg + open a channel adds < 15 MB resident memory (ours, MB)",
        rss, "<", 15.0,
        f"ours {rss:.1f} MB, native {native_rss:.1f} MB" if rss is not None and native_rss is not None else "",
        unit="MB",
    )
    return found


def print_targets(found: list[dict]) -> None:
    rows = []
    for target in found:
        value = target["value"]
        shown = "-" if value is None else (f"{value:.1f} MB" if target["unit"] == "MB" else format_ratio(value))
        verdict = {True: "MET", False: "MISSED", None: "NO DATA"}[target["met"]]
        rows.append([target["target"], shown, verdict, target["detail"]])
    print_table("Targets (issue 8), from this run", "", ["target", "value", "verdict", "measured"], rows)


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
    inproc_table(results["inproc"])
    latency_tables(results["latency"])
    fanout_table(results["fanout"])
    frames_table(results["frames"])
    rss_table(results["rss"])
    scaling_table(results["scaling"], report["settings"]["scaling"])
    print("Scaling for the README (median time per send, ours / native (ratio)):")
    print()
    print(report["scaling_markdown"])
    print()
    print_targets(report["targets"])
    for error in report["errors"]:
        print(f"ERROR {error}")
