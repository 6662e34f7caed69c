"""`POST /responses` request (the newer response-object convention), mapped onto chat."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from serve_app.schemas.chat import MAX_FALLBACKS, Fallback, Reasoning, ServiceParameters
from serve_app.schemas.common import AnonUserId


class _Open(BaseModel):
    model_config = ConfigDict(extra="allow")


class InputPart(_Open):
    type: Literal["input_text", "output_text", "input_image", "input_file"]
    text: str | None = None
    image_url: Any = None
    file_data: str | None = None
    filename: str | None = None


class InputMessage(_Open):
    type: Literal["message"] = "message"
    role: Literal["user", "assistant", "system", "developer"]
    content: str | list[InputPart]


class FunctionCallItem(_Open):
    type: Literal["function_call"]
    call_id: str
    name: str
    arguments: str = "{}"


class FunctionCallOutputItem(_Open):
    type: Literal["function_call_output"]
    call_id: str
    output: str


class FunctionTool(_Open):
    type: Literal["function"] = "function"
    name: str = Field(min_length=1, max_length=64, pattern=r"^[A-Za-z0-9_-]+$")
    description: str | None = None
    parameters: dict[str, Any] = Field(default_factory=lambda: {"type": "object",
                                                                  "properties": {}})


class NamedTool(_Open):
    type: Literal["function"] = "function"
    name: str


class TextFormat(_Open):
    type: Literal["text", "json_object", "json_schema"] = "text"
    name: str = "response"
    schema_: dict[str, Any] | None = Field(default=None, alias="schema")


class TextConfig(_Open):
    format: TextFormat | None = None


class ResponsesRequest(_Open):
    model: str = Field(min_length=1)
    input: str | list[InputMessage | FunctionCallItem | FunctionCallOutputItem]
    instructions: str | None = None
    max_output_tokens: int | None = Field(default=None, ge=1)
    temperature: float | None = Field(default=None, ge=0, le=2)
    top_p: float | None = Field(default=None, ge=0, le=1)
    stream: bool = False
    # Run detached from the connection and keep the response (serve_app/responses/).
    background: bool = False
    tools: list[FunctionTool] | None = None
    tool_choice: Literal["none", "auto", "required"] | NamedTool | None = None
    text: TextConfig | None = None
    reasoning: Reasoning | None = None
    fallbacks: list[Fallback] | None = Field(default=None, max_length=MAX_FALLBACKS)
    include: list[str] | None = None
    metadata: dict[str, str] | None = None
    store: bool | None = None
    user: str | None = None
    anon_user_id: AnonUserId | None = None  # as on chat: the reference accepts it here too
    service_parameters: ServiceParameters | None = None
    venice_parameters: ServiceParameters | None = None  # the reference's name for the same

    @model_validator(mode="after")
    def _not_empty(self) -> ResponsesRequest:
        if isinstance(self.input, list) and not self.input:
            raise ValueError("input must not be empty")
        if self.background and self.store is False:
            raise ValueError("background responses are stored: store must not be false")
        return self
