"""Every example in examples/ runs to completion (the docs link to them as promises)."""
import os
import pathlib
import signal
import subprocess
import sys
import time

import pytest

EXAMPLES = sorted((pathlib.Path(__file__).resolve().parents[2] / "examples").glob("*.py"))


DEMO = EXAMPLES[0].with_name("demo.py")
OTHERS = [path for path in EXAMPLES if path != DEMO]  # the demo has tests of its own, below


@pytest.mark.parametrize("script", OTHERS, ids=[path.stem for path in OTHERS])
def test_example_runs(script):
    """Run as a user would."""
    result = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, f"{script.name} failed:\n{result.stdout[-3000:]}\n{result.stderr[-3000:]}"
    assert result.stdout.strip(), f"{script.name} printed nothing"


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


def wait_for(condition, what: str, timeout: float = 120) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, what
        time.sleep(0.01)


def group_gone(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return True
    return False


def group_runs_java(pgid: int) -> bool:
    """Whether a JVM (Spark's) runs in the process group."""
    for stat in pathlib.Path("/proc").glob("[0-9]*/stat"):
        try:  # a process may end between the listing and either read
            fields = stat.read_text().rsplit(")", 1)[1].split()
            if int(fields[2]) == pgid and (stat.parent / "comm").read_text().strip() == "java":
                return True
        except (FileNotFoundError, ProcessLookupError):
            continue
    return False


@pytest.mark.parametrize("moment", ["creating", "live", "spark"])
def test_demo_ctrl_c_leaves_nothing(tmp_path, moment):
    """Ctrl-C to the demo's process group (as a terminal sends it) while it
    creates its channels and starts its processes, while they run, or once
    Spark's JVM runs (its start was left orphaned when interrupted): exit
    status 130, no traceback from it or its processes, none of them left,
    nothing left in /dev/shm."""
    seconds = "1" if moment == "spark" else "60"
    demo = subprocess.Popen([sys.executable, str(DEMO), "--seconds", seconds, "--out", str(tmp_path)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        if moment == "creating":
            wait_for(lambda: demo_objects(demo.pid) or demo.poll() is not None, "the demo created no channel")
        elif moment == "live":
            for line in demo.stdout:
                if line.startswith("live for"):
                    break
        else:
            wait_for(lambda: group_runs_java(demo.pid) or demo.poll() is not None, "the demo started no JVM")
        assert demo.poll() is None
        os.killpg(demo.pid, signal.SIGINT)
        _, err = demo.communicate(timeout=120)
        assert demo.returncode == 130, err[-3000:]
        assert "Traceback" not in err and "Exception in thread" not in err, err[-3000:]
        wait_for(lambda: group_gone(demo.pid), "a process of the demo outlived it", timeout=30)
    finally:
        if not group_gone(demo.pid):
            os.killpg(demo.pid, signal.SIGKILL)
        demo.wait(timeout=30)
        left = demo_objects(demo.pid)
        for name in left:  # whatever the outcome, nothing of it stays in /dev/shm
            (pathlib.Path("/dev/shm") / name).unlink(missing_ok=True)
    assert left == []
