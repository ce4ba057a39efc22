"""The benchmark peers behind one small interface, for core_worker.py.

A peer is one way of moving messages between Python code:

  ours      this package (kickmsg/, pure Python)
  native    the native kickmsg 0.1.0 binding (same API, other process only)
  mp_pipe   multiprocessing.Pipe(duplex=False), one pipe per subscriber
  mp_queue  multiprocessing.Queue, one queue per subscriber
  zmq       pyzmq XPUB -> SUB over the ipc:// transport

Life cycle, the same for every peer (see core_worker.py):

  1. ``setup()`` in the benchmark process, before any fork: creates what the
     children must inherit or open (the kickmsg region, the pipes or queues,
     the ipc endpoint name).
  2. ``subscriber(index)`` in each subscriber process (a fork of 1.) or in the
     benchmark process itself for in-process runs.
  3. ``publisher()`` in the benchmark process, after the forks (a zmq context
     must not cross a fork), then ``publisher.wait_for_subscribers(count)``.
  4. ``teardown()`` in the benchmark process, always (unlinks the region,
     removes the ipc socket file).

Each end exposes the operations the benchmarks time, as plain bound methods
where possible so no wrapper call is timed:

  publisher.send(buffer)        copy one message out (to every subscriber)
  publisher.send_frame(source, header)
                                produce a frame by copying ``source`` (a numpy
                                uint8 array) into the buffer that is sent, with
                                ``header`` (bytes) written over its start, and
                                send it; for kickmsg the buffer is the
                                allocated slot (published in place)
  subscriber.receive()          blocking receive -> bytes, None after the
                                peer's ``idle_s`` (kickmsg, zmq; the pipe and
                                the queue block until data comes)
  subscriber.try_receive()      non-blocking -> bytes or None
  subscriber.inproc_receive()   the receive of the in-process benchmark:
                                try_receive for kickmsg; the blocking receive
                                for the others, whose delivery is asynchronous
                                (queue feeder thread, 0MQ I/O thread)
  subscriber.receive_frame()    blocking -> (numpy uint8 array over the received
                                frame, release callable), or (None, None);
                                kickmsg returns a view over the slot (no copy)
"""
import functools
import multiprocessing
import os
import pathlib
import queue as queue_module
import time

import numpy

class KickmsgPeer:
    """``ours`` or ``native``: ``module`` is the imported kickmsg; ``config``
    the Config fields that differ from the defaults; a blocking receive gives
    up after ``idle_s``."""

    lossy = True  # a ring overwrites its oldest entry when a subscriber lags

    def __init__(self, name: str, module, shm_name: str, config: dict, idle_s: float):
        self.name, self.kickmsg, self.shm_name, self.config = name, module, shm_name, config
        self.idle_s = idle_s
        self.region = None

    def make_config(self):
        cfg = self.kickmsg.Config()
        for field, value in self.config.items():
            setattr(cfg, field, value)
        return cfg

    def setup(self, subscribers: int) -> None:
        self.region = self.kickmsg.SharedRegion.create(
            self.shm_name, self.kickmsg.ChannelType.PubSub, self.make_config(), "kmbench"
        )
        self.owner_pid = os.getpid()

    def teardown(self) -> None:
        if self.region is not None:
            self.region.unlink()
            self.region = None

    def _region(self):
        # A child opens the channel by name, as any other process would.
        return self.region if os.getpid() == self.owner_pid else self.kickmsg.SharedRegion.open(self.shm_name)

    def subscriber(self, index: int) -> "KickmsgSubscriber":
        return KickmsgSubscriber(self.kickmsg.Subscriber(self._region()), self.idle_s)

    def publisher(self) -> "KickmsgPublisher":
        return KickmsgPublisher(self.kickmsg.Publisher(self._region()))


class KickmsgPublisher:
    def __init__(self, publisher):
        self.publisher = publisher
        self.send = publisher.send
        self.allocate_retries = 0

    def wait_for_subscribers(self, count: int, timeout_s: float) -> None:
        pass  # the subscribers joined their rings before reporting ready

    def send_frame(self, source: numpy.ndarray, header: bytes) -> None:
        while (slot := self.publisher.allocate(source.nbytes)) is None:
            self.allocate_retries += 1  # every slot in use: try again
        view = memoryview(slot)
        numpy.copyto(numpy.frombuffer(view, numpy.uint8), source)
        view[: len(header)] = header
        view.release()
        slot.publish()

    def close(self) -> None:
        del self.publisher, self.send


