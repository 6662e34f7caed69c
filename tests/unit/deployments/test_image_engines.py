"""The image engines as a user sees them: sizes, alpha, quality against plain resampling,
background masks, determinism and the safety blur. Diffusion runs on TEST WEIGHTS built here
in seconds (their pictures are noise; the code path is the real one)."""

from __future__ import annotations

import shutil
import time
from pathlib import Path

import numpy as np
import pytest
from PIL import Image, ImageDraw

from deployments.engines.image import (
    ENGINES,
    RealEsrganEngine,
    default_realesrgan_weights,
)
from deployments.weights.image import build_tiny_matting_onnx
from deployments.weights.registry import BUILDERS, prepare_weights

# --------------------------------------------------------------------------------------------
# helpers


def psnr(a: Image.Image, b: Image.Image) -> float:
    x, y = np.asarray(a, np.float64), np.asarray(b, np.float64)
    return float(10 * np.log10(255.0**2 / np.mean((x - y) ** 2)))


def high_frequency(image: Image.Image) -> float:
    """Mean absolute Laplacian of the grey image: how much fine detail it has."""
    g = np.asarray(image.convert("L"), np.float64)
    lap = 4 * g[1:-1, 1:-1] - g[:-2, 1:-1] - g[2:, 1:-1] - g[1:-1, :-2] - g[1:-1, 2:]
    return float(np.abs(lap).mean())


def test_card(size: int = 256) -> Image.Image:
    """Gradients, flat shapes with hard edges, thin lines, arcs and text-like strokes."""
    y, x = np.mgrid[0:size, 0:size].astype(np.float32) / size
    image = Image.fromarray((np.stack([x, y, (x + y) / 2], -1) * 255).astype(np.uint8))
    draw = ImageDraw.Draw(image)
    s = size / 256
    draw.rectangle([20 * s, 20 * s, 100 * s, 90 * s], fill=(220, 30, 40), outline=(0, 0, 0),
                   width=3)
    draw.ellipse([130 * s, 30 * s, 230 * s, 130 * s], fill=(30, 200, 60),
                 outline=(255, 255, 255), width=2)
    draw.polygon([(40 * s, 200 * s), (120 * s, 130 * s), (160 * s, 230 * s)], fill=(250, 220, 0))
    for i in range(8):
        draw.line([((150 + 12 * i) * s, 150 * s), ((170 + 12 * i) * s, 240 * s)], fill=(10, 10, 10),
                  width=2)
    for i in range(5):
        draw.arc([(170 - 6 * i) * s, (160 - 6 * i) * s, (240 + 6 * i) * s, (230 + 6 * i) * s],
                 0, 270, fill=(0, 0, 200), width=1)
    # "handwriting": zigzag strokes of one-pixel pens
    for row in range(3):
        top = (100 + 10 * row) * s
        points = [((20 + 4 * k) * s, top + (0 if k % 2 else 6 * s)) for k in range(24)]
        draw.line(points, fill=(0, 0, 0), width=1)
    return image


test_card.__test__ = False  # a helper, not a test


def matting_scene(width: int, height: int, seed: int = 0) -> tuple[Image.Image, np.ndarray]:
    """A textured warm object (an ellipse on a stem) in the middle of a textured cool
    background; the object's mask."""
    rng = np.random.default_rng(seed)
    y, x = np.mgrid[0:height, 0:width].astype(np.float32)
    background = np.stack([90 + 40 * np.sin(x / 23), 140 + 30 * np.cos(y / 31),
                           200 + 20 * np.sin((x + y) / 40)], -1)
    cx, cy = width / 2, height / 2
    mask = ((x - cx) / (width * 0.22)) ** 2 + ((y - cy) / (height * 0.3)) ** 2 <= 1
    mask |= (np.abs(x - cx) < width * 0.08) & (y > cy) & (y < height * 0.85)
    subject = np.stack([200 + 30 * np.sin(x / 5), 90 + 40 * np.cos(y / 7),
                        40 + 20 * np.sin(x * y / 300)], -1)
    pixels = np.where(mask[..., None], subject, background) + rng.normal(0, 8, background.shape)
    return Image.fromarray(np.clip(pixels, 0, 255).astype(np.uint8)), mask


# --------------------------------------------------------------------------------------------
# Real-ESRGAN


@pytest.fixture(scope="module")
def upscaler() -> RealEsrganEngine:
    return ENGINES["realesrgan-ncnn"](None, {})


