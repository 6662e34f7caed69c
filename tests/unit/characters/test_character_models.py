"""Every character has a model: a client of the reference, which validates `/characters`
against the published record (`modelId` a string), reads each character's model, whether it
was created naming one, without one (the default text model), or stored before that rule."""

from __future__ import annotations

from sqlmodel import Session

from serve_app.db.engine import make_engine
from serve_app.db.tables import Character
from tests.reference_api import response_schema, schema_errors


def _default_text_model(gateway) -> str:
    return gateway.client.get("/api/v1/models/traits",
                              params={"type": "text"}).json()["data"]["default"]


def _create(gateway, **fields):
    return gateway.client.post("/api/v1/characters", headers=gateway.auth(),
                               json={"name": fields.get("slug", "x").title(), **fields})


def test_a_character_created_without_a_model_has_the_default_text_model(gateway):
    created = _create(gateway, slug="sage", systemPrompt="You are a calm sage.")
    assert created.status_code == 200, created.text
    default = _default_text_model(gateway)
    assert created.json()["data"]["modelId"] == default
    key = gateway.create_key()["apiKey"]

    listed = gateway.client.get("/api/v1/characters", headers=gateway.auth(key))
    one = gateway.client.get("/api/v1/characters/sage", headers=gateway.auth(key))

    assert schema_errors(response_schema("/characters"), listed.json()) == []
    assert schema_errors(response_schema("/characters/{slug}"), one.json()) == []
    assert [c["modelId"] for c in listed.json()["data"]] == [default]
    assert one.json()["data"]["modelId"] == default


def test_a_character_stored_without_a_model_is_answered_with_the_default(gateway):
    engine = make_engine(gateway.settings.resolved_database_url)
    with Session(engine) as session:  # as characters were stored before every one had a model
        session.add(Character(slug="old-timer", name="Old Timer", model_id=None))
        session.commit()
    engine.dispose()
    key = gateway.create_key()["apiKey"]

    listed = gateway.client.get("/api/v1/characters", headers=gateway.auth(key)).json()
    one = gateway.client.get("/api/v1/characters/old-timer", headers=gateway.auth(key)).json()

    assert schema_errors(response_schema("/characters"), listed) == []
    assert listed["data"][0]["modelId"] == _default_text_model(gateway)
    assert one["data"]["modelId"] == _default_text_model(gateway)


def test_a_named_model_is_stored_by_its_id_and_an_unknown_one_refused(gateway):
    aliased = _create(gateway, slug="pirate", modelId="gpt-4o-mini")
    assert aliased.status_code == 200, aliased.text
    assert aliased.json()["data"]["modelId"] == "smollm2-135m-instruct"

    unknown = _create(gateway, slug="ghost", modelId="no-such-model")
    not_text = _create(gateway, slug="echo", modelId="text-embedding-all-minilm-l6-v2")

    for refused in (unknown, not_text):
        assert refused.status_code == 400
        assert refused.json()["code"] == "INVALID_REQUEST"
        assert refused.json()["details"]["modelId"]["_errors"]
    key = gateway.create_key()["apiKey"]
    slugs = [c["slug"] for c in gateway.client.get(
        "/api/v1/characters", headers=gateway.auth(key)).json()["data"]]
    assert slugs == ["pirate"]


def test_the_operator_cli_creates_characters_with_a_model(gateway):
    plain = gateway.cli("create-character", "--slug", "bard", "--name", "Bard")
    named = gateway.cli("create-character", "--slug", "scribe", "--name", "Scribe",
                        "--model", "default")

    assert plain["modelId"] == named["modelId"] == _default_text_model(gateway)
