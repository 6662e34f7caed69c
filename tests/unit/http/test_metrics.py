"""The metrics an operator relies on: the request middleware labels each request with its
route template (never the raw path), status, model and credentials; the Grafana dashboard
queries only metrics the platform defines."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest

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


def test_the_dashboard_queries_only_metrics_the_platform_defines():
    defined = {"ray_" + m._name for m in vars(Metrics()).values() if hasattr(m, "_name")}
    dashboard = json.loads(DASHBOARD.read_text())
    assert dashboard["panels"]
    for panel in dashboard["panels"]:
        for target in panel["targets"]:
            used = set(re.findall(r"ray_inference_[a-z_]+", target["expr"]))
            names = {re.sub(r"_(bucket|count|sum)$", "", name) for name in used}
            assert names <= defined, (panel["title"], names - defined)
