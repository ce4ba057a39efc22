"""kickmsg.spark.analysis on synthetic recordings written with pyarrow.

The expected figures come from a literal, row-by-row implementation of the
definitions of the module (``reference``) and, for the main ones, from the numbers
the recordings were built with."""
import ast
import json
import math
import os
import pathlib
import subprocess
import sys

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

pytest.importorskip("pyspark")
pytest.importorskip("matplotlib")

from kickmsg.spark import analysis  # noqa: E402

ROOT = pathlib.Path(__file__).resolve().parents[2]
MODULE = ROOT / "kickmsg" / "spark" / "analysis.py"
MS, US, S = 1_000_000, 1_000, 1_000_000_000

SCHEMA = pa.schema([
    ("recording", pa.string()),
    ("channel", pa.string()),
    ("ring_pos", pa.int64()),
    ("recv_mono_ns", pa.int64()),
    ("recv_wall_ns", pa.int64()),
    ("size", pa.int32()),
    ("lost", pa.int64()),
    ("stamp_ns", pa.int64()),
    ("payload", pa.binary()),
])


# ---------------------------------------------------------------- synthetic recordings

def stamp_of(payload):
    """The stamp_ns column as the recorder computes it."""
    if len(payload) < 8:
        return None
    value = int.from_bytes(payload[:8], "little")
    return value if value < 2**63 else None


def messages(recording, channel, times, sizes, latencies=None, skips=None, texts=None):
    """Rows of one channel: message i arrives at times[i] with sizes[i]
    bytes; latencies[i] (ns) puts a stamp in the payload (None: none);
    skips[i] = (positions skipped before i, lost reported on i); texts[i]
    makes a text payload instead."""
    skips = skips or {}
    rows, pos = [], 0
    for i, (t, size) in enumerate(zip(times, sizes)):
        skipped, lost = skips.get(i, (0, 0))
        pos += skipped
        if texts is not None:
            payload = texts[i].encode()
        elif latencies is not None and latencies[i] is not None and size >= 8:
            payload = (t - latencies[i]).to_bytes(8, "little") + bytes(size - 8)
        else:
            payload = bytes(size)
        rows.append({
            "recording": recording, "channel": channel, "ring_pos": pos, "recv_mono_ns": t,
            "recv_wall_ns": 1_700_000_000 * S + t, "size": len(payload), "lost": lost,
            "stamp_ns": stamp_of(payload), "payload": payload,
        })
        pos += 1
    return rows


def recording_a():
    """Two channels of one run on a host booted long ago: an IMU at 1 kHz
    with jitter, ring gaps and losses, and a text log (no stamps) that
    starts the recording 300 ms before the IMU."""
    base = 5_000 * S
    n = 2000
    imu = messages(
        "hostA-100-1000", "/kickmsg_imu",
        times=[base + 300 * MS + i * MS + (i * 7919 % 400_001) - 200_000 for i in range(n)],
        sizes=[4 if i % 500 == 250 else 24 + i % 41 for i in range(n)],   # 4 rows too short for a stamp
        latencies=[20 * US + (i * 37 % 400) * US for i in range(n)],
        skips={500: (3, 3), 1500: (2, 2), 1800: (1, 0)},                 # gaps 6, lost 5
    )
    log_times, t = [], base
    for i in range(300):
        log_times.append(t)
        t += 5 * MS + (i * 7907 % 20_000) * US
    texts = [f"INFO: step {i} " + "x" * (i % 30) for i in range(300)]
    log = messages("hostA-100-1000", "/kickmsg_log", log_times, [len(x) for x in texts],
                   skips={100: (1, 1)}, texts=texts)
    return imu + log


def recording_b():
    """The IMU again in another run (another boot: smaller monotonic times),
    at 500 Hz, with one payload whose 'stamp' is 61 s old (not a stamp)."""
    base = 100 * S
    latencies = [50 * US] * 500
    latencies[123] = 61 * S
    return messages("hostB-200-2000", "/kickmsg_imu", [base + i * 2 * MS for i in range(500)],
                    [32] * 500, latencies)


