"""The model deployments by name, and the one way to bind one.

`MODEL_DEPLOYMENTS` maps a deployment name of the catalog (text-xs, embedding, image-upscale,
speech, video-generation, ...) to its deployment class; `bind(name, models, settings)` binds
that class under the name, with the Serve options of configs/deployments.yaml and the GPUs its
models' engines run on (deployments/spec.py, `replica_options`), for the catalog models it
serves. A Serve config file's `deployments:` section overrides those options.

Until a class has an entry here, its catalog models are listed with `offline: true` and
requests for them answer 503 `MODEL_OFFLINE`.
"""

from __future__ import annotations

import copy
from functools import cache
from pathlib import Path
from typing import Any

import yaml
from ray.serve.deployment import Application, Deployment

from deployments.audio import SpeechDeployment, TranscriptionDeployment
from deployments.embedding import EmbeddingDeployment
from deployments.image import ImageDeployment
from deployments.spec import ServedModel, model_specs, replica_options
from deployments.text import TextDeployment
from deployments.video import VideoDeployment

OPTIONS_FILE = Path(__file__).resolve().parent.parent / "configs" / "deployments.yaml"

TEXT_DEPLOYMENTS = ("text-xs", "text-s", "text-m", "text-l")
# Image deployments, one per engine family: upscaling, background removal (matting), and
# diffusion pipelines (edit and generation).
IMAGE_DEPLOYMENTS = ("image-upscale", "image-matting", "image-diffusion")
AUDIO_DEPLOYMENTS = ("speech", "transcription")
# Video, one per engine family: generation (Wan) and enhancement of a source clip.
VIDEO_DEPLOYMENTS = ("video-generation", "video-enhance")

MODEL_DEPLOYMENTS: dict[str, Deployment] = {
    "embedding": EmbeddingDeployment,
    **dict.fromkeys(TEXT_DEPLOYMENTS, TextDeployment),
    **dict.fromkeys(IMAGE_DEPLOYMENTS, ImageDeployment),
    "speech": SpeechDeployment,
    "transcription": TranscriptionDeployment,
    **dict.fromkeys(VIDEO_DEPLOYMENTS, VideoDeployment),
}


@cache
def _options_file() -> dict[str, Any]:
    return yaml.safe_load(OPTIONS_FILE.read_text(encoding="utf-8"))


def deployment_options(name: str) -> dict[str, Any]:
    """The Serve options of the model deployment `name` (configs/deployments.yaml)."""
    return copy.deepcopy(_options_file()["deployments"][name])


def vllm_cpu_env() -> dict[str, str]:
    """The environment of vLLM's CPU build (configs/deployments.yaml, `vllm-cpu-env`)."""
    return dict(_options_file()["vllm-cpu-env"])


def bind(name: str, models: list[ServedModel], settings: dict[str, Any]) -> Application:
    """The deployment `name` bound for `models` (the catalog models it serves); `settings` are
    the platform's settings as plain data (`data_dir` fills the models' weights specs)."""
    deployment = MODEL_DEPLOYMENTS[name]
    options = replica_options(deployment_options(name), models)
    return deployment.options(name=name, **options).bind(model_specs(models, settings))
