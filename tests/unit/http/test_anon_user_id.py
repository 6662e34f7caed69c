"""`anon_user_id`, wherever it is accepted (chat, `/responses`, background removal, multi-edit
and edit, JSON or multipart), is checked as the spec says: 1 to 128 printable ASCII characters
(0x20 to 0x7E) without `||`. Anything else is a 400 detailed error naming the field, and
nothing is held or charged; a valid one is accepted."""

from __future__ import annotations

import pytest

INVALID = ["", "a||b", "x" * 129, "caf\u00e9", "tab\there", "line\nbreak", "\x7f", 42]
VALID = ["end-user-7", " spaced out ", "x" * 128, "~!@#$%^&*()|[]{}"]
CHAT = {"model": "default", "messages": [{"role": "user", "content": "hi"}]}
ROUTES = {
    "/api/v1/chat/completions": CHAT,
    "/api/v1/responses": {"model": "default", "input": "hi"},
    "/api/v1/image/background-remove": {"image": "aGVsbG8="},
    "/api/v1/image/multi-edit": {"prompt": "make it blue", "images": ["aGVsbG8="]},
    "/api/v1/image/edit": {"prompt": "make it blue", "image": "aGVsbG8="},
}


@pytest.mark.parametrize("path", list(ROUTES))
def test_an_invalid_anon_user_id_is_a_400_and_nothing_is_charged(fake_gateway, key, books,
                                                                 path):
    before = books.balance_nanos()
    for value in INVALID:
        resp = fake_gateway.client.post(path, headers=fake_gateway.auth(key),
                                        json={**ROUTES[path], "anon_user_id": value})

        assert resp.status_code == 400, (path, value, resp.text)
        body = resp.json()
        assert body["code"] == "INVALID_REQUEST" and isinstance(body["error"], str)
        assert body["details"]["anon_user_id"]["_errors"], (path, value)
        assert books.held(resp.headers["cf-ray"]) is None
    assert books.balance_nanos() == before
    assert books.open_holds() == 0


@pytest.mark.parametrize("path", ["/api/v1/image/background-remove", "/api/v1/image/edit"])
def test_a_multipart_upload_checks_it_too(fake_gateway, key, path):
    fields = {"anon_user_id": "a||b", **({"prompt": "make it blue"} if "edit" in path else {})}
    resp = fake_gateway.client.post(path, headers=fake_gateway.auth(key), data=fields,
                                    files={"image": ("a.png", b"\x89PNG not really", "image/png")})

    assert resp.status_code == 400, resp.text
    assert resp.json()["details"]["anon_user_id"]["_errors"]


@pytest.mark.parametrize("path", ["/api/v1/chat/completions", "/api/v1/responses"])
@pytest.mark.parametrize("value", [*VALID, None])  # null: as if left out
def test_a_valid_anon_user_id_is_accepted(fake_gateway, key, path, value):
    resp = fake_gateway.client.post(path, headers=fake_gateway.auth(key),
                                    json={**ROUTES[path], "anon_user_id": value})

    assert resp.status_code == 200, resp.text
