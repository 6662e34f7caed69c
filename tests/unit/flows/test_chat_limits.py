"""Chat against a key's per-minute limits: a request counts its prompt and the most it may
generate toward tokens per minute when admitted, corrected to the measured tokens after the
answer; a fallback that answers is counted against its own limits first."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from tests.fakes import at_capacity, crashed
from tests.unit.flows.conftest import CATALOG

PRIMARY_TPM = 200  # below chat-primary's max_completion_tokens (256)
FALLBACK_RPM, FALLBACK_TPM = 3, 100_000


@pytest.fixture
def gateway_catalog(tmp_path: Path) -> Path:
    """The flows catalog, with small per-minute limits of its own on each chat model."""
    catalog = yaml.safe_load(CATALOG.read_text())
    for model in catalog["models"]:
        if model["id"] == "chat-primary":
            model["rate_limits"] = {"requests_per_minute": 100,
                                    "tokens_per_minute": PRIMARY_TPM}
        if model["id"] == "chat-fallback":
            model["rate_limits"] = {"requests_per_minute": FALLBACK_RPM,
                                    "tokens_per_minute": FALLBACK_TPM}
    path = tmp_path / "limited-catalog.yaml"
    path.write_text(yaml.safe_dump(catalog))
    return path


def _chat(gateway, key: str, *, fallbacks: bool = False, **body):
    return gateway.client.post("/api/v1/chat/completions", headers=gateway.auth(key), json={
        "model": "chat-primary", "messages": [{"role": "user", "content": "Name a fast fox"}],
        **({"fallbacks": [{"model": "chat-fallback"}]} if fallbacks else {}), **body})


@pytest.mark.parametrize("body", [{"max_tokens": 250}, {"max_completion_tokens": 250},
                                  {"max_tokens": 120, "n": 2}, {}],
                         ids=["max_tokens", "max_completion_tokens", "n", "the-model-cap"])
def test_a_request_that_may_generate_more_than_the_tpm_is_refused_before_the_model(
        fake_gateway, fakes, key, books, body):
    """The attack: a short prompt asking for more tokens than the key may use in a minute
    (before, only the prompt was counted, so it was admitted and generated them all)."""
    before = books.balance_nanos()

    resp = _chat(fake_gateway, key, **body)

    assert resp.status_code == 429, resp.text
    assert resp.json()["code"] == "RATE_LIMIT_EXCEEDED"
    assert f"more than the {PRIMARY_TPM} tokens per minute" in resp.json()["error"]
    assert fakes["text-xs"].calls == []
    assert books.entries() == 0
    assert books.balance_nanos() == before
    assert books.open_holds() == 0
    # nothing was counted: a small request still has the whole minute
    small = _chat(fake_gateway, key, max_tokens=20)
    assert small.status_code == 200, small.text
    assert small.headers["x-ratelimit-remaining-requests"] == "99"


def test_a_small_request_counts_its_completion_limit_then_its_measured_tokens(
        fake_gateway, fakes, key):
    first = _chat(fake_gateway, key, max_tokens=40)
    assert first.status_code == 200, first.text
    measured = first.json()["usage"]["total_tokens"]
    counted_at_admission = PRIMARY_TPM - int(first.headers["x-ratelimit-remaining-tokens"])
    assert counted_at_admission > 40 > measured  # the prompt and all 40 tokens it could use

    second = _chat(fake_gateway, key, max_tokens=40)  # the same admission count
    assert second.status_code == 200, second.text
    remaining = int(second.headers["x-ratelimit-remaining-tokens"])
    # what remains counted of the first request is what it measured
    assert remaining == PRIMARY_TPM - measured - counted_at_admission
    assert len(fakes["text-xs"].calls) == 2


def test_a_failed_request_keeps_only_its_prompt_estimate_counted(fake_gateway, fakes, key):
    fakes["text-xs"].fail_with(crashed())
    failed = _chat(fake_gateway, key, max_tokens=40)
    assert failed.status_code == 500, failed.text
    counted_at_admission = PRIMARY_TPM - int(failed.headers["x-ratelimit-remaining-tokens"])
    fakes["text-xs"].recover()

    resp = _chat(fake_gateway, key, max_tokens=40)

    assert resp.status_code == 200, resp.text
    prompt_estimate = counted_at_admission - 40
    assert int(resp.headers["x-ratelimit-remaining-tokens"]) == (
        PRIMARY_TPM - prompt_estimate - counted_at_admission)


def _remaining(resp) -> tuple[int, int]:
    return (int(resp.headers["x-ratelimit-remaining-requests"]),
            int(resp.headers["x-ratelimit-remaining-tokens"]))


def test_a_key_at_its_limit_on_the_fallback_is_not_served_by_it(fake_gateway, fakes, key,
                                                                  books):
    """The attack: a key spent on the fallback model names it as the fallback of a busy
    primary (before, only the primary's limits were asked, and the fallback answered)."""
    for _ in range(FALLBACK_RPM):
        assert _chat(fake_gateway, key, model="chat-fallback", max_tokens=20).status_code == 200
    fakes["text-xs"].fail_with(at_capacity())
    before = books.balance_nanos()

    resp = _chat(fake_gateway, key, fallbacks=True, max_tokens=20)

    assert resp.status_code == 429, resp.text
    assert "chat-fallback" in resp.json()["error"]
    assert resp.headers["x-ratelimit-remaining-requests"] == "0"
    assert len(fakes["text-xs"].calls) == 1  # the primary was tried
    assert len(fakes["text-s"].calls) == FALLBACK_RPM  # the direct ones only
    assert books.charges(resp.headers["cf-ray"]) == []
    assert books.balance_nanos() == before
    assert books.open_holds() == 0


def test_a_fallback_that_answers_counts_toward_its_own_limits(fake_gateway, fakes, key, books):
    direct = _chat(fake_gateway, key, model="chat-fallback", max_tokens=20)
    assert direct.status_code == 200, direct.text
    requests, tokens = _remaining(direct)
    assert requests == FALLBACK_RPM - 1
    admitted = FALLBACK_TPM - tokens  # the prompt estimate and 20: the same for each request
    fakes["text-xs"].fail_with(at_capacity())

    resp = _chat(fake_gateway, key, fallbacks=True, max_tokens=20)

    assert resp.status_code == 200, resp.text
    assert resp.headers["x-service-model-id"] == "chat-fallback"
    assert books.only_charge(resp.headers["cf-ray"]).model_id == "chat-fallback"
    assert _remaining(resp) == (
        FALLBACK_RPM - 2, FALLBACK_TPM - direct.json()["usage"]["total_tokens"] - admitted)
    fakes["text-xs"].recover()
    # the fallback's count was corrected to what it measured ...
    after = _chat(fake_gateway, key, model="chat-fallback", max_tokens=20)
    assert _remaining(after) == (FALLBACK_RPM - 3,
                                 _remaining(resp)[1] - resp.json()["usage"]["total_tokens"])
    assert _chat(fake_gateway, key, model="chat-fallback", max_tokens=20).status_code == 429
    # ... and the primary, which failed, keeps the prompt estimate of its request
    primary = _chat(fake_gateway, key, max_tokens=20)
    assert primary.status_code == 200, primary.text
    assert _remaining(primary)[1] == PRIMARY_TPM - (admitted - 20) - admitted
