"""A key whose `modelPrivacy` excludes the model, answered as the reference answers it: 403
with a standard error (`{"error": ...}`, no code) naming the key's setting and the model,
before anything is held or charged."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from tests.unit.flows.conftest import CATALOG

ANONYMOUS = "chat-fallback"


@pytest.fixture
def gateway_catalog(tmp_path: Path) -> Path:
    """The flows catalog with one text model Anonymous."""
    catalog = yaml.safe_load(CATALOG.read_text())
    for model in catalog["models"]:
        if model["id"] == ANONYMOUS:
            model["privacy"] = "anonymized"
    path = tmp_path / "catalog.yaml"
    path.write_text(yaml.safe_dump(catalog))
    return path


def _chat(gateway, key: str, model: str):
    return gateway.client.post("/api/v1/chat/completions", headers=gateway.auth(key), json={
        "model": model, "messages": [{"role": "user", "content": "hi"}]})


@pytest.mark.parametrize("tier", ["PRIVATE_ONLY", "PRIVATE_TEXT"])
def test_a_key_kept_to_private_models_is_refused_an_anonymous_one(fake_gateway, books,
                                                                   tier: str) -> None:
    key = fake_gateway.create_key(modelPrivacy=tier)["apiKey"]
    before = books.balance_nanos(), books.entries()

    refused = _chat(fake_gateway, key, ANONYMOUS)

    assert refused.status_code == 403, refused.text
    assert refused.json() == {"error": (
        f"This API key is set to '{tier}', but `{ANONYMOUS}` is an Anonymous model. Choose a "
        "Private, TEE, or E2EE model, or change the model privacy setting of this API key.")}
    assert (books.balance_nanos(), books.entries()) == before and not books.open_holds()
    assert _chat(fake_gateway, key, "chat-primary").status_code == 200  # a Private model
    everything = fake_gateway.create_key(modelPrivacy="ALL")["apiKey"]
    assert _chat(fake_gateway, everything, ANONYMOUS).status_code == 200
