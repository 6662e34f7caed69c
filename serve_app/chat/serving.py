"""Chat completions, engine-agnostic: plan the request (model and fallbacks, composed prompt,
sampling, output constraints), run it on the text deployment, and shape the answer as a
chat.completion object or a stream of chat.completion.chunk events."""

from __future__ import annotations

import dataclasses
import json
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any, TypeVar

from sqlalchemy.engine import Engine

from deployments.protocol import Chunk, TextEvent, TextRequest
from deployments.protocol import Usage as EngineUsage
from deployments.streaming import coalesce
from serve_app.accounts.key_store import KeyRecord
from serve_app.billing.pricing import Cost, price, token_units, unit_price_usd
from serve_app.characters import find_character
from serve_app.chat import tools as tool_calls
from serve_app.chat.engine_request import (
    admission_tokens,
    completion_limit,
    output_schema,
    prompt_estimate,
    sampling,
    service_parameters,
)
from serve_app.chat.files import FileReader, has_files
from serve_app.chat.filters import CaretCitations, FilterChain, TextFilter, ThinkStripper
from serve_app.chat.prompt import (
    Composition,
    check_capabilities,
    engine_messages,
    last_user_text,
)
from serve_app.chat.web import WebDocument, WebTools, WebUnavailable, find_urls
from serve_app.db.engine import run_in_session
from serve_app.errors import ApiError, UnsupportedFeature
from serve_app.models.calls import ModelFailed, complete_model, stream_model
from serve_app.models.catalog import Catalog, CatalogModel
from serve_app.models.router import ModelRouter, RoutedModel
from serve_app.pipeline.admission import Admission
from serve_app.pipeline.context import RequestContext
from serve_app.pipeline.settlement import Charge
from serve_app.schemas.chat import ChatCompletionRequest, ServiceParameters

T = TypeVar("T")
# Usage-priced extras of a chat, charged on its own ledger entry at the answering model's
# catalog price (`pricing.web_search` per search, `pricing.web_scraping` per page read).
WEB_LINES = ("web_search", "web_scraping")


@dataclass
class Usage:
    """What the engine produced for one request, kept current while it streams."""

    prompt_tokens: int = 0
    completion_tokens: int = 0
    cached_tokens: int = 0  # of the prompt's, served by the engine's prefix cache

    def saw(self, chunk: Chunk) -> None:
        """Count a streamed chunk: the first carries the prompt's tokens (and the cached)."""
        if chunk.prompt_tokens is not None:
            self.prompt_tokens = chunk.prompt_tokens
            self.cached_tokens = chunk.cached_tokens or 0
        self.completion_tokens += chunk.tokens

    def record(self, reported: EngineUsage) -> None:
        """Take the engine's final count (it replaces the running count of the stream)."""
        self.prompt_tokens = reported.prompt_tokens
        self.completion_tokens = reported.completion_tokens
        self.cached_tokens = reported.cached_tokens

    def as_dict(self) -> dict[str, Any]:
        return {"prompt_tokens": self.prompt_tokens,
                "completion_tokens": self.completion_tokens,
                "total_tokens": self.prompt_tokens + self.completion_tokens,
                "prompt_tokens_details": {"cached_tokens": self.cached_tokens}}


