"""Text engines behind one interface: `generate(request)` takes a `TextRequest` and yields
`Chunk`s, then the final `Usage` (or an `EngineError` instead of anything else), so the
deployment and the gateway never see which engine runs. The types: deployments/protocol.py.
"""

from __future__ import annotations

import asyncio
import collections
import logging
import os
from collections.abc import AsyncIterator, Mapping
from pathlib import Path
from typing import Any, Protocol

from deployments.engines import vllm_fork_server, vllm_model_infos
from deployments.engines.cpu_flags import cpu_dtype
from deployments.engines.vision import (
    DEFAULT_FRAME_SIDE,
    MediaError,
    decoded_media,
    vision_conversation,
    vllm_vision_args,
)
from deployments.engines.vllm_compile import compile_settings
from deployments.engines.vllm_compile_fill import choose, start_fill
from deployments.protocol import Chunk, EngineError, Sampling, TextEvent, TextRequest, Usage
from deployments.spec import (
    DEFAULT_MAX_MODEL_LEN,
    DEFAULT_MAX_NUM_SEQS,
    PLATFORM_OPTIONS,
    room_for_others,
)

logger = logging.getLogger("deployments.text")


class TextEngine(Protocol):
    """An engine of the text deployment. One may also have `async def complete(request) ->
    list[TextEvent]`, the whole answer of a unary request in one call, which the deployment
    then prefers to merging its stream (a server the operator runs: one non-streamed call)."""

    max_model_len: int
    max_num_seqs: int  # sequences it runs at once: the slots of its fair-share gate

    def generate(self, request: TextRequest) -> AsyncIterator[TextEvent]: ...

    def stats(self) -> dict[str, Any]: ...

    def shutdown(self) -> None: ...


def _logprob_entries(tokenizer: Any, token_ids: list[int], logprobs: list[dict] | None,
                     top: int) -> list[dict[str, Any]] | None:
    if logprobs is None:
        return None
    entries = []
    for token_id, candidates in zip(token_ids, logprobs, strict=False):
        chosen = candidates.get(token_id)
        token = chosen.decoded_token if chosen and chosen.decoded_token is not None \
            else tokenizer.decode([token_id])
        ranked = sorted(candidates.items(), key=lambda kv: kv[1].rank or 0)[:top]
        entries.append({
            "token": token,
            "logprob": float(chosen.logprob) if chosen else float("-inf"),
            "bytes": list(token.encode("utf-8")),
            "top_logprobs": [
                {"token": (lp.decoded_token if lp.decoded_token is not None
                           else tokenizer.decode([tid])),
                 "logprob": float(lp.logprob),
                 "bytes": list((lp.decoded_token or "").encode("utf-8"))}
                for tid, lp in ranked],
        })
    return entries


def template_kwargs(request: TextRequest) -> dict[str, Any]:
    """The chat template's variables: the request's own, and its reasoning effort (a template
    that does not use a variable ignores it): "none" turns thinking off (`enable_thinking`),
    another effort is handed on as `reasoning_effort`."""
    kwargs: dict[str, Any] = {"add_generation_prompt": True, "continue_final_message": False,
                              **request.chat_template_kwargs}
    effort = request.sampling.reasoning_effort
    if effort == "none":
        kwargs.setdefault("enable_thinking", False)
    elif effort is not None:
        kwargs["reasoning_effort"] = effort
    if request.tools:
        kwargs["tools"] = request.tools
    return kwargs


def sampling_kwargs(s: Sampling) -> dict[str, Any]:
    """vLLM's sampling parameters for what the request asked (max_tokens, n and the output
    kind aside). vLLM refuses `top_p` 0 and `repetition_penalty` 0, which the API accepts: top_p
    0 keeps only the likeliest token, run as `top_k` 1 (greedy, but with n > 1 allowed, which
    vLLM refuses at temperature 0); repetition_penalty 0 is no penalty (vLLM's 1.0)."""
    params: dict[str, Any] = {
        "stop": list(s.stop) or None,
        "stop_token_ids": list(s.stop_token_ids) or None,
        "seed": s.seed,
    }
    for name in ("temperature", "top_p", "min_p", "presence_penalty", "frequency_penalty",
                 "repetition_penalty"):
        if getattr(s, name) is not None:
            params[name] = getattr(s, name)
    if s.top_k is not None:
        params["top_k"] = s.top_k if s.top_k > 0 else 0
    if s.top_p == 0:
        del params["top_p"]
        params["top_k"] = 1
    if s.repetition_penalty == 0:
        del params["repetition_penalty"]
    if s.logprobs:
        params["logprobs"] = max(1, s.top_logprobs or 0)
    return params


