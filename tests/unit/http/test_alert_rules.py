"""The Prometheus alert rules shipped in configs/prometheus/alerts.yaml: valid for Prometheus
(`promtool check rules`), about metrics the platform defines, and firing when they should
(`promtool test rules`)."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

from tests.unit.http.test_metrics import defined_metrics

RULES = Path(__file__).resolve().parents[3] / "configs" / "prometheus" / "alerts.yaml"
PROMTOOL = shutil.which("promtool")
needs_promtool = pytest.mark.skipif(
    PROMTOOL is None, reason="promtool not installed (Debian: apt-get install prometheus)")


def _rules() -> list[dict]:
    return [rule for group in yaml.safe_load(RULES.read_text())["groups"]
            for rule in group["rules"]]


def test_the_rules_cover_what_an_operator_is_paged_for():
    exprs = {rule["alert"]: rule["expr"] for rule in _rules()}
    wanted = {"ray_inference_requests_total": "error ratio",
              "ray_inference_gate_refused_total": "503 capacity ratio",
              "ray_inference_engine_ttft_seconds_bucket": "TTFT p95",
              "ray_inference_billing_seconds_bucket": "ledger writer lag",
              "ray_inference_dependency_up": "database or Redis down",
              "ray_serve_deployment_replica_starts_total": "replicas restarting"}
    for metric, what in wanted.items():
        assert any(metric in expr for expr in exprs.values()), what


def test_the_rules_query_only_metrics_the_platform_defines():
    defined = defined_metrics()
    for rule in _rules():
        used = set(re.findall(r"ray_inference_[a-z0-9_]+", rule["expr"]))
        names = {re.sub(r"_(bucket|count|sum)$", "", name) for name in used}
        assert names <= defined, (rule["alert"], names - defined)


@needs_promtool
def test_promtool_accepts_the_rules():
    result = subprocess.run([PROMTOOL, "check", "rules", str(RULES)], capture_output=True,
                            text=True, check=False)
    assert result.returncode == 0, result.stdout + result.stderr


@needs_promtool
def test_redis_down_fires_after_two_minutes(tmp_path):
    tests = tmp_path / "alerts_test.yaml"
    tests.write_text(yaml.safe_dump({
        "rule_files": [str(RULES)],
        "evaluation_interval": "1m",
        "tests": [{
            "interval": "1m",
            "input_series": [
                {"series": 'ray_inference_dependency_up{part="redis", instance="a"}',
                 "values": "1 1 0 0 0 0 0"},
                {"series": 'ray_inference_dependency_up{part="database", instance="a"}',
                 "values": "1 1 1 1 1 1 1"}],
            "alert_rule_test": [
                {"eval_time": "3m", "alertname": "InferenceDependencyDown", "exp_alerts": []},
                {"eval_time": "5m", "alertname": "InferenceDependencyDown", "exp_alerts": [{
                    "exp_labels": {"part": "redis", "severity": "page"},
                    "exp_annotations": {
                        "summary": "redis is unreachable from the Gateway",
                        "description": "GET /ready names redis as failing; its 503 body "
                                       "says why."}}]}],
        }]}))
    result = subprocess.run([PROMTOOL, "test", "rules", str(tests)], capture_output=True,
                            text=True, check=False)
    assert result.returncode == 0, result.stdout + result.stderr
