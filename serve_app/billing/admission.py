"""Steps 3 to 5 of a billable request: the key's privacy tier, the rate limits, and the hold of
the most the request may cost, with the balance headers taken from the hold."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Sequence

from fastapi import Request

from serve_app.auth.key_store import KeyRecord
from serve_app.billing.pricing import Cost, price
from serve_app.billing.service import Hold, check_privacy, payer_of
from serve_app.catalog import CatalogModel
from serve_app.limits.service import Ticket
from serve_app.responses import set_balance_headers
from serve_app.state import GatewayState
from serve_app.timing import timed

MaxUnits = Callable[[CatalogModel], dict[str, int]]


async def hold_for(request: Request, state: GatewayState, key: KeyRecord,
                   models: Sequence[CatalogModel], max_units: MaxUnits | Cost) -> Hold:
    """Hold the highest price any of `models` (the model and its fallbacks) may charge: their
    token prices of `max_units`, or a price already computed (images)."""
    for model in models:
        check_privacy(key, model)
    amount = max_units.nanos if isinstance(max_units, Cost) else max(
        price(model, max_units(model)).nanos for model in models)
    hold = await state.billing.hold(request.state.request_id, payer_of(key), amount)
    set_balance_headers(request, hold.before)
    return hold


async def admit_and_hold(request: Request, state: GatewayState, key: KeyRecord,
                         model: CatalogModel, tokens: int, max_units: MaxUnits | Cost
                         ) -> tuple[Ticket | None, Hold]:
    """Rate limits (`tokens`: the prompt estimate), then the hold. When the key's last count
    left it well inside its limits, the two round trips run side by side, and a refusal by
    the limiter gives the hold back; near its limits they run one after the other, so that a
    flood of refused requests writes nothing to the ledger. The answer is the same either
    way: 429 before 402, and an admitted request counts even when the hold refuses."""
    if not state.limits.has_room(key, model, tokens):
        with timed(request, "limits"):
            ticket = await state.limits.admit(request, key, model, tokens)
        with timed(request, "hold"):
            return ticket, await hold_for(request, state, key, [model], max_units)
    with timed(request, "limits+hold"):
        return await limits_beside_hold(state.limits.admit(request, key, model, tokens),
                                        hold_for(request, state, key, [model], max_units))


async def limits_beside_hold(admitting: Awaitable[Ticket | None], holding: Awaitable[Hold]
                             ) -> tuple[Ticket | None, Hold]:
    """The limiter's decision and the hold, run together. A refusal by the limiter comes
    first (429 before 402) and gives the hold back; an admitted request counts even when the
    hold refuses."""
    admitted, held = await asyncio.gather(admitting, holding, return_exceptions=True)
    if isinstance(admitted, BaseException):
        if isinstance(held, Hold):
            await held.finish(None)
        raise admitted
    if isinstance(held, BaseException):
        raise held
    return admitted, held
