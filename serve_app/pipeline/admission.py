"""Steps 3 to 5 of every billable request, in one rule: the rate limits (429), the checks of
the request, then the model's privacy tier (403) and the hold of the most the request may
cost (402). The limiter's decision starts first; when the key's last count left it well inside
its limits, the hold runs beside it and a refusal by the limiter gives the hold back; near its
limits they run one after the other, so that a flood of refused requests writes nothing to the
ledger. The answers are the same either way: 429 before 400 before 402, and an admitted request
counts even when the hold refuses. Its caller is the request runner (pipeline/runner.py),
which checks the request while the limiter decides:

    pending = admission.start(ctx, key, model, tokens)
    try:
        check the request
    except BaseException as exc:
        await pending.abandon(exc)  # a 429 comes first
        raise
    charge = await pending.hold(models, max_cost)
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
from serve_app.errors import ApiError, UnsupportedFeature
from serve_app.limits.rate_limits import RateLimited, RateLimits, Ticket
from serve_app.models.catalog import CatalogModel
from serve_app.pipeline import respond
from serve_app.pipeline.context import RequestContext
from serve_app.pipeline.settlement import Charge

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

    def start(self, ctx: RequestContext, key: KeyRecord, model: CatalogModel, tokens: int, *,
              feature_budget: bool = False, limit: LimitCheck | None = None
              ) -> PendingAdmission:
        """Start the limiter's decision for `model` (`begin`), to be followed by `hold`."""
        deciding, beside = self.begin(ctx, key, model, tokens, feature_budget=feature_budget,
                                      limit=limit)
        return PendingAdmission(self, ctx, key, deciding, beside)

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

    async def admit_fallback(self, charge: Charge, key: KeyRecord, model: CatalogModel,
                             tokens: int, *, left_tokens: int) -> None:
        """Count a request toward a fallback `model`'s per-minute limits before it is called
        (the request was admitted on its primary): 429 when they refuse (the fallback is then
        skipped). Admitted, the charge's ticket becomes the fallback's (the answer corrects it
        to the measured tokens), and the model that failed keeps `left_tokens` counted."""
        ctx = charge.ctx
        with ctx.step("fallback-limits"):
            ticket = await self.decide(ctx, key, model, tokens, False)
        previous, charge.ticket = charge.ticket, ticket
        if previous is not None:
            previous.correct(left_tokens)

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
        try:
            ticket = await self.limits.admit(key, model, tokens, feature_budget=feature_budget)
        except RateLimited as refused:
            if refused.state is not None:
                respond.rate_limit_headers(ctx, refused.state)
            raise
        if ticket is not None:
            respond.rate_limit_headers(ctx, ticket.state)
        return ticket

    async def hold_most(self, ctx: RequestContext, key: KeyRecord, models: Sequence[CatalogModel],
                    max_cost: Cost | MaxUnits) -> Hold:
        """Hold the highest price any of `models` (a model and its fallbacks) may charge."""
        for model in models:
            check_privacy(key, model)
        amount = max_cost.nanos if isinstance(max_cost, Cost) else max(
            price(model, max_cost(model)).nanos for model in models)
        hold = await self.billing.hold(ctx.request_id, payer_of(key), amount)
        respond.balance_headers(ctx, hold.before)
        return hold


class PendingAdmission:
    """A request whose limiter decision is under way; `hold` or `abandon` must follow."""

    def __init__(self, admission: Admission, ctx: RequestContext, key: KeyRecord,
                 deciding: asyncio.Future[Ticket | None], beside: bool) -> None:
        self._admission = admission
        self._ctx = ctx
        self._key = key
        self._deciding = deciding
        self._beside = beside

    async def hold(self, models: Sequence[CatalogModel], max_cost: Cost | MaxUnits) -> Charge:
        ctx = self._ctx
        if not self._beside:
            with ctx.step("limits"):
                ticket = await self._deciding
            with ctx.step("hold"):
                hold = await self._admission.hold_most(ctx, self._key, models, max_cost)
            return Charge(ctx, hold, ticket)
        with ctx.step("limits+hold"):
            holding = asyncio.ensure_future(self._admission.hold_most(ctx, self._key, models,
                                                                  max_cost))
            try:
                admitted, held = await asyncio.gather(self._deciding, holding,
                                                      return_exceptions=True)
            except asyncio.CancelledError:
                # The caller left (its client hung up) while the limiter decided: a hold
                # already taken would otherwise stay open until it goes stale.
                if holding.done() and not holding.cancelled() and not holding.exception():
                    await holding.result().finish(None)
                raise
        if isinstance(admitted, BaseException):
            if isinstance(held, Hold):
                await held.finish(None)
            raise admitted
        if isinstance(held, BaseException):
            raise held
        return Charge(ctx, held, admitted)

    async def decided(self) -> None:
        """Wait for the limiter's decision (its 429 raised here): work the server does before
        the hold (reading a chat's files, which sizes it) starts only for a counted caller."""
        with self._ctx.step("limits"):
            await self._deciding

    async def abandon(self, reason: BaseException | None = None) -> None:
        """The request was refused before its hold: the limiter's refusal (429) comes first;
        an unsupported feature counts toward its own budget."""
        with self._ctx.step("limits"):
            await self._deciding
        if isinstance(reason, UnsupportedFeature):
            self._admission.unsupported_feature(self._ctx, self._key)