@pytest.mark.parametrize("scale", [2, 3, 4, 2.5])
def test_upscale_output_size(upscaler: RealEsrganEngine, scale: float) -> None:
    image = test_card(64).crop((0, 0, 64, 50))
    [out] = upscaler.run([image], {"scale": scale, "creativity": 0})
    assert out.mode == "RGB"
    assert out.size == (round(64 * scale), round(50 * scale))


def test_upscale_keeps_alpha(upscaler: RealEsrganEngine) -> None:
    image = test_card(64).convert("RGBA")
    alpha = np.tile(np.linspace(0, 255, 64, dtype=np.uint8), (64, 1))
    image.putalpha(Image.fromarray(alpha, "L"))
    [out] = upscaler.run([image], {"scale": 3})
    assert out.mode == "RGBA" and out.size == (192, 192)
    expected = Image.fromarray(alpha, "L").resize((192, 192), Image.Resampling.LANCZOS)
    assert np.array_equal(np.asarray(out.getchannel("A")), np.asarray(expected))


def test_upscale_beats_bicubic(upscaler: RealEsrganEngine) -> None:
    original = test_card(256)
    small = original.resize((128, 128), Image.Resampling.BICUBIC)
    [ours] = upscaler.run([small], {"scale": 2, "creativity": 0})
    bicubic = small.resize((256, 256), Image.Resampling.BICUBIC)
    ours_db, bicubic_db = psnr(ours, original), psnr(bicubic, original)
    print(f"PSNR x2 on the test card: Real-ESRGAN {ours_db:.2f} dB, bicubic {bicubic_db:.2f} dB")
    assert ours_db > bicubic_db + 0.3


def test_creativity_boosts_detail(upscaler: RealEsrganEngine) -> None:
    small = test_card(128)
    network = upscaler.upscale_network(small, 2)
    [plain] = upscaler.run([small], {"scale": 2, "creativity": 0})
    [boosted] = upscaler.run([small], {"scale": 2, "creativity": 0.02})
    [middle] = upscaler.run([small], {"scale": 2, "creativity": 0.01})
    assert np.array_equal(np.asarray(plain), np.asarray(network))
    assert not np.array_equal(np.asarray(boosted), np.asarray(plain))
    energies = [high_frequency(image) for image in (plain, middle, boosted)]
    print("high-frequency energy at creativity 0 / 0.01 / 0.02:", energies)
    assert energies[0] < energies[1] < energies[2]


def test_upscale_refuses_what_it_cannot_do(upscaler: RealEsrganEngine) -> None:
    image = test_card(32)
    with pytest.raises(ValueError, match="scale"):
        upscaler.run([image], {"scale": 5})
    with pytest.raises(ValueError, match="creativity"):
        upscaler.run([image], {"scale": 2, "creativity": 0.5})
    with pytest.raises(ValueError, match="model"):
        ENGINES["realesrgan-ncnn"](None, {"model": "nope"})


def test_upscale_weights_from_another_folder(tmp_path: Path) -> None:
    """The weights are a path: a copy of the package's files elsewhere serves the same."""
    for path in default_realesrgan_weights().glob("realesr-animevideov3-x*"):
        shutil.copy(path, tmp_path / path.name)
    engine = ENGINES["realesrgan-ncnn"](str(tmp_path), {})
    assert engine.network_scale(2.5) == 3
    [out] = engine.run([test_card(32)], {"scale": 2})
    assert out.size == (64, 64)
    with pytest.raises(FileNotFoundError):
        ENGINES["realesrgan-ncnn"](str(tmp_path / "missing"), {})
    # x4plus only has a x4 network: x2 runs it, then resizes down
    assert ENGINES["realesrgan-ncnn"](None, {"model": "x4plus"}).network_scale(2) == 4


# --------------------------------------------------------------------------------------------
# background removal


def test_grabcut_finds_the_subject() -> None:
    image, truth = matting_scene(400, 300)
    started = time.perf_counter()
    [out] = ENGINES["grabcut"](None, {}).run([image], {})
    elapsed = time.perf_counter() - started
    assert out.mode == "RGBA" and out.size == image.size
    alpha = np.asarray(out.getchannel("A"))
    found = alpha >= 128
    iou = (found & truth).sum() / (found | truth).sum()
    print(f"GrabCut IoU {iou:.3f} on 400x300 in {elapsed:.2f}s")
    assert iou >= 0.8
    assert alpha[0, 0] == 0 and alpha[150, 200] == 255
    # feathered: some pixels between transparent and opaque, all of them near the edge
    assert 0 < ((alpha > 0) & (alpha < 255)).sum() < 0.05 * alpha.size
    assert np.array_equal(np.asarray(out.convert("RGB")), np.asarray(image))


