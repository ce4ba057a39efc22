"""asyncio: await kickmsg subscribers without a thread of your own.

    message = await aio.receive(subscriber, timeout=1.0)
    async for subscriber, message in aio.messages(imu, gps, telemetry):
        ...

One waiter thread per event loop sleeps, without the GIL, on the rings of
every subscriber being awaited at once (a WaitSet's futex_waitv) and on a
doorbell word the loop rings when that set changes; it wakes the loop with
``call_soon_threadsafe``. No thread per subscriber, no polling for
messages: the thread wakes for a message, for the subscribers' check-ins
(every 0.1 s) and, at the latest every second, to see whether its loop
was closed (it then ends). The loop's own thread does everything else
(announcing on the rings, checking in, receiving), so a subscriber is only
ever used by the thread running the loop. Awaiting never takes a message
out of its ring: a cancelled await loses nothing. A subscriber is awaited
by one task at a time.

``await aio.board_change(board, last_seen, timeout)`` waits for a change of
a Blackboard (layout 9) in the loop's default executor, not in the waiter
thread: a board is not a WaitSet member (see ``board_change``).
"""
import asyncio
import datetime
import threading
import weakref
from collections.abc import AsyncIterator, Callable, Sequence
from typing import TYPE_CHECKING, Any, overload

from kickmsg.config import to_microseconds
from kickmsg.protocol.v4.layout import U32_MAX
from kickmsg.protocol.common import Doorbell, sleep_on_words
from kickmsg.subscriber import SampleView, Subscriber
from kickmsg.waitset import WaitSet, Waitable, _Sleep, _sooner, ring_owner

if TYPE_CHECKING:  # not imported at run time: numpy is only needed by typed channels
    import numpy.typing as npt

    from kickmsg.protocol.v9.blackboard import Blackboard
    from kickmsg.typed import TypedSubscriber

__all__ = [
    "BOARD_SLICE_S", "LOOP_CHECK_NS", "Message", "Timeout", "board_change", "messages", "receive", "receive_latest",
    "receive_view",
]

type Timeout = datetime.timedelta | float | None
type Message = bytes | npt.NDArray[Any]  # a copy from a Subscriber, records from a TypedSubscriber

LOOP_CHECK_NS = 1_000_000_000  # the waiter thread looks this often whether its loop was closed
BOARD_SLICE_S = 0.1  # board_change's longest sleep in one executor call


@overload
async def receive(subscriber: Subscriber, timeout: Timeout = None) -> bytes | None: ...
@overload
async def receive(subscriber: "TypedSubscriber", timeout: Timeout = None) -> "npt.NDArray[Any] | None": ...
async def receive(subscriber: Waitable, timeout: Timeout = None) -> Message | None:
    """The next message, awaited up to ``timeout`` (a timedelta or seconds;
    None: no limit); None on timeout. A copy (bytes) from a Subscriber, the
    records (a numpy array over the slot) from a TypedSubscriber."""
    return await _receive(subscriber, subscriber.try_receive, timeout)


async def receive_view(subscriber: Subscriber, timeout: Timeout = None) -> SampleView | None:
    """Like ``receive``, zero-copy: a SampleView over the slot."""
    return await _receive(subscriber, subscriber.try_receive_view, timeout)


@overload
async def receive_latest(subscriber: Subscriber, timeout: Timeout = None) -> bytes | None: ...
@overload
async def receive_latest(subscriber: "TypedSubscriber", timeout: Timeout = None) -> "npt.NDArray[Any] | None": ...
async def receive_latest(subscriber: Waitable, timeout: Timeout = None) -> Message | None:
    """Like ``receive``, but the newest message, passing over older unread
    ones (read-latest: they count in ``skipped``)."""
    return await _receive(subscriber, subscriber.try_receive_latest, timeout)


async def messages(*subscribers: Waitable) -> AsyncIterator[tuple[Waitable, Message]]:
    """An async iterator of (subscriber, message) for every message of
    ``subscribers`` (copies; records from a TypedSubscriber), in arrival
    order per subscriber, taking turns between those with messages ready.
    It never ends by itself."""
    while True:
        received = False
        for subscriber in subscribers:
            message = subscriber.try_receive()
            if message is not None:
                received = True
                yield subscriber, message
        if not received:
            await _waiter().until_ready(subscribers)


async def board_change(board: "Blackboard", last_seen: int, timeout: Timeout = None) -> bool:
    """True once the board's ``change_seq`` differs from ``last_seen`` (a
    key declared, written, released, taken over or swept), False after
    ``timeout`` (a timedelta or seconds; None: no limit). The sleep is the
    board's own ``wait`` (its futex, its waiters count: native writers wake
    it), run in the loop's default executor in slices of BOARD_SLICE_S, so
    a cancelled or timed-out await gives its thread back within one slice."""
    seconds = None if timeout is None else to_microseconds(timeout, "timeout") / 1e6
    if board.change_seq != last_seen:
        return True
    loop = asyncio.get_running_loop()
    try:
        async with asyncio.timeout(seconds):
            while not await loop.run_in_executor(None, board.wait, last_seen, BOARD_SLICE_S):
                pass
            return True
    except TimeoutError:
        return False


