"""`inference-admin`: key and account administration straight against the database, for
operators who have no key yet (or lost it). Uses the same settings as the platform."""

from __future__ import annotations

import argparse
import json
import sys
from decimal import Decimal, InvalidOperation
from pathlib import Path

from sqlalchemy import update
from sqlmodel import Session, select

from serve_app import characters
from serve_app.accounts import keys as service
from serve_app.accounts.key_store import mark_account_keys_changed
from serve_app.accounts.provisioning import bootstrap, show_admin_key
from serve_app.billing import journal
from serve_app.billing.wallet_accounts import find_or_create_wallet_account
from serve_app.db import backup
from serve_app.db.engine import make_engine, migrate, pending_migrations, schema_revision
from serve_app.db.tables import Account, ApiKeyType, EntryKind, LimitPeriod, ModelPrivacy
from serve_app.errors import ApiError
from serve_app.limits.policy import load_tiers
from serve_app.models.catalog import load_catalog
from serve_app.money import MAX_AMOUNT_UNITS, as_number, to_nanos
from serve_app.schemas.api_keys import CreateApiKeyRequest
from serve_app.schemas.characters import CreateCharacterRequest, CreateReviewRequest
from serve_app.settings import Settings
from serve_app.wallets import topups
from serve_app.wallets.sign_in import normalize_address


def _account_id(session: Session, given: str | None) -> str:
    if given:
        if session.get(Account, given) is None:
            raise SystemExit(f"no account {given!r}")
        return given
    first = session.exec(select(Account).order_by(Account.created_at)).first()
    if first is None:
        raise SystemExit("the database has no account yet")
    return first.id


def _amount(text: str) -> Decimal:
    try:
        value = Decimal(text)
    except InvalidOperation as exc:
        raise argparse.ArgumentTypeError(f"not a number: {text!r}") from exc
    if not value.is_finite() or value < 0:
        raise argparse.ArgumentTypeError("must be a number, not negative")
    if value > MAX_AMOUNT_UNITS:  # its nano-units would not fit the 64-bit columns
        raise argparse.ArgumentTypeError(f"at most {MAX_AMOUNT_UNITS}")
    return value


def _reason(text: str) -> str:
    if not text.strip():
        raise argparse.ArgumentTypeError("must say why")
    if len(text) > 500:
        raise argparse.ArgumentTypeError("at most 500 characters")
    return text.strip()


def _audit(session: Session) -> dict:
    accounts = journal.audit(session)
    differing = [a.as_dict() for a in accounts if not a.agrees]
    return {"ok": not differing, "accounts": len(accounts), "differing": differing}