class KickmsgSubscriber:
    def __init__(self, subscriber, idle_s: float):
        self.subscriber, self.idle_s = subscriber, idle_s
        self.try_receive = self.inproc_receive = subscriber.try_receive
        self.receive = functools.partial(subscriber.receive, idle_s)
        self._receive_view = subscriber.receive_view

    def receive_frame(self):
        view = self._receive_view(self.idle_s)
        if view is None:
            return None, None
        return numpy.frombuffer(view, numpy.uint8), view.release

    @property
    def lost(self) -> int:
        return self.subscriber.lost

    def close(self) -> None:
        close = getattr(self.subscriber, "close", None)  # the native one leaves on deallocation
        if close:
            close()
        del self.subscriber, self.try_receive, self.inproc_receive, self.receive, self._receive_view


class PipePeer:
    """``multiprocessing.Pipe(duplex=False)`` (an os.pipe): one per subscriber,
    the publisher writes each message to all of them in turn."""

    name = "mp_pipe"
    lossy = False  # a full pipe blocks the writer
    idle_s = None  # the receive blocks until data comes

    def setup(self, subscribers: int) -> None:
        self.pipes = [multiprocessing.Pipe(duplex=False) for _ in range(subscribers)]  # (reader, writer)

    def teardown(self) -> None:
        for reader, writer in getattr(self, "pipes", []):
            reader.close()
            writer.close()

    def subscriber(self, index: int) -> "PipeSubscriber":
        return PipeSubscriber(self.pipes[index][0])

    def publisher(self) -> "PipePublisher":
        return PipePublisher([writer for _, writer in self.pipes])


class PipePublisher:
    def __init__(self, writers):
        self.writers = writers
        if len(writers) == 1:
            self.send = writers[0].send_bytes
        self.frame_buffer = None

    def send(self, data) -> None:
        for writer in self.writers:
            writer.send_bytes(data)

    def send_frame(self, source: numpy.ndarray, header: bytes) -> None:
        # One reusable send buffer: send_bytes returns once the kernel has it all.
        if self.frame_buffer is None or self.frame_buffer.nbytes != source.nbytes:
            self.frame_buffer = numpy.empty_like(source)
        numpy.copyto(self.frame_buffer, source)
        self.frame_buffer[: len(header)] = numpy.frombuffer(header, numpy.uint8)
        for writer in self.writers:
            writer.send_bytes(self.frame_buffer)

    def wait_for_subscribers(self, count: int, timeout_s: float) -> None:
        pass

    def close(self) -> None:
        pass


class PipeSubscriber:
    lost = 0

    def __init__(self, reader):
        self.reader = reader
        self.receive = self.inproc_receive = reader.recv_bytes

    def try_receive(self):
        return self.reader.recv_bytes() if self.reader.poll() else None

    def receive_frame(self):
        return numpy.frombuffer(self.reader.recv_bytes(), numpy.uint8), None

    def close(self) -> None:
        pass


class QueuePeer:
    """``multiprocessing.Queue(maxsize)``: one per subscriber; ``put`` hands the
    object to a feeder thread that pickles it into a pipe."""

    name = "mp_queue"
    lossy = False  # a full queue blocks put()
    idle_s = None  # the receive blocks until data comes

    def __init__(self, maxsize: int):
        self.maxsize = maxsize

    def setup(self, subscribers: int) -> None:
        self.queues = [multiprocessing.Queue(self.maxsize) for _ in range(subscribers)]

    def teardown(self) -> None:
        for queue in getattr(self, "queues", []):
            queue.close()
            queue.cancel_join_thread()

    def subscriber(self, index: int) -> "QueueSubscriber":
        return QueueSubscriber(self.queues[index])

    def publisher(self) -> "QueuePublisher":
        return QueuePublisher(self.queues)


class QueuePublisher:
    def __init__(self, queues):
        self.queues = queues

    def send(self, data) -> None:
        # put() pickles later, in the feeder thread: hand it an immutable
        # message (bytes(b) is b itself when b is already bytes).
        data = bytes(data)
        for queue in self.queues:
            queue.put(data)

    def send_frame(self, source: numpy.ndarray, header: bytes) -> None:
        # A fresh array per frame: the feeder thread pickles it later.
        frame = source.copy()
        frame[: len(header)] = numpy.frombuffer(header, numpy.uint8)
        for queue in self.queues:
            queue.put(frame)

    def wait_for_subscribers(self, count: int, timeout_s: float) -> None:
        pass

    def close(self) -> None:
        pass


