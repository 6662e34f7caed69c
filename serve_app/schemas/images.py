"""Image request bodies: the spec's upscale, background removal and multi-edit, and the
published generation and edit companions (`/image/generate`, `/image/edit`, and the
chat-completion convention's `/images/generations`).

Image fields hold what the client sent (base64, a data URL or a URL); the router turns them
into bytes (serve_app/images/inputs.py). Multipart uploads arrive as bytes beside the body.
Fields the spec does not list are passed through and ignored.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from serve_app.schemas.common import AnonUserId

AspectRatio = Literal["auto", "1:1", "3:2", "16:9", "21:9", "9:16", "2:3", "3:4", "4:3", "4:5"]
OutputFormat = Literal["jpeg", "jpg", "png", "webp"]
Quality = Literal["low", "medium", "high"]

MAX_PROMPT_CHARS = 32768


class _ImageBody(BaseModel):
    model_config = ConfigDict(extra="ignore")


class UpscaleRequest(_ImageBody):
    image: str | None = None  # base64 or data URL (JSON); a file upload arrives beside it
    scale: float = Field(default=2, ge=2, le=4)
    creativity: float | None = 0.01

    @property
    def clamped_creativity(self) -> float:
        """Clamped to 0..0.02 as the spec says (null means the default)."""
        value = 0.01 if self.creativity is None else self.creativity
        return min(max(value, 0.0), 0.02)


class BackgroundRemoveRequest(_ImageBody):
    image: str | None = None  # base64, data URL or image URL
    image_url: str | None = None  # the published form of the URL
    anon_user_id: AnonUserId | None = None


class MultiEditRequest(_ImageBody):
    prompt: str = Field(min_length=1, max_length=MAX_PROMPT_CHARS)
    images: list[str] = Field(default_factory=list)  # JSON; uploads arrive beside the body
    modelId: str | None = Field(default=None, min_length=1)
    model: str | None = Field(default=None, min_length=1)  # accepted like `/image/edit`
    anon_user_id: AnonUserId | None = None
    aspect_ratio: AspectRatio | None = None
    output_format: OutputFormat | None = None
    quality: Quality | None = None
    resolution: str | None = Field(default=None, min_length=1, max_length=10)
    safe_mode: bool = False
    disable_prompt_optimization_thinking: bool | None = None
    enhance_prompt: bool = False

    @property
    def model_name(self) -> str:
        return self.modelId or self.model or "default"


class EditRequest(MultiEditRequest):
    """`POST /image/edit`: one image (`image`) instead of `images`; safe mode on unless
    turned off, as published for this endpoint."""

    image: str | None = None
    images: list[str] = Field(default_factory=list)
    safe_mode: bool = True


class GenerateRequest(_ImageBody):
    """`POST /image/generate`, as published."""

    model: str = Field(default="default", min_length=1)
    prompt: str = Field(min_length=1, max_length=7500)
    negative_prompt: str | None = Field(default=None, max_length=7500)
    width: int = Field(default=1024, gt=0, le=1280)
    height: int = Field(default=1024, gt=0, le=1280)
    format: Literal["jpeg", "png", "webp"] = "webp"
    cfg_scale: float | None = Field(default=None, gt=0, le=20)
    steps: int | None = Field(default=None, ge=1)
    seed: int | None = Field(default=None, ge=-999999999, le=999999999)
    variants: int = Field(default=1, ge=1, le=4)
    safe_mode: bool = True
    style_preset: str | None = None
    return_binary: bool = False
    aspect_ratio: str | None = None
    resolution: str | None = Field(default=None, min_length=1, max_length=10)
    quality: Quality | None = None
    enhance_prompt: bool = False
    disable_prompt_optimization_thinking: bool | None = None
    hide_watermark: bool = False
    embed_exif_metadata: bool = False

    @model_validator(mode="after")
    def _binary_is_one_image(self) -> GenerateRequest:
        if self.return_binary and self.variants > 1:
            raise ValueError("variants is only supported when return_binary is false")
        return self


OPENAI_SIZES = ("auto", "256x256", "512x512", "1024x1024", "1536x1024", "1024x1536",
                "1792x1024", "1024x1792")


class OpenAIImageRequest(_ImageBody):
    """`POST /images/generations` of the chat-completion convention (the `openai` SDK's
    `images.generate`). Fields that do not apply here are accepted and ignored."""

    prompt: str = Field(min_length=1, max_length=1500)
    model: str | None = "default"
    n: int | None = Field(default=1, ge=1, le=1)
    size: str | None = "auto"
    response_format: Literal["b64_json", "url"] | None = "b64_json"
    output_format: Literal["jpeg", "png", "webp"] | None = "png"
    moderation: Literal["low", "auto"] | None = "auto"
    quality: str | None = None
    style: str | None = None
    background: str | None = None
    output_compression: int | None = Field(default=None, ge=0, le=100)
    user: str | None = None

    @field_validator("size")
    @classmethod
    def _known_size(cls, value: str | None) -> str | None:
        if value is not None and value not in OPENAI_SIZES:
            raise ValueError(f"size must be one of {', '.join(OPENAI_SIZES)}")
        return value
