"""Diffusion image engines (diffusers pipelines on local weights): edits with an instruction
model (InstructPix2Pix layout) and text-to-image generation. Same interface as the other image
engines (engines/image.py): `run(images, params)` returns output images."""

from __future__ import annotations

import logging
import secrets
import threading
from typing import TYPE_CHECKING, Any

import numpy as np
from PIL import Image, ImageFilter

from deployments.engines.stop import StopSignal, check

if TYPE_CHECKING:
    import torch

logger = logging.getLogger("deployments.engines.diffusion")


# --------------------------------------------------------------------------------------------
# Diffusion: diffusers pipelines from a folder


def _between_steps(stop: StopSignal | None) -> Any:
    """The pipeline's `callback_on_step_end`: raises Stopped after the step once `stop` is
    set (None: no callback)."""
    if stop is None:
        return None

    def after_step(pipeline: Any, step: int, timestep: Any, tensors: dict) -> dict:
        check(stop)
        return tensors

    return after_step


class _DiffusersEngine:
    """Shared by the diffusers engines: loading, seeding, the safety check and its blur.

    The pipeline loads from a local folder (`from_pretrained(path, local_files_only=True)`), the
    layout real Stable Diffusion / InstructPix2Pix folders have, in float32 on the CPU unless
    options say otherwise. options: `device` (cpu), `dtype` (float32; float16 on a GPU),
    `threads` (torch's intra-op threads, default 1: a replica gets a fraction of a CPU),
    `max_pixels` (the largest output, default 2048x2048: larger is refused, not attempted).

    Safe mode: when the folder has a `safety_checker` component, it runs on the outputs of a
    request with `safe_mode` true (not through the pipeline, which would black them out); a
    flagged image is returned blurred (Gaussian, radius 5% of its shorter side). Every output
    carries `.info["blurred"]` (bool) and `.info["seed"]` (the seed used).
    """

    pipeline_class_name = ""

    def __init__(self, weights: str | None, options: dict[str, Any] | None = None) -> None:
        import diffusers
        import torch

        options = options or {}
        if not weights:
            raise ValueError(f"{type(self).__name__} needs `weights`: a diffusers folder")
        torch.set_num_threads(int(options.get("threads", 1)))
        self.device = str(options.get("device", "cpu"))
        self.dtype = getattr(torch, str(options.get("dtype", "float32")))
        pipeline_class = getattr(diffusers, self.pipeline_class_name)
        pipeline = pipeline_class.from_pretrained(weights, local_files_only=True,
                                                  dtype=self.dtype)
        # The safety check runs here instead (blur, not black), only when asked for.
        self.safety_checker = getattr(pipeline, "safety_checker", None)
        self.feature_extractor = getattr(pipeline, "feature_extractor", None)
        if self.safety_checker is not None:
            pipeline.safety_checker = None
            self.safety_checker.to(self.device).eval()
        pipeline.set_progress_bar_config(disable=True)
        self.pipeline = pipeline.to(self.device)
        self.path = weights
        self.max_pixels = int(options.get("max_pixels", 2048 * 2048))
        # A pipeline call changes its scheduler's state: one call at a time.
        self._lock = threading.Lock()

    def _size(self, params: dict[str, Any]) -> tuple[int, int]:
        width, height = int(params["width"]), int(params["height"])
        if width <= 0 or height <= 0 or width % 8 or height % 8:
            raise ValueError(f"width and height must be positive multiples of 8, "
                             f"not {width}x{height}")
        if width * height > self.max_pixels:
            raise ValueError(f"{width}x{height} is more than this model makes "
                             f"({self.max_pixels} pixels)")
        return width, height

    @staticmethod
    def _generator(seed: Any) -> tuple[torch.Generator, int]:
        """A CPU generator, so a seed gives the same picture on any device."""
        import torch

        seed = secrets.randbits(63) if seed is None else int(seed)
        return torch.Generator("cpu").manual_seed(seed), seed

    def flagged(self, images: list[Image.Image]) -> list[bool]:
        """The safety checker's verdict per image (all False when the folder has none)."""
        import torch

        if self.safety_checker is None or self.feature_extractor is None:
            return [False] * len(images)
        clip_input = self.feature_extractor(images, return_tensors="pt").pixel_values
        clip_input = clip_input.to(self.device, self.dtype)
        with torch.inference_mode():
            # forward_onnx: the same scores and thresholds as forward, without blacking out
            # images or logging that it did
            _, flags = self.safety_checker.forward_onnx(
                clip_input=clip_input, images=torch.zeros(len(images), 1))
        return [bool(flag) for flag in flags]

    def finish(self, images: list[Image.Image], safe_mode: bool, seed: int) -> list[Image.Image]:
        flags = self.flagged(images) if safe_mode else [False] * len(images)
        out = []
        for image, flag in zip(images, flags, strict=True):
            if flag:
                image = image.filter(ImageFilter.GaussianBlur(radius=0.05 * min(image.size)))
            image.info["blurred"] = flag
            image.info["seed"] = seed
            out.append(image)
        return out


