"""The platform's Prometheus metrics, as an operator scrapes them from Ray's metrics agent:
requests by route, status, model and credentials, summed across Gateway replicas; tokens and
charges by model; ledger, limiter and deployment timings."""

from __future__ import annotations

import time

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

pytestmark = pytest.mark.integration

EMBEDDING = "text-embedding-all-minilm-l6-v2"


def _samples(platform) -> list:
    text = httpx.get(platform.metrics_url, timeout=10).text
    return [s for family in text_string_to_metric_families(text) for s in family.samples
            if s.name.startswith("ray_inference_")]


def _total(samples: list, name: str, **labels: str) -> float:
    """The sum over every series of `name` whose labels match (one series per replica)."""
    return sum(s.value for s in samples if s.name == name
               and all(s.labels.get(k) == v for k, v in labels.items()))


def _wait_for(platform, check, timeout_s: float = 90):
    deadline = time.monotonic() + timeout_s
    while True:
        samples = _samples(platform)
        if check(samples) or time.monotonic() > deadline:
            return samples
        time.sleep(2)


def test_requests_are_counted_across_replicas_with_their_labels(platform, inference_key):
    auth = {"Authorization": f"Bearer {inference_key}"}
    embeddings = {"route": "/embeddings", "status": "200", "model": EMBEDDING, "auth": "key"}
    before = _total(_samples(platform), "ray_inference_requests_total", **embeddings)
    for url in platform.replica_urls:  # three on each Gateway replica
        for _ in range(3):
            resp = httpx.post(f"{url}/embeddings", headers=auth, timeout=60,
                              json={"model": EMBEDDING, "input": "count me"})
            assert resp.status_code == 200
    refused = httpx.get(f"{platform.replica_urls[0]}/api_keys", timeout=30)
    assert refused.status_code == 401

    goal = before + 3 * len(platform.replica_urls)
    expected = [  # each replica's worker reports on its own schedule: wait for all of them
        ("ray_inference_requests_total", embeddings, goal),
        ("ray_inference_requests_total", {"route": "/api_keys", "status": "401",
                                          "auth": "none"}, 1),
        ("ray_inference_request_seconds_count", {"route": "/embeddings", "model": EMBEDDING},
         goal),
        ("ray_inference_engine_seconds_count", {"deployment": "embedding",
                                                "model": EMBEDDING}, 1),
        ("ray_inference_billing_seconds_count", {"operation": "settle"}, 1),
        ("ray_inference_limiter_decisions_total", {"outcome": "admitted"}, 1),
    ]
    samples = _wait_for(platform, lambda s: all(
        _total(s, name, **labels) >= least for name, labels, least in expected))
    for name, labels, least in expected:
        assert _total(samples, name, **labels) >= least, (name, labels)


def test_tokens_and_charges_are_counted_per_model(platform, inference_key):
    resp = httpx.post(f"{platform.base_url}/chat/completions", timeout=120,
                      headers={"Authorization": f"Bearer {inference_key}"},
                      json={"model": "tiny-chat", "max_tokens": 4,
                            "messages": [{"role": "user", "content": "Hi"}]})
    assert resp.status_code == 200
    samples = _wait_for(platform, lambda s: _total(
        s, "ray_inference_tokens_total", model="tiny-chat", direction="output") > 0)
    assert _total(samples, "ray_inference_tokens_total", model="tiny-chat",
                  direction="input") > 0
    assert _total(samples, "ray_inference_tokens_total", model="tiny-chat",
                  direction="output") > 0
    assert _total(samples, "ray_inference_charged_usd_total", model="tiny-chat") > 0


def test_a_chat_shows_the_engines_own_figures_and_the_gates_queue(platform, inference_key):
    """vLLM's measurements (deployments/engines/vllm_stats.py) and the fair-share gate's
    (deployments/fair_share.py) reach the same endpoint, labelled by the model."""
    with httpx.stream("POST", f"{platform.base_url}/chat/completions", timeout=120,
                      headers={"Authorization": f"Bearer {inference_key}"},
                      json={"model": "tiny-chat", "max_tokens": 8, "stream": True,
                            "messages": [{"role": "user", "content": "Hi"}]}) as resp:
        assert resp.status_code == 200
        resp.read()
    chat = {"model": "tiny-chat"}
    expected = [
        ("ray_inference_engine_ttft_seconds_count", chat),
        ("ray_inference_engine_tpot_seconds_count", chat),
        ("ray_inference_engine_e2e_seconds_count", chat),
        ("ray_inference_engine_generation_tokens_total", chat),
        ("ray_inference_engine_prompt_tokens_total", chat),
        ("ray_inference_engine_prefix_cache_queries_total", chat),
        ("ray_inference_gate_wait_seconds_count", {**chat, "tier": "default"}),
    ]
    gauges = {"ray_inference_engine_requests_running", "ray_inference_engine_requests_waiting",
              "ray_inference_engine_kv_cache_usage", "ray_inference_gate_waiting",
              "ray_inference_gate_running"}
    # Gauges: present once set, whatever their value. Ray's agent shows a gauge in the report
    # after it was set, and each replica's worker reports on its own schedule: the names seen
    # over the scrapes while waiting are what an operator's Prometheus would have recorded.
    seen: set[str] = set()

    def shown(s: list) -> bool:
        seen.update(x.name for x in s if x.labels.get("model") == "tiny-chat")
        return gauges <= seen and all(_total(s, name, **labels) > 0
                                      for name, labels in expected)

    samples = _wait_for(platform, shown)
    for name, labels in expected:
        assert _total(samples, name, **labels) > 0, (name, labels)
    assert gauges <= seen, gauges - seen
