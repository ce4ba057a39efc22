"""Worker processes for bench_core.py: one implementation per process.

Run by bench_core.py, never by hand, as

    python    core_worker.py ours   -           MODE JSON-ARGS   (our package)
    python -S core_worker.py native NATIVE_DIR  MODE JSON-ARGS   (native 0.1.0)

For ``native`` the interpreter runs without site-packages (-S) and
``sys.path[0]`` is replaced by the directory holding ``kickmsg.abi3.so``, so
our package cannot be imported in that process; the import is checked.

Modes (each prints one JSON object as its last stdout line):
  roundtrip   send + try_receive in one process, per payload size
  subscribe   create the region, join it, print "ready", then time every
              message received with a blocking receive(timeout)
  publish     open the region and publish stamped messages at a fixed period

Only the standard library and ``kickmsg`` are imported here.
"""
import json
import struct
import sys
import time

impl, native_dir, mode, raw_args = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4]
if impl == "native":
    assert sys.flags.no_site, "run the native worker with python -S"
    sys.path[0] = native_dir  # the script's own directory is not needed
    import kickmsg

    assert kickmsg.__file__.endswith(".so"), f"expected the native binding, got {kickmsg.__file__}"
elif impl == "ours":
    import kickmsg

    assert kickmsg.__file__.endswith("__init__.py"), f"expected the pure-Python package, got {kickmsg.__file__}"
else:
    raise SystemExit(f"unknown implementation {impl!r}")

ARGS = json.loads(raw_args)

# Latency messages: sequence number and publish stamp, padded to the payload size.
STAMP = struct.Struct("<QQ")
STOP_SEQUENCE = 2**64 - 1


def emit(result: dict) -> None:
    result["impl"] = impl
    result["module"] = kickmsg.__file__
    print(json.dumps(result), flush=True)


# -- (a) in-process round trip ---------------------------------------------


def timed_round_trips(publisher, subscriber, payload: bytes, iterations: int) -> int:
    """Nanoseconds for ``iterations`` send + try_receive pairs."""
    send = publisher.send
    receive = subscriber.try_receive
    start = time.perf_counter_ns()
    for _ in range(iterations):
        send(payload)
        receive()
    return time.perf_counter_ns() - start


def roundtrip(name: str, sizes: list, repeats: int, warmup_s: float, repeat_s: float) -> None:
    """For each size: warm up for ``warmup_s`` (which also calibrates how many
    iterations fill about ``repeat_s``), then ``repeats`` timed runs."""
    region = kickmsg.SharedRegion.create(name, kickmsg.ChannelType.PubSub, kickmsg.Config(), "bench_core")
    try:
        publisher = kickmsg.Publisher(region)
        subscriber = kickmsg.Subscriber(region)
        results = {}
        for size in sizes:
            payload = (bytes(range(256)) * (size // 256 + 1))[:size]
            publisher.send(payload)
            received = subscriber.try_receive()
            assert received == payload, f"{impl}: round trip of {size} B returned {len(received or b'')} B"
            # Warm up; count how many iterations fit into warmup_s.
            iterations, done, spent = 100, 0, 0
            while spent < warmup_s * 1e9:
                spent += timed_round_trips(publisher, subscriber, payload, iterations)
                done += iterations
                iterations *= 2
            per_repeat = max(1000, int(repeat_s * 1e9 * done / spent))
            runs = [timed_round_trips(publisher, subscriber, payload, per_repeat) / per_repeat for _ in range(repeats)]
            assert subscriber.try_receive() is None and subscriber.lost == 0
            results[str(size)] = {"iterations_per_repeat": per_repeat, "ns_per_op_runs": runs}
        del publisher, subscriber
        emit({"roundtrip": results})
    finally:
        region.unlink()


# -- (b) cross-process one-way latency --------------------------------------


def subscribe(name: str, size: int, warmup: int, samples: int, timeout_s: float) -> None:
    """Create the region, join, then receive until the stop message. For each
    message: latency = monotonic_ns() after receive - stamp in the payload.
    Also records whether the subscriber entered receive() before the message
    was stamped, i.e. it really had to wait for it."""
    region = kickmsg.SharedRegion.create(name, kickmsg.ChannelType.PubSub, kickmsg.Config(), "bench_core")
    try:
        subscriber = kickmsg.Subscriber(region)
        print("ready", flush=True)
        latencies_ns, waited, gaps, timeouts = [], 0, 0, 0
        expected = 0
        while True:
            entered = time.monotonic_ns()
            data = subscriber.receive(timeout_s)
            now = time.monotonic_ns()
            if data is None:
                timeouts += 1
                if timeouts >= 3:
                    break  # the publisher is gone: report what we have
                continue
            sequence, stamp = STAMP.unpack_from(data)
            if sequence == STOP_SEQUENCE:
                break
            assert len(data) == size
            gaps += sequence - expected
            expected = sequence + 1
            if sequence >= warmup:
                latencies_ns.append(now - stamp)
                waited += stamp > entered
        emit(
            {
                "latencies_ns": latencies_ns,
                "expected": samples,
                "waited": waited,
                "lost_by_sequence": gaps,
                "lost": subscriber.lost,
                "timeouts": timeouts,
            }
        )
    finally:
        region.unlink()


def publish(name: str, size: int, count: int, period_s: float) -> None:
    """Publish ``count`` stamped messages, at least ``period_s`` apart (a late
    wake-up of this process delays the next message rather than sending two
    back to back), then a stop message. The stamp is taken right before
    send()."""
    publisher = kickmsg.Publisher(kickmsg.SharedRegion.open(name))
    padding = bytes(size - STAMP.size)
    period_ns = int(period_s * 1e9)
    next_send = time.monotonic_ns() + period_ns
    for sequence in range(count):
        remaining = next_send - time.monotonic_ns()
        if remaining > 0:
            time.sleep(remaining / 1e9)
        stamp = time.monotonic_ns()
        next_send = stamp + period_ns
        publisher.send(STAMP.pack(sequence, stamp) + padding)
    time.sleep(period_s)
    publisher.send(STAMP.pack(STOP_SEQUENCE, 0) + padding)
    emit({"published": count})


if __name__ == "__main__":
    {"roundtrip": roundtrip, "subscribe": subscribe, "publish": publish}[mode](**ARGS)
