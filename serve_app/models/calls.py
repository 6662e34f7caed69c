"""One hop to a model deployment, with its failures turned into the spec's errors.

A full queue is 503 `MODEL_AT_CAPACITY`: Serve's `max_queued_requests` refuses rather than
queueing without bound, and an engine's fair-share gate refuses a request that would wait too
long for its turn, with the wait as `Retry-After` (deployments/fair_share.py); a dead deployment
is 503 `MODEL_OFFLINE`; an engine's own report of a failure arrives as an `EngineError` value
(deployments/protocol.py) and becomes that status.

A deployment scaled to zero (`min_replicas: 0`) is started by the call itself: Serve's handle
queues it and reports the queue, and the autoscaler starts a replica. The call waits for that
cold start, but not without end: one that no replica has taken after `COLD_START_WAIT_S`
while its deployment has no running replica is withdrawn and answered 503
`MODEL_AT_CAPACITY` with `Retry-After` (the replica keeps starting for the retry). A call
queued behind running but busy replicas waits as before: that queue has its own bounds.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncIterator, Iterator
from typing import Any

from ray.exceptions import ActorDiedError, ActorUnavailableError, RayActorError
from ray.serve.exceptions import BackPressureError, DeploymentUnavailableError

from deployments.protocol import EngineError, TextEvent
from serve_app.errors import ApiError, nest_errors, retry_after
from serve_app.metrics import metrics

logger = logging.getLogger("serve_app.models.calls")


@contextlib.contextmanager
def outliving_the_request() -> Iterator[None]:
    """Model calls made (and tasks created) inside are not children of the Serve request being
    served: Serve cancels a request's child calls when its client leaves, and a background
    generation must outlive the connection that asked for it. The request's id is kept (for
    Serve's logs); the link to the request is not."""
    from ray.serve import context as serve_context  # private: Serve has no public switch

    current = serve_context._get_serve_request_context()
    token = serve_context._serve_request_context.set(serve_context._RequestContext(
        route=current.route, request_id=current.request_id, app_name=current.app_name))
    try:
        yield
    finally:
        serve_context._serve_request_context.reset(token)


class ModelFailed(ApiError):
    """The model could not answer (ours, not the client's fault): fallbacks may try another."""


def engine_error_to_api(error: EngineError) -> ApiError:
    status, message, field = error.status, error.message, error.field
    details = nest_errors([((field,) if field else (), message)]) if status == 400 else None
    headers = retry_after(error.retry_after) if error.retry_after is not None else None
    cls = ModelFailed if status >= 500 else ApiError
    return cls(status, message, code=error.code or (
        "INVALID_REQUEST" if status == 400 else "INFERENCE_FAILED"), details=details,
        headers=headers)


def raise_if_reported(answer: Any) -> None:
    """An engine's own report of a failure (an `EngineError` value), raised as its
    ApiError."""
    if isinstance(answer, EngineError):
        raise engine_error_to_api(answer)


def _translate(exc: BaseException, model_id: str) -> ApiError:
    if isinstance(exc, BackPressureError):
        return ModelFailed(503, f"Model {model_id} is at capacity; try again later",
                           code="MODEL_AT_CAPACITY")
    if isinstance(exc, DeploymentUnavailableError | ActorDiedError | ActorUnavailableError
                  | RayActorError):
        return ModelFailed(503, f"Model {model_id} is offline; try again later",
                           code="MODEL_OFFLINE")
    logger.error("model %s failed", model_id, exc_info=exc)
    return ModelFailed(500, "Inference failed", code="INFERENCE_FAILED")


COLD_START_RETRY_AFTER_S = 15  # Retry-After of a call withdrawn while its replica starts


class ColdStarts:
    """How long a call waits for a replica of a deployment that has none running
    (`cold_start_wait_s`, set once per Gateway replica from the settings)."""

    wait_s: float = 120.0


def bound_cold_starts(wait_s: float) -> None:
    ColdStarts.wait_s = wait_s


