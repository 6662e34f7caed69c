"""First start: migrate the schema and, on an empty database, create the first account.

The first account gets `INITIAL_CREDIT_USD` and one ADMIN key: `ADMIN_API_KEY` when set,
otherwise a generated key that is shown once to the operator.
"""

from __future__ import annotations

import secrets
from dataclasses import dataclass

from sqlalchemy import func
from sqlmodel import Session, select

from serve_app.accounts.secrets import generate_secret, hash_secret
from serve_app.db.engine import make_engine, migrate
from serve_app.db.tables import Account, AccountKind, ApiKey, ApiKeyType, ServerSecret
from serve_app.money import to_nanos
from serve_app.settings import Settings

MIN_ADMIN_KEY_LENGTH = 20


CURSOR_SECRET = "usage_cursor"
DOWNLOAD_SECRET = "media_download"  # signs the delivery URLs of finished media


def ensure_secret(session: Session, name: str) -> str:
    """A random secret shared by every replica through the database, made on first use."""
    row = session.get(ServerSecret, name)
    if row is None:
        row = ServerSecret(name=name, value=secrets.token_hex(32))
        session.add(row)
        session.commit()
    return row.value


@dataclass(frozen=True)
class BootstrapResult:
    created: bool
    account_id: str
    generated_admin_key: str | None  # shown once, never stored


def bootstrap(settings: Settings) -> BootstrapResult:
    settings.data_dir.mkdir(parents=True, exist_ok=True)
    url = settings.resolved_database_url
    migrate(url)
    engine = make_engine(url)
    try:
        with Session(engine) as session:
            ensure_secret(session, CURSOR_SECRET)
            ensure_secret(session, DOWNLOAD_SECRET)
            existing = session.exec(select(Account).order_by(Account.created_at)).first()
            if existing is not None:
                return BootstrapResult(False, existing.id, None)
            if session.exec(select(func.count()).select_from(ApiKey)).one():
                raise RuntimeError("database has API keys but no account")
            secret = settings.admin_api_key
            generated = None
            if secret is None:
                secret = generated = generate_secret()
            elif len(secret) < MIN_ADMIN_KEY_LENGTH:
                raise ValueError(f"ADMIN_API_KEY must be at least {MIN_ADMIN_KEY_LENGTH} "
                                 "characters long")
            account = Account(kind=AccountKind.API, is_operator=True,
                              usd_balance_nanos=to_nanos(settings.initial_credit_usd))
            session.add(account)
            session.flush()
            session.add(ApiKey(account_id=account.id, key_hash=hash_secret(secret),
                               last6=secret[-6:], key_type=ApiKeyType.ADMIN,
                               description="First admin key"))
            session.commit()
            return BootstrapResult(True, account.id, generated)
    finally:
        engine.dispose()
