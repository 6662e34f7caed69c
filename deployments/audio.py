"""The audio deployments: `speech` (text to speech, streamed sentence by sentence) and
`transcription` (speech to text), each with its own autoscaling bounds and a bounded queue
(configs/deployments.yaml).

Engines are synchronous and CPU-bound: they run in a worker thread of the replica, so its
event loop keeps answering (health checks, other calls) while audio is computed.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import AsyncIterator, Callable, Iterator
from typing import Any

from ray import serve

from deployments.base import ModelDeployment, not_served
from deployments.engines.audio import CONTENT_TYPES, ENGINES, encode_audio
from deployments.errors import engine_error
from deployments.spec import ModelSpec

_DONE = object()


async def in_thread(produce: Callable[[], Iterator[Any]]) -> AsyncIterator[Any]:
    """The items of a blocking iterator, computed in a worker thread as they come."""
    loop = asyncio.get_running_loop()
    queue: asyncio.Queue[Any] = asyncio.Queue(maxsize=8)
    stop = threading.Event()

    def run() -> None:
        if stop.is_set():  # the consumer left before the work began
            return
        try:
            for item in produce():
                if stop.is_set():
                    return
                asyncio.run_coroutine_threadsafe(queue.put(item), loop).result()
        except BaseException as exc:  # handed to the consumer
            asyncio.run_coroutine_threadsafe(queue.put(exc), loop).result()
            return
        asyncio.run_coroutine_threadsafe(queue.put(_DONE), loop).result()

    worker = loop.run_in_executor(None, run)
    try:
        while True:
            item = await queue.get()
            if item is _DONE:
                break
            if isinstance(item, BaseException):
                raise item
            yield item
    finally:
        stop.set()
        while not queue.empty():  # let a blocked producer finish
            queue.get_nowait()
        await asyncio.shield(worker)


@serve.deployment
class SpeechDeployment(ModelDeployment):
    ENGINES = ENGINES

    def __init__(self, models: list[ModelSpec]) -> None:
        super().__init__(models)
        self._busy = threading.Lock()  # one synthesis at a time: the engine uses its threads

    def voices(self, model_id: str) -> list[str]:
        return list(self.engines[model_id].voices())

    async def speak(self, model_id: str, text: str, voice: str, speed: float,
                    fmt: str) -> AsyncIterator[Any]:
        """Encoded audio of `text`, piece by piece as sentences are synthesized; the first
        item is `{"sample_rate"}` (or an error), the rest are bytes."""
        engine = self.engines.get(model_id)
        if engine is None:
            yield not_served(model_id)
            return
        if voice not in engine.voices():
            yield engine_error(400, f"voice {voice!r} is not offered by {model_id}; use one "
                                    f"of {', '.join(engine.voices())}", field="voice")
            return
        yield {"sample_rate": engine.sample_rate}

        def produce() -> Iterator[bytes]:
            with self._busy:
                yield from encode_audio(engine.synthesize(text, voice, speed),
                                        engine.sample_rate, fmt)

        try:
            async for piece in in_thread(produce):
                yield piece
        except ValueError as exc:  # text the voice cannot read
            yield engine_error(400, str(exc), field="input")

    async def synthesize(self, model_id: str, params: dict[str, Any],
                         inputs: dict[str, bytes]) -> dict[str, Any]:
        """A queued speech job (`/audio/queue`): all of `params["prompt"]` read aloud, as one
        file in `params["format"]`."""
        engine = self.engines.get(model_id)
        if engine is None:
            return not_served(model_id)
        fmt = str(params.get("format", "mp3"))
        started = time.perf_counter()

        def work() -> bytes:
            with self._busy:
                return b"".join(encode_audio(
                    engine.synthesize(params["prompt"], params["voice"],
                                      float(params.get("speed") or 1.0)),
                    engine.sample_rate, fmt))

        try:
            media = await asyncio.to_thread(work)
        except ValueError as exc:
            return engine_error(400, str(exc), field="prompt")
        return {"media": media, "media_type": CONTENT_TYPES[fmt],
                "replica_ms": (time.perf_counter() - started) * 1000}


@serve.deployment
class TranscriptionDeployment(ModelDeployment):
    ENGINES = ENGINES

    def __init__(self, models: list[ModelSpec]) -> None:
        super().__init__(models)
        self._busy = threading.Lock()

    async def transcribe(self, model_id: str, audio: bytes, language: str | None,
                         timestamps: bool) -> dict[str, Any]:
        engine = self.engines.get(model_id)
        if engine is None:
            return not_served(model_id)
        started = time.perf_counter()

        def work() -> dict[str, Any]:
            with self._busy:
                return engine.transcribe(audio, language, timestamps)

        try:
            out = await asyncio.to_thread(work)
        except ValueError as exc:  # audio that cannot be decoded or is too long; a language
            message = str(exc)       # the model does not know
            if message.startswith("language"):
                return engine_error(400, message, field="language")
            return engine_error(400, message, code="INVALID_AUDIO_FORMAT", field="file")
        out["replica_ms"] = (time.perf_counter() - started) * 1000
        return out

