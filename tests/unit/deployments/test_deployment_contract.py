"""The contract between the Gateway and the deployments (deployments/protocol.py): its values
cross Ray intact, the prompt-cache router reads a TextRequest, and real deployments, run in
process, answer its result objects and report failures as EngineError values."""

from __future__ import annotations

import asyncio
import dataclasses
import io
import pickle
from types import SimpleNamespace

import cloudpickle
import numpy as np
import pytest
from PIL import Image

from deployments import protocol
from deployments.protocol import (
    Chunk,
    Embeddings,
    EngineError,
    ImageRequest,
    ImageResult,
    MediaJob,
    MediaResult,
    Sampling,
    SpeechPiece,
    SpeechRequest,
    SpeechStart,
    TextRequest,
    Transcription,
    TranscriptionRequest,
    Usage,
)
from deployments.routing import _cache_key

REQUEST = TextRequest(request_id="r1", messages=[{"role": "user", "content": "Hi"}],
                      sampling=Sampling(temperature=0.2, stop=("\n",), max_tokens=5, n=2),
                      json_schema={"type": "object"}, prompt_cache_key="conversation-7")

VALUES = [
    REQUEST, Sampling(),
    Chunk(index=0, text="Hel", tokens=1, logprobs=[{"token": "Hel"}], prompt_tokens=3),
    Usage(prompt_tokens=3, completion_tokens=1),
    EngineError(400, "too long", code="TOO_MANY_TOKENS", field="max_tokens"),
    ImageRequest(images=[b"\x89PNG"], fields=["image"], params={"scale": 2}, format="png"),
    ImageResult(images=[b"x"], width=2, height=2, blurred=False, replica_ms=1.0),
    SpeechRequest("Hello.", "joe", 1.0, "wav"), SpeechStart(22050), SpeechPiece(b"ID3", 6),
    TranscriptionRequest(b"RIFF", "en", True),
    Transcription("hi", 1.0, "en", [{"text": "hi", "start": 0.0, "end": 1.0}], None, 2.0),
    MediaJob({"prompt": "a fox", "seconds": 2}, {"image": b"\x89PNG"}),
    MediaResult(b"mp4", "video/mp4", 3.0),
]


@pytest.mark.parametrize("value", VALUES, ids=lambda v: type(v).__name__)
def test_every_value_of_the_contract_crosses_ray_intact(value) -> None:
    for dumps, loads in ((pickle.dumps, pickle.loads), (cloudpickle.dumps, cloudpickle.loads)):
        again = loads(dumps(value))
        assert again == value and type(again) is type(value)


def test_embeddings_cross_with_their_vectors() -> None:
    vectors = np.eye(2, dtype=np.float32)
    again = pickle.loads(pickle.dumps(Embeddings(vectors, [3, 4], 256, 1.5)))
    assert np.array_equal(again.vectors, vectors) and again.tokens == [3, 4]
    assert (again.max_seq_length, again.replica_ms) == (256, 1.5)


def test_the_router_reads_the_prompt_cache_key_of_a_text_request() -> None:
    def pending(*args, **kwargs):
        return SimpleNamespace(args=list(args), kwargs=kwargs)

    assert _cache_key(pending("m", REQUEST)) == "conversation-7"
    assert _cache_key(pending("m", request=REQUEST)) == "conversation-7"
    unkeyed = TextRequest(request_id="r2", messages=[])
    assert _cache_key(pending("m", unkeyed)) is None
    assert _cache_key(pending()) is None  # stats()
    assert _cache_key(None) is None


def _deployment(cls, engine: str):
    spec = {"id": "m1", "engine": engine, "weights": None, "engine_options": {}}
    return cls.func_or_class([spec])


def _png(size: int = 48) -> bytes:
    image = Image.new("RGB", (size, size), (250, 250, 250))
    image.paste((200, 30, 30), (12, 12, size - 12, size - 12))
    out = io.BytesIO()
    image.save(out, format="PNG")
    return out.getvalue()


