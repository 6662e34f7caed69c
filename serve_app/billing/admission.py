"""Steps 3 and 5 of a billable request: the key's privacy tier, then the hold of the most the
request may cost, with the balance headers taken from the hold."""

from __future__ import annotations

from collections.abc import Callable, Sequence

from fastapi import Request

from serve_app.auth.key_store import KeyRecord
from serve_app.billing.pricing import price
from serve_app.billing.service import Hold, check_privacy, payer_of
from serve_app.catalog import CatalogModel
from serve_app.responses import set_balance_headers
from serve_app.state import GatewayState

MaxUnits = Callable[[CatalogModel], dict[str, int]]


async def hold_for(request: Request, state: GatewayState, key: KeyRecord,
                   models: Sequence[CatalogModel], max_units: MaxUnits) -> Hold:
    """Hold the highest price any of `models` (the model and its fallbacks) may charge."""
    for model in models:
        check_privacy(key, model)
    amount = max(price(model, max_units(model)).nanos for model in models)
    hold = await state.billing.hold(request.state.request_id, payer_of(key), amount)
    set_balance_headers(request, hold.before)
    return hold
