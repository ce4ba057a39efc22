"""Run Python snippets against a Kickmsg implementation in a subprocess.

The native ``kickmsg`` 0.1.0 (installed by ``make test`` into
``.native/kickmsg-0.1.0``) is our interop peer for layout 4, the native
0.9.2 (``.native/kickmsg-0.9.2``, ``start_native9``/``run_native9``) for
layout 9. It never shares a process
with this package: ``run_native``/``start_native`` run a snippet under
``python -I -S`` (isolated: no PYTHON* variables, no working directory on
``sys.path``, no site-packages, so our editable install is invisible) with
that directory first on ``sys.path``, and the child checks that ``kickmsg``
really is the compiled module. ``run_ours``/``start_ours`` do the same with
this package, for process-to-process tests in both directions.

Inside a snippet these names are ready:

- ``kickmsg``: the implementation under test in that child;
- ``P``: the keyword arguments given to ``run_*``/``start_*`` (JSON values);
- ``ready()``: print the line ``ready`` (for ``Peer.wait_ready``);
- ``done(value)``: print ``value`` as the JSON result line;
- ``wait_go()``: block until the test calls ``Peer.tell()``;
- ``make_config(dict)``, ``make_payload(seq)``, ``check_payload(data)``.

Every child is bounded in time and killed on timeout; any failure shows the
child's stderr.
"""
import json
import os
import pathlib
import select
import subprocess
import sys
import time

import pytest

import kickmsg  # ours: the native one is only ever imported by children
from conftest import ROOT

NATIVE_DIR = ROOT / ".native" / "kickmsg-0.1.0"
NATIVE9_DIR = ROOT / ".native" / "kickmsg-0.9.2"
DEFAULT_TIMEOUT = 30.0

