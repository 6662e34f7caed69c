"""JSON bodies capped where the reference caps them: 35 MB once the caller is known (a
413 `{code: PAYLOAD_TOO_LARGE, error}` past it, declared or streamed), 1 MB before."""

from __future__ import annotations

import json

from serve_app.caller_gate import ANONYMOUS_BODY_BYTES
from serve_app.middleware import MAX_BODY_BYTES
from tests.unit.conftest import Gateway
from tests.unit.http.test_body_before_caller import Upload, call, run

CHAT = "/api/v1/chat/completions"
THIRTY_FIVE_MB = 35 * 1024 * 1024


def _json_of_size(size: int) -> bytes:
    """A chat request of exactly `size` bytes (an unknown model, padded in a field)."""
    head = b'{"model": "no-such-model", "messages": [{"role": "user", "content": "'
    tail = b'"}]}'
    body = head + b"a" * (size - len(head) - len(tail)) + tail
    assert len(body) == size
    json.loads(body)
    return body


def _refusal(cap: int) -> dict:
    return {"code": "PAYLOAD_TOO_LARGE",
            "error": f"Request body exceeds the maximum allowed size ({cap} bytes)."}


def test_a_known_callers_json_body_of_35_mb_is_read_and_one_byte_more_is_a_413(
        gateway: Gateway) -> None:
    assert MAX_BODY_BYTES == THIRTY_FIVE_MB
    headers = {**gateway.auth(gateway.create_key()["apiKey"]),
               "content-type": "application/json"}

    at_cap = gateway.client.post(CHAT, content=_json_of_size(THIRTY_FIVE_MB), headers=headers)
    over = gateway.client.post(CHAT, content=_json_of_size(THIRTY_FIVE_MB + 1),
                               headers=headers)

    # Read and parsed: the route's own answer (the model is unknown), not the cap's.
    assert at_cap.status_code == 404, at_cap.text[:300]
    assert at_cap.json()["code"] == "MODEL_NOT_FOUND"
    assert over.status_code == 413
    assert over.json() == _refusal(THIRTY_FIVE_MB)


def test_a_known_callers_streamed_body_past_35_mb_is_a_413(gateway: Gateway) -> None:
    key = gateway.create_key()["apiKey"]
    body = _json_of_size(THIRTY_FIVE_MB + 1)
    chunk = 1024 * 1024

    async def scenario(app):
        upload = Upload([body[i:i + chunk] for i in range(0, len(body), chunk)])
        status, _, answer = await call(app, "POST", CHAT, upload, {
            "authorization": f"Bearer {key}", "content-type": "application/json",
            "transfer-encoding": "chunked"})
        assert (status, answer) == (413, _refusal(THIRTY_FIVE_MB))

    run(gateway, scenario)


def test_a_caller_not_known_yet_keeps_the_1_mb_cap(gateway: Gateway) -> None:
    at_cap = gateway.client.post("/api/v1/x402/top-up", content=b" " * ANONYMOUS_BODY_BYTES,
                                 headers={"content-type": "application/json"})
    over = gateway.client.post("/api/v1/x402/top-up",
                               content=b" " * (ANONYMOUS_BODY_BYTES + 1),
                               headers={"content-type": "application/json"})

    assert at_cap.status_code != 413, at_cap.text
    assert over.status_code == 413
    assert over.json() == _refusal(ANONYMOUS_BODY_BYTES)
