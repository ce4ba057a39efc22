"""`make demo`: the whole pipeline, live channels to a Spark report.

As separate processes, for about ten seconds:
  - an IMU publisher at 1 kHz: typed records stamped with their publish time;
  - a camera publisher at 30 Hz: 640x480x3 frames written in place in the
    slots (zero-copy), stamped too;
  - a fast subscriber and a deliberately slow one (it loses messages: its
    ring overflows, nobody else notices);
  - the recorder, writing both channels to Parquet (sizes and stamps; the
    frames themselves are not kept).
Meanwhile this process prints live per-channel figures. Then a local Spark
job analyses the recording (rates, inter-arrival, losses, sizes, end-to-end
latency from the stamps) and writes an HTML report with plots.

Run it:  python examples/demo.py [--seconds 10] [--out demo-output]
Nothing is left in /dev/shm afterwards, even after Ctrl-C (at any moment:
exit status 130, no traceback).
"""
import os
import signal


def exit_at_once(number, frame) -> None:
    """Ctrl-C where there is nothing to clean up (the imports, the end): status 130, quietly."""
    os._exit(130)


if __name__ == "__main__":  # first, before the imports below (the children import this module too)
    signal.signal(signal.SIGINT, exit_at_once)

import argparse
import contextlib
import multiprocessing
import shutil
import sys
import time

import numpy as np

import kickmsg
from kickmsg import typed
from kickmsg.recording import stamp
from kickmsg.recording.record import Recorder

Imu = typed.RecordType("Imu", [stamp.FIELD, ("accel", "<f4", (3,)), ("gyro", "<f4", (3,))])
FRAME_SHAPE = (480, 640, 3)
FRAME_BYTES = int(np.prod(FRAME_SHAPE))
CHANNELS = {  # topic: (rate in Hz, config)
    "imu": (1000, kickmsg.Config(max_subscribers=4, sub_ring_capacity=256, pool_size=1024,
                                 max_payload_size=Imu.dtype.itemsize, schema=Imu.schema)),
    "camera": (30, kickmsg.Config(max_subscribers=4, sub_ring_capacity=8, pool_size=40, max_payload_size=FRAME_BYTES)),
}


def paced(rate_hz: float, stop):
    """Yield 0, 1, 2, ... at ``rate_hz`` until ``stop`` is set."""
    began, index = time.monotonic(), 0
    while not stop.is_set():
        time.sleep(max(0.0, began + index / rate_hz - time.monotonic()))
        yield index
        index += 1


def imu_publisher(prefix: str, ready, stop) -> None:
    publisher = typed.TypedPublisher(kickmsg.Node("imu", prefix=prefix).advertise_or_join("imu", CHANNELS["imu"][1]), Imu)
    ready.release()
    for i in paced(CHANNELS["imu"][0], stop):
        publisher.send((stamp.now(), (0.01 * np.sin(i / 100), 0.0, 9.81), (0.0, 0.0, 0.001 * i)))


def camera_publisher(prefix: str, ready, stop) -> None:
    publisher = kickmsg.Node("camera", prefix=prefix).advertise_or_join("camera", CHANNELS["camera"][1])
    ready.release()
    gradient = np.linspace(0, 255, FRAME_SHAPE[1], dtype=np.uint8)
    for i in paced(CHANNELS["camera"][0], stop):
        slot = publisher.allocate(FRAME_BYTES)
        if slot is None:  # every slot still held: skip this frame
            continue
        buffer = memoryview(slot)
        frame = np.frombuffer(buffer, dtype=np.uint8).reshape(FRAME_SHAPE)
        frame[:, :, 0] = gradient
        frame[:, :, 1] = i % 256
        frame[:, :, 2] = 255 - gradient
        stamp.write(buffer)  # the first 8 bytes: the publish time
        del frame, buffer  # no buffer of the slot may outlive its publication
        slot.publish()


def subscriber(prefix: str, topic: str, pause_s: float, counts, ready, stop) -> None:
    """Receive (zero-copy) and count; the slow one naps after each message."""
    with kickmsg.Node(f"{topic}-reader", prefix=prefix).subscribe(topic) as sub:
        ready.release()
        while not stop.is_set():
            view = sub.receive_view(0.1)
            if view is None:
                continue
            view.release()
            counts[0] += 1
            counts[1] = sub.lost
            if pause_s:
                time.sleep(pause_s)


