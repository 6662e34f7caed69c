"""Chat completions, engine-agnostic: plan the request (model and fallbacks, files read, composed
prompt, sampling, output constraints; chat/plan.py), run it on the text deployment, and shape
the answer as a chat.completion object or a stream of chat.completion.chunk events
(chat/stream_events.py)."""

from __future__ import annotations

import dataclasses
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import AbstractAsyncContextManager
from typing import Any, TypeVar

from sqlalchemy.engine import Engine

from deployments.protocol import Chunk, TextEvent, TextRequest
from deployments.protocol import Usage as EngineUsage
from serve_app.accounts.key_store import KeyRecord
from serve_app.characters import find_character
from serve_app.chat import tools as tool_calls
from serve_app.chat.audio_parts import (
    AudioReader,
    audio_parts,
    check_audio_parts,
    decode_audio_parts,
)
from serve_app.chat.engine_request import (
    admission_tokens,
    greedy_refusal,
    output_schema,
    prefix_cache_salt,
    prompt_estimate,
    sampling,
    service_parameters,
)
from serve_app.chat.files import FileReader, has_files
from serve_app.chat.media import MediaReader, has_media
from serve_app.chat.plan import ChatPlan
from serve_app.chat.prompt import (
    Composition,
    check_capabilities,
    engine_messages,
    last_user_text,
    takes_parts,
)
from serve_app.chat.stream_events import choice_logprobs, chunks_with_first, citations, sse_events
from serve_app.chat.web import WebTools, WebUnavailable, find_urls
from serve_app.db.engine import run_in_session
from serve_app.errors import ApiError, UnsupportedFeature
from serve_app.models.calls import ModelFailed, complete_model, stream_model
from serve_app.models.catalog import Catalog, CatalogModel
from serve_app.models.router import ModelRouter, RoutedModel
from serve_app.pipeline import respond
from serve_app.pipeline.bill import Bill, BilledEvents, Mark
from serve_app.pipeline.context import RequestContext
from serve_app.pipeline.runner import RequestRunner
from serve_app.schemas.chat import ChatCompletionRequest, ServiceParameters
from serve_app.tracing import traceparent

T = TypeVar("T")
__all__ = ["ChatPlan", "ChatService", "chunks_with_first"]  # the /responses shaping uses them