def vllm_engine_args(model_path: str, options: Mapping[str, Any], compiling: Mapping[str, Any],
                     max_num_seqs: int) -> Any:
    """vLLM's `AsyncEngineArgs` for a catalog model: the platform's settings (its weights, the
    dtype by the CPU, prefix caching, compact JSON, a vision model's limits), then the model's
    own engine arguments (`engine_options` beyond the platform's typed ones:
    `tensor_parallel_size`, `gpu_memory_utilization`, `quantization`, ..., checked against
    vLLM's when the catalog loaded), which win; the compile settings (`compiling`, from
    vllm_compile.py) and the batch with its fair-share room (`max_num_seqs`) are derived from
    the catalog's values and come last."""
    from vllm.config import StructuredOutputsConfig
    from vllm.engine.arg_utils import AsyncEngineArgs

    dtype = options.get("dtype", "auto")
    if dtype == "auto" and os.environ.get("VLLM_TARGET_DEVICE") == "cpu":
        dtype = cpu_dtype()
    vision = dict(options.get("vision") or {})
    platform: dict[str, Any] = {
        "model": model_path,
        "tokenizer": model_path,
        "max_model_len": DEFAULT_MAX_MODEL_LEN,
        "disable_log_stats": True,
        "seed": 0,
        # Repeated prefixes (a conversation's earlier turns, a shared system prompt) are read
        # from the KV cache instead of recomputed; their count is reported as cached_tokens
        # and billed at the cache-read price. vLLM's default for most models, set here so
        # that it stays on.
        "enable_prefix_caching": True,
        # Compact JSON under a schema: fewer tokens, and no model can pad it with endless
        # whitespace until max_tokens.
        "structured_outputs_config": StructuredOutputsConfig(
            backend="xgrammar", disable_any_whitespace=True),
        **(vllm_vision_args(vision) if vision else {}),
    }
    own = {key: value for key, value in options.items() if key not in PLATFORM_OPTIONS}
    return AsyncEngineArgs(**{**platform, **own, "dtype": dtype, **compiling,
                              "max_num_seqs": max_num_seqs})


