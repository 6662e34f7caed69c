"""x402 top-ups: a signed USDC payment becomes wallet credit, exactly once.

The way of one payment:
  1. count the attempt against its client address's and the replica's per-minute buckets
     (429 with Retry-After), before the header is decoded: fresh payer addresses cost the
     attacker nothing, a client address and the global count do;
  2. decode the payment header and match it to a requirement we issue (auth/x402);
  3. check its signature here, before anything is written, then count the attempt against
     its payer's per-minute cap (429 with Retry-After past TOP_UPS_PER_MINUTE); a payment
     already credited or being processed is refused from a read (409), nothing written;
  4. the facilitator verifies it;
  5. claim it: a PENDING row keyed by what makes the payment unique on its chain (EIP-3009
     authorization nonce, the Solana transfer message), written in a transaction of its own
     (not the money writer's). A replay, or a second submission racing the first, finds the
     row and is refused;
  6. the facilitator settles it (moves the money);
  7. credit the wallet and mark the row CREDITED in one transaction (the money writer).
A facilitator that refuses to verify leaves nothing written; one that refuses to settle drops
the claim, so the same payment may be submitted again; one that does not confirm a settlement
leaves it PENDING for the operator.
"""

from __future__ import annotations

import asyncio
import logging
import os
from collections.abc import Mapping
from dataclasses import dataclass
from decimal import Decimal, InvalidOperation
from typing import Any

from sqlalchemy import delete, select, update
from sqlalchemy.engine import Engine
from sqlmodel import Session

from serve_app.billing.journal import add_entry
from serve_app.billing.ledger import Balances
from serve_app.billing.service import Billing
from serve_app.billing.wallet_accounts import find_or_create_wallet_account
from serve_app.db.engine import dialect_insert, run_in_session
from serve_app.db.tables import EntryKind, PaymentStatus, X402Payment, utcnow
from serve_app.errors import ApiError, invalid_request, retry_after_s
from serve_app.limits.core import OK
from serve_app.limits.limit_headers import limit_headers
from serve_app.limits.policy import WINDOW_MS
from serve_app.limits.rate_limits import RateLimits
from serve_app.money import NANOS_PER_UNIT, from_nanos
from serve_app.net_guard import is_loopback
from serve_app.wallets.payment_required import encode_header, resource
from serve_app.wallets.sign_in import first_header
from serve_app.wallets.x402 import (
    FacilitatorClient,
    PaymentConfig,
    SettleResult,
    VerifiedPayment,
    X402PaymentError,
    accepts,
    decode_payment_header,
    match_requirement,
    verify_payment,
)
from serve_app.wallets.x402.requirements import X402_VERSION

logger = logging.getLogger("serve_app.billing")

# Top-up attempts a payer address may make per minute (counted once its signature checks out,
# so that nobody else can spend an address's attempts): each attempt claims a row and calls
# the facilitator.
TOP_UPS_PER_MINUTE = 10
# Top-up attempts one client address may make per minute, and all clients together (each
# replica's limiter backend counts them: shared across replicas on Redis or Ray), counted
# before the payment header is decoded (X402_TOP_UPS_PER_CLIENT_PER_MINUTE,
# X402_TOP_UPS_PER_MINUTE).
DEFAULT_TOP_UPS_PER_CLIENT = 10
DEFAULT_TOP_UPS_GLOBAL = 600

NANOS_PER_BASE_UNIT = NANOS_PER_UNIT // 10**6  # USDC has 6 decimals
PAYMENT_HEADERS = ("payment-signature", "x-402-payment", "x-payment")


def payment_header(headers: Mapping[str, str]) -> str | None:
    return first_header(headers, PAYMENT_HEADERS)


def _already_credited() -> X402PaymentError:
    return X402PaymentError(409, "X402_PAYMENT_ALREADY_USED",
                            "This payment has already been credited",
                            reason="payment_already_used")


def not_configured() -> ApiError:
    return ApiError(503, "Top-ups are not available on this server: the operator has not set "
                         "X402_FACILITATOR_URL and the X402_PAY_TO_* receiving wallets",
                    code="X402_NOT_CONFIGURED")


