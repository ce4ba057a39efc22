"""The PNG chart of bench_core.py (matplotlib, Agg backend): one panel per
benchmark, grouped bars per peer, log scales. Drawn from the results
dictionary only; nothing is measured here."""
import pathlib

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

from bench_report import PEERS, machine_line, size_label  # noqa: E402

COLORS = {"ours": "#d62728", "native": "#1f77b4", "mp_pipe": "#2ca02c", "mp_queue": "#9467bd", "zmq": "#ff7f0e"}


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
    return {
        peer: [((table.get(key) or {}).get(peer) or {}).get(field, 0) * scale or None for key in keys] for peer in PEERS
    }


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

    latency = results["latency"]
    keys = list(latency)
    labels = [f"{size_label(key.split('_')[0])}\n{key.split('_')[1]}" for key in keys]
    grouped_bars(
        axes[0][1], labels, pick(latency, keys, "median_us"),
        "2. cross-process one-way latency (lower is better)", "µs, median (p99: tick)", pick(latency, keys, "p99_us"),
    )

    fanout = results["fanout"]
    keys = list(fanout)
    grouped_bars(
        axes[0][2], [f"{key} subscriber(s)" for key in keys], pick(fanout, keys, "median_msgs_s"),
        "3. fan-out 64 B (higher is better)", "messages received / s (all subscribers)",
    )

    frames = results["frames"]
    keys = list(frames)
    grouped_bars(
        axes[1][0], [size_label(key) for key in keys], pick(frames, keys, "gb_s"),
        "4. large frames as numpy arrays (higher is better)", "GB/s received",
    )

    axis = axes[1][1]
    scaling = results["scaling"]
    settings = report["settings"]["scaling"]
    for peer, style in (("ours", "-"), ("native", "--")):
        for color, size in zip(("#1f77b4", "#ff7f0e", "#2ca02c", "#d62728"), settings["sizes"]):
            points = [
                (rings, scaling[peer][str(rings)][str(size)]["median_ns"] / 1e3)
                for rings in settings["rings"]
                if scaling.get(peer) and str(size) in scaling[peer].get(str(rings), {})
            ]
            if points:
                axis.plot(*zip(*points), style, color=color, marker="o", label=f"{peer} {size_label(size)}")
    axis.set_xscale("log", base=2)
    axis.set_yscale("log")
    axis.set_xticks(settings["rings"], [str(rings) for rings in settings["rings"]])
    axis.set_title("6. publish cost vs subscriber rings (ours solid, native dashed)", fontsize=10)
    axis.set_xlabel("subscriber rings")
    axis.set_ylabel("µs per send")
    axis.grid(which="both", alpha=0.3)
    axis.legend(fontsize=7, ncol=2)

    axis = axes[1][2]
    rss = results["rss"]
    peers = [peer for peer in ("ours", "native") if rss.get(peer)]
    imported = [rss[peer]["import_mb"] for peer in peers]
    opened = [rss[peer]["open_mb"] for peer in peers]
    axis.bar(peers, imported, label="import kickmsg", color="#7f7f7f")
    axis.bar(peers, opened, bottom=imported, label="open a channel", color="#bcbd22")
    axis.axhline(15, color="red", linestyle=":", label="target: 15 MB")
    axis.set_title("5. resident memory added (MB)", fontsize=10)
    axis.set_ylabel("MB")
    axis.legend(fontsize=8)

    axes[0][0].legend(fontsize=8)
    figure.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(path, dpi=100)
    plt.close(figure)
