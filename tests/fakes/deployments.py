"""Fake model deployments that answer the Gateway the way Serve's `DeploymentHandle`s do.

The Gateway calls a deployment as `await handle.<method>.remote(*args)` (serve_app/models/calls.py
`call_model`) or iterates `handle.<method>.options(stream=True).remote(*args)` (`stream_model`),
and reads `deployment_name` for its metrics. Each fake here has those, answers with the shapes
the real deployment (deployments/*.py) sends, deterministically and in microseconds, records
every call it got, and can be switched to fail. Arguments and answers are the types of
deployments/protocol.py, as with the real deployments:

    text = FakeTextDeployment("text-xs")
    text.fail_with(at_capacity())                      # Serve refuses: 503 MODEL_AT_CAPACITY
    text.fail_with(offline())                          # the replica died: 503 MODEL_OFFLINE
    text.fail_with(crashed())                          # the engine raised: 500 INFERENCE_FAILED
    text.fail_with(reported(503, "busy", code="X"))    # the engine's own report (EngineError)
    text.fail_with(at_capacity(), model_id="chat-a")   # only for one of its models
    text.fail_with(crashed(), after_pieces=2)          # a stream that breaks after 2 pieces
    text.recover()
    text.pause()   # calls wait (work in flight, as a test sees it) until
    text.resume()

`fake_deployments(catalog)` builds one fake per deployment of a catalog (text, embedding, image
and video families), to hand to `GatewayState.create(handles=...)`.
"""

from __future__ import annotations

import asyncio
import hashlib
import io
import re
import threading
from collections.abc import AsyncIterator, Awaitable, Callable, Generator
from dataclasses import dataclass
from fractions import Fraction
from typing import Any, ClassVar

import numpy as np
from PIL import Image
from ray.exceptions import ActorUnavailableError
from ray.serve.exceptions import BackPressureError

from deployments.protocol import (
    Chunk,
    Embeddings,
    EngineError,
    ImageRequest,
    ImageResult,
    MediaJob,
    MediaResult,
    Message,
    SpeechPiece,
    SpeechRequest,
    SpeechStart,
    Tenant,
    TextEvent,
    TextRequest,
    Usage,
    not_served,
)

# An exception raised when the call is awaited, or an engine error answered as a value.
Failure = BaseException | EngineError

DEFAULT_REPLY = "The quick brown fox jumps over the lazy dog."


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


# ---- the handle look-alike ---------------------------------------------------------------

@dataclass(frozen=True)
class Call:
    """One call a fake got: the method, its arguments, and whether it was streamed."""

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

    def __init__(self, deployment: FakeDeployment, name: str, stream: bool = False) -> None:
        self._deployment = deployment
        self._name = name
        self._stream = stream

    @property
    def deployment_name(self) -> str:
        return self._deployment.deployment_name

    def options(self, *, stream: bool | None = None, **_: Any) -> _Method:
        return _Method(self._deployment, self._name,
                       self._stream if stream is None else stream)

    def remote(self, *args: Any) -> _Response | _ResponseGenerator:
        return self._deployment._call(self._name, args, self._stream)


