"""Counters and gauges reach Ray's metric objects through one flush: a counter's increments
summed per tag set, a gauge's last value per tag set, nothing lost, nothing recorded twice."""

from __future__ import annotations

import ast
import os
import threading

import pytest

from deployments.metric_batch import BatchedCounter, BatchedGauge, MetricBatch, process_batch
from deployments.metrics import EngineMetrics, GateMetrics
from serve_app.metrics import Metrics


class Sink:
    """Stands in for a Ray metric object: every record it was handed."""

    def __init__(self) -> None:
        self.records: list[tuple[float, dict[str, str]]] = []
        self.recorded = threading.Event()

    def inc(self, value: float = 1.0, tags: dict[str, str] | None = None) -> None:
        self.records.append((value, tags or {}))
        self.recorded.set()

    set = inc


def test_a_counter_is_handed_one_sum_per_tag_set_at_the_flush():
    batch, sink = MetricBatch(), Sink()
    requests = BatchedCounter(sink, batch)
    for _ in range(3):
        requests.inc(tags={"route": "/chat/completions", "status": "200"})
    requests.inc(2, tags={"route": "/chat/completions", "status": "429"})
    requests.inc(0.5, tags={"route": "/chat/completions", "status": "200"})
    assert sink.records == []  # nothing recorded until the flush

    batch.flush()
    assert sorted(sink.records, key=lambda r: r[1]["status"]) == [
        (3.5, {"route": "/chat/completions", "status": "200"}),
        (2, {"route": "/chat/completions", "status": "429"})]
    batch.flush()  # nothing new: nothing recorded again
    assert len(sink.records) == 2


def test_a_gauge_is_handed_its_last_value_per_tag_set():
    batch, sink = MetricBatch(), Sink()
    in_flight = BatchedGauge(sink, batch)
    for count in (1, 2, 3, 2):
        in_flight.set(count, tags={"deployment": "text"})
    in_flight.set(1, tags={"deployment": "embedding"})
    in_flight.set(None, tags={"deployment": "embedding"})  # no change, as Ray's Gauge takes it
    batch.flush()
    assert sorted(sink.records, key=lambda r: r[1]["deployment"]) == [
        (1, {"deployment": "embedding"}), (2, {"deployment": "text"})]


def test_the_gateways_calls_in_flight_are_published_as_counted():
    batch, sink = MetricBatch(), Sink()
    m = Metrics(batch)
    m.in_flight.metric = sink
    for _ in range(3):
        m.call_started("text")
    m.call_ended("text")
    batch.flush()
    assert sink.records == [(2, {"deployment": "text"})]
    assert m.calls_in_flight("text") == 2


def test_a_counter_refuses_a_value_that_is_not_positive_at_the_call():
    counter = BatchedCounter(Sink(), MetricBatch())
    with pytest.raises(ValueError):
        counter.inc(0, tags={"model": "m"})


def test_one_series_that_fails_to_record_does_not_stop_the_others():
    class Broken(Sink):
        def inc(self, value: float = 1.0, tags: dict[str, str] | None = None) -> None:
            raise ValueError("Missing value for tag key(s): model.")

    batch, sink = MetricBatch(), Sink()
    BatchedCounter(Broken(), batch).inc(tags={})
    BatchedCounter(sink, batch).inc(tags={"model": "m"})
    batch.flush()
    assert sink.records == [(1, {"model": "m"})]


def test_what_is_recorded_is_flushed_without_being_asked():
    batch, sink = MetricBatch(interval_s=0.01), Sink()
    BatchedCounter(sink, batch).inc(tags={"outcome": "admitted"})
    assert sink.recorded.wait(timeout=30)
    assert sink.records == [(1, {"outcome": "admitted"})]
    sink.recorded.clear()
    BatchedCounter(sink, batch).inc(tags={"outcome": "admitted"})  # the flusher sleeps again
    assert sink.recorded.wait(timeout=30)
    assert sink.records == [(1, {"outcome": "admitted"})] * 2


def test_a_forked_child_starts_with_an_empty_batch_of_its_own():
    batch, sink = process_batch(), Sink()
    BatchedCounter(sink, batch).inc(5, tags={"model": "parent"})
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: the parent's kept count is not its to hand over
        try:
            sink.records.clear()
            batch.flush()
            BatchedCounter(sink, batch).inc(tags={"model": "child"})
            batch.flush()
            os.write(write, repr(sink.records).encode())
        finally:
            os._exit(0)
    os.close(write)
    os.waitpid(pid, 0)
    assert ast.literal_eval(os.read(read, 1000).decode()) == [(1, {"model": "child"})]
    batch.flush()
    assert sink.records == [(5, {"model": "parent"})]


def test_every_counter_and_gauge_of_the_platform_goes_through_the_batch():
    for source in (Metrics(MetricBatch()), GateMetrics(MetricBatch()),
                   EngineMetrics(MetricBatch())):
        for metric in vars(source).values():
            kind = type(getattr(metric, "metric", metric)).__name__
            if kind in ("Counter", "Gauge"):
                assert type(metric).__name__ == f"Batched{kind}", metric.metric._name