def recording_c():
    """A run recorded with --no-payload: a camera at 10 Hz with one loss, a
    channel exactly 99 % stamped, one 98 % stamped, one single message."""
    base = 700 * S
    cam = messages("hostA-300-3000", "/kickmsg_cam", [base + i * 100 * MS for i in range(50)],
                   [921_600] * 50, [2 * MS + i * 10 * US for i in range(50)], skips={20: (1, 1)})
    edge = messages("hostA-300-3000", "/kickmsg_edge", [base + 7 * MS + i * 50 * MS for i in range(100)],
                    [4 if i == 42 else 16 for i in range(100)], [100 * US] * 100)
    below = messages("hostA-300-3000", "/kickmsg_below", [base + 9 * MS + i * 50 * MS for i in range(100)],
                     [4 if i in (3, 4) else 16 for i in range(100)], [100 * US] * 100)
    once = messages("hostA-300-3000", "/kickmsg_once", [base + 2500 * MS], [12], [1 * MS])
    return cam + edge + below + once


def write(path, rows, payload=True):
    """One Parquet file as the recorder writes it (with --no-payload: no payload column)."""
    schema = SCHEMA if payload else SCHEMA.remove(SCHEMA.get_field_index("payload"))
    meta = {"recording": rows[0]["recording"], "host": "test", "started_wall_ns": 0, "channels": {}}
    schema = schema.with_metadata({"kickmsg.recording": json.dumps(meta)})
    table = pa.Table.from_pylist([{k: r[k] for k in schema.names} for r in rows], schema=schema)
    pq.write_table(table, path)


@pytest.fixture(scope="module")
def recordings(tmp_path_factory):
    """A directory with files of three runs (one split in two files, one
    without payloads) and a file being written; returns (dir, rows)."""
    folder = tmp_path_factory.mktemp("recordings")
    a, b, c = recording_a(), recording_b(), recording_c()
    split = 5_000 * S + 1200 * MS
    write(folder / "hostA-100-1000_0.parquet", [r for r in a if r["recv_mono_ns"] < split])
    write(folder / "hostA-100-1000_1.parquet", [r for r in a if r["recv_mono_ns"] >= split])
    write(folder / "hostB-200-2000_0.parquet", b)
    write(folder / "hostA-300-3000_0.parquet", c, payload=False)
    (folder / "hostA-300-3000_1.parquet.tmp").write_bytes(b"PAR1 half written")
    return folder, a + b + c


@pytest.fixture(scope="module")
def spark():
    import kickmsg.spark

    session = kickmsg.spark.session("local[2]", "kickmsg-analysis-tests")
    yield session
    session.stop()


@pytest.fixture(scope="module")
def result(spark, recordings):
    return analysis.analyze(spark, [str(recordings[0])])


# ---------------------------------------------------------------- the definitions, row by row

