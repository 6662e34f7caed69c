"""Video engines: generation with the diffusers Wan pipelines, and enhancement of a source
clip (Real-ESRGAN upscaling, optical-flow frame interpolation). Each takes the job's
parameters and input files and returns the frames and their rate; `encode_mp4` makes the file.

- `wan`: a Wan folder (`WanPipeline.save_pretrained` layout: Wan 2.1/2.2 T2V or TI2V, or the
  tiny test weights of deployments/video_weights.py). Text-to-video runs `WanPipeline`;
  image-to-video `WanImageToVideoPipeline` (Wan 2.2 TI2V style: the image conditions the first
  latent frame); reference-to-video `WanVideoToVideoPipeline` on the reference clip. All three
  share the folder's weights in memory.
- `realesrgan-video`: every frame through Real-ESRGAN (the image engine's networks).
- `flow-interpolation`: new frames between each pair, warped along OpenCV's DIS optical flow
  (presets ultrafast / fast / medium are the `enhancement_model` names).
"""

from __future__ import annotations

import io
import math
import threading
from fractions import Fraction
from typing import Any

import numpy as np
from PIL import Image

# Wan's VAE compresses time by 4: a clip has 4k + 1 frames.
WAN_TEMPORAL_STRIDE = 4
MAX_FRAMES = 24 * 30
# Decoded frames a job may hold in memory at once (RGB bytes): a source clip is refused,
# before it is decoded whole, when it (or what the job makes of it) would need more.
MAX_DECODED_BYTES = 2 * 1024**3


def encode_mp4(frames: np.ndarray | list[np.ndarray], fps: float) -> bytes:
    """H.264 (yuv420p, the widely playable profile) in MP4; frames are HxWx3 uint8 RGB with
    even sides."""
    import av

    out = io.BytesIO()
    rate = Fraction(fps).limit_denominator(1001)
    with av.open(out, mode="w", format="mp4") as container:
        first = frames[0]
        stream = container.add_stream("libx264", rate=rate)
        stream.width, stream.height = first.shape[1], first.shape[0]
        stream.pix_fmt = "yuv420p"
        stream.options = {"crf": "20", "preset": "veryfast"}
        for frame in frames:
            video_frame = av.VideoFrame.from_ndarray(np.ascontiguousarray(frame), format="rgb24")
            for packet in stream.encode(video_frame):
                container.mux(packet)
        for packet in stream.encode():
            container.mux(packet)
    return out.getvalue()


def decode_frames(data: bytes, max_frames: int = MAX_FRAMES, *, growth: int = 1,
                  at_most_fps: float | None = None) -> tuple[list[np.ndarray], float]:
    """The frames (HxWx3 uint8 RGB) of a video file, and their frame rate. `growth`: how many
    times larger the job's output frames are (an upscale's factor squared); the decoded and
    made frames together must fit MAX_DECODED_BYTES, whatever the container claims.
    `at_most_fps`: a clip faster than it keeps only the frame nearest each instant of that
    rate (the others are dropped as they are decoded), and the rate returned is it."""
    import av

    frames: list[np.ndarray] = []
    held = 0
    with av.open(io.BytesIO(data), mode="r") as container:
        stream = container.streams.video[0]
        fps = float(stream.average_rate or stream.base_rate or 24)
        step = fps / at_most_fps if at_most_fps and at_most_fps < fps else 1.0
        for index, frame in enumerate(container.decode(stream)):
            if index < round(len(frames) * step):
                continue  # between two kept instants: dropped before it costs anything
            held += frame.width * frame.height * 3 * (1 + growth)
            if held > MAX_DECODED_BYTES:
                raise ValueError("the clip is too large to process: use a shorter or smaller "
                                 "clip")
            frames.append(frame.to_ndarray(format="rgb24"))
            if len(frames) >= max_frames:
                break
    if not frames:
        raise ValueError("the video has no frames")
    return frames, (at_most_fps if step > 1 else fps)


def _even(frame: np.ndarray) -> np.ndarray:
    """H.264 in yuv420p needs even sides."""
    h, w = frame.shape[:2]
    return frame[: h - h % 2, : w - w % 2]


def wan_frame_count(seconds: float, fps: float) -> int:
    """The 4k + 1 frame count nearest to `seconds` at `fps` (at least 5)."""
    steps = max(1, round(seconds * fps / WAN_TEMPORAL_STRIDE))
    return steps * WAN_TEMPORAL_STRIDE + 1


def _resample(frames: list[np.ndarray], count: int) -> list[np.ndarray]:
    """`count` frames spread evenly over `frames`."""
    if len(frames) == count:
        return frames
    picks = np.linspace(0, len(frames) - 1, count).round().astype(int)
    return [frames[i] for i in picks]


