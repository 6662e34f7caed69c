"""Steps 3 to 5 of every billable request (docs/architecture/request.md: admit, call the
model, settle), in one order for every modality: `admit` gives the request's bill
(pipeline/bill.py) with the limiter's decision started, and settles or releases it on the
way out, however the body ends.

    async with runner.admit(ctx, key, routed, tokens=estimate) as bill:
        plan = check(body)                  # 400s: a 429 still wins, on exit
        await bill.hold(plan.max_cost)      # 403, 402, then 503 offline
        out = await the model call
        bill.deliver(price(model, used), tokens=used)
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from serve_app.accounts.key_store import KeyRecord
from serve_app.models.router import ModelRouter, RoutedModel
from serve_app.pipeline.admission import Admission, LimitCheck
from serve_app.pipeline.bill import Admitting, Bill
from serve_app.pipeline.context import RequestContext


class RequestRunner:
    """The one sequence of a billable request (the module's docstring)."""

    def __init__(self, router: ModelRouter, admission: Admission) -> None:
        self.router = router
        self.admission = admission

    @asynccontextmanager
    async def admit(self, ctx: RequestContext, key: KeyRecord, routed: RoutedModel, *,
                    tokens: int = 0, limit: LimitCheck | None = None,
                    calls_model: bool = True, feature_budget: bool = False,
                    model_headers: bool = True) -> AsyncIterator[Bill]:
        """The request's bill, the limiter's decision started; the body checks the request,
        `hold`s, works and `deliver`s; the exit settles or releases, however the body ends (a
        stream's bill: where its stream ends; a queued job's: in the job worker).
        `tokens`: the most the request may use (its rate-limit count until corrected);
        `limit`: a check in place of the model's own limits (the crypto proxy's caps);
        `calls_model`: False when the work calls no deployment (the crypto proxy's nodes,
        a video price's fetch of its clip): no offline check;
        `feature_budget`: a refusal for a feature the model lacks counts toward its own
        budget (chat); `model_headers`: False when the caller sets them once it knows which
        model answered (a chat's fallbacks), or the answer names no model (the crypto
        proxy's, a price's)."""
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
