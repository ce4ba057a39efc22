"""The benchmark peers behind one small interface, for core_worker.py.

A peer is one way of moving messages between Python code:

  ours      this package (kickmsg/, pure Python), layout-4 channels
  native    the native kickmsg 0.1.0 binding (layout 4; same API, other process only)
  ours9     this package on layout-9 channels
  native9   the native kickmsg 0.9.2 binding (layout 9; other process only)
  mp_pipe   multiprocessing.Pipe(duplex=False), one pipe per subscriber
  mp_queue  multiprocessing.Queue, one queue per subscriber
  zmq       pyzmq XPUB -> SUB over the ipc:// transport
  faster_fifo  faster_fifo.Queue, one per subscriber
  iceoryx2  iceoryx2's publish-subscribe (Python binding), zero-copy loans
  zenoh     eclipse-zenoh, peer mode on 127.0.0.1, shared memory for 4 KB+

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
import ctypes
import functools
import json
import multiprocessing
import os
import pathlib
import queue as queue_module
import time
from typing import Any

import numpy

class KickmsgPeer:
    """``ours``, ``native``, ``ours9`` or ``native9``: ``module`` is the
    imported kickmsg; ``config`` the Config fields that differ from the
    defaults; a blocking receive gives up after ``idle_s``."""

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
        return KickmsgPublisher(self.kickmsg.Publisher(self._region()), sized=self.name in ("ours", "native"))


class KickmsgPublisher:
    """``sized``: allocate in 0.1.0's form, ``allocate(len)`` then
    ``publish()``; else in 0.9.2's, ``allocate()`` (a buffer of
    max_payload_size, the frame's size here) then ``publish(len)``."""

    def __init__(self, publisher, sized: bool):
        self.publisher = publisher
        self.send = publisher.send
        self.sized = sized
        self.allocate_retries = 0

    def wait_for_subscribers(self, count: int, timeout_s: float) -> None:
        pass  # the subscribers joined their rings before reporting ready

    def send_frame(self, source: numpy.ndarray, header: bytes) -> None:
        allocate, size = self.publisher.allocate, source.nbytes
        while (slot := allocate(size) if self.sized else allocate()) is None:
            self.allocate_retries += 1  # every slot in use: try again
        view = memoryview(slot)
        numpy.copyto(numpy.frombuffer(view, numpy.uint8)[:size], source)
        view[: len(header)] = header
        view.release()
        if self.sized:
            slot.publish()
        else:
            slot.publish(size)

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


class FasterFifoPeer:
    """``faster_fifo.Queue``: one per subscriber, ``max_size_bytes`` room for
    ``depth`` messages of ``size`` bytes (pickled, as ``put`` does by default)."""

    name = "faster_fifo"
    lossy = False  # a full queue blocks put()
    idle_s = None  # the receive blocks until data comes

    def __init__(self, depth: int, size: int) -> None:
        self.capacity = max(1 << 20, depth * (size + 256))

    def setup(self, subscribers: int) -> None:
        import faster_fifo

        self.queues: list[Any] = [faster_fifo.Queue(max_size_bytes=self.capacity) for _ in range(subscribers)]

    def teardown(self) -> None:
        for queue in getattr(self, "queues", []):
            queue.close()

    def subscriber(self, index: int) -> "FasterFifoSubscriber":
        return FasterFifoSubscriber(self.queues[index])

    def publisher(self) -> "QueuePublisher":
        return QueuePublisher(self.queues)  # the same puts as mp.Queue's


class FasterFifoSubscriber:
    lost = 0

    def __init__(self, queue: Any) -> None:
        self.queue = queue
        self.receive = self.inproc_receive = functools.partial(queue.get, True, 3600.0)

    def try_receive(self) -> Any:
        try:
            return self.queue.get_nowait()
        except queue_module.Empty:
            return None

    def receive_frame(self) -> tuple[Any, None]:
        return self.receive(), None  # unpickled: already a numpy array

    def close(self) -> None:
        pass