_PIPELINES: dict[tuple[str, Any, str], Any] = {}
_LOCKS: dict[str, threading.Lock] = {}


def _shared_pipeline(weights: str, dtype: Any, device: str) -> Any:
    """One `WanPipeline` per folder in a replica: the catalog's text, image and reference
    models of one folder share its weights."""
    from diffusers import WanPipeline

    key = (weights, dtype, device)
    if key not in _PIPELINES:
        _PIPELINES[key] = WanPipeline.from_pretrained(weights, dtype=dtype).to(device)
    return _PIPELINES[key]


class WanVideoEngine:
    """params: `prompt`, `negative_prompt`, `seconds`, `width`, `height`, `fps`, `seed`;
    inputs: `image` (image-to-video) or `reference-0`.. (reference-to-video).
    options: `steps` (default 30), `guidance` (5.0), `strength` (reference-to-video, 0.7),
    `max_frames`, `device` (cpu)."""

    def __init__(self, weights: str | None, options: dict[str, Any] | None = None) -> None:
        if not weights:
            raise ValueError("the wan engine needs a weights folder")
        import torch
        from diffusers import WanImageToVideoPipeline, WanVideoToVideoPipeline

        options = options or {}
        self.steps = int(options.get("steps", 30))
        self.guidance = float(options.get("guidance", 5.0))
        self.strength = float(options.get("strength", 0.7))
        self.max_frames = int(options.get("max_frames", 121))
        device = str(options.get("device", "cpu"))
        dtype = torch.bfloat16 if options.get("dtype") == "bfloat16" else torch.float32
        self.text = _shared_pipeline(weights, dtype, device)
        # The same modules, other ways in (no second copy of the weights).
        self.image = WanImageToVideoPipeline.from_pipe(self.text, expand_timesteps=True)
        self.video = WanVideoToVideoPipeline.from_pipe(self.text)
        for pipeline in (self.text, self.image, self.video):
            pipeline.set_progress_bar_config(disable=True)
        self._torch = torch
        self._lock = _LOCKS.setdefault(weights, threading.Lock())

    def run(self, params: dict[str, Any], inputs: dict[str, bytes]) -> tuple[np.ndarray, float]:
        width, height = int(params["width"]), int(params["height"])
        fps = float(params["fps"])
        count = min(wan_frame_count(float(params["seconds"]), fps), self.max_frames)
        generator = self._torch.Generator().manual_seed(int(params.get("seed", 0)))
        common = {"prompt": params["prompt"], "negative_prompt": params.get("negative_prompt"),
                  "height": height, "width": width, "num_inference_steps": self.steps,
                  "guidance_scale": self.guidance, "generator": generator, "output_type": "np"}
        references = sorted(name for name in inputs if name.startswith("reference-"))
        with self._lock:
            if references:
                frames: list[np.ndarray] = []
                for name in references:
                    frames += decode_frames(inputs[name], max_frames=self.max_frames)[0]
                clip = [Image.fromarray(f).resize((width, height), Image.LANCZOS)
                        for f in _resample(frames, count)]
                out = self.video(video=clip, strength=self.strength, **common)
            elif "image" in inputs:
                image = Image.open(io.BytesIO(inputs["image"])).convert("RGB")
                image = image.resize((width, height), Image.LANCZOS)
                out = self.image(image=image, num_frames=count, **common)
            else:
                out = self.text(num_frames=count, **common)
        video = np.asarray(out.frames[0])
        return (np.clip(video * 255 + 0.5, 0, 255).astype(np.uint8), fps)


def _interpolate_pair(a: np.ndarray, b: np.ndarray, flow_ab: np.ndarray, flow_ba: np.ndarray,
                      t: float) -> np.ndarray:
    """The frame at `t` (0..1) between a and b: each warped along its flow, then blended."""
    import cv2

    h, w = a.shape[:2]
    grid_x, grid_y = np.meshgrid(np.arange(w, dtype=np.float32),
                                 np.arange(h, dtype=np.float32))
    from_a = cv2.remap(a, grid_x - t * flow_ab[..., 0], grid_y - t * flow_ab[..., 1],
                       cv2.INTER_LINEAR, borderMode=cv2.BORDER_REPLICATE)
    from_b = cv2.remap(b, grid_x - (1 - t) * flow_ba[..., 0],
                       grid_y - (1 - t) * flow_ba[..., 1], cv2.INTER_LINEAR,
                       borderMode=cv2.BORDER_REPLICATE)
    return cv2.addWeighted(from_a, 1 - t, from_b, t, 0)


