"""TEST WEIGHTS for vision chat, built locally and deterministically (fixed seeds): no model hub
is reachable here, so this is a tiny random SmolVLM (the Idefics3 architecture: a SigLIP
vision tower, a pixel-shuffle connector and a Llama decoder; two layers each) saved in exactly
the layout of a real one (`save_pretrained` of `Idefics3ForConditionalGeneration`, SmolLM2's
tokenizer with the image tokens SmolVLM adds, its image processor config and chat template).
vLLM loads it with the code that serves SmolVLM-256M-Instruct or Idefics3-8B; its answers are
noise. Point the catalog at a real vision-language model folder to get real answers.

Why not a tiny Qwen2-VL: vLLM's Qwen2-VL (and Qwen2.5-VL, LLaVA-OneVision, InternVL) modules
import torchvision, which the CPU build of vLLM does not install, so they cannot load here;
Idefics3's image processor has a Pillow backend.
"""

from __future__ import annotations

from pathlib import Path

from deployments.weights.store import WEIGHTS_LABEL, build_once

TILE = 64  # pixels of one tile's side (SmolVLM-256M: 512)
LONGEST_EDGE = 2 * TILE  # images are resized to this longest edge, then cut into tiles
PATCH = 16
SCALE_FACTOR = 2  # the connector's pixel shuffle
IMAGE_SEQ_LEN = (TILE // PATCH) ** 2 // SCALE_FACTOR ** 2  # tokens of one tile

# SmolVLM's tokens beyond SmolLM2's own.
IMAGE_TOKENS = ["<fake_token_around_image>", "<image>", "<end_of_utterance>", "<global-img>",
                *(f"<row_{row}_col_{col}>" for row in range(1, 7) for col in range(1, 7))]

# SmolVLM-Instruct's chat template (image parts as `<image>`), taking plain string content too.
CHAT_TEMPLATE = (
    "<|im_start|>{% for message in messages %}{{ message['role'] | capitalize }}"
    "{% if message['content'] is string %}{{ ': ' + message['content'] }}"
    "{% else %}{% if message['content'] and message['content'][0]['type'] == 'image' %}"
    "{{ ':' }}{% else %}{{ ': ' }}{% endif %}"
    "{% for line in message['content'] %}{% if line['type'] == 'text' %}{{ line['text'] }}"
    "{% elif line['type'] == 'image' %}{{ '<image>' }}{% endif %}{% endfor %}{% endif %}"
    "<end_of_utterance>\n{% endfor %}{% if add_generation_prompt %}{{ 'Assistant:' }}{% endif %}"
)


def build_tiny_smolvlm(target: Path, seed: int = 4321) -> Path:
    """A tiny SmolVLM (a few million parameters, random weights from a fixed seed): loads and
    answers text and images like a real one, in seconds, for tests."""
    return build_once(target, lambda folder: _build(folder, seed))


def _processor():
    from transformers import AutoTokenizer, Idefics3ImageProcessorPil, Idefics3Processor

    from deployments.weights.text import smollm2_gguf

    gguf = smollm2_gguf()
    tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
    tokenizer.add_special_tokens({"additional_special_tokens": IMAGE_TOKENS})
    images = Idefics3ImageProcessorPil(
        size={"longest_edge": LONGEST_EDGE}, max_image_size={"longest_edge": TILE},
        do_image_splitting=True)
    return Idefics3Processor(image_processor=images, tokenizer=tokenizer,
                             image_seq_len=IMAGE_SEQ_LEN, chat_template=CHAT_TEMPLATE)


def _build(target: Path, seed: int) -> dict:
    import torch
    from transformers import GenerationConfig, Idefics3Config, Idefics3ForConditionalGeneration

    processor = _processor()
    tokenizer = processor.tokenizer
    end_of_utterance = tokenizer.convert_tokens_to_ids("<end_of_utterance>")
    config = Idefics3Config(
        text_config={
            "model_type": "llama", "vocab_size": len(tokenizer), "hidden_size": 64,
            "intermediate_size": 128, "num_hidden_layers": 2, "num_attention_heads": 2,
            # vLLM's CPU attention needs a head size of 32 or more.
            "num_key_value_heads": 1, "head_dim": 32, "max_position_embeddings": 4096,
            "rms_norm_eps": 1e-5, "tie_word_embeddings": True,
            "bos_token_id": tokenizer.bos_token_id, "eos_token_id": end_of_utterance,
            "pad_token_id": tokenizer.pad_token_id,
        },
        vision_config={
            "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2,
            "num_attention_heads": 2, "image_size": TILE, "patch_size": PATCH,
        },
        scale_factor=SCALE_FACTOR, image_token_id=processor.image_token_id,
        tie_word_embeddings=True, pad_token_id=tokenizer.pad_token_id,
    )
    with torch.no_grad():
        torch.manual_seed(seed)
        model = Idefics3ForConditionalGeneration(config)
        for index, param in enumerate(model.parameters()):
            if param.dim() > 1:
                param.normal_(0.0, 0.2, generator=torch.Generator().manual_seed(seed + index))
    model.to(torch.float32).eval().save_pretrained(target, safe_serialization=True)
    GenerationConfig(bos_token_id=tokenizer.bos_token_id,
                     eos_token_id=[end_of_utterance, tokenizer.eos_token_id],
                     pad_token_id=tokenizer.pad_token_id).save_pretrained(target)
    processor.save_pretrained(target)
    (target / "README.md").write_text(
        f"# {WEIGHTS_LABEL}\n\nBuilt by deployments.weights.vision (Idefics3, SmolVLM's layout, "
        f"seed {seed}): text and image chat; videos are read as frames.\n", encoding="utf-8")
    return {"seed": seed, "architecture": "Idefics3ForConditionalGeneration",
            "label": WEIGHTS_LABEL}
