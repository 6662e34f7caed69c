"""What the Gateway knows of the servers behind `engine: openai` models
(serve_app/models/upstream_states.py): read from the real text deployment holding the model,
whose server is a real one on a socket; a deployment that does not answer in time leaves the
state last heard, and `/ready`'s check answers anyway."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from deployments.protocol import Sampling, TextRequest
from deployments.text import TextDeployment
from serve_app.models.catalog import Catalog, load_catalog
from serve_app.models.upstream_states import UpstreamStates
from tests.fakes.served import class_of
from tests.fakes.upstream_server import UpstreamServer, upstream_server

MODEL = "pool-chat"


@pytest.fixture
def upstream() -> Iterator[UpstreamServer]:
    with upstream_server() as server:
        yield server


def _catalog(tmp_path: Path, upstream: UpstreamServer) -> Catalog:
    path = tmp_path / "catalog.yaml"
    path.write_text(yaml.safe_dump({"models": [{
        "id": MODEL, "type": "text", "name": "Pool chat", "deployment": "text-m",
        "engine": "openai", "size_class": "M", "context_length": 4096,
        "engine_options": {"base_url": upstream.base_url, "upstream_model": "m",
                           "failures_to_offline": 1, "probe_interval_s": 60},
        "pricing": {"input": {"usd": 1, "diem": 1}, "output": {"usd": 1, "diem": 1}}}]}))
    return load_catalog(path)


class _Method:
    """`handle.stats` of a Serve handle: `.remote()` is awaitable."""

    def __init__(self, answer: Any) -> None:
        self.answer = answer

    def remote(self) -> Any:
        return self.answer()


class Handle:
    """The deployment's handle: its `stats()` answered by the real deployment, or never."""

    def __init__(self, deployment: Any) -> None:
        self.deployment, self.hangs = deployment, False
        self.stats = _Method(self._stats)

    async def _stats(self) -> Any:
        if self.hangs:  # a replica too busy to answer
            await asyncio.Event().wait()
        return await self.deployment.stats()


async def test_the_state_is_the_replicas_and_a_deployment_that_hangs_keeps_the_last_heard(
        tmp_path, upstream):
    catalog = _catalog(tmp_path, upstream)
    [model] = catalog.models
    deployment = class_of(TextDeployment)([{
        "id": MODEL, "engine": "openai", "weights": None,
        "engine_options": model.engine_options.given()}])
    handle = Handle(deployment)
    states = UpstreamStates(catalog, {"text-m": handle}.get, max_age_s=0, timeout_s=0.2)
    assert await states.current() == {MODEL: {"online": True, "failures_in_a_row": 0}}
    assert states.is_offline(model) is False

    upstream.behaviour = "down"
    await deployment.complete(MODEL, _request())  # one failure: offline (the catalog's bound)
    assert (await states.current())[MODEL]["online"] is False
    assert states.is_offline(model) is True

    handle.hangs = True
    assert (await states.current())[MODEL]["online"] is False  # kept, not dropped


def _request() -> TextRequest:
    return TextRequest("req-1", [{"role": "user", "content": "hi"}], Sampling())
