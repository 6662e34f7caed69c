"""First start: migrate the schema and, on an empty database, create the first account.

The first account gets `INITIAL_CREDIT_USD` and one ADMIN key: `ADMIN_API_KEY` when set,
otherwise a generated key that is shown once to the operator.
"""

from __future__ import annotations

import logging
import secrets
import sys
from dataclasses import dataclass, field
from typing import TextIO

from sqlalchemy import func
from sqlmodel import Session, select

from serve_app.accounts.secrets import generate_secret, hash_secret
from serve_app.billing.journal import add_entry
from serve_app.db.engine import make_engine, migrate
from serve_app.db.tables import (
    Account,
    AccountKind,
    ApiKey,
    ApiKeyType,
    EntryKind,
    ServerSecret,
)
from serve_app.money import to_nanos
from serve_app.settings import Settings

logger = logging.getLogger("serve_app.accounts.provisioning")

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
    # Shown once (show_admin_key), never stored, never logged: kept out of the repr.
    generated_admin_key: str | None = field(repr=False)


def show_admin_key(result: BootstrapResult, stream: TextIO | None = None, *,
                   terminal_only: bool = True) -> None:
    """Show a generated first admin key once to the person starting the platform: printed on
    `stream` (stderr by default), never through `logging` (Ray writes replica and driver logs
    to files). With `terminal_only`, only when `stream` is a terminal: where it is not (a Serve
    config deployed by the controller, output redirected to a file), a notice without the key
    is logged and the operator makes a key with `inference-admin create-key`."""
    if not result.generated_admin_key:
        return
    stream = stream or sys.stderr
    if terminal_only and not stream.isatty():
        logger.warning("A first admin key was generated for account %s but no terminal is "
                       "attached to show it: create one with `inference-admin create-key "
                       "--account %s --type ADMIN`, or set ADMIN_API_KEY before the first start",
                       result.account_id, result.account_id)
        return
    print(f"\n  First admin API key (shown once, store it now):\n"
          f"    {result.generated_admin_key}\n", file=stream, flush=True)


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
            account = Account(kind=AccountKind.API, is_operator=True)
            session.add(account)
            session.flush()
            if settings.initial_credit_usd:
                add_entry(session, account.id, EntryKind.GRANT,
                          usd_nanos=to_nanos(settings.initial_credit_usd),
                          source="first start", reason="INITIAL_CREDIT_USD",
                          actor="first start")
            session.add(ApiKey(account_id=account.id, key_hash=hash_secret(secret),
                               last6=secret[-6:], key_type=ApiKeyType.ADMIN,
                               description="First admin key"))
            session.commit()
            return BootstrapResult(True, account.id, generated)
    finally:
        engine.dispose()