@dataclass
class ChatPlan:
    request_id: str
    req: ChatCompletionRequest
    params: ServiceParameters
    candidates: list[RoutedModel]
    engine_request: TextRequest | None  # None until planned
    tool_mode: str
    web_documents: list[WebDocument] = field(default_factory=list)
    query: str = ""  # the last user message's text (its files aside): search and scraping
    searches: int = 0  # searches the provider answered
    scraped_urls: int = 0  # pages read (only those are billed)
    usage: Usage = field(default_factory=Usage)
    answered_by: RoutedModel | None = None
    charge: Charge | None = None  # the hold and the rate-limit count, settled once
    key: KeyRecord | None = None  # the caller (its limits count the fallbacks too)

    def max_units(self, model: CatalogModel) -> dict[str, int]:
        """The most tokens this request can use on `model`, for the hold.

        A prompt cannot have more tokens than its UTF-8 bytes plus the chat template's few
        per message; prompts the server adds to (characters, web pages) count as the whole
        context. The output is `max_tokens` (or the model's cap) for each of the `n` choices.
        """
        context = model.context_length
        req = self.req
        if self.params.character_slug or self.params.enable_web_scraping or \
                self.params.enable_web_search != "off":
            prompt = context or 1_000_000
        else:
            body = req.model_dump_json(include={"messages", "tools", "response_format"})
            prompt = len(body.encode()) + 16 * len(req.messages) + 2048
            prompt = min(prompt, context) if context else prompt
        output = completion_limit(req, model) or context or 4096
        return {"input": prompt, "output": output * req.n,
                "web_search": int(self.params.enable_web_search != "off"),
                "web_scraping": len(find_urls(self.query)) if self.params.enable_web_scraping
                else 0}

    def cost(self) -> Cost | None:
        """What the answer measured, and the web searches and pages it used, priced for the
        model that answered (extras it does not price are left out)."""
        if self.answered_by is None:
            return None
        model = self.answered_by.model
        used = {"web_search": self.searches, "web_scraping": self.scraped_urls}
        usage = self.usage
        return price(model, {**token_units(model, usage.prompt_tokens,
                                           usage.completion_tokens, usage.cached_tokens),
                             **{line: n for line, n in used.items()
                                if n and unit_price_usd(model, line)}})

    async def release(self) -> None:
        """Give the hold back: the request failed before, or on our side of, the work."""
        if self.charge is not None:
            # The completion counted at admission was never generated (or not delivered).
            await self.charge.release(tokens=prompt_estimate(self.req))

    async def finish_charge(self) -> None:
        """Settle with the measured cost of what was sent, and correct the rate-limit count
        to the measured tokens."""
        if self.charge is not None:
            await self.charge.settle(self.cost(), tokens=self.usage.prompt_tokens
                                     + self.usage.completion_tokens)

    @property
    def router_label(self) -> str:
        """`x-service-model-router` of the answer: `fallback` when a fallback answered."""
        routed = self.answered_by
        assert routed is not None, "no model has answered yet"
        return "fallback" if routed is not self.candidates[0] else routed.router

    @property
    def known_tools(self) -> set[str]:
        return {t.function.name for t in self.req.tools or []}

    def output_filter(self) -> TextFilter:
        filters: list[TextFilter] = []
        if self.params.strip_thinking_response or self.params.disable_thinking:
            filters.append(ThinkStripper())
        if self.params.enable_web_citations and self.web_documents:
            filters.append(CaretCitations())
        return FilterChain(filters)


