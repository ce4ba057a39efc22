"""The explorer's tests schedule the flows' source, step by step: they run on
the pure build only (kickmsg/build.py). `make test` runs them with
KICKMSG_PURE=1; run in a process with the compiled build, they stop at once
and say so."""
import pytest

from kickmsg import atomics

if atomics.COMPILED:
    pytest.exit("tests/verify schedules the flows' source: run it with KICKMSG_PURE=1 in the environment "
                "(make test does)", returncode=pytest.ExitCode.USAGE_ERROR)