def _database(args: argparse.Namespace, url: str) -> dict | None:
    """The commands on the database itself, run before the first start's provisioning (which
    would migrate it and write an account): None for any other command."""
    try:
        if args.command == "backup":
            return backup.backup(url, args.path).as_dict()
        if args.command == "restore":
            return backup.restore(url, args.path).as_dict()
    except backup.BackupError as exc:
        raise SystemExit(f"error: {exc}") from None
    if args.command == "migrate":
        pending = pending_migrations(url)
        if args.check:
            return {"ok": not pending, "schemaRevision": schema_revision(url),
                    "pending": pending}
        migrate(url)
        return {"ok": True, "applied": pending, "schemaRevision": schema_revision(url)}
    if args.command == "audit":
        if pending_migrations(url):
            raise SystemExit("error: the database's schema is not this version's: run "
                             "`inference-admin migrate` first")
        engine = make_engine(url)
        try:
            with Session(engine) as session:
                return _audit(session)
        finally:
            engine.dispose()
    return None


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="inference-admin", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)

    create = sub.add_parser("create-key", help="create an API key and print it once")
    create.add_argument("--type", choices=[t.value for t in ApiKeyType], default="INFERENCE")
    create.add_argument("--description", default="")
    create.add_argument("--account")
    create.add_argument("--expires-at", help="ISO 8601 date or date-time")
    create.add_argument("--limit-usd", type=_amount)
    create.add_argument("--limit-diem", type=_amount)
    create.add_argument("--limit-period", choices=[p.value for p in LimitPeriod],
                        default="EPOCH")
    create.add_argument("--model-privacy", choices=[p.value for p in ModelPrivacy],
                        default="ALL")

    listing = sub.add_parser("list-keys", help="list the active keys of an account")
    listing.add_argument("--account")

    revoke = sub.add_parser("revoke-key", help="revoke a key by id")
    revoke.add_argument("id")
    revoke.add_argument("--account")

    credit = sub.add_parser("credit", help="add USD to an account's balance: an entry of its "
                                           "journal, with the reason and who gave it")
    credit.add_argument("--usd", type=_amount, required=True)
    credit.add_argument("--account")
    credit.add_argument("--reason", type=_reason, required=True,
                        help="why the credit is given (kept in the journal)")
    credit.add_argument("--actor", help="who gives it (default: the OS user)")

    sub.add_parser("audit", help="recompute every account's balances from its journal; exits "
                                 "non-zero naming each account that differs")
    backup = sub.add_parser("backup", help="write a consistent copy of the database to PATH "
                                           "(SQLite's online backup; pg_dump on PostgreSQL), "
                                           "safe while the platform runs")
    backup.add_argument("path", type=Path)
    restore = sub.add_parser("restore", help="restore a backup into the settings' database, "
                                             "which must be empty (platform stopped)")
    restore.add_argument("path", type=Path)
    migrate_cmd = sub.add_parser("migrate", help="bring the database's schema to this "
                                                 "version (alembic upgrade head)")
    migrate_cmd.add_argument("--check", action="store_true",
                             help="change nothing; exit non-zero when migrations are pending")

    stake = sub.add_parser("stake", help="set an account's staked tokens: each UTC day its "
                                         "DIEM allocation is 1 DIEM per staked token")
    stake.add_argument("--tokens", type=int, required=True)
    staker = stake.add_mutually_exclusive_group()
    staker.add_argument("--account")
    staker.add_argument("--wallet", help="an EVM or Solana address (its account is created "
                                         "if the wallet was never seen)")

    character = sub.add_parser("create-character", help="create a public character")
    character.add_argument("--slug", required=True)
    character.add_argument("--name", required=True)
    character.add_argument("--description", default="")
    character.add_argument("--system-prompt", default="")
    character.add_argument("--author", default="")
    character.add_argument("--tag", action="append", default=[])
    character.add_argument("--web-enabled", action="store_true")
    character.add_argument("--model", default=None,
                           help="its text model (default: the catalog's default text model)")

    review = sub.add_parser("add-review", help="add a review to a character")
    review.add_argument("slug")
    review.add_argument("--username", required=True)
    review.add_argument("--rating", type=int, required=True)
    review.add_argument("--message")
    review.add_argument("--locale")

    account = sub.add_parser("create-account", help="create an account with an ADMIN key "
                                                    "(printed once)")
    account.add_argument("--usd", type=_amount, default=Decimal(0))
    account.add_argument("--partner", action="store_true",
                         help="partner accounts get the partner rate-limit columns")
    account.add_argument("--description", default="Account admin key")
    account.add_argument("--actor", help="who gives its --usd (default: the OS user)")

    tier = sub.add_parser("set-tier", help="set an account's rate-limit tier (one of "
                                           "RATE_LIMIT_TIERS, configs/rate_limit_tiers.yaml)")
    tier.add_argument("tier")
    tier.add_argument("--account")

    sub.add_parser("accounts", help="list accounts with their balances and rate-limit tiers")
    sub.add_parser("pending-payments", help="x402 top-ups whose settlement was never "
                                            "confirmed (to check against the chain)")
    check = sub.add_parser("check-config", help="dry run of a Serve config: catalog, weights, "
                                                "resources, multi-node settings (exit 1 on "
                                                "an error)")
    check.add_argument("config", type=Path, help="a Serve config (configs/production.yaml)")
    check.add_argument("--catalog", type=Path, help="default: MODEL_CATALOG, as the platform")
    check.add_argument("--cluster", type=Path, help="the Ray cluster launcher's config "
                                                    "(default: cluster.yaml)")
    check.add_argument("--kuberay", type=Path, help="a RayService manifest or kustomize folder "
                       "(default: deploy/kubernetes/base/rayservice.yaml)")

    resolve = sub.add_parser("resolve-payment", help="credit a PENDING top-up that settled, "
                                                     "or drop one that did not")
    resolve.add_argument("payment_id")
    verdict = resolve.add_mutually_exclusive_group(required=True)
    verdict.add_argument("--settled-as", metavar="TRANSACTION",
                         help="the transaction that settled it: credit the wallet")
    verdict.add_argument("--drop", action="store_true", help="it never settled: drop the claim")
    return parser


def _accounts(session: Session) -> list[dict]:
    return [{"id": a.id, "kind": a.kind, "walletAddress": a.wallet_address,
             "usd": as_number(a.usd_balance_nanos), "diem": as_number(a.diem_balance_nanos),
             "stakedTokens": a.staked_tokens, "isPartner": a.is_partner,
             "rateLimitTier": a.rate_limit_tier}
            for a in session.exec(select(Account).order_by(Account.created_at)).all()]


