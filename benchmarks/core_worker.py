"""Benchmark worker for bench_core.py: one peer per process tree.

Run by bench_core.py, never by hand, as

    python    core_worker.py PEER      -          -         MODE JSON-ARGS
    python -S core_worker.py native    NATIVE_DIR SITE_DIR  MODE JSON-ARGS
    python -S core_worker.py native9   NATIVE_DIR SITE_DIR  MODE JSON-ARGS

PEER is ours, native, ours9, native9, mp_pipe, mp_queue, zmq, faster_fifo,
iceoryx2 or zenoh (see peers.py). For ``native`` (0.1.0, layout 4) and
``native9`` (0.9.2, layout 9) the interpreter runs without site-packages
(-S); NATIVE_DIR (the one holding 0.1.0's ``kickmsg.abi3.so``, or 0.9.2's
``kickmsg`` package) goes first on sys.path and SITE_DIR (for numpy) last,
so our package cannot be imported in that process: the import is checked.
``ours`` and ``ours9`` import this package, with $KICKMSG_LAYOUT set by
bench_core.py to 4 and 9 (checked): their channels are layout 4 and layout
9. The other peers import no kickmsg at all.

Cross-process benchmarks fork their subscriber processes from here
(multiprocessing, "fork" start method: what the pipes and queues need), so
every process of a measurement runs the same peer. Each mode prints one JSON
object, the raw measurements, as the last stdout line; bench_core.py
computes the statistics.

Modes and exactly what they time:

  inproc    one process, one subscriber: ``publisher.send(payload)`` then the
            receive of the same message, for each size. Timed in batches of
            ``batch`` pairs with perf_counter_ns; each repeat lasts about
            ``repeat_s`` (sized by a warm-up of ``warmup_s``). Also gives the
            channel's layout (ours: 4 or 9, by $KICKMSG_LAYOUT; else null).
  latency   a publisher (this process) and one subscriber process, both
            pinned (this one to core 0, the subscriber to core 1) when
            ``pinned`` is true, left to the scheduler otherwise. Every
            ``period_s`` the publisher takes ``time.monotonic_ns()``, builds the
            message (sequence number and stamp, padded to ``size`` bytes: a new
            bytes object, as the native ``send`` takes only bytes) and sends
            it, timing the ``send`` call alone with perf_counter_ns (the cold
            send: the first after an idle millisecond). The subscriber, blocked
            in its receive (``spin`` false) or looping on its non-blocking
            receive (``spin`` true), computes ``monotonic_ns() - stamp`` as soon
            as it has the message. It also notes whether it was already waiting
            when the message was stamped.
  pingpong  this process (pinned to core 0) and one forked process (core 1),
            two channels: this one sends a ``size``-byte message on "there"
            and waits for it to come back on "back" with the peer's blocking
            receive; the other receives on "there" and sends what it got on
            "back". One-way latency = half of each round trip
            (perf_counter_ns), after ``warmup`` trips. Each side also notes
            its CPU time (``time.process_time_ns``: user and system, all its
            threads) and the wall time over the measured trips: CPU time
            close to wall time is a receive that spins rather than sleeps.
  fanout    a publisher (this process) and ``subscribers`` processes. Each
            round the publisher sends ``size``-byte messages as fast as it can
            for ``duration_s``, then a short stop message; each subscriber
            counts what it receives (blocking receive) and notes the clock
            every 64 messages and at the stop message. Rate of a subscriber =
            messages counted at its last clock note / (that note - the
            publisher's start). Round 0 is a warm-up of ``warmup_s``
            (reported apart as ``first_round``: for frames, the first pass).
  frames    the same with one subscriber and ``size``-byte frames: the
            publisher produces each frame by copying a prepared numpy image
            into the buffer it sends (for kickmsg: the allocated slot, then
            publish in place) with a 16-byte header (sequence, stamp); the
            subscriber gets it as a numpy uint8 array (kickmsg: a view over
            the slot, no copy), reads the header and the last byte, releases
            it, and notes the clock of every frame.
  scaling   kickmsg peers only, one process: ``publisher.send(payload)`` alone
            on a region with ``rings`` subscribers that never read (so every
            ring has wrapped: the steady state, each publish also evicts the
            ring's oldest entry), for each size.
"""
import json
import multiprocessing
import os
import struct
import sys
import time
import traceback
from typing import Any

