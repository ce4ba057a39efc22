"""Run code in a child whose ``/dev/shm`` is a small tmpfs of its own (a
private mount namespace made with ``unshare``): the kernel itself says
ENOSPC there, and nothing the child makes reaches this machine's /dev/shm."""
import json
import subprocess
import sys


def run_on_a_tiny_dev_shm(child_code: str, size: str = "1M", timeout: float = 60):
    """Run ``child_code`` (given our sys.path as argv[1]) in a child with a
    private tmpfs of ``size`` on /dev/shm; what it prints, as JSON."""
    command = [
        "unshare", "--mount", "--propagation", "private", "sh", "-c",
        f'mount -t tmpfs -o size={size} tmpfs /dev/shm && exec "$0" -c "$1" "$2"',
        sys.executable, child_code, json.dumps([p for p in sys.path if p]),
    ]
    done = subprocess.run(command, capture_output=True, timeout=timeout)
    assert done.returncode == 0, done.stderr.decode()
    return json.loads(done.stdout)
