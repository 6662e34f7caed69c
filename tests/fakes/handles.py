"""Serve's side of a model call, in process: handles that answer the Gateway the way Serve's
`DeploymentHandle`s do, and the failures Serve itself raises.

The Gateway calls a deployment as `await handle.<method>.remote(*args)` (serve_app/models/calls.py
`call_model`) or iterates `handle.<method>.options(stream=True).remote(*args)` (`stream_model`),
and reads `deployment_name` for its metrics. A `DeploymentHandle` here has those; it records
every call, can hold calls in flight (`pause`/`resume`) and can fail them the way Serve does
(`at_capacity()`, `offline()`). What answers is `_answer(name)`: a method of a real deployment
instance (`ServedDeployment`, whose engines are fakes).

    text.fail_with(at_capacity())                      # Serve refuses: 503 MODEL_AT_CAPACITY
    text.fail_with(offline())                          # the replica died: 503 MODEL_OFFLINE
    text.fail_with(crashed())                          # the engine raised: 500 INFERENCE_FAILED
    text.fail_with(reported(503, "busy", code="X"))    # the engine's own report (EngineError)
    text.fail_with(at_capacity(), model_id="chat-a")   # only for one of its models
    text.fail_with(crashed(), after_pieces=2)          # a stream that breaks after 2 pieces
    text.recover()
    text.pause()   # calls wait (work in flight, as a test sees it) until
    text.resume()
"""

from __future__ import annotations

import asyncio
import inspect
import threading
from collections.abc import AsyncIterator, Awaitable, Callable, Generator
from dataclasses import dataclass
from typing import Any, ClassVar

from ray.exceptions import ActorUnavailableError
from ray.serve.exceptions import BackPressureError

from deployments.protocol import EngineError

# An exception raised when the call is awaited, or an engine error answered as a value.
Failure = BaseException | EngineError


# ---- failures ----------------------------------------------------------------------------

def at_capacity() -> BackPressureError:
    """Serve's refusal when the deployment's queue is full (the Gateway's 503
    MODEL_AT_CAPACITY)."""
    return BackPressureError(num_queued_requests=8, max_queued_requests=8)


def offline() -> ActorUnavailableError:
    """A replica that is gone (the Gateway's 503 MODEL_OFFLINE)."""
    return ActorUnavailableError("the replica is unavailable", None)


def crashed(message: str = "the engine crashed") -> RuntimeError:
    """Any other exception out of the deployment (the Gateway's 500 INFERENCE_FAILED)."""
    return RuntimeError(message)


def reported(status: int, message: str, *, code: str | None = None,
             field: str | None = None) -> EngineError:
    """An engine's own report of a failure (deployments/protocol.py `EngineError`)."""
    return EngineError(status, message, code=code, field=field)


def raised_by_serve(failure: Failure) -> bool:
    """Whether Serve itself raises `failure` (a full queue, a replica gone), not a replica's
    code: a handle fails those calls; anything else is the engine's to fail."""
    return isinstance(failure, BackPressureError | ActorUnavailableError)


# ---- the handle look-alike ---------------------------------------------------------------

@dataclass(frozen=True)
class Call:
    """One call a handle got: the method, its arguments, and whether it was streamed."""

    method: str
    args: tuple[Any, ...]
    stream: bool

    @property
    def model_id(self) -> str:
        return self.args[0]


class _Response:
    """`handle.m.remote(...)`: awaitable once, like Serve's `DeploymentResponse`."""

    def __init__(self, start: Callable[[], Awaitable[Any]]) -> None:
        self._start = start

    def __await__(self) -> Generator[Any, None, Any]:
        return self._start().__await__()


class _ResponseGenerator:
    """`handle.m.options(stream=True).remote(...)`: async-iterable, like Serve's
    `DeploymentResponseGenerator`; a failure surfaces on the first `__anext__`."""

    def __init__(self, start: Callable[[], AsyncIterator[Any]]) -> None:
        self._start = start
        self._iterator: AsyncIterator[Any] | None = None

    def __aiter__(self) -> _ResponseGenerator:
        return self

    async def __anext__(self) -> Any:
        if self._iterator is None:
            self._iterator = self._start()
        return await self._iterator.__anext__()


