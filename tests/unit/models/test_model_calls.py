"""How failures of a model deployment reach the client."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime

import pytest
from ray.serve.exceptions import BackPressureError, DeploymentUnavailableError

from deployments.protocol import Chunk, EngineError, Usage
from serve_app.errors import ApiError
from serve_app.models import calls
from serve_app.models.calls import ColdStarts, ModelFailed, call_model, complete_model
from serve_app.models.catalog import CatalogModel
from serve_app.models.records import model_record


class _Method:
    """A deployment method whose call ends the way the test says."""

    def __init__(self, outcome) -> None:
        self.outcome = outcome

    def remote(self, *args):
        async def run():
            if isinstance(self.outcome, BaseException):
                raise self.outcome
            return self.outcome

        return run()


def _call(outcome):
    return asyncio.run(call_model(_Method(outcome), "m1", "m1", ["x"]))


def test_a_full_queue_is_503_model_at_capacity():
    with pytest.raises(ModelFailed) as err:
        _call(BackPressureError(num_queued_requests=64, max_queued_requests=64))
    assert (err.value.status, err.value.code) == (503, "MODEL_AT_CAPACITY")


def test_an_unavailable_deployment_is_503_model_offline():
    with pytest.raises(ModelFailed) as err:
        _call(DeploymentUnavailableError("text-xs"))
    assert (err.value.status, err.value.code) == (503, "MODEL_OFFLINE")


def test_an_engine_crash_is_500_without_details():
    with pytest.raises(ModelFailed) as err:
        _call(RuntimeError("CUDA out of memory at 0xdeadbeef"))
    assert (err.value.status, err.value.code) == (500, "INFERENCE_FAILED")
    assert "0xdeadbeef" not in err.value.message


def test_an_engine_report_of_a_bad_input_is_a_400_detailed_error():
    with pytest.raises(ApiError) as err:
        _call(EngineError(400, "too long", code="TOO_MANY_TOKENS", field="max_tokens"))
    assert not isinstance(err.value, ModelFailed)  # the client's mistake: no fallback
    assert err.value.body()["details"]["max_tokens"]["_errors"] == ["too long"]


def test_a_unary_answer_comes_back_whole_and_its_error_chunk_is_the_clients_error():
    chunks = [Chunk(index=0, text="Hello", tokens=1, finish_reason="length"),
              Usage(prompt_tokens=3, completion_tokens=1)]
    assert asyncio.run(complete_model(_Method(chunks), "m1", "m1", None)) == chunks
    with pytest.raises(ApiError) as err:
        asyncio.run(complete_model(_Method([EngineError(
            400, "too long", code="TOO_MANY_TOKENS", field="max_tokens")]), "m1", "m1", None))
    assert (err.value.status, err.value.code) == (400, "TOO_MANY_TOKENS")
    assert not isinstance(err.value, ModelFailed)


class _Unassigned:
    """A Serve handle call that no replica takes until `take()` (a deployment at zero)."""

    def __init__(self) -> None:
        self.taken = asyncio.Event()
        self.withdrawn = False

    def take(self) -> None:
        self.taken.set()

    async def _fetch_future_result_async(self) -> str:
        try:
            await self.taken.wait()
        except asyncio.CancelledError:
            self.withdrawn = True
            raise
        return "replica"

    def __await__(self):
        async def answer():
            await self._fetch_future_result_async()
            return ["vectors"]

        return answer().__await__()


class _ColdMethod:
    deployment_name, app_name = "image-matting", "inference"

    def __init__(self, response: _Unassigned) -> None:
        self.response = response

    def remote(self, *args):
        return self.response


def _cold_call(response: _Unassigned, take_after_s: float | None = None):
    async def run():
        if take_after_s is not None:
            asyncio.get_running_loop().call_later(take_after_s, response.take)
        return await call_model(_ColdMethod(response), "m1", "m1")

    return asyncio.run(run())


def test_a_call_no_replica_takes_while_none_runs_is_503_with_retry_after(monkeypatch):
    monkeypatch.setattr(ColdStarts, "wait_s", 0.05)
    monkeypatch.setattr(calls, "running_replicas", lambda method: 0)
    response = _Unassigned()
    with pytest.raises(ModelFailed) as err:
        _cold_call(response)
    assert (err.value.status, err.value.code) == (503, "MODEL_AT_CAPACITY")
    assert int(err.value.headers["Retry-After"]) > 0
    assert response.withdrawn  # out of the handle's queue: it is not run later


def test_a_call_waits_on_for_a_replica_that_runs_and_for_one_that_starts_in_time(monkeypatch):
    monkeypatch.setattr(ColdStarts, "wait_s", 0.05)
    monkeypatch.setattr(calls, "running_replicas", lambda method: 1)  # busy, not absent
    assert _cold_call(_Unassigned(), take_after_s=0.3) == ["vectors"]

    def unexpected(method):
        raise AssertionError("no replica count is read for a call taken in time")

    monkeypatch.setattr(ColdStarts, "wait_s", 5.0)
    monkeypatch.setattr(calls, "running_replicas", unexpected)
    assert _cold_call(_Unassigned(), take_after_s=0.1) == ["vectors"]


def test_deprecated_models_carry_the_warning_headers():
    model = CatalogModel.model_validate({
        "id": "old", "type": "embedding", "name": "Old", "deployment": "embedding",
        "engine": "sentence-transformers", "pricing": {},
        "deprecation": {"date": "2026-03-01T00:00:00Z", "replacementModelId": "new"}})
    headers = model.deprecation_headers()
    assert headers["x-service-model-deprecation-date"] == "2026-03-01T00:00:00Z"
    assert "new" in headers["x-service-model-deprecation-warning"]
    assert model_record(model, offline=False)["model_spec"]["deprecation"]["date"].startswith(
        datetime(2026, 3, 1, tzinfo=UTC).strftime("%Y-%m-%d"))
