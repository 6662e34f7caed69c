"""Ray Serve model deployments, one per class (text-xs, text-s, text-m, text-l, embedding,
image, speech, video). Each wraps an engine behind one interface; `MODEL_DEPLOYMENTS` maps a
deployment name of the catalog to the function that binds it for the models it serves.

The engines arrive with their issues; until a class has an entry here, its catalog models are
listed with `offline: true` and requests for them answer 503 `MODEL_OFFLINE`.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from ray.serve.deployment import Application

from serve_app.catalog import CatalogModel

DeploymentBuilder = Callable[[list[CatalogModel], dict[str, Any]], Application]


def _embedding(models: list[CatalogModel], settings: dict[str, Any]) -> Application:
    from deployments import embedding

    return embedding.bind(models, settings)


def _text(name: str) -> DeploymentBuilder:
    def build(models: list[CatalogModel], settings: dict[str, Any]) -> Application:
        from deployments import text

        return text.bind(name, models, settings)

    return build


def _image(name: str) -> DeploymentBuilder:
    def build(models: list[CatalogModel], settings: dict[str, Any]) -> Application:
        from deployments import image

        return image.bind(name, models, settings)

    return build


def _audio(kind: str) -> Callable[[str], DeploymentBuilder]:
    def named(name: str) -> DeploymentBuilder:
        def build(models: list[CatalogModel], settings: dict[str, Any]) -> Application:
            from deployments import audio

            binder = audio.bind_speech if kind == "speech" else audio.bind_transcription
            return binder(name, models, settings)

        return build

    return named


def _video(name: str) -> DeploymentBuilder:
    def build(models: list[CatalogModel], settings: dict[str, Any]) -> Application:
        from deployments import video

        return video.bind(name, models, settings)

    return build


# Image deployments, one per engine family: upscaling, background removal (matting), and
# diffusion pipelines (edit and generation).
IMAGE_DEPLOYMENTS = ("image-upscale", "image-matting", "image-diffusion")

MODEL_DEPLOYMENTS: dict[str, DeploymentBuilder] = {
    "embedding": _embedding,
    **{name: _text(name) for name in ("text-xs", "text-s", "text-m", "text-l")},
    **{name: _image(name) for name in IMAGE_DEPLOYMENTS},
    "speech": _audio("speech")("speech"),
    "transcription": _audio("transcription")("transcription"),
    # Video, one per engine family: generation (Wan) and enhancement of a source clip.
    **{name: _video(name) for name in ("video-generation", "video-enhance")},
}
AUDIO_DEPLOYMENTS = ("speech", "transcription")
VIDEO_DEPLOYMENTS = ("video-generation", "video-enhance")
