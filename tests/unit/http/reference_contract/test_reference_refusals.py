"""Refusals as the reference publishes them: a bad body (400), no or a wrong key (401), a
payment needed (402: a key without credit, no credentials, a wallet without credit, a top-up
without a payment), an unknown model, character or job (404), the wrong content type (415) and
the sunset route (410), each checked against the error schema the reference publishes for that
route and status (its StandardError where it publishes none for that status); and every route
served asked wrongly in the usual ways. The x402 402s are read with the reference's `oneOf` as
`anyOf` (test_reference_contract.py, known differences)."""

from __future__ import annotations

from typing import Any

import httpx
import pytest

from tests.reference_api import component_schema, reference_document, schema_errors
from tests.unit.http.reference_contract.calls import (
    API,
    CHAT,
    EMBEDDING,
    TEXT,
    VIDEO,
    Call,
    Caller,
)
from tests.unit.http.reference_contract.test_reference_contract import (
    NOT_EXERCISED,
    SWEEP,
    reference_schema,
)
from tests.wallets import Wallet, signed_in

UNKNOWN_JOB = "00000000-0000-4000-8000-000000000000"

def _signed_in_without_credit(c: Caller) -> httpx.Response:
    wallet = Wallet()
    headers = signed_in(c.gw.client, wallet, f"http://testserver{API}/chat/completions")
    return c.anonymous("POST", "/chat/completions", json=CHAT, headers=headers)


# id -> (path, method, status, the call).
REFUSALS: dict[str, tuple[str, str, str, Call]] = {
    "400 chat without messages": ("/chat/completions", "post", "400",
                                  lambda c: c.post("/chat/completions", {"model": TEXT})),
    "400 chat body not JSON": ("/chat/completions", "post", "400", lambda c: c.post(
        "/chat/completions", content=b"{not json", headers={"Content-Type": "application/json"})),
    "400 embeddings of token ids": ("/embeddings", "post", "400", lambda c: c.post(
        "/embeddings", {"model": EMBEDDING, "input": [[1, 2, 3]]})),
    "400 key description too long": ("/api_keys", "post", "400", lambda c: c.post(
        "/api_keys", {"apiKeyType": "INFERENCE", "description": "x" * 65}, admin=True)),
    "400 video quote of an unknown duration": ("/video/quote", "post", "400", lambda c: c.post(
        "/video/quote", {**VIDEO, "duration": "99s"})),
    "401 balance without a key": ("/billing/balance", "get", "401",
                                  lambda c: c.anonymous("GET", "/billing/balance")),
    "401 chat with an unknown key": ("/chat/completions", "post", "401", lambda c: c.post(
        "/chat/completions", CHAT, headers={"Authorization": "Bearer not-a-key"})),
    "401 key list with an inference key": ("/api_keys", "get", "401",
                                           lambda c: c.get("/api_keys")),
    "402 chat of an account without credit": ("/chat/completions", "post", "402", lambda c: (
        c.post("/chat/completions", CHAT, headers=c.poor_key()))),
    "402 video of an account without credit": ("/video/queue", "post", "402", lambda c: c.post(
        "/video/queue", VIDEO, headers=c.poor_key())),
    "402 chat without credentials": ("/chat/completions", "post", "402",
                                     lambda c: c.anonymous("POST", "/chat/completions",
                                                           json=CHAT)),
    "402 chat of a wallet without credit": ("/chat/completions", "post", "402",
                                            lambda c: _signed_in_without_credit(c)),
    "402 top-up without a payment": ("/x402/top-up", "post", "402",
                                     lambda c: c.anonymous("POST", "/x402/top-up")),
    "415 chat sent as text": ("/chat/completions", "post", "415", lambda c: c.post(
        "/chat/completions", content=b"Say hello.", headers={"Content-Type": "text/plain"})),
    "415 upscale sent as text": ("/image/upscale", "post", "415", lambda c: c.post(
        "/image/upscale", content=b"not an image", headers={"Content-Type": "text/plain"})),
    "404 chat of an unknown model": ("/chat/completions", "post", "404", lambda c: c.post(
        "/chat/completions", {**CHAT, "model": "no-such-model"})),
    "404 embeddings of an unknown model": ("/embeddings", "post", "404", lambda c: c.post(
        "/embeddings", {"model": "no-such-model", "input": "hello"})),
    "404 unknown character": ("/characters/{slug}", "get", "404",
                              lambda c: c.get("/characters/nobody")),
    "404 reviews of an unknown character": ("/characters/{slug}/reviews", "get", "404",
                                            lambda c: c.get("/characters/nobody/reviews")),
    "404 retrieve of an unknown video job": ("/video/retrieve", "post", "404", lambda c: c.post(
        "/video/retrieve", {"model": VIDEO["model"], "queue_id": UNKNOWN_JOB})),
    "410 sunset usage": ("/billing/usage", "get", "410",
                         lambda c: c.get("/billing/usage", admin=True)),
    "410 sunset usage without a key": ("/billing/usage", "get", "410",
                                       lambda c: c.anonymous("GET", "/billing/usage")),
}