class Iceoryx2Peer:
    """iceoryx2 (Python binding) publish-subscribe of ``Slice[c_uint8]``, with an
    event service beside it for the blocking receive (the publisher notifies
    after each send; the subscriber waits on its listener when it finds no
    sample), as iceoryx2's event-based examples do. Zero-copy both ways: the
    publisher loans a sample and writes into it, the subscriber reads the
    sample in place. Subscriber buffer ``depth``, no history, the default
    safe overflow (a full buffer drops its oldest sample, like a kickmsg
    ring). Its files carry ``prefix`` (under /dev/shm) and live under
    ``root`` (/tmp)."""

    name = "iceoryx2"
    lossy = True

    def __init__(self, service: str, prefix: str, root: str, depth: int, size: int, idle_s: float) -> None:
        self.service, self.prefix, self.root = service, prefix, root
        self.depth, self.size, self.idle_s = depth, size, idle_s

    def setup(self, subscribers: int) -> None:
        self.subscribers = subscribers

    def teardown(self) -> None:
        pass  # bench_core removes the files by prefix

    def _services(self) -> tuple[Any, Any, Any]:
        """The node and both services, made once per process (after any fork)."""
        if getattr(self, "_pid", None) != os.getpid():
            import iceoryx2

            config = iceoryx2.config.default()
            config.global_cfg.prefix = iceoryx2.FileName.new(self.prefix)
            config.global_cfg.root_path = iceoryx2.Path.new(self.root)
            node = iceoryx2.NodeBuilder.new().config(config).create(iceoryx2.ServiceType.Ipc)
            name = iceoryx2.ServiceName.new(self.service)
            topic = (
                node.service_builder(name)
                .publish_subscribe(iceoryx2.Slice[ctypes.c_uint8])
                .max_subscribers(max(2, self.subscribers))
                .subscriber_max_buffer_size(self.depth)
                .history_size(0)
                .open_or_create()
            )
            events = node.service_builder(name).event().open_or_create()
            self._iceoryx2, self._node, self._topic, self._events = iceoryx2, node, topic, events
            self._pid = os.getpid()
        return self._iceoryx2, self._topic, self._events

    def subscriber(self, index: int) -> "Iceoryx2Subscriber":
        iceoryx2, topic, events = self._services()
        subscriber = topic.subscriber_builder().buffer_size(self.depth).create()
        return Iceoryx2Subscriber(iceoryx2, subscriber, events.listener_builder().create(), self.idle_s)

    def publisher(self) -> "Iceoryx2Publisher":
        iceoryx2, topic, events = self._services()
        publisher = (
            topic.publisher_builder()
            .initial_max_slice_len(self.size)
            .allocation_strategy(iceoryx2.AllocationStrategy.Static)
            .create()
        )
        return Iceoryx2Publisher(topic, publisher, events.notifier_builder().create())