# Shared by every child and by the test process: a config from a dict, and
# self-checking payloads (sequence number, length, CRC32 of a body whose
# bytes and size depend on the sequence number).
HELPERS = r'''
import struct
import zlib

PAYLOAD_HEAD = struct.Struct("<QII")  # seq, body length, crc32(body)

def subscriber_joined(name):
    """Whether a subscriber of region ``name`` has finished joining: a ring
    is Live and its subscriber waits for messages (has_waiter), so it gets
    every message published from now on. Live alone is not enough: on layout
    9 a ring is Live before its subscriber has chosen where to start reading
    (WIRE9.md B.4). Raw bytes, the same in both layouts: the header's
    sub_rings_offset (24), max_subs (40) and sub_ring_stride (88); a ring's
    state in the low 2 bits of its first word, has_waiter at +72."""
    with open("/dev/shm" + name, "rb") as file:
        data = file.read()
    rings, (max_subs,), (stride,) = struct.unpack_from("<Q", data, 24)[0], struct.unpack_from("<Q", data, 40), struct.unpack_from("<Q", data, 88)
    return any(struct.unpack_from("<I", data, rings + index * stride)[0] & 3 == 1
               and struct.unpack_from("<I", data, rings + index * stride + 72)[0] != 0 for index in range(max_subs))

def make_config(fields):
    """A kickmsg.Config with the given fields (attribute assignment works in
    both implementations); 'schema' is a dict of SchemaInfo fields."""
    cfg = kickmsg.Config()
    for key, value in fields.items():
        if key == "schema":
            info = kickmsg.SchemaInfo()
            for schema_key, schema_value in value.items():
                if schema_key in ("identity", "layout"):
                    schema_value = bytes.fromhex(schema_value)
                setattr(info, schema_key, schema_value)
            value = info
        setattr(cfg, key, value)
    return cfg

def make_payload(seq, max_body=200):
    """A message carrying ``seq`` and a checksum of a seq-dependent body."""
    length = (seq * 37) % (max_body + 1)
    body = bytes((seq * 131 + i * 7) & 0xFF for i in range(length))
    return PAYLOAD_HEAD.pack(seq, length, zlib.crc32(body)) + body

def check_payload(data):
    """The sequence number of a message made by make_payload; raises
    ValueError if its length or checksum is wrong."""
    data = bytes(data)
    seq, length, crc = PAYLOAD_HEAD.unpack_from(data)
    body = data[PAYLOAD_HEAD.size:]
    if len(body) != length or zlib.crc32(body) != crc:
        raise ValueError(f"corrupt message: seq={seq} length={len(body)}/{length}")
    if body != bytes((seq * 131 + i * 7) & 0xFF for i in range(length)):
        raise ValueError(f"message {seq} has the checksum but not the body of its sequence number")
    return seq

def open_region(spec):
    """Open or create the region a spec dict describes: 'name', and 'how'
    ('open', 'create' or 'create_or_open') with 'type', 'config', 'creator'
    and, for ours only, 'layout' (else the process default)."""
    how = spec.get("how", "open")
    if how == "open":
        return kickmsg.SharedRegion.open(spec["name"])
    channel_type = getattr(kickmsg.ChannelType, spec.get("type", "PubSub"))
    factory = getattr(kickmsg.SharedRegion, how)
    chosen = {"layout": spec["layout"]} if "layout" in spec else {}
    return factory(spec["name"], channel_type, make_config(spec["config"]), spec.get("creator", ""), **chosen)

def publish(pub, seqs, how="mixed", seconds=20.0):
    """Publish make_payload(seq) for each seq: by send, by allocate + fill +
    publish, or alternating ('mixed'); retry while the pool is dry. Returns
    the distinct numbers of rings that allocate+publish reported."""
    import time
    deadline = time.monotonic() + seconds
    reached = set()
    for index, seq in enumerate(seqs):
        payload = make_payload(seq)
        zero_copy = how == "allocate" or (how == "mixed" and index % 2 == 1)
        while True:
            if zero_copy and hasattr(kickmsg.AllocatedSlot, "max_size"):  # 0.9.2's form (ours too)
                slot = pub.allocate()
                if slot is not None:
                    with memoryview(slot) as view:
                        view[: len(payload)] = payload
                    reached.add(slot.publish(len(payload)))
                    break
            elif zero_copy:  # 0.1.0's form
                slot = pub.allocate(len(payload))
                if slot is not None:
                    with memoryview(slot) as view:
                        view[:] = payload
                    reached.add(slot.publish())
                    break
            else:
                try:
                    sent = pub.send(payload)
                except BlockingIOError:
                    pass
                else:
                    assert sent == len(payload), (sent, len(payload))
                    break
            if time.monotonic() > deadline:
                raise TimeoutError(f"the slot pool stayed dry (message {seq})")
            time.sleep(0.0005)
    return sorted(reached)

def receive_until(sub, last_seqs, mode="copy", seconds=20.0):
    """Receive make_payload messages until every seq in ``last_seqs`` has
    arrived (or ``seconds`` passed), by copy, by zero-copy view, or
    alternating ('mixed'); try_* first, then a short blocking receive.
    Returns the seqs in arrival order, the ring positions of the views,
    the subscriber's lost count, and whether it timed out."""
    import time
    waiting = set(last_seqs)
    seqs, positions = [], []
    deadline = time.monotonic() + seconds
    while waiting and time.monotonic() < deadline:
        if mode == "view" or (mode == "mixed" and len(seqs) % 2 == 1):
            view = sub.try_receive_view()
            if view is None:
                view = sub.receive_view(0.1)
            if view is None:
                continue
            with view:
                data = bytes(view)
                positions.append(view.ring_pos)
        else:
            data = sub.try_receive()
            if data is None:
                data = sub.receive(0.1)
            if data is None:
                continue
        seq = check_payload(data)
        seqs.append(seq)
        waiting.discard(seq)
    return {"seqs": seqs, "positions": positions, "lost": sub.lost, "timed_out": bool(waiting)}
'''

