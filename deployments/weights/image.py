"""TEST WEIGHTS for the image engines, built locally and deterministically (fixed seeds): no
model hub is reachable here, so these are tiny random networks saved in exactly the layout of
real ones. Their output is noise; they exist so that the real loading and inference code
(`from_pretrained` of a Stable Diffusion / InstructPix2Pix folder, an ONNX matting model) runs
in tests in seconds. Point the catalog at a real folder to get real images.

- `build_tiny_sd`: a `StableDiffusionPipeline` folder (`pipeline.save_pretrained`).
- `build_tiny_instruct_pix2pix`: a `StableDiffusionInstructPix2PixPipeline` folder.
- `build_tiny_matting_onnx`: `model.onnx`, a small conv net with a matting model's signature.

The test weights' safety checker flags everything, so the blur path is exercised; real weights
bring a real checker.
"""

from __future__ import annotations

import json
import tempfile
import time
from pathlib import Path
from typing import Any

from deployments.weights.store import WEIGHTS_LABEL, build_once, log

# The tokenizer's special tokens, as in CLIP's vocabulary.
_BOS, _EOS = "<|startoftext|>", "<|endoftext|>"


def build_tiny_sd(target: Path, seed: int = 0) -> Path:
    """A tiny text-to-image Stable Diffusion folder (test weights, output is noise)."""
    return build_once(target, lambda folder: _build_pipeline(folder, seed, instruct=False))


def build_tiny_instruct_pix2pix(target: Path, seed: int = 0) -> Path:
    """A tiny InstructPix2Pix folder: its UNet takes 8 channels, the noisy latents and the
    encoded base image (test weights, output is noise)."""
    return build_once(target, lambda folder: _build_pipeline(folder, seed, instruct=True))


def build_tiny_matting_onnx(target: Path, size: int = 64, seed: int = 0) -> Path:
    """`target/model.onnx`: a tiny conv net taking 1x3x`size`x`size` normalised RGB and giving
    1x1x`size`x`size` alpha logits, like BiRefNet / RMBG exports (test weights)."""
    return build_once(target, lambda folder: _export_matting(folder, size, seed))


