"""Where a blocking receive's one-way latency goes, this package alone.

    python benchmarks/latency_breakdown.py [--messages N] [--size BYTES]

As in ``make bench``'s latency benchmark: a publisher process stamps
``time.monotonic_ns()`` into a message every millisecond and sends it; a
subscriber process blocked in ``receive`` computes the delay when it has the
message. Both regions' atomics are wrapped (the door is swappable) to note
the clock around the futex calls, which splits the delay into:

  to wake call     stamp -> the publisher calls futex_wake_all (its send up
                   to the commit into the subscriber's ring)
  wake call        the futex_wake_all system call itself
  kernel wake-up   end of the wake call -> the subscriber's futex_wait returns
  to message       futex_wait returned -> receive returned the message

Medians over the messages, in microseconds. The sum of the medians need not
equal the median of the total. "kernel wake-up" may be negative: on another
core the woken subscriber often runs before the waker's system call returns.
"""
import argparse
import multiprocessing
import os
import statistics
import struct
import sys
import time

import kickmsg
from kickmsg.atomics import HARDWARE, Atomics

STAMP = struct.Struct("<qq")  # sequence, monotonic_ns at send


class ClockedFutex(Atomics):
    """The hardware atomics, noting the clock around futex calls."""

    def __init__(self):
        self.wake_calls = []  # (start, end) of each futex_wake_all
        self.wait_returns = []  # monotonic_ns when each futex_wait returned

    def futex_wait(self, address, expected, timeout_ns):
        outcome = HARDWARE.futex_wait(address, expected, timeout_ns)
        self.wait_returns.append(time.monotonic_ns())
        return outcome

    def futex_wake_all(self, address):
        start = time.monotonic_ns()
        woken = HARDWARE.futex_wake_all(address)
        self.wake_calls.append((start, time.monotonic_ns()))
        return woken


def subscribe(name: str, messages: int, link) -> None:
    region = kickmsg.SharedRegion.open(name)
    clocked = region.core.atomics = ClockedFutex()
    subscriber = kickmsg.Subscriber(region)
    link.send("ready")
    woke, in_hand = [], []  # ns after the stamp
    for _ in range(messages):
        clocked.wait_returns.clear()
        data = subscriber.receive(2.0)
        now = time.monotonic_ns()
        if data is None:
            break
        _, stamp = STAMP.unpack_from(data)
        in_hand.append(now - stamp)
        woke.append(clocked.wait_returns[-1] - stamp if clocked.wait_returns else None)
    link.send((woke, in_hand))
    subscriber.close()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--messages", type=int, default=2000)
    parser.add_argument("--size", type=int, default=64)
    arguments = parser.parse_args()
    name = f"/km_latency_{os.getpid()}"
    region = kickmsg.SharedRegion.create(name, kickmsg.ChannelType.PubSub, kickmsg.Config(), "latency")
    child = None
    try:
        ours, theirs = multiprocessing.Pipe()
        child = multiprocessing.get_context("spawn").Process(target=subscribe, args=(name, arguments.messages, theirs))
        child.start()
        if not ours.poll(30) or ours.recv() != "ready":
            sys.exit("latency_breakdown: the subscriber did not start")
        clocked = region.core.atomics = ClockedFutex()
        publisher = kickmsg.Publisher(region)
        padding = bytes(arguments.size - STAMP.size)
        wake_starts, wake_spans, wake_ends = [], [], []
        for sequence in range(arguments.messages):
            time.sleep(0.001)
            clocked.wake_calls.clear()
            stamp = time.monotonic_ns()
            publisher.send(STAMP.pack(sequence, stamp) + padding)
            start, end = clocked.wake_calls[0] if clocked.wake_calls else (None, None)
            wake_starts.append(start and start - stamp)
            wake_spans.append(start and end - start)
            wake_ends.append(end and end - stamp)
        if not ours.poll(60):
            sys.exit("latency_breakdown: the subscriber did not report")
        woke, in_hand = ours.recv()
        child.join(10)
    finally:
        if child and child.is_alive():
            child.kill()
        kickmsg.unlink_shm(name)
    # Only the messages the subscriber was asleep for: a wake call was made
    # and its futex_wait returned.
    paired = [
        (start, span, woke_at - end, got - woke_at, got)
        for start, span, end, woke_at, got in zip(wake_starts, wake_spans, wake_ends, woke, in_hand)
        if start is not None and woke_at is not None
    ]
    if not paired:
        sys.exit("latency_breakdown: no message was received by a sleeping subscriber")
    print(f"{len(paired)} of {arguments.messages} messages ({arguments.size} B) woke a sleeping subscriber; medians in µs:")
    for label, column in zip(("to wake call", "wake call", "kernel wake-up", "to message", "total"), zip(*paired)):
        print(f"  {label:<15}{statistics.median(column) / 1000:8.1f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