PRELUDE = r'''
import json
import os
import sys

sys.path.insert(0, {path!r})
import kickmsg
assert kickmsg.__file__.endswith({suffix!r}), "wrong kickmsg: " + kickmsg.__file__
P = json.loads(sys.argv[1])

def ready():
    print("ready", flush=True)

def done(value):
    print(json.dumps(value), flush=True)

def wait_go():
    """Block until the test calls Peer.tell()."""
    sys.stdin.readline()
'''

# The helpers, for the test process too (with our kickmsg).
exec(HELPERS)

# A peer that claims region P["name"]'s schema as P["who"] when told (a race
# of claimants, of either implementation); done: whether it won.
CLAIM_SCHEMA = """
region = kickmsg.SharedRegion.open(P["name"])
info = kickmsg.SchemaInfo()
info.name = P["who"]
ready()
wait_go()
done(region.try_claim_schema(info))
"""


def native_dir(version: str = "0.1.0") -> pathlib.Path:
    """A native wheel's directory (0.1.0 or 0.9.2); fail (never skip) when
    it is missing."""
    directory, module = {"0.1.0": (NATIVE_DIR, "kickmsg.abi3.so"), "0.9.2": (NATIVE9_DIR, "kickmsg/_native.abi3.so")}[version]
    if not (directory / module).is_file():
        pytest.fail(f"native kickmsg {version} is not installed in {directory}; `make test` installs it")
    return directory


def _command(impl: str, code: str, params: dict) -> list[str]:
    """The command line of a child."""
    if impl == "native":
        prelude = PRELUDE.format(path=str(native_dir()), suffix=".so")
        python = [sys.executable, "-I", "-S"]
    elif impl == "native9":  # 0.9.2: a package around kickmsg/_native.abi3.so
        prelude = PRELUDE.format(path=str(native_dir("0.9.2")), suffix="kickmsg-0.9.2/kickmsg/__init__.py")
        python = [sys.executable, "-I", "-S"]
    elif impl == "ours":
        # Exactly the package the test process imported.
        prelude = PRELUDE.format(path=str(pathlib.Path(kickmsg.__file__).parent.parent), suffix=kickmsg.__file__)
        python = [sys.executable, "-I"]
    else:
        raise ValueError(f"unknown implementation {impl!r}")
    return python + ["-c", prelude + HELPERS + code, json.dumps(params)]


def _fail(what: str, proc: subprocess.Popen, stdout: str, stderr: str):
    pytest.fail(f"{what} (exit code {proc.returncode})\n--- stdout ---\n{stdout}\n--- stderr ---\n{stderr}")