class VLLMEngine:
    """vLLM's in-process async engine (`AsyncLLM`), streaming one delta per engine step.

    A vision model (its catalog `engine_options.vision`, deployments/engines/vision.py) also
    takes the images and videos of a request, as vLLM's multimodal data."""

    def __init__(self, model_path: str, options: dict[str, Any]) -> None:
        compiling = compile_settings(options)  # the compile cache's place, in the environment
        cache_root = os.environ.get("VLLM_CACHE_ROOT")
        if cache_root:  # what vLLM learnt of its model classes at an earlier start
            vllm_model_infos.bring(Path(cache_root))
        # vLLM's engine core imports vLLM in a fork server while this process does
        # (vllm_fork_server.py), where vLLM would import it after, in a spawned process.
        fork_server = vllm_fork_server.start()
        before_import = dict(os.environ)
        from vllm.v1.engine.async_llm import AsyncLLM

        from deployments.engines import vllm_stats  # imports vLLM's: after the fork server

        self.max_model_len = int(options.get("max_model_len", DEFAULT_MAX_MODEL_LEN))
        # The batch (`max_num_seqs`), and on top of it the room kept for tenants other than
        # the busiest (deployments/fair_share.py): the engine admits both.
        batch = int(options.get("max_num_seqs", DEFAULT_MAX_NUM_SEQS))
        self.reserved_slots = room_for_others(options, batch)
        self.max_num_seqs = batch + self.reserved_slots
        vision = dict(options.get("vision") or {})
        self.frame_side = int(vision.get("frame_side", DEFAULT_FRAME_SIDE))
        args = vllm_engine_args(model_path, options, compiling, self.max_num_seqs)
        # Eager instead while the compile cache is cold, compiled behind (vllm_compile_fill.py).
        choice = choose(args, options)
        self.compile_key = choice.key
        self.compiled = not choice.args.enforce_eager  # told by stats(): the launcher waits on it
        # vLLM's own measurements into Ray's metrics (vllm_stats.py), labelled by the model's
        # folder until the deployment names the model (`name_metrics`).
        self.metric_tags = {"model": Path(model_path).name}
        with vllm_fork_server.engine_core_forked(fork_server, before_import):
            self.engine = AsyncLLM.from_engine_args(
                choice.args, stat_loggers=vllm_stats.stat_loggers(self.metric_tags))
        if cache_root:
            vllm_model_infos.keep(Path(cache_root))
        if choice.fill and choice.key:
            logger.warning("Compile cache cold: %s runs eager; compiling it in the background "
                           "for the next start", model_path)
            self.compile_fill = start_fill(model_path, options, choice.key)
        self.tokenizer = self.engine.get_tokenizer()
        # Completion tokens of requests cancelled mid-stream (most recent last).
        self.cancelled: collections.deque[int] = collections.deque(maxlen=100)

    async def _render(self, request: TextRequest) -> dict[str, Any]:
        from vllm.renderers.params import ChatParams

        if request.images or request.videos:
            return await self._render_vision(request)
        renderer = self.engine.renderer
        chat_params = ChatParams(chat_template=None,
                                 chat_template_kwargs=template_kwargs(request))
        tok_params = renderer.default_chat_tok_params.with_kwargs(add_special_tokens=False)
        _, (engine_input,) = await renderer.render_chat_async(
            [request.messages], chat_params, tok_params)
        return engine_input

    async def _render_vision(self, request: TextRequest) -> dict[str, Any]:
        """The prompt of a request with images or videos: decoded (in a thread), the
        conversation rendered by the model's chat template with its placeholders, then
        vLLM's multimodal processing (each placeholder grows to the image's tokens)."""
        from vllm.renderers.hf import safe_apply_chat_template

        images, videos = await asyncio.to_thread(decoded_media, request.images,
                                                 request.videos, self.frame_side)
        messages, ordered = vision_conversation(request.messages, images, videos)
        kwargs = template_kwargs(request)
        tools = kwargs.pop("tools", None)
        token_ids = await asyncio.to_thread(
            safe_apply_chat_template, self.engine.model_config, self.tokenizer, messages,
            tools=tools, tokenize=True, **kwargs)
        (engine_input,) = await self.engine.renderer.render_cmpl_async(
            [{"prompt_token_ids": token_ids, "multi_modal_data": {"image": ordered}}])
        return engine_input

    def _sampling_params(self, request: TextRequest, prompt_tokens: int):
        from vllm import SamplingParams
        from vllm.sampling_params import RequestOutputKind, StructuredOutputsParams

        s = request.sampling
        room = self.max_model_len - prompt_tokens
        max_tokens = s.max_tokens
        if max_tokens is None:
            max_tokens = room
        elif max_tokens > room:
            raise _TooManyTokens(prompt_tokens, max_tokens, self.max_model_len)
        if max_tokens < 1:
            raise _TooManyTokens(prompt_tokens, 1, self.max_model_len)
        params = {"n": s.n, "max_tokens": max_tokens, "output_kind": RequestOutputKind.DELTA,
                  **sampling_kwargs(s)}
        if request.json_schema is not None:
            params["structured_outputs"] = StructuredOutputsParams(json=request.json_schema)
        return SamplingParams(**params)

    async def generate(self, request: TextRequest) -> AsyncIterator[TextEvent]:
        from vllm.exceptions import VLLMClientError

        try:
            engine_input = await self._render(request)
            if request.cache_salt:  # vLLM hashes it into the prompt's first cached block
                engine_input["cache_salt"] = request.cache_salt
            prompt_tokens = len(engine_input["prompt_token_ids"])
            params = self._sampling_params(request, prompt_tokens)
        except _TooManyTokens as exc:
            yield EngineError(400, str(exc), code="TOO_MANY_TOKENS", field="max_tokens")
            return
        except MediaError as exc:
            yield EngineError(400, str(exc), code=exc.code, field="messages")
            return
        except (ValueError, TypeError, VLLMClientError) as exc:
            # vLLM's own refusals (VLLMValidationError, e.g. n > 1 at temperature 0) are not
            # ValueErrors: without them here a client's mistake would be a 500
            yield EngineError(400, f"Invalid generation parameters: {exc}")
            return
        top = request.sampling.top_logprobs or 0
        completion = cached = 0
        first = True
        try:
            # Cancelling this generator (a client that disconnects) makes vLLM abort.
            async for out in self.engine.generate(engine_input, params, request.request_id):
                # The prompt's tokens the prefix cache served, known once it is read.
                cached = min(out.num_cached_tokens or cached, prompt_tokens)
                for choice in out.outputs:
                    completion += len(choice.token_ids)
                    # The first chunk carries the prompt's tokens: they are billed even if
                    # the client leaves mid-stream.
                    yield self._chunk(choice, params, top, (prompt_tokens, cached) if first
                                      else (None, None))
                    first = False
        except (asyncio.CancelledError, GeneratorExit):
            self.cancelled.append(completion)
            raise
        yield Usage(prompt_tokens=prompt_tokens, completion_tokens=completion,
                    cached_tokens=cached)

    def _chunk(self, choice: Any, params: Any, top: int,
               prompt: tuple[int, int] | tuple[None, None]) -> Chunk:
        """A choice's delta; `prompt`: the prompt's tokens and those cached (first chunk)."""
        return Chunk(
            index=choice.index,
            text=choice.text,
            tokens=len(choice.token_ids),
            finish_reason=choice.finish_reason,
            logprobs=_logprob_entries(self.tokenizer, list(choice.token_ids),
                                      choice.logprobs, top) if params.logprobs else None,
            prompt_tokens=prompt[0],
            cached_tokens=prompt[1],
        )

    def name_metrics(self, model_id: str) -> None:
        """Label the engine's metrics with the catalog's model id."""
        self.metric_tags["model"] = model_id

    def stats(self) -> dict[str, Any]:
        return {"unfinished": int(self.engine.get_num_unfinished_requests()),
                "cancelled_tokens": list(self.cancelled), "compiled": self.compiled}

    def shutdown(self) -> None:
        self.engine.shutdown()


class _TooManyTokens(Exception):
    def __init__(self, prompt: int, completion: int, context: int) -> None:
        super().__init__(f"The prompt has {prompt} tokens and {completion} more were asked "
                         f"for; the model's context holds {context}")


ENGINES: dict[str, type] = {"vllm": VLLMEngine}
