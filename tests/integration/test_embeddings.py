"""`POST /embeddings` through the real Serve app, with the `openai` SDK and raw HTTP."""

from __future__ import annotations

import base64

import httpx
import numpy as np
import pytest

pytestmark = pytest.mark.integration

MODEL = "text-embedding-all-minilm-l6-v2"



def test_float_and_base64_give_the_same_vectors(client):
    texts = ["The cat sat on the mat.", "Ray Serve scales Python services."]
    floats = client.embeddings.create(model=MODEL, input=texts, encoding_format="float")
    b64 = client.embeddings.create(model=MODEL, input=texts, encoding_format="base64")
    assert [d.index for d in floats.data] == [0, 1]
    assert len(floats.data[0].embedding) == 384
    assert floats.usage.prompt_tokens > 0
    assert floats.usage.total_tokens == floats.usage.prompt_tokens
    for f, b in zip(floats.data, b64.data, strict=True):
        # Asked for explicitly, base64 reaches the caller as the raw string.
        decoded = np.frombuffer(base64.b64decode(b.embedding), dtype="<f4")
        assert np.allclose(np.asarray(f.embedding, dtype=np.float32), decoded)
    assert abs(np.linalg.norm(floats.data[0].embedding) - 1) < 1e-4


def test_raw_base64_is_little_endian_float32(platform, inference_key):
    resp = httpx.post(f"{platform.base_url}/embeddings", headers=platform.auth(inference_key),
                      json={"model": MODEL, "input": "hello", "encoding_format": "base64"})
    assert resp.status_code == 200
    vector = np.frombuffer(base64.b64decode(resp.json()["data"][0]["embedding"]), dtype="<f4")
    assert vector.shape == (384,)
    assert resp.headers["x-service-model-id"] == MODEL


def test_similar_sentences_are_closer_than_unrelated_ones(client):
    out = client.embeddings.create(model=MODEL, input=[
        "A dog runs in the park.", "A puppy is running through the park.",
        "Quarterly tax filings are due in April."])
    a, b, c = (np.asarray(d.embedding) for d in out.data)
    assert a @ b > a @ c + 0.2


def test_dimensions_truncate_and_renormalise(client):
    full = client.embeddings.create(model=MODEL, input="vectors").data[0].embedding
    short = client.embeddings.create(model=MODEL, input="vectors", dimensions=64).data[0].embedding
    assert len(short) == 64
    assert abs(np.linalg.norm(short) - 1) < 1e-4
    expected = np.asarray(full[:64]) / np.linalg.norm(full[:64])
    assert np.allclose(short, expected, atol=1e-5)


@pytest.mark.parametrize("body,field", [
    ({"input": "x", "dimensions": 385}, "dimensions"),
    ({"input": []}, "input"),
    ({"input": [1, 2, 3]}, "input"),
    ({"input": [[1, 2], [3]]}, "input"),
    ({"input": ["ok", ""]}, "input"),
    ({"input": ["x"] * 2049}, "input"),
    ({"input": "x", "encoding_format": "int8"}, "encoding_format"),
    ({"input": "word " * 9000}, "input"),
])
def test_bad_inputs_are_400_detailed_errors(platform, inference_key, body, field):
    resp = httpx.post(f"{platform.base_url}/embeddings", headers=platform.auth(inference_key),
                      json={"model": MODEL, **body}, timeout=60)
    assert resp.status_code == 400, resp.text
    assert field in resp.json()["details"]


def test_unknown_model_is_404_and_chat_model_is_refused(platform, inference_key):
    missing = httpx.post(f"{platform.base_url}/embeddings", headers=platform.auth(inference_key),
                         json={"model": "nope", "input": "x"})
    assert (missing.status_code, missing.json()["code"]) == (404, "MODEL_NOT_FOUND")


def test_compression_is_negotiated(platform, inference_key):
    body = {"model": MODEL, "input": ["compress me"] * 8}
    for encoding in ("gzip", "br"):
        resp = httpx.post(f"{platform.base_url}/embeddings", json=body,
                          headers={**platform.auth(inference_key), "Accept-Encoding": encoding})
        assert resp.headers["content-encoding"] == encoding
        # httpx decodes both; the wire carried fewer bytes than the JSON.
        assert resp.json()["object"] == "list"
        assert resp.num_bytes_downloaded < len(resp.content) / 2


def test_aliases_resolve_to_the_embedding_model(client):
    out = client.embeddings.create(model="text-embedding-3-small", input="alias")
    assert out.model == MODEL


def test_embeddings_without_credentials_answer_the_wallet_discovery_402(platform):
    resp = httpx.post(f"{platform.base_url}/embeddings", json={"model": MODEL, "input": "x"})
    assert resp.status_code == 402
    assert resp.json()["authOptions"]["apiKey"]["header"] == "Authorization: Bearer YOUR_API_KEY"
    assert resp.headers["PAYMENT-REQUIRED"]
    bad = httpx.post(f"{platform.base_url}/embeddings", json={"model": MODEL, "input": "x"},
                     headers={"Authorization": "Bearer sk-nope"})
    assert bad.status_code == 401
