"""Every example in examples/ runs to completion (they are the README's promises)."""
import pathlib
import signal
import subprocess
import sys

import pytest

EXAMPLES = sorted((pathlib.Path(__file__).resolve().parent.parent / "examples").glob("*.py"))


@pytest.mark.parametrize("script", EXAMPLES, ids=[path.stem for path in EXAMPLES])
def test_example_runs(script, tmp_path):
    """Run as a user would; the demo for 2 s instead of 10, into a temporary directory."""
    arguments = ["--seconds", "2", "--out", str(tmp_path)] if script.stem == "demo" else []
    result = subprocess.run([sys.executable, str(script), *arguments], capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, f"{script.name} failed:\n{result.stdout[-3000:]}\n{result.stderr[-3000:]}"
    assert result.stdout.strip(), f"{script.name} printed nothing"


DEMO = EXAMPLES[0].with_name("demo.py")


def demo_objects(pid):
    return sorted(path.name for path in pathlib.Path("/dev/shm").glob(f"kmdemo{pid}_*"))


def test_demo_writes_the_report_and_leaves_no_shared_memory(tmp_path):
    demo = subprocess.Popen([sys.executable, str(DEMO), "--seconds", "2", "--out", str(tmp_path)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    out, err = demo.communicate(timeout=300)
    assert demo.returncode == 0, err[-3000:]
    assert "imu" in out and "camera" in out and "report:" in out
    report = (tmp_path / "report.html").read_text()
    assert report.count("data:image/png;base64") >= 4  # rate and histograms of both channels
    assert demo_objects(demo.pid) == []


def test_demo_interrupted_leaves_no_shared_memory(tmp_path):
    demo = subprocess.Popen([sys.executable, str(DEMO), "--seconds", "60", "--out", str(tmp_path)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        for line in demo.stdout:
            if line.startswith("live for"):
                break
        assert demo_objects(demo.pid), "the demo's channels should exist while it runs"
        demo.send_signal(signal.SIGINT)
        demo.communicate(timeout=60)
    finally:
        demo.kill()
    assert demo_objects(demo.pid) == []