class Iceoryx2Publisher:
    def __init__(self, topic: Any, publisher: Any, notifier: Any) -> None:
        self.topic, self.publisher, self.notifier = topic, publisher, notifier
        self._loan, self._notify = publisher.loan_slice_uninit, notifier.notify

    def send(self, data: bytes) -> None:
        sample = self._loan(len(data))
        ctypes.memmove(sample.payload_ptr, data, len(data))
        sample.assume_init().send()
        self._notify()

    def send_frame(self, source: numpy.ndarray, header: bytes) -> None:
        sample = self._loan(source.nbytes)
        view = numpy.frombuffer((ctypes.c_uint8 * source.nbytes).from_address(sample.payload_ptr), numpy.uint8)
        numpy.copyto(view, source)
        view[: len(header)] = numpy.frombuffer(header, numpy.uint8)
        del view
        sample.assume_init().send()
        self._notify()

    def wait_for_subscribers(self, count: int, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        while self.topic.dynamic_config.number_of_subscribers < count:
            if time.monotonic() > deadline:
                raise RuntimeError(f"iceoryx2: fewer than {count} subscribers after {timeout_s} s")
            time.sleep(0.01)
        self.publisher.update_connections()

    def close(self) -> None:
        self.notifier.delete()
        self.publisher.delete()


class Iceoryx2Subscriber:
    lost = 0  # iceoryx2 does not tell; the benchmarks count by sequence

    def __init__(self, iceoryx2: Any, subscriber: Any, listener: Any, idle_s: float) -> None:
        self.subscriber, self.listener = subscriber, listener
        self.wait = iceoryx2.Duration.from_secs_f64(idle_s)
        self.idle_s = idle_s

    def _sample(self) -> Any:
        """The next sample, waiting on the listener up to ``idle_s``; None then."""
        sample = self.subscriber.receive()
        deadline = None
        while sample is None:
            deadline = deadline or time.monotonic() + self.idle_s
            if time.monotonic() > deadline:
                return None
            self.listener.timed_wait(self.wait)
            sample = self.subscriber.receive()
        return sample

    def receive(self) -> bytes | None:
        sample = self._sample()
        if sample is None:
            return None
        data = ctypes.string_at(sample.payload_ptr, sample.header.number_of_elements)
        sample.delete()
        return data

    def try_receive(self) -> bytes | None:
        sample = self.subscriber.receive()
        if sample is None:
            return None
        data = ctypes.string_at(sample.payload_ptr, sample.header.number_of_elements)
        sample.delete()
        return data

    inproc_receive = try_receive  # delivery is synchronous (shared memory)

    def receive_frame(self) -> tuple[numpy.ndarray | None, Any]:
        sample = self._sample()
        if sample is None:
            return None, None
        length = sample.header.number_of_elements
        view = numpy.frombuffer((ctypes.c_uint8 * length).from_address(sample.payload_ptr), numpy.uint8)
        return view, sample.delete

    def close(self) -> None:
        self.listener.delete()
        self.subscriber.delete()


class ZenohPeer:
    """eclipse-zenoh in peer mode, multicast and gossip scouting off: each
    subscriber's session listens on its own TCP endpoint on 127.0.0.1
    (``ports[index]``), the publisher's session connects to all of them (one
    session per process, shared in-process). Shared memory on: payloads of
    ``shm_from`` bytes and more are written into a buffer of zenoh's
    ``ShmProvider`` and travel by shared memory; smaller ones are put as
    bytes. Reliable with ``CongestionControl.BLOCK`` (a full queue blocks the
    publisher), subscriber FIFO handler of ``depth``. The Python API has no
    buffer view of a zenoh buffer: the publisher copies from bytes into its
    SHM buffer, the subscriber copies out (``to_bytes``)."""

    name = "zenoh"
    lossy = False
    idle_s = None  # the receive blocks until data comes
    shm_from = 4096

    def __init__(self, key: str, ports: list[int], depth: int, size: int) -> None:
        self.key, self.ports, self.depth, self.size = key, ports, depth, size

    def setup(self, subscribers: int) -> None:
        self.subscribers = subscribers

    def teardown(self) -> None:
        pass

    def _session(self, listen: list[int], connect: list[int]) -> tuple[Any, Any]:
        if getattr(self, "_pid", None) != os.getpid():
            import zenoh

            config = zenoh.Config()
            config.insert_json5("mode", '"peer"')
            config.insert_json5("scouting/multicast/enabled", "false")
            config.insert_json5("scouting/gossip/enabled", "false")
            config.insert_json5("listen/endpoints", json.dumps([f"tcp/127.0.0.1:{port}" for port in listen]))
            config.insert_json5("connect/endpoints", json.dumps([f"tcp/127.0.0.1:{port}" for port in connect]))
            config.insert_json5("transport/shared_memory/enabled", "true")
            self._zenoh, self._session_object, self._pid = zenoh, zenoh.open(config), os.getpid()
        return self._zenoh, self._session_object

    def subscriber(self, index: int) -> "ZenohSubscriber":
        zenoh, session = self._session([self.ports[index]], [])
        self.local_subscribers = getattr(self, "local_subscribers", 0) + 1  # in this process
        return ZenohSubscriber(session.declare_subscriber(self.key, zenoh.handlers.FifoChannel(self.depth)))

    def publisher(self) -> "ZenohPublisher":
        zenoh, session = self._session([], self.ports[: self.subscribers])
        publisher = session.declare_publisher(self.key, congestion_control=zenoh.CongestionControl.BLOCK)
        provider, policy = None, None
        if self.size >= self.shm_from:
            # Room for the subscriber's queue and two in flight; a full pool waits for freed buffers.
            provider = zenoh.shm.ShmProvider.default_backend(max(1 << 20, (self.depth + 2) * self.size))
            policy = zenoh.shm.BlockOn(zenoh.shm.GarbageCollect())
        return ZenohPublisher(self, session, publisher, provider, policy)


class ZenohPublisher:
    def __init__(self, peer: ZenohPeer, session: Any, publisher: Any, provider: Any, policy: Any) -> None:
        self.peer, self.session, self.publisher, self.provider, self.policy = peer, session, publisher, provider, policy
        self._put = publisher.put
        if provider is None:
            self.send = self._put  # type: ignore[method-assign]  # plain bytes: put them as they are

    def send(self, data: bytes | bytearray) -> None:
        buffer = self.provider.alloc(len(data), self.policy)
        buffer[0 : len(data)] = data if isinstance(data, (bytes, bytearray)) else bytes(data)
        self._put(buffer)

    def send_frame(self, source: numpy.ndarray, header: bytes) -> None:
        frame = bytearray(source.tobytes())  # the buffer takes bytes or bytearray only
        frame[: len(header)] = header
        self.send(frame)

    def wait_for_subscribers(self, count: int, timeout_s: float) -> None:
        """Wait for a session with each subscriber and a matching subscription,
        then a moment for the other subscriptions to arrive."""
        deadline = time.monotonic() + timeout_s
        peers, remote = self.session.info.peers_zid, count - getattr(self.peer, "local_subscribers", 0)
        while len(list(peers())) < remote or not self.publisher.matching_status.matching:
            if time.monotonic() > deadline:
                raise RuntimeError(f"zenoh: {count} subscribers did not match within {timeout_s} s")
            time.sleep(0.01)
        time.sleep(0.2)

    def close(self) -> None:
        self.publisher.undeclare()


class ZenohSubscriber:
    lost = 0

    def __init__(self, subscriber: Any) -> None:
        self.subscriber = subscriber
        self._recv, self._try_recv = subscriber.recv, subscriber.try_recv

    def receive(self) -> bytes:
        return self._recv().payload.to_bytes()

    inproc_receive = receive  # delivery goes through zenoh's threads

    def try_receive(self) -> bytes | None:
        sample = self._try_recv()
        return None if sample is None else sample.payload.to_bytes()

    def receive_frame(self) -> tuple[numpy.ndarray, None]:
        return numpy.frombuffer(self._recv().payload.to_bytes(), numpy.uint8), None

    def close(self) -> None:
        self.subscriber.undeclare()