def parse_amount(value: str | None, config: PaymentConfig) -> Decimal:
    """The top-up amount a client asks requirements for (USD); the minimum by default.
    `accepts` checks the range."""
    if value is None or value == "":
        return config.min_top_up_usd
    try:
        amount = Decimal(value)
    except InvalidOperation:
        amount = Decimal("NaN")
    if not amount.is_finite():
        raise invalid_request("amount must be a number of USD", "amount")
    return amount


@dataclass(frozen=True, slots=True)
class Credited:
    wallet_address: str
    account_id: str
    amount_nanos: int
    balance: Balances
    payment_id: str


def _refuse_known(session: Session, payment_id: str) -> None:
    """409 for a payment already claimed (credited, or being processed): a read, no write."""
    status = session.execute(select(X402Payment.status).where(
        X402Payment.payment_id == payment_id)).scalar_one_or_none()
    if status is None:
        return
    if status == PaymentStatus.CREDITED:
        raise _already_credited()
    raise _in_progress()


def _in_progress() -> X402PaymentError:
    return X402PaymentError(409, "X402_PAYMENT_IN_PROGRESS",
                            "This payment is being processed by another request",
                            reason="payment_in_progress")


def _claim(session: Session, paid: VerifiedPayment) -> None:
    """Write the PENDING row, committed (in a session of its own, off the money writer), or
    409 when the payment is already claimed."""
    claimed = session.execute(
        dialect_insert(session)(X402Payment).values(
            payment_id=paid.payment_id, status=PaymentStatus.PENDING.value,
            wallet_address=paid.payer, network=paid.network,
            amount_nanos=paid.amount_base_units * NANOS_PER_BASE_UNIT, created_at=utcnow())
        .on_conflict_do_nothing(index_elements=["payment_id"])
        .returning(X402Payment.payment_id)).first()
    session.commit()
    if claimed is None:
        _refuse_known(session, paid.payment_id)
        raise _in_progress()  # claimed and dropped meanwhile: the other request decides


def _unclaim(session: Session, payment_id: str) -> None:
    session.execute(delete(X402Payment).where(X402Payment.payment_id == payment_id,
                                               X402Payment.status == PaymentStatus.PENDING))


def _unclaim_committed(session: Session, payment_id: str) -> None:
    _unclaim(session, payment_id)
    session.commit()


def _credit(session: Session, paid: VerifiedPayment, transaction: str) -> Credited:
    marked = session.execute(
        update(X402Payment).where(X402Payment.payment_id == paid.payment_id,
                                  X402Payment.status == PaymentStatus.PENDING)
        .values(status=PaymentStatus.CREDITED.value, transaction=transaction,
                credited_at=utcnow()))
    if marked.rowcount != 1:  # cannot happen while the claim is ours; never credit twice
        raise _already_credited()
    account = find_or_create_wallet_account(session, paid.payer)
    amount = paid.amount_base_units * NANOS_PER_BASE_UNIT
    balance = add_entry(session, account.account_id, EntryKind.TOP_UP, usd_nanos=amount,
                        source=paid.payment_id)
    session.execute(update(X402Payment).where(X402Payment.payment_id == paid.payment_id)
                    .values(account_id=account.account_id,
                            balance_after_nanos=balance.usd_nanos))
    return Credited(paid.payer, account.account_id, amount, balance, paid.payment_id)


def listening_hosts(settings) -> set[str]:
    """Every address this platform answers on: HOST, the Gateway's direct-ingress host and,
    under Serve, the HTTP proxy's host (`http_options` of the Serve config)."""
    hosts = {settings.host}
    if direct := os.environ.get("RAY_SERVE_DEFAULT_HTTP_HOST"):
        hosts.add(direct)
    try:
        import ray

        if ray.is_initialized():
            from ray.serve.context import _get_global_client

            hosts.add(_get_global_client().http_config.host)
    except Exception:  # not under Serve (tests, plain uvicorn)
        pass
    return hosts


