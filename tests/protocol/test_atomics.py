"""The C shim through kickmsg.atomics: values, widths, CAS results, futex."""
import ctypes
import threading

import pytest

from kickmsg import atomics
from kickmsg.atomics import HARDWARE as ops

U32, U64 = 2**32 - 1, 2**64 - 1


@pytest.fixture
def words():
    """Two u64 words of ordinary memory and their address."""
    memory = (ctypes.c_uint64 * 2)()
    return memory, ctypes.addressof(memory)


@pytest.mark.parametrize("width, limit", [("u32", U32), ("u64", U64)])
def test_loads_and_stores_keep_the_width(words, width, limit):
    memory, address = words
    for store in ("store_relaxed", "store_release", "store_seq_cst"):
        getattr(ops, f"{store}_{width}")(address, limit)
        assert getattr(ops, f"load_relaxed_{width}")(address) == limit
        assert getattr(ops, f"load_acquire_{width}")(address) == limit
    if width == "u32":
        assert memory[0] == U32 and memory[1] == 0  # only 4 bytes written


@pytest.mark.parametrize("width", ["u32", "u64"])
@pytest.mark.parametrize("order", ["relaxed", "acquire", "release", "acq_rel", "seq_cst"])
def test_cas_returns_the_value_found(words, width, order):
    _, address = words
    cas = getattr(ops, f"cas_{order}_{width}")
    getattr(ops, f"store_relaxed_{width}")(address, 5)
    assert cas(address, 5, 7) == 5  # success: found what was expected
    assert cas(address, 5, 9) == 7  # failure: found 7, nothing written
    assert getattr(ops, f"load_relaxed_{width}")(address) == 7


@pytest.mark.parametrize("width, limit", [("u32", U32), ("u64", U64)])
@pytest.mark.parametrize("order", ["relaxed", "acquire", "release", "acq_rel"])
def test_fetch_add_and_sub_wrap_like_unsigned(words, width, limit, order):
    _, address = words
    getattr(ops, f"store_relaxed_{width}")(address, limit)
    assert getattr(ops, f"fetch_add_{order}_{width}")(address, 1) == limit
    assert getattr(ops, f"load_relaxed_{width}")(address) == 0
    assert getattr(ops, f"fetch_sub_{order}_{width}")(address, 1) == 0
    assert getattr(ops, f"fetch_sub_{order}_{width}")(address, 4) == limit
    assert getattr(ops, f"load_relaxed_{width}")(address) == limit - 4


def test_futex_reports_timeout_and_changed_value(words):
    _, address = words
    ops.store_relaxed_u32(address, 3)
    assert ops.futex_wait(address, 3, 1_000_000) == atomics.FUTEX_TIMED_OUT
    assert ops.futex_wait(address, 4, 1_000_000) == atomics.FUTEX_VALUE_CHANGED
    assert ops.futex_wake_all(address) == 0  # nobody waiting


def test_futex_wait_is_woken_and_does_not_hold_the_gil(words):
    """A thread asleep in futex_wait (no limit) lets this thread run Python
    code, and wakes up when we store and wake."""
    _, address = words
    ops.store_relaxed_u32(address, 0)
    outcome = []
    sleeper = threading.Thread(target=lambda: outcome.append(ops.futex_wait(address, 0, -1)), daemon=True)
    sleeper.start()
    spins = 0
    while ops.futex_wake_all(address) == 0:  # Python keeps running meanwhile
        spins += 1
        assert spins < 10_000_000, "the sleeping thread never reached futex_wait"
    sleeper.join(timeout=10)
    assert not sleeper.is_alive()
    assert outcome == [atomics.FUTEX_WOKEN]


def test_atomics_are_built_to_keep_the_gil_and_futex_calls_to_release_it():
    """kickmsg/_build.py turns cffi's GIL release into an empty block for the
    atomics module only. It relies on the shape of cffi's generated code:
    its definitions first, our source next, then wrappers bracketing each
    call with Py_BEGIN/END_ALLOW_THREADS. A cffi that changed that shape
    would silently release the GIL again (or fail to build); this says so."""
    from kickmsg import _build

    def generated(builder) -> str:
        import io
        code = io.StringIO()
        builder.emit_c_code(code)
        return code.getvalue()

    atomics_code = generated(_build.atomics_builder)
    ours = atomics_code.index("#define Py_BEGIN_ALLOW_THREADS {")
    assert atomics_code.index("#define _cffi_save_errno") < ours  # after cffi's own definitions
    first_wrapper = atomics_code.index("{ result = km_load_relaxed_u32(x0); }")
    assert ours < atomics_code.rindex("Py_BEGIN_ALLOW_THREADS", 0, first_wrapper)  # before its uses
    futex_code = generated(_build.futex_builder)
    assert "#define Py_BEGIN_ALLOW_THREADS {" not in futex_code
    assert "Py_BEGIN_ALLOW_THREADS" in futex_code