def test_grabcut_large_image() -> None:
    image, truth = matting_scene(3840, 2160)
    started = time.perf_counter()
    [out] = ENGINES["grabcut"](None, {}).run([image], {})
    found = np.asarray(out.getchannel("A")) >= 128
    iou = (found & truth).sum() / (found | truth).sum()
    print(f"GrabCut 3840x2160 in {time.perf_counter() - started:.2f}s, IoU {iou:.3f}")
    assert out.size == (3840, 2160) and iou >= 0.8


# --------------------------------------------------------------------------------------------
# ONNX matting


def test_onnx_matting_tiny_model(tmp_path: Path) -> None:
    folder = prepare_weights(str(tmp_path / "matting"), {"build": "tiny-matting-onnx"})
    assert (folder / "model.onnx").is_file()
    engine = ENGINES["onnx-matting"](str(folder), {})
    assert engine.size == 64  # the model's own fixed input size
    image, _ = matting_scene(300, 200)
    [out] = engine.run([image], {})
    assert out.mode == "RGBA" and out.size == (300, 200)
    alpha = np.asarray(out.getchannel("A"))
    assert alpha.dtype == np.uint8 and 0 <= alpha.min() <= alpha.max() <= 255
    assert alpha.std() > 0  # a picture's worth of values, not one constant
    # the file itself works too, and the build is deterministic
    again = build_tiny_matting_onnx(tmp_path / "again")
    assert (again / "model.onnx").read_bytes() == (folder / "model.onnx").read_bytes()
    [out2] = ENGINES["onnx-matting"](str(again / "model.onnx"), {}).run([image], {})
    assert np.array_equal(np.asarray(out2), np.asarray(out))


def _constant_model(path: Path, value: float, size: int = 32) -> Path:
    """An ONNX model whose output is `value` everywhere (1x1xSxS)."""
    import onnx
    from onnx import TensorProto, helper

    graph = helper.make_graph(
        [helper.make_node("ReduceMean", ["input", "axes"], ["mean"], keepdims=1),
         helper.make_node("Mul", ["mean", "zero"], ["nothing"]),
         helper.make_node("Add", ["nothing", "value"], ["alpha"])],
        "constant",
        [helper.make_tensor_value_info("input", TensorProto.FLOAT, [1, 3, size, size])],
        [helper.make_tensor_value_info("alpha", TensorProto.FLOAT, [1, 1, size, size])],
        [helper.make_tensor("axes", TensorProto.INT64, [1], [1]),
         helper.make_tensor("zero", TensorProto.FLOAT, [], [0.0]),
         helper.make_tensor("value", TensorProto.FLOAT, [], [value])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])
    model.ir_version = 8
    onnx.save(model, path)
    return path


def test_onnx_matting_probabilities_and_logits(tmp_path: Path) -> None:
    image = Image.new("RGB", (40, 30), (10, 20, 30))
    probabilities = ENGINES["onnx-matting"](str(_constant_model(tmp_path / "p.onnx", 0.25)), {})
    logits = ENGINES["onnx-matting"](str(_constant_model(tmp_path / "l.onnx", 2.0)), {})
    assert set(np.unique(np.asarray(probabilities.run([image], {})[0].getchannel("A")))) == {64}
    sigmoid = round(255 / (1 + np.exp(-2.0)))  # 225
    assert set(np.unique(np.asarray(logits.run([image], {})[0].getchannel("A")))) == {sigmoid}


# --------------------------------------------------------------------------------------------
# diffusion (test weights)


