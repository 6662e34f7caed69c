"""The one money object of a billable request: its rate-limit count, its hold and what it
delivered, settled or released exactly once. Each service drives it top to bottom
(docs/architecture/request.md):

    async with runner.admit(ctx, key, routed, tokens=estimate) as bill:  # limits deciding
        plan = check(body)                       # 400s (a 429 still wins, on exit)
        await bill.hold(plan.max_cost)           # 403 privacy, 402, then 503 offline
        result = await work(plan)
        bill.deliver(result.cost, tokens=used)   # what was delivered
    # exit: settle what was delivered, or release the hold, however the work ended

The order of the answers is one rule: the limiter's decision starts first (the model is
resolved before: its 404 or 400 comes before); a refusal of the request's own checks waits for
it, so a 429 comes before a 400; then each model's privacy tier (403) and the hold of the most
the request may cost (402); then the offline check (503 MODEL_OFFLINE): a request for a model
that is not running is counted like any other, and its hold goes back. When the key's last
count left it well inside its limits, the hold runs beside the limiter's decision (a refusal
by the limiter then gives the hold back); near its limits they run one after the other, so
that a flood of refused requests writes nothing to the ledger.

A stream outlives the handler: `bill.stream(events)` hands the bill to the response that sends
them (http/billed_stream.py), which settles it where the stream ends: at the `SETTLE` its
source yields once, before its last events (chat's `[DONE]`), so that what it delivered is
durable before it says it is done, or wherever else it ends (an error, a client that left, a
body never sent). A queued job keeps its
hold: `bill.pass_on()` at intake, and the job worker settles it with `Bill.resume(...)`.
A request whose price is known only once its inputs are read holds a floor, then `rehold`s.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from dataclasses import dataclass
from datetime import datetime
from enum import Enum

from serve_app.accounts.key_store import KeyRecord
from serve_app.billing.ledger import Payer
from serve_app.billing.pricing import Cost
from serve_app.billing.service import Billing, Hold
from serve_app.errors import UnsupportedFeature, refused_for_capacity
from serve_app.limits.rate_limits import Ticket
from serve_app.models.catalog import CatalogModel
from serve_app.models.router import ModelRouter, RoutedModel
from serve_app.pipeline import respond
from serve_app.pipeline.admission import Admission, MaxUnits
from serve_app.pipeline.context import RequestContext

# What a request delivered so far, and its measured tokens (None: the count stays as admitted).
Measure = Callable[[], tuple[Cost | None, int | None]]


class Mark(Enum):
    SETTLE = "settle"


SETTLE = Mark.SETTLE  # yielded once by a stream's source: settle here, before its last events


@dataclass(eq=False)
class Admitting:
    """What a bill needs until its hold is taken: the limiter's decision under way, and what
    the hold and the offline check are for."""

    admission: Admission
    router: ModelRouter
    key: KeyRecord
    routed: RoutedModel
    deciding: asyncio.Future[Ticket | None]
    beside: bool  # the hold runs beside the limiter's decision
    calls_model: bool
    model_headers: bool


class Bill:
    """One request's money, from its admission to its settlement (the module's docstring)."""

    def __init__(self, ctx: RequestContext, *, hold: Hold | None = None,
                 ticket: Ticket | None = None, admitting: Admitting | None = None) -> None:
        self.ctx = ctx
        self.ticket = ticket
        self._hold = hold
        self._admitting = admitting
        self.delivered: Cost | None = None
        self.tokens: int | None = None
        # What was delivered, read at the settlement in place of `deliver`ed figures: for
        # work whose delivery grows as it goes (a stream's tokens, a chat's searches).
        self.measure: Measure | None = None
        self.settled = False  # what was delivered is charged
        self._closed = False
        self._streamed = False

    @classmethod
    def resume(cls, billing: Billing, request_id: str, payer: Payer,
               created_at: datetime) -> Bill:
        """The bill of a queued job, whose hold was taken when the job was queued (keyed by
        its request id) and passed on: the job worker settles or releases it as a
        request's."""
        return cls(RequestContext(request_id),
                   hold=billing.held_since(request_id, payer, created_at))

    # -- admission -------------------------------------------------------------------------

    async def decided(self) -> None:
        """Wait for the limiter's decision (its 429 raised here): work the server does before
        the hold (reading what sizes it) starts only for a counted caller."""
        if self._admitting is not None:
            with self.ctx.step("limits"):
                await self._admitting.deciding

    async def hold(self, max_cost: Cost | MaxUnits, *, fallbacks: Sequence[CatalogModel] = (),
                   helpers: Sequence[CatalogModel] = ()) -> None:
        """Hold the most the request may cost (`max_cost`: a cost, or the most units, priced
        at the dearest of its models), once the limiter admitted it: each model's privacy tier
        (403), the hold (402), then the model online (503; `fallbacks` may answer in its
        place, one running is enough; `helpers` it uses besides, all must run)."""
        admitting = self._admitting
        assert admitting is not None and self._hold is None, "one hold per admitted bill"
        model = admitting.routed.model
        models = [model, *fallbacks, *helpers]
        self._hold, self.ticket = await self._admit(admitting, models, max_cost)
        self._admitting = None
        try:
            if admitting.calls_model:
                router = admitting.router
                if not any(router.is_online(fallback) for fallback in fallbacks):
                    router.require_online(model)
                for helper in helpers:
                    router.require_online(helper)
            if admitting.model_headers:
                respond.model_headers(self.ctx, model, admitting.routed.router)
        except BaseException as failure:
            await self.close(failure)
            raise

    async def _admit(self, admitting: Admitting, models: Sequence[CatalogModel],
                     max_cost: Cost | MaxUnits) -> tuple[Hold, Ticket | None]:
        ctx, admission, key = self.ctx, admitting.admission, admitting.key
        if not admitting.beside:
            with ctx.step("limits"):
                ticket = await admitting.deciding
            with ctx.step("hold"):
                return await admission.hold_most(ctx, key, models, max_cost), ticket
        with ctx.step("limits+hold"):
            holding = asyncio.ensure_future(admission.hold_most(ctx, key, models, max_cost))
            try:
                admitted, held = await asyncio.gather(admitting.deciding, holding,
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
        return held, admitted

    async def admit_fallback(self, admission: Admission, key: KeyRecord, model: CatalogModel,
                             tokens: int, *, left_tokens: int) -> None:
        """Count the request toward a fallback `model`'s per-minute limits before it is
        called (it was admitted on its primary): 429 when they refuse (the fallback is then
        skipped). Admitted, the bill's count becomes the fallback's, and the model that
        failed keeps `left_tokens` counted."""
        with self.ctx.step("fallback-limits"):
            ticket = await admission.decide(self.ctx, key, model, tokens, False)
        previous, self.ticket = self.ticket, ticket
        if previous is not None:
            previous.correct(left_tokens)

    async def rehold(self, cost: Cost) -> None:
        """Hold `cost` (the real price, once the inputs told it) in place of the floor held:
        the floor goes back first, so that an account that can pay the price is not refused
        for holding both; 402 when it cannot (nothing is held then). The rate-limit count
        stays as admitted."""
        hold = self._hold
        assert hold is not None, "hold the floor first"
        if cost.nanos == hold.nanos:
            return
        await hold.finish(None)
        with self.ctx.step("hold"):
            self._hold = await hold.billing.hold(hold.request_id, hold.payer, cost.nanos)
        respond.balance_headers(self.ctx, self._hold.before)

    def charge_only_if_held(self) -> None:
        """At the settlement, charge only while the hold is still there: one the sweep
        released meanwhile (its request was given up as failed) stays released."""
        if self._hold is not None:
            self._hold.charge_late = False

    @property
    def held_nanos(self) -> int:
        assert self._hold is not None, "nothing is held"
        return self._hold.nanos

    # -- delivery and settlement -----------------------------------------------------------

    def deliver(self, cost: Cost | None, *, tokens: int | None = None) -> None:
        """What was delivered so far (it replaces an earlier figure): charged at the
        settlement, even when the work then fails; `tokens`: the measured rate-limit count
        (with no cost: what it is corrected to when the hold is released)."""
        self.delivered, self.tokens = cost, tokens

    def stream(self, events: AsyncIterator[str | Mark] | AsyncIterator[bytes | Mark],
               stop: Callable[[], Awaitable[None]] | None = None) -> BilledEvents:
        """Hand the bill to the response that streams `events`: it settles the bill where
        the stream ends (http/billed_stream.py), not the `async with`."""
        self._streamed = True
        return BilledEvents(self, events, stop)

    def pass_on(self) -> None:
        """The hold outlives the request: a queued job keeps it, and the job worker settles
        it once the job is made, or releases it (`Bill.resume`)."""
        self._closed = True

    async def exit(self, failure: BaseException | None = None) -> None:
        """The end of the `async with`: the bill is closed, unless a stream took it and
        nothing failed since."""
        if self._streamed and failure is None:
            return
        await self.close(failure)

    async def close(self, failure: BaseException | None = None) -> None:
        """Settle what was delivered, or release the hold; only the first call does anything.
        A bill closed before its hold leaves the limiter's refusal (429) to answer first, and
        an unsupported feature counts toward its own budget. A request refused by a model at
        capacity never reached the engine: none of its tokens count toward the per-minute
        limit."""
        if self._closed:
            return
        self._closed = True
        if self._hold is None:
            await self._abandon(failure)
            return
        if self.measure is not None:
            self.delivered, self.tokens = self.measure()
        capacity = failure is not None and refused_for_capacity(failure)
        tokens = 0 if capacity else self.tokens
        if self.delivered is not None:
            await self._settle(self._hold, self.delivered, tokens)
            self.settled = True
        else:
            self._correct(tokens)
            await self._hold.finish(None)

    async def _abandon(self, reason: BaseException | None) -> None:
        admitting, self._admitting = self._admitting, None
        if admitting is None:
            return
        with self.ctx.step("limits"):
            await admitting.deciding
        if isinstance(reason, UnsupportedFeature):
            admitting.admission.unsupported_feature(self.ctx, admitting.key)

    async def _settle(self, hold: Hold, cost: Cost, tokens: int | None) -> None:
        try:
            if not hold.done:
                with self.ctx.step("settle"):
                    await hold.finish(cost)
                self.ctx.charged(cost.units, cost.nanos)
        finally:
            self._correct(tokens)

    def _correct(self, tokens: int | None) -> None:
        """Correct the rate-limit count to the measured `tokens` (None: it stays)."""
        if tokens is not None and self.ticket is not None:
            ticket, self.ticket = self.ticket, None
            ticket.correct(tokens)


@dataclass(eq=False)
class BilledEvents:
    """A stream's pieces (server-sent events, or audio bytes) and the bill they deliver; the
    HTTP response (serve_app/http/billed_stream.py) sends them and closes the bill."""

    billed: Bill
    events: AsyncIterator[str | Mark] | AsyncIterator[bytes | Mark]
    # Stops the model's work when the stream is cut short (None: the events are closed;
    # a generator closed before its first step runs none of its code, so a source that
    # holds a call open before then gives its own).
    stop: Callable[[], Awaitable[None]] | None = None

    async def halt(self) -> None:
        """Stop the model's work of a stream cut short: its own `stop`, else its events
        closed."""
        await (self.stop() if self.stop is not None else aclose(self.events))


async def aclose(events: AsyncIterator[object]) -> None:
    """Close a stream's source (an async generator's `finally` runs: the model call stops);
    a source that is no generator has nothing to close."""
    close = getattr(events, "aclose", None)
    if close is not None:
        await close()