class FakeDeployment:
    """A Serve deployment handle look-alike. Subclasses implement `async def _<method>(...)`
    (a coroutine for unary methods, an async generator for streaming ones) for each name in
    `METHODS`."""

    METHODS: ClassVar[tuple[str, ...]] = ()

    def __init__(self, deployment_name: str, models: list[str] | None = None) -> None:
        self.deployment_name = deployment_name
        # The model ids this deployment holds; None: any (a model it does not hold gets the
        # real deployments' answer, `not_served`: a 404 EngineError).
        self.models = set(models) if models is not None else None
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

    def _failure_for(self, model_id: Any) -> tuple[Failure | None, int]:
        return self._failures.get(model_id, self._failures.get(None, (None, 0)))

    def _not_served(self, model_id: Any) -> EngineError | None:
        if self.models is None or model_id in self.models:
            return None
        return not_served(model_id)

    def _call(self, name: str, args: tuple[Any, ...], stream: bool
              ) -> _Response | _ResponseGenerator:
        self.calls.append(Call(name, args, stream))
        impl = getattr(self, f"_{name}")
        model_id = args[0] if args else None
        refusal, after_pieces = self._failure_for(model_id)
        if refusal is None:
            refusal, after_pieces = self._not_served(model_id), 0
        if stream:
            async def streamed() -> AsyncIterator[Any]:
                await self._wait_while_paused()
                sent = 0
                if refusal is None or after_pieces:
                    async for piece in impl(*args):
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
            result = impl(*args)
            if hasattr(result, "__aiter__"):  # a streaming method awaited whole
                return [piece async for piece in result]
            return await result

        return _Response(unary)

    def _reported_answer(self, method: str, error: EngineError) -> Any:
        """How the method answers an error (a list of chunks answers `[error]`)."""
        return error


# ---- text --------------------------------------------------------------------------------

def _words(text: str) -> list[str]:
    """One token per word, with its trailing space: the pieces add up to `text`."""
    return re.findall(r"\S+\s*", text)


def _message_text(message: Message) -> str:
    content = message.get("content")
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return " ".join(str(p.get("text", "")) for p in content if isinstance(p, dict))
    return ""


def prompt_token_list(messages: list[Message]) -> list[str]:
    """The fake's tokenizer: one token per word of each message, after one for its role."""
    return [token for m in messages
            for token in [f"<{m.get('role')}>", *_words(_message_text(m))]]


def count_prompt_tokens(messages: list[Message]) -> int:
    return len(prompt_token_list(messages))