class ChatService:
    """Chat between the router and the text deployments: admitted (pipeline/admission.py),
    planned (model, fallbacks, prompt, sampling), answered unary or streamed."""

    def __init__(self, router: ModelRouter, catalog: Catalog, web: WebTools, database: Engine,
                 admission: Admission, files: FileReader) -> None:
        self.router = router
        self.catalog = catalog
        self.web = web
        self.files = files
        self.database = database
        self.admission = admission

    async def _character_prompt(self, slug: str) -> str:
        character = await run_in_session(self.database,
                                         lambda session: find_character(session, slug))
        return character.system_prompt

    async def _web_context(self, plan: ChatPlan) -> None:
        params, text = plan.params, plan.query
        if params.enable_web_scraping:
            urls = find_urls(text)
            if urls:
                plan.web_documents = await self.web.scrape(urls)
                plan.scraped_urls = len(plan.web_documents)
        if plan.web_documents or params.enable_web_search == "off":
            return  # scraped pages take the place of a search
        if not self.web.search_available:
            if params.enable_web_search == "on":
                raise UnsupportedFeature("Web search is not configured on this server",
                                         "service_parameters")
            return
        try:
            plan.web_documents = await self.web.search(text[:500])
            plan.searches = 1
        except WebUnavailable as exc:
            if params.enable_web_search == "on":
                raise ApiError(503, str(exc), code="WEB_SEARCH_UNAVAILABLE") from exc

    async def plan(self, ctx: RequestContext, key: KeyRecord,
                   req: ChatCompletionRequest) -> ChatPlan:
        """Validate, admit and plan. The limiter decides as soon as the model is known, and the
        request is checked against the model meanwhile: a refusal by the limits (429) comes before
        any error of the request. Files are read (by the extraction workers) once the limiter
        has counted the caller, and become text parts; the hold (for the model and its
        fallbacks) is then sized from that text, before any other work (characters, web
        search, the model)."""
        primary = self.router.resolve(req.model, "text")
        pending = self.admission.start(ctx, key, primary.model,
                                       admission_tokens(req, primary.model),
                                       feature_budget=True)
        try:
            candidates = [primary] + [self.router.resolve(f.model, "text")
                                      for f in req.fallbacks or []]
            params = service_parameters(req, primary.suffix_params)
            req = req.model_copy(update={"service_parameters": params})
            check_capabilities(req, primary.model)
            mode = tool_calls.tool_mode(req)
            query = last_user_text(req)
            if has_files(req):
                await pending.decided()
                with ctx.step("files"):
                    req = await self.files.inline(req)
        except BaseException as exc:
            await pending.abandon(exc)
            raise
        plan = ChatPlan(request_id=ctx.request_id, req=req, params=params, candidates=candidates,
                        engine_request=None, tool_mode=mode, key=key, query=query)
        plan.charge = await pending.hold([c.model for c in candidates], plan.max_units)
        try:
            comp = Composition(citations=params.enable_web_citations)
            if params.include_service_system_prompt:
                comp.service_prompt = self.catalog.service_system_prompt
            if params.character_slug:
                comp.character_prompt = await self._character_prompt(params.character_slug)
            if mode != "none":
                comp.tools_prompt = tool_calls.tools_system_prompt(req)
            if params.enable_web_scraping or params.enable_web_search != "off":
                await self._web_context(plan)
            comp.web_documents = plan.web_documents
            plan.engine_request = TextRequest(
                request_id=ctx.request_id,
                messages=engine_messages(req, comp),
                sampling=sampling(req, primary),
                json_schema=output_schema(req, mode),
                chat_template_kwargs={"enable_thinking": False} if params.disable_thinking
                else {},
                prompt_cache_key=req.prompt_cache_key,
            )
        except BaseException as exc:
            # Nothing ran on the model: the hold goes back (a missing character, a failed
            # web search, a client that left).
            await plan.release()
            if isinstance(exc, UnsupportedFeature):
                self.admission.unsupported_feature(ctx, key)
            raise
        return plan

    async def _first_that_answers(
            self, plan: ChatPlan,
            call: Callable[[Any, RoutedModel, TextRequest], Awaitable[T]]
    ) -> tuple[RoutedModel, T]:
        """`call(handle, model, engine request)` on each model in fallback order, until one
        answers: a model that fails or is unavailable (503) passes the request on. A fallback
        is first counted against its own per-minute limits: one whose limits refuse (429) is
        skipped like an unavailable one."""
        assert plan.engine_request is not None, "the request is not planned"
        last_error: ApiError | None = None
        for routed in plan.candidates:
            try:
                if routed is not plan.candidates[0]:
                    try:
                        await self._admit_fallback(plan, routed.model)
                    except ApiError as refused:  # by the fallback's limits (429)
                        if refused.status != 429:
                            raise
                        last_error = refused
                        continue
                handle = self.router.handle(routed.model)
                request = dataclasses.replace(plan.engine_request,
                                              sampling=sampling(plan.req, routed))
                return routed, await call(handle, routed, request)
            except ModelFailed as exc:
                last_error = exc
            except ApiError as exc:
                if exc.status != 503:
                    raise
                last_error = exc
        assert last_error is not None
        raise last_error

    async def _admit_fallback(self, plan: ChatPlan, model: CatalogModel) -> None:
        """The fallback's limits count the request (429 when they refuse)."""
        if plan.charge is None or plan.key is None:
            return
        await self.admission.admit_fallback(
            plan.charge, plan.key, model, admission_tokens(plan.req, model),
            left_tokens=prompt_estimate(plan.req))

    async def start_model_stream(self, plan: ChatPlan) -> tuple[
            RoutedModel, AsyncIterator[TextEvent], TextEvent]:
        """The first model (in fallback order) that starts answering, its stream and its
        first chunk."""
        async def start(handle: Any, routed: RoutedModel, request: TextRequest):
            stream = stream_model(handle.generate, routed.model.id, routed.model.id, request)
            return stream, await anext(stream)

        routed, (stream, first) = await self._first_that_answers(plan, start)
        return routed, stream, first

    async def run_unary(self, plan: ChatPlan) -> dict[str, Any]:
        routed, chunks = await self._first_that_answers(
            plan, lambda handle, routed, request: complete_model(
                handle.complete, routed.model.id, routed.model.id, request))
        plan.answered_by = routed
        texts: dict[int, str] = {}
        finish: dict[int, str | None] = {}
        logprobs: dict[int, list] = {}
        for chunk in chunks:
            if isinstance(chunk, EngineUsage):
                plan.usage.record(chunk)
                continue
            assert isinstance(chunk, Chunk)  # an EngineError raised in complete_model
            plan.usage.saw(chunk)
            i = chunk.index
            texts[i] = texts.get(i, "") + chunk.text
            if chunk.logprobs is not None:
                logprobs.setdefault(i, []).extend(chunk.logprobs)
            if chunk.finish_reason:
                finish[i] = chunk.finish_reason
        choices = []
        for i in sorted(texts):
            f = plan.output_filter()
            content = f.feed(texts[i]) + f.flush()
            message: dict[str, Any] = {"role": "assistant", "content": content}
            reason = finish.get(i) or "stop"
            if plan.tool_mode != "none":
                calls = tool_calls.parse_calls(content, plan.known_tools)
                if calls:
                    message = {"role": "assistant", "content": None, "tool_calls": calls}
                    reason = "tool_calls"
            if plan.params.return_search_results_as_documents and plan.web_documents:
                message.setdefault("tool_calls", []).append(
                    tool_calls.search_documents_call(_citations(plan)))
            choices.append({"index": i, "message": message, "logprobs": _choice_logprobs(
                logprobs.get(i)), "finish_reason": reason})
        response: dict[str, Any] = {
            "id": f"chatcmpl-{plan.request_id}",
            "object": "chat.completion",
            "created": int(time.time()),
            "model": routed.model.id,
            "choices": choices,
            "usage": plan.usage.as_dict(),
            "system_fingerprint": None,
        }
        if plan.web_documents:
            response["service_parameters"] = {"web_search_citations": _citations(plan)}
        return response

    async def open_stream(self, plan: ChatPlan) -> tuple[RoutedModel, AsyncIterator[str]]:
        """Start the model (fallbacks included) before the response starts, so that a failure
        to start is still an ordinary error response; then stream the rest as SSE events."""
        routed, stream, first = await self.start_model_stream(plan)
        plan.answered_by = routed
        return routed, _sse_events(plan, routed, chunks_with_first(first, stream))


