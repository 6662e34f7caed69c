"""A real deployment class run in process behind a handle, its engines fakes.

The model is Ray Serve LLM's `MockVLLMEngine` behind the real `LLMServer`: the deployment's
own code (the model lookup and "not served here", the fair-share gate, the stream's merge,
the conversion of what its engine raises into the spec's errors) runs in every flow test;
only the engine, the part that needs weights and seconds, is a fake. A fake engine is
registered under the engine name `fake` in the class's `ENGINES` (a subclass that changes
nothing else), and every model the handle holds is built with it.

Failures: Serve's own (`at_capacity()`, `offline()`) stay at the handle; any other failure a
test sets is handed to the fake engines, which fail the way the family's real engines do (a
text engine yields the EngineError, an image engine raises, ...), so that it travels through
the deployment's code to the Gateway.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any, ClassVar, Protocol

from deployments.spec import EngineOptionsView, ModelSpec
from tests.fakes.handles import DeploymentHandle, Failure, raised_by_serve

FAKE_ENGINE = "fake"


class ModelOptions(Protocol):
    """What a catalog model tells its fake (serve_app's `CatalogModel` has these)."""

    @property
    def id(self) -> str: ...

    @property
    def engine_options(self) -> EngineOptionsView: ...


class FakeEngine:
    """What every fake engine shares: the failure a test set (`fail_with`), met after
    `after_pieces` pieces of a stream (at once otherwise)."""

    def __init__(self, weights: str | None = None, options: dict[str, Any] | None = None
                 ) -> None:
        self.options = dict(options or {})
        self.failure: Failure | None = None
        self.after_pieces = 0

    def fail_with(self, failure: Failure, after_pieces: int = 0) -> None:
        self.failure, self.after_pieces = failure, after_pieces

    def recover(self) -> None:
        self.failure, self.after_pieces = None, 0


def fake_specs(models: Sequence[str | ModelOptions]) -> list[ModelSpec]:
    """The specs a replica would get for `models` (ids, or catalog models with their engine
    options), every one on the fake engine."""
    specs: list[ModelSpec] = []
    for model in models:
        model_id = model if isinstance(model, str) else model.id
        options = {} if isinstance(model, str) else {
            k: v for k, v in model.engine_options.given().items() if k != "build"}
        specs.append({"id": model_id, "engine": FAKE_ENGINE, "weights": None,
                      "engine_options": options})
    return specs


def class_of(deployment: Any) -> type:
    """The class behind a Serve deployment (`@serve.deployment` wraps it)."""
    return getattr(deployment, "func_or_class", deployment)


_MADE: dict[tuple[type, type], type] = {}


def with_fake_engine(cls: type, engine: type[FakeEngine]) -> type:
    """A deployment class (a Serve deployment's `func_or_class`) with `engine` registered as
    its `fake` engine, and nothing else changed (made once per pair)."""
    made = _MADE.get((cls, engine))
    if made is None:
        made = _MADE[cls, engine] = type(cls.__name__, (cls,), {
            "ENGINES": {FAKE_ENGINE: engine}, "__module__": cls.__module__})
    return made


class ServedDeployment(DeploymentHandle):
    """A handle on an instance of the real deployment class `DEPLOYMENT`, each of its models
    served by a fake engine (`ENGINE`, or the one given)."""

    DEPLOYMENT: ClassVar[type]  # the class behind the Serve deployment
    ENGINE: ClassVar[type[FakeEngine]]

    def __init__(self, deployment_name: str, models: Sequence[str | ModelOptions], *,
                 engine: type[FakeEngine] | None = None) -> None:
        super().__init__(deployment_name)
        cls = with_fake_engine(self.DEPLOYMENT, engine or self.ENGINE)
        self.deployment = cls(fake_specs(models))

    @property
    def engines(self) -> Mapping[str, Any]:
        """The fake engines, by model id."""
        return self.deployment.engines

    def _answer(self, name: str) -> Callable[..., Any]:
        return getattr(self.deployment, name)

    def fail_with(self, failure: Failure, *, model_id: str | None = None,
                  after_pieces: int = 0) -> None:
        """As `DeploymentHandle.fail_with`; a failure of the engine's (not Serve's) is set on
        the engines, which fail the way the family's real engines do."""
        if raised_by_serve(failure):
            super().fail_with(failure, model_id=model_id, after_pieces=after_pieces)
            return
        for held, engine in self.engines.items():
            if model_id in (None, held):
                engine.fail_with(failure, after_pieces)

    def recover(self) -> None:
        super().recover()
        for engine in self.engines.values():
            engine.recover()
