"""Embeddings through admission, the embedding deployment and settlement."""

from __future__ import annotations

import base64
import hashlib
import time
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest

from tests.fakes import FakeEmbeddingDeployment, at_capacity
from tests.unit.flows.books import per_million

INPUT_USD = 5  # embed-small (catalog.yaml), USD per million tokens
DIMENSIONS = 64
TEXTS = ["a quick brown fox", "jumps over the lazy dog today"]


def _embed(gateway, key: str, **body):
    return gateway.client.post("/api/v1/embeddings", headers=gateway.auth(key),
                               json={"model": "embed-small", "input": TEXTS, **body})


def test_embeddings_answer_one_unit_vector_of_the_models_dimensions_per_input(
        fake_gateway, fakes, key):
    resp = _embed(fake_gateway, key)

    assert resp.status_code == 200, resp.text
    body = resp.json()
    assert body["object"] == "list" and body["model"] == "embed-small"
    assert [d["index"] for d in body["data"]] == [0, 1]
    vectors = np.array([d["embedding"] for d in body["data"]], dtype=np.float32)
    assert vectors.shape == (2, DIMENSIONS)
    assert np.allclose(np.linalg.norm(vectors, axis=1), 1, atol=1e-5)
    fake = fakes["embedding"]
    assert np.allclose(vectors[1], fake.vector("embed-small", TEXTS[1]), atol=1e-6)
    (call,) = fake.calls
    model_id, texts, owners = call.args
    assert (model_id, texts) == ("embed-small", TEXTS)
    # whose texts they are, for the engine's fair share: one account's, hashed, in one run
    ((tenant, count),) = owners
    assert count == len(TEXTS)
    assert tenant.id == hashlib.sha256(
        f"tenant:{fake_gateway.account_id}".encode()).hexdigest()[:24]
    assert resp.headers["x-service-model-id"] == "embed-small"
    assert resp.headers["x-service-balance-usd"] == "10"


def test_embeddings_are_charged_for_the_measured_tokens(fake_gateway, key, books):
    before = books.balance_nanos()

    resp = _embed(fake_gateway, key)

    assert resp.status_code == 200, resp.text
    tokens = sum(FakeEmbeddingDeployment.tokens_of(t) for t in TEXTS)
    assert resp.json()["usage"] == {"prompt_tokens": tokens, "total_tokens": tokens}
    charge = books.only_charge(resp.headers["cf-ray"])
    assert charge.model_id == "embed-small"
    assert charge.lines == {"input": (tokens, per_million(INPUT_USD, tokens))}
    assert books.balance_nanos() == before - charge.total_nanos
    assert books.open_holds() == 0


def test_an_input_longer_than_the_model_reads_is_charged_only_what_it_read(fake_gateway, fakes,
                                                                           key, books):
    long_text = "word " * 400  # 402 tokens; the model reads its first max_seq_length

    resp = fake_gateway.client.post("/api/v1/embeddings", headers=fake_gateway.auth(key),
                                    json={"model": "embed-small", "input": long_text})

    assert resp.status_code == 200, resp.text
    read = fakes["embedding"].max_seq_length
    assert resp.json()["usage"]["prompt_tokens"] == read
    assert books.only_charge(resp.headers["cf-ray"]).lines == {
        "input": (read, per_million(INPUT_USD, read))}


def test_embeddings_shortened_to_the_asked_dimensions_stay_unit_length(fake_gateway, key):
    resp = _embed(fake_gateway, key, dimensions=16, encoding_format="base64")

    assert resp.status_code == 200, resp.text
    for item in resp.json()["data"]:
        vector = np.frombuffer(base64.b64decode(item["embedding"]), dtype="<f4")
        assert vector.shape == (16,)
        assert np.linalg.norm(vector) == pytest.approx(1, abs=1e-5)


