"""The metrics an operator relies on: the request middleware labels each request with its
route template (never the raw path), status, model and credentials; the Grafana dashboard
queries only metrics the platform defines."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest

from deployments.metrics import EngineMetrics, GateMetrics
from serve_app import metrics as metrics_module
from serve_app.metrics import Metrics

DASHBOARD = Path(__file__).resolve().parents[3] / "configs" / "grafana" / "inference-dashboard.json"


class Recorder:
    """Stands in for Ray's metric objects: what was recorded, with which tags."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, float, dict[str, str]]] = []

    def __getattr__(self, name: str) -> Any:
        recorder = self

        class Metric:
            def inc(self, value: float = 1, tags: dict | None = None) -> None:
                recorder.calls.append((name, value, tags or {}))

            observe = set = inc

        return Metric()


@pytest.fixture
def recorded(monkeypatch) -> Recorder:
    recorder = Recorder()
    monkeypatch.setattr(metrics_module, "metrics", lambda: recorder)
    return recorder


def test_requests_are_labelled_by_route_template_status_model_and_credentials(
        gateway, recorded):
    key = gateway.create_key()
    assert gateway.client.get(f"/api/v1/api_keys/{key['id']}",
                              headers=gateway.auth()).status_code == 200
    gateway.client.get("/api/v1/api_keys")  # no key
    counted = [tags for name, _, tags in recorded.calls if name == "requests"]
    assert {"route": "/api_keys/{key_id}", "status": "200", "model": "", "auth": "key"} in counted
    assert {"route": "/api_keys", "status": "401", "model": "", "auth": "none"} in counted
    timed = [tags for name, _, tags in recorded.calls if name == "request_seconds"]
    assert {"route": "/api_keys/{key_id}", "model": ""} in timed
    unmatched = gateway.client.get("/api/v1/no/such/route/12345")
    assert unmatched.status_code == 404
    assert any(t["route"] == "unmatched" for n, _, t in recorded.calls if n == "requests")


def ray_metrics() -> list[Any]:
    """Every Ray metric object the Gateway and the model replicas define (a batched counter's
    or gauge's own: `.metric`)."""
    return [getattr(m, "metric", m) for source in (Metrics(), GateMetrics(), EngineMetrics())
            for m in vars(source).values() if hasattr(getattr(m, "metric", m), "_name")]


def defined_metrics() -> set[str]:
    """Every metric the Gateway and the model replicas define, as Prometheus names it."""
    return {"ray_" + m._name for m in ray_metrics()}


def test_the_dashboard_queries_only_metrics_the_platform_defines():
    defined = defined_metrics()
    dashboard = json.loads(DASHBOARD.read_text())
    assert dashboard["panels"]
    for panel in dashboard["panels"]:
        for target in panel.get("targets", ()):  # a row holds none
            used = set(re.findall(r"ray_inference_[a-z0-9_]+", target["expr"]))
            names = {re.sub(r"_(bucket|count|sum)$", "", name) for name in used}
            assert names <= defined, (panel["title"], names - defined)


def test_the_dashboard_shows_the_engines_and_the_gates():
    queried = " ".join(target["expr"] for panel in json.loads(DASHBOARD.read_text())["panels"]
                       for target in panel.get("targets", ()))
    for name in ("engine_ttft_seconds", "engine_tpot_seconds", "engine_kv_cache_usage",
                 "engine_prefix_cache_hits_total", "engine_preemptions_total",
                 "engine_requests_waiting", "gate_waiting", "gate_wait_seconds",
                 "gate_refused_total", "gate_engine_seconds"):
        assert f"ray_inference_{name}" in queried, name


def test_the_metrics_page_lists_every_metric_with_its_labels():
    page = (DASHBOARD.parents[2] / "docs" / "operators" / "metrics.md").read_text()
    rows = {line.split("|")[1].strip().strip("`"): line for line in page.splitlines()
            if line.startswith("| `ray_")}
    for metric in ray_metrics():
        row = rows.get(f"ray_{metric._name}")
        assert row is not None, metric._name
        labels = row.split("|")[2]
        for tag in metric._tag_keys:
            assert tag in labels, (metric._name, tag)