class QueueSubscriber:
    lost = 0

    def __init__(self, queue):
        self.queue = queue
        self.receive = self.inproc_receive = queue.get

    def try_receive(self):
        try:
            return self.queue.get_nowait()
        except queue_module.Empty:
            return None

    def receive_frame(self):
        return self.queue.get(), None  # unpickled: already a numpy array

    def close(self) -> None:
        pass


class ZmqPeer:
    """pyzmq XPUB (bound) -> SUB (connected) over ``ipc://``; send and receive
    high-water marks ``hwm`` (PUB drops what exceeds it, as 0MQ does)."""

    name = "zmq"
    lossy = True

    def __init__(self, socket_path: str, hwm: int, idle_s: float):
        import zmq

        self.zmq, self.socket_path, self.hwm, self.idle_s = zmq, socket_path, hwm, idle_s
        self.endpoint = f"ipc://{socket_path}"

    def setup(self, subscribers: int) -> None:
        pathlib.Path(self.socket_path).unlink(missing_ok=True)

    def teardown(self) -> None:
        pathlib.Path(self.socket_path).unlink(missing_ok=True)

    def _context(self):
        # One context per process, made after any fork.
        if getattr(self, "_context_pid", None) != os.getpid():
            self._context_object = self.zmq.Context()
            self._context_pid = os.getpid()
        return self._context_object

    def subscriber(self, index: int) -> "ZmqSubscriber":
        zmq = self.zmq
        socket = self._context().socket(zmq.SUB)
        socket.setsockopt(zmq.RCVHWM, self.hwm)
        socket.setsockopt(zmq.RCVTIMEO, int(self.idle_s * 1000))
        socket.setsockopt(zmq.RECONNECT_IVL, 10)  # the publisher may bind after we connect
        socket.setsockopt(zmq.LINGER, 0)
        socket.setsockopt(zmq.SUBSCRIBE, b"")
        socket.connect(self.endpoint)
        return ZmqSubscriber(zmq, socket)

    def publisher(self) -> "ZmqPublisher":
        zmq = self.zmq
        socket = self._context().socket(zmq.XPUB)
        socket.setsockopt(zmq.SNDHWM, self.hwm)
        socket.setsockopt(zmq.XPUB_VERBOSE, 1)  # one subscription message per subscriber
        socket.setsockopt(zmq.LINGER, 0)
        socket.bind(self.endpoint)
        return ZmqPublisher(zmq, socket)


class ZmqPublisher:
    def __init__(self, zmq, socket):
        self.zmq, self.socket = zmq, socket
        self.send = socket.send

    def wait_for_subscribers(self, count: int, timeout_s: float) -> None:
        """Wait for ``count`` subscriptions, so no message is sent before the
        subscribers listen (0MQ's "slow joiner")."""
        deadline = time.monotonic() + timeout_s
        seen = 0
        while seen < count:
            remaining_ms = int((deadline - time.monotonic()) * 1000)
            if remaining_ms <= 0 or not self.socket.poll(remaining_ms):
                raise RuntimeError(f"zmq: {seen} of {count} subscriptions arrived")
            if self.socket.recv()[:1] == b"\x01":
                seen += 1

    def send_frame(self, source: numpy.ndarray, header: bytes) -> None:
        # A fresh array per frame, sent without a copy (0MQ keeps a reference).
        frame = source.copy()
        frame[: len(header)] = numpy.frombuffer(header, numpy.uint8)
        self.socket.send(frame, copy=False)

    def close(self) -> None:
        self.socket.close(linger=0)


class ZmqSubscriber:
    lost = 0  # 0MQ does not tell; the benchmarks count by sequence

    def __init__(self, zmq, socket):
        self.zmq, self.socket = zmq, socket
        self._recv = self.inproc_receive = socket.recv

    def receive(self):
        try:
            return self._recv()
        except self.zmq.Again:
            return None

    def try_receive(self):
        try:
            return self._recv(self.zmq.NOBLOCK)
        except self.zmq.Again:
            return None

    def receive_frame(self):
        try:
            frame = self._recv(copy=False)
        except self.zmq.Again:
            return None, None
        return numpy.frombuffer(frame.buffer, numpy.uint8), None

    def close(self) -> None:
        self.socket.close(linger=0)