class FakeTextDeployment(FakeDeployment):
    """A text deployment (deployments/text.py): `generate` streams lists of chunks,
    `complete` answers the merged chunks at once.

    Every choice answers `reply`, one token per word, sent in `pieces` chunks; `max_tokens`
    cuts it (finish_reason `length`). The prompt counts one token per word and per message.
    Like vLLM's prefix cache, a prompt's longest prefix shared with an earlier prompt of the
    same model and the same `cache_salt` counts as cached (all but its last token at most):
    `cached_tokens`.
    """

    METHODS = ("generate", "complete", "stats")

    def __init__(self, deployment_name: str = "text-xs", models: list[str] | None = None, *,
                 reply: str = DEFAULT_REPLY, pieces: int = 3) -> None:
        super().__init__(deployment_name, models)
        self.reply = reply
        self.pieces = max(1, pieces)
        # (model, cache salt) -> prompts, as tokens
        self._prompts_seen: dict[tuple[str, str | None], list[list[str]]] = {}

    @property
    def requests(self) -> list[TextRequest]:
        """The engine requests of the calls so far, in order."""
        return [c.args[1] for c in self.calls if c.method in ("generate", "complete")]

    def completion_tokens(self, max_tokens: int | None = None) -> int:
        """What one choice of the reply counts (cut at `max_tokens`)."""
        words = len(_words(self.reply))
        return min(words, max_tokens) if max_tokens else words

    def cached_tokens(self, model_id: str, prompt: list[str], salt: str | None = None) -> int:
        """What the prefix cache serves of `prompt` under `salt`, which it then holds too."""
        seen = self._prompts_seen.setdefault((model_id, salt), [])
        shared = max((_common_prefix(prompt, earlier) for earlier in seen), default=0)
        seen.append(prompt)
        return min(shared, len(prompt) - 1)

    def _chunks(self, request: TextRequest, model_id: str = "") -> list[TextEvent]:
        assert isinstance(request, TextRequest), request
        n = request.sampling.n
        words = _words(self.reply)
        limit = request.sampling.max_tokens
        finish = "stop"
        if limit is not None and len(words) > limit:
            words, finish = words[:limit], "length"
        size = max(1, -(-len(words) // self.pieces))
        groups = [words[i:i + size] for i in range(0, len(words), size)] or [[]]
        prompt_list = prompt_token_list(request.messages)
        prompt = len(prompt_list)
        cached = self.cached_tokens(model_id, prompt_list, request.cache_salt)
        chunks: list[TextEvent] = []
        for index in range(n):
            for g, group in enumerate(groups):
                chunks.append(Chunk(
                    index=index, text="".join(group), tokens=len(group),
                    finish_reason=finish if g == len(groups) - 1 else None,
                    # the real engine puts the prompt's count on the first chunk
                    prompt_tokens=prompt if not chunks else None,
                    cached_tokens=cached if not chunks else None))
        chunks.append(Usage(prompt_tokens=prompt,
                            completion_tokens=n * sum(len(g) for g in groups),
                            cached_tokens=cached))
        return chunks

    async def _generate(self, model_id: str, request: TextRequest
                        ) -> AsyncIterator[list[TextEvent]]:
        for chunk in self._chunks(request, model_id):
            await asyncio.sleep(0)
            yield [chunk]  # the real deployment yields lists (deployments/streaming.py)

    async def _complete(self, model_id: str, request: TextRequest) -> list[TextEvent]:
        return _merge(self._chunks(request, model_id))

    async def _stats(self) -> dict[str, dict[str, Any]]:
        return {}

    def _reported_answer(self, method: str, error: EngineError) -> Any:
        return [error] if method == "complete" else error


def _merge(events: list[TextEvent]) -> list[TextEvent]:
    """Consecutive chunks of one choice as one (what `complete` answers)."""
    out: list[TextEvent] = []
    position_of: dict[int, int] = {}
    for event in events:
        if not isinstance(event, Chunk):
            out.append(event)
            continue
        position = position_of.get(event.index)
        if position is None:
            position_of[event.index] = len(out)
            out.append(event)
            continue
        current = out[position]
        assert isinstance(current, Chunk)
        out[position] = Chunk(index=current.index, text=current.text + event.text,
                              tokens=current.tokens + event.tokens,
                              finish_reason=event.finish_reason,
                              prompt_tokens=current.prompt_tokens,
                              cached_tokens=current.cached_tokens)
    return out


def _common_prefix(a: list[str], b: list[str]) -> int:
    n = 0
    for x, y in zip(a, b, strict=False):
        if x != y:
            break
        n += 1
    return n


# ---- embeddings --------------------------------------------------------------------------

class FakeEmbeddingDeployment(FakeDeployment):
    """The embedding deployment (deployments/embedding.py): `embed(model_id, texts, owners)`
    answers
    unit vectors of the model's dimensions, the same for the same text, and each input's
    tokens (one per word, plus the two special tokens)."""

    METHODS = ("embed", "dimensions")

    def __init__(self, deployment_name: str = "embedding", models: list[str] | None = None, *,
                 dimensions: dict[str, int] | int = 384, max_seq_length: int = 256) -> None:
        super().__init__(deployment_name, models)
        self._dimensions = dimensions
        self.max_seq_length = max_seq_length

    def dimensions_of(self, model_id: str) -> int:
        d = self._dimensions
        return d if isinstance(d, int) else d[model_id]

    @staticmethod
    def tokens_of(text: str) -> int:
        return len(_words(text)) + 2

    def vector(self, model_id: str, text: str) -> np.ndarray:
        seed = int.from_bytes(hashlib.sha256(f"{model_id}\0{text}".encode()).digest()[:8],
                              "big")
        v = np.random.default_rng(seed).standard_normal(self.dimensions_of(model_id))
        return (v / np.linalg.norm(v)).astype(np.float32)

    async def _embed(self, model_id: str, texts: list[str],
                     owners: list[tuple[Tenant, int]] | None = None) -> Embeddings:
        return Embeddings(vectors=np.stack([self.vector(model_id, t) for t in texts]),
                          tokens=[self.tokens_of(t) for t in texts],
                          max_seq_length=self.max_seq_length, replica_ms=1.0)

    async def _dimensions(self, model_id: str) -> int:
        return self.dimensions_of(model_id)


# ---- images ------------------------------------------------------------------------------

_PIL_FORMATS = {"png": "PNG", "jpeg": "JPEG", "jpg": "JPEG", "webp": "WEBP"}


def encode_image(image: Image.Image, fmt: str) -> bytes:
    out = io.BytesIO()
    pil_format = _PIL_FORMATS[fmt.lower()]
    if pil_format == "JPEG" and image.mode != "RGB":
        image = image.convert("RGB")
    image.save(out, format=pil_format)
    return out.getvalue()


class FakeImageDeployment(FakeDeployment):
    """An image deployment (deployments/image.py): `run(model_id, ImageRequest)` answers
    real images made with Pillow in the request's format: the input scaled by `params["scale"]`
    (upscale), the input's size with an alpha channel (no prompt: background removal), or
    `params` width x height (edits and generation), `variants` of them."""

    METHODS = ("run",)
    COLOUR = (40, 120, 200)

    def __init__(self, deployment_name: str = "image-upscale", models: list[str] | None = None,
                 *, blurred: bool = False) -> None:
        super().__init__(deployment_name, models)
        self.blurred = blurred

    def _output_size(self, inputs: list[Image.Image], params: dict[str, Any]
                     ) -> tuple[int, int]:
        if "scale" in params and inputs:
            w, h = inputs[0].size
            return round(w * params["scale"]), round(h * params["scale"])
        if params.get("width") and params.get("height"):
            return int(params["width"]), int(params["height"])
        if inputs:
            return inputs[0].size
        return 64, 64

    async def _run(self, model_id: str, request: ImageRequest) -> ImageResult | EngineError:
        assert isinstance(request, ImageRequest), request
        assert len(request.fields) == len(request.images)
        params, fmt = request.params, request.format
        try:
            inputs = [Image.open(io.BytesIO(data)) for data in request.images]
        except Exception:
            return reported(400, "image could not be read: not a PNG, JPEG or WebP file",
                            code="CORRUPTED_IMAGE", field="image")
        width, height = self._output_size(inputs, params)
        mode = "RGBA" if inputs and "prompt" not in params and "scale" not in params else "RGB"
        colour = (*self.COLOUR, 255) if mode == "RGBA" else self.COLOUR
        made = Image.new(mode, (width, height), colour)
        count = int(params.get("variants") or 1)
        return ImageResult(images=[encode_image(made, fmt) for _ in range(count)], width=width,
                           height=height, blurred=self.blurred, replica_ms=1.0)


# ---- video -------------------------------------------------------------------------------

def encode_mp4(width: int, height: int, frames: int, fps: float) -> bytes:
    """A real H.264 MP4 of `frames` plain frames (sides made even)."""
    import av

    width, height = max(2, width - width % 2), max(2, height - height % 2)
    out = io.BytesIO()
    with av.open(out, mode="w", format="mp4") as container:
        stream = container.add_stream("libx264", rate=Fraction(fps).limit_denominator(1001))
        stream.width, stream.height, stream.pix_fmt = width, height, "yuv420p"
        stream.options = {"preset": "ultrafast"}
        for i in range(frames):
            picture = np.full((height, width, 3), (i * 16) % 256, dtype=np.uint8)
            for packet in stream.encode(av.VideoFrame.from_ndarray(picture, format="rgb24")):
                container.mux(packet)
        for packet in stream.encode():
            container.mux(packet)
    return out.getvalue()


class FakeVideoDeployment(FakeDeployment):
    """A video deployment (deployments/video.py): `generate(model_id, MediaJob)` answers a
    real MP4 of the job's size and length (its params' width, height, seconds, fps), kept
    small: at most `max_side` pixels a side and `max_frames` frames."""

    METHODS = ("generate",)

    def __init__(self, deployment_name: str = "video-generation",
                 models: list[str] | None = None, *, max_side: int = 64,
                 max_frames: int = 8) -> None:
        super().__init__(deployment_name, models)
        self.max_side = max_side
        self.max_frames = max_frames
        self.made: list[bytes] = []

    async def _generate(self, model_id: str, job: MediaJob) -> MediaResult:
        assert isinstance(job, MediaJob), job
        params = job.params
        width, height = int(params.get("width") or 64), int(params.get("height") or 64)
        shrink = max(1.0, max(width, height) / self.max_side)
        fps = float(params.get("fps") or 8)
        frames = max(1, min(self.max_frames, round(float(params.get("seconds") or 1) * fps)))
        media = encode_mp4(round(width / shrink), round(height / shrink), frames, fps)
        self.made.append(media)
        return MediaResult(media=media, media_type="video/mp4", replica_ms=1.0)


# ---- speech ------------------------------------------------------------------------------

class FakeSpeechDeployment(FakeDeployment):
    """A speech deployment (deployments/audio.py): `speak(model_id, SpeechRequest)` streams a
    `SpeechStart`, then one `SpeechPiece` per sentence of the text (`pieces_for`): 16-bit PCM,
    `SAMPLES_PER_CHARACTER` silent samples per character, whatever the format asked, each
    piece with the characters of its sentence. `voices`: the ones it offers (None: any)."""

    METHODS = ("speak",)
    SAMPLE_RATE = 16_000
    SAMPLES_PER_CHARACTER = 40

    def __init__(self, deployment_name: str = "speech", models: list[str] | None = None,
                 *, voices: list[str] | None = None) -> None:
        super().__init__(deployment_name, models)
        self.voices = voices

    @classmethod
    def pieces_for(cls, text: str) -> list[SpeechPiece]:
        return [SpeechPiece(bytes(2 * cls.SAMPLES_PER_CHARACTER * len(sentence)), len(sentence))
                for sentence in re.findall(r".+?(?:[.!?]+\s*|$)", text, re.S) if sentence]

    async def _speak(self, model_id: str, request: SpeechRequest
                     ) -> AsyncIterator[SpeechStart | SpeechPiece | EngineError]:
        assert isinstance(request, SpeechRequest), request
        if self.voices is not None and request.voice not in self.voices:
            yield reported(400, f"voice {request.voice!r} is not offered", field="voice")
            return
        yield SpeechStart(self.SAMPLE_RATE)
        for piece in self.pieces_for(request.text):
            await asyncio.sleep(0)
            yield piece


# ---- a fleet for a catalog ---------------------------------------------------------------

_FAMILY_OF_TYPE: dict[str, type[FakeDeployment]] = {
    "text": FakeTextDeployment,
    "embedding": FakeEmbeddingDeployment,
    "image": FakeImageDeployment,
    "upscale": FakeImageDeployment,
    "inpaint": FakeImageDeployment,
    "video": FakeVideoDeployment,
}


def fake_deployments(catalog: Any) -> dict[str, FakeDeployment]:
    """One fake per deployment of `catalog` (a serve_app.models.catalog.Catalog) whose models are
    text, embedding, image or video models, by deployment name; each holds the catalog's
    models of its deployment (embeddings with their catalog dimensions). Deployments of other
    families (speech, music) are left out: their models are offline."""
    by_deployment: dict[str, list[Any]] = {}
    for model in catalog.models:
        by_deployment.setdefault(model.deployment, []).append(model)
    fakes: dict[str, FakeDeployment] = {}
    for name, models in by_deployment.items():
        families = {_FAMILY_OF_TYPE.get(m.type) for m in models}
        if len(families) != 1 or None in families:
            continue
        family = families.pop()
        assert family is not None
        ids = [m.id for m in models]
        if family is FakeEmbeddingDeployment:
            fakes[name] = FakeEmbeddingDeployment(
                name, ids, dimensions={m.id: m.dimensions or 384 for m in models})
        else:
            fakes[name] = family(name, ids)
    return fakes
