"""Counter increments and gauge values kept in the process and handed to Ray's metric objects
by one periodic flush, in place of one record per call.

Each record of a `ray.util.metrics` object is a call into Ray's core worker (its tags checked,
then a C++ record): a Gateway replica made about eleven per 1-token chat, a text engine's stat
logger several per engine step. Ray's core worker exports what a process recorded to its
node's metrics agent every `metrics_report_interval_ms` (10 s by default), so a counter's
increments summed per tag set, and a gauge's last value per tag set, handed over a fraction of
a second later read the same on Prometheus. Histograms have no batched record in Ray's API
(each observation is its own record): they stay direct.

The flush runs on a daemon thread that sleeps until something is recorded (an idle process
never wakes for it), then waits `interval_s` and hands over everything kept; at the process's
exit, whatever is left. Outside Ray the metric objects record nothing, flushed or not.
"""

from __future__ import annotations

import atexit
import logging
import os
import threading
import time
from collections.abc import Callable
from functools import cache
from typing import Protocol

logger = logging.getLogger(__name__)

FLUSH_INTERVAL_S = 0.5

_Tags = tuple[tuple[str, str], ...]


class CounterSink(Protocol):
    def inc(self, value: float = 1.0, tags: dict[str, str] | None = None) -> None: ...


class GaugeSink(Protocol):
    def set(self, value: float, tags: dict[str, str] | None = None) -> None: ...


class MetricBatch:
    """The increments and gauge values recorded since the last flush, per metric and tag set."""

    def __init__(self, interval_s: float = FLUSH_INTERVAL_S) -> None:
        self.interval_s = interval_s
        self._start_empty()

    def _start_empty(self) -> None:
        self._lock = threading.Lock()
        self._sums: dict[tuple[CounterSink, _Tags], float] = {}
        self._values: dict[tuple[GaugeSink, _Tags], float] = {}
        self._pending = False
        self._due = threading.Event()
        self._flusher: threading.Thread | None = None

    def add(self, counter: CounterSink, value: float, tags: dict[str, str] | None) -> None:
        key = (counter, tuple(tags.items()) if tags else ())
        with self._lock:
            self._sums[key] = self._sums.get(key, 0) + value
            wake = not self._pending
            self._pending = True
        if wake:
            self._wake()

    def set(self, gauge: GaugeSink, value: float, tags: dict[str, str] | None) -> None:
        key = (gauge, tuple(tags.items()) if tags else ())
        with self._lock:
            self._values[key] = value
            wake = not self._pending
            self._pending = True
        if wake:
            self._wake()

    def flush(self) -> None:
        """Hand everything kept to the metric objects: one record per metric and tag set."""
        with self._lock:
            sums, self._sums = self._sums, {}
            values, self._values = self._values, {}
            self._pending = False
        for (counter, tags), total in sums.items():
            self._hand_over(counter.inc, total, tags)
        for (gauge, tags), value in values.items():
            self._hand_over(gauge.set, value, tags)

    @staticmethod
    def _hand_over(record: Callable[..., None], value: float, tags: _Tags) -> None:
        try:
            record(value, tags=dict(tags))
        except Exception:  # one bad series (a missing tag) must not stop the others
            logger.exception("metric record failed: %r %r", value, tags)

    def _wake(self) -> None:
        if self._flusher is None:
            with self._lock:
                if self._flusher is None:
                    self._flusher = threading.Thread(target=self._run, name="metric-flush",
                                                     daemon=True)
                    self._flusher.start()
                    atexit.register(self.flush)
        self._due.set()

    def _run(self) -> None:
        while True:
            self._due.wait()
            self._due.clear()
            time.sleep(self.interval_s)
            self.flush()


class BatchedCounter:
    """A Ray Counter's `inc`, summed in `batch` until its flush."""

    def __init__(self, metric: CounterSink, batch: MetricBatch) -> None:
        self.metric = metric
        self._batch = batch

    def inc(self, value: float = 1.0, tags: dict[str, str] | None = None) -> None:
        if value <= 0:  # as Ray's Counter refuses it, at the call that made it
            raise ValueError(f"value must be >0, got {value}")
        self._batch.add(self.metric, value, tags)


class BatchedGauge:
    """A Ray Gauge's `set`, its last value per tag set handed over by `batch`'s flush."""

    def __init__(self, metric: GaugeSink, batch: MetricBatch) -> None:
        self.metric = metric
        self._batch = batch

    def set(self, value: float | None, tags: dict[str, str] | None = None) -> None:
        if value is not None:  # None: no change, as Ray's Gauge takes it
            self._batch.set(self.metric, value, tags)


@cache
def process_batch() -> MetricBatch:
    """The process's one batch, shared by the Gateway's and the model replicas' metrics. A
    child forked from the process starts with an empty one of its own (the parent's flusher
    thread does not follow it into the child, its lock might be held)."""
    batch = MetricBatch()
    os.register_at_fork(after_in_child=batch._start_empty)
    return batch
