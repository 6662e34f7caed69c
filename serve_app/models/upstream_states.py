"""Whether the server behind each `engine: openai` model answers, as the Gateway last heard it.

The model's replica keeps that state (deployments/engines/openai_upstream.py: offline after
`failures_to_offline` failures in a row, online again once a probe of the server's `/models`
answers) and shows it in its deployment's `stats()` under `upstream`. The Gateway asks for
it when something wants to know and what it holds is older than `max_age_s`: `/ready` waits
for the answer and names an offline model; `GET /models` answers at once with what is held
and has it asked again in the background. Nothing is asked while nobody looks, and a
catalog without such models asks nothing at all.

With several replicas of a deployment, the state is that of the replica that answered.
"""

from __future__ import annotations

import asyncio
import logging
import math
import time
from collections.abc import Callable
from typing import Any

from serve_app.models.catalog import Catalog, CatalogModel
from serve_app.models.upstream import UPSTREAM_ENGINE

logger = logging.getLogger("serve_app.models.upstream_states")

# How old a state may be before a reader has it asked again, and how long one asking waits
# for a deployment (asked together; one that does not answer in time keeps its last state).
MAX_AGE_S = 5.0
ASK_TIMEOUT_S = 1.0

# A deployment by name -> its handle, or None where this application does not run it.
Handles = Callable[[str], Any | None]


class UpstreamStates:
    """The last heard `upstream` stats of each `engine: openai` model, by model id."""

    def __init__(self, catalog: Catalog, handles: Handles, *, max_age_s: float = MAX_AGE_S,
                 timeout_s: float = ASK_TIMEOUT_S) -> None:
        self._models = [m for m in catalog.models if m.engine == UPSTREAM_ENGINE]
        self._handles = handles
        self._max_age_s = max_age_s
        self._timeout_s = timeout_s
        self._states: dict[str, dict[str, Any]] = {}
        self._asked_at = -math.inf
        self._asking: asyncio.Task[dict[str, dict[str, Any]]] | None = None

    @property
    def models(self) -> list[CatalogModel]:
        return list(self._models)

    def is_offline(self, model: CatalogModel) -> bool:
        """What was last heard (never waits); has it asked again when it is old."""
        if model.engine != UPSTREAM_ENGINE:
            return False
        if time.monotonic() - self._asked_at > self._max_age_s:
            self._ask_in_background()
        return self._states.get(model.id, {}).get("online") is False

    def held(self) -> dict[str, dict[str, Any]]:
        """What was last heard, without asking."""
        return dict(self._states)

    async def current(self) -> dict[str, dict[str, Any]]:
        """Each such model's state (`{"online": bool, "failures_in_a_row": int}`), asked now
        unless what is held is recent; a model whose deployment did not answer is left out."""
        if time.monotonic() - self._asked_at <= self._max_age_s:
            return dict(self._states)
        if self._asking is None or self._asking.done():
            self._asking = asyncio.get_running_loop().create_task(self._ask())
        return dict(await asyncio.shield(self._asking))

    def _ask_in_background(self) -> None:
        if self._asking is not None and not self._asking.done():
            return
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:  # no loop here (a synchronous caller): the next reader asks
            return
        self._asking = loop.create_task(self._ask())

    async def _ask(self) -> dict[str, dict[str, Any]]:
        by_deployment: dict[str, list[CatalogModel]] = {}
        for model in self._models:
            by_deployment.setdefault(model.deployment, []).append(model)
        heard = dict(self._states)  # a deployment that does not answer keeps its last state
        answers = await asyncio.gather(*(self._stats(d) for d in by_deployment))
        for models, stats in zip(by_deployment.values(), answers, strict=True):
            if stats is None:
                continue
            for model in models:
                state = stats.get(model.id, {}).get("upstream")
                if isinstance(state, dict):
                    heard[model.id] = state
                else:
                    heard.pop(model.id, None)
        self._states = heard
        self._asked_at = time.monotonic()
        return heard

    async def _stats(self, deployment: str) -> dict[str, Any] | None:
        handle = self._handles(deployment)
        if handle is None:
            return None
        try:
            return dict(await asyncio.wait_for(handle.stats.remote(), self._timeout_s) or {})
        except Exception as exc:  # a deployment that does not answer: its state unknown
            logger.warning("deployment %s did not report its models' servers (%s)",
                           deployment, type(exc).__name__)
            return None