DIS_PRESETS = {"dis-ultrafast": 0, "dis-fast": 1, "dis-medium": 2}


def interpolate(frames: list[np.ndarray], fps: float, target_fps: float, slowdown: int,
                preset: str = "dis-fast") -> list[np.ndarray]:
    """Frames at `target_fps` over `slowdown` times the clip's length: every output instant
    maps back to a source instant, made from the two frames around it along their optical
    flow (DIS). The clip plays `slowdown` times slower at `target_fps`."""
    import cv2

    if preset not in DIS_PRESETS:
        raise ValueError(f"unknown enhancement model {preset!r}; one of {sorted(DIS_PRESETS)}")
    dis = cv2.DISOpticalFlow_create(DIS_PRESETS[preset])
    grey = [cv2.cvtColor(f, cv2.COLOR_RGB2GRAY) for f in frames]
    seconds = len(frames) / fps * slowdown
    count = max(1, round(seconds * target_fps))
    if count > MAX_FRAMES * 4 or count * frames[0].nbytes > MAX_DECODED_BYTES:
        raise ValueError(f"the clip would need {count} frames at {target_fps:g} fps: too many "
                         "to make; use a shorter clip, a lower target_fps or slowdown_factor")
    flows: dict[int, tuple[np.ndarray, np.ndarray]] = {}
    out: list[np.ndarray] = []
    for k in range(count):
        source_t = (k / target_fps) / slowdown * fps  # position in source frames
        i = min(math.floor(source_t), len(frames) - 1)
        t = source_t - i
        if i >= len(frames) - 1 or t < 1e-3:
            out.append(frames[i])
            continue
        if i not in flows:
            flows[i] = (dis.calc(grey[i], grey[i + 1], None), dis.calc(grey[i + 1], grey[i], None))
        out.append(_interpolate_pair(frames[i], frames[i + 1], *flows[i], t))
    return out


class RealEsrganVideoEngine:
    """params: `upscale_factor` (1: enhance at the same size, 2, 4), `creativity`,
    `target_fps` (frames added by interpolation); input `video`. options as the image
    engine's Real-ESRGAN (`model`, `tilesize`, ...)."""

    def __init__(self, weights: str | None, options: dict[str, Any] | None = None) -> None:
        from deployments.engines.image import RealEsrganEngine

        self.upscaler = RealEsrganEngine(weights, options)

    def run(self, params: dict[str, Any], inputs: dict[str, bytes]) -> tuple[list, float]:
        """A `target_fps` below the source's rate drops frames to it before upscaling, so the
        network works on the frames delivered, the ones the price counts (pricing/video.py:
        the output rate); one above it adds frames by interpolation after upscaling."""
        factor = int(params.get("upscale_factor", 2))
        target = float(params["target_fps"]) if params.get("target_fps") else None
        frames, fps = decode_frames(inputs["video"], growth=max(1, factor) ** 2,
                                    at_most_fps=target)
        frames = frames[: max(1, round(float(params["seconds"]) * fps))]
        creativity = float(params.get("creativity") or 0.0)
        out = []
        for frame in frames:
            image = Image.fromarray(frame)
            big = self.upscaler.run([image], {"scale": max(2, factor),
                                              "creativity": min(max(creativity, 0), 0.02)})[0]
            if factor == 1:  # quality enhancement: the network's detail at the source size
                big = big.resize(image.size, Image.LANCZOS)
            out.append(_even(np.asarray(big.convert("RGB"))))
        if target and target > fps:
            out = interpolate(out, fps, target, 1)
            fps = target
        return out, fps


class FlowInterpolationEngine:
    """params: `target_fps`, `slowdown_factor`, `enhancement_model` (a DIS preset); input
    `video`."""

    def __init__(self, weights: str | None, options: dict[str, Any] | None = None) -> None:
        self.default_preset = str((options or {}).get("preset", "dis-fast"))

    def run(self, params: dict[str, Any], inputs: dict[str, bytes]) -> tuple[list, float]:
        frames, fps = decode_frames(inputs["video"])
        slowdown = int(params.get("slowdown_factor") or 1)
        frames = frames[: max(2, round(float(params["seconds"]) / slowdown * fps))]
        target = float(params.get("target_fps") or fps)  # the spec: omitted keeps the rate
        preset = str(params.get("enhancement_model") or self.default_preset)
        return [_even(f) for f in interpolate(frames, fps, target, slowdown, preset)], target


ENGINES = {"wan": WanVideoEngine, "realesrgan-video": RealEsrganVideoEngine,
           "flow-interpolation": FlowInterpolationEngine}