class _Method:
    """`handle.<name>`: `.remote(*args)`, `.options(stream=...)`, `deployment_name`."""

    def __init__(self, handle: DeploymentHandle, name: str, stream: bool = False) -> None:
        self._handle = handle
        self._name = name
        self._stream = stream

    @property
    def deployment_name(self) -> str:
        return self._handle.deployment_name

    def options(self, *, stream: bool | None = None, **_: Any) -> _Method:
        return _Method(self._handle, self._name, self._stream if stream is None else stream)

    def remote(self, *args: Any) -> _Response | _ResponseGenerator:
        return self._handle._call(self._name, args, self._stream)


class DeploymentHandle:
    """A Serve deployment handle look-alike: the calls in `METHODS` go to `_answer(name)`, a
    coroutine function for unary methods, an async generator function for streaming ones (a
    plain function's result is answered as it is)."""

    METHODS: ClassVar[tuple[str, ...]] = ()

    def __init__(self, deployment_name: str) -> None:
        self.deployment_name = deployment_name
        self.calls: list[Call] = []
        self._failures: dict[str | None, tuple[Failure, int]] = {}
        # Set while calls may run; a test thread clears it (`pause`) to hold calls in flight.
        self._running = threading.Event()
        self._running.set()

    def __getattr__(self, name: str) -> _Method:
        if name in type(self).METHODS:
            return _Method(self, name)
        raise AttributeError(f"{type(self).__name__} ({self.deployment_name}) has no "
                             f"method {name!r}")

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.deployment_name!r})"

    def _answer(self, name: str) -> Callable[..., Any]:
        raise NotImplementedError

    # -- switches --

    def fail_with(self, failure: Failure, *, model_id: str | None = None,
                  after_pieces: int = 0) -> None:
        """Fail every later call (for `model_id` only, when given) with `failure`: an exception
        raised where Serve would raise it, or an EngineError (`reported(...)`) answered as a
        value. `after_pieces`: a stream fails only after sending that many pieces (a unary
        call fails at once)."""
        self._failures[model_id] = (failure, after_pieces)

    def recover(self) -> None:
        self._failures.clear()

    def pause(self) -> None:
        """Hold every call that starts from now on until `resume` (from the test's thread:
        the gateway's event loop keeps running meanwhile)."""
        self._running.clear()

    def resume(self) -> None:
        self._running.set()

    async def _wait_while_paused(self) -> None:
        await asyncio.sleep(0)
        while not self._running.is_set():
            await asyncio.sleep(0.005)

    # -- what the tests read --

    def calls_to(self, method: str) -> list[Call]:
        return [c for c in self.calls if c.method == method]

    # -- the machinery --

    def _refusal(self, model_id: Any) -> tuple[Failure | None, int]:
        """The failure a call for `model_id` meets here, and after how many pieces."""
        return self._failures.get(model_id, self._failures.get(None, (None, 0)))

    def _answered(self, name: str, args: tuple[Any, ...], result: Any) -> Any:
        """A unary call's answer on its way back (a handle that keeps answers notes it)."""
        return result

    def _call(self, name: str, args: tuple[Any, ...], stream: bool
              ) -> _Response | _ResponseGenerator:
        self.calls.append(Call(name, args, stream))
        answer = self._answer(name)
        refusal, after_pieces = self._refusal(args[0] if args else None)
        if stream:
            async def streamed() -> AsyncIterator[Any]:
                await self._wait_while_paused()
                sent = 0
                if refusal is None or after_pieces:
                    async for piece in answer(*args):
                        if refusal is not None and sent == after_pieces:
                            break
                        yield piece
                        sent += 1
                if isinstance(refusal, BaseException):
                    raise refusal
                if refusal is not None:
                    yield refusal

            return _ResponseGenerator(streamed)

        async def unary() -> Any:
            await self._wait_while_paused()
            if isinstance(refusal, BaseException):
                raise refusal
            if refusal is not None:
                return self._reported_answer(name, refusal)
            result = answer(*args)
            if hasattr(result, "__aiter__"):  # a streaming method awaited whole
                result = [piece async for piece in result]
            elif inspect.isawaitable(result):
                result = await result
            return self._answered(name, args, result)

        return _Response(unary)

    def _reported_answer(self, method: str, error: EngineError) -> Any:
        """How the method answers an error (a list of chunks answers `[error]`)."""
        return error
