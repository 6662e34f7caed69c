"""A text engine that is a server the operator already runs (vLLM, SGLang, TGI, llama.cpp, a
provider): `engine: openai` in the catalog. It speaks the chat-completion convention to that
server over one pooled HTTP client and answers the same `TextEvent`s as an engine in process,
so the text deployment's fair-share gate, its queue bound and its 503 with Retry-After apply
unchanged (deployments/text.py).

The upstream's address and key stay here: no error, log line or stat names either. Its usage
report is what is billed; the chunks' own count (estimated where the server reports nothing
until the end) is what a client that leaves pays for, and its difference from the report is
logged. A server that fails `failures_to_offline` times in a row is offline: requests get a
503 at once (the Gateway tries the model's fallbacks) while a probe asks its `/models` until
it answers again.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import importlib.util
import json
import logging
import math
import os
from collections.abc import AsyncGenerator, AsyncIterator
from dataclasses import dataclass
from typing import Any

import httpx

from deployments.engines.openai_parsed import ParsedText
from deployments.engines.openai_unary import NotAChatCompletion, unary_events
from deployments.protocol import (
    Chunk,
    EngineError,
    Message,
    Sampling,
    TextEvent,
    TextRequest,
    Usage,
)
from deployments.spec import DEFAULT_MAX_MODEL_LEN

logger = logging.getLogger("deployments.openai_upstream")
# httpx and httpcore log every request's URL (INFO, DEBUG): the upstream's address is private.
for _name in ("httpx", "httpcore"):
    logging.getLogger(_name).setLevel(logging.WARNING)

ENGINE_NAME = "openai"
# Seconds a 429 or 503 of the upstream is retried after when it names no Retry-After.
DEFAULT_RETRY_AFTER_S = 2.0


@dataclass(frozen=True, slots=True)
class UpstreamSettings:
    """A model's upstream, from its catalog `engine_options` (serve_app/models/upstream.py
    checks them when the catalog loads; the defaults are here, the one place they live)."""

    base_url: str
    upstream_model: str
    api_key_env: str | None = None
    connect_timeout_s: float = 5.0
    read_timeout_s: float = 300.0  # the longest wait for the next piece of an answer
    max_concurrency: int = 16  # requests in flight to the upstream, per replica
    failures_to_offline: int = 3
    probe_interval_s: float = 10.0
    # The upstream reports usage on every chunk (vLLM and SGLang do when asked,
    # `stream_options.continuous_usage_stats`): a client that leaves pays the exact count.
    usage_every_chunk: bool = False
    max_model_len: int = DEFAULT_MAX_MODEL_LEN

    @classmethod
    def of(cls, options: dict[str, Any]) -> UpstreamSettings:
        names = set(cls.__dataclass_fields__)
        return cls(**{key: value for key, value in options.items() if key in names})

    def api_key(self) -> str | None:
        """The key, from the environment variable the catalog names (never the catalog)."""
        if not self.api_key_env:
            return None
        key = os.environ.get(self.api_key_env)
        if not key:
            raise RuntimeError(f"the upstream's key variable {self.api_key_env} is not set "
                               "in this replica's environment")
        return key


def upstream_client(settings: UpstreamSettings) -> httpx.AsyncClient:
    """The pooled client of one upstream: its key in every request's header, HTTP/2 where
    the server offers it, at most `max_concurrency` connections, no redirects followed."""
    key = settings.api_key()
    return httpx.AsyncClient(
        base_url=settings.base_url.rstrip("/") + "/",
        headers={"Authorization": f"Bearer {key}"} if key else {},
        http2=importlib.util.find_spec("h2") is not None,
        timeout=httpx.Timeout(settings.read_timeout_s, connect=settings.connect_timeout_s),
        limits=httpx.Limits(max_connections=settings.max_concurrency,
                            max_keepalive_connections=settings.max_concurrency),
        follow_redirects=False)


class UpstreamHealth:
    """Failures in a row of one upstream: past the bound it is offline until a probe of its
    `/models` answers (one probe task at a time)."""

    def __init__(self, settings: UpstreamSettings) -> None:
        self.bound = settings.failures_to_offline
        self.interval = settings.probe_interval_s
        self.failures_in_a_row = 0
        self.online = True
        self._probe: asyncio.Task[None] | None = None

    def succeeded(self) -> None:
        self.failures_in_a_row = 0
        self.online = True

    def failed(self, client: httpx.AsyncClient) -> None:
        self.failures_in_a_row += 1
        if self.online and self.failures_in_a_row >= self.bound:
            self.online = False
            logger.warning("upstream offline after %d failures in a row; probing it every "
                           "%g s", self.failures_in_a_row, self.interval)
        if not self.online and (self._probe is None or self._probe.done()):
            self._probe = asyncio.get_running_loop().create_task(self._probe_until_up(client))

    async def _probe_until_up(self, client: httpx.AsyncClient) -> None:
        while not self.online:
            await asyncio.sleep(self.interval)
            with contextlib.suppress(httpx.HTTPError):
                answer = await client.get("models")
                if answer.status_code == 200:
                    self.succeeded()
                    logger.warning("upstream answers again: online")

    def stats(self) -> dict[str, Any]:
        return {"online": self.online, "failures_in_a_row": self.failures_in_a_row}


class UpstreamFailed(Exception):
    """The upstream failed this request: `error` is the answer, `counts` whether it counts
    towards the upstream being offline (a refusal for load or a client's mistake does not)."""

    def __init__(self, error: EngineError, counts: bool) -> None:
        super().__init__(error.message)
        self.error, self.counts = error, counts


class OpenAIUpstreamEngine:
    """A `TextEngine` (deployments/engines/text.py) whose model runs on an OpenAI-compatible
    server. A streamed chat goes to it as a stream with its usage (`include_usage`), a unary
    one as one non-streamed call (`complete`, which the deployment prefers for a unary
    request). A client that leaves closes the connection either way, so the upstream stops
    generating at once."""

    def __init__(self, weights: str | None, options: dict[str, Any]) -> None:
        self.settings = settings = UpstreamSettings.of(options)
        self.max_model_len = settings.max_model_len
        # The gate's slots are the bound itself; its reserved room is taken out of them
        # (deployments/fair_share.py), so the upstream never sees more than the bound.
        self.max_num_seqs = settings.max_concurrency
        self.client = upstream_client(settings)
        self.health = UpstreamHealth(settings)
        self.in_flight = 0
        # Completion tokens of requests the client left mid-stream (most recent last).
        self.cancelled: collections.deque[int] = collections.deque(maxlen=100)

    async def generate(self, request: TextRequest) -> AsyncIterator[TextEvent]:
        refused = self._refused_at_once(request)
        if refused is not None:
            yield refused
            return
        count = _Count(prompt_estimate(request.messages))
        self.in_flight += 1
        try:
            # Closed at once when the client leaves (GeneratorExit here): so is the upstream's
            # connection, and it stops generating.
            async with contextlib.aclosing(self._stream(request, count)) as events:
                async for event in events:
                    yield event
        except UpstreamFailed as failed:
            if failed.counts:
                self.health.failed(self.client)
            yield failed.error
            return
        except (asyncio.CancelledError, GeneratorExit):
            self.cancelled.append(count.completion)
            raise
        finally:
            self.in_flight -= 1
        self.health.succeeded()
        yield count.usage()

    async def complete(self, request: TextRequest) -> list[TextEvent]:
        """The whole answer of a unary chat from one non-streamed call: a chunk per choice,
        then the usage (deployments/engines/openai_unary.py); or the error instead."""
        refused = self._refused_at_once(request)
        if refused is not None:
            return [refused]
        self.in_flight += 1
        try:
            events: list[TextEvent] = [*await self._call(request)]
        except UpstreamFailed as failed:
            if failed.counts:
                self.health.failed(self.client)
            return [failed.error]
        except asyncio.CancelledError:  # the client left: the call's connection is closed
            self.cancelled.append(0)
            raise
        finally:
            self.in_flight -= 1
        self.health.succeeded()
        return events

    def _refused_at_once(self, request: TextRequest) -> EngineError | None:
        """The answer of a request the upstream is not asked for."""
        if request.images or request.videos:
            return EngineError(400, "This model takes no images or videos", field="messages")
        if not self.health.online:
            return offline(self.settings)
        return None

    async def _call(self, request: TextRequest) -> list[Chunk | Usage]:
        answer = await post_answer(self.client, self.settings, "chat/completions",
                                   chat_body(self.settings, request, stream=False))
        try:
            return unary_events(_json(answer.content), prompt_estimate(request.messages))
        except NotAChatCompletion:
            logger.warning("upstream %s answered something else than a chat completion",
                           self.settings.upstream_model)
            raise UpstreamFailed(_bad_answer(), counts=True) from None

    async def _stream(self, request: TextRequest, count: _Count) -> AsyncGenerator[Chunk]:
        body = chat_body(self.settings, request, stream=True)
        finished = False
        try:
            async with self.client.stream("POST", "chat/completions", json=body) as answer:
                if answer.status_code != 200:
                    raise refusal(answer.status_code, await answer.aread(),
                                   answer.headers.get("retry-after"), self.settings)
                async for line in answer.aiter_lines():
                    data = _sse_data(line)
                    # After [DONE] the body is read to its end, not left: a connection left
                    # mid-body is closed, and every stream would open a new one.
                    if data is None or finished:
                        continue
                    if data == "[DONE]":
                        finished = True
                        continue
                    for chunk in count.chunks(_json(data), self.settings.usage_every_chunk):
                        yield chunk
                if not finished and not count.all_finished():
                    raise UpstreamFailed(_ended_early(), counts=True)
        except httpx.TransportError as exc:  # timeouts too
            if finished:  # the answer was whole: only its connection's end went wrong
                return
            logger.warning("upstream %s failed (%s)", self.settings.upstream_model,
                           type(exc).__name__)
            raise UpstreamFailed(_ended_early() if count.started else unreachable(exc),
                                 counts=True) from None

    def stats(self) -> dict[str, Any]:
        return {"unfinished": self.in_flight, "cancelled_tokens": list(self.cancelled),
                "upstream": self.health.stats()}

    def shutdown(self) -> None:
        """Close the pooled connections (on the loop that still runs, if any)."""
        with contextlib.suppress(RuntimeError):
            asyncio.get_running_loop().create_task(self.client.aclose())


class _Count:
    """What one answer has counted: the prompt (the upstream's figure once it gives one, an
    estimate before), each choice's tokens as delivered, and the upstream's final usage."""

    def __init__(self, prompt_estimate: int) -> None:
        self.prompt = prompt_estimate
        self.cached = 0
        self.completion = 0
        self.started = False  # a chunk went out: a failure now ends the stream
        self.finished: dict[int, bool] = {}
        self.reported: dict[str, Any] | None = None
        self.parsed = ParsedText()  # tool calls and reasoning the upstream parsed, as text

    def chunks(self, data: Any, usage_every_chunk: bool) -> list[Chunk]:
        if not isinstance(data, dict):
            raise UpstreamFailed(_ended_early() if self.started else _bad_answer(), counts=True)
        if "error" in data:  # an error reported inside the stream
            raise UpstreamFailed(_ended_early() if self.started else _bad_answer(), counts=True)
        usage = data.get("usage")
        reported_completion = None
        if isinstance(usage, dict):
            previous = (self.reported or {}).get("completion_tokens", 0)
            self.reported = usage
            self._take_prompt(usage)
            reported_completion = int(usage.get("completion_tokens") or 0) - int(previous or 0)
        made: list[Chunk] = []
        for choice in data.get("choices") or []:
            index = int(choice.get("index", 0))
            finish = choice.get("finish_reason")
            text = self.parsed.text(index, choice.get("delta"), bool(finish))
            logprobs = (choice.get("logprobs") or {}).get("content")
            if not text and not finish and not logprobs:
                continue
            if finish:
                self.finished[index] = True
            else:
                self.finished.setdefault(index, False)
            tokens = len(logprobs) if logprobs else (1 if text else 0)
            if usage_every_chunk and reported_completion is not None:
                tokens, reported_completion = reported_completion, 0
            self.completion += tokens
            first = not self.started
            self.started = True
            made.append(Chunk(index=index, text=text, tokens=tokens, finish_reason=finish,
                              logprobs=logprobs or None,
                              prompt_tokens=self.prompt if first else None,
                              cached_tokens=self.cached if first else None))
        return made

    def _take_prompt(self, usage: dict[str, Any]) -> None:
        if usage.get("prompt_tokens") is not None:
            self.prompt = int(usage["prompt_tokens"])
        details = usage.get("prompt_tokens_details") or {}
        self.cached = min(int(details.get("cached_tokens") or 0), self.prompt)

    def all_finished(self) -> bool:
        return bool(self.finished) and all(self.finished.values())

    def usage(self) -> Usage:
        """The upstream's report when it gave one (the difference from the chunks' own count
        logged), else the chunks' count."""
        if self.reported is None:
            logger.info("upstream reported no usage: billing the counted %d prompt (estimated) "
                        "and %d completion tokens", self.prompt, self.completion)
            return Usage(self.prompt, self.completion, self.cached)
        completion = int(self.reported.get("completion_tokens") or 0)
        if completion != self.completion:
            logger.info("upstream usage: %d completion tokens where the chunks counted %d",
                        completion, self.completion)
        return Usage(self.prompt, completion, self.cached)


def prompt_estimate(messages: list[Message]) -> int:
    """A prompt's tokens before the upstream counts them: about four bytes a token (the
    Gateway's own estimate, serve_app/chat/engine_request.py)."""
    return len(json.dumps(messages).encode()) // 4 + 1


def chat_body(settings: UpstreamSettings, request: TextRequest, stream: bool
              ) -> dict[str, Any]:
    """The chat-completion request the upstream receives: the composed conversation (the
    tools described in it, or with `native_tools` the client's tools and choice as they
    came), the sampling asked for, the output's schema; a stream asks for its usage (a
    non-streamed answer always has it)."""
    body: dict[str, Any] = {
        "model": settings.upstream_model,
        "messages": request.messages,
        "stream": stream,
        **({"stream_options": {"include_usage": True, **(
            {"continuous_usage_stats": True} if settings.usage_every_chunk else {})}}
           if stream else {}),
        **sampling_fields(request.sampling),
    }
    if request.json_schema is not None:
        body["response_format"] = {"type": "json_schema", "json_schema": {
            "name": "output", "schema": request.json_schema, "strict": True}}
    if request.tools:
        body["tools"] = request.tools
        if request.tool_choice is not None:
            body["tool_choice"] = request.tool_choice
    if request.chat_template_kwargs:
        body["chat_template_kwargs"] = request.chat_template_kwargs
    return body


def sampling_fields(s: Sampling) -> dict[str, Any]:
    """The request's sampling as the convention's fields; those it left unset are left to the
    upstream (TGI and providers refuse some of vLLM's extensions: only what was asked goes)."""
    fields: dict[str, Any] = {"n": s.n} if s.n != 1 else {}
    for name in ("temperature", "top_p", "top_k", "min_p", "presence_penalty",
                 "frequency_penalty", "repetition_penalty", "seed", "max_tokens",
                 "top_logprobs", "reasoning_effort"):
        value = getattr(s, name)
        if value is not None:
            fields[name] = value
    if s.stop:
        fields["stop"] = list(s.stop)
    if s.stop_token_ids:
        fields["stop_token_ids"] = list(s.stop_token_ids)
    if s.logprobs:
        fields["logprobs"] = True
    return fields


async def post_answer(client: httpx.AsyncClient, settings: UpstreamSettings, path: str,
                      body: dict[str, Any]) -> httpx.Response:
    """One non-streamed call to the upstream: its 200 answer, else `UpstreamFailed` (no
    answer at all: a 503 that counts toward offline; a refusal: as `refusal` maps it)."""
    try:
        answer = await client.post(path, json=body)
    except httpx.TransportError as exc:  # timeouts too
        logger.warning("upstream %s failed (%s)", settings.upstream_model, type(exc).__name__)
        raise UpstreamFailed(unreachable(exc), counts=True) from None
    if answer.status_code != 200:
        raise refusal(answer.status_code, answer.content, answer.headers.get("retry-after"),
                      settings)
    return answer


def _sse_data(line: str) -> str | None:
    if not line.startswith("data:"):
        return None
    return line[5:].strip()


def _json(data: str | bytes) -> Any:
    try:
        return json.loads(data)
    except ValueError:
        return None


def _ended_early() -> EngineError:
    return EngineError(500, "The model's server ended the answer early",
                       code="INFERENCE_FAILED")


def offline(settings: UpstreamSettings) -> EngineError:
    """The answer of a model whose upstream is offline (at once, until a probe answers)."""
    return EngineError(503, f"The model is offline; try again in "
                            f"{settings.probe_interval_s:.0f} s",
                       code="MODEL_OFFLINE", retry_after=settings.probe_interval_s)


def unreachable(exc: httpx.HTTPError) -> EngineError:
    """A 503 for an upstream that did not answer at all (no connection, a timeout)."""
    if isinstance(exc, httpx.TimeoutException):
        return EngineError(503, "The model did not answer in time; try again later",
                           code="MODEL_OFFLINE", retry_after=DEFAULT_RETRY_AFTER_S)
    return EngineError(503, "The model is offline; try again later", code="MODEL_OFFLINE",
                       retry_after=DEFAULT_RETRY_AFTER_S)


def _bad_answer() -> EngineError:
    return EngineError(500, "The model's server answered something else than a chat "
                            "completion", code="INFERENCE_FAILED")


def refusal(status: int, body: bytes, retry_after: str | None,
            settings: UpstreamSettings) -> UpstreamFailed:
    """The upstream's refusal as ours: a 429 or 503 is a 503 with Retry-After (the Gateway
    tries the fallbacks), a 400 or 422 stays a 400 with the upstream's message, anything else
    is our failure (logged with its status, never the upstream's address)."""
    if status in (429, 503):
        wait = _seconds(retry_after)
        return UpstreamFailed(EngineError(503, f"The model is at capacity; try again in "
                                               f"{math.ceil(wait)} s", code="MODEL_AT_CAPACITY",
                                          retry_after=wait), counts=False)
    message = _upstream_message(body, settings)
    if status in (400, 413, 422):
        return UpstreamFailed(EngineError(400, message or "The model refused the request"),
                              counts=False)
    logger.warning("upstream %s answered %d: %s", settings.upstream_model, status, message)
    return UpstreamFailed(EngineError(500, "Inference failed", code="INFERENCE_FAILED"),
                          counts=True)


def _seconds(retry_after: str | None) -> float:
    try:
        wait = float(retry_after) if retry_after else DEFAULT_RETRY_AFTER_S
    except ValueError:  # an HTTP date: not worth parsing for a few seconds
        wait = DEFAULT_RETRY_AFTER_S
    return wait if math.isfinite(wait) and wait > 0 else DEFAULT_RETRY_AFTER_S


def _upstream_message(body: bytes, settings: UpstreamSettings) -> str:
    """The message of an upstream's error body (`{"error": {"message"}}`, `{"error": "..."}`,
    `{"message"}` or `{"detail"}`), without the upstream's address or key, at most 500
    characters."""
    found: Any = _json(body.decode("utf-8", "replace"))
    if isinstance(found, dict):
        error = found.get("error", found)
        found = (error.get("message") or error.get("detail") if isinstance(error, dict)
                 else error)
    text = found if isinstance(found, str) else ""
    for private in (settings.base_url.rstrip("/"), _host(settings.base_url),
                    os.environ.get(settings.api_key_env or "") or None):
        if private:
            text = text.replace(private, "[upstream]")
    return text[:500]


def _host(url: str) -> str | None:
    try:
        return httpx.URL(url).host or None
    except httpx.InvalidURL:
        return None


ENGINES: dict[str, type] = {ENGINE_NAME: OpenAIUpstreamEngine}