async def _receive[T](subscriber: Waitable, try_receive: Callable[[], T | None], timeout: Timeout) -> T | None:
    seconds = None if timeout is None else to_microseconds(timeout, "timeout") / 1e6
    try:
        async with asyncio.timeout(seconds):
            while (message := try_receive()) is None:
                await _waiter().until_ready([subscriber])
            return message
    except TimeoutError:
        return None


_WAITERS: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, "_Waiter"] = weakref.WeakKeyDictionary()


def _waiter() -> "_Waiter":
    """The running loop's waiter, made at its first await."""
    loop = asyncio.get_running_loop()
    waiter = _WAITERS.get(loop)
    if waiter is None or waiter.stopped:
        waiter = _WAITERS[loop] = _Waiter(loop)
    return waiter


class _Waiter:
    """The waiter of one event loop: a WaitSet of the subscribers being
    awaited, whose sleep runs in a thread of its own."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = weakref.ref(loop)  # the thread must not keep the loop alive
        self._awaited = WaitSet()  # used by the loop's thread only
        self._futures: dict[Subscriber, asyncio.Future[None]] = {}  # ring owner -> the future its task awaits
        self._lock = threading.Lock()  # guards the next two, shared with the thread
        self._armed: _Sleep | None = None  # the _Sleep the thread is to sleep on; None: it parks
        self._generation = 0  # bumped at each arming; the doorbell word holds it
        self._doorbell = Doorbell()
        self._thread: threading.Thread | None = None
        self.stopped = False  # the thread has ended (its loop was closed, or it failed)

    async def until_ready(self, subscribers: Sequence[Waitable]) -> None:
        """Return once one of ``subscribers`` has a message ready (at once if
        one has)."""
        owners = [ring_owner(subscriber) for subscriber in subscribers]
        for subscriber, owner in zip(subscribers, owners):
            if owner in self._futures:
                raise RuntimeError(f"{subscriber!r} is already awaited by another task (one task at a time)")
        future = asyncio.get_running_loop().create_future()
        try:
            for subscriber, owner in zip(subscribers, owners):
                self._awaited.add(subscriber)
                self._futures[owner] = future
            self._look()
            await future
        finally:
            for owner in owners:
                if self._futures.get(owner) is future:
                    del self._futures[owner]
                    self._awaited.remove(owner)  # has_waiter = 0 on its ring

    def _look(self) -> None:
        """Announce on every awaited ring: wake the tasks whose subscriber
        has a message ready, and arm the thread with the others."""
        ready, sleep = self._awaited._look()
        for added in ready:
            future = self._futures[ring_owner(added)]
            if not future.done():
                future.set_result(None)
        self._arm(sleep if sleep.addresses else None)

    def _arm(self, sleep: _Sleep | None) -> None:
        """Give the thread what to sleep on (None: nothing, it parks) and
        ring the doorbell, which ends the sleep it is in."""
        with self._lock:
            if sleep is None and self._armed is None:
                return  # parked already
            self._armed = sleep
            self._generation = (self._generation + 1) & U32_MAX
            self._doorbell.ring(self._generation)  # under the lock: the word never goes back to an older generation
        if self._thread is None and sleep is not None:
            self._thread = threading.Thread(target=self._run, name="kickmsg.aio waiter", daemon=True)
            self._thread.start()

    def _on_report(self) -> None:
        """In the loop: the thread's sleep ended (a wake-up, a word changed,
        or time to check in). Look again."""
        try:
            self._look()
        except Exception as error:  # no task is running here: hand it to the awaiting ones
            self._fail(error)

    def _fail(self, error: Exception) -> None:
        for future in self._futures.values():
            if not future.done():
                future.set_exception(error)

    # -- the waiter thread ------------------------------------------------------

    def _run(self) -> None:
        """Sleep on what the loop armed, and on the doorbell; when that
        sleep ends, tell the loop and park until it arms again. Ends once
        the loop is closed (noticed within LOOP_CHECK_NS)."""
        try:
            while self._loop_is_open():
                with self._lock:
                    generation, sleep = self._generation, self._armed
                if sleep is None:
                    self._doorbell.wait(generation, LOOP_CHECK_NS)
                    continue
                sleep_on_words(
                    [self._doorbell.address, *sleep.addresses],
                    [generation, *sleep.values],
                    _sooner(sleep.timeout_ns, LOOP_CHECK_NS),
                )
                with self._lock:
                    if self._generation != generation:
                        continue  # armed anew meanwhile: sleep on the new words
                    self._armed = None  # parked until the loop arms again
                if not self._tell_loop(self._on_report):
                    break
        except Exception as error:
            self._tell_loop(self._fail, error)
        finally:
            self.stopped = True

    def _loop_is_open(self) -> bool:
        loop = self._loop()
        return loop is not None and not loop.is_closed()

    def _tell_loop(self, callback: Callable[..., object], *args: object) -> bool:
        """Have the loop call ``callback``; False if the loop is closed."""
        loop = self._loop()
        if loop is None:
            return False
        try:
            loop.call_soon_threadsafe(callback, *args)
        except RuntimeError:  # closed
            return False
        return True
