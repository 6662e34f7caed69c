"""The audio deployments: `speech` (text to speech, streamed sentence by sentence) and
`transcription` (speech to text), each with its own autoscaling bounds and a bounded queue
(configs/deployments.yaml).

Engines are synchronous and CPU-bound: they run in a worker thread of the replica, so its
event loop keeps answering (health checks, other calls) while audio is computed. One request
runs at a time per replica; the waiting ones are served least-served account first (engine
seconds), and one that would wait past MAX_QUEUE_WAIT_S is answered 503 at once
(deployments/fair_share.py). A transcription whose call is cancelled (its client left) stops
at Whisper's next segment, its turn held until the engine is free (engines/stop.py); speech
stops at its next sentence.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import AsyncIterator, Callable, Iterator
from typing import Any

from ray import serve

from deployments.base import ModelDeployment
from deployments.engines.audio import CONTENT_TYPES, encode_audio, encode_sentences
from deployments.engines.audio_engines import ENGINES
from deployments.engines.stop import Stopped, StopSignal, until_stopped
from deployments.fair_share import AtCapacity, one_at_a_time, timed_turn
from deployments.protocol import (
    EngineError,
    MediaJob,
    MediaResult,
    SpeechPiece,
    SpeechRequest,
    SpeechStart,
    Transcription,
    TranscriptionRequest,
    at_capacity,
    not_served,
)
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
        # One synthesis at a time: the engine uses its threads. The gate orders the waiting
        # requests; the lock also holds off a thread still finishing for a client that left.
        self.gate = one_at_a_time(models)
        self._busy = threading.Lock()

    def voices(self, model_id: str) -> list[str]:
        return list(self.engines[model_id].voices())

    async def speak(self, model_id: str, request: SpeechRequest
                    ) -> AsyncIterator[SpeechStart | SpeechPiece | EngineError]:
        """Encoded audio of the request's text, piece by piece as sentences are synthesized;
        the first item is a `SpeechStart` (or an EngineError), the rest are `SpeechPiece`s,
        each with the characters it reads (an EngineError last when the voice cannot read
        the text)."""
        engine = self.engines.get(model_id)
        if engine is None:
            yield not_served(model_id)
            return
        if request.voice not in engine.voices():
            yield EngineError(400, f"voice {request.voice!r} is not offered by {model_id}; "
                                   f"use one of {', '.join(engine.voices())}", field="voice")
            return
        yield SpeechStart(engine.sample_rate)

        def produce() -> Iterator[tuple[bytes, int]]:
            with self._busy:
                yield from encode_sentences(
                    engine.sentences(request.text, request.voice, request.speed),
                    engine.sample_rate, request.format)

        try:
            async with timed_turn(self.gate, request.tenant, model_id):
                async for audio, characters in in_thread(produce):
                    yield SpeechPiece(audio, characters)
        except AtCapacity as full:
            yield at_capacity(model_id, full.retry_after)
        except ValueError as exc:  # text the voice cannot read
            yield EngineError(400, str(exc), field="input")

    async def synthesize(self, model_id: str, job: MediaJob) -> MediaResult | EngineError:
        """A queued speech job (`/audio/queue`): all of its params' `prompt` read aloud, as
        one file in their `format`."""
        engine = self.engines.get(model_id)
        if engine is None:
            return not_served(model_id)
        params = job.params
        fmt = str(params.get("format", "mp3"))
        started = time.perf_counter()

        def work() -> bytes:
            with self._busy:
                return b"".join(encode_audio(
                    engine.synthesize(params["prompt"], params["voice"],
                                      float(params.get("speed") or 1.0)),
                    engine.sample_rate, fmt))

        try:
            # the caller's share, as any call
            async with timed_turn(self.gate, job.tenant, model_id):
                media = await asyncio.to_thread(work)
        except AtCapacity as full:
            return at_capacity(model_id, full.retry_after)
        except ValueError as exc:
            return EngineError(400, str(exc), field="prompt")
        return MediaResult(media, CONTENT_TYPES[fmt], (time.perf_counter() - started) * 1000)


@serve.deployment
class TranscriptionDeployment(ModelDeployment):
    ENGINES = ENGINES

    def __init__(self, models: list[ModelSpec]) -> None:
        super().__init__(models)
        self.gate = one_at_a_time(models)  # the order of the waiting requests (see speech)
        self._busy = threading.Lock()
        self.stopped_early = 0  # transcriptions stopped because their call was cancelled

    async def transcribe(self, model_id: str, request: TranscriptionRequest
                         ) -> Transcription | EngineError:
        engine = self.engines.get(model_id)
        if engine is None:
            return not_served(model_id)
        started = time.perf_counter()
        # named only when the Gateway gave them: an engine that takes none is still served
        bounds = {name: value for name, value in (("demuxer", request.demuxer),
                                                  ("max_seconds", request.max_seconds))
                  if value is not None}

        def work(stop: StopSignal) -> dict[str, Any]:
            with self._busy:
                try:
                    return engine.transcribe(request.audio, request.language,
                                             request.timestamps, stop=stop, **bounds)
                except Stopped:
                    self.stopped_early += 1
                    raise

        try:
            async with timed_turn(self.gate, request.tenant, model_id):
                out = await until_stopped(work)
        except AtCapacity as full:
            return at_capacity(model_id, full.retry_after)
        except ValueError as exc:  # audio that cannot be decoded or is too long; a language
            message = str(exc)       # the model does not know
            if message.startswith("language"):
                return EngineError(400, message, field="language")
            return EngineError(400, message, code="INVALID_AUDIO_FORMAT", field="file")
        return Transcription(out["text"], out["duration"], out.get("language"),
                             out["segments"], out.get("words"),
                             (time.perf_counter() - started) * 1000)