def reference(rows):
    """Every exact figure of every channel, computed literally from the rows."""
    runs, starts = {}, {}
    for r in rows:
        runs.setdefault(r["channel"], {}).setdefault(r["recording"], []).append(r)
        starts[r["recording"]] = min(starts.get(r["recording"], r["recv_mono_ns"]), r["recv_mono_ns"])
    expected = {}
    for channel, by_run in runs.items():
        every = [r for run in by_run.values() for r in run]
        duration_ns = intervals = gaps = 0
        interarrival, latency, seconds = [], [], {}
        for recording, run in by_run.items():
            times = sorted(r["recv_mono_ns"] for r in run)
            duration_ns += times[-1] - times[0]
            intervals += len(run) - 1
            interarrival += [b - a for a, b in zip(times, times[1:])]
            positions = sorted(r["ring_pos"] for r in run)
            gaps += sum(max(0, b - a - 1) for a, b in zip(positions, positions[1:]))
            for r in run:
                k = math.floor((r["recv_mono_ns"] - starts[recording]) / 1e9)
                count, size = seconds.get(k, (0, 0))
                seconds[k] = (count + 1, size + r["size"])
        for r in every:
            if r["stamp_ns"] is not None and 0 <= r["recv_mono_ns"] - r["stamp_ns"] <= 60 * S:
                latency.append(r["recv_mono_ns"] - r["stamp_ns"])
        n, lost, total = len(every), sum(r["lost"] for r in every), sum(r["size"] for r in every)
        duration_s = duration_ns / 1e9
        sizes = [r["size"] for r in every]
        expected[channel] = {
            "messages": n,
            "recordings": len(by_run),
            "duration_s": duration_s,
            "rate_hz": intervals / duration_s if duration_ns else None,
            "gaps": gaps,
            "lost": lost,
            "loss_ratio": lost / (n + lost),
            "size_min": min(sizes), "size_max": max(sizes), "size_mean": total / n,
            "bytes_per_s": total / duration_s if duration_ns else None,
            "stamped": len(latency) >= 0.99 * n,
            "interarrival_ns": interarrival,
            "latency_ns": latency,
            "sizes": sizes,
            "per_second": [{"second": k, "messages": seconds.get(k, (0, 0))[0], "bytes": seconds.get(k, (0, 0))[1]}
                           for k in range(max(seconds) + 1)],
        }
    return expected


def assert_quantile(value, values, q):
    """``value`` is a q-quantile of ``values`` up to percentile_approx's rank error."""
    n = len(values)
    tolerance = n / analysis.ACCURACY + 1
    below = sum(1 for v in values if v < value)
    at_most = sum(1 for v in values if v <= value)
    assert below <= q * n + tolerance and at_most >= q * n - tolerance, (value, q, n)


CHANNELS = ["/kickmsg_below", "/kickmsg_cam", "/kickmsg_edge", "/kickmsg_imu", "/kickmsg_log", "/kickmsg_once"]


@pytest.fixture(scope="module")
def expected(recordings):
    return reference(recordings[1])


# ---------------------------------------------------------------- tests

def test_channels(result):
    assert list(result) == CHANNELS


@pytest.mark.parametrize("channel", CHANNELS)
def test_exact_figures(result, expected, channel):
    got, want = result[channel], expected[channel]
    for key in ("messages", "recordings", "duration_s", "rate_hz", "gaps", "lost", "loss_ratio",
                "bytes_per_s", "stamped", "per_second"):
        assert got[key] == want[key], key
    sizes = got["size_bytes"]
    assert (sizes["min"], sizes["max"], sizes["mean"]) == (want["size_min"], want["size_max"], want["size_mean"])
    if want["interarrival_ns"]:
        assert got["interarrival_ms"]["max"] == max(want["interarrival_ns"]) / 1e6
    else:
        assert got["interarrival_ms"] is None
    if want["stamped"]:
        assert got["latency_us"]["max"] == max(want["latency_ns"]) / 1e3
    else:
        assert got["latency_us"] is None


@pytest.mark.parametrize("channel", CHANNELS)
def test_percentiles(result, expected, channel):
    got, want = result[channel], expected[channel]
    for name, q in (("p50", 0.5), ("p95", 0.95)):
        assert_quantile(got["size_bytes"][name], want["sizes"], q)
    for key, values, unit in (("interarrival_ms", want["interarrival_ns"], 1e6), ("latency_us", want["latency_ns"], 1e3)):
        if got[key] is None:
            continue
        for name, q in (("p50", 0.5), ("p95", 0.95), ("p99", 0.99)):
            assert_quantile(round(got[key][name] * unit), values, q)


