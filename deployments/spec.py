"""What a model deployment is told about the models it serves.

At bind time the Gateway hands the catalog's models (serve_app's `CatalogModel`); a deployment
reads only the attributes of `ServedModel`, so this package needs nothing from serve_app.
What crosses Ray to the replicas is plain data, one `ModelSpec` per model.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, NotRequired, Protocol, TypedDict

DEFAULT_MAX_QUEUE_WAIT_S = 30.0
# Sequences a CPU text engine runs in one batch when its catalog entry does not say.
DEFAULT_MAX_NUM_SEQS = 10
# A text engine's context when its catalog entry does not say (`max_model_len`).
DEFAULT_MAX_MODEL_LEN = 2048
# The `engine_options` the platform reads itself (serve_app/models/engine_options.py types
# them); every other option of a vLLM model is one of vLLM's engine arguments, passed on.
PLATFORM_OPTIONS = frozenset({"build", "vision", "max_seconds", "enforce_eager", "fair_share",
                              "reserved_slots", "max_num_seqs", "max_batch_texts", "cpus"})
# The engine arguments that multiply the GPUs one engine runs on (vLLM spawns a worker per GPU).
PARALLEL_ARGUMENTS = ("tensor_parallel_size", "pipeline_parallel_size")
# Where the GPUs of a parallel engine are placed: on one node (tensor parallelism across
# nodes is slow; a node type must hold them all).
PARALLEL_PLACEMENT_STRATEGY = "STRICT_PACK"


class EngineOptionsView(Protocol):
    """A catalog model's engine options as the deployments read them."""

    @property
    def build(self) -> str | None:
        """The weights builder's name (deployments/weights/registry.py), if any."""
        ...

    def given(self) -> dict[str, Any]:
        """Every option as the catalog wrote it (what a replica receives)."""
        ...


class ServedModel(Protocol):
    """The attributes of a catalog model that the deployments read."""

    @property
    def id(self) -> str: ...

    @property
    def engine(self) -> str: ...

    @property
    def engine_options(self) -> EngineOptionsView: ...

    def weights_spec(self, data_dir: Path) -> str | None:
        """The weights location with `${DATA_DIR}` filled in (a path or `package:...`)."""
        ...


class ModelSpec(TypedDict):
    """One model as a replica receives it."""

    id: str
    engine: str
    weights: str | None  # a path or `package:<module>/<path>`, DATA_DIR filled in
    engine_options: dict[str, Any]
    # The longest a request may wait for its turn at the engine before it is refused with a
    # 503 (the MAX_QUEUE_WAIT_S setting; deployments/fair_share.py).
    max_queue_wait_s: NotRequired[float]


def max_queue_wait_of(spec: ModelSpec | None) -> float:
    """The longest a request for this model may wait for its turn (the default for a spec
    that does not say, or none)."""
    return spec.get("max_queue_wait_s", DEFAULT_MAX_QUEUE_WAIT_S) if spec \
        else DEFAULT_MAX_QUEUE_WAIT_S


def room_for_others(options: dict[str, Any], batch: int) -> int:
    """Sequences a text engine admits beyond its batch of `batch` (`max_num_seqs`), kept for
    tenants other than the busiest (deployments/fair_share.py): `engine_options.reserved_slots`,
    by default an eighth of the batch and at least one; none when `fair_share: false` turns
    the order off. On top of the batch, not taken from it: a tenant alone still fills the
    whole batch, so the room costs no throughput."""
    if not options.get("fair_share", True):
        return 0
    return int(options.get("reserved_slots", max(1, batch // 8)))


def gpus_per_engine(options: dict[str, Any]) -> int:
    """The GPUs one engine of these `engine_options` runs on: its tensor parallel size times
    its pipeline parallel size (1 when it names neither)."""
    gpus = 1
    for name in PARALLEL_ARGUMENTS:
        gpus *= int(options.get(name, 1))
    return gpus


def parallel_placement(ray_actor_options: dict[str, Any], gpus: int) -> dict[str, Any]:
    """The Serve options that give a replica whose engine runs on `gpus` GPUs those GPUs: one
    placement group bundle per GPU on one node, the replica itself in the first bundle with its
    CPUs (Serve places it there) and no GPU of its own (vLLM's workers, one a bundle, hold them).
    Nothing for an engine on one GPU or none: the replica's `ray_actor_options` say it all."""
    if gpus <= 1:
        return {}
    replica = {key: value for key, value in ray_actor_options.items() if key != "num_gpus"}
    first = {"CPU": float(replica.get("num_cpus", 1)), "GPU": 1.0,
             **{name: float(amount) for name, amount in (replica.get("resources") or {}).items()}}
    if replica.get("memory"):
        first["memory"] = float(replica["memory"])
    return {"ray_actor_options": replica,
            "placement_group_bundles": [first] + [{"GPU": 1.0} for _ in range(gpus - 1)],
            "placement_group_strategy": PARALLEL_PLACEMENT_STRATEGY}


def replica_options(options: dict[str, Any], models: list[ServedModel]) -> dict[str, Any]:
    """A model deployment's Serve `options` with the resources its models' engines need: a
    replica whose largest engine runs on several GPUs (`tensor_parallel_size` ...) gets them
    as placement group bundles (`parallel_placement`)."""
    gpus = max((gpus_per_engine(m.engine_options.given()) for m in models), default=1)
    return {**options, **parallel_placement(dict(options.get("ray_actor_options") or {}), gpus)}


def model_specs(models: list[ServedModel], settings: dict[str, Any]) -> list[ModelSpec]:
    """What a deployment's replicas need of each of its catalog models, as plain data (it
    crosses Ray): id, engine, weights (with DATA_DIR filled in), engine options and the
    longest wait for a turn at the engine."""
    data_dir = Path(settings["data_dir"])
    max_wait = float(settings.get("max_queue_wait_s", DEFAULT_MAX_QUEUE_WAIT_S))
    return [{"id": m.id, "engine": m.engine, "weights": m.weights_spec(data_dir),
             "engine_options": m.engine_options.given(), "max_queue_wait_s": max_wait}
            for m in models]
