"""A catalog model's `engine_options`: the settings the platform reads, typed, and the engine
arguments passed through as written (every other key: `engine_arguments`). A vLLM model's
engine arguments are checked against vLLM's own when the catalog loads (vllm_arguments.py);
other engines read theirs (threads, steps, device, ...) themselves.

The whole mapping (`given()`) is what a deployment's replicas receive (deployments/spec.py,
whose PLATFORM_OPTIONS names the typed fields here).
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import ConfigDict, Field

from serve_app.models.sections import Section


class VisionOptions(Section):
    """A vision model's bounds and its processor's layout (serve_app/chat/vision.py, read too
    by deployments/engines/vision.py)."""

    layout: Literal["patches", "tiles"] | None = None
    images: int | None = None
    videos: int | None = None
    video_frames: int | None = None
    video_seconds: int | float | None = None
    frame_side: int | None = None
    patch: int | None = None
    min_pixels: int | None = None
    max_pixels: int | None = None
    longest_edge: int | None = None
    tile: int | None = None
    tile_tokens: int | None = None


class EngineOptions(Section):
    """The typed settings; any other key is an engine argument (vLLM's `max_model_len` or
    `tensor_parallel_size`, a thread count, a device), passed to the engine untouched."""

    model_config = ConfigDict(extra="allow", frozen=True)

    build: str | None = None  # the weights builder (deployments/weights/registry.py)
    vision: VisionOptions | None = None
    max_seconds: int | float | None = None  # transcription: the longest audio it hears
    enforce_eager: bool | None = None  # vLLM without compiled graphs
    fair_share: bool | None = None  # false: no fair-share order at the engine
    reserved_slots: int | None = None  # sequences kept for tenants other than the busiest
    max_num_seqs: int | None = None  # a text engine's batch
    max_batch_texts: int | None = None  # an embedding engine's batch
    # The cores the replica's threads run on, indices into the cores the process may use, a
    # negative one from the last ([-1]: the last core); deployments/affinity.py.
    cpus: list[int] | None = Field(default=None, min_length=1)

    @property
    def engine_arguments(self) -> dict[str, Any]:
        """The keys not typed here, as the catalog wrote them."""
        return {key: value for key, value in self.given().items()
                if key not in type(self).model_fields}