def test_embeddings_failing_model_charges_nothing_and_releases_the_hold(fake_gateway, fakes,
                                                                        key, books):
    fakes["embedding"].fail_with(at_capacity())
    before = books.balance_nanos()

    resp = _embed(fake_gateway, key)

    assert resp.status_code == 503
    assert resp.json()["code"] == "MODEL_AT_CAPACITY"
    assert books.entries() == 0
    assert books.balance_nanos() == before
    assert books.open_holds() == 0


def test_concurrent_requests_share_model_calls_and_each_is_charged_its_own_tokens(
        fake_gateway, fakes, key, books):
    fake = fakes["embedding"]
    fake.pause()  # the first call waits: the requests behind it queue up meanwhile
    inputs = [[f"text {i} " * (i + 1)] * (i + 1) for i in range(6)]

    def embed(texts: list[str]):
        return fake_gateway.client.post("/api/v1/embeddings", headers=fake_gateway.auth(key),
                                        json={"model": "embed-small", "input": texts})

    with ThreadPoolExecutor(len(inputs)) as pool:
        answers = [pool.submit(embed, texts) for texts in inputs]
        deadline = time.monotonic() + 120
        while books.open_holds() < len(inputs):  # every request admitted and waiting
            assert time.monotonic() < deadline
            time.sleep(0.01)
        fake.resume()
        answers = [a.result() for a in answers]

    assert len(fake.calls) < len(inputs)
    for texts, resp in zip(inputs, answers, strict=True):
        assert resp.status_code == 200, resp.text
        tokens = sum(FakeEmbeddingDeployment.tokens_of(t) for t in texts)
        assert resp.json()["usage"]["prompt_tokens"] == tokens
        assert len(resp.json()["data"]) == len(texts)
        assert books.only_charge(resp.headers["cf-ray"]).lines == {
            "input": (tokens, per_million(INPUT_USD, tokens))}
    assert books.open_holds() == 0


def test_a_large_batch_is_answered_whole_and_compressed(fake_gateway, fakes, key):
    """A batch of many inputs (its answer rendered off the event loop) comes back whole,
    compressed for a client that accepts it, one vector per input in order."""
    texts = [f"sentence {i} about the sea" for i in range(40)]
    resp = fake_gateway.client.post(
        "/api/v1/embeddings", json={"model": "embed-small", "input": texts},
        headers={**fake_gateway.auth(key), "Accept-Encoding": "gzip"})
    assert resp.status_code == 200, resp.text
    assert resp.headers["content-encoding"] == "gzip"
    data = resp.json()["data"]
    assert [d["index"] for d in data] == list(range(40))
    assert np.allclose(data[7]["embedding"], fakes["embedding"].vector("embed-small", texts[7]),
                       atol=1e-6)


# ---- inputs over the per-input token limit ------------------------------------------------

def test_an_input_surely_over_8192_tokens_is_refused_before_the_model(fake_gateway, fakes,
                                                                      key, books):
    """The attack: inputs far over the limit were tokenised and encoded by the model, then
    refused (400, nothing charged): the work was free. Now one with more words than the limit
    has tokens is refused before the hold: the model never sees it."""
    before = books.balance_nanos()

    resp = _embed(fake_gateway, key, input=["short one", "word " * 9000])

    assert resp.status_code == 400, resp.text
    assert resp.json()["code"] == "INVALID_REQUEST"
    assert "input" in resp.json()["details"]
    assert fakes["embedding"].calls == []
    assert books.entries() == 0 and books.open_holds() == 0
    assert books.balance_nanos() == before


def test_a_long_input_within_the_limit_is_embedded(fake_gateway, fakes, key, books):
    """Long in characters, within the limit in tokens: not refused by the early count."""
    text = "longerword " * 8000  # 88,000 characters, 8,002 tokens

    resp = _embed(fake_gateway, key, input=[text])

    assert resp.status_code == 200, resp.text
    assert len(fakes["embedding"].calls) == 1
    tokens = FakeEmbeddingDeployment.tokens_of(text)
    assert books.only_charge(resp.headers["cf-ray"]).lines["input"][0] == \
        min(tokens, fakes["embedding"].max_seq_length)
