"""A request's bill (serve_app/pipeline/bill.py) through `RequestRunner.admit`, on stand-ins
for admission, the model router and the ledger: one order of refusals, and exactly one
settle-or-release however the work ends. The flows through it, with the real admission and
ledger, are the modality tests."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

import pytest

from serve_app.billing.ledger import Balances
from serve_app.billing.pricing import Cost, PricedLine
from serve_app.errors import ApiError, UnsupportedFeature
from serve_app.models.router import RoutedModel
from serve_app.pipeline.bill import Bill
from serve_app.pipeline.context import RequestContext
from serve_app.pipeline.runner import RequestRunner


def _costing(nanos: int) -> Cost:
    return Cost(None, (PricedLine("input", 1, nanos, 0.0),))  # type: ignore[arg-type]


HELD = _costing(7)


@dataclass
class Ledger:
    """What the stand-in hold did: ("settle", cost) or ("release", None), in order."""

    done: list[tuple[str, Any]] = field(default_factory=list)
    holds: list[int] = field(default_factory=list)
    refuse_above: int | None = None  # a hold above this many nanos is a 402
    held_for: list[list[str]] = field(default_factory=list)  # the models of each hold


@dataclass
class StandInHold:
    ledger: Ledger
    nanos: int = 0
    request_id: str = "r"
    payer: Any = None
    before: Balances = field(default_factory=lambda: Balances(5, 0))
    done: bool = False

    @property
    def billing(self) -> StandInHold:
        return self

    async def hold(self, request_id: str, payer: Any, nanos: int) -> StandInHold:
        if self.ledger.refuse_above is not None and nanos > self.ledger.refuse_above:
            raise ApiError(402, "Insufficient balance", code="INSUFFICIENT_BALANCE")
        self.ledger.holds.append(nanos)
        return StandInHold(self.ledger, nanos)

    async def finish(self, cost: Cost | None) -> None:
        if self.done:
            return
        self.done = True
        self.ledger.done.append(("settle", cost) if cost is not None else ("release", None))


class StandInAdmission:
    def __init__(self, order: list[str], ledger: Ledger, refusal: ApiError | None) -> None:
        self.order, self.ledger, self.refusal = order, ledger, refusal

    def begin(self, ctx: RequestContext, key: Any, model: Any, tokens: int, *,
              limit: Any = None, feature_budget: bool = False) -> tuple[asyncio.Future, bool]:
        async def decide() -> None:
            self.order.append("limits")
            if self.refusal is not None:
                raise self.refusal

        return asyncio.ensure_future(decide()), False

    async def hold_most(self, ctx: RequestContext, key: Any, models: list, max_cost: Cost
                        ) -> StandInHold:
        self.order.append("hold")
        self.ledger.held_for.append([model.id for model in models])
        return await StandInHold(self.ledger).hold("r", None, max_cost.nanos)

    def unsupported_feature(self, ctx: RequestContext, key: Any) -> None:
        self.order.append("unsupported")


class StandInRouter:
    def __init__(self, order: list[str], online: bool, offline: frozenset[str] = frozenset()
                 ) -> None:
        self.order, self.online, self.offline = order, online, offline

    def is_online(self, model: Any) -> bool:
        return self.online and model.id not in self.offline

    def require_online(self, model: Any) -> None:
        self.order.append("online")
        if not self.is_online(model):
            raise ApiError(503, "offline", code="MODEL_OFFLINE")


@dataclass
class StandInModel:
    id: str = "m"
    name: str = "M"

    def deprecation_headers(self) -> dict[str, str]:
        return {}


def _runner(order: list[str], ledger: Ledger, *, online: bool = True,
            refusal: ApiError | None = None, offline: frozenset[str] = frozenset()
            ) -> RequestRunner:
    return RequestRunner(StandInRouter(order, online, offline),  # type: ignore[arg-type]
                         StandInAdmission(order, ledger, refusal))  # type: ignore[arg-type]


def _run(runner: RequestRunner, work: Callable[[Bill], Awaitable[Any]],
         check: Callable[[], object] = lambda: None, **hold: Any) -> Any:
    async def request() -> Any:
        async with runner.admit(RequestContext("r"), None,  # type: ignore[arg-type]
                                RoutedModel(StandInModel())) as bill:  # type: ignore[arg-type]
            check()
            await bill.hold(HELD, **hold)
            return await work(bill)

    return asyncio.run(request())


async def _answered(bill: Bill) -> str:
    bill.deliver(HELD, tokens=3)
    return "answer"


def test_the_refusals_come_in_one_order_limits_checks_hold_then_offline():
    order: list[str] = []
    ledger = Ledger()
    with pytest.raises(ApiError) as refused:
        _run(_runner(order, ledger, online=False), _answered)
    assert refused.value.code == "MODEL_OFFLINE"
    assert order == ["limits", "hold", "online"]
    assert ledger.done == [("release", None)]  # the offline model's hold went back


def test_a_429_comes_before_what_the_checks_refuse():
    def invalid() -> None:
        raise ApiError(400, "bad field")

    ledger = Ledger()
    with pytest.raises(ApiError) as refused:
        _run(_runner([], ledger, refusal=ApiError(429, "slow down")), _answered, invalid)
    assert refused.value.status == 429
    with pytest.raises(ApiError) as refused:
        _run(_runner([], ledger), _answered, invalid)
    assert refused.value.status == 400
    assert ledger.holds == []  # refused before any hold


def test_what_was_delivered_is_settled_once():
    ledger = Ledger()
    assert _run(_runner([], ledger), _answered) == "answer"
    assert ledger.done == [("settle", HELD)]


@pytest.mark.parametrize("failure", [RuntimeError("the engine crashed"),
                                     asyncio.CancelledError()], ids=["error", "cancelled"])
def test_work_that_ends_without_delivering_releases_the_hold_once(failure):
    ledger = Ledger()

    async def fails(bill: Bill) -> None:
        raise failure

    with pytest.raises(type(failure)):
        _run(_runner([], ledger), fails)
    assert ledger.done == [("release", None)]


def test_work_that_fails_after_delivering_is_charged_what_it_delivered():
    ledger = Ledger()

    async def delivers_then_fails(bill: Bill) -> None:
        bill.deliver(HELD)
        raise ApiError(504, "the node timed out")

    with pytest.raises(ApiError):
        _run(_runner([], ledger), delivers_then_fails)
    assert ledger.done == [("settle", HELD)]


def test_a_hold_passed_on_to_a_queued_job_is_neither_settled_nor_released():
    ledger = Ledger()

    async def queued(bill: Bill) -> None:
        bill.pass_on()

    _run(_runner([], ledger), queued)
    assert ledger.done == []


def test_a_streamed_bill_is_settled_by_its_stream_unless_the_handler_fails_first():
    ledger = Ledger()

    async def streams(bill: Bill) -> Any:
        return bill.stream(_no_events())

    handed = _run(_runner([], ledger), streams)
    assert ledger.done == []  # the response settles it where the stream ends
    handed.billed.deliver(HELD)
    asyncio.run(handed.billed.close())
    assert ledger.done == [("settle", HELD)]

    ledger = Ledger()

    async def fails_after(bill: Bill) -> None:
        bill.stream(_no_events())
        raise RuntimeError("the response was never made")

    with pytest.raises(RuntimeError):
        _run(_runner([], ledger), fails_after)
    assert ledger.done == [("release", None)]


async def _no_events() -> Any:
    return
    yield


def test_a_rehold_gives_the_floor_back_before_holding_the_price():
    ledger = Ledger(refuse_above=100)
    bill = Bill(RequestContext("r"), hold=StandInHold(ledger, nanos=7))  # type: ignore[arg-type]

    asyncio.run(bill.rehold(_costing(7)))  # the floor was the price: nothing to do
    assert ledger.done == [] and ledger.holds == []
    asyncio.run(bill.rehold(_costing(50)))
    assert ledger.done == [("release", None)] and ledger.holds == [50]
    assert bill.ctx.headers["x-service-balance-usd"] == "0.000000005"

    with pytest.raises(ApiError) as refused:
        asyncio.run(bill.rehold(_costing(500)))
    assert refused.value.status == 402
    assert ledger.done == [("release", None)] * 2  # nothing is held after a 402


def _models(*names: str) -> list[StandInModel]:
    return [StandInModel(id=name) for name in names]


def test_a_request_with_fallbacks_is_held_for_every_model_and_needs_one_running():
    ledger = Ledger()
    models = {"fallbacks": _models("f1", "f2"), "helpers": _models("ears")}
    assert _run(_runner([], ledger, offline=frozenset({"m", "f1"})), _answered,
                **models) == "answer"
    assert ledger.held_for == [["m", "f1", "f2", "ears"]]  # each one's privacy tier

    for offline in ({"m", "f1", "f2"}, {"ears"}):  # none of the candidates, or the helper
        order: list[str] = []
        ledger = Ledger()
        with pytest.raises(ApiError) as refused:
            _run(_runner(order, ledger, offline=frozenset(offline)), _answered, **models)
        assert refused.value.code == "MODEL_OFFLINE"
        assert order[:2] == ["limits", "hold"]  # after the limits and the hold
        assert ledger.done == [("release", None)]


def test_what_a_measure_gives_is_read_when_the_bill_closes():
    ledger = Ledger()
    delivered: list[Cost] = []

    async def streams(bill: Bill) -> None:
        bill.measure = lambda: (delivered[-1] if delivered else None, 5)
        delivered.append(_costing(2))  # counted as it goes, not `deliver`ed
        delivered.append(_costing(3))

    _run(_runner([], ledger), streams)
    assert ledger.done == [("settle", _costing(3))]

    ledger = Ledger()

    async def nothing(bill: Bill) -> None:
        bill.measure = lambda: (None, 5)

    _run(_runner([], ledger), nothing)
    assert ledger.done == [("release", None)]


def test_model_headers_wait_for_the_model_that_answers_when_asked():
    async def request(model_headers: bool) -> dict[str, str]:
        ctx = RequestContext("r")
        async with _runner([], Ledger()).admit(ctx, None,  # type: ignore[arg-type]
                                               RoutedModel(StandInModel()),  # type: ignore[arg-type]
                                               model_headers=model_headers) as bill:
            await bill.hold(HELD)
        return ctx.headers

    assert asyncio.run(request(True))["x-service-model-id"] == "m"
    assert "x-service-model-id" not in asyncio.run(request(False))


def test_a_feature_the_model_lacks_counts_toward_its_own_budget_before_any_hold():
    def lacks() -> None:
        raise UnsupportedFeature("no web search here", "service_parameters")

    order: list[str] = []
    ledger = Ledger()
    with pytest.raises(UnsupportedFeature):
        _run(_runner(order, ledger), _answered, lacks)
    assert order == ["limits", "unsupported"]
    assert ledger.holds == [] and ledger.done == []
