"""`POST /embeddings` request."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

MAX_ITEMS = 2048


class EmbeddingRequest(BaseModel):
    model_config = ConfigDict(extra="allow")

    input: str | list[str]
    model: str = Field(min_length=1)
    dimensions: int | None = Field(default=None, ge=1)
    encoding_format: Literal["float", "base64"] = "float"
    user: str | None = None  # accepted and discarded

    @field_validator("input", mode="before")
    @classmethod
    def _no_token_arrays(cls, value: object) -> object:
        if isinstance(value, list) and any(isinstance(v, int | list) for v in value):
            raise ValueError("token arrays are not accepted: send text")
        return value

    @field_validator("input")
    @classmethod
    def _not_empty(cls, value: str | list[str]) -> str | list[str]:
        items = [value] if isinstance(value, str) else value
        if not items:
            raise ValueError("input must not be empty")
        if len(items) > MAX_ITEMS:
            raise ValueError(f"at most {MAX_ITEMS} inputs per request")
        if any(not item for item in items):
            raise ValueError("inputs must not be empty strings")
        return value

    @property
    def texts(self) -> list[str]:
        return [self.input] if isinstance(self.input, str) else list(self.input)