def _byte_vocabulary() -> dict[str, int]:
    """CLIP's byte-to-printable-character table (the byte-level BPE alphabet): printable
    bytes map to themselves, the others to code points from 256 on."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1),
                 *range(ord("®"), ord("ÿ") + 1)]
    table: dict[int, str] = {byte: chr(byte) for byte in printable}
    extra = 0
    for byte in range(256):
        if byte not in table:
            table[byte] = chr(256 + extra)
            extra += 1
    alphabet = [table[byte] for byte in range(256)]
    # every byte alone, then every byte ending a word: with no merges, text tokenizes to bytes
    tokens = [*alphabet, *(char + "</w>" for char in alphabet), _BOS, _EOS]
    return {token: index for index, token in enumerate(tokens)}


def _tiny_tokenizer(folder: Path) -> Any:
    """A CLIPTokenizer read from a vocab.json / merges.txt written here (bytes only)."""
    from transformers import CLIPTokenizer

    (folder / "vocab.json").write_text(json.dumps(_byte_vocabulary(), ensure_ascii=False),
                                       encoding="utf-8")
    (folder / "merges.txt").write_text("#version: 0.2\n", encoding="utf-8")
    return CLIPTokenizer.from_pretrained(folder, model_max_length=77)


def _seeded(seed: int) -> None:
    import torch

    torch.manual_seed(seed)


def _build_pipeline(target: Path, seed: int, instruct: bool) -> dict:
    kind = "InstructPix2Pix (image edits)" if instruct else "Stable Diffusion (generation)"
    started = time.monotonic()
    log(f"Building the {kind} test weights at {target} (once; a few seconds)...")
    built = _save_pipeline(target, seed, instruct)
    log(f"  done in {time.monotonic() - started:.1f}s")
    return built


def _save_pipeline(target: Path, seed: int, instruct: bool) -> dict:
    import torch
    from diffusers import (
        AutoencoderKL,
        EulerDiscreteScheduler,
        StableDiffusionInstructPix2PixPipeline,
        StableDiffusionPipeline,
        UNet2DConditionModel,
    )
    from diffusers.pipelines.stable_diffusion.safety_checker import (
        StableDiffusionSafetyChecker,
    )
    from transformers import CLIPConfig, CLIPImageProcessor, CLIPTextConfig, CLIPTextModel

    with tempfile.TemporaryDirectory() as staging:
        tokenizer = _tiny_tokenizer(Path(staging))

    _seeded(seed)
    text_encoder = CLIPTextModel(CLIPTextConfig(
        vocab_size=len(tokenizer), hidden_size=32, intermediate_size=64, num_hidden_layers=2,
        num_attention_heads=4, max_position_embeddings=77, projection_dim=32,
        bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id))

    _seeded(seed + 1)
    # Four levels, so the latent is 1/8 of the image as in real Stable Diffusion; narrow, and
    # no attention in the middle, so that a 1024x1024 picture decodes in about 2 s on one core.
    vae = AutoencoderKL(
        in_channels=3, out_channels=3, latent_channels=4, layers_per_block=1,
        block_out_channels=(8, 16, 32, 32), norm_num_groups=8, mid_block_add_attention=False,
        down_block_types=("DownEncoderBlock2D",) * 4, up_block_types=("UpDecoderBlock2D",) * 4,
        sample_size=256)

    _seeded(seed + 2)
    # Cross-attention only at 1/4 of the latent: 1024 tokens for a 1024x1024 picture.
    unet = UNet2DConditionModel(
        sample_size=32, in_channels=8 if instruct else 4, out_channels=4, layers_per_block=1,
        block_out_channels=(32, 32, 64),
        down_block_types=("DownBlock2D", "DownBlock2D", "CrossAttnDownBlock2D"),
        up_block_types=("CrossAttnUpBlock2D", "UpBlock2D", "UpBlock2D"), cross_attention_dim=32,
        attention_head_dim=8, norm_num_groups=32)

    scheduler = EulerDiscreteScheduler(
        beta_start=0.00085, beta_end=0.012, beta_schedule="scaled_linear",
        num_train_timesteps=1000, steps_offset=1)

    _seeded(seed + 3)
    checker = StableDiffusionSafetyChecker(CLIPConfig(
        text_config={"hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 1,
                     "num_attention_heads": 4, "vocab_size": 64,
                     "bos_token_id": 0, "eos_token_id": 1, "pad_token_id": 1},
        vision_config={"hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 2,
                       "num_attention_heads": 4, "image_size": 32, "patch_size": 4},
        projection_dim=32))
    with torch.no_grad():
        checker.concept_embeds.normal_(generator=torch.Generator().manual_seed(seed + 4))
        checker.special_care_embeds.normal_(generator=torch.Generator().manual_seed(seed + 5))
        # A concept fires when cosine(image, concept) - weight > 0. Cosines are >= -1, so a
        # weight of -2 fires for every image: the test checker flags everything.
        checker.concept_embeds_weights.fill_(-2.0)
        checker.special_care_embeds_weights.fill_(2.0)
    feature_extractor = CLIPImageProcessor(
        size={"shortest_edge": 32}, crop_size={"height": 32, "width": 32})

    pipeline_class = StableDiffusionInstructPix2PixPipeline if instruct else \
        StableDiffusionPipeline
    pipeline = pipeline_class(
        vae=vae.eval(), text_encoder=text_encoder.eval(), tokenizer=tokenizer,
        unet=unet.eval(), scheduler=scheduler, safety_checker=checker.eval(),
        feature_extractor=feature_extractor, requires_safety_checker=True)
    pipeline.save_pretrained(target, safe_serialization=True)
    (target / "README.md").write_text(
        f"# {WEIGHTS_LABEL}\n\nBuilt by deployments.weights.image "
        f"({pipeline_class.__name__}, seed {seed}). The safety checker flags every image.\n",
        encoding="utf-8")
    return {"seed": seed, "pipeline": pipeline_class.__name__, "label": WEIGHTS_LABEL}


def _export_matting(target: Path, size: int, seed: int) -> dict:
    import torch

    class TinyMatting(torch.nn.Module):
        """Three convolutions and a coarse branch: a few thousand weights."""

        def __init__(self) -> None:
            super().__init__()
            self.features = torch.nn.Sequential(
                torch.nn.Conv2d(3, 8, 3, padding=1), torch.nn.ReLU(),
                torch.nn.Conv2d(8, 8, 3, padding=2, dilation=2), torch.nn.ReLU())
            self.coarse = torch.nn.Sequential(
                torch.nn.AvgPool2d(4), torch.nn.Conv2d(8, 8, 3, padding=1), torch.nn.ReLU(),
                torch.nn.Upsample(scale_factor=4, mode="bilinear", align_corners=False))
            self.head = torch.nn.Conv2d(16, 1, 3, padding=1)

        def forward(self, image: torch.Tensor) -> torch.Tensor:
            features = self.features(image)
            return self.head(torch.cat([features, self.coarse(features)], dim=1))

    if size % 4:
        raise ValueError(f"size must be a multiple of 4, not {size}")
    _seeded(seed)
    model = TinyMatting().eval()
    target.mkdir(parents=True, exist_ok=True)
    example = torch.zeros(1, 3, size, size)
    torch.onnx.export(model, (example,), str(target / "model.onnx"), input_names=["input"],
                      output_names=["alpha"], external_data=False, verbose=False)
    (target / "README.md").write_text(
        f"# {WEIGHTS_LABEL}\n\nA tiny matting-shaped ONNX model: input 1x3x{size}x{size} "
        "(ImageNet-normalised RGB), output 1x1 alpha logits of the same size.\n",
        encoding="utf-8")
    return {"seed": seed, "size": size, "label": WEIGHTS_LABEL}
