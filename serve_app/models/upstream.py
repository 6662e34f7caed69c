"""The catalog's section for a model served by a server the operator already runs
(`engine: openai`, deployments/engines/openai_upstream.py): its `engine_options` checked when
the catalog loads, so a typo, a missing field or a key variable that is not set fails the
start with the model's name instead of a replica failing later.

Fields left out take the engine's defaults (deployments/engines/openai_upstream.py,
`UpstreamSettings`), which live there only.
"""

from __future__ import annotations

import os
from typing import Any

from pydantic import Field, PositiveFloat, PositiveInt, ValidationError

from serve_app.models.sections import Section

# The engine whose `engine_options` are this section.
UPSTREAM_ENGINE = "openai"


class UpstreamOptions(Section):
    """Where the model's server is, what it calls the model, the environment variable that
    holds its key (never the key), its timeouts and how many requests it is sent at once."""

    base_url: str = Field(pattern=r"^https?://[^\s/]+(/\S*)?$")  # up to /v1
    upstream_model: str = Field(min_length=1)
    api_key_env: str | None = Field(default=None, pattern=r"^[A-Za-z_][A-Za-z0-9_]*$")
    connect_timeout_s: PositiveFloat | None = None
    read_timeout_s: PositiveFloat | None = None
    max_concurrency: PositiveInt | None = None
    failures_to_offline: PositiveInt | None = None
    probe_interval_s: PositiveFloat | None = None
    usage_every_chunk: bool | None = None
    max_model_len: PositiveInt | None = None
    # The server parses tool calls itself (vLLM's `--enable-auto-tool-choice` with a
    # `--tool-call-parser`, SGLang's `--tool-call-parser`, TGI, a provider): the client's
    # tools, `tool_choice` and the conversation's calls and results go to it in the
    # convention's form. Off: they are described in the conversation, as for every model.
    native_tools: bool | None = None


def upstream_problems(model_id: str, arguments: dict[str, Any]) -> list[str]:
    """What is wrong with an `engine: openai` model's engine options (`arguments`: those the
    platform does not type itself), each naming the model; none when they are whole."""
    try:
        options = UpstreamOptions.model_validate(arguments)
    except ValidationError as exc:
        return [f"model {model_id!r}: engine_options.{'.'.join(map(str, e['loc']))}: "
                f"{_said(e)}" for e in exc.errors()]
    if options.api_key_env and not os.environ.get(options.api_key_env):
        return [f"model {model_id!r}: engine_options.api_key_env names "
                f"{options.api_key_env}, which is not set in the environment"]
    return []


def _said(error: Any) -> str:
    if error["type"] == "extra_forbidden":
        return "not an option of an openai engine"
    return str(error["msg"])
