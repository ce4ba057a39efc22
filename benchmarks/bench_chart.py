"""The PNG chart of bench_core.py (matplotlib, Agg backend): one panel per
benchmark, grouped bars per peer, log scales. Drawn from the results
dictionary only; nothing is measured here."""
import pathlib

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

from bench_report import KICKMSG_PEERS, PEERS, machine_line, size_label  # noqa: E402

COLORS = {
    "ours": "#d62728", "native": "#1f77b4", "ours9": "#ff9896", "native9": "#aec7e8", "mp_pipe": "#2ca02c",
    "mp_queue": "#9467bd", "zmq": "#ff7f0e",
    "faster_fifo": "#8c564b", "iceoryx2": "#17becf", "zenoh": "#e377c2",
}


def grouped_bars(axis, groups: list[str], values: dict, title: str, ylabel: str, whiskers: dict | None = None) -> None:
    """``values[peer][i]`` for group i (None: no bar); ``whiskers`` the same
    shape, drawn as a black tick above each bar (p99)."""
    width = 0.8 / len(PEERS)
    for index, peer in enumerate(PEERS):
        positions = [group + (index - (len(PEERS) - 1) / 2) * width for group in range(len(groups))]
        heights = [value if value else 0 for value in values[peer]]
        axis.bar(positions, heights, width, label=peer, color=COLORS[peer])
        if whiskers:
            points = [(x, y) for x, y in zip(positions, whiskers[peer]) if y]
            if points:
                axis.scatter(*zip(*points), marker="_", color="black", s=40, zorder=3)
    axis.set_xticks(range(len(groups)), groups)
    axis.set_yscale("log")
    axis.set_title(title, fontsize=10)
    axis.set_ylabel(ylabel)
    axis.grid(axis="y", which="both", alpha=0.3)


def pick(table: dict, keys: list, field: str, scale: float = 1.0) -> dict:
    """``values[peer][i]``: ``field`` of ``table[keys[i]][peer]`` times ``scale``,
    None when failed or not measured."""
    values: dict[str, list] = {}
    for peer in PEERS:
        values[peer] = []
        for key in keys:
            value = ((table.get(key) or {}).get(peer) or {}).get(field)
            values[peer].append(value * scale if value else None)
    return values


def merged(*parts: tuple) -> tuple[list[str], dict]:
    """Groups of several tables in one panel: ``parts`` are (label, table,
    key, field, scale); returns the labels and ``values[peer][i]``."""
    labels: list[str] = []
    values: dict[str, list] = {peer: [] for peer in PEERS}
    for label, table, key, field, scale in parts:
        labels.append(label)
        picked = pick(table, [key], field, scale)
        for peer in PEERS:
            values[peer] += picked[peer]
    return labels, values


def draw(report: dict, path: pathlib.Path) -> None:
    results = report["results"]
    figure, axes = plt.subplots(2, 3, figsize=(18, 10))
    figure.suptitle(f"kickmsg benchmarks ({report['mode']} run, {report['date']})\n{machine_line(report['machine'])}", fontsize=10)

    inproc = results["inproc"]
    keys = list(inproc)
    grouped_bars(
        axes[0][0], [size_label(key) for key in keys], pick(inproc, keys, "median_ns", 1e-3),
        "1. in-process send + receive (lower is better)", "µs per message (p99: tick)",
        pick(inproc, keys, "p99_ns", 1e-3),
    )

    labels, values = merged(
        ("ping-pong 64 B\npinned", results["pingpong"], "64", "median_us", 1.0),
        ("64 B, 1 per ms", results["latency"], "64_block", "median_us", 1.0),
    )
    _, p99 = merged(
        ("", results["pingpong"], "64", "p99_us", 1.0), ("", results["latency"], "64_block", "p99_us", 1.0)
    )
    grouped_bars(axes[0][1], labels, values, "2-3. one-way latency, blocking receive (lower is better)",
                 "µs, median (p99: tick)", p99)

    labels, values = merged(
        ("4 KB, 1 subscriber", results["throughput"], "1", "median_msgs_s", 1.0),
        ("64 B, 4 subscribers", results["fanout"], "4", "median_msgs_s", 1.0),
    )
    grouped_bars(axes[0][2], labels, values, "4-5. streaming and fan-out (higher is better)",
                 "messages received / s (all subscribers)")

    frames = results["frames"]
    labels, values = merged(
        ("1 MB", frames, str(1 << 20), "median_fps", 1.0),
        ("8 MB", frames, str(8 << 20), "median_fps", 1.0),
        ("8 MB first pass", frames, str(8 << 20), "first_pass_fps", 1.0),
    )
    grouped_bars(axes[1][0], labels, values, "6. large frames as numpy arrays (higher is better)", "frames / s")

    axis = axes[1][1]
    scaling = results["scaling"]
    settings = report["settings"]["scaling"]
    for peer, style in (("ours", "-"), ("native", "--")):
        for color, size in zip(("#1f77b4", "#ff7f0e", "#2ca02c", "#d62728"), settings["sizes"]):
            points = [
                (rings, scaling[peer][str(rings)][str(size)]["median_ns"] / 1e3)
                for rings in settings["rings"]
                if scaling.get(peer) and str(size) in (scaling[peer].get(str(rings)) or {})
            ]
            if points:
                axis.plot(*zip(*points), style, color=color, marker="o", label=f"{peer} {size_label(size)}")
    axis.set_xscale("log", base=2)
    axis.set_yscale("log")
    axis.set_xticks(settings["rings"], [str(rings) for rings in settings["rings"]])
    axis.set_title("8. publish cost vs subscriber rings (ours solid, native dashed)", fontsize=10)
    axis.set_xlabel("subscriber rings")
    axis.set_ylabel("µs per send")
    axis.grid(which="both", alpha=0.3)
    axis.legend(fontsize=7, ncol=2)

    axis = axes[1][2]
    rss = results["rss"]
    peers = [peer for peer in KICKMSG_PEERS if rss.get(peer) and "error" not in rss[peer]]
    imported = [rss[peer]["import_mb"] for peer in peers]
    opened = [rss[peer]["open_mb"] for peer in peers]
    axis.bar(peers, imported, label="import kickmsg", color="#7f7f7f")
    axis.bar(peers, opened, bottom=imported, label="open a channel", color="#bcbd22")
    axis.axhline(15, color="red", linestyle=":", label="target: 15 MB")
    axis.set_title("7. resident memory added (MB)", fontsize=10)
    axis.set_ylabel("MB")
    axis.legend(fontsize=8)

    axes[0][0].legend(fontsize=8, ncol=2)
    figure.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(path, dpi=100)
    plt.close(figure)