@pytest.fixture(scope="session")
def tiny_diffusion(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("image-weights")
    started = time.perf_counter()
    folders = {name: prepare_weights(str(root / name), {"build": name})
               for name in ("tiny-sd", "tiny-instruct-pix2pix")}
    print(f"built the tiny diffusion folders in {time.perf_counter() - started:.1f}s")
    return folders


@pytest.fixture(scope="session")
def text2img(tiny_diffusion: dict[str, Path]):
    return ENGINES["diffusers-text2img"](str(tiny_diffusion["tiny-sd"]), {"threads": 2})


@pytest.fixture(scope="session")
def editor(tiny_diffusion: dict[str, Path]):
    return ENGINES["diffusers-edit"](str(tiny_diffusion["tiny-instruct-pix2pix"]),
                                     {"threads": 2})


GENERATE = {"prompt": "a lighthouse at dusk", "negative_prompt": "blurry", "width": 256,
            "height": 256, "steps": 4, "cfg_scale": 7.0, "seed": 7, "variants": 1,
            "safe_mode": False}


def test_builders_are_registered() -> None:
    assert {"tiny-sd", "tiny-instruct-pix2pix", "tiny-matting-onnx"} <= set(BUILDERS)
    assert set(ENGINES) == {"realesrgan-ncnn", "grabcut", "onnx-matting", "diffusers-edit",
                            "diffusers-text2img"}


def test_text2img_seed_size_and_variants(text2img) -> None:
    started = time.perf_counter()
    [first] = text2img.run([], GENERATE)
    print(f"text2img 256x256, 4 steps: {time.perf_counter() - started:.2f}s")
    [same] = text2img.run([], GENERATE)
    [other] = text2img.run([], {**GENERATE, "seed": 8})
    assert first.size == (256, 256) and first.mode == "RGB"
    assert np.array_equal(np.asarray(first), np.asarray(same))
    assert not np.array_equal(np.asarray(first), np.asarray(other))
    assert first.info == {"blurred": False, "seed": 7}
    assert np.asarray(first).std() > 1  # pictures, not a black square

    [wide] = text2img.run([], {**GENERATE, "width": 320, "height": 192})
    assert wide.size == (320, 192)
    pair = text2img.run([], {**GENERATE, "variants": 2})
    assert len(pair) == 2 and all(image.size == (256, 256) for image in pair)
    assert not np.array_equal(np.asarray(pair[0]), np.asarray(pair[1]))
    with pytest.raises(ValueError, match="multiples of 8"):
        text2img.run([], {**GENERATE, "width": 250})


def test_text2img_safe_mode_blurs(text2img) -> None:
    """The test weights' safety checker flags everything: safe mode blurs every picture."""
    [plain] = text2img.run([], GENERATE)
    [safe] = text2img.run([], {**GENERATE, "safe_mode": True})
    assert plain.info["blurred"] is False and safe.info["blurred"] is True
    print("high-frequency energy, safe_mode off / on:", high_frequency(plain),
          high_frequency(safe))
    assert high_frequency(safe) < 0.5 * high_frequency(plain)
    # the blur is of the same picture: its mean colour is kept
    assert np.allclose(np.asarray(safe, float).mean((0, 1)), np.asarray(plain, float).mean((0, 1)),
                       atol=3)


def test_edit_mask_overlay_and_seed(editor) -> None:
    base = test_card(128)
    mask = Image.new("L", (256, 256), 0)
    mask.paste(255, (128, 0, 256, 256))  # edit the right half only
    overlay = Image.new("RGBA", (256, 256), (0, 0, 0, 0))
    overlay.paste((255, 0, 255, 255), (16, 16, 48, 48))  # a magenta square on the kept half
    params = {"prompt": "make it snow", "width": 256, "height": 256, "steps": 4,
              "guidance_scale": 7.5, "image_guidance_scale": 1.5, "seed": 3, "safe_mode": False}
    started = time.perf_counter()
    [out] = editor.run([base, overlay, mask], params)
    print(f"edit 256x256, 4 steps: {time.perf_counter() - started:.2f}s")
    [again] = editor.run([base, overlay, mask], params)
    assert out.size == (256, 256) and out.info["blurred"] is False
    assert np.array_equal(np.asarray(out), np.asarray(again))

    pixels = np.asarray(out)
    expected = np.asarray(base.resize((256, 256), Image.Resampling.LANCZOS)).copy()
    expected[16:48, 16:48] = (255, 0, 255)
    assert np.array_equal(pixels[:, :128], expected[:, :128])  # black mask: the base
    assert np.abs(pixels[:, 128:].astype(int) - expected[:, 128:]).mean() > 10  # white: edited

    # the deployment decodes a grey mask as RGB: the same edit
    [from_rgb] = editor.run([base, overlay, mask.convert("RGB")], params)
    assert np.array_equal(np.asarray(from_rgb), pixels)

    [tall] = editor.run([base], {**params, "width": 192, "height": 320})
    assert tall.size == (192, 320)
    [safe] = editor.run([base], {**params, "safe_mode": True})
    assert safe.info["blurred"] is True
    with pytest.raises(ValueError, match="layer 1"):
        editor.run([base, test_card(64)], params)
