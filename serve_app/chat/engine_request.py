"""What a chat request asks of the engine, derived from the request and its model: the
service parameters (body over model-name suffix), the sampling, the output's JSON schema, the
account's prefix-cache salt, and the token counts admission needs (the prompt's estimate, the
completion limit)."""

from __future__ import annotations

import hashlib
from typing import Any

from deployments.protocol import Sampling
from serve_app.chat import tools as tool_calls
from serve_app.chat.media import PART_TOKENS_ESTIMATE, media_payload
from serve_app.errors import ApiError, invalid_request
from serve_app.models.catalog import CatalogModel
from serve_app.models.router import RoutedModel
from serve_app.schemas.chat import ChatCompletionRequest, ServiceParameters


def service_parameters(req: ChatCompletionRequest, suffix: dict[str, Any]) -> ServiceParameters:
    """Body values win over the same parameters given as a model-name suffix."""
    merged = {**suffix, **req.service_parameters.model_dump(
        exclude_unset=True, exclude_defaults=False)}
    try:
        return ServiceParameters.model_validate(merged)
    except Exception as exc:
        raise ApiError(400, f"Invalid model suffix parameters: {exc}",
                       code="INVALID_REQUEST") from exc


def prefix_cache_salt(account_id: str) -> str:
    """The engine's prefix cache is shared by every tenant of a replica, and a prompt's
    `cached_tokens` would tell one tenant what another sent: the engine keeps each account's
    cached prefixes under its own salt. A hash of the account's id (the id itself never
    reaches the engine or its cache events), the same on every replica."""
    return hashlib.sha256(f"prefix-cache:{account_id}".encode()).hexdigest()[:32]


def sampling(req: ChatCompletionRequest, routed: RoutedModel) -> Sampling:
    model = routed.model
    defaults = model.text_constraints
    temperature = req.temperature if req.temperature is not None else defaults.default_temperature
    if temperature is not None:
        # min_temp/max_temp bound the sampling temperature.
        if req.min_temp is not None:
            temperature = max(temperature, req.min_temp)
        if req.max_temp is not None:
            temperature = min(temperature, req.max_temp)
    max_tokens = completion_limit(req, model)
    return Sampling(
        temperature=temperature,
        top_p=req.top_p if req.top_p is not None else defaults.default_top_p,
        top_k=req.top_k, min_p=req.min_p,
        presence_penalty=req.presence_penalty, frequency_penalty=req.frequency_penalty,
        repetition_penalty=req.repetition_penalty, seed=req.seed,
        stop=tuple(req.stop_list or ()), stop_token_ids=tuple(req.stop_token_ids or ()),
        max_tokens=max_tokens, n=req.n,
        logprobs=bool(req.logprobs), top_logprobs=req.top_logprobs,
        reasoning_effort=reasoning_effort(req, model),
    )


# vLLM's `_SAMPLING_EPS`: a temperature below it samples greedily, and it then refuses n > 1.
GREEDY_TEMPERATURE = 1e-5


def greedy_refusal(req: ChatCompletionRequest, routed: RoutedModel) -> ApiError | None:
    """The 400 the engine would answer for `n` > 1 at temperature 0 (every choice would be the
    same greedy answer), found from the request alone, before any work is done for it."""
    asked = sampling(req, routed)
    if asked.n > 1 and asked.temperature is not None and asked.temperature < GREEDY_TEMPERATURE:
        return invalid_request(f"n must be 1 at temperature 0 on {routed.model.id} (greedy "
                               f"sampling gives one answer): set a temperature, or n: 1", "n")
    return None


def reasoning_effort(req: ChatCompletionRequest, model: CatalogModel) -> str | None:
    """The reasoning effort `model` is asked for: `reasoning_effort` over `reasoning.effort`
    (as the reference), `reasoning.enabled: false` as "none"; None when the model does not
    reason (the request's reasoning is then ignored, as the reference ignores it) or the
    request leaves it to the model. An effort other than "none" reaches only a model that
    takes one (`supportsReasoningEffort`)."""
    caps = model.capabilities
    if not caps.get("supportsReasoning"):
        return None
    reasoning = req.reasoning
    effort = req.reasoning_effort or (reasoning.effort if reasoning else None)
    if effort is None and reasoning is not None and reasoning.enabled is False:
        effort = "none"
    if effort not in (None, "none") and not caps.get("supportsReasoningEffort"):
        return None
    return effort


def output_schema(req: ChatCompletionRequest, mode: str) -> dict[str, Any] | None:
    if mode == "forced":
        return tool_calls.forced_call_schema(req)
    fmt = req.response_format
    if fmt is None or fmt.type == "text":
        return None
    if fmt.type == "json_object":
        return {"type": "object"}
    return fmt.json_schema.schema_ if fmt.json_schema else None


def prompt_estimate(req: ChatCompletionRequest) -> int:
    """Tokens of a prompt before it is tokenised: about four bytes per token; an image or
    video part counts as a large image's tokens, not its data's bytes (chat/media.py)."""
    media_chars, media_parts = media_payload(req)
    return (len(req.model_dump_json(include={"messages"}).encode()) - media_chars) // 4 + 1 \
        + media_parts * PART_TOKENS_ESTIMATE


def completion_limit(req: ChatCompletionRequest, model: CatalogModel) -> int | None:
    """The most tokens one choice may generate on `model`: the request's `max_tokens` (or
    `max_completion_tokens`) capped by the model's, the model's cap when the request sets
    none; None: no limit but the context."""
    limit = req.completion_limit
    if model.max_completion_tokens:
        limit = min(limit or model.max_completion_tokens, model.max_completion_tokens)
    return limit


def admission_tokens(req: ChatCompletionRequest, model: CatalogModel) -> int:
    """The tokens a request counts toward tokens-per-minute when admitted: the prompt's
    estimate plus the most the answer may generate (the completion limit, or the context
    length when there is none, for each of the `n` choices), so that a key cannot ask for more
    than its limit in one request. After the answer the count is corrected to the measured
    total; a request that fails keeps only its prompt estimate counted."""
    output = completion_limit(req, model) or model.context_length or 0
    return prompt_estimate(req) + output * req.n