class ChatService:
    """Chat between the router and the text deployments: admitted on its bill
    (pipeline/bill.py), planned (model, fallbacks, prompt, sampling), answered unary or
    streamed."""

    def __init__(self, router: ModelRouter, catalog: Catalog, web: WebTools, database: Engine,
                 runner: RequestRunner, files: FileReader, audio: AudioReader,
                 media: MediaReader) -> None:
        self.router = router
        self.catalog = catalog
        self.web = web
        self.files = files
        self.audio = audio
        self.media = media
        self.database = database
        self.runner = runner
        self.admission = runner.admission

    async def _character_prompt(self, slug: str) -> str:
        character = await run_in_session(self.database,
                                         lambda session: find_character(session, slug))
        return character.system_prompt

    def _check_web(self, params: ServiceParameters) -> None:
        if params.enable_web_search == "on" and not self.web.search_available:
            raise UnsupportedFeature("Web search is not configured on this server",
                                     "service_parameters")

    async def _web_context(self, plan: ChatPlan, account_id: str) -> None:
        params, text = plan.params, plan.query
        if params.enable_web_scraping:
            urls = find_urls(text)
            if urls:
                plan.web_documents = await self.web.scrape(urls, account_id)
                plan.scraped_urls = len(plan.web_documents)
        if plan.web_documents or params.enable_web_search == "off":
            return  # scraped pages take the place of a search
        if not self.web.search_available:  # "on" was refused before the hold
            return
        try:
            plan.web_documents = await self.web.search(text[:500])
            plan.searches = 1
        except WebUnavailable as exc:
            if params.enable_web_search == "on":
                raise ApiError(503, str(exc), code="WEB_SEARCH_UNAVAILABLE") from exc

    def _admit(self, ctx: RequestContext, key: KeyRecord, req: ChatCompletionRequest,
               primary: RoutedModel) -> AbstractAsyncContextManager[Bill]:
        """The chat's bill: its tokens (the prompt's estimate and the completion limit), the
        unsupported features' budget, and the model headers of the model that answers (set
        once it has)."""
        return self.runner.admit(ctx, key, primary, tokens=admission_tokens(req, primary.model),
                                 feature_budget=True, model_headers=False)

    async def _planned(self, ctx: RequestContext, key: KeyRecord, req: ChatCompletionRequest,
                       primary: RoutedModel, bill: Bill) -> ChatPlan:
        """The request checked (`_checked`, while the limiter decides), held for, then
        prepared (`_prepare`). A request with files or image and video parts first holds a
        floor (its known text, chat/plan.py) and reads them, then holds what they make it
        cost (`_read_inputs`); any other holds its most at once. The candidates and the model
        that hears audio parts are held for (their privacy tiers) and must run (one of the
        candidates). What was delivered is read from the plan when the bill closes."""
        plan = await self._checked(ctx, key, req, primary)
        reads = has_files(plan.req) or has_media(plan.req)
        bill.measure = plan.delivered
        await bill.hold(plan.floor_cost() if reads else plan.max_cost(),
                        fallbacks=[c.model for c in plan.candidates[1:]],
                        helpers=[plan.transcriber] if plan.transcriber else [])
        return await self._prepare(ctx, key, plan, bill)

    async def _checked(self, ctx: RequestContext, key: KeyRecord, req: ChatCompletionRequest,
                       primary: RoutedModel) -> ChatPlan:
        """Validate and plan: every cheap check (the character, web search, the fallbacks)
        comes before any work is done for the request (files read, the web searched, audio
        heard), and after the limiter's refusal (429 before 400)."""
        candidates = [primary] + [self.router.resolve(f.model, "text")
                                  for f in req.fallbacks or []]
        params = service_parameters(req, primary.suffix_params)
        req = req.model_copy(update={"service_parameters": params})
        check_capabilities(req, primary.model)
        mode = tool_calls.tool_mode(req)
        transcriber = self.audio.transcriber() if audio_parts(req) else None
        # What the engine would refuse of the sampling, the audio parts' formats and sizes,
        # a missing character, a web search the server lacks (models offline: once the hold
        # is taken, by the bill).
        refusal = greedy_refusal(req, primary)
        if refusal is not None:
            raise refusal
        check_audio_parts(req)
        character = await self._character_prompt(params.character_slug) \
            if params.character_slug else ""
        self._check_web(params)
        # fallbacks that would refuse the sampling or the image and video parts, or take
        # the request's tools otherwise than the primary (as they came, or described)
        tooled = tool_calls.uses_tools(req)
        candidates = [c for c in candidates if c is primary or (
            greedy_refusal(req, c) is None
            and (not has_media(req) or takes_parts(req, c.model))
            and (not tooled or c.model.native_tools == primary.model.native_tools))]
        return ChatPlan(request_id=ctx.request_id, req=req, params=params,
                        candidates=candidates, engine_request=None, tool_mode=mode, key=key,
                        query=last_user_text(req), audio_parts=audio_parts(req),
                        transcriber=transcriber, character_prompt=character,
                        service_prompt=self.catalog.service_system_prompt
                        if params.include_service_system_prompt else "")

    async def answer(self, ctx: RequestContext, key: KeyRecord, req: ChatCompletionRequest,
                     shape: Callable[[ChatPlan], Awaitable[T]]) -> T:
        """A unary answer on its bill: admitted, checked, held and prepared (`_planned`), then
        `shape(plan)` (the model's work, shaped); what was delivered is settled however it
        ends. The model headers name the model that answered."""
        primary = self.router.resolve(req.model, "text")
        async with self._admit(ctx, key, req, primary) as bill:
            plan = await self._planned(ctx, key, req, primary, bill)
            answer = await shape(plan)
        ctx.gate_wait_ms = plan.gate_wait_ms
        self._model_headers(ctx, plan)
        return answer

    async def stream(self, ctx: RequestContext, key: KeyRecord, req: ChatCompletionRequest,
                     start: Callable[[ChatPlan], Awaitable[AsyncIterator[str | Mark]]]
                     ) -> BilledEvents:
        """A streamed answer on its bill: admitted, checked, held and prepared, then
        `start(plan)` starts the model (fallbacks included) before the response does, so
        that a failure to start is still an ordinary error answer, and gives its events;
        from then on, the bill is the stream's, which settles it (pipeline/bill.py)."""
        primary = self.router.resolve(req.model, "text")
        async with self._admit(ctx, key, req, primary) as bill:
            plan = await self._planned(ctx, key, req, primary, bill)
            events = await start(plan)
            ctx.first_token_ms = ctx.times.elapsed_ms()  # `start` waited for the first piece
            ctx.gate_wait_ms = plan.gate_wait_ms
            self._model_headers(ctx, plan)
            return bill.stream(events)

    @staticmethod
    def _model_headers(ctx: RequestContext, plan: ChatPlan) -> None:
        assert plan.answered_by is not None, "no model has answered yet"
        respond.model_headers(ctx, plan.answered_by.model, plan.router_label)

    async def _prepare(self, ctx: RequestContext, key: KeyRecord, plan: ChatPlan,
                       bill: Bill) -> ChatPlan:
        """Once the hold is taken: the audio parts decoded, the files and media read (and
        the hold of what they make the request cost), the engine request composed (URL
        media fetched, the web searched and scraped, audio heard last). Nothing ran on the
        model yet: should any of it fail, the hold goes back but what was done is charged
        (the searches answered, the pages scraped, the audio heard: `ChatPlan.delivered`)."""
        plan.billed = bill
        if plan.transcriber is not None:  # every part's bytes, before any work is done
            plan.audio_data = decode_audio_parts(plan.req)
        if has_files(plan.req) or has_media(plan.req):
            await self._read_inputs(ctx, key, plan)
        await self._compose(ctx, key, plan)
        return plan

    async def _read_inputs(self, ctx: RequestContext, key: KeyRecord, plan: ChatPlan) -> None:
        """Read the files (by the extraction workers) and inline images and videos under the
        floor hold, then hold what they make the request cost in its place (402 when the
        account cannot pay it: the floor is then already given back)."""
        req, primary = plan.req, plan.candidates[0]
        if has_files(req):
            with ctx.step("files"):
                req = await self.files.inline(req, key.account_id)
        if has_media(req):  # a vision model's images and videos: inline ones checked
            with ctx.step("media"):
                plan.media = await self.media.collect(req, primary.model, key.account_id)
        plan.req = req
        assert plan.billed is not None, "hold the floor first"
        await plan.billed.rehold(plan.max_cost())

    async def _compose(self, ctx: RequestContext, key: KeyRecord, plan: ChatPlan) -> None:
        """The engine request, once the hold is taken: URL media fetched, the web read, audio
        heard, the character's, the tools' and the web's prompts added."""
        params, media = plan.params, plan.media
        if media is not None and media.pending:
            with ctx.step("media_fetch"):  # URLs, fetched once the hold is taken
                await self.media.fetch(media, key.account_id)
        if params.enable_web_scraping or params.enable_web_search != "off":
            await self._web_context(plan, key.account_id)
        if plan.transcriber is not None:  # last: nothing but the model may fail after it
            with ctx.step("audio"):
                plan.req = await self.audio.inline(plan.req, plan.transcriber, plan.heard,
                                                   plan.audio_data)
                plan.audio_data = None
        req = plan.req
        # A server that parses tool calls itself takes them as they came (every candidate
        # of such a request is one: `_plan`).
        native = plan.candidates[0].model.native_tools
        comp = Composition(citations=params.enable_web_citations, media=media is not None,
                           character_prompt=plan.character_prompt,
                           web_documents=plan.web_documents,
                           service_prompt=plan.service_prompt, native_tools=native)
        if plan.tool_mode != "none" and not native:
            comp.tools_prompt = tool_calls.tools_system_prompt(req)
        tools, tool_choice = tool_calls.as_given(req) if native else (None, None)
        plan.engine_request = TextRequest(
            request_id=ctx.request_id,
            messages=engine_messages(req, comp),
            sampling=sampling(req, plan.candidates[0]),
            json_schema=output_schema(req, "none" if native else plan.tool_mode),
            chat_template_kwargs={"enable_thinking": False} if params.disable_thinking
            else {},
            tools=tools,
            tool_choice=tool_choice,
            prompt_cache_key=req.prompt_cache_key,
            cache_salt=prefix_cache_salt(key.account_id),
            images=media.images if media else (),
            videos=media.videos if media else (),
            tenant=self.admission.tenant(key),
        )

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
                handle = self.router.text(routed.model)
                # The model step's span (if traced) goes with the call: the replica's spans
                # join the request's trace.
                request = dataclasses.replace(plan.engine_request,
                                              sampling=sampling(plan.req, routed),
                                              traceparent=traceparent())
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
        if plan.billed is None or plan.key is None:
            return
        await plan.billed.admit_fallback(
            self.admission, plan.key, model, admission_tokens(plan.req, model),
            left_tokens=prompt_estimate(plan.req))

    async def start_model_stream(self, plan: ChatPlan) -> tuple[
            RoutedModel, AsyncIterator[TextEvent], TextEvent]:
        """The first model (in fallback order) that starts answering, its stream and its
        first chunk."""
        async def start(handle: Any, routed: RoutedModel, request: TextRequest):
            stream = stream_model(handle.generate, routed.model.id, routed.model.id, request)
            return stream, await anext(stream)

        routed, (stream, first) = await self._first_that_answers(plan, start)
        plan.answered_by = routed
        plan.gate_wait_ms = getattr(first, "gate_wait_ms", None)
        return routed, stream, first

    async def run_unary(self, plan: ChatPlan) -> dict[str, Any]:
        routed, chunks = await self._first_that_answers(
            plan, lambda handle, routed, request: complete_model(
                handle.complete, routed.model.id, routed.model.id, request))
        plan.answered_by = routed
        plan.gate_wait_ms = next((c.gate_wait_ms for c in chunks if isinstance(c, Chunk)), None)
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
                    tool_calls.search_documents_call(citations(plan)))
            choices.append({"index": i, "message": message, "logprobs": choice_logprobs(
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
            response["service_parameters"] = {"web_search_citations": citations(plan)}
        return response

    async def completion(self, ctx: RequestContext, key: KeyRecord,
                         req: ChatCompletionRequest) -> dict[str, Any]:
        """A chat.completion object."""
        async def shape(plan: ChatPlan) -> dict[str, Any]:
            respond.content_headers(ctx)
            with ctx.step("model"):
                return await self.run_unary(plan)

        return await self.answer(ctx, key, req, shape)

    async def completion_stream(self, ctx: RequestContext, key: KeyRecord,
                                req: ChatCompletionRequest,
                                waiting: Callable[[Awaitable[Any]], Awaitable[Any]]
                                ) -> BilledEvents:
        """chat.completion.chunk events. `waiting` watches the client while the first token
        is awaited: a model queue can hold a stream for minutes, and a client that leaves
        meanwhile (ClientGone) is not charged for tokens it will never receive."""
        async def start(plan: ChatPlan) -> AsyncIterator[str | Mark]:
            respond.content_headers(ctx)
            with ctx.step("first-token"):
                routed, stream, first = await waiting(self.start_model_stream(plan))
            return sse_events(plan, routed, chunks_with_first(first, stream))

        return await self.stream(ctx, key, req, start)
