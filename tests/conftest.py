"""Shared fixtures: unique shared-memory names that are removed even when a
test fails, and the location of the native kickmsg 0.1.0 peer."""
import itertools
import os
import pathlib
import secrets

import pytest

import crashworkers

from kickmsg import atomics, owners, shm

ROOT = pathlib.Path(__file__).resolve().parent.parent
TESTS = ROOT / "tests"  # the helper modules: a test file run as a script finds them through $PYTHONPATH
SESSION_PREFIX = f"kmtest_{os.getpid()}_{secrets.token_hex(3)}"
_counter = itertools.count()


def pytest_collection_modifyitems(config, items):
    """The explorer's tests (tests/verify) schedule the flows' source, step
    by step: they run on the pure build only (kickmsg/build.py). `make test`
    runs them with KICKMSG_PURE=1; asked for in a process with the compiled
    build, the run stops at once and says so."""
    explorer_tests = TESTS / "verify"
    if atomics.COMPILED and any(item.path.is_relative_to(explorer_tests) for item in items):
        pytest.exit("tests/verify schedules the flows' source: run it with KICKMSG_PURE=1 in the environment "
                    "(make test does)", returncode=pytest.ExitCode.USAGE_ERROR)


def new_shm_name(label: str = "r") -> str:
    """A fresh name under this test session's prefix."""
    return f"/{SESSION_PREFIX}_{label}_{next(_counter)}"


@pytest.fixture
def shm_name(request):
    """A unique shm name; the region and its sidecar files are removed after
    the test whatever its outcome."""
    name = new_shm_name(request.node.name[:40].replace("/", "_").replace("[", "_").replace("]", ""))
    yield name
    shm.unlink(name)
    owners.unlink(name)


@pytest.fixture
def prefix():
    """A Node prefix of this test's own (no leading '/'); every object under
    it is removed after the test, whatever its outcome."""
    value = new_shm_name("p")[1:]
    yield value
    for path in pathlib.Path("/dev/shm").glob(f"{value}_*"):
        path.unlink(missing_ok=True)


@pytest.fixture(scope="session", autouse=True)
def remove_leftover_regions():
    """After the session, remove every object this session's names created
    (also those made by subprocesses under the same prefix)."""
    yield
    for path in pathlib.Path("/dev/shm").glob(f"{SESSION_PREFIX}_*"):
        path.unlink(missing_ok=True)


@pytest.fixture
def procs():
    """A crashworkers.Processes; whatever still runs at the end is killed."""
    started = crashworkers.Processes()
    yield started
    started.kill_all()


@pytest.fixture(params=[4, 9], ids=["layout4", "layout9"])
def layout(request, monkeypatch):
    """Run the test on layout 4 and on layout 9: regions created without a
    ``layout=`` (SharedRegion.create/create_or_open, Node), here and in the
    test's children, get this one (through $KICKMSG_LAYOUT)."""
    monkeypatch.setenv("KICKMSG_LAYOUT", str(request.param))
    return request.param


# On a test of a module that runs on both layouts: this one holds for layout 4 only.
layout4_only = pytest.mark.parametrize("layout", [4], ids=["layout4"], indirect=True)


@pytest.fixture
def layout4_default(monkeypatch):
    """Regions created without a ``layout=``, here and in the test's
    children, get layout 4 (through $KICKMSG_LAYOUT)."""
    monkeypatch.setenv("KICKMSG_LAYOUT", "4")


# A test (or a module's ``pytestmark``) of what layout 4 alone has: owner
# records in sidecar files, its byte offsets, native 0.1.0 peers.
on_layout4 = pytest.mark.usefixtures("layout4_default")
