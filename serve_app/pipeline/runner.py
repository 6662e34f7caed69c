"""Steps 3 to 5 of every billable request (docs/architecture/request.md: admit, call the
model, settle), in one order for every modality:

1. the limiter's decision starts (the model is resolved first: its 404 or 400 comes before);
2. the request's checks run meanwhile (`quote`: what they refuse comes after a 429, so 429
   before 400), and give the most the request may cost (a `Quoted` when the request may
   run on more than its model: a chat's fallbacks and the model that hears its audio);
3. the hold of that (each model's privacy tier 403, then 402);
4. the offline check (503 MODEL_OFFLINE), after the limits and the hold: a request for a model
   that is not running is counted like any other and its answer shows the count (the spec
   does not order them; tests/unit/limits/test_rate_limit_tiers.py relies on it); its hold
   goes back. A request with fallbacks needs one of its models running;
5. the model headers, then the caller's work (the model call, the body of the `async with`);
6. exactly one settlement: what the work `deliver`ed (or its `measure` gives) is charged,
   else the hold is released, whatever ends the work (an answer, an error, a client that
   left).

    async with runner.run(ctx, key, routed, quote, tokens=estimate) as billed:
        out = await the model call
        billed.deliver(price(model, used), tokens=used)

A stream outlives the handler: `open` gives the same `BilledCall` without the `async with`,
and the stream's end calls its `close` (one settler per stream: the response that sends
it, http/billed_stream.py).
A request whose price is known only once its inputs are read quotes a floor, then
`charge.rehold`s the price.
"""

from __future__ import annotations

import inspect
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass

from serve_app.accounts.key_store import KeyRecord
from serve_app.billing.pricing import Cost
from serve_app.errors import refused_for_capacity
from serve_app.models.catalog import CatalogModel
from serve_app.models.router import ModelRouter, RoutedModel
from serve_app.pipeline import respond
from serve_app.pipeline.admission import Admission, LimitCheck
from serve_app.pipeline.bill import Admitting, Bill
from serve_app.pipeline.context import RequestContext
from serve_app.pipeline.settlement import Charge

# What a request delivered so far, and its measured tokens (None: the count stays as admitted).
Measure = Callable[[], tuple[Cost | None, int | None]]


@dataclass(frozen=True)
class Quoted:
    """A quote of a request that may run on more than its model."""

    cost: Cost  # the most it may cost (the hold)
    fallbacks: Sequence[CatalogModel] = ()  # may answer in its place: one running is enough
    helpers: Sequence[CatalogModel] = ()  # it uses besides (a chat's transcriber): all run
    measure: Measure | None = None  # what it delivered, read at `close` (BilledCall.measure)


# The request's own checks (400s), run while the limiter decides; they return the most the
# request may cost.
Quote = Callable[[], Cost | Quoted | Awaitable[Cost | Quoted]]


@dataclass(eq=False)
class BilledCall:
    """An admitted request's charge and what was delivered so far; `close` settles it."""

    charge: Charge
    delivered: Cost | None = None
    tokens: int | None = None
    closed: bool = False
    settled: bool = False  # what was delivered is charged
    # What was delivered, read at `close` in place of `deliver`ed figures: for work whose
    # delivery grows as it goes (a stream's tokens, a chat's searches and audio heard).
    measure: Measure | None = None

    def deliver(self, cost: Cost | None, *, tokens: int | None = None) -> None:
        """What was delivered so far (it replaces an earlier figure): charged at `close`,
        even when the work then fails; `tokens`: the measured rate-limit count (with no
        cost: what it is corrected to when the hold is released)."""
        self.delivered, self.tokens = cost, tokens

    def pass_on(self) -> None:
        """The hold outlives the request: a queued job keeps it, and the job runner settles
        it once the job is made, or releases it (jobs/runner.py)."""
        self.closed = True

    async def close(self, failure: BaseException | None = None) -> None:
        """Settle what was delivered, or release the hold; only the first call does anything.
        A request refused by a model at capacity never reached the engine: none of its
        tokens count toward the per-minute limit."""
        if self.closed:
            return
        self.closed = True
        if self.measure is not None:
            self.delivered, self.tokens = self.measure()
        capacity = failure is not None and refused_for_capacity(failure)
        tokens = 0 if capacity else self.tokens
        if self.delivered is not None:
            await self.charge.settle(self.delivered, tokens=tokens)
            self.settled = True
        else:
            await self.charge.release(tokens=tokens)