def chunks_with_first(first: TextEvent, rest: AsyncIterator[TextEvent]
                      ) -> AsyncIterator[TextEvent]:
    async def gen():
        yield first
        async for chunk in rest:
            yield chunk

    return gen()


async def _queued(chunks: AsyncIterator[TextEvent]) -> AsyncIterator[TextEvent]:
    """The chunks, with those that arrived while the previous event was being written merged
    per choice: when the model outpaces this replica, one event carries several tokens."""
    async for merged in coalesce(chunks, min_interval_s=0):
        for chunk in merged:
            yield chunk


def _choice_logprobs(entries: list[dict[str, Any]] | None) -> dict[str, Any] | None:
    return {"content": entries} if entries is not None else None


def _citations(plan: ChatPlan) -> list[dict[str, str]]:
    return [d.as_dict() for d in plan.web_documents]


def _sse(payload: dict[str, Any] | str) -> str:
    data = payload if isinstance(payload, str) else json.dumps(payload, separators=(",", ":"))
    return f"data: {data}\n\n"


async def _sse_events(plan: ChatPlan, routed: RoutedModel,
                      chunks: AsyncIterator[TextEvent]) -> AsyncIterator[str]:
    base = {"id": f"chatcmpl-{plan.request_id}", "object": "chat.completion.chunk",
            "created": int(time.time()), "model": routed.model.id}

    def event(index: int, delta: dict[str, Any], finish: str | None = None,
              logprobs: list | None = None) -> str:
        return _sse({**base, "choices": [{"index": index, "delta": delta,
                                          "logprobs": _choice_logprobs(logprobs),
                                          "finish_reason": finish}]})

    filters: dict[int, TextFilter] = {}
    held: dict[int, str] = {}  # text held back while it may still be a tool call
    started: set[int] = set()
    first_call = 0  # the index of a choice's first own tool call (after the documents)
    try:
        if plan.params.include_search_results_in_stream and plan.web_documents:
            yield _sse({**base, "choices": [],
                        "service_parameters": {"web_search_citations": _citations(plan)}})
        if plan.params.return_search_results_as_documents and plan.web_documents:
            # The documents come first, as a tool call of each choice; the choice's own
            # calls (if any) follow it.
            documents = tool_calls.search_documents_call(_citations(plan))
            first_call = 1
            for i in range(plan.req.n):
                started.add(i)
                yield event(i, {"role": "assistant", "content": "",
                                "tool_calls": [dict(documents, index=0)]})
        async for chunk in _queued(chunks):
            if isinstance(chunk, EngineUsage):
                plan.usage.record(chunk)
                continue
            assert isinstance(chunk, Chunk)  # an EngineError raised in stream_model
            i = chunk.index
            plan.usage.saw(chunk)
            f = filters.setdefault(i, plan.output_filter())
            text = f.feed(chunk.text)
            if i not in started:
                started.add(i)
                yield event(i, {"role": "assistant", "content": ""})
            if plan.tool_mode != "none":
                held[i] = held.get(i, "") + text
                if plan.tool_mode == "auto" and not tool_calls.may_be_call(held[i]):
                    text, held[i] = held[i], ""
                else:
                    text = ""
            if text or chunk.logprobs:
                yield event(i, {"content": text}, logprobs=chunk.logprobs)
            if chunk.finish_reason:
                rest = held.pop(i, "") + f.flush()
                reason = chunk.finish_reason
                calls = tool_calls.parse_calls(rest, plan.known_tools) \
                    if plan.tool_mode != "none" else None
                if calls:
                    yield event(i, {"tool_calls": [dict(c, index=n) for n, c in
                                                   enumerate(calls, start=first_call)]})
                    reason = "tool_calls"
                elif rest:
                    yield event(i, {"content": rest})
                yield event(i, {}, finish=reason)
        if plan.req.stream_options and plan.req.stream_options.include_usage:
            yield _sse({**base, "choices": [], "usage": plan.usage.as_dict()})
        await plan.finish_charge()  # durable before the stream says it is done
        yield _sse("[DONE]")
    except ApiError as exc:
        # The response has started: report the failure in the stream itself. Our failure
        # is not charged.
        await plan.release()
        yield _sse({"error": exc.message, "code": exc.code})
        yield _sse("[DONE]")
    finally:
        # A client that hung up still pays for the tokens it was sent.
        await plan.finish_charge()
