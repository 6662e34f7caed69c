"""What the deployment files must agree on with a Serve config: the resources each deployment's
replica asks Ray for, and how long its longest stream lasts."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ray.serve.schema import ServeDeploySchema

from serve_app.models.catalog import load_catalog
from serve_app.settings import Settings

# The slowest rate one stream was measured to decode at in the docs: 8 streams sharing 64
# tokens/s (bfloat16 on AVX2 kernels, docs/models/adding-a-model.md).
SLOWEST_STREAM_TOKENS_PER_S = 64 / 8
# Deployments whose replicas hold a stream from its first token to its last.
STREAMING_DEPLOYMENTS = ("Gateway", "text-xs", "text-s", "text-m", "text-l")


def deployments(serve_config: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """The options of the one application's deployments, by name, checked by Serve's schema."""
    (app,) = ServeDeploySchema.model_validate(serve_config).applications
    return {d.name: d.model_dump(exclude_unset=True) for d in app.deployments}


def replica_resources(options: dict[str, Any]) -> tuple[float, float]:
    """(CPUs, GPUs) one replica reserves: its placement group's bundles where it has them
    (a tensor parallel text class, on one node), else its own; Serve's default is one CPU
    and no GPU."""
    bundles = options.get("placement_group_bundles")
    if bundles:
        return (float(sum(b.get("CPU", 0) for b in bundles)),
                float(sum(b.get("GPU", 0) for b in bundles)))
    actor = options.get("ray_actor_options", {})
    return float(actor.get("num_cpus", 1)), float(actor.get("num_gpus", 0))


def longest_stream_s(catalog: Path) -> float:
    """The longest a chat stream of this catalog may last: the longest wait for its turn at a
    busy engine (MAX_QUEUE_WAIT_S), then its most tokens at the slowest measured rate."""
    bounds = {model.id: model.max_completion_tokens or model.context_length
              for model in load_catalog(catalog).models if model.deployment.startswith("text-")}
    unbounded = [name for name, tokens in bounds.items() if tokens is None]
    assert not unbounded, f"chat models with no bound on a stream's tokens: {unbounded}"
    most_tokens = max(tokens for tokens in bounds.values() if tokens is not None)
    return Settings().max_queue_wait_s + most_tokens / SLOWEST_STREAM_TOKENS_PER_S