def test_an_image_deployment_answers_an_image_result_and_reports_failures_as_values() -> None:
    from deployments.image import ImageDeployment

    deployment = _deployment(ImageDeployment, "grabcut")
    out = asyncio.run(deployment.run("m1", ImageRequest([_png()], ["image"], {}, "png")))
    assert isinstance(out, ImageResult)
    assert (out.width, out.height, out.blurred) == (48, 48, False)
    assert Image.open(io.BytesIO(out.images[0])).size == (48, 48)

    bad = asyncio.run(deployment.run("m1", ImageRequest([b"not an image"], ["images[1]"], {},
                                                        "png")))
    assert isinstance(bad, EngineError)
    assert (bad.status, bad.code, bad.field) == (400, "CORRUPTED_IMAGE", "images[1]")
    assert asyncio.run(deployment.run("other", ImageRequest([], [], {}, "png"))) == \
        protocol.not_served("other")


def test_a_speech_stream_starts_with_its_sample_rate_then_sends_audio() -> None:
    from deployments.audio import SpeechDeployment

    deployment = _deployment(SpeechDeployment, "piper")
    voice = deployment.voices("m1")[0]

    async def speak(request: SpeechRequest) -> list:
        return [item async for item in deployment.speak("m1", request)]

    text = "Hello there."
    start, *pieces = asyncio.run(speak(SpeechRequest(text, voice, 1.0, "wav")))
    assert isinstance(start, SpeechStart) and start.sample_rate > 0
    assert pieces and all(isinstance(p, SpeechPiece) for p in pieces)
    assert b"".join(p.audio for p in pieces)[:4] == b"RIFF"
    assert sum(p.characters for p in pieces) == len(text)

    [refused] = asyncio.run(speak(SpeechRequest("Hello.", "nobody", 1.0, "wav")))
    assert isinstance(refused, EngineError)
    assert (refused.status, refused.field) == (400, "voice")


class _StubEngine:
    """A text engine that answers three chunks and its usage."""

    def __init__(self) -> None:
        self.requests: list[TextRequest] = []

    async def generate(self, request: TextRequest):
        self.requests.append(request)
        yield Chunk(index=0, text="Hel", tokens=1, prompt_tokens=4)
        yield Chunk(index=0, text="lo", tokens=1)
        yield Chunk(index=0, text="!", tokens=1, finish_reason="stop")
        yield Usage(prompt_tokens=4, completion_tokens=3)


def test_a_text_deployment_merges_its_engines_chunks_and_reports_a_model_it_lacks() -> None:
    from deployments.text import TextDeployment

    deployment = TextDeployment.func_or_class([])
    engine = deployment.engines["m1"] = _StubEngine()

    merged, usage = asyncio.run(deployment.complete("m1", REQUEST))
    # the first chunk carries the fair-share gate's wait, which the access log reports
    assert isinstance(merged, Chunk) and merged.gate_wait_ms is not None
    assert merged.gate_wait_ms >= 0
    assert dataclasses.replace(merged, gate_wait_ms=None) == Chunk(
        index=0, text="Hello!", tokens=3, finish_reason="stop", prompt_tokens=4)
    assert usage == Usage(prompt_tokens=4, completion_tokens=3)
    assert engine.requests == [REQUEST]

    async def streamed(model_id: str) -> list:
        return [event for piece in [p async for p in deployment.generate(model_id, REQUEST)]
                for event in (piece if isinstance(piece, list) else [piece])]

    events = asyncio.run(streamed("m1"))
    assert "".join(e.text for e in events if isinstance(e, Chunk)) == "Hello!"
    assert events[-1] == Usage(prompt_tokens=4, completion_tokens=3)
    assert asyncio.run(streamed("other")) == [protocol.not_served("other")]
    assert asyncio.run(deployment.complete("other", REQUEST)) == [protocol.not_served("other")]
