"""Errors with one root (issue 35): what a program catches while it runs
is a named ``KickmsgError`` that keeps the built-in class code written for
the native binding catches."""
import os
import pathlib

import pytest

import kickmsg
from kickmsg import Blackboard, BlackboardConfig, shm
from kickmsg.recording.files import file_format

PREFIX = f"kp35err_{os.getpid()}"


@pytest.fixture
def prefix():
    """A name prefix of this test's own; its objects are removed whatever the outcome."""
    yield PREFIX
    for path in pathlib.Path(shm.SHM_DIRECTORY).glob(f"{PREFIX}*"):
        path.unlink(missing_ok=True)


def test_a_full_board_and_a_key_owned_by_a_live_process(prefix):
    board = Blackboard.open_or_create(prefix, "state", BlackboardConfig(capacity=1, max_value_size=8))
    writer = board.declare("a")
    with pytest.raises(kickmsg.BoardKeyOwnedError, match="Blackboard key already owned by a live process: a") as owned:
        board.declare("a")
    with pytest.raises(kickmsg.CapacityError, match=r"Blackboard is at capacity \(1 keys\)") as full:
        board.declare("b")
    assert all(isinstance(error.value, RuntimeError) for error in (owned, full))  # what 0.9.2 raises
    assert writer.valid


def test_a_board_of_another_config(prefix):
    Blackboard.open_or_create(prefix, "state", BlackboardConfig(capacity=2, max_value_size=8))
    with pytest.raises(kickmsg.ConfigMismatchError, match="Blackboard config mismatch") as mismatch:
        Blackboard.open_or_create(prefix, "state", BlackboardConfig(capacity=4, max_value_size=8))
    assert isinstance(mismatch.value, RuntimeError)


def test_a_fifo_where_a_region_should_be(prefix):
    name = f"/{prefix}_fifo"
    os.mkfifo(shm.SHM_DIRECTORY + name)
    with pytest.raises(kickmsg.CorruptRegionError, match="is not a regular file") as refused:
        shm.open_existing(name)
    assert isinstance(refused.value, RuntimeError)


def test_a_file_that_is_not_a_recording(tmp_path):
    text = tmp_path / "notes.txt"
    text.write_text("not a recording")
    with pytest.raises(kickmsg.RecordingError, match="notes.txt is not a recording: neither a Parquet nor an MCAP file") as refused:
        file_format(str(text))
    assert isinstance(refused.value, ValueError)


def test_a_bad_argument_stays_a_plain_value_error():
    with pytest.raises(ValueError, match="seed must be an unsigned 64-bit integer, got -1") as refused:
        kickmsg.hash.fnv1a_64(b"", seed=-1)
    assert not isinstance(refused.value, kickmsg.KickmsgError)


@pytest.mark.parametrize("layout", [4, 9])
def test_a_channel_of_another_config_or_a_damaged_one_is_named(prefix, layout):
    """create_or_open on another geometry: ConfigMismatchError; an object
    that is not a region: CorruptRegionError; an empty one: EmptyObjectError
    — each still the RuntimeError the native bindings raise."""
    name = f"/{prefix}_{layout}"
    region = kickmsg.SharedRegion.create(name, kickmsg.ChannelType.PubSub, kickmsg.Config(sub_ring_capacity=8, pool_size=16), layout=layout)
    with pytest.raises(kickmsg.ConfigMismatchError, match="Config mismatch on existing region") as mismatch:
        kickmsg.SharedRegion.create_or_open(name, kickmsg.ChannelType.PubSub, kickmsg.Config(sub_ring_capacity=8, pool_size=32), layout=layout)
    assert isinstance(mismatch.value, RuntimeError)
    del region
    with open(shm.SHM_DIRECTORY + name, "r+b") as object_file:
        object_file.write(b"\0" * 8)  # the magic word gone
    with pytest.raises(kickmsg.CorruptRegionError, match="bad magic") as corrupt:
        kickmsg.SharedRegion.open(name)
    assert isinstance(corrupt.value, RuntimeError)
    os.truncate(shm.SHM_DIRECTORY + name, 0)
    with pytest.raises(kickmsg.EmptyObjectError, match="is empty") as empty:
        kickmsg.SharedRegion.open(name)
    assert isinstance(empty.value, RuntimeError)


@pytest.mark.parametrize("layout", [4, 9])
def test_a_channel_whose_rings_are_all_taken_is_a_capacity_error(prefix, layout):
    """Every ring held by a live subscriber: CapacityError, the RuntimeError
    both native bindings raise, naming the channel."""
    name = f"/{prefix}_full{layout}"
    region = kickmsg.SharedRegion.create(name, kickmsg.ChannelType.PubSub,
                                         kickmsg.Config(max_subscribers=1, sub_ring_capacity=8, pool_size=16), layout=layout)
    holder = kickmsg.Subscriber(region)
    with pytest.raises(kickmsg.CapacityError, match=f"No free subscriber slots in {name}") as full:
        kickmsg.Subscriber(region)
    assert isinstance(full.value, RuntimeError)
    holder.close()
