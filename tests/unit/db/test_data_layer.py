"""The control plane in SQL, on SQLite and PostgreSQL: migrations, bootstrap, key lookup."""

from __future__ import annotations

import asyncio
from decimal import Decimal

import pytest
from sqlalchemy import event, inspect
from sqlmodel import Session, select

from serve_app.accounts.key_store import KeyStore
from serve_app.accounts.provisioning import bootstrap
from serve_app.cli import run as cli
from serve_app.db.engine import make_engine
from serve_app.db.tables import Account, ApiKey
from serve_app.errors import ApiError
from serve_app.money import from_nanos
from serve_app.settings import Settings


def test_the_migrations_build_exactly_the_tables_of_the_models(database_url):
    from alembic.autogenerate import compare_metadata
    from alembic.migration import MigrationContext
    from sqlmodel import SQLModel

    with make_engine(database_url).connect() as connection:
        differences = compare_metadata(MigrationContext.configure(connection), SQLModel.metadata)
    assert differences == []


def _settings(database_url: str, tmp_path, **extra) -> Settings:
    return Settings(database_url=database_url, data_dir=tmp_path, **extra)


def test_key_hash_has_a_unique_index(database_url):
    engine = make_engine(database_url)
    indexes = {i["name"]: i for i in inspect(engine).get_indexes("api_keys")}
    assert indexes["ix_api_keys_key_hash"]["unique"]
    assert indexes["ix_api_keys_key_hash"]["column_names"] == ["key_hash"]


def test_bootstrap_creates_the_first_account_with_credit_and_admin_key(database_url, tmp_path):
    admin = "sk-operator-chosen-admin-key-0001"
    result = bootstrap(_settings(database_url, tmp_path, admin_api_key=admin,
                                 initial_credit_usd=Decimal("25.5")))
    assert result.created and result.generated_admin_key is None
    engine = make_engine(database_url)
    with Session(engine) as session:
        account = session.exec(select(Account)).one()
        assert from_nanos(account.usd_balance_nanos) == Decimal("25.5")
        key = session.exec(select(ApiKey)).one()
        assert key.key_type == "ADMIN" and key.last6 == admin[-6:]
    store = KeyStore(engine)
    assert asyncio.run(store.authenticate(admin)).is_admin


def test_bootstrap_again_keeps_accounts_and_keys(database_url, tmp_path):
    first = bootstrap(_settings(database_url, tmp_path))
    assert first.generated_admin_key
    second = bootstrap(_settings(database_url, tmp_path, admin_api_key="sk-" + "z" * 30))
    assert not second.created and second.account_id == first.account_id
    store = KeyStore(make_engine(database_url))
    assert asyncio.run(store.authenticate(first.generated_admin_key)).is_admin
    with pytest.raises(ApiError):
        asyncio.run(store.authenticate("sk-" + "z" * 30))


def test_short_admin_api_key_is_refused(database_url, tmp_path):
    with pytest.raises(ValueError, match="at least"):
        bootstrap(_settings(database_url, tmp_path, admin_api_key="short"))


def test_key_lookup_is_one_query_then_served_from_the_cache(database_url, tmp_path):
    result = bootstrap(_settings(database_url, tmp_path))
    engine = make_engine(database_url)
    statements: list[str] = []
    event.listen(engine, "before_cursor_execute",
                 lambda _c, _cur, stmt, *_: statements.append(stmt))
    store = KeyStore(engine)

    async def twice():
        await store.authenticate(result.generated_admin_key)
        await store.authenticate(result.generated_admin_key)

    asyncio.run(twice())
    lookups = [s for s in statements if "api_keys" in s]
    assert len(lookups) == 1
    assert "key_hash" in lookups[0]


def test_cli_creates_keys_credits_and_revokes(database_url, tmp_path):
    settings = _settings(database_url, tmp_path)
    created = cli(["create-key", "--type", "INFERENCE", "--description", "from cli",
                   "--limit-usd", "3"], settings=settings)
    assert created["apiKey"].startswith("sk-")
    assert created["consumptionLimit"]["usd"] == 3
    store = KeyStore(make_engine(database_url))
    assert asyncio.run(store.authenticate(created["apiKey"])).id == created["id"]

    listed = cli(["list-keys"], settings=settings)
    assert created["id"] in {k["id"] for k in listed}

    before = cli(["accounts"], settings=settings)[0]["usd"]
    after = cli(["credit", "--usd", "2.25", "--reason", "a goodwill credit"],
                settings=settings)
    assert Decimal(str(after["usd"])) == Decimal(str(before)) + Decimal("2.25")
    staked = cli(["stake", "--tokens", "40"], settings=settings)
    assert staked["stakedTokens"] == 40

    cli(["revoke-key", created["id"]], settings=settings)
    fresh = KeyStore(make_engine(database_url))
    with pytest.raises(ApiError):
        asyncio.run(fresh.authenticate(created["apiKey"]))