def _one_of_as_any_of(schema: Any) -> Any:
    """The reference's 402 `oneOf` [standard error, x402 body] read as `anyOf`: the x402 body
    has an `error` string too, so it is valid under both branches (the spec's 402 variants)."""
    if isinstance(schema, dict):
        return {("anyOf" if key == "oneOf" else key): _one_of_as_any_of(value)
                for key, value in schema.items()}
    if isinstance(schema, list):
        return [_one_of_as_any_of(item) for item in schema]
    return schema


def error_schema(path: str, method: str, status: str) -> dict[str, Any]:
    if status not in reference_document()["paths"][path][method]["responses"]:
        return component_schema("StandardError")
    schema = reference_schema(path, method, status)
    return _one_of_as_any_of(schema) if status == "402" else schema


@pytest.mark.parametrize("case", list(REFUSALS))
def test_a_refusal_parses_as_the_reference_publishes_it(caller: Caller, case: str):
    path, method, status, call = REFUSALS[case]

    resp = call(caller)

    assert resp.status_code == int(status), resp.text
    assert resp.headers["content-type"].startswith("application/json")
    assert schema_errors(error_schema(path, method, status), resp.json()) == []


# ---- every route the sweep calls, asked wrongly ---------------------------------------------

PATH_VALUES = {"{id}": "no-such-key", "{slug}": "nobody", "{network}": "ethereum-mainnet",
               "{walletAddress}": "0x0000000000000000000000000000000000000001"}
WRONG_TYPES = {"model": 5, "prompt": 7, "input": 9, "messages": "hello", "id": 3,
               "queue_id": 1, "apiKeyType": "NOPE", "duration": 4, "jsonrpc": 2}
BAD_QUERY = {"type": "nope", "lookback": "x", "page": "0", "pageSize": "0", "limit": "0",
             "startDate": "yesterday"}


def _wrong_asks(c: Caller, method: str, url: str) -> dict[str, httpx.Response]:
    admin, inference = c.auth(admin=True), c.auth()
    ask = {"without credentials": {}, "with an unknown key": {
        "headers": {"Authorization": "Bearer not-a-key"}}}
    if method in ("post", "patch"):
        ask |= {"with an empty body": {"headers": admin, "json": {}},
                "with fields of the wrong type": {"headers": admin, "json": WRONG_TYPES},
                "with an inference key and an empty body": {"headers": inference, "json": {}}}
    else:
        ask |= {"with a bad query": {"headers": admin, "params": BAD_QUERY},
                "with an inference key": {"headers": inference}}
    return {name: c.gw.client.request(method.upper(), url, **kw) for name, kw in ask.items()}


# The routes the sweep calls, and those served whose success is not JSON (their refusals are).
SERVED_ROUTES = sorted({(s.path, s.method) for s in SWEEP.values()} | {
    route for route, reason in NOT_EXERCISED.items()
    if reason.startswith(("success is binary", "sunset"))})


@pytest.mark.parametrize("route", SERVED_ROUTES,
                         ids=[f"{method.upper()} {path}" for path, method in SERVED_ROUTES])
def test_a_route_asked_wrongly_refuses_as_the_reference_publishes(caller: Caller,
                                                                  route: tuple[str, str]):
    path, method = route
    url = "/api/v1" + path
    for placeholder, value in PATH_VALUES.items():
        url = url.replace(placeholder, value)

    answers = _wrong_asks(caller, method, url)

    refusals = {name: resp for name, resp in answers.items() if resp.status_code >= 400}
    assert {name: resp.status_code for name, resp in answers.items()
            if resp.status_code >= 500} == {}
    assert {name: resp.headers["content-type"] for name, resp in refusals.items()
            if not resp.headers["content-type"].startswith("application/json")} == {}
    assert {name: (resp.status_code, errors) for name, resp in refusals.items()
            if (errors := schema_errors(error_schema(path, method, str(resp.status_code)),
                                        resp.json()))} == {}