def recorder(prefix: str, out: str, ready, stop, result) -> None:
    names = [f"/{prefix}_{topic}" for topic in CHANNELS]
    rec = Recorder(names, out, payload=False)
    ready.release()
    summary = rec.run(stop=stop)  # until the live part ends
    result.put({name: (c.messages, c.lost) for name, c in summary.channels.items()})


@contextlib.contextmanager
def ctrl_c_held():
    """Ctrl-C waits until the block ends: children started in it inherit
    SIGINT blocked (the parent stops them through `stop`), and a cleanup in
    it completes."""
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=10.0, help="how long the live part runs (default 10)")
    parser.add_argument("--out", default="demo-output", help="directory for the recording and the report")
    args = parser.parse_args()
    recording = os.path.join(args.out, "recording")
    signal.signal(signal.SIGINT, signal.default_int_handler)  # from here Ctrl-C is a KeyboardInterrupt
    try:
        run_live(args.seconds, recording)
        analyse(args.out, recording)
    except KeyboardInterrupt:
        signal.signal(signal.SIGINT, exit_at_once)
        print("\ninterrupted", file=sys.stderr)
        sys.exit(130)
    signal.signal(signal.SIGINT, exit_at_once)


def run_live(seconds: float, recording: str) -> None:
    """The processes publish, receive and record for ``seconds``; their
    channels are removed however it ends."""
    prefix = f"kmdemo{os.getpid()}"
    shutil.rmtree(recording, ignore_errors=True)
    node = kickmsg.Node("demo", prefix=prefix)
    context = multiprocessing.get_context("spawn")
    stop, ready, result = context.Event(), context.Semaphore(0), context.Queue()
    counts = {
        (topic, speed): context.Array("q", 2)  # received, lost
        for topic in CHANNELS for speed in ("fast", "slow")
    }
    readers = [
        context.Process(target=subscriber, args=(prefix, topic, 0.02 if speed == "slow" else 0, counts[topic, speed], ready, stop))
        for topic, speed in counts
    ]
    rec = context.Process(target=recorder, args=(prefix, recording, ready, stop, result))
    publishers = [context.Process(target=imu_publisher, args=(prefix, ready, stop)),
                  context.Process(target=camera_publisher, args=(prefix, ready, stop))]
    processes = readers + [rec] + publishers
    try:
        for topic, (_, config) in CHANNELS.items():
            node.advertise(topic, config)
        with ctrl_c_held():
            for process in readers + [rec]:
                process.start()
        for _ in readers + [rec]:
            ready.acquire(timeout=60)
        with ctrl_c_held():
            for process in publishers:
                process.start()
        for _ in publishers:  # the clock starts once both publish
            ready.acquire(timeout=60)
        print(f"live for {seconds:g} s: IMU 1 kHz typed records, camera 30 Hz 640x480x3 frames written in place")
        print(f"{'t':>4}  {'channel':<7} {'fast: received':>15} {'lost':>5}   {'slow: received':>15} {'lost':>6}")
        began = time.monotonic()
        while time.monotonic() - began < seconds:
            time.sleep(1)
            for topic in CHANNELS:
                (fast_received, fast_lost), (slow_received, slow_lost) = counts[topic, "fast"], counts[topic, "slow"]
                print(f"{time.monotonic() - began:>3.0f}s  {topic:<7} {fast_received:>15} {fast_lost:>5}"
                      f"   {slow_received:>15} {slow_lost:>6}", flush=True)
        stop.set()
        recorded = result.get(timeout=60)
        for name, (messages, lost) in recorded.items():
            print(f"recorded {name}: {messages} messages, lost {lost}")
    finally:
        with ctrl_c_held():
            stop.set()
            for process in processes:
                if process.pid is not None:  # started
                    process.join(timeout=10)
                    if process.is_alive():
                        process.kill()
            for topic in CHANNELS:
                node.unlink_topic(topic)
            kickmsg.Registry.unlink(prefix)  # the namespace's participant registry (layout 9's nodes list themselves)


def analyse(out: str, recording: str) -> None:
    """A local Spark job: the figures, and the HTML report with plots."""
    print("\nanalysing the recording with Spark (local mode) ...", flush=True)
    from kickmsg.spark import analysis

    report = os.path.join(out, "report.html")
    results = analysis.run([recording], master="local[2]", json_path=os.path.join(out, "analysis.json"),
                           html_path=report)
    print(analysis.format_table(results))
    print(f"\nreport: {os.path.abspath(report)}")


if __name__ == "__main__":
    main()