def running_replicas(method: Any) -> int:
    """The RUNNING replicas of `method`'s deployment, as the Serve controller reports them
    (a call to the controller: only for a call that has waited long already)."""
    from ray import serve

    app = serve.status().applications.get(method.app_name)
    deployment = app.deployments.get(method.deployment_name) if app else None
    return deployment.replica_states.get("RUNNING", 0) if deployment else 0


async def wait_for_a_replica(response: Any, method: Any, model_id: str) -> None:
    """Until a replica has taken the call (`response`, a Serve handle call's). Past
    `ColdStarts.wait_s` with no replica of the deployment running: the call is withdrawn and
    ApiError 503 MODEL_AT_CAPACITY raised, with Retry-After."""
    fetch = getattr(response, "_fetch_future_result_async", None)
    if fetch is None:  # not a Serve handle's call (a test's stand-in): nothing to wait for
        return
    taken = asyncio.ensure_future(fetch())
    try:
        done, _ = await asyncio.wait({taken}, timeout=ColdStarts.wait_s)
        if not done:
            try:
                running = await asyncio.to_thread(running_replicas, method)
            except Exception:  # the controller does not answer: no replica to count on
                logger.exception("reading the replicas of %s failed", model_id)
                running = 0
            if running == 0 and not taken.done():
                taken.cancel()  # leaves the handle's queue; the replica keeps starting
                logger.warning("a call to %s withdrawn: no replica took it in %.0f s and its "
                               "deployment has none running", model_id, ColdStarts.wait_s)
                raise ModelFailed(
                    503, f"Model {model_id} is starting; try again in "
                         f"{COLD_START_RETRY_AFTER_S} seconds", code="MODEL_AT_CAPACITY",
                    headers=retry_after(COLD_START_RETRY_AFTER_S))
        await taken
    finally:
        if not taken.done():  # this request was cancelled (its client left)
            taken.cancel()


class _Timed:
    """A call's time on its deployment (queue and engine, as this replica waits for it) and
    the calls in flight, for the metrics."""

    def __init__(self, method: Any, model_id: str) -> None:
        self.deployment = str(getattr(method, "deployment_name", "") or "unknown")
        self.model_id = model_id

    def __enter__(self) -> _Timed:
        self.started = time.perf_counter()
        metrics().call_started(self.deployment)
        return self

    def __exit__(self, *_: object) -> None:
        m = metrics()
        m.call_ended(self.deployment)
        m.engine_seconds.observe(time.perf_counter() - self.started,
                                 tags={"deployment": self.deployment, "model": self.model_id})


async def call_model(method: Any, model_id: str, *args: Any) -> Any:
    """`await handle.<method>.remote(*args)`: its result object (deployments/protocol.py),
    raising ApiError for any failure."""
    try:
        with _Timed(method, model_id):
            response = method.remote(*args)
            await wait_for_a_replica(response, method, model_id)
            result = await response
    except ApiError:
        raise
    except Exception as exc:
        raise _translate(exc, model_id) from exc
    raise_if_reported(result)
    return result


async def complete_model(method: Any, model_id: str, *args: Any) -> list[TextEvent]:
    """The chunks and usage of a deployment method that answers a unary request in one
    reply; an EngineError among them raises ApiError."""
    chunks: list[TextEvent] = await call_model(method, model_id, *args)
    for chunk in chunks:
        raise_if_reported(chunk)
    return chunks


async def stream_model(method: Any, model_id: str, *args: Any) -> AsyncIterator[Any]:
    """Items of a streaming deployment method, which yields items or lists of them (see
    deployments/streaming.py); an EngineError or a failure raises ApiError."""
    try:
        with _Timed(method, model_id):
            pieces = method.options(stream=True).remote(*args)
            await wait_for_a_replica(pieces, method, model_id)
            async for piece in pieces:
                for chunk in piece if isinstance(piece, list) else (piece,):
                    raise_if_reported(chunk)
                    yield chunk
    except ApiError:
        raise
    except Exception as exc:
        raise _translate(exc, model_id) from exc
