"""An embedding model on a server the operator runs (`engine: openai`), through the real
embedding deployment class in process, against a real HTTP server on a socket
(tests/fakes/upstream_server.py): the vectors in input order at unit length, the server's usage
shared among the inputs, its refusals as ours, an upstream that stops answering and comes
back, and its address and key kept from answers and logs."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest

from deployments.embedding import EmbeddingDeployment
from deployments.engines.openai_embeddings import shares
from deployments.protocol import Embeddings, EngineError
from deployments.spec import ModelSpec
from tests.fakes.served import class_of
from tests.fakes.upstream_server import UpstreamServer, embedding_tokens, upstream_server

MODEL = "pool-embedder"
KEY = "sk-upstream-embedding-secret-0123"
TEXTS = ["a lighthouse", "storms over the grey sea tonight", "x"]


@pytest.fixture
def upstream() -> Iterator[UpstreamServer]:
    with upstream_server() as server:
        yield server


def _deployment(upstream: UpstreamServer, monkeypatch: pytest.MonkeyPatch,
                **options: Any) -> Any:
    monkeypatch.setenv("POOL_EMBEDDING_KEY_FOR_TEST", KEY)
    spec: ModelSpec = {"id": MODEL, "engine": "openai", "weights": None,
                       "engine_options": {"base_url": upstream.base_url,
                                          "upstream_model": "upstream-embedder",
                                          "api_key_env": "POOL_EMBEDDING_KEY_FOR_TEST",
                                          **options},
                       "max_queue_wait_s": 5.0}
    return class_of(EmbeddingDeployment)([spec])


async def test_embeddings_are_the_upstreams_vectors_in_order_at_unit_length(
        upstream, monkeypatch):
    deployment = _deployment(upstream, monkeypatch)
    out = await deployment.embed(MODEL, TEXTS)
    assert isinstance(out, Embeddings)
    # the server's vector of input i is (len(text), 1, i): back in input order, scaled
    expected = np.array([[len(t), 1.0, i] for i, t in enumerate(TEXTS)], dtype=np.float32)
    expected /= np.linalg.norm(expected, axis=1, keepdims=True)
    np.testing.assert_allclose(out.vectors, expected, rtol=1e-6)
    [body] = upstream.bodies
    assert body == {"model": "upstream-embedder", "input": TEXTS, "encoding_format": "float"}
    assert upstream.authorizations == [f"Bearer {KEY}"]


async def test_the_upstreams_usage_is_what_the_inputs_are_billed_in_all(upstream, monkeypatch):
    deployment = _deployment(upstream, monkeypatch)
    out = await deployment.embed(MODEL, TEXTS)
    assert sum(out.tokens) == sum(embedding_tokens(t) for t in TEXTS)
    assert all(count >= 0 for count in out.tokens)
    assert out.max_seq_length >= max(out.tokens)  # what the Gateway bills: all of each


def test_a_reported_total_is_shared_by_length_and_adds_up_exactly():
    texts = ["a" * 40, "b" * 20, "c" * 4]  # estimated 11, 6 and 2 tokens
    assert shares(38, texts, "m") == [22, 12, 4]
    assert shares(30, texts, "m") == [17, 10, 3]  # 17.4, 9.5, 3.2: the largest remainder
    assert sum(shares(7, texts, "m")) == 7
    assert shares(None, texts, "m") == [11, 6, 2]  # no report: the estimates


@pytest.mark.parametrize("status", ["429", "503"])
async def test_an_upstream_at_capacity_is_a_503_with_its_retry_after(upstream, monkeypatch,
                                                                     status):
    upstream.behaviour = status
    deployment = _deployment(upstream, monkeypatch)
    refused = await deployment.embed(MODEL, TEXTS)
    assert isinstance(refused, EngineError)
    assert (refused.status, refused.code, refused.retry_after) == (503, "MODEL_AT_CAPACITY", 7)
    assert (await deployment.stats())[MODEL]["upstream"]["online"] is True


async def test_an_upstream_400_stays_a_400_with_its_message_and_not_its_address(
        upstream, monkeypatch):
    upstream.behaviour = "400"
    deployment = _deployment(upstream, monkeypatch)
    refused = await deployment.embed(MODEL, TEXTS)
    assert isinstance(refused, EngineError) and refused.status == 400
    assert refused.message.startswith("max_tokens is too large for")
    assert "127.0.0.1" not in refused.message


async def test_an_upstream_down_goes_offline_after_its_failures_and_a_probe_brings_it_back(
        upstream, monkeypatch):
    upstream.behaviour = "down"
    deployment = _deployment(upstream, monkeypatch, failures_to_offline=2,
                             probe_interval_s=0.05)
    for _ in range(2):
        failed = await deployment.embed(MODEL, TEXTS)
        assert (failed.status, failed.code) == (500, "INFERENCE_FAILED")
    assert (await deployment.stats())[MODEL]["upstream"] == {"online": False,
                                                             "failures_in_a_row": 2}
    offline = await deployment.embed(MODEL, TEXTS)
    assert (offline.status, offline.code, offline.retry_after) == (503, "MODEL_OFFLINE", 0.05)
    assert len(upstream.bodies) == 2  # an offline upstream is not asked
    upstream.behaviour = "ok"
    for _ in range(600):  # the probe's next round
        if (await deployment.stats())[MODEL]["upstream"]["online"]:
            break
        await asyncio.sleep(0.05)
    assert isinstance(await deployment.embed(MODEL, TEXTS), Embeddings)


async def test_an_upstream_that_does_not_answer_is_a_503_offline(monkeypatch):
    with upstream_server() as gone:
        pass  # its port now refuses connections
    deployment = _deployment(gone, monkeypatch)
    refused = await deployment.embed(MODEL, TEXTS)
    assert (refused.status, refused.code) == (503, "MODEL_OFFLINE")
    assert refused.retry_after


async def test_the_upstreams_address_and_key_reach_no_answer_and_no_log(
        upstream, monkeypatch, caplog):
    caplog.set_level(logging.DEBUG)
    deployment = _deployment(upstream, monkeypatch, failures_to_offline=10)
    answers: list[Any] = []
    for behaviour in ("ok", "400", "500", "429"):
        upstream.behaviour = behaviour
        answers.append(await deployment.embed(MODEL, TEXTS))
    answers += [await deployment.stats()]
    address = upstream.base_url.removeprefix("http://").removesuffix("/v1")
    for text in [repr(a) for a in answers] + [r.getMessage() for r in caplog.records]:
        assert address not in text and KEY not in text