class Peer:
    """A started child process running a snippet."""

    def __init__(self, impl: str, code: str, params: dict, timeout: float):
        self.impl = impl
        self.deadline = time.monotonic() + timeout
        self.proc = subprocess.Popen(
            _command(impl, code, params),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            stdin=subprocess.PIPE,
            cwd=ROOT,  # harmless: -I keeps the working directory off sys.path
        )
        self._early = b""  # stdout bytes read by wait_ready
        self._finished = False  # its output has been collected

    def _remaining(self) -> float:
        return max(0.1, self.deadline - time.monotonic())

    def _kill_and_fail(self, what: str):
        self.proc.kill()
        stdout, stderr = self.proc.communicate(timeout=10)
        self._finished = True
        _fail(f"{self.impl} child: {what}", self.proc, (self._early + stdout).decode(), stderr.decode())

    def wait_ready(self) -> None:
        """Block until the child's next stdout line, which must be ``ready``
        (or fail, with its stderr)."""
        fd = self.proc.stdout.fileno()
        line = b""
        while not line.endswith(b"\n"):
            readable, _, _ = select.select([fd], [], [], self._remaining())
            if not readable:
                self._kill_and_fail("timed out before printing 'ready'")
            chunk = os.read(fd, 1)  # one byte: leave the rest for result()
            if not chunk:
                self._kill_and_fail("exited before printing 'ready'")
            line += chunk
            self._early += chunk
        if line != b"ready\n":
            self._kill_and_fail(f"printed {line!r} instead of 'ready'")

    def tell(self) -> None:
        """Let a child blocked in ``wait_go()`` continue."""
        try:
            self.proc.stdin.write(b"go\n")
            self.proc.stdin.flush()
        except BrokenPipeError:
            self._kill_and_fail("exited before being told to go")

    def result(self):
        """Wait for the child to finish; the JSON value of its last stdout line."""
        try:
            stdout, stderr = self.proc.communicate(timeout=self._remaining())
        except subprocess.TimeoutExpired:
            stdout = None
        if stdout is None:  # (outside the except block: no chained traceback)
            self._kill_and_fail("timed out")
        self._finished = True
        stdout = (self._early + stdout).decode()
        if self.proc.returncode != 0:
            _fail(f"{self.impl} child failed", self.proc, stdout, stderr.decode())
        lines = stdout.split("\n")
        lines = [line for line in lines if line.strip() and line != "ready"]
        if not lines:
            _fail(f"{self.impl} child printed no result", self.proc, stdout, stderr.decode())
        return json.loads(lines[-1])

    def kill(self) -> None:
        """Stop the child if it is still running (safe to call twice)."""
        if self.proc.poll() is None:
            self.proc.kill()
        if not self._finished:
            self._finished = True
            self.proc.communicate(timeout=10)

    def __enter__(self):
        return self

    def __exit__(self, *exc_info):
        self.kill()


def start_native(code: str, timeout: float = DEFAULT_TIMEOUT, **params) -> Peer:
    """Start ``code`` with the native kickmsg; use as a context manager."""
    return Peer("native", code, params, timeout)


def start_native9(code: str, timeout: float = DEFAULT_TIMEOUT, **params) -> Peer:
    """Start ``code`` with the native kickmsg 0.9.2; use as a context manager."""
    return Peer("native9", code, params, timeout)


def run_native9(code: str, timeout: float = DEFAULT_TIMEOUT, **params):
    """Run ``code`` with the native kickmsg 0.9.2 to completion; its JSON result."""
    with start_native9(code, timeout, **params) as peer:
        return peer.result()


def start_ours(code: str, timeout: float = DEFAULT_TIMEOUT, **params) -> Peer:
    """Start ``code`` with this package in a subprocess."""
    return Peer("ours", code, params, timeout)


def race(peers: list[Peer]) -> list:
    """Wait until every peer is ready, let them all go at once, and return
    their results in order (whatever still runs at the end is killed)."""
    try:
        for peer in peers:
            peer.wait_ready()
        for peer in peers:
            peer.tell()
        return [peer.result() for peer in peers]
    finally:
        for peer in peers:
            peer.kill()


def run_native(code: str, timeout: float = DEFAULT_TIMEOUT, **params):
    """Run ``code`` with the native kickmsg to completion; its JSON result."""
    with start_native(code, timeout, **params) as peer:
        return peer.result()


def run_ours(code: str, timeout: float = DEFAULT_TIMEOUT, **params):
    """Run ``code`` with this package in a subprocess; its JSON result."""
    with start_ours(code, timeout, **params) as peer:
        return peer.result()


def start_native_of_layout(code: str, timeout: float = DEFAULT_TIMEOUT, **params) -> Peer:
    """Start ``code`` with the native kickmsg of the layout under test:
    0.9.2 when $KICKMSG_LAYOUT is 9 (the ``layout`` fixture sets it), else 0.1.0."""
    return (start_native9 if os.environ.get("KICKMSG_LAYOUT") == "9" else start_native)(code, timeout, **params)


def run_native_of_layout(code: str, timeout: float = DEFAULT_TIMEOUT, **params):
    """Run ``code`` to completion with the native kickmsg of the layout under test; its JSON result."""
    with start_native_of_layout(code, timeout, **params) as peer:
        return peer.result()
