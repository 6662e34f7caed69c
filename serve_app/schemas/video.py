"""Video request bodies: the spec's quote and queue, and the published retrieve and complete.

Media fields hold what the client sent (a data URL or an http(s) URL); the service fetches
them through the private-address guard. Which fields a model uses depends on what it does
(its catalog `operation`); the others are refused where they would change the result.
"""

from __future__ import annotations

from itertools import pairwise
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

Duration = Literal[
    "1s", "2s", "3s", "4s", "5s", "6s", "7s", "8s", "9s", "10s", "11s", "12s", "13s", "14s",
    "15s", "16s", "17s", "18s", "19s", "20s", "21s", "22s", "23s", "24s", "25s", "26s", "27s",
    "28s", "29s", "30s", "-1", "1 gen", "auto", "Auto"]
AspectRatio = Literal["1:1", "2:3", "3:2", "3:4", "4:3", "4:5", "5:4", "9:16", "9:21", "16:9",
                      "21:9", "adaptive", "auto"]
Resolution = Literal["256p", "360p", "480p", "540p", "580p", "720p", "1080p", "1440p", "2160p",
                     "2k", "4k", "1x", "2x", "4x", "2K", "480P", "768P", "1080P", "true_1080p"]
MAX_PROMPT_CHARS = 20000


class _VideoBody(BaseModel):
    model_config = ConfigDict(extra="ignore")

    @field_validator("duration", mode="before", check_fields=False)
    @classmethod
    def _duration_text(cls, value: Any) -> Any:
        # `-1` sent as a number, as some clients do
        return str(value) if isinstance(value, int) and not isinstance(value, bool) else value


class _Pricing(_VideoBody):
    model: str = Field(min_length=1)
    duration: Duration
    aspect_ratio: AspectRatio | None = None
    resolution: Resolution | None = None
    upscale_factor: Literal[1, 2, 4] | None = None
    enhancement_model: str | None = Field(default=None, min_length=1, max_length=128)
    target_fps: int | None = Field(default=None, ge=16, le=120)
    slowdown_factor: Literal[1, 2, 4, 8] | None = None
    audio: bool | None = None
    video_url: str | None = None


class QuoteVideoRequest(_Pricing):
    reference_video_total_duration: float | None = Field(default=None, ge=0, le=150)


# `camera_trajectory`, as the reference checks it: 2 to 12 keyframes at strictly increasing
# times in [0, 1] (fractions of the clip), each elevation -90 to 90 degrees, each distance
# positive (1: unchanged), the azimuth (signed degrees) travelling at most 32 turns in all;
# it needs the `image_url` it moves the camera around (serve_app/video/serving.py).
CAMERA_KEYFRAMES = (2, 12)
MAX_AZIMUTH_TRAVEL_DEGREES = 32 * 360


class CameraKeyframe(BaseModel):
    time: float = Field(ge=0, le=1, allow_inf_nan=False)
    azimuth: float = Field(allow_inf_nan=False)
    elevation: float = Field(ge=-90, le=90, allow_inf_nan=False)
    distance: float = Field(gt=0, allow_inf_nan=False)


class Element(BaseModel):
    frontal_image_url: str | None = None
    reference_image_urls: list[str] = Field(default_factory=list, max_length=3)
    video_url: str | None = None


class Keyframe(BaseModel):
    image_url: str
    frame_index: int = Field(ge=0)


class SeedanceConsent(BaseModel):
    confirmed_terms_and_privacy: Literal[True]
    confirmed_legal_right: Literal[True]
    confirmed_screening_acknowledged: Literal[True]


class QueueVideoRequest(_Pricing):
    prompt: str = Field(min_length=1, max_length=MAX_PROMPT_CHARS)
    negative_prompt: str | None = Field(default=None, max_length=MAX_PROMPT_CHARS)
    consents: dict[str, Any] | None = None
    omni_reference_task_type: Literal["auto", "reference", "edit", "extend", "editing",
                                      "extension"] | None = None
    softness: float | None = None
    creativity: float | None = None
    realism: float | None = None
    sharp: float | None = None
    compression: float | None = None
    noise: float | None = None
    halo: float | None = None
    grain: float | None = None
    recover_detail: float | None = None
    h264_output: bool | None = None
    output_format: Literal["mp4"] | None = None
    camera_trajectory: list[CameraKeyframe] | None = Field(
        default=None, min_length=CAMERA_KEYFRAMES[0], max_length=CAMERA_KEYFRAMES[1])
    image_url: str | None = None
    end_image_url: str | None = None
    audio_url: str | None = None
    reference_image_urls: list[str] | None = Field(default=None, max_length=30)
    reference_video_urls: list[str] | None = Field(default=None, max_length=10)
    reference_audio_urls: list[str] | None = Field(default=None, max_length=10)
    reference_document_urls: list[str] | None = Field(default=None, max_length=1)
    scene_image_urls: list[str] | None = Field(default=None, max_length=4)
    elements: list[Element] | None = Field(default=None, max_length=4)
    keyframes: list[Keyframe] | None = Field(default=None, max_length=10)
    callback_url: str | None = Field(default=None, min_length=1, max_length=2048, description=(
        "Where the signed job event is POSTed once the job ends (docs: Completion webhooks)"))

    @field_validator("camera_trajectory")
    @classmethod
    def _camera_path(cls, path: list[CameraKeyframe] | None) -> list[CameraKeyframe] | None:
        if path is None:
            return None
        if any(later.time <= earlier.time for earlier, later in pairwise(path)):
            raise ValueError("keyframe times must be strictly increasing")
        travel = sum(abs(later.azimuth - earlier.azimuth)
                     for earlier, later in pairwise(path))
        if travel > MAX_AZIMUTH_TRAVEL_DEGREES:
            raise ValueError(f"the azimuth travels {travel:g} degrees in all; at most "
                             f"{MAX_AZIMUTH_TRAVEL_DEGREES} (32 turns)")
        return path


class JobRequest(BaseModel):
    """`/video/retrieve`, `/video/complete` and their audio twins."""

    model_config = ConfigDict(extra="ignore")

    model: str = Field(min_length=1)
    queue_id: str = Field(min_length=1, max_length=64)


class RetrieveRequest(JobRequest):
    delete_media_on_completion: bool = False