PEER, NATIVE_DIR, SITE_DIR, MODE, RAW_ARGS = sys.argv[1:6]
KICKMSG_PEERS = ("ours", "native", "ours9", "native9")
if PEER in ("native", "native9"):
    assert sys.flags.no_site, "run the native worker with python -S"
    sys.path.insert(0, NATIVE_DIR)
    sys.path.append(SITE_DIR)  # numpy; our package is installed by a .pth hook that -S skips
    import kickmsg

    expected = ".so" if PEER == "native" else "kickmsg-0.9.2/kickmsg/__init__.py"
    assert kickmsg.__file__.endswith(expected), f"expected the native binding, got {kickmsg.__file__}"
elif PEER in ("ours", "ours9"):
    import kickmsg

    from kickmsg import atomics

    assert kickmsg.__file__.endswith("__init__.py"), f"expected this package, got {kickmsg.__file__}"
    pure = os.environ.get("KICKMSG_PURE") == "1"
    assert atomics.COMPILED != pure, f"expected the {'pure' if pure else 'compiled'} build (kickmsg/build.py)"
    layout = os.environ.get("KICKMSG_LAYOUT")
    assert layout == ("9" if PEER == "ours9" else "4"), f"{PEER}: $KICKMSG_LAYOUT is {layout!r}"
else:
    kickmsg = None

import numpy  # noqa: E402  (after the sys.path set-up above)

import peers  # noqa: E402

ARGS = json.loads(RAW_ARGS)
CONTEXT = multiprocessing.get_context("fork")
STAMP = struct.Struct("<QQ")  # sequence number, monotonic_ns at send
STOP_SEQUENCE = 2**64 - 1
STOP_MESSAGE = b"\0"  # fan-out and frames: any message of another length ends a round
NS = 1_000_000_000


def make_peer(args: dict, size: int, channel: str = "") -> Any:
    """The peer of this worker for messages of up to ``size`` bytes;
    ``channel`` names another channel of the same peer (ping-pong: "_there"
    and "_back")."""
    if PEER in KICKMSG_PEERS:
        return peers.KickmsgPeer(PEER, kickmsg, args["shm_name"] + channel, args.get("config", {}), args["idle_s"])
    if PEER == "mp_pipe":
        return peers.PipePeer()
    if PEER == "mp_queue":
        return peers.QueuePeer(args["depth"])
    if PEER == "zmq":
        return peers.ZmqPeer(args["socket_path"] + channel, args["depth"], args["idle_s"])
    if PEER == "faster_fifo":
        return peers.FasterFifoPeer(args["depth"], size)
    if PEER == "iceoryx2":
        return peers.Iceoryx2Peer(
            f"kmbench/{MODE}{channel}", args["iox_prefix"], args["iox_root"], args["depth"], size, args["idle_s"]
        )
    if PEER == "zenoh":
        ports = args["ports"][4:] if channel == "_back" else args["ports"][:4]
        return peers.ZenohPeer(f"kmbench/{MODE}{channel}", ports, args["depth"], size)
    raise SystemExit(f"unknown peer {PEER!r}")


def emit(result: dict) -> None:
    if PEER not in KICKMSG_PEERS:
        assert "kickmsg" not in sys.modules, "a non-kickmsg peer imported kickmsg"
    result["peer"] = PEER
    result["module"] = kickmsg.__file__ if kickmsg else None
    print(json.dumps(result), flush=True)


# -- subscriber processes -----------------------------------------------------


class Children:
    """Subscriber processes forked from here, each with a control pipe."""

    def __init__(self, target, count: int, peer, args: dict):
        self.links = []
        for index in range(count):
            mine, theirs = CONTEXT.Pipe()
            process = CONTEXT.Process(target=_child_main, args=(target, peer, index, theirs, args), daemon=True)
            process.start()
            theirs.close()
            self.links.append((process, mine))

    def expect(self, timeout_s: float, what: str) -> list:
        """One message from every child within ``timeout_s`` in total."""
        deadline = time.monotonic() + timeout_s
        messages = []
        for index, (process, link) in enumerate(self.links):
            if not link.poll(max(0.0, deadline - time.monotonic())):
                raise RuntimeError(f"{PEER}: subscriber {index} sent no {what} within {timeout_s:.0f} s")
            message = link.recv()
            if isinstance(message, dict) and "error" in message:
                raise RuntimeError(f"{PEER}: subscriber {index} failed:\n{message['error']}")
            messages.append(message)
        return messages

    def stop(self) -> None:
        for process, link in self.links:
            process.join(timeout=5)
            if process.is_alive():
                process.kill()
                process.join()
            link.close()


def _child_main(target, peer, index, link, args) -> None:
    try:
        target(peer, index, link, **args)
    except BaseException:
        link.send({"error": traceback.format_exc()})


