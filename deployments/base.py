"""What every model deployment shares: the engines of the models it serves, by model id, loaded
the same way (weights built first when the catalog says how).

A family's deployment subclasses `ModelDeployment`, names its engines in `ENGINES` and looks
an engine up with `self.engines.get(model_id)`, answering `not_served(model_id)`
(deployments/protocol.py) when there is none. Its Serve options are in
configs/deployments.yaml (deployments/registry.py).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from typing import Any, ClassVar

from deployments.affinity import pin_process, replica_cpus
from deployments.gil import hand_over_the_gil_quickly
from deployments.priority import lower_cpu_priority
from deployments.spec import ModelSpec
from deployments.weights.registry import engine_weights

logger = logging.getLogger("deployments")

# An engine class: `(weights path or None, options) -> engine`.
EngineFactory = Callable[[str | None, dict[str, Any]], Any]


def load_engines(specs: list[ModelSpec], engines: Mapping[str, EngineFactory]
                 ) -> dict[str, Any]:
    """One engine per model spec, `engines[name](weights path or None, options)`, with the
    weights built first when the catalog says how (`build`, not passed on to the engine); None:
    the engine's own default (weights shipped in a package)."""
    loaded = {}
    for spec in specs:
        options = {k: v for k, v in spec["engine_options"].items() if k not in ("build", "cpus")}
        path = engine_weights(spec["engine"], spec["weights"], spec["engine_options"])
        loaded[spec["id"]] = engines[spec["engine"]](str(path) if path else None, options)
        logger.info("model %s (%s) loaded from %s", spec["id"], spec["engine"],
                    path or "its package")
    return loaded


class ModelDeployment:
    """The base of every model deployment: `engines`, by model id."""

    ENGINES: ClassVar[Mapping[str, EngineFactory]] = {}

    def __init__(self, models: list[ModelSpec]) -> None:
        hand_over_the_gil_quickly()  # engines run in worker threads beside the event loop
        lower_cpu_priority()  # behind the request path (ENGINE_NICENESS), before engines start
        cpus = replica_cpus(spec["engine_options"] for spec in models)  # refused before loading
        self.engines: dict[str, Any] = load_engines(models, self.ENGINES)
        if cpus:
            pin_process(cpus)  # engine_options.cpus: every thread, the engines' included
