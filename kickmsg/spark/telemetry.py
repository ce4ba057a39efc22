"""Driver telemetry: a Spark driver publishes its own progress into a topic.

Any process on the host (``kickmsg echo``, a dashboard, a native-library
program) can then follow a running job without a network or the Spark UI.
Each message is one compact JSON object with a ``kind`` and a wall-clock
time ``t``::

    {"kind":"job_start","job":3,"stages":[5,6],"t":...}
    {"kind":"stage","stage":5,"job":3,"tasks":8,"active":2,"completed":4,"failed":0,"t":...}
    (a stage Spark skipped, reusing earlier output, ends with "skipped":true)
    {"kind":"job_end","job":3,"status":"SUCCEEDED","t":...}
    {"kind":"query_progress","query":"...","name":"imu","batch":12,"input_rows":100,
     "input_rps":98.5,"processed_rps":1520.0,"duration_ms":65,"t":...}

Jobs and stages come from the status tracker, polled every ``interval``
seconds (0.25 by default), which bounds their rate; streaming progress comes
from a ``StreamingQueryListener`` and is also sent at most once per interval
per query.

The topic is created with ``TELEMETRY_CONFIG`` (8 rings of 256, a pool of
1024 slots of 1024 bytes; ``cfg`` to choose others) on the default layout.
A topic that exists already (a viewer made it first) is published into as
it is, whatever its settings and layout.

Telemetry is best effort: it never stops the job. A message the pool has
no slot for (nobody reads), or too large for the topic's slots, is counted
in ``dropped``; a topic it cannot publish into at all (damaged, not
writable) is warned about once (``RuntimeWarning``) and every message is
counted in ``dropped``.
"""
import threading
import time
import warnings

from collections.abc import Hashable
from typing import Any

from pyspark.sql import SparkSession
from pyspark.sql.streaming import StreamingQueryListener
from pyspark.sql.streaming.listener import (
    QueryIdleEvent,
    QueryProgressEvent,
    QueryStartedEvent,
    QueryTerminatedEvent,
)

from kickmsg import jsontext
from kickmsg.config import Config
from kickmsg.node import Node
from kickmsg.publisher import Publisher
from kickmsg.region import SharedRegion

__all__ = ["DriverTelemetry", "FINISHED", "TELEMETRY_CONFIG"]

TELEMETRY_CONFIG = Config(max_subscribers=8, sub_ring_capacity=256, pool_size=1024, max_payload_size=1024)
FINISHED = ("SUCCEEDED", "FAILED")


class _QueryListener(StreamingQueryListener):
    """Forwards streaming query events to the telemetry."""

    def __init__(self, telemetry: "DriverTelemetry") -> None:
        self.telemetry = telemetry

    def onQueryStarted(self, event: QueryStartedEvent) -> None:
        self.telemetry.publish({"kind": "query_start", "query": str(event.id), "name": event.name})

    def onQueryProgress(self, event: QueryProgressEvent) -> None:
        progress = event.progress
        self.telemetry.publish(
            {
                "kind": "query_progress",
                "query": str(progress.id),
                "name": progress.name,
                "batch": progress.batchId,
                "input_rows": progress.numInputRows,
                "input_rps": progress.inputRowsPerSecond,
                "processed_rps": progress.processedRowsPerSecond,
                "duration_ms": progress.batchDuration,
            },
            throttle_key=("query", str(progress.id)),
        )

    def onQueryIdle(self, event: QueryIdleEvent) -> None:
        pass

    def onQueryTerminated(self, event: QueryTerminatedEvent) -> None:
        self.telemetry.publish({"kind": "query_end", "query": str(event.id), "exception": event.exception})