def pending_payments(session: Session) -> list[dict]:
    """Payments whose settlement was never confirmed (facilitator timeout, crash)."""
    rows = session.execute(select(X402Payment).where(
        X402Payment.status == PaymentStatus.PENDING).order_by(X402Payment.created_at)).scalars()
    return [{"paymentId": p.payment_id, "wallet": p.wallet_address, "network": p.network,
             "amountUsd": float(from_nanos(p.amount_nanos)), "createdAt": str(p.created_at)}
            for p in rows]


def resolve_pending(session: Session, payment_id: str, transaction: str | None) -> dict:
    """The operator's verdict on a PENDING payment, after checking the chain: credit it (it
    settled as `transaction`) or drop the claim (it never settled; it may be sent again)."""
    row = session.get(X402Payment, payment_id)
    if row is None or row.status != PaymentStatus.PENDING:
        raise ValueError(f"no PENDING payment {payment_id!r}")
    if transaction is None:
        _unclaim(session, payment_id)
        return {"paymentId": payment_id, "dropped": True}
    paid = VerifiedPayment(network=row.network, payer=row.wallet_address,
                           amount_base_units=row.amount_nanos // NANOS_PER_BASE_UNIT,
                           payment_id=payment_id)
    credited = _credit(session, paid, transaction)
    return {"paymentId": payment_id, "credited": float(from_nanos(credited.amount_nanos)),
            "wallet": credited.wallet_address}