def run(argv: list[str] | None = None, settings: Settings | None = None) -> dict | list:
    args = _parser().parse_args(argv)
    if args.command == "check-config":  # reads files only: no database, no bootstrap
        from serve_app import config_check  # Ray Serve and the deployments: seconds to import

        raise SystemExit(config_check.main(args))
    settings = settings or Settings()
    done = _database(args, settings.resolved_database_url)
    if done is not None:
        return done
    result = bootstrap(settings)
    show_admin_key(result, terminal_only=False)  # stderr (stdout is the JSON answer)
    engine = make_engine(settings.resolved_database_url)
    try:
        with Session(engine, expire_on_commit=False) as session:
            if args.command == "accounts":
                return _accounts(session)
            if args.command == "pending-payments":
                return topups.pending_payments(session)
            if args.command == "resolve-payment":
                try:
                    done = topups.resolve_pending(session, args.payment_id, args.settled_as)
                except ValueError as exc:
                    raise SystemExit(str(exc)) from None
                session.commit()
                return done
            if args.command == "create-account":
                new = Account(is_partner=args.partner)
                session.add(new)
                session.flush()
                if args.usd:
                    journal.add_entry(session, new.id, EntryKind.GRANT,
                                      usd_nanos=to_nanos(args.usd), source="create-account",
                                      reason="the credit of a new account",
                                      actor=args.actor or journal.operator_name())
                session.commit()
                key = service.create_key(session, new.id, CreateApiKeyRequest(
                    apiKeyType="ADMIN", description=args.description))
                return {"accountId": new.id, "apiKey": key["apiKey"], "keyId": key["id"]}
            if args.command == "create-character":
                req = CreateCharacterRequest(
                    slug=args.slug, name=args.name, description=args.description,
                    systemPrompt=args.system_prompt, author=args.author, tags=args.tag,
                    webEnabled=args.web_enabled, modelId=args.model)
                return characters.create_character(
                    session, catalog=load_catalog(settings.model_catalog), **req.columns())
            if args.command == "add-review":
                req = CreateReviewRequest(username=args.username, rating=args.rating,
                                          message=args.message, locale=args.locale)
                return characters.add_review(session, args.slug, **req.columns())
            if args.command == "stake" and args.wallet:
                address = normalize_address(args.wallet)
                account_id = find_or_create_wallet_account(session, address).account_id
            else:
                account_id = _account_id(session, args.account)
            if args.command == "create-key":
                limit = None
                if args.limit_usd is not None or args.limit_diem is not None:
                    limit = {"usd": args.limit_usd, "diem": args.limit_diem}
                req = CreateApiKeyRequest.model_validate({
                    "apiKeyType": args.type, "description": args.description,
                    "expiresAt": args.expires_at, "consumptionLimit": limit,
                    "limitPeriod": args.limit_period, "modelPrivacy": args.model_privacy})
                return service.create_key(session, account_id, req)
            if args.command == "list-keys":
                return service.list_keys(session, account_id)
            if args.command == "revoke-key":
                service.delete_key(session, account_id, args.id)
                return {"revoked": args.id}
            if args.command == "credit":
                journal.add_entry(session, account_id, EntryKind.GRANT,
                                  usd_nanos=to_nanos(args.usd), source="inference-admin credit",
                                  reason=args.reason,
                                  actor=args.actor or journal.operator_name())
                session.commit()
                return next(a for a in _accounts(session) if a["id"] == account_id)
            if args.command == "stake":
                if args.tokens < 0:
                    raise SystemExit("--tokens must not be negative")
                # The allocation of the current epoch is recomputed at the next request.
                session.execute(update(Account).where(Account.id == account_id).values(
                    staked_tokens=args.tokens, diem_epoch=None))
                session.commit()
                return next(a for a in _accounts(session) if a["id"] == account_id)
            if args.command == "set-tier":
                tiers = load_tiers(settings.rate_limit_tiers)
                if args.tier not in tiers:
                    raise SystemExit(f"unknown rate-limit tier {args.tier!r}; the tiers of "
                                     f"{settings.rate_limit_tiers}: {', '.join(tiers.names)}")
                session.execute(update(Account).where(Account.id == account_id).values(
                    rate_limit_tier=args.tier))
                # Replicas pick the new tier up with the account's keys at their next sync.
                mark_account_keys_changed(session, account_id)
                session.commit()
                return next(a for a in _accounts(session) if a["id"] == account_id)
            raise SystemExit(f"unknown command {args.command}")
    finally:
        engine.dispose()


def main(argv: list[str] | None = None) -> None:
    try:
        out = run(argv)
    except ApiError as err:
        print(f"error: {err.message}", file=sys.stderr)
        if err.details:
            print(json.dumps(err.details), file=sys.stderr)
        raise SystemExit(1) from err
    print(json.dumps(out, indent=2, default=str))
    if isinstance(out, dict) and out.get("ok") is False:  # audit, migrate --check
        raise SystemExit(1)


if __name__ == "__main__":
    main()
