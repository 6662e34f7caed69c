"""How failures of a model deployment reach the client."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime

import pytest
from ray.serve.exceptions import BackPressureError, DeploymentUnavailableError

from deployments.protocol import Chunk, EngineError, Usage
from serve_app.errors import ApiError
from serve_app.models.calls import ModelFailed, call_model, complete_model
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
