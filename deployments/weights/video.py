"""TEST WEIGHTS for the video engine, built locally and deterministically (fixed seeds): no
model hub is reachable here, so this is a tiny random Wan network saved in exactly the layout
of a real one (`WanPipeline.save_pretrained`: tokenizer, UMT5 text encoder, Wan VAE, Wan
transformer, flow-matching scheduler). Its output is noise; it exists so that the real loading
and inference code of deployments/engines/video.py runs in tests in seconds. Point the catalog
at a real Wan 2.1 / 2.2 folder to get real videos.
"""

from __future__ import annotations

from pathlib import Path

from deployments.weights.store import WEIGHTS_LABEL, build_once


def build_tiny_wan(target: Path, seed: int = 0) -> Path:
    return build_once(target, lambda folder: _build(folder, seed))


def _tokenizer():
    """A byte-level tokenizer (no merges): every UTF-8 byte is a token, as UMT5 expects ids."""
    from tokenizers import Tokenizer, decoders, models
    from tokenizers.pre_tokenizers import ByteLevel
    from transformers import PreTrainedTokenizerFast

    vocab = {"<pad>": 0, "</s>": 1, "<unk>": 2}
    for char in sorted(ByteLevel.alphabet()):
        vocab[char] = len(vocab)
    backend = Tokenizer(models.BPE(vocab=vocab, merges=[], unk_token="<unk>"))
    backend.pre_tokenizer = ByteLevel(add_prefix_space=False)
    backend.decoder = decoders.ByteLevel()
    return PreTrainedTokenizerFast(tokenizer_object=backend, pad_token="<pad>",
                                   eos_token="</s>", unk_token="<unk>", model_max_length=512)


def _build(target: Path, seed: int) -> dict:
    import torch
    from diffusers import (
        AutoencoderKLWan,
        FlowMatchEulerDiscreteScheduler,
        WanPipeline,
        WanTransformer3DModel,
    )
    from transformers import UMT5Config, UMT5EncoderModel

    tokenizer = _tokenizer()
    torch.manual_seed(seed)
    text_encoder = UMT5EncoderModel(UMT5Config(
        vocab_size=len(tokenizer), d_model=32, d_kv=8, d_ff=64, num_layers=2, num_heads=4,
        relative_attention_num_buckets=8, pad_token_id=0, eos_token_id=1,
        decoder_start_token_id=0))
    torch.manual_seed(seed + 1)
    # Four latent channels, time compressed by 4 and space by 8, as the real Wan VAE does.
    vae = AutoencoderKLWan(base_dim=8, z_dim=4, dim_mult=[1, 1, 1, 1], num_res_blocks=1,
                           temperal_downsample=[False, True, True],
                           latents_mean=[0.0] * 4, latents_std=[1.0] * 4)
    torch.manual_seed(seed + 2)
    transformer = WanTransformer3DModel(
        patch_size=(1, 2, 2), num_attention_heads=2, attention_head_dim=16, in_channels=4,
        out_channels=4, text_dim=32, freq_dim=32, ffn_dim=64, num_layers=2,
        cross_attn_norm=True, qk_norm="rms_norm_across_heads", rope_max_seq_len=32)
    pipeline = WanPipeline(tokenizer=tokenizer, text_encoder=text_encoder.eval(), vae=vae.eval(),
                           transformer=transformer.eval(),
                           scheduler=FlowMatchEulerDiscreteScheduler(shift=3.0))
    pipeline.save_pretrained(target, safe_serialization=True)
    (target / "README.md").write_text(
        f"# {WEIGHTS_LABEL}\n\nBuilt by deployments.weights.video (WanPipeline, seed {seed}): "
        "text-to-video, image-to-video and video-to-video from one folder.\n", encoding="utf-8")
    return {"seed": seed, "pipeline": "WanPipeline", "label": WEIGHTS_LABEL}
