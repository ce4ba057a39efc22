"""The weak memory model itself, on small litmus tests over ordinary memory.

Each test drives ``WeakMemory`` directly, actor by actor, as the explorer
does, and checks what a load may read: the C11 rules of the module's
docstring, one by one.
"""
import ctypes

import pytest

from kickmsg.verify.memory import HISTORY, Operation, WeakMemory


class Litmus:
    """Three actors (0, 1, 2, named a, b, c) over a few u64 words of
    ordinary memory. ``read_ages`` records how many stores each load could
    read, when it had a choice."""

    def __init__(self):
        self.words = (ctypes.c_uint64 * 4)()
        self.read_ages = []
        self.pick = "oldest"
        self.memory = WeakMemory(["a", "b", "c"], self._choose)
        self.steps = 0

    def _choose(self, ages):
        self.read_ages.append(ages)
        return ages - 1 if self.pick == "oldest" else 0

    def address(self, word: int) -> int:
        return ctypes.addressof(self.words) + 8 * word

    def do(self, actor: int, operation: str, word: int, *operands):
        self.steps += 1
        result, _ = self.memory.perform(actor, operation, self.address(word), operands, self.steps)
        return result

    def load(self, actor: int, word: int, order: str = "relaxed", pick: str = "oldest") -> int:
        """What the load reads if it picks the oldest (or newest) store it may."""
        self.pick = pick
        return self.do(actor, f"load_{order}_u64", word)


X, FLAG = 0, 1


def test_operations_are_read_from_their_names():
    assert Operation.named("cas_acq_rel_u64") == Operation("cas", "acq_rel", "u64")
    assert Operation.named("fetch_sub_release_u32") == Operation("fetch_sub", "release", "u32")
    assert Operation.named("store_seq_cst_u32") == Operation("store", "seq_cst", "u32")


def test_a_load_may_read_an_older_store_of_another_actor():
    litmus = Litmus()
    litmus.do(0, "store_relaxed_u64", X, 1)
    assert litmus.load(1, X) == 0  # the initial value: nothing orders b after a's store
    assert litmus.read_ages == [2]


def test_an_actor_reads_its_own_stores_or_newer():
    litmus = Litmus()
    litmus.do(0, "store_relaxed_u64", X, 1)
    assert litmus.load(0, X) == 1  # sequenced before: write-read coherence
    assert litmus.read_ages == []  # no choice to make


@pytest.mark.parametrize("pick, x_at_least", [("newest", 1), ("oldest", 0)])
def test_release_acquire_passes_on_what_was_written_before(pick, x_at_least):
    litmus = Litmus()
    litmus.do(0, "store_relaxed_u64", X, 1)
    litmus.do(0, "store_release_u64", FLAG, 1)
    litmus.load(1, FLAG, "acquire", pick)
    assert litmus.load(1, X) == x_at_least  # having read flag = 1, b must see x = 1; not so having read 0


@pytest.mark.parametrize("store, load", [("relaxed", "acquire"), ("release", "relaxed")])
def test_relaxed_on_either_side_passes_on_nothing(store, load):
    litmus = Litmus()
    litmus.do(0, "store_relaxed_u64", X, 1)
    litmus.do(0, f"store_{store}_u64", FLAG, 1)
    assert litmus.load(1, FLAG, load, "newest") == 1
    assert litmus.load(1, X) == 0  # the flag was seen, x = 1 may not be


def test_a_load_never_reads_older_than_what_it_read_before():
    litmus = Litmus()
    litmus.do(0, "store_relaxed_u64", X, 1)
    litmus.do(0, "store_relaxed_u64", X, 2)
    assert litmus.load(1, X, pick="newest") == 2
    assert litmus.load(1, X) == 2  # read-read coherence: neither 1 nor the initial 0 any more
    assert litmus.read_ages == [3]  # the second load had no choice


def test_read_modify_writes_read_the_newest_store_and_continue_release_sequences():
    litmus = Litmus()
    litmus.do(0, "store_relaxed_u64", X, 1)
    litmus.do(0, "store_release_u64", FLAG, 1)
    assert litmus.do(1, "fetch_add_relaxed_u64", FLAG, 1) == 1  # never the initial 0: atomicity
    assert litmus.do(1, "cas_relaxed_u64", FLAG, 0, 5) == 2  # a failed CAS reads the newest too
    assert litmus.load(2, FLAG, "acquire", "newest") == 2  # b's relaxed RMW, in a's release sequence
    assert litmus.load(2, X) == 1  # so c synchronized with a


def test_a_plain_store_ends_a_release_sequence():
    litmus = Litmus()
    litmus.do(0, "store_relaxed_u64", X, 1)
    litmus.do(0, "store_release_u64", FLAG, 1)
    litmus.do(1, "store_relaxed_u64", FLAG, 2)
    assert litmus.load(2, FLAG, "acquire", "newest") == 2
    assert litmus.load(2, X) == 0


def test_seq_cst_acts_as_acq_rel():
    litmus = Litmus()
    litmus.do(0, "store_relaxed_u64", X, 1)
    litmus.do(0, "store_seq_cst_u64", FLAG, 1)
    assert litmus.do(1, "cas_seq_cst_u64", FLAG, 1, 2) == 1
    assert litmus.load(1, X) == 1


def test_futex_wait_compares_the_newest_store_and_a_wake_touches_no_memory():
    litmus = Litmus()
    litmus.do(0, "store_relaxed_u64", X, 7)
    result, stale = litmus.memory.perform(1, "load_relaxed_u32", litmus.address(X), (), 9, newest=True)
    assert (result, stale) == (7, None) and litmus.read_ages == []
    assert litmus.memory.perform(0, "futex_wake_all", litmus.address(X), (), 10) == (0, None)  # nobody asleep


def test_a_stale_read_names_the_newest_store():
    litmus = Litmus()
    litmus.do(0, "store_relaxed_u64", X, 1)  # step 1
    litmus.steps = 41
    litmus.do(0, "store_relaxed_u64", X, 2)  # step 42
    result, stale = litmus.memory.perform(1, "load_relaxed_u64", litmus.address(X), (), 50)
    assert result == 0 and stale == (2, 42)


def test_each_word_keeps_a_bounded_history():
    litmus = Litmus()
    for value in range(1, 10):
        litmus.do(0, "store_relaxed_u64", X, value)
    assert litmus.load(1, X) == 9 - HISTORY + 1
    assert litmus.read_ages == [HISTORY]


def test_a_payload_read_not_ordered_after_its_write_is_a_race():
    litmus = Litmus()
    litmus.memory.access_payload(0, 3, "write", 4)
    litmus.do(0, "store_relaxed_u64", FLAG, 1)
    litmus.load(1, FLAG, "acquire", "newest")  # relaxed store: no synchronization
    litmus.memory.access_payload(1, 3, "read", 9)
    assert litmus.memory.race == ("data race on slot 3's payload: b reads it at step 10, "
                                  "but a's write at step 5 does not happen before")


def test_a_payload_write_must_follow_every_read():
    litmus = Litmus()
    litmus.memory.access_payload(0, 1, "write", 0)
    litmus.do(0, "store_release_u64", FLAG, 1)
    litmus.load(1, FLAG, "acquire", "newest")
    litmus.memory.access_payload(1, 1, "read", 3)  # ordered after the write: fine
    assert litmus.memory.race is None
    litmus.memory.access_payload(0, 1, "write", 4)  # but the reader never told the writer it was done
    assert "a writes it at step 5, but b's read at step 4 does not happen before" in litmus.memory.race