class DiffusersEditEngine(_DiffusersEngine):
    """Instruction-based image editing with diffusers' StableDiffusionInstructPix2PixPipeline.

    params: `prompt`, `width`, `height` (the output size, multiples of 8), `steps`,
    `guidance_scale` (text), `image_guidance_scale`, `seed` (int or None), `safe_mode` (bool).

    images[0] is the base image, resized to width x height. images[1:] are edit layers, each
    resized to that size:
    - an RGBA layer with any transparency (or an opaque colour RGBA) is an overlay,
      alpha-composited over the base, in order, before editing;
    - an 'L'-mode or grey (R = G = B) layer is a mask: after editing, output = the (composited)
      base where the mask is black, the edit where it is white, a blend in between. Several
      masks add up (their maximum). Grey means channels within a few levels of each other
      (a JPEG of a grey picture), in RGB or in opaque RGBA.
    Any other layer (an opaque colour RGB image) is refused with ValueError.
    """

    pipeline_class_name = "StableDiffusionInstructPix2PixPipeline"

    def run(self, images: list[Image.Image], params: dict[str, Any],
            stop: StopSignal | None = None) -> list[Image.Image]:
        import torch

        if not images:
            raise ValueError("an edit needs a base image")
        width, height = self._size(params)
        base = images[0].convert("RGB").resize((width, height), Image.Resampling.LANCZOS)
        mask = None
        for index, layer in enumerate(images[1:], start=1):
            layer = layer.resize((width, height), Image.Resampling.LANCZOS)
            kind = _layer_kind(layer)
            if kind == "overlay":
                base = Image.alpha_composite(base.convert("RGBA"), layer.convert("RGBA"))
                base = base.convert("RGB")
            elif kind == "mask":
                grey = np.asarray(layer.convert("L"), dtype=np.float32) / 255.0
                mask = grey if mask is None else np.maximum(mask, grey)
            else:
                raise ValueError(f"edit layer {index} is neither an RGBA overlay nor a "
                                 "greyscale mask")
        generator, seed = self._generator(params.get("seed"))
        with self._lock, torch.inference_mode():
            edited = self.pipeline(
                prompt=str(params.get("prompt") or ""), image=base,
                num_inference_steps=int(params.get("steps", 20)),
                guidance_scale=float(params.get("guidance_scale", 7.5)),
                image_guidance_scale=float(params.get("image_guidance_scale", 1.5)),
                generator=generator, output_type="pil",
                callback_on_step_end=_between_steps(stop)).images[0]
        if edited.size != (width, height):
            edited = edited.resize((width, height), Image.Resampling.LANCZOS)
        if mask is not None:
            weight = mask[:, :, None]
            blended = np.asarray(base, np.float32) * (1.0 - weight) + \
                np.asarray(edited, np.float32) * weight
            edited = Image.fromarray(np.clip(blended + 0.5, 0, 255).astype(np.uint8), "RGB")
        return self.finish([edited], bool(params.get("safe_mode", True)), seed)


GREY_TOLERANCE = 6


def _layer_kind(layer: Image.Image) -> str:
    """'overlay', 'mask' or 'other' (see DiffusersEditEngine)."""
    if layer.mode in ("L", "LA", "1"):
        return "mask"
    pixels = np.asarray(layer)
    if layer.mode == "RGBA" and (pixels[:, :, 3] < 255).any():
        return "overlay"
    rgb = pixels[:, :, :3].astype(np.int16)
    # grey up to JPEG's rounding of the colour channels
    if (rgb.max(axis=2) - rgb.min(axis=2)).max() <= GREY_TOLERANCE:
        return "mask"
    return "overlay" if layer.mode == "RGBA" else "other"


class DiffusersText2ImgEngine(_DiffusersEngine):
    """Text to image with diffusers' StableDiffusionPipeline.

    params: `prompt`, `negative_prompt` (optional), `width`, `height` (multiples of 8),
    `steps`, `cfg_scale`, `seed` (int or None: the same seed gives the same pictures),
    `variants` (1..4 images), `safe_mode` (bool). No input images.
    """

    pipeline_class_name = "StableDiffusionPipeline"

    def run(self, images: list[Image.Image], params: dict[str, Any],
            stop: StopSignal | None = None) -> list[Image.Image]:
        import torch

        if images:
            raise ValueError("text-to-image takes no input image")
        width, height = self._size(params)
        variants = int(params.get("variants", 1))
        if not 1 <= variants <= 4:
            raise ValueError(f"variants must be between 1 and 4, not {variants}")
        generator, seed = self._generator(params.get("seed"))
        with self._lock, torch.inference_mode():
            out = self.pipeline(
                prompt=str(params.get("prompt") or ""),
                negative_prompt=params.get("negative_prompt") or None,
                width=width, height=height,
                num_inference_steps=int(params.get("steps", 20)),
                guidance_scale=float(params.get("cfg_scale", 7.5)),
                num_images_per_prompt=variants, generator=generator, output_type="pil",
                callback_on_step_end=_between_steps(stop)).images
        return self.finish(list(out), bool(params.get("safe_mode", True)), seed)