def test_figures_the_recordings_were_built_with(result):
    imu, log, cam = (result[c] for c in ("/kickmsg_imu", "/kickmsg_log", "/kickmsg_cam"))
    assert (imu["messages"], imu["recordings"], imu["gaps"], imu["lost"]) == (2500, 2, 6, 5)
    assert imu["loss_ratio"] == 5 / 2505
    assert imu["stamped"] and imu["latency_us"]["max"] == (20 + 399) and imu["latency_us"]["p50"] > 20
    assert 0.8 <= imu["interarrival_ms"]["p50"] <= 2.0        # 1 ms with jitter, then 2 ms
    assert (log["stamped"], log["latency_us"], log["gaps"], log["lost"]) == (False, None, 1, 1)
    assert (cam["messages"], cam["gaps"], cam["lost"], cam["duration_s"]) == (50, 1, 1, 4.9)
    assert cam["rate_hz"] == 49 / 4.9 and cam["interarrival_ms"]["max"] == 100.0
    assert cam["size_bytes"] == {"min": 921_600, "p50": 921_600, "p95": 921_600, "max": 921_600, "mean": 921_600.0}
    assert cam["bytes_per_s"] == 50 * 921_600 / 4.9
    assert cam["latency_us"]["max"] == 2000 + 49 * 10
    assert result["/kickmsg_edge"]["stamped"] is True       # exactly 99 %
    assert result["/kickmsg_below"]["stamped"] is False     # 98 %
    # The IMU's seconds count from the start of recording A (the log's first
    # message, 300 ms earlier) merged with recording B's from its own start.
    per_second = [s["messages"] for s in imu["per_second"]]
    assert len(per_second) == 3 and sum(per_second) == 2500 and per_second[0] in (700 + 500, 701 + 500)


def test_single_message_channel(result):
    once = result["/kickmsg_once"]
    assert (once["messages"], once["duration_s"], once["rate_hz"], once["bytes_per_s"]) == (1, 0.0, None, None)
    assert once["interarrival_ms"] is None and once["stamped"] is True
    assert once["latency_us"] == {"p50": 1000.0, "p95": 1000.0, "p99": 1000.0, "max": 1000.0}
    assert once["per_second"] == [{"second": 0, "messages": 0, "bytes": 0}, {"second": 1, "messages": 0, "bytes": 0},
                                  {"second": 2, "messages": 1, "bytes": 12}]   # 2.5 s after the camera's first


def test_histograms_count_every_value(result, expected):
    for channel, got in result.items():
        histograms, want = got["histograms"], expected[channel]
        for key, values in (("interarrival_ms", want["interarrival_ns"]), ("latency_us", want["latency_ns"])):
            if got[key] is None:
                assert histograms[key] is None
                continue
            histogram = histograms[key]
            assert len(histogram["counts"]) == analysis.HISTOGRAM_BINS
            assert sum(histogram["counts"]) + histogram["above"] == len(values)


def test_result_is_plain_json(result):
    assert json.loads(json.dumps(result, allow_nan=False)) == result


def test_paths_may_be_files_and_globs(spark, recordings):
    folder = recordings[0]
    paths = [str(folder / "hostB-200-2000_0.parquet"), str(folder / "hostA-100-1000_*.parquet")]
    channels = analysis.analyze(spark, paths)
    assert {c: channels[c]["messages"] for c in channels} == {"/kickmsg_imu": 2500, "/kickmsg_log": 300}


def test_write_html(result, tmp_path):
    path = tmp_path / "report.html"
    analysis.write_html(result, str(path))
    text = path.read_text()
    assert text.count('<img src="data:image/png;base64,') == 6 + 5 + 4   # rate, inter-arrival, latency
    for channel in CHANNELS:
        assert f"<h2>{channel}</h2>" in text


def test_table(result):
    lines = analysis.format_table(result).splitlines()
    assert lines[0].split()[:3] == ["channel", "messages", "rate"]
    assert [line.split()[0] for line in lines[1:]] == CHANNELS