# -- inproc --------------------------------------------------------------------


def timed_batches(send, receive, payload, batches: int, batch: int) -> list:
    """Nanoseconds of each of ``batches`` runs of ``batch`` send + receive pairs."""
    clock = time.perf_counter_ns
    pairs = range(batch)
    spans = [0] * batches
    for index in range(batches):
        start = clock()
        for _ in pairs:
            send(payload)
            receive()
        spans[index] = clock() - start
    return spans


def inproc(sizes: list, repeats: int, warmup_s: float, repeat_s: float, batch: int, **peer_args) -> None:
    peer = make_peer(peer_args, max(sizes))
    peer.setup(1)
    try:
        publisher = peer.publisher()  # zmq: bind before the subscriber connects
        subscriber = peer.subscriber(0)
        publisher.wait_for_subscribers(1, 10)
        send, receive = publisher.send, subscriber.inproc_receive
        results = {}
        for size in sizes:
            payload = (bytes(range(256)) * (size // 256 + 1))[:size]
            send(payload)
            assert receive() == payload, f"{PEER}: in-process {size} B came back different"
            # Warm up, doubling the batch count, to learn how many fill repeat_s.
            batches, done, spent = 4, 0, 0
            while spent < warmup_s * NS:
                spent += sum(timed_batches(send, receive, payload, batches, batch))
                done += batches
                batches *= 2
            per_repeat = max(10, int(repeat_s * NS * done / spent))
            runs = [timed_batches(send, receive, payload, per_repeat, batch) for _ in range(repeats)]
            results[str(size)] = {"batch": batch, "batch_ns_runs": runs}
        assert getattr(subscriber, "lost", 0) == 0
        subscriber.close()
        publisher.close()
        emit({"inproc": results, "layout": getattr(getattr(peer, "region", None), "layout", None)})
    finally:
        peer.teardown()


# -- latency ---------------------------------------------------------------------


def latency_subscriber(peer, index: int, link, size: int, spin: bool, pinned: bool) -> None:
    if pinned:
        pin(1)
    subscriber = peer.subscriber(index)
    link.send("ready")
    receive = subscriber.try_receive if spin else subscriber.receive
    clock = time.monotonic_ns
    idle_ns = int((peer.idle_s or 1.0) * NS)
    latencies, expected, gaps, timeouts, bad_size = [], 0, 0, 0, 0
    warmup = None
    while True:
        entered = clock()
        data = receive()
        if spin:
            misses = 0
            while data is None:
                misses += 1
                if not misses & 0xFFFF and clock() - entered > idle_ns:
                    break
                data = receive()
        now = clock()
        if data is None:
            timeouts += 1
            if timeouts >= 5:
                break  # the publisher is gone: report what we have
            continue
        sequence, stamp = STAMP.unpack_from(data)
        if sequence == STOP_SEQUENCE:
            warmup = stamp  # the stop message carries the warm-up count
            break
        bad_size += len(data) != size
        gaps += sequence - expected
        expected = sequence + 1
        latencies.append((sequence, now - stamp, stamp > entered))
    measured = [(ns, was_waiting) for sequence, ns, was_waiting in latencies if sequence >= (warmup or 0)]
    link.send(
        {
            "latencies_ns": [ns for ns, _ in measured],
            "waited": sum(was_waiting for _, was_waiting in measured),
            "lost_by_sequence": gaps,
            "lost": subscriber.lost,
            "timeouts": timeouts,
            "bad_size": bad_size,
        }
    )
    subscriber.close()


def latency(size: int, spin: bool, pinned: bool, period_s: float, warmup: int, samples: int, **peer_args) -> None:
    peer = make_peer(peer_args, size)
    peer.setup(1)
    children = None
    try:
        children = Children(latency_subscriber, 1, peer, {"size": size, "spin": spin, "pinned": pinned})
        children.expect(30, "ready")
        if pinned:
            pin(0)
        publisher = peer.publisher()
        publisher.wait_for_subscribers(1, 10)
        send, clock, sleep, pack, timer = publisher.send, time.monotonic_ns, time.sleep, STAMP.pack, time.perf_counter_ns
        padding = bytes(size - STAMP.size)
        period_ns = int(period_s * NS)
        next_send = clock() + period_ns
        send_ns = []
        for sequence in range(warmup + samples):
            remaining = next_send - clock()
            if remaining > 0:
                sleep(remaining / NS)
            stamp = clock()
            # A late wake-up delays the next message rather than sending two back to back.
            next_send = stamp + period_ns
            message = pack(sequence, stamp) + padding
            began = timer()
            send(message)
            send_ns.append(timer() - began)
        sleep(period_s)
        send(pack(STOP_SEQUENCE, warmup) + padding)
        (result,) = children.expect(30, "result")
        publisher.close()
        emit({"latency": result, "sent": warmup + samples, "send_ns": send_ns[warmup:]})
    finally:
        if children:
            children.stop()
        peer.teardown()


# -- pingpong ------------------------------------------------------------------------


def pin(core: int) -> None:
    """Run this process on ``core`` alone (cores 0 and 1 on a 2-core machine)."""
    if len(os.sched_getaffinity(0)) >= 2:
        os.sched_setaffinity(0, {core})


def pong(peer: Any, index: int, link: Any, back: Any, warmup: int) -> None:
    """The far side of the ping-pong: echo every message until one of another
    size; its CPU and wall time from the end of the warm-up to that one."""
    pin(1)
    inbox = peer.subscriber(0)
    link.send("ready")
    assert link.recv() == "go"
    outbox = back.publisher()
    outbox.wait_for_subscribers(1, 10)
    link.send("ready")
    size, echoed, began = None, 0, (time.process_time_ns(), time.perf_counter_ns())
    while (message := inbox.receive()) is not None:
        if size is not None and len(message) != size:
            break
        size = len(message)
        outbox.send(message)
        echoed += 1
        if echoed == warmup:
            began = (time.process_time_ns(), time.perf_counter_ns())
    link.send({"echoed": echoed, "cpu_ns": time.process_time_ns() - began[0], "wall_ns": time.perf_counter_ns() - began[1]})
    inbox.close()
    outbox.close()


def pingpong(size: int, warmup: int, trips: int, **peer_args: Any) -> None:
    there, back = make_peer(peer_args, size, "_there"), make_peer(peer_args, size, "_back")
    there.setup(1)
    back.setup(1)
    children = None
    try:
        children = Children(pong, 1, there, {"back": back, "warmup": warmup})
        children.expect(30, "ready")
        pin(0)
        inbox = back.subscriber(0)
        outbox = there.publisher()
        children.links[0][1].send("go")  # both subscribers exist: the publishers may connect
        outbox.wait_for_subscribers(1, 10)
        children.expect(30, "ready")
        send, receive, clock = outbox.send, inbox.receive, time.perf_counter_ns
        message = bytes(size)
        trips_ns = []
        for trip in range(warmup + trips):
            if trip == warmup:
                cpu_began, wall_began = time.process_time_ns(), clock()
            began = clock()
            send(message)
            answer = receive()
            trips_ns.append(clock() - began)
            if answer is None or len(answer) != size:
                raise RuntimeError(f"{PEER}: the ping-pong answer was {answer!r:.40}")
        cpu_ns, wall_ns = time.process_time_ns() - cpu_began, clock() - wall_began
        send(b"\0")
        (result,) = children.expect(30, "result")
        inbox.close()
        outbox.close()
        emit({"pingpong": {
            "one_way_ns": [ns / 2 for ns in trips_ns[warmup:]], "echoed": result["echoed"],
            "ping_cpu_ns": cpu_ns, "ping_wall_ns": wall_ns, "pong_cpu_ns": result["cpu_ns"], "pong_wall_ns": result["wall_ns"],
        }})
    finally:
        if children:
            children.stop()
        there.teardown()
        back.teardown()


# -- fanout and frames --------------------------------------------------------------


def stream_subscriber(peer, index: int, link, size: int, rounds: int, frames: bool) -> None:
    """Receive ``rounds`` rounds, each up to the stop message (or, for a lossy
    peer that dropped it, until the idle timeout once something came)."""
    subscriber = peer.subscriber(index)
    link.send("ready")
    clock = time.monotonic_ns
    receive = subscriber.receive
    receive_frame = subscriber.receive_frame
    for _ in range(rounds):
        count = mark_count = mark_ns = idle = 0
        stopped, times, expected, gaps, checksum = False, [], 0, 0, 0
        while True:
            if frames:
                array, release = receive_frame()
                data = array
            else:
                data = receive()
            if data is None:
                if count or idle >= 10:
                    break
                idle += 1
                continue
            if len(data) != size:
                mark_count, mark_ns, stopped = count, clock(), True
                if frames:
                    del array, data
                    if release:
                        release()
                break
            count += 1
            if frames:
                now = clock()
                # Read the header and the last byte through the array.
                sequence = int(array[:8].view(numpy.uint64)[0])
                checksum ^= int(array[-1])
                del array, data
                if release:
                    release()
                times.append(now)
                gaps += sequence - expected
                expected = sequence + 1
                mark_count, mark_ns = count, now
            elif not count & 63:
                mark_count, mark_ns = count, clock()
        link.send(
            {
                "count": count,
                "mark_count": mark_count,
                "mark_ns": mark_ns,
                "stopped": stopped,
                "lost": subscriber.lost,
                "frame_ns": times,
                "lost_by_sequence": gaps,
            }
        )
    subscriber.close()


def stream(kind: str, subscribers: int, size: int, duration_s: float, warmup_s: float, repeats: int, **peer_args):
    frames = kind == "frames"
    peer = make_peer(peer_args, size)
    peer.setup(subscribers)
    children = None
    rounds = []
    try:
        children = Children(
            stream_subscriber, subscribers, peer, {"size": size, "rounds": 1 + repeats, "frames": frames}
        )
        children.expect(30, "ready")
        publisher = peer.publisher()
        publisher.wait_for_subscribers(subscribers, 10)
        clock = time.monotonic_ns
        payload = bytes(size)
        source = numpy.random.default_rng(1).integers(0, 256, size, dtype=numpy.uint8)
        for round_index in range(1 + repeats):
            duration_ns = int((warmup_s if round_index == 0 else duration_s) * NS)
            sent = 0
            if frames:
                send_frame = publisher.send_frame
                start = clock()
                end = start + duration_ns
                while True:
                    send_frame(source, STAMP.pack(sent, clock()))
                    sent += 1
                    if clock() >= end:
                        break
            else:
                send = publisher.send
                start = clock()
                end = start + duration_ns
                while True:
                    for _ in range(64):
                        send(payload)
                    sent += 64
                    if clock() >= end:
                        break
            stopped_ns = clock()
            publisher.send(STOP_MESSAGE)
            received = children.expect(60 + 4 * duration_ns / NS, "round result")
            rounds.append({"start_ns": start, "publisher_ns": stopped_ns - start, "sent": sent, "subscribers": received})
        retries = getattr(publisher, "allocate_retries", 0)
        publisher.close()
        # Round 0, the warm-up, is the first pass over fresh buffers: reported apart.
        emit({kind: {"first_round": rounds[0], "rounds": rounds[1:], "allocate_retries": retries, "lossy": peer.lossy}})
    finally:
        if children:
            children.stop()
        peer.teardown()


def fanout(**args) -> None:
    stream("fanout", **args)


def frames(**args) -> None:
    stream("frames", subscribers=1, **args)


# -- scaling -----------------------------------------------------------------------


def timed_sends(send, payload, batches: int, batch: int) -> list:
    clock = time.perf_counter_ns
    sends = range(batch)
    spans = [0] * batches
    for index in range(batches):
        start = clock()
        for _ in sends:
            send(payload)
        spans[index] = clock() - start
    return spans


def scaling(
    rings: list, sizes: list, repeats: int, warmup_s: float, repeat_s: float, batch: int, shm_name: str, config: dict,
    idle_s: float, **_unused,
) -> None:
    assert kickmsg is not None, "scaling is measured for the kickmsg peers only"
    results = {}
    for ring_count in rings:
        peer = peers.KickmsgPeer(
            PEER, kickmsg, f"{shm_name}_{ring_count}", dict(config, max_subscribers=ring_count), idle_s
        )
        peer.setup(ring_count)
        try:
            subscribers = [peer.subscriber(index) for index in range(ring_count)]
            publisher = peer.publisher()
            send = publisher.send
            for size in sizes:
                payload = (bytes(range(256)) * (size // 256 + 1))[:size]
                # Wrap every ring first (the steady state), then calibrate as in inproc.
                timed_sends(send, payload, 2 * config["sub_ring_capacity"] // batch + 1, batch)
                batches, done, spent = 2, 0, 0
                while spent < warmup_s * NS:
                    spent += sum(timed_sends(send, payload, batches, batch))
                    done += batches
                    batches *= 2
                per_repeat = max(5, int(repeat_s * NS * done / spent))
                runs = [timed_sends(send, payload, per_repeat, batch) for _ in range(repeats)]
                results.setdefault(str(ring_count), {})[str(size)] = {"batch": batch, "batch_ns_runs": runs}
            for subscriber in subscribers:
                subscriber.close()
            publisher.close()
            del subscribers, publisher, send
        finally:
            peer.teardown()
    emit({"scaling": results})


if __name__ == "__main__":
    {"inproc": inproc, "latency": latency, "pingpong": pingpong, "fanout": fanout, "frames": frames, "scaling": scaling}[MODE](**ARGS)
