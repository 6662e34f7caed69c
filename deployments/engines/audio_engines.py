"""The audio engines by name, as the catalog's `engine` names them. Apart from the engines, so
that Kokoro, which builds on `audio.py`'s pieces, is not imported back by it."""

from __future__ import annotations

from typing import Any

from deployments.engines.audio import PiperSpeechEngine, WhisperEngine
from deployments.engines.kokoro import KokoroSpeechEngine

ENGINES: dict[str, Any] = {
    "piper": PiperSpeechEngine,
    "kokoro": KokoroSpeechEngine,
    "faster-whisper": WhisperEngine,
}
