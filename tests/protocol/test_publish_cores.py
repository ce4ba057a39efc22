"""The publisher cores of both layouts (``kickmsg.protocol.v4.publish``,
``kickmsg.protocol.v9.publish``): one shape, ``PublisherCore``, and the
reservation they own; and what the API's ``Publisher`` and
``AllocatedSlot`` add over them."""
import gc

import pytest

import rawregion
from conftest import new_shm_name
from kickmsg import ChannelType, Config, PoolEmptyError, Publisher, SharedRegion, Subscriber, shm
from kickmsg.protocol import freestack
from kickmsg.protocol.cores import PublisherCore
from kickmsg.protocol.v4 import publish as publish4
from kickmsg.protocol.v4.layout import INVALID_SLOT
from kickmsg.protocol.v9 import publish as publish9

CONFIG = Config(max_subscribers=2, sub_ring_capacity=2, pool_size=4, max_payload_size=16)
CORES = {4: publish4.Publisher, 9: publish9.Publisher}


@pytest.fixture(params=[4, 9], ids=["layout4", "layout9"])
def region(request):
    """A region of each layout, unlinked after the test whatever its outcome."""
    name = new_shm_name("kp35pub")
    try:
        yield SharedRegion.create(name, ChannelType.PubSub, CONFIG, layout=request.param)
    finally:
        shm.unlink(name)


def core_of(region: SharedRegion) -> PublisherCore:
    return CORES[region.layout](region.core)


def test_the_api_holds_the_core_of_its_layout(region):
    assert type(Publisher(region)._core) is CORES[region.layout]


def test_allocate_payload_publish_delivers_and_consumes_the_reservation(region):
    core = core_of(region)
    subscriber = Subscriber(region)
    slot = core.allocate()
    assert slot != INVALID_SLOT and core.pending == slot
    core.payload(slot, 5)[:] = b"hello"
    assert core.publish(slot, 5) == 1
    assert core.pending == INVALID_SLOT
    assert subscriber.try_receive() == b"hello"
    with pytest.raises(ValueError, match=f"slot {slot} is not this publisher's reservation"):
        core.publish(slot, 5)  # consumed: publishing it again is refused
    subscriber.close()
    rawregion.assert_pool_whole(region.name)


def test_allocate_gives_back_the_previous_reservation(region):
    core = core_of(region)
    first = core.allocate()
    second = core.allocate()
    assert second != INVALID_SLOT and core.pending == second
    assert freestack.count_free(region.core) == 3  # the first went back
    with pytest.raises(ValueError, match=f"publish\\(len\\) exceeds slot max_size: 17 > 16"):
        core.publish(second, 17)  # too long: given back, nothing delivered
    assert core.pending == INVALID_SLOT and freestack.count_free(region.core) == 4
    assert first != INVALID_SLOT


def test_a_slot_set_aside_stays_out_of_the_pool_until_given_back(region):
    core = core_of(region)
    slot = core.allocate()
    core.set_aside(slot)  # a buffer over it is still alive
    assert core.pending == INVALID_SLOT
    core.allocate()  # no reservation to give back: the slot set aside stays out
    assert freestack.count_free(region.core) == 2
    core.give_back(slot)
    core.give_back(core.pending)
    assert core.pending == INVALID_SLOT and freestack.count_free(region.core) == 4


def test_send_on_an_empty_pool_raises_pool_empty_naming_the_pool(region):
    core = core_of(region)
    for _ in range(4):
        CORES[region.layout](region.core).allocate()  # four publishers each hold a slot
    with pytest.raises(PoolEmptyError) as raised:
        core.send(b"x")
    assert isinstance(raised.value, BlockingIOError)  # what the native bindings raise
    assert str(raised.value) == (f"[Errno 11] slot pool of {region.name} exhausted: all 4 slots in use; try again "
                                 f"after subscribers drain (kickmsg audit {region.name} shows who holds them)")
    with pytest.raises(ValueError, match=f"message too large: 17 bytes exceeds max_payload_size 16 of {region.name}"):
        core.send(bytes(17))


def test_send_leaves_a_reservation_on_layout_4_and_gives_it_back_on_layout_9(region):
    """0.1.0's send pops a slot of its own; 0.9.2's allocates, so the
    previous reservation goes back to the pool."""
    core = core_of(region)
    subscriber = Subscriber(region)
    slot = core.allocate()
    assert core.send(b"sent") == 4
    assert subscriber.try_receive() == b"sent"
    if region.layout == 4:
        assert core.pending == slot
        core.payload(slot, 6)[:] = b"placed"
        assert core.publish(slot, 6) == 1
        assert subscriber.try_receive() == b"placed"
    else:
        assert core.pending == INVALID_SLOT
    subscriber.close()
    rawregion.assert_pool_whole(region.name)


def test_a_superseded_slot_with_a_live_buffer_comes_back_when_the_buffer_goes(region):
    """Through the API: a newer allocate (both layouts) or a send (layout 9)
    supersedes a slot; while a buffer over it lives, the slot stays out of
    the pool (nothing else can be handed it), then comes back."""
    publisher = Publisher(region)
    first = publisher.allocate()
    buffer = memoryview(first)
    second = publisher.allocate()  # the core's reservation is now second's
    assert not first.valid and freestack.count_free(region.core) == 2
    buffer.release()
    assert freestack.count_free(region.core) == 3
    assert second.publish(3) == 0  # no subscriber
    del first, second
    gc.collect()
    rawregion.assert_pool_whole(region.name)


def test_a_send_supersedes_an_allocated_slot_on_layout_9_only(region):
    publisher = Publisher(region)
    subscriber = Subscriber(region)
    slot = publisher.allocate()
    with memoryview(slot) as buffer:
        buffer[:4] = b"slot"
        publisher.send(b"sent")
        assert slot.valid is (region.layout == 4)
        assert freestack.count_free(region.core) == 2  # sent's slot in the ring; slot's held by the buffer
    if region.layout == 4:
        assert slot.publish(4) == 1
        assert [subscriber.try_receive(), subscriber.try_receive()] == [b"sent", b"slot"]
    else:
        with pytest.raises(ValueError, match="superseded"):
            slot.publish(4)
        assert [subscriber.try_receive(), subscriber.try_receive()] == [b"sent", None]
    subscriber.close()
    del slot
    gc.collect()
    rawregion.assert_pool_whole(region.name)


def test_a_send_too_long_leaves_an_allocated_slot_alone(region):
    """The length is refused before anything else: the slot allocated stays
    the reservation, on layout 9 too (0.9.2's send)."""
    publisher = Publisher(region)
    slot = publisher.allocate()
    with pytest.raises(ValueError, match="message too large: 17 bytes exceeds max_payload_size 16"):
        publisher.send(bytes(17))
    assert slot.valid and publisher._core.pending == slot._slot
    assert slot.publish(0) == 0  # no subscriber
    rawregion.assert_pool_whole(region.name)