class DriverTelemetry:
    """``with DriverTelemetry(spark):`` publishes job, stage and streaming
    progress into ``/{prefix}_{topic}`` (Node naming) while the block runs."""

    def __init__(self, spark: SparkSession, topic: str = "spark.telemetry", prefix: str = "kickmsg",
                 interval: float = 0.25, cfg: Config | None = None) -> None:
        self.spark = spark
        self.topic = topic
        self.prefix = prefix
        self.interval = interval
        self.cfg = cfg or TELEMETRY_CONFIG
        self.published = 0
        self.dropped = 0
        self._lock = threading.Lock()  # the listener and the poller both publish
        self._last_sent: dict[Hashable, float] = {}  # throttle key -> monotonic time of the last message
        self._jobs_seen = 0  # job ids below this have been announced
        self._running_jobs: dict[int, list[int]] = {}  # job id -> stage ids
        self._stages: dict[int, tuple[tuple[int, int, int, int], bool]] = {}  # stage id -> last published counters
        self._stopping = threading.Event()
        self._publisher: Publisher | None = None
        self._too_large_told = False

    def _join_topic(self) -> Publisher | None:
        """A publisher into the topic: created with ``cfg`` if absent, else
        the channel as it is; None, with a warning, if it cannot be
        published into."""
        node = Node("spark-driver", prefix=self.prefix)
        try:
            return node.advertise_or_join(self.topic, self.cfg)
        except (RuntimeError, ValueError, OSError):  # e.g. Config mismatch: a viewer made it with other settings
            pass
        name = f"/{self.prefix}_{self.topic}"
        try:
            return Publisher(SharedRegion.open(name), name="spark-driver")
        except (RuntimeError, ValueError, OSError) as error:
            warnings.warn(f"DriverTelemetry: cannot publish into {name} ({str(error).splitlines()[0]}); "
                          "the job goes on, its telemetry counted in dropped", RuntimeWarning, stacklevel=3)
            return None

    def __enter__(self) -> "DriverTelemetry":
        self._publisher = self._join_topic()
        self._tracker = self.spark.sparkContext.statusTracker()
        while self._tracker.getJobInfo(self._jobs_seen) is not None:  # jobs from before: not ours to report,
            self._jobs_seen += 1  # except those still running, which the first poll picks up below
        for job in self._tracker.getActiveJobsIds():
            info = self._tracker.getJobInfo(job)
            self._running_jobs[job] = list(info.stageIds) if info is not None else []
        self._listener = _QueryListener(self)
        self.spark.streams.addListener(self._listener)
        self.publish({"kind": "telemetry_start", "app": self.spark.sparkContext.appName})
        self._poller = threading.Thread(target=self._poll, name="kickmsg-telemetry", daemon=True)
        self._poller.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self._stopping.set()
        self._poller.join()
        self._poll_once()  # what finished since the last poll
        self.spark.streams.removeListener(self._listener)
        self.publish({"kind": "telemetry_end", "published": self.published + 1, "dropped": self.dropped})

    def publish(self, event: dict[str, Any], throttle_key: Hashable | None = None) -> None:
        """Send one event (skipped if ``throttle_key`` sent one less than an
        interval ago)."""
        now = time.monotonic()
        with self._lock:
            if throttle_key is not None:
                if now - self._last_sent.get(throttle_key, -1e9) < self.interval:
                    return
                self._last_sent[throttle_key] = now
            event["t"] = time.time()
            message = jsontext.dumps(event, separators=(",", ":"), default=str).encode()
            if self._publisher is None:
                self.dropped += 1
                return
            limit = self._publisher.region.geometry.slot_data_size
            if len(message) > limit:
                self.dropped += 1
                if not self._too_large_told:
                    self._too_large_told = True
                    warnings.warn(f"DriverTelemetry: {self._publisher.region.name} holds messages of up to {limit} "
                                  f"bytes; larger events ({event['kind']}: {len(message)} bytes) are counted in dropped",
                                  RuntimeWarning, stacklevel=2)
                return
            try:
                self._publisher.send(message)
                self.published += 1
            except BlockingIOError:
                self.dropped += 1

    def _poll(self) -> None:
        while not self._stopping.wait(self.interval):
            self._poll_once()

    def _poll_once(self) -> None:
        """Announce new jobs, finished jobs and changed stage counters."""
        tracker = self._tracker
        while (info := tracker.getJobInfo(self._jobs_seen)) is not None:  # job ids count up from 0
            self.publish({"kind": "job_start", "job": info.jobId, "stages": list(info.stageIds)})
            self._running_jobs[info.jobId] = list(info.stageIds)
            self._jobs_seen += 1
        for job, stages in list(self._running_jobs.items()):
            info = tracker.getJobInfo(job)  # the status first: stage counters read after it are final
            finished = info is None or info.status in FINISHED
            for stage in stages:
                self._publish_stage(job, stage, job_finished=finished)
            if finished:
                status = info.status if info is not None else "UNKNOWN"
                self.publish({"kind": "job_end", "job": job, "status": status})
                del self._running_jobs[job]

    def _publish_stage(self, job: int, stage: int, job_finished: bool) -> None:
        """Counters of one stage, when they changed. A stage of a finished job
        that never ran its tasks was skipped (Spark reused its output)."""
        info = self._tracker.getStageInfo(stage)
        if info is None:
            return
        counters = (info.numTasks, info.numActiveTasks, info.numCompletedTasks, info.numFailedTasks)
        tasks, active, completed, failed = counters
        skipped = job_finished and active == 0 and completed + failed < tasks
        if self._stages.get(stage) != (counters, skipped):
            self._stages[stage] = (counters, skipped)
            event: dict[str, Any] = {"kind": "stage", "stage": stage, "job": job, "tasks": tasks, "active": active,
                     "completed": completed, "failed": failed}
            if skipped:
                event["skipped"] = True
            self.publish(event)
