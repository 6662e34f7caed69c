"""The contract between the Gateway and the model deployments: everything that crosses Ray.

Both sides import this module and nothing else of each other (the Gateway also uses
`deployments.streaming`). Values are frozen dataclasses with slots: plain, cheap to pickle,
compared by value. A deployment method takes the model id and one request object, and answers
a result object, or an `EngineError` (the engine's own report of a failure, a value, so that it
crosses Ray intact); the Gateway turns an `EngineError` into the spec's error body.

Calls (deployment method: arguments -> answer):

    text          generate(model_id, TextRequest) -> stream of lists of TextEvent
                  complete(model_id, TextRequest) -> list[TextEvent] (merged per choice)
    embedding     embed(model_id, texts: list[str], owners) -> Embeddings | EngineError
    image-*       run(model_id, ImageRequest) -> ImageResult | EngineError
    speech        speak(model_id, SpeechRequest) -> stream: SpeechStart | EngineError first,
                                                    then SpeechPiece, an EngineError on failure
                  synthesize(model_id, MediaJob) -> MediaResult | EngineError (queued)
    transcription transcribe(model_id, TranscriptionRequest) -> Transcription | EngineError
    video-*       generate(model_id, MediaJob) -> MediaResult | EngineError (queued)

The Protocols at the end name these calls per family, for the Gateway's typed handles.

This module imports nothing of serve_app and nothing heavy (numpy only for type checking).
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    import numpy as np

# A message of a conversation as the chat template reads it: {"role", "content", ...}.
Message = dict[str, Any]


# ---- errors ------------------------------------------------------------------------------

@dataclass(frozen=True, slots=True)
class EngineError:
    """An engine's report of a failure: the HTTP status, the message, the spec's error code
    (None: INVALID_REQUEST for a 400, INFERENCE_FAILED otherwise) and the request field at
    fault (a 400's details)."""

    status: int
    message: str
    code: str | None = None
    field: str | None = None
    retry_after: float | None = None  # seconds, for a 503 at capacity (`Retry-After`)


def at_capacity(model_id: str, retry_after: float) -> EngineError:
    """The answer of a deployment whose engine would make the request wait too long for its
    turn (deployments/fair_share.py): a 503 to retry after `retry_after` seconds."""
    return EngineError(503, f"Model {model_id} is at capacity; try again in "
                            f"{retry_after:.0f} s", code="MODEL_AT_CAPACITY",
                       retry_after=retry_after)


def not_served(model_id: str) -> EngineError:
    """The answer of a deployment for a model it does not hold (a 404)."""
    return EngineError(404, f"Model {model_id!r} is not served here", code="MODEL_NOT_FOUND")


# ---- who asks -----------------------------------------------------------------------------

@dataclass(frozen=True, slots=True)
class Tenant:
    """Whose request it is, for the engine's fair share (deployments/fair_share.py): an opaque
    id the same for every request of one account (a hash, never the account's id) and the
    account's share weight (its rate-limit tier's; 1 by default)."""

    id: str
    weight: float = 1.0
    tier: str = "default"  # the tier's name: a label of the gate's metrics, never an identity


# Whose request it is when the platform itself asks (or a caller sent no tenant).
PLATFORM_TENANT = Tenant("platform", tier="platform")


# ---- text --------------------------------------------------------------------------------

@dataclass(frozen=True, slots=True)
class Sampling:
    """How to sample: None leaves a parameter to the engine's default. `max_tokens` None: as
    many as the context leaves. `top_p` 0 keeps only the likeliest token and
    `repetition_penalty` 0 means none: an engine that refuses either maps it. `reasoning_effort`
    is set only for a model that reasons ("none": no thinking)."""

    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None
    min_p: float | None = None
    presence_penalty: float | None = None
    frequency_penalty: float | None = None
    repetition_penalty: float | None = None
    seed: int | None = None
    stop: tuple[str, ...] = ()
    stop_token_ids: tuple[int, ...] = ()
    max_tokens: int | None = None
    n: int = 1
    logprobs: bool = False
    top_logprobs: int | None = None
    reasoning_effort: str | None = None


@dataclass(frozen=True, slots=True)
class ChatImage:
    """An image of a chat, for a vision model: the encoded file (PNG, JPEG or WebP, under
    25 MB), checked by the Gateway from its header (format, mode, pixels) before anything
    decodes it; width and height as displayed (EXIF orientation applied)."""

    data: bytes = field(repr=False)
    width: int
    height: int


@dataclass(frozen=True, slots=True)
class ChatVideo:
    """A video of a chat: the file (MP4, MOV or WebM, under 25 MB) the Gateway probed (its
    length, size and frame rate within bounds). The engine reads `frames` frames spread
    evenly over its `seconds`."""

    data: bytes = field(repr=False)
    seconds: float
    width: int
    height: int
    frames: int


@dataclass(frozen=True, slots=True)
class TextRequest:
    """One chat generation: the composed conversation, sampling, and output constraints.
    `prompt_cache_key` makes requests of one conversation prefer one replica
    (deployments/routing.py); `cache_salt` (the account's, hashed) keeps the engine's prefix
    cache apart per account: a prompt only reads prefixes cached under the same salt.

    A vision model's conversation may hold `{"type": "image"}` and `{"type": "video"}` parts
    among its text parts (content as a list); the n-th of each is `images[n]` / `videos[n]`."""

    request_id: str
    messages: list[Message]
    sampling: Sampling = field(default_factory=Sampling)
    json_schema: dict[str, Any] | None = None
    chat_template_kwargs: dict[str, Any] = field(default_factory=dict)
    tools: list[dict[str, Any]] | None = None
    # With `tools`, for an engine that takes them as they came: "auto", "required", "none"
    # or the named function ({"type": "function", "function": {"name": ...}}).
    tool_choice: str | dict[str, Any] | None = None
    prompt_cache_key: str | None = None
    cache_salt: str | None = None
    images: tuple[ChatImage, ...] = ()
    videos: tuple[ChatVideo, ...] = ()
    tenant: Tenant | None = None
    # The W3C trace context of the Gateway's span that makes the call, when the request is
    # traced: the replica's spans join its trace (deployments/tracing.py).
    traceparent: str | None = None


@dataclass(frozen=True, slots=True)
class Chunk:
    """One choice advanced by `tokens` tokens of `text`. The first chunk of a stream carries
    the prompt's token count and how many of them the engine's prefix cache served (billed
    even if the client leaves mid-stream); the last of a choice its `finish_reason`.
    `logprobs`: one entry per token, when asked for."""

    index: int
    text: str
    tokens: int = 0
    finish_reason: str | None = None
    logprobs: list[dict[str, Any]] | None = None
    prompt_tokens: int | None = None
    cached_tokens: int | None = None
    # On the first chunk of an answer: how long the request waited for its turn at the
    # replica's fair-share gate (milliseconds), for the Gateway's access log.
    gate_wait_ms: float | None = None


@dataclass(frozen=True, slots=True)
class Usage:
    """The engine's final count of a generation: the last item of its stream.
    `cached_tokens`: the prompt's tokens served from the prefix cache (at most
    `prompt_tokens`), billed at the model's cache-read price."""

    prompt_tokens: int
    completion_tokens: int
    cached_tokens: int = 0


# What a text engine yields: chunks, then its usage; or an error instead of anything else.
TextEvent = Chunk | Usage | EngineError


# ---- embeddings --------------------------------------------------------------------------

# The most tokens one embeddings input may have: the replica encodes no input over it (its
# token count comes back, and the Gateway refuses the request: nothing is charged).
MAX_INPUT_TOKENS = 8192

@dataclass(frozen=True, slots=True)
class Embeddings:
    """Unit vectors of the texts of one call, each input's whole token count (the model read
    at most `max_seq_length` of them), the replica's time on the call, and of it the forward
    pass that carried the call (shared with the other calls of its batch)."""

    vectors: np.ndarray  # (texts, dimensions), float32
    tokens: list[int]
    max_seq_length: int
    replica_ms: float
    engine_ms: float = 0.0


# ---- images ------------------------------------------------------------------------------

@dataclass(frozen=True, slots=True)
class ImageRequest:
    """Encoded input images (each with the request field it came from, for errors), the
    engine family's parameters (scale, creativity, prompt, width, height, seed, steps, ...),
    and the output format (png, jpeg, webp)."""

    images: list[bytes]
    fields: list[str]
    params: dict[str, Any]
    format: str
    tenant: Tenant | None = None


@dataclass(frozen=True, slots=True)
class ImageResult:
    images: list[bytes]  # encoded in the request's format
    width: int
    height: int
    blurred: bool  # safe mode blurred at least one output
    replica_ms: float


# ---- audio -------------------------------------------------------------------------------

@dataclass(frozen=True, slots=True)
class SpeechRequest:
    text: str
    voice: str
    speed: float
    format: str  # mp3, opus, aac, flac, wav, pcm
    tenant: Tenant | None = None


@dataclass(frozen=True, slots=True)
class SpeechStart:
    """The first item of a speech stream: the voice is loaded; audio pieces (bytes) follow."""

    sample_rate: int


@dataclass(frozen=True, slots=True)
class SpeechPiece:
    """Encoded audio of a speech stream and the input characters it covers (a stream's pieces
    add up to the whole text): a client that leaves early pays for what it was sent."""

    audio: bytes
    characters: int


@dataclass(frozen=True, slots=True)
class TranscriptionRequest:
    """`demuxer`: the container format the Gateway judged the bytes to be (FFmpeg opens them
    as that, guessing nothing); `max_seconds`: the most audio the caller was billed for (the
    engine decodes no further)."""

    audio: bytes
    language: str | None
    timestamps: bool
    tenant: Tenant | None = None
    demuxer: str | None = None
    max_seconds: float | None = None


@dataclass(frozen=True, slots=True)
class Transcription:
    """Times in seconds; `words` only when timestamps were asked for."""

    text: str
    duration: float
    language: str | None
    segments: list[dict[str, Any]]  # {"text", "start", "end"}
    words: list[dict[str, Any]] | None
    replica_ms: float


# ---- queued media jobs -------------------------------------------------------------------

@dataclass(frozen=True, slots=True)
class MediaJob:
    """A queued job (video, queued speech): its parameters as stored in the job table, its
    input files by name, and the tenant of the account that queued it."""

    params: dict[str, Any]
    inputs: dict[str, bytes] = field(default_factory=dict)
    tenant: Tenant | None = None  # whose job it is, at the engine's fair-share gate


@dataclass(frozen=True, slots=True)
class MediaResult:
    media: bytes
    media_type: str
    replica_ms: float


# ---- the calls, per deployment family ------------------------------------------------------
# What the Gateway may call on each family's deployment: its handle is typed with these
# (serve_app/models/router.py), and a test holds every deployment class and every fake of
# tests/fakes to them (tests/unit/deployments/test_protocols.py).


class TextServer(Protocol):
    """text-* deployments (deployments/text.py)."""

    def generate(self, model_id: str, request: TextRequest
                 ) -> AsyncIterator[list[TextEvent] | TextEvent]: ...

    async def complete(self, model_id: str, request: TextRequest) -> list[TextEvent]: ...


class EmbeddingServer(Protocol):
    """The embedding deployment (deployments/embedding.py)."""

    async def embed(self, model_id: str, texts: list[str],
                    owners: Sequence[tuple[Tenant, int]] = ()) -> Embeddings | EngineError: ...


class ImageServer(Protocol):
    """image-* deployments (deployments/image.py)."""

    async def run(self, model_id: str, request: ImageRequest) -> ImageResult | EngineError: ...


class SpeechServer(Protocol):
    """The speech deployment (deployments/audio.py)."""

    def speak(self, model_id: str, request: SpeechRequest
              ) -> AsyncIterator[SpeechStart | SpeechPiece | EngineError]: ...

    async def synthesize(self, model_id: str, job: MediaJob) -> MediaResult | EngineError: ...


class TranscriptionServer(Protocol):
    """The transcription deployment (deployments/audio.py)."""

    async def transcribe(self, model_id: str, request: TranscriptionRequest
                         ) -> Transcription | EngineError: ...


class JobServer(Protocol):
    """video-* deployments (deployments/video.py): one queued job a call."""

    async def generate(self, model_id: str, job: MediaJob) -> MediaResult | EngineError: ...