class RequestRunner:
    """The one sequence of a billable request (the module's docstring)."""

    def __init__(self, router: ModelRouter, admission: Admission) -> None:
        self.router = router
        self.admission = admission

    async def open(self, ctx: RequestContext, key: KeyRecord, routed: RoutedModel,
                   quote: Quote, *, tokens: int = 0, limit: LimitCheck | None = None,
                   calls_model: bool = True, feature_budget: bool = False,
                   model_headers: bool = True) -> BilledCall:
        """Steps 1 to 5 (the module's docstring); the caller owns the `close`.
        `tokens`: the most the request may use (its rate-limit count until corrected);
        `limit`: a check in place of the model's own limits (the crypto proxy's caps);
        `calls_model`: False when the work calls no deployment (the crypto proxy's nodes,
        a video quote's fetch of its clip): no offline check;
        `feature_budget`: a refusal for a feature the model lacks counts toward its own
        budget (chat); `model_headers`: False when the caller sets them once it knows which
        model answered (a chat's fallbacks), or the answer names no model (the crypto
        proxy's, a quote's)."""
        model = routed.model
        pending = self.admission.start(ctx, key, model, tokens, limit=limit,
                                       feature_budget=feature_budget)
        try:
            quoted = quote()
            if inspect.isawaitable(quoted):
                quoted = await quoted
        except BaseException as refused:
            await pending.abandon(refused)  # a 429 comes first
            raise
        if not isinstance(quoted, Quoted):
            quoted = Quoted(quoted)
        billed = BilledCall(await pending.hold(
            [model, *quoted.fallbacks, *quoted.helpers], quoted.cost), measure=quoted.measure)
        try:
            if calls_model:
                self._require_online(model, quoted)
            if model_headers:
                respond.model_headers(ctx, model, routed.router)
        except BaseException as failure:
            await billed.close(failure)
            raise
        return billed

    def _require_online(self, model: CatalogModel, quoted: Quoted) -> None:
        """503 MODEL_OFFLINE when neither the model nor any of its fallbacks runs, or a
        helper does not."""
        if not any(self.router.is_online(fallback) for fallback in quoted.fallbacks):
            self.router.require_online(model)
        for helper in quoted.helpers:
            self.router.require_online(helper)

    @asynccontextmanager
    async def admit(self, ctx: RequestContext, key: KeyRecord, routed: RoutedModel, *,
                    tokens: int = 0, limit: LimitCheck | None = None,
                    calls_model: bool = True, feature_budget: bool = False,
                    model_headers: bool = True) -> AsyncIterator[Bill]:
        """The request's bill (pipeline/bill.py), the limiter's decision started; the body
        checks the request, `hold`s, works and `deliver`s; the exit settles or releases,
        however the body ends (a stream's bill: where its stream ends). The options are
        `open`'s."""
        deciding, beside = self.admission.begin(ctx, key, routed.model, tokens, limit=limit,
                                                feature_budget=feature_budget)
        bill = Bill(ctx, admitting=Admitting(self.admission, self.router, key, routed,
                                             deciding, beside, calls_model, model_headers))
        try:
            yield bill
        except BaseException as failure:
            await bill.exit(failure)
            raise
        await bill.exit()

    @asynccontextmanager
    async def run(self, ctx: RequestContext, key: KeyRecord, routed: RoutedModel,
                  quote: Quote, *, tokens: int = 0, limit: LimitCheck | None = None,
                  calls_model: bool = True, feature_budget: bool = False,
                  model_headers: bool = True) -> AsyncIterator[BilledCall]:
        """`open`, the caller's work, then `close`, however the work ends."""
        billed = await self.open(ctx, key, routed, quote, tokens=tokens, limit=limit,
                                 calls_model=calls_model, feature_budget=feature_budget,
                                 model_headers=model_headers)
        try:
            yield billed
        except BaseException as failure:
            await billed.close(failure)
            raise
        await billed.close()