def test_module_imports_no_kickmsg():
    """What a spark-submit driver needs: pyspark and the standard library
    (matplotlib only inside write_html)."""
    tree = ast.parse(MODULE.read_text())
    top = set()
    for node in tree.body:
        if isinstance(node, ast.Import):
            top.update(a.name.split(".")[0] for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            top.add(node.module.split(".")[0])
    assert top - set(sys.stdlib_module_names) == {"pyspark"}
    every = {n.module if isinstance(n, ast.ImportFrom) else a.name
             for n in ast.walk(tree) if isinstance(n, (ast.Import, ast.ImportFrom))
             for a in n.names}
    assert not [name for name in every if name.startswith("kickmsg")]


def test_runs_as_a_script(recordings, result, tmp_path):
    """``python kickmsg/spark/analysis.py`` as spark-submit runs it, with
    ``kickmsg`` made unimportable: the module stands alone."""
    stub = tmp_path / "stub" / "kickmsg"
    stub.mkdir(parents=True)
    (stub / "__init__.py").write_text("raise ImportError('analysis.py must not import kickmsg')\n")
    env = dict(os.environ, PYTHONPATH=str(stub.parent))
    json_path, html_path = tmp_path / "out.json", tmp_path / "out.html"
    done = subprocess.run(
        [sys.executable, str(MODULE), str(recordings[0] / "*.parquet"), "--master", "local[1]",
         "--json", str(json_path), "--html", str(html_path)],
        env=env, cwd=tmp_path, capture_output=True, text=True, timeout=180,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    written = json.loads(json_path.read_text())
    assert written.keys() == result.keys()
    for channel, figures in written.items():
        for key in ("messages", "gaps", "lost", "duration_s", "rate_hz", "per_second"):
            assert figures[key] == result[channel][key]
    assert 'src="data:image/png;base64,' in html_path.read_text()
    table = done.stdout.splitlines()
    assert table[0].startswith("channel") and [line.split()[0] for line in table[1:]] == CHANNELS


def test_a_re_created_region_is_a_restart_not_a_gap(spark, tmp_path):
    """A recording whose recorder followed a re-created region (the
    ``rejoined`` column): ring positions 100-109, then 40-44 in the new
    region, the first of them with the 40 messages it missed in ``lost``.
    analyze reports 1 restart, no gap (positions are compared within one
    region) and the 40 lost; a file recorded before the column existed,
    read with it, has no restart. Before, the restart showed nowhere."""
    new_schema = pa.schema(list(SCHEMA)[:-1] + [("rejoined", pa.int32()), ("payload", pa.binary())])
    positions = [(pos, 0, 0) for pos in range(100, 110)] + [(40, 40, 1)] + [(pos, 0, 1) for pos in range(41, 45)]
    rows = [{"recording": "hostA-1-1", "channel": "/kickmsg_x", "ring_pos": pos, "recv_mono_ns": i * MS,
             "recv_wall_ns": i * MS, "size": 4, "lost": lost, "stamp_ns": None, "rejoined": rejoined, "payload": bytes(4)}
            for i, (pos, lost, rejoined) in enumerate(positions)]
    meta = {"kickmsg.recording": json.dumps({"recording": "hostA-1-1", "host": "test", "started_wall_ns": 0, "channels": {}})}
    pq.write_table(pa.Table.from_pylist(rows, schema=new_schema.with_metadata(meta)), tmp_path / "new.parquet")
    write(tmp_path / "old.parquet", messages("hostA-2-2", "/kickmsg_old", [i * MS for i in range(5)], [8] * 5))
    result = analysis.analyze(spark, [str(tmp_path)])
    x, old = result["/kickmsg_x"], result["/kickmsg_old"]
    assert (x["messages"], x["restarts"], x["gaps"], x["lost"]) == (15, 1, 0, 40)
    assert (old["messages"], old["restarts"], old["gaps"], old["lost"]) == (5, 0, 0, 0)
