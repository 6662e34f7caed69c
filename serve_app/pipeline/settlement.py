"""The one place money moves after the admission: a `Charge` (the hold of an admitted request,
and its rate-limit ticket) is settled with what was delivered, or released when nothing was.
Either way exactly once: a second call does nothing. A request whose price is known only once
its inputs are read (a chat's files, a job's clips) holds a floor first, then `rehold`s."""

from __future__ import annotations

from dataclasses import dataclass

from serve_app.billing.ledger import Balances
from serve_app.billing.pricing import Cost
from serve_app.billing.service import Hold
from serve_app.limits.rate_limits import Ticket
from serve_app.pipeline import respond
from serve_app.pipeline.context import RequestContext


@dataclass(eq=False)
class Charge:
    ctx: RequestContext
    hold: Hold
    ticket: Ticket | None = None

    @property
    def before(self) -> Balances:
        """The balance before the request (its headers show it)."""
        return self.hold.before

    @property
    def done(self) -> bool:
        return self.hold.done

    async def settle(self, cost: Cost | None, *, tokens: int | None = None) -> None:
        """Charge `cost` (what was delivered; None or an empty cost releases the hold), then
        correct the rate-limit count to the measured `tokens` (sent, not awaited)."""
        try:
            if not self.hold.done:
                with self.ctx.step("settle"):
                    await self.hold.finish(cost)
                if cost is not None:
                    self.ctx.charged(cost.units, cost.nanos)
        finally:
            if tokens is not None and self.ticket is not None:
                ticket, self.ticket = self.ticket, None
                ticket.correct(tokens)

    async def release(self, *, tokens: int | None = None) -> None:
        """Nothing was delivered: the hold goes back whole; `tokens`: what the rate-limit
        count is corrected to (None: it stays as admitted)."""
        if tokens is not None and self.ticket is not None:
            ticket, self.ticket = self.ticket, None
            ticket.correct(tokens)
        await self.hold.finish(None)

    async def rehold(self, cost: Cost) -> None:
        """Hold `cost` (the real price, once the inputs told it) in place of the floor held at
        admission: the floor goes back first, so that an account that can pay the price is
        not refused for holding both; 402 when it cannot (nothing is held then). The
        rate-limit count stays as admitted."""
        if cost.nanos == self.hold.nanos:
            return
        await self.hold.finish(None)
        hold = self.hold
        with self.ctx.step("hold"):
            self.hold = await hold.billing.hold(hold.request_id, hold.payer, cost.nanos)
        respond.balance_headers(self.ctx, self.hold.before)
