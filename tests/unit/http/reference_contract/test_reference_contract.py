"""Every path and method of the published reference (shared/reference/venice/openapi.yaml)
with a JSON success answer, called the way a client of the reference calls it, through the
gateway in process (fake model deployments, tests/unit/http/reference_contract/conftest.py):
the answer must validate against the reference's schema for that route and status.

Known differences, where our spec (shared/spec/inference-api.md) defines the shape and the
reference's schema refuses it; the spec stands and each is accepted here explicitly
(KNOWN_DIFFERENCES), and listed on the family's page of docs/api/:

- GET /models: `model_spec.capabilities` carries `maxInputImages` and
  `supportsOptimizePromptThinking` (spec, Resources, "Model record"); the reference's
  `capabilities` admits no keys beyond its own (docs/api/index.md, Models).
- POST /embeddings with `encoding_format: base64`: each `embedding` is a base64 string (spec,
  Resources, "Embedding list"); the reference types it as an array of numbers only
  (docs/api/embeddings.md).
- 402 of the inference routes without credentials (the x402 discovery body): the reference
  publishes `oneOf` [standard error, x402 body], and the x402 body carries `error` too (spec,
  Errors, 402 variants), so it is valid under both branches and `oneOf` fails whatever the
  server sends; read as `anyOf` (docs/api/wallets.md). Checked in test_reference_refusals.py.

Routes of the reference not called here, each with the reason: NOT_EXERCISED.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import pytest

from tests.reference_api import (
    reference_document,
    response_schema,
    schema_errors,
    with_spec_model_capabilities,
)
from tests.unit.http.reference_contract.calls import (
    AUDIO,
    CHAT,
    EMBEDDING,
    JSON_ONLY,
    TEXT,
    VIDEO,
    Call,
    Caller,
    character,
    finished,
    running,
    top_up,
    transcription,
    used,
    wallet_read,
)
from tests.wallets import Wallet

# (path, method) of the reference that the sweep does not call, and why.
NOT_EXERCISED: dict[tuple[str, str], str] = {
    ("/image/upscale", "post"): "success is binary image/png only (no JSON schema)",
    ("/image/edit", "post"): "success is a binary image only (no JSON schema)",
    ("/image/multi-edit", "post"): "success is a binary image only (no JSON schema)",
    ("/image/background-remove", "post"): "success is binary image/png only (no JSON schema)",
    ("/audio/speech", "post"): "success is binary audio only (no JSON schema)",
    ("/billing/usage", "get"): "sunset: answers 410 only (test_reference_refusals.py)",
    ("/audio/voices", "post"): "voice cloning is not implemented (we serve GET /audio/voices: "
                               "the speech models' voices); the spec does not name it",
    ("/api_keys/generate_web3_key", "get"): "not implemented (wallets sign in with "
                                            "SIGN-IN-WITH-X); the spec does not name it",
    ("/api_keys/generate_web3_key", "post"): "not implemented (wallets sign in with "
                                             "SIGN-IN-WITH-X); the spec does not name it",
    ("/video/transcriptions", "post"): "not implemented; the spec does not name it",
    ("/augment/text-parser", "post"): "the augment family is not implemented; the spec does "
                                      "not name it",
    ("/augment/scrape", "post"): "the augment family is not implemented; the spec does not "
                                 "name it",
    ("/augment/search", "post"): "the augment family is not implemented; the spec does not "
                                 "name it",
}

# (path, method, status) -> the reference's schema as our spec amends it (module docstring).
def _base64_embeddings(listing: dict[str, Any]) -> dict[str, Any]:
    item = listing["properties"]["data"]["items"]["properties"]
    item["embedding"] = {"anyOf": [item["embedding"], {"type": "string"}]}
    return listing


KNOWN_DIFFERENCES: dict[tuple[str, str, str], Callable[[dict[str, Any]], dict[str, Any]]] = {
    ("/models", "get", "200"): with_spec_model_capabilities,
    ("/embeddings", "post", "200"): _base64_embeddings,
}


def reference_schema(path: str, method: str, status: str = "200") -> dict[str, Any]:
    schema = response_schema(path, method, status)
    amend = KNOWN_DIFFERENCES.get((path, method, status))
    return amend(schema) if amend else schema


@dataclass(frozen=True)
class Sweep:
    path: str
    method: str
    call: Call


def _key_created(c: Caller):
    return c.post("/api_keys", {
        "apiKeyType": "INFERENCE", "description": "contract", "consumptionLimit": {"usd": 5},
        "limitPeriod": "MONTH", "modelPrivacy": "PRIVATE_TEXT",
        "expiresAt": "2099-01-01T00:00:00.000Z"}, admin=True)


# id -> the route and the call of a client of the reference that must succeed on it; a route
# may be called in a few ways (its answer has variants).
SWEEP: dict[str, Sweep] = {s_id: s for s_id, s in [
    ("POST /chat/completions", Sweep("/chat/completions", "post",
                                     lambda c: c.post("/chat/completions", CHAT))),
    ("POST /chat/completions reference parameters", Sweep(
        "/chat/completions", "post", lambda c: c.post("/chat/completions", {
            **CHAT, "max_tokens": 16, "temperature": 0.2, "logprobs": True, "top_logprobs": 2,
            "venice_parameters": {"include_venice_system_prompt": False}}))),
    ("POST /responses", Sweep("/responses", "post", lambda c: c.post(
        "/responses", {"model": TEXT, "input": "Say hello."}))),
    ("POST /responses messages", Sweep("/responses", "post", lambda c: c.post(
        "/responses", {"model": TEXT, "max_output_tokens": 16,
                       "input": [{"role": "user", "content": "Say hello."}]}))),
    ("POST /image/generate", Sweep("/image/generate", "post", lambda c: c.post(
        "/image/generate", {"model": "stable-diffusion-test", "prompt": "a red fox",
                            "width": 256, "height": 256}))),
    ("POST /image/generate two variants", Sweep("/image/generate", "post", lambda c: c.post(
        "/image/generate", {"model": "stable-diffusion-test", "prompt": "a red fox",
                            "width": 256, "height": 256, "variants": 2, "format": "png"}))),
    ("POST /image/generate required fields only", Sweep("/image/generate", "post", lambda c: (
        c.post("/image/generate", {"model": "stable-diffusion-test", "prompt": "a red fox"})))),
    ("POST /images/generations prompt only", Sweep("/images/generations", "post", lambda c: (
        c.post("/images/generations", {"prompt": "a red fox"})))),
    ("POST /images/generations", Sweep("/images/generations", "post", lambda c: c.post(
        "/images/generations", {"prompt": "a red fox", "model": "stable-diffusion-test",
                                "size": "256x256"}))),
    ("GET /image/styles", Sweep("/image/styles", "get",
                                lambda c: c.anonymous("GET", "/image/styles"))),
    ("GET /models", Sweep("/models", "get", lambda c: c.anonymous("GET", "/models"))),
    ("GET /models all types", Sweep("/models", "get", lambda c: c.anonymous(
        "GET", "/models", params={"type": "all"}))),
    ("GET /models/traits", Sweep("/models/traits", "get",
                                 lambda c: c.anonymous("GET", "/models/traits"))),
    ("GET /models/traits image", Sweep("/models/traits", "get", lambda c: c.anonymous(
        "GET", "/models/traits", params={"type": "image"}))),
    ("GET /models/compatibility_mapping", Sweep(
        "/models/compatibility_mapping", "get",
        lambda c: c.anonymous("GET", "/models/compatibility_mapping"))),
    ("GET /api_keys", Sweep("/api_keys", "get", lambda c: (
        c.ok(_key_created(c)), c.get("/api_keys", admin=True))[1])),
    ("POST /api_keys", Sweep("/api_keys", "post", _key_created)),
    ("POST /api_keys without limits", Sweep("/api_keys", "post", lambda c: c.post(
        "/api_keys", {"apiKeyType": "ADMIN", "description": "ops"}, admin=True))),
    ("PATCH /api_keys", Sweep("/api_keys", "patch", lambda c: c.patch("/api_keys", {
        "id": c.spare_key_id(), "description": "renamed", "consumptionLimit": {"diem": 2},
        "expiresAt": None}))),
    ("DELETE /api_keys", Sweep("/api_keys", "delete", lambda c: c.delete(
        "/api_keys", params={"id": c.spare_key_id()}))),
    ("GET /api_keys/{id}", Sweep("/api_keys/{id}", "get", lambda c: c.get(
        f"/api_keys/{c.spare_key_id()}", admin=True))),
    ("GET /api_keys/rate_limits", Sweep("/api_keys/rate_limits", "get",
                                        lambda c: c.get("/api_keys/rate_limits"))),
    ("GET /api_keys/rate_limits admin", Sweep("/api_keys/rate_limits", "get", lambda c: c.get(
        "/api_keys/rate_limits", admin=True))),
    ("GET /api_keys/rate_limits/log", Sweep("/api_keys/rate_limits/log", "get", lambda c: c.get(
        "/api_keys/rate_limits/log", admin=True))),
    ("GET /characters", Sweep("/characters", "get", lambda c: (
        character(c), c.get("/characters"))[1])),
    ("GET /characters filtered", Sweep("/characters", "get", lambda c: (character(c), c.get(
        "/characters", params={"isAdult": "false", "sortBy": "highestRating", "limit": 10,
                               "search": "sage", "sortOrder": "desc"}))[1])),
    ("GET /characters/{slug}", Sweep("/characters/{slug}", "get",
                                     lambda c: c.get(f"/characters/{character(c)}"))),
    ("GET /characters/{slug}/reviews", Sweep(
        "/characters/{slug}/reviews", "get", lambda c: c.get(
            f"/characters/{character(c)}/reviews", params={"page": 1, "pageSize": 10}))),
    ("POST /embeddings", Sweep("/embeddings", "post", lambda c: c.post("/embeddings", {
        "model": EMBEDDING, "input": "The food was delicious.", "encoding_format": "float"}))),
    ("POST /embeddings base64 list", Sweep("/embeddings", "post", lambda c: c.post(
        "/embeddings", {"model": EMBEDDING, "input": ["one", "two"],
                        "encoding_format": "base64", "dimensions": 384}))),
    ("POST /audio/transcriptions", Sweep("/audio/transcriptions", "post",
                                         transcription(response_format="json"))),
    ("POST /audio/transcriptions timestamps", Sweep(
        "/audio/transcriptions", "post",
        transcription(response_format="json", timestamps="true", language="en"))),
    ("POST /video/quote", Sweep("/video/quote", "post", lambda c: c.post("/video/quote", {
        k: VIDEO[k] for k in ("model", "duration", "resolution", "aspect_ratio")}))),
    ("POST /video/queue", Sweep("/video/queue", "post",
                                lambda c: c.post("/video/queue", VIDEO))),
    ("POST /video/retrieve", Sweep("/video/retrieve", "post",
                                   lambda c: running(c, "video", VIDEO))),
    ("POST /video/retrieve completed", Sweep("/video/retrieve", "post", lambda c: c.post(
        "/video/retrieve", finished(c, "video", VIDEO), headers=JSON_ONLY))),
    ("POST /video/complete", Sweep("/video/complete", "post", lambda c: c.post(
        "/video/complete", finished(c, "video", VIDEO)))),
    ("POST /audio/quote", Sweep("/audio/quote", "post", lambda c: c.post(
        "/audio/quote", {"model": "piper-narrator", "character_count": 1200}))),
    ("POST /audio/queue", Sweep("/audio/queue", "post",
                                lambda c: c.post("/audio/queue", AUDIO))),
    ("POST /audio/retrieve", Sweep("/audio/retrieve", "post",
                                   lambda c: running(c, "audio", AUDIO))),
    ("POST /audio/complete", Sweep("/audio/complete", "post", lambda c: c.post(
        "/audio/complete", finished(c, "audio", AUDIO)))),
    ("GET /billing/balance", Sweep("/billing/balance", "get",
                                   lambda c: c.get("/billing/balance", admin=True))),
    ("GET /billing/usage-analytics", Sweep("/billing/usage-analytics", "get", lambda c: used(
        c).get("/billing/usage-analytics", admin=True))),
    ("GET /billing/usage-analytics dates", Sweep("/billing/usage-analytics", "get", lambda c: (
        used(c).get("/billing/usage-analytics", admin=True,
                    params={"startDate": "2026-01-01", "endDate": "2026-01-31"})))),
    ("GET /billing/usage-history", Sweep("/billing/usage-history", "get", lambda c: used(
        c).get("/billing/usage-history", admin=True, headers=JSON_ONLY))),
    ("GET /billing/usage-history paged", Sweep("/billing/usage-history", "get", lambda c: used(
        used(c)).get("/billing/usage-history", admin=True, headers=JSON_ONLY,
                     params={"pageSize": 10, "currency": "USD",
                             "startTimestamp": "2026-01-01T00:00:00Z"}))),
    ("GET /crypto/rpc/networks", Sweep("/crypto/rpc/networks", "get",
                                       lambda c: c.anonymous("GET", "/crypto/rpc/networks"))),
    ("POST /crypto/rpc/{network}", Sweep("/crypto/rpc/{network}", "post", lambda c: c.post(
        "/crypto/rpc/ethereum-mainnet",
        {"jsonrpc": "2.0", "method": "eth_blockNumber", "params": [], "id": 1}))),
    ("POST /x402/top-up", Sweep("/x402/top-up", "post", lambda c: top_up(c, Wallet()))),
    ("GET /x402/balance/{walletAddress}", Sweep("/x402/balance/{walletAddress}", "get",
                                                wallet_read("balance"))),
    ("GET /x402/transactions/{walletAddress}", Sweep("/x402/transactions/{walletAddress}",
                                                     "get", wallet_read("transactions"))),
]}


def _reference_routes() -> set[tuple[str, str]]:
    return {(path, method) for path, item in reference_document()["paths"].items()
            for method in item if method in ("get", "post", "put", "patch", "delete")}


def test_every_reference_route_is_swept_or_listed_with_its_reason():
    swept = {(s.path, s.method) for s in SWEEP.values()}

    assert swept | set(NOT_EXERCISED) == _reference_routes()
    assert not swept & set(NOT_EXERCISED)
    assert all(NOT_EXERCISED.values())


@pytest.mark.parametrize("sweep_id", list(SWEEP))
def test_the_answer_parses_as_the_reference_publishes_it(caller: Caller, sweep_id: str):
    sweep = SWEEP[sweep_id]

    resp = sweep.call(caller)

    assert resp.status_code == 200, resp.text
    assert resp.headers["content-type"].startswith("application/json")
    assert schema_errors(reference_schema(sweep.path, sweep.method), resp.json()) == []
