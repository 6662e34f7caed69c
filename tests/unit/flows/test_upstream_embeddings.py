"""Embeddings of a model on a server the operator runs (`engine: openai`), as a client sees
them: the Gateway in process, the real embedding deployment holding the model's upstream
engine, a real OpenAI-compatible server on a socket (tests/fakes/upstream_server.py) behind
it. The vectors are the server's, the charge its usage; its refusals are the spec's errors
(a 429 or 503 upstream is a 503 with Retry-After, a 400 a 400 with its message), with nothing
charged and its address never shown."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from serve_app.models.catalog import load_catalog
from serve_app.models.upstream_states import UpstreamStates
from tests.fakes.handles import DeploymentHandle
from tests.fakes.upstream_models import (
    UpstreamEmbeddingDeployment,
    upstream_catalog,
    upstream_fleet,
    upstream_model,
)
from tests.fakes.upstream_server import UpstreamServer, embedding_tokens, upstream_server
from tests.unit.flows.books import per_million
from tests.unit.flows.conftest import CATALOG

MODEL = "embed-upstream"
KEY = "sk-upstream-embedding-secret-for-flows"
INPUT_USD = 4  # per million tokens
TEXTS = ["a quick brown fox", "jumps over the lazy dog today"]


@pytest.fixture
def upstream() -> Iterator[UpstreamServer]:
    with upstream_server() as server:
        yield server


@pytest.fixture
def gateway_catalog(tmp_path: Path, upstream: UpstreamServer,
                    monkeypatch: pytest.MonkeyPatch) -> Path:
    """The flows' catalog and an embedding model on the upstream, with its key's variable;
    the model is the type's default (/ready counts it)."""
    monkeypatch.setenv("UPSTREAM_EMBEDDING_KEY_FOR_FLOWS", KEY)
    return upstream_catalog(tmp_path, CATALOG, upstream_model(
        upstream, MODEL, upstream_name="upstream-embedder",
        api_key_env="UPSTREAM_EMBEDDING_KEY_FOR_FLOWS", type="embedding",
        name="Embeddings upstream", deployment="embedding", dimensions=3, context_length=512,
        pricing={"input": {"usd": INPUT_USD, "diem": INPUT_USD}}),
        traits={"embedding": {"default": MODEL}})


@pytest.fixture
def fakes(gateway_catalog: Path) -> dict[str, DeploymentHandle]:
    """The flows' fakes, but the embedding deployment is the real one, holding the model."""
    return upstream_fleet(load_catalog(gateway_catalog), UpstreamEmbeddingDeployment,
                          "embedding")


def _embed(gateway: Any, key: str, **body: Any) -> Any:
    return gateway.client.post("/api/v1/embeddings", headers=gateway.auth(key),
                               json={"model": MODEL, "input": TEXTS, **body})


def test_embeddings_are_the_upstreams_vectors_charged_by_its_usage(fake_gateway, key, books,
                                                                   upstream):
    resp = _embed(fake_gateway, key)
    assert resp.status_code == 200, resp.text
    body = resp.json()
    assert body["model"] == MODEL and [d["index"] for d in body["data"]] == [0, 1]
    vectors = np.array([d["embedding"] for d in body["data"]], dtype=np.float32)
    assert vectors.shape == (2, 3)
    assert np.allclose(np.linalg.norm(vectors, axis=1), 1, atol=1e-5)
    assert vectors[0] == pytest.approx(np.array([len(TEXTS[0]), 1, 0]) / np.linalg.norm(
        [len(TEXTS[0]), 1, 0]), rel=1e-5)
    tokens = sum(embedding_tokens(t) for t in TEXTS)
    assert body["usage"] == {"prompt_tokens": tokens, "total_tokens": tokens}
    charge = books.only_charge(resp.headers["cf-ray"])
    assert charge.model_id == MODEL
    assert charge.lines["input"] == (tokens, per_million(INPUT_USD, tokens))
    [sent] = upstream.bodies
    assert sent["model"] == "upstream-embedder" and sent["input"] == TEXTS
    assert upstream.authorizations == [f"Bearer {KEY}"]


@pytest.mark.parametrize("status", ["429", "503"])
def test_an_upstream_at_capacity_is_a_503_with_retry_after_and_charges_nothing(
        fake_gateway, key, books, upstream, status):
    upstream.behaviour = status
    before = books.balance_nanos()
    resp = _embed(fake_gateway, key)
    assert resp.status_code == 503, resp.text
    assert resp.json()["code"] == "MODEL_AT_CAPACITY"
    assert resp.headers["retry-after"] == "7"
    assert books.balance_nanos() == before and books.open_holds() == 0


def test_an_upstream_400_is_a_400_with_its_message_and_not_its_address(fake_gateway, key,
                                                                      books, upstream):
    upstream.behaviour = "400"
    before = books.balance_nanos()
    resp = _embed(fake_gateway, key)
    assert resp.status_code == 400, resp.text
    assert resp.json()["code"] == "INVALID_REQUEST"
    assert resp.json()["error"].startswith("max_tokens is too large for")
    address = upstream.base_url.removeprefix("http://").removesuffix("/v1")
    assert address not in resp.text and KEY not in resp.text
    assert books.balance_nanos() == before and books.open_holds() == 0


def test_an_upstream_that_fails_is_a_500_charging_nothing(fake_gateway, key, books, upstream):
    upstream.behaviour = "500"
    before = books.balance_nanos()
    resp = _embed(fake_gateway, key)
    assert resp.status_code == 500, resp.text
    assert resp.json()["code"] == "INFERENCE_FAILED"
    assert books.balance_nanos() == before and books.open_holds() == 0


def test_a_default_model_whose_server_stops_answering_makes_the_gateway_not_ready(
        fake_gateway, key, upstream):
    router = fake_gateway.services.router
    router.upstreams = UpstreamStates(router.catalog, router.deployment_handle, max_age_s=0)
    assert fake_gateway.client.get("/ready").status_code == 200
    upstream.behaviour = "down"
    for _ in range(2):  # the catalog's failures_to_offline
        assert _embed(fake_gateway, key).status_code == 500
    ready = fake_gateway.client.get("/ready")
    assert ready.status_code == 503, ready.text
    assert ready.json()["code"] == "NOT_READY"
    assert ready.json()["checks"][f"model:{MODEL}"] == (
        "its server does not answer (2 failures in a row); its replica probes it until it "
        "does")
    address = upstream.base_url.removeprefix("http://").removesuffix("/v1")
    assert address not in ready.text
    assert fake_gateway.client.get("/api/v1/models?type=embedding").json()["data"][0][
        "model_spec"]["offline"] is True
