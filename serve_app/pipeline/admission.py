"""Admission of a billable request, in one rule: the rate limits (429), the checks of the
request, then the model's privacy tier (403) and the hold of the most the request may cost
(402). The limiter's decision starts first (`begin`); when the key's last count left it well
inside its limits, the hold runs beside it and a refusal by the limiter gives the hold back;
near its limits they run one after the other, so that a flood of refused requests writes
nothing to the ledger. The answers are the same either way: 429 before 400 before 402, and an
admitted request counts even when the hold refuses. The request's bill (pipeline/bill.py)
drives it: it checks the request while the limiter decides, then holds.
"""

from __future__ import annotations

import asyncio
import hashlib
from collections.abc import Awaitable, Callable, Sequence

from deployments.protocol import Tenant
from serve_app.accounts.key_store import KeyRecord
from serve_app.billing.ledger import Payer
from serve_app.billing.pricing import Cost, price
from serve_app.billing.service import Billing, Hold
from serve_app.errors import ApiError
from serve_app.limits.rate_limits import RateLimited, RateLimits, Ticket
from serve_app.models.catalog import CatalogModel
from serve_app.pipeline import respond
from serve_app.pipeline.context import RequestContext

# The most a request may use of a model, in its priced units ({"input": n, "output": m}).
MaxUnits = Callable[[CatalogModel], dict[str, int]]
# A limit other than the model's own per-minute limits (the crypto RPC proxy's caps).
LimitCheck = Callable[[], Awaitable[Ticket | None]]


def _diem_limit(key: KeyRecord) -> int | None:
    """The key's DIEM limit: `vcu` is DIEM's legacy name (the spec: "the legacy unit being
    deprecated in favor of diem"; the reference: "VCU (Legacy Diem)"), so a vcu limit caps
    the same DIEM spending, 1 VCU per DIEM, in the same window; with both, the lower holds."""
    limits = [n for n in (key.limit_diem_nanos, key.limit_vcu_nanos) if n is not None]
    return min(limits) if limits else None


def payer_of(key: KeyRecord) -> Payer:
    if key.wallet_address is not None:
        return Payer(account_id=key.account_id, wallet_address=key.wallet_address)
    return Payer(account_id=key.account_id, api_key_id=key.id, limit_period=key.limit_period,
                 limit_usd_nanos=key.limit_usd_nanos, limit_diem_nanos=_diem_limit(key))


def check_privacy(key: KeyRecord, model: CatalogModel) -> None:
    """The key's `modelPrivacy` tier against the model's privacy in the catalog: a refusal is
    the reference's answer, a 403 standard error (its message, no code)."""
    if key.model_privacy == "ALL" or model.is_private:
        return
    if key.model_privacy == "PRIVATE_TEXT" and model.type not in ("text", "embedding"):
        return
    raise ApiError(403, f"This API key is set to '{key.model_privacy}', but `{model.id}` is an "
                        "Anonymous model. Choose a Private, TEE, or E2EE model, or change the "
                        "model privacy setting of this API key.")


class Admission:
    def __init__(self, limits: RateLimits, billing: Billing) -> None:
        self.limits = limits
        self.billing = billing

    def begin(self, ctx: RequestContext, key: KeyRecord, model: CatalogModel, tokens: int, *,
              feature_budget: bool = False, limit: LimitCheck | None = None
              ) -> tuple[asyncio.Future[Ticket | None], bool]:
        """Start the limiter's decision for `model` (`tokens`: the most the request may
        use: chat's prompt estimate and completion limit);
        `feature_budget`: unsupported features count toward their own budget (chat).
        `limit` replaces the model's limits with another check. Gives the decision under
        way, and whether the hold may run beside it (the key is well inside its limits)."""
        if limit is not None:  # its failures count toward the key's model-less budget
            return asyncio.ensure_future(limit()), False
        ctx.limit_model = model.id
        beside = self.limits.has_room(key, model, tokens)
        deciding = self.decide(ctx, key, model, tokens, feature_budget)
        return asyncio.ensure_future(deciding), beside

    def tenant(self, key: KeyRecord) -> Tenant:
        """Whose request it is at a busy engine (deployments/fair_share.py): the caller's
        account (a wallet's too), hashed so that its id never reaches an engine, with the
        share of its rate-limit tier."""
        digest = hashlib.sha256(f"tenant:{key.account_id}".encode()).hexdigest()[:24]
        return Tenant(digest, self.limits.tiers.share(key.rate_limit_tier),
                      tier=key.rate_limit_tier)

    async def admit_key_creation(self, ctx: RequestContext, key: KeyRecord) -> None:
        """The account's per-minute cap on new API keys (429)."""
        try:
            respond.rate_limit_headers(ctx, await self.limits.admit_key_creation(key))
        except RateLimited as refused:
            if refused.state is not None:
                respond.rate_limit_headers(ctx, refused.state)
            raise

    def unsupported_feature(self, ctx: RequestContext, key: KeyRecord) -> None:
        """Count a request refused for a feature its model lacks (its own budget)."""
        ctx.unsupported_feature = True
        self.limits.unsupported_feature(key, ctx.limit_model, ctx.request_id)

    async def decide(self, ctx: RequestContext, key: KeyRecord, model: CatalogModel,
                     tokens: int, feature_budget: bool) -> Ticket | None:
        """The limiter's decision for `model` (429 when it refuses), its headers set."""
        try:
            ticket = await self.limits.admit(key, model, tokens, feature_budget=feature_budget)
        except RateLimited as refused:
            if refused.state is not None:
                respond.rate_limit_headers(ctx, refused.state)
            raise
        if ticket is not None:
            respond.rate_limit_headers(ctx, ticket.state)
        return ticket

    async def hold_most(self, ctx: RequestContext, key: KeyRecord,
                        models: Sequence[CatalogModel], max_cost: Cost | MaxUnits) -> Hold:
        """Hold the highest price any of `models` (a model and its fallbacks) may charge."""
        for model in models:
            check_privacy(key, model)
        amount = max_cost.nanos if isinstance(max_cost, Cost) else max(
            price(model, max_cost(model)).nanos for model in models)
        hold = await self.billing.hold(ctx.request_id, payer_of(key), amount)
        respond.balance_headers(ctx, hold.before)
        return hold
