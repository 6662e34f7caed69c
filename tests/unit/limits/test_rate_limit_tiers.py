"""Rate-limit tiers: the tier file, `inference-admin set-tier`, the limits an account on a tier
gets on model requests and in `/api_keys/rate_limits`, and the migration that adds the tier."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
import yaml
from alembic import command
from sqlalchemy import text

from serve_app.accounts.key_store import KeyStore
from serve_app.accounts.provisioning import bootstrap
from serve_app.accounts.secrets import generate_secret, hash_secret
from serve_app.cli import run as cli
from serve_app.db.engine import alembic_config, make_engine, migrate
from serve_app.limits.policy import DEFAULT_LIMITS, load_tiers
from serve_app.models.catalog import read_catalog_file
from serve_app.settings import Settings
from tests.conftest import _PG_REASON, drop_postgres_schema, new_postgres_schema
from tests.unit.conftest import Gateway, make_gateway

# The spec's table (docs: inference-api.md, Limits): class -> rpm, tpm, partner rpm, partner tpm.
SPEC_TABLE = {
    "XS": (500, 5_000_000, 500, 10_000_000),
    "S": (150, 3_000_000, 300, 6_000_000),
    "M": (100, 2_000_000, 200, 4_000_000),
    "L": (100, 2_000_000, 150, 3_000_000),
    "IMAGE": (20, None, 60, None),
    "SPEECH": (60, None, 120, None),
}
CHAT_MODEL = "smollm2-135m-instruct"  # class XS
EMBEDDING_MODEL = "text-embedding-all-minilm-l6-v2"  # class XS


def _times(row: tuple, factor: int) -> tuple:
    return tuple(None if v is None else v * factor for v in row)


def test_the_shipped_tiers_are_the_spec_table_ten_times_it_and_a_benchmark_tier():
    tiers = load_tiers(Settings().rate_limit_tiers)
    assert tiers.names == ["default", "scale", "benchmark"]
    assert dict(tiers.tables["default"]) == SPEC_TABLE == DEFAULT_LIMITS
    assert dict(tiers.tables["scale"]) == {c: _times(r, 10) for c, r in SPEC_TABLE.items()}
    for cls, (rpm, tpm, partner_rpm, partner_tpm) in tiers.tables["benchmark"].items():
        assert rpm == partner_rpm == 1_000_000, cls
        # Image and speech have no token limit on any tier, as in the spec's table.
        assert tpm == partner_tpm == (None if cls in ("IMAGE", "SPEECH") else 1_000_000_000)


def test_a_file_without_tiers_gives_the_spec_table_and_mistakes_name_the_file(tmp_path):
    empty = tmp_path / "tiers.yaml"
    empty.write_text("# no tiers yet\n")
    assert dict(load_tiers(empty).tables) == {"default": SPEC_TABLE}

    missing_class = tmp_path / "missing.yaml"
    missing_class.write_text("tiers:\n  gold:\n    XS: {requests_per_minute: 1, "
                             "tokens_per_minute: null, partner_requests_per_minute: 1, "
                             "partner_tokens_per_minute: null}\n")
    with pytest.raises(ValueError, match=r"(?s)missing\.yaml.*tier 'gold' must list exactly"):
        load_tiers(missing_class)
    bad_name = tmp_path / "bad.yaml"
    bad_name.write_text("tiers:\n  Gold Tier: {}\n")
    with pytest.raises(ValueError, match=r"bad\.yaml"):
        load_tiers(bad_name)


# --- the gateway in process (no model deployments: model requests are admitted, then 503) ----


_gateway = contextlib.contextmanager(make_gateway)


def _rate_limits(gw: Gateway, key: str | None = None) -> dict:
    """The tier and, per model, the limits `GET /api_keys/rate_limits` shows."""
    resp = gw.client.get("/api/v1/api_keys/rate_limits", headers=gw.auth(key))
    assert resp.status_code == 200, resp.text
    data = resp.json()["data"]
    return {"apiTier": data["apiTier"],
            **{m["apiModelId"]: {e["type"]: e["amount"] for e in m["rateLimits"]}
               for m in data["rateLimits"]}}


@pytest.fixture
def tier_gateway(database_url: str, tmp_path: Path) -> Iterator[Gateway]:
    """The gateway on SQLite and PostgreSQL; replicas look for key changes every 0.1 s."""
    with _gateway(Settings(data_dir=tmp_path, database_url=database_url,
                           key_sync_interval_s=0.1)) as gw:
        yield gw


def _keys_last_changed_long_ago(gw: Gateway) -> None:
    """As for keys made before the replica started: its sync no longer sees them as new."""
    with gw.services.engine.begin() as conn:
        conn.execute(text("UPDATE api_keys SET updated_at = :then"),
                     {"then": datetime.now(UTC) - timedelta(hours=1)})


def _wait_for_tier(gw: Gateway, tier: str, key: str | None = None) -> None:
    """Until the replica's key sync has picked the account's new tier up."""
    deadline = time.monotonic() + 120
    while _rate_limits(gw, key)["apiTier"]["id"] != tier and time.monotonic() < deadline:
        time.sleep(0.05)


def _embed(gw: Gateway, key: str | None = None):
    """A model request: its rate limits are applied (and shown) before the model, which is
    offline here, answers 503."""
    resp = gw.client.post("/api/v1/embeddings", headers=gw.auth(key),
                          json={"model": EMBEDDING_MODEL, "input": "hello"})
    assert resp.status_code == 503, resp.text
    assert resp.json()["code"] == "MODEL_OFFLINE"
    return resp


def _limit_headers(resp) -> tuple[str, str]:
    return resp.headers["x-ratelimit-limit-requests"], resp.headers["x-ratelimit-limit-tokens"]


def test_an_account_set_to_scale_gets_ten_times_the_limits_on_its_requests(tier_gateway):
    """The tier reaches a key the replica has cached within KEY_SYNC_INTERVAL_S."""
    gw = tier_gateway
    now = time.time()
    gw.services.limits.clock = lambda: now  # one window however long the sync takes
    _keys_last_changed_long_ago(gw)
    before = _embed(gw)
    assert _limit_headers(before) == ("500", "5000000")
    remaining = int(before.headers["x-ratelimit-remaining-requests"])

    assert gw.cli("set-tier", "scale")["rateLimitTier"] == "scale"
    # waited for where it costs no failed request (a poll of 503s would spend the error
    # budget on a slow sync)
    _wait_for_tier(gw, "scale")
    after = _embed(gw)
    assert _limit_headers(after) == ("5000", "50000000")
    # The same window goes on counting: what was used before the change still counts.
    used = 500 - remaining
    assert int(after.headers["x-ratelimit-remaining-requests"]) <= 5000 - used - 1


def test_a_benchmark_account_gets_the_benchmark_limits(tmp_path):
    settings = Settings(data_dir=tmp_path, admin_api_key="sk-load-test-admin-key-0001")
    bootstrap(settings)
    cli(["set-tier", "benchmark"], settings=settings)  # before the gateway starts
    with _gateway(settings) as gw:
        assert _limit_headers(_embed(gw)) == ("1000000", "1000000000")


def test_the_cli_sets_a_tier_and_refuses_an_unknown_one(database_url, tmp_path):
    settings = Settings(data_dir=tmp_path, database_url=database_url)
    bootstrap(settings)
    operator = cli(["accounts"], settings=settings)[0]
    assert operator["rateLimitTier"] == "default"

    changed = cli(["set-tier", "scale"], settings=settings)  # the operator's account
    assert (changed["id"], changed["rateLimitTier"]) == (operator["id"], "scale")

    other = cli(["create-account", "--usd", "1"], settings=settings)["accountId"]
    cli(["set-tier", "--account", other, "benchmark"], settings=settings)
    tiers = {a["id"]: a["rateLimitTier"] for a in cli(["accounts"], settings=settings)}
    assert tiers == {operator["id"]: "scale", other: "benchmark"}

    with pytest.raises(SystemExit, match=r"unknown rate-limit tier 'gold'.*default, scale, "
                                         r"benchmark"):
        cli(["set-tier", "--account", other, "gold"], settings=settings)
    with pytest.raises(SystemExit, match="no account 'nobody'"):
        cli(["set-tier", "--account", "nobody", "scale"], settings=settings)
    tiers = {a["id"]: a["rateLimitTier"] for a in cli(["accounts"], settings=settings)}
    assert tiers == {operator["id"]: "scale", other: "benchmark"}


def test_rate_limits_endpoint_shows_the_tier_and_its_limits(tier_gateway):
    gw = tier_gateway
    inference = gw.client.post("/api/v1/api_keys", headers=gw.auth(), json={
        "apiKeyType": "INFERENCE", "description": "app"}).json()["data"]["apiKey"]
    _keys_last_changed_long_ago(gw)
    default = _rate_limits(gw, inference)
    assert default["apiTier"] == {"id": "paid", "isCharged": True}
    assert default[CHAT_MODEL] == {"RPM": 500, "TPM": 5_000_000}

    gw.cli("set-tier", "scale")
    _wait_for_tier(gw, "scale", inference)
    scale = _rate_limits(gw, inference)
    assert scale["apiTier"] == {"id": "scale", "isCharged": True}
    assert scale[CHAT_MODEL] == {"RPM": 5_000, "TPM": 50_000_000}
    assert scale[EMBEDDING_MODEL] == {"RPM": 5_000, "TPM": 50_000_000}


def test_partner_accounts_get_the_partner_columns_of_their_tier(tmp_path):
    with _gateway(Settings(data_dir=tmp_path)) as gw:
        partner = gw.cli("create-account", "--usd", "5", "--partner")
        gw.cli("set-tier", "--account", partner["accountId"], "scale")
        shown = _rate_limits(gw, partner["apiKey"])
        assert shown["apiTier"] == {"id": "scale", "isCharged": True}
        assert shown[CHAT_MODEL] == {"RPM": 5_000, "TPM": 100_000_000}
        assert _rate_limits(gw)["apiTier"]["id"] == "paid"  # the operator's account is not


def test_catalog_overrides_apply_on_the_default_tier_only(tmp_path):
    default_catalog = Settings().model_catalog
    [chat] = [m for m in read_catalog_file(default_catalog)["models"] if m["id"] == CHAT_MODEL]
    # a catalog that includes the default one and overrides its chat model's limits
    catalog = {"include": [str(default_catalog.resolve())],
               "models": [{**chat, "rate_limits": {"requests_per_minute": 7}}]}
    path = tmp_path / "models.yaml"
    path.write_text(yaml.safe_dump(catalog))
    with _gateway(Settings(data_dir=tmp_path, model_catalog=path,
                           key_sync_interval_s=0.1)) as gw:
        assert _rate_limits(gw)[CHAT_MODEL] == {"RPM": 7, "TPM": 5_000_000}
        gw.cli("set-tier", "scale")
        _wait_for_tier(gw, "scale")
        assert _rate_limits(gw)[CHAT_MODEL] == {"RPM": 5_000, "TPM": 50_000_000}


# --- the migration ------------------------------------------------------------------------


@pytest.fixture(params=["sqlite", "postgresql"])
def empty_database_url(request, tmp_path: Path) -> Iterator[str]:
    """A database of each kind with no schema at all."""
    if request.param == "sqlite":
        yield f"sqlite:///{tmp_path / 'old.db'}"
        return
    if _PG_REASON:
        pytest.skip(_PG_REASON)
    url = new_postgres_schema("t")
    try:
        yield url
    finally:
        drop_postgres_schema(url)


def _tier_of_key(url: str, secret: str) -> str:
    engine = make_engine(url)
    try:
        return asyncio.run(KeyStore(engine).authenticate(secret)).rate_limit_tier
    finally:
        engine.dispose()


def test_the_migration_gives_existing_accounts_the_default_tier(empty_database_url, tmp_path):
    url = empty_database_url
    command.upgrade(alembic_config(url), "0004")  # a database from before tiers
    secret = generate_secret()
    now = datetime.now(UTC)
    engine = make_engine(url)
    with engine.begin() as conn:
        conn.execute(text(
            "INSERT INTO accounts (id, kind, usd_balance_nanos, diem_balance_nanos, is_partner,"
            " is_operator, created_at) VALUES ('acct-1', 'API', 0, 0, FALSE, TRUE, :now)"),
            {"now": now})
        conn.execute(text(
            "INSERT INTO api_keys (id, account_id, key_hash, last6, key_type, description,"
            " limit_period, model_privacy, created_at, updated_at) VALUES ('key-1', 'acct-1',"
            " :hash, :last6, 'ADMIN', 'old key', 'EPOCH', 'ALL', :now, :now)"),
            {"hash": hash_secret(secret), "last6": secret[-6:], "now": now})
    engine.dispose()

    migrate(url)
    settings = Settings(data_dir=tmp_path, database_url=url)
    [account] = cli(["accounts"], settings=settings)
    assert (account["id"], account["rateLimitTier"]) == ("acct-1", "default")
    assert _tier_of_key(url, secret) == "default"
    assert cli(["set-tier", "scale"], settings=settings)["rateLimitTier"] == "scale"
    assert _tier_of_key(url, secret) == "scale"

    command.downgrade(alembic_config(url), "0004")  # and back, keeping the account
    migrate(url)
    assert cli(["accounts"], settings=settings)[0]["rateLimitTier"] == "default"


def test_each_tier_has_its_share_of_a_busy_engine(tmp_path: Path) -> None:
    """`shares` in the tier file: a tier's weight in an engine's fair share; 1 unless listed,
    and an unknown tier has the default's."""
    from serve_app.limits.policy import RateLimitTiers

    shipped = load_tiers(Path(__file__).parents[3] / "configs" / "rate_limit_tiers.yaml")
    assert (shipped.share("default"), shipped.share("scale")) == (1.0, 4.0)
    assert shipped.share("gone-from-the-file") == 1.0
    assert RateLimitTiers.builtin().share("default") == 1.0

    tiers = yaml.safe_load(
        (Path(__file__).parents[3] / "configs" / "rate_limit_tiers.yaml").read_text())
    tiers["shares"] = {"scale": 2.5}
    good = tmp_path / "tiers.yaml"
    good.write_text(yaml.safe_dump(tiers))
    loaded = load_tiers(good)
    assert (loaded.share("scale"), loaded.share("benchmark"), loaded.share("default")) == \
        (2.5, 1.0, 1.0)
    for shares, words in (({"nobody": 2}, "not listed"), ({"scale": 0}, "greater than 0")):
        tiers["shares"] = shares
        good.write_text(yaml.safe_dump(tiers))
        with pytest.raises(ValueError, match=words):
            load_tiers(good)
