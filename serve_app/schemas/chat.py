"""`POST /chat/completions` request, in the usual chat-completion convention plus
`service_parameters`. Unlisted fields pass through (and are ignored).

Bounds follow the published reference (shared/reference/venice/openapi.yaml): what it accepts
is accepted here, e.g. `max_tokens` of 0 or less (ignored), `top_p: 0`, any
`repetition_penalty` from 0 up, `verbosity: "auto"`, ten fallbacks."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from serve_app.schemas.common import AnonUserId

MAX_N = 8
MAX_STOP = 16
MAX_FALLBACKS = 10  # the reference's maxItems


class _Open(BaseModel):
    model_config = ConfigDict(extra="allow")


class CacheControl(_Open):
    type: str = "ephemeral"


class TextPart(_Open):
    type: Literal["text"]
    text: str
    cache_control: CacheControl | None = None


class ImageUrl(_Open):
    url: str = Field(min_length=1)
    detail: str | None = None


class ImagePart(_Open):
    type: Literal["image_url"]
    image_url: ImageUrl
    cache_control: CacheControl | None = None


class InputAudio(_Open):
    data: str = Field(min_length=1)
    format: str


class AudioPart(_Open):
    type: Literal["input_audio"]
    input_audio: InputAudio


class VideoUrl(_Open):
    url: str = Field(min_length=1)


class VideoPart(_Open):
    type: Literal["video_url"]
    video_url: VideoUrl


class FileData(_Open):
    filename: str | None = None
    file_data: str | None = None  # base64, or a data: URL
    file_id: str | None = None


class FilePart(_Open):
    type: Literal["file"]
    file: FileData


ContentPart = Annotated[TextPart | ImagePart | AudioPart | VideoPart | FilePart,
                        Field(discriminator="type")]


class FunctionCall(_Open):
    name: str
    arguments: str = "{}"


class ToolCall(_Open):
    id: str
    type: Literal["function"] = "function"
    function: FunctionCall


class ChatMessage(_Open):
    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: str | list[ContentPart] | None = None
    name: str | None = None
    tool_calls: list[ToolCall] | None = None
    tool_call_id: str | None = None
    cache_control: CacheControl | None = None

    @model_validator(mode="after")
    def _content_rules(self) -> ChatMessage:
        if self.role in ("system", "developer", "user") and self.content is None:
            raise ValueError(f"{self.role} messages need content")
        if self.role == "tool" and not self.tool_call_id:
            raise ValueError("tool messages need tool_call_id")
        return self

    def text(self) -> str:
        """The text of the message (parts joined); non-text parts are handled before this."""
        if self.content is None:
            return ""
        if isinstance(self.content, str):
            return self.content
        return "\n".join(p.text for p in self.content if isinstance(p, TextPart))


class FunctionDefinition(_Open):
    name: str = Field(min_length=1, max_length=64, pattern=r"^[A-Za-z0-9_-]+$")
    description: str | None = None
    parameters: dict[str, Any] = Field(default_factory=lambda: {"type": "object",
                                                                  "properties": {}})
    strict: bool | None = None


class Tool(_Open):
    type: Literal["function"] = "function"
    function: FunctionDefinition


class NamedFunction(_Open):
    name: str


class ToolChoiceFunction(_Open):
    type: Literal["function"] = "function"
    function: NamedFunction


class JsonSchemaFormat(_Open):
    name: str = "response"
    schema_: dict[str, Any] = Field(default_factory=dict, alias="schema")
    strict: bool | None = None
    description: str | None = None


class ResponseFormat(_Open):
    type: Literal["text", "json_object", "json_schema"]
    json_schema: JsonSchemaFormat | None = None

    @model_validator(mode="after")
    def _schema_given(self) -> ResponseFormat:
        if self.type == "json_schema" and self.json_schema is None:
            raise ValueError("json_schema is required when type is json_schema")
        return self


class StreamOptions(_Open):
    include_usage: bool = False
    # The stream runs to its end whoever reads it, and is kept to be resumed after any event
    # (GET /chat/completions/{id}?stream=true with Last-Event-ID): serve_app/responses/.
    resumable: bool = False


ReasoningEffort = Literal["none", "minimal", "low", "medium", "high", "xhigh", "max"]


Verbosity = Literal["low", "medium", "high", "auto"]


class Reasoning(_Open):
    effort: ReasoningEffort | None = None
    enabled: bool | None = None
    summary: Literal["auto", "concise", "detailed"] | None = None


class TextOptions(_Open):
    verbosity: Verbosity | None = None


class Fallback(_Open):
    model: str = Field(min_length=1)


class ServiceParameters(_Open):
    character_slug: str | None = None
    strip_thinking_response: bool = False
    disable_thinking: bool = False
    enable_e2ee: bool | None = None
    enable_web_search: Literal["off", "on", "auto"] = "off"
    enable_web_scraping: bool = False
    enable_x_search: bool = False
    enable_web_citations: bool = False
    include_search_results_in_stream: bool = False
    return_search_results_as_documents: bool = False
    include_service_system_prompt: bool = True


class ChatCompletionRequest(_Open):
    model: str = Field(min_length=1)
    messages: list[ChatMessage] = Field(min_length=1)

    temperature: float | None = Field(default=None, ge=0, le=2)
    # 0 keeps only the likeliest token (the vLLM engine runs it as top_k 1)
    top_p: float | None = Field(default=None, ge=0, le=1)
    top_k: int | None = Field(default=None, ge=-1)
    min_p: float | None = Field(default=None, ge=0, le=1)
    min_temp: float | None = Field(default=None, ge=0, le=2)
    max_temp: float | None = Field(default=None, ge=0, le=2)
    frequency_penalty: float | None = Field(default=None, ge=-2, le=2)
    presence_penalty: float | None = Field(default=None, ge=-2, le=2)
    # no upper bound in the reference; 0 is taken as no penalty (the engine's 1.0)
    repetition_penalty: float | None = Field(default=None, ge=0, allow_inf_nan=False)
    seed: int | None = None
    stop: str | list[str] | None = None
    stop_token_ids: list[int] | None = None
    max_tokens: int | None = None  # 0 or less: ignored (the model's own limit)
    max_completion_tokens: int | None = None
    n: int = Field(default=1, ge=1, le=MAX_N)
    logprobs: bool = False
    top_logprobs: int | None = Field(default=None, ge=0, le=20)

    stream: bool = False
    stream_options: StreamOptions | None = None

    response_format: ResponseFormat | None = None
    tools: list[Tool] | None = None
    tool_choice: Literal["none", "auto", "required"] | ToolChoiceFunction | None = None
    parallel_tool_calls: bool = True

    reasoning: Reasoning | None = None
    reasoning_effort: ReasoningEffort | None = None
    verbosity: Verbosity | None = None
    text: TextOptions | None = None

    user: str | None = None
    anon_user_id: AnonUserId | None = None
    fallbacks: list[Fallback] | None = Field(default=None, max_length=MAX_FALLBACKS)
    store: bool | None = None
    include: list[str] | None = None
    metadata: dict[str, str] | None = None
    prompt_cache_key: str | None = Field(default=None, max_length=256)
    prompt_cache_retention: str | None = None

    service_parameters: ServiceParameters = Field(default_factory=ServiceParameters)

    @model_validator(mode="before")
    @classmethod
    def _accept_reference_name(cls, data: Any) -> Any:
        """The live reference calls `service_parameters` `venice_parameters`: take both."""
        if isinstance(data, dict) and "venice_parameters" in data \
                and "service_parameters" not in data:
            data = {**data, "service_parameters": data["venice_parameters"]}
        return data

    @field_validator("max_tokens", "max_completion_tokens")
    @classmethod
    def _ignore_non_positive(cls, value: int | None) -> int | None:
        """The reference ignores a limit of 0 or less: the model's own limit applies."""
        return value if value is not None and value > 0 else None

    @model_validator(mode="after")
    def _cross_field_rules(self) -> ChatCompletionRequest:
        stops = [self.stop] if isinstance(self.stop, str) else (self.stop or [])
        if len(stops) > MAX_STOP:
            raise ValueError(f"stop takes at most {MAX_STOP} sequences")
        if self.top_logprobs and not self.logprobs:
            raise ValueError("top_logprobs needs logprobs: true")
        if (self.min_temp is not None and self.max_temp is not None
                and self.min_temp > self.max_temp):
            raise ValueError("min_temp must not exceed max_temp")
        if isinstance(self.tool_choice, ToolChoiceFunction) or self.tool_choice == "required":
            if not self.tools:
                raise ValueError("tool_choice needs tools")
            if isinstance(self.tool_choice, ToolChoiceFunction) and self.tool_choice.function.name \
                    not in {t.function.name for t in self.tools}:
                raise ValueError(f"tool_choice names unknown tool "
                                 f"{self.tool_choice.function.name!r}")
        if self.metadata is not None and len(self.metadata) > 16:
            raise ValueError("metadata takes at most 16 keys")
        return self

    @property
    def stop_list(self) -> list[str]:
        return [self.stop] if isinstance(self.stop, str) else list(self.stop or [])

    @property
    def completion_limit(self) -> int | None:
        return self.max_completion_tokens or self.max_tokens