class TopUps:
    """Top-ups: what to pay (the 402), and a payment header turned into credit."""

    def __init__(self, billing: Billing, config: PaymentConfig, facilitator_url: str | None,
                 *, listen_hosts: set[str], database: Engine,
                 limits: RateLimits | None = None,
                 per_client_per_minute: int = DEFAULT_TOP_UPS_PER_CLIENT,
                 global_per_minute: int = DEFAULT_TOP_UPS_GLOBAL) -> None:
        self.billing = billing
        self.limits = limits
        # Claims are written here (the money writer only credits).
        self.database = database
        self.per_client_per_minute = per_client_per_minute
        self.global_per_minute = global_per_minute
        self.config = config
        self._facilitator_url = facilitator_url
        self._facilitator: FacilitatorClient | None = None
        self._stop_dev: Any = None
        self._settling: set[asyncio.Future] = set()
        if facilitator_url == "dev":
            exposed = sorted(host for host in listen_hosts if not is_loopback(host))
            if exposed:
                raise ValueError(
                    "X402_FACILITATOR_URL=dev moves no money and credits every valid signature: "
                    f"it is refused while the platform listens on {', '.join(exposed)}; listen "
                    "on a loopback address only, or point X402_FACILITATOR_URL at a real "
                    "facilitator")
            logger.warning("X402_FACILITATOR_URL=dev: top-ups are checked by the bundled "
                           "development facilitator, which MOVES NO MONEY; never use it in "
                           "production")

    @property
    def available(self) -> bool:
        return bool(self._facilitator_url) and bool(self.config.networks)

    def facilitator(self) -> FacilitatorClient:
        if self._facilitator is None:
            url = self._facilitator_url
            if url == "dev":
                from serve_app.wallets.x402.dev_facilitator import start_in_thread

                url, self._stop_dev = start_in_thread(
                    host="127.0.0.1", solana_fee_payer=self.config.solana_fee_payer)
            assert url is not None
            self._facilitator = FacilitatorClient(url)
        return self._facilitator

    def requirements(self, resource_url: str, amount_usd: Decimal) -> ApiError:
        """402 with what to pay: one `accepts` entry per network we receive on."""
        if not self.available:
            raise not_configured()
        offered = accepts(self.config, amount_usd)
        header = encode_header({"x402Version": X402_VERSION, "error": "Payment required",
                                "resource": resource(resource_url, "Wallet credit top-up"),
                                "accepts": offered})
        return ApiError(402, "Payment required", headers={"PAYMENT-REQUIRED": header},
                        raw_body={"x402Version": X402_VERSION, "accepts": offered})

    async def top_up(self, header_value: str, client_address: str) -> tuple[dict, str]:
        """Credit the payment in `header_value` sent from `client_address`; (answer body,
        PAYMENT-RESPONSE header)."""
        if not self.available:
            raise not_configured()
        await self._count_client(client_address)
        payload = decode_payment_header(header_value)
        requirement = match_requirement(payload, self.config)
        paid = verify_payment(payload, requirement)
        await self._count_attempt(paid.payer)
        await run_in_session(self.database, lambda s: _refuse_known(s, paid.payment_id))
        await self.facilitator().verify(payload, requirement)  # nothing written before
        # From the claim on, the payment runs to its end even if the client hangs up (Serve
        # cancels the request): money that moved is credited, a refusal frees the claim.
        task = asyncio.ensure_future(self._claim_settle_credit(payload, requirement, paid))
        self._settling.add(task)
        task.add_done_callback(self._settling.discard)
        credited, settled = await asyncio.shield(task)
        logger.info("credited %s USD to wallet %s (payment %s, transaction %s)",
                    from_nanos(credited.amount_nanos), paid.payer, paid.payment_id,
                    settled.transaction)
        body = {"success": True, "data": {
            "walletAddress": credited.wallet_address,
            "amountCredited": float(from_nanos(credited.amount_nanos)),
            "newBalance": float(from_nanos(credited.balance.usd_nanos)),
            "paymentId": credited.payment_id,
        }}
        return body, settled.payment_response_header()

    async def _count_client(self, client_address: str) -> None:
        """429 past the client address's attempts in its minute, then past everyone's: before
        the header is decoded (an attempt the client's bucket refuses spends no global one)."""
        await self._count(f"client:{client_address}", self.per_client_per_minute,
                          f"for client address {client_address}")
        await self._count("all", self.global_per_minute, "on this server")

    async def _count_attempt(self, payer: str) -> None:
        """429 (with Retry-After) past TOP_UPS_PER_MINUTE attempts of `payer` in its minute:
        before the claim and the facilitator, so a refused payment stays unused."""
        owner = f"wallet:{payer.lower() if payer.startswith('0x') else payer}"
        await self._count(owner, TOP_UPS_PER_MINUTE, f"for wallet {payer}")

    async def _count(self, owner: str, per_minute: int, whose: str) -> None:
        if self.limits is None:
            return
        outcome = await self.limits.count_account(owner, "x402_top_up", per_minute)
        if outcome.code == OK:
            return
        now_ms = self.limits.clock() * 1000
        retry_after = retry_after_s((outcome.window_ms + WINDOW_MS - now_ms) / 1000)
        message = (f"Too many top-up attempts: at most {per_minute} per minute {whose}; "
                   f"retry after {retry_after} seconds (nothing was charged and the payment "
                   "was not used)")
        raise ApiError(429, message, code="RATE_LIMIT_EXCEEDED",
                       headers=limit_headers(retry_after_s=retry_after))

    async def _claim_settle_credit(self, payload, requirement: dict,
                                   paid: VerifiedPayment) -> tuple[Credited, SettleResult]:
        """Claim the verified payment, settle it, credit it (the money writer's one
        transaction)."""
        await run_in_session(self.database, lambda s: _claim(s, paid))
        try:
            settled = await self.facilitator().settle(payload, requirement)
        except X402PaymentError:  # refused: nothing moved, the payment may be sent again
            await run_in_session(self.database,
                                 lambda s: _unclaim_committed(s, paid.payment_id))
            raise
        except ApiError as exc:
            # Unreachable or timed out while settling: the money may have moved. The claim
            # stays PENDING (never credited twice); the operator reconciles it.
            logger.error("settling payment %s of %s: %s; left PENDING for reconciliation",
                         paid.payment_id, paid.payer, exc.message)
            raise ApiError(502, "The payment facilitator did not confirm the settlement; "
                                f"nothing was credited. Payment {paid.payment_id} is held for "
                                "the operator to reconcile", code=exc.code) from exc
        credited = await self.billing.writer.run(
            lambda s: _credit(s, paid, settled.transaction))
        self.billing.remember_balance(credited.account_id, credited.balance)
        return credited, settled

    def close(self) -> None:
        if self._stop_dev is not None:
            self._stop_dev()
