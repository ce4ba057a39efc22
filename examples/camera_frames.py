"""Camera frames through shared memory, with no copy on either side.

A camera process fills 640x480 RGB frames directly inside pool slots
(``allocate`` + a numpy view of the slot) and publishes them; a viewer
process receives each frame as a read-only numpy array over the same slot
(``receive_view`` + ``numpy.asarray``). Run it:  python examples/camera_frames.py
"""
import multiprocessing
import os

import numpy as np

import kickmsg

HEIGHT, WIDTH, CHANNELS = 480, 640, 3
FRAME_BYTES = HEIGHT * WIDTH * CHANNELS
FRAMES = 60


def camera(channel, ready) -> None:
    """Paint each frame in place: a gradient, and the frame number in pixel (0, 0)."""
    publisher = kickmsg.Publisher(kickmsg.SharedRegion.open(channel))
    ready.wait()
    gradient = np.linspace(0, 255, WIDTH, dtype=np.uint8)
    frame_number = 0
    while frame_number < FRAMES:
        slot = publisher.allocate(FRAME_BYTES)
        if slot is None:  # every slot is still held by the viewer: try again
            continue
        frame = np.frombuffer(memoryview(slot), dtype=np.uint8).reshape(HEIGHT, WIDTH, CHANNELS)
        frame[:, :, 0] = gradient
        frame[:, :, 1] = frame_number
        frame[:, :, 2] = 255 - gradient
        frame[0, 0, :] = frame_number
        del frame  # the buffer must be released before the next allocate
        slot.publish()
        frame_number += 1


def viewer(channel, results, ready) -> None:
    """Receive frames as arrays over the slots and check what was painted."""
    subscriber = kickmsg.Subscriber(kickmsg.SharedRegion.open(channel))
    ready.set()
    seen = []
    while len(seen) + subscriber.lost < FRAMES:
        view = subscriber.receive_view(timeout=5.0)
        if view is None:
            break
        with view:
            frame = np.asarray(view).reshape(HEIGHT, WIDTH, CHANNELS)
            assert not frame.flags.writeable and not frame.flags.owndata  # a view, not a copy
            number = int(frame[0, 0, 0])
            assert (frame[1:, :, 1] == number).all()
            seen.append(number)
            del frame
    results.put((seen, subscriber.lost))


def main() -> None:
    channel = f"/kickmsg_example_camera_{os.getpid()}"
    config = kickmsg.Config(max_subscribers=2, sub_ring_capacity=4, pool_size=12, max_payload_size=FRAME_BYTES)
    kickmsg.SharedRegion.create(channel, kickmsg.ChannelType.PubSub, config, "camera-example")
    context = multiprocessing.get_context("spawn")
    results, ready = context.Queue(), context.Event()
    processes = [
        context.Process(target=viewer, args=(channel, results, ready)),
        context.Process(target=camera, args=(channel, ready)),
    ]
    try:
        for process in processes:
            process.start()
        seen, lost = results.get(timeout=60)
        print(f"viewer got {len(seen)} frames of {WIDTH}x{HEIGHT}x{CHANNELS} in place, lost {lost}; in order: {seen == sorted(seen)}")
    finally:
        for process in processes:
            process.join(timeout=10)
            if process.is_alive():
                process.kill()
        kickmsg.unlink_shm(channel)


if __name__ == "__main__":
    main()
