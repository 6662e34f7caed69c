"""The calls across Ray, held to their Protocols (deployments/protocol.py): every deployment
class answers its family's calls with the Protocol's parameters, every model deployment of the
registry belongs to a family, and every handle of the in-process tier runs a real deployment
class (tests/fakes/served.py) and answers only that class's methods, so a flow test cannot
pass against a call no deployment answers."""

from __future__ import annotations

import importlib
import inspect
from typing import Any

import pytest

from deployments.audio import SpeechDeployment, TranscriptionDeployment
from deployments.embedding import EmbeddingDeployment
from deployments.image import ImageDeployment
from deployments.protocol import (
    EmbeddingServer,
    ImageServer,
    JobServer,
    SpeechServer,
    TextServer,
    TranscriptionServer,
)
from deployments.registry import MODEL_DEPLOYMENTS
from deployments.text import TextDeployment
from deployments.video import VideoDeployment
from tests.fakes import ServedDeployment

FAMILIES: list[tuple[type, Any]] = [
    (TextServer, TextDeployment), (EmbeddingServer, EmbeddingDeployment),
    (ImageServer, ImageDeployment), (SpeechServer, SpeechDeployment),
    (TranscriptionServer, TranscriptionDeployment), (JobServer, VideoDeployment)]
# Modules of the in-process tier that define fakes of their own.
FAKE_MODULES = ("tests.fakes", "tests.unit.audio.conftest",
                "tests.unit.video.conftest", "tests.unit.flows.test_chat_audio",
                "tests.unit.chat.test_vision_chat")


def _class(deployment: Any) -> type:
    """The class behind a Serve deployment."""
    return getattr(deployment, "func_or_class", deployment)


def _calls(protocol: type) -> list[str]:
    return [name for name, value in vars(protocol).items()
            if callable(value) and not name.startswith("_")]


def _parameters(function: Any) -> list[tuple[str, bool]]:
    """(name, has a default) of each parameter but `self`."""
    return [(p.name, p.default is not inspect.Parameter.empty)
            for p in list(inspect.signature(function).parameters.values())[1:]]


def _kind(function: Any) -> str:
    if inspect.isasyncgenfunction(function):
        return "stream"
    return "unary" if inspect.iscoroutinefunction(function) else "plain"


@pytest.mark.parametrize(("protocol", "deployment"), FAMILIES,
                         ids=[p.__name__ for p, _ in FAMILIES])
def test_each_deployment_class_answers_its_protocol(protocol, deployment):
    cls = _class(deployment)
    for name in _calls(protocol):
        wanted, real = getattr(protocol, name), getattr(cls, name, None)
        assert real is not None, f"{cls.__name__} has no {name}"
        assert _parameters(real) == _parameters(wanted), (cls.__name__, name)
        # A Protocol's `def ... -> AsyncIterator` is a stream: the class yields its pieces.
        expected = "unary" if inspect.iscoroutinefunction(wanted) else "stream"
        assert _kind(real) == expected, (cls.__name__, name)


def test_every_model_deployment_belongs_to_a_family():
    families = {_class(deployment) for _, deployment in FAMILIES}
    for name, deployment in MODEL_DEPLOYMENTS.items():
        assert _class(deployment) in families, f"{name} has no Protocol"


def _subclasses(base: type) -> list[type]:
    for module in FAKE_MODULES:
        importlib.import_module(module)
    found, todo = [], list(base.__subclasses__())
    while todo:
        fake = todo.pop()
        found.append(fake)
        todo += fake.__subclasses__()
    return found


def test_every_handle_on_a_real_deployment_answers_what_its_class_answers():
    handles = _subclasses(ServedDeployment)
    assert len(handles) >= 6  # text, embedding, image, video, speech, transcription
    classes = [_class(deployment) for _, deployment in FAMILIES]
    for handle in handles:
        cls = _class(handle.DEPLOYMENT)
        assert cls in classes, handle.__name__
        assert handle.METHODS and all(callable(getattr(cls, name, None))
                                      for name in handle.METHODS), handle.__name__
