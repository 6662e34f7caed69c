"""One chat request as planned: its models, composed request, web context and files, what the
engine used while it answered, the most it may cost (the hold) and what it delivered."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from deployments.protocol import Chunk, TextRequest
from deployments.protocol import Usage as EngineUsage
from serve_app.accounts.key_store import KeyRecord
from serve_app.billing.pricing import Cost, price, token_units, unit_price_usd
from serve_app.chat.audio_parts import heard_line, most_seconds
from serve_app.chat.engine_request import completion_limit, prompt_estimate
from serve_app.chat.filters import CaretCitations, FilterChain, TextFilter, ThinkStripper
from serve_app.chat.media import ChatMedia
from serve_app.chat.prompt import Composition, rendered_bytes
from serve_app.chat.tools import tools_system_prompt
from serve_app.chat.vision import VisionSpec
from serve_app.chat.web import WebDocument, find_urls
from serve_app.models.catalog import CatalogModel
from serve_app.models.router import RoutedModel
from serve_app.pipeline.bill import Bill
from serve_app.schemas.chat import (
    AudioPart,
    ChatCompletionRequest,
    FilePart,
    ImagePart,
    ServiceParameters,
    VideoPart,
)

_UNREAD = (FilePart, AudioPart, ImagePart, VideoPart)  # parts the server reads for the model


@dataclass
class ProducedTokens:
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
    character_prompt: str = ""  # the character's (`character_slug`), looked up before the hold
    service_prompt: str = ""  # the service's default system prompt, when the request takes it
    searches: int = 0  # searches the provider answered
    scraped_urls: int = 0  # pages read (only those are billed)
    audio_parts: int = 0  # input_audio parts, heard by `transcriber` before the model
    transcriber: CatalogModel | None = None
    audio_data: list[bytes] | None = None  # the audio parts' bytes, decoded until heard
    heard_seconds: int = 0
    media: ChatMedia | None = None  # image and video parts, for a vision model
    usage: ProducedTokens = field(default_factory=ProducedTokens)
    answered_by: RoutedModel | None = None
    gate_wait_ms: float | None = None  # the model replica's fair-share wait (access log)
    billed: Bill | None = None  # the hold and the rate-limit count, settled once
    key: KeyRecord | None = None  # the caller (its limits count the fallbacks too)
    _rendered: tuple[ChatCompletionRequest, int] | None = field(default=None, init=False,
                                                               repr=False)

    def max_units(self, model: CatalogModel) -> dict[str, int]:
        """The most tokens this request can use on `model`, for the hold.

        A prompt cannot have more tokens than its UTF-8 bytes as the engine is sent it (tool
        calls and tool descriptions as rendered, chat/prompt.py `rendered_bytes`) plus the
        chat template's few per message, with each image or video counted as the most tokens
        its pixels make on `model` (chat/vision.py); prompts the server adds to (characters,
        web pages, transcripts) count as the whole context. The output is `max_tokens` (or
        the model's cap) for each of the `n` choices.
        """
        context = model.context_length
        req = self.req
        if self.params.character_slug or self.params.enable_web_scraping or \
                self.params.enable_web_search != "off" or self.audio_parts:
            prompt = context or 1_000_000
        else:
            prompt = self._rendered_bytes() + 16 * len(req.messages) + 2048
            if self.media is not None:  # images and videos: their tokens (never rendered)
                prompt += self.media.tokens(VisionSpec.of(model))
            prompt = min(prompt, context) if context else prompt
        output = completion_limit(req, model) or context or 4096
        return {"input": prompt, "output": output * req.n,
                "web_search": int(self.params.enable_web_search != "off"),
                "web_scraping": len(find_urls(self.query)) if self.params.enable_web_scraping
                else 0}

    def _rendered_bytes(self) -> int:
        """The request's prompt as the engine is sent it, in bytes, and its output schema
        (counted as before: the hold's margin); kept while `req` is the same."""
        req = self.req
        if self._rendered is None or self._rendered[0] is not req:
            comp = Composition(service_prompt=self.service_prompt,
                               tools_prompt=tools_system_prompt(req)
                               if self.tool_mode != "none" else "",
                               media=self.media is not None)
            size = rendered_bytes(req, comp) + len(
                req.model_dump_json(include={"response_format"}).encode())
            self._rendered = (req, size)
        return self._rendered[1]

    def floor_units(self, model: CatalogModel) -> dict[str, int]:
        """The least this request uses on `model` whatever its files, audio and media turn
        out to be: the prompt's text known before they are read (counted as the hold counts
        it, without the hold's margin) and one token of output per choice."""
        req = self.req
        messages = [m.model_copy(update={"content": [p for p in m.content
                                                     if not isinstance(p, _UNREAD)]})
                    if isinstance(m.content, list) else m for m in req.messages]
        known = req.model_copy(update={"messages": messages})
        body = known.model_dump_json(include={"messages", "tools", "response_format"})
        prompt = len(body.encode()) + 16 * len(messages)
        context = model.context_length
        return {"input": min(prompt, context) if context else prompt, "output": req.n}

    def floor_cost(self) -> Cost:
        """The hold taken before the server reads the request's files or media (the real
        one, `max_cost`, is sized from them): the dearest model's floor, and a second of each
        audio part (the least one is charged). A caller who cannot pay it is refused before
        any of them is read."""
        dearest = max((price(c.model, self.floor_units(c.model)) for c in self.candidates),
                      key=lambda cost: cost.nanos)
        return self._with_audio(dearest, self.audio_parts)

    def max_cost(self) -> Cost:
        """The hold: the dearest model's most, and the most its audio parts may be heard."""
        dearest = max((price(c.model, self.max_units(c.model)) for c in self.candidates),
                      key=lambda cost: cost.nanos)
        return self._with_audio(dearest, self.audio_parts * most_seconds(self.transcriber)
                                if self.transcriber else 0)

    def _with_audio(self, cost: Cost, seconds: int) -> Cost:
        if not seconds or self.transcriber is None:
            return cost
        return Cost(cost.model, (*cost.lines, heard_line(self.transcriber, seconds)))

    def _web_units(self, model: CatalogModel) -> dict[str, int]:
        """The searches answered and pages scraped, on the lines `model` prices."""
        used = {"web_search": self.searches, "web_scraping": self.scraped_urls}
        return {line: n for line, n in used.items() if n and unit_price_usd(model, line)}

    def cost(self) -> Cost | None:
        """What the answer measured, and the web searches and pages it used, priced for the
        model that answered (extras it does not price are left out), and the audio heard at
        the transcription model's price. Without an answer, the work done before the model
        alone (`_done_before_model`)."""
        if self.answered_by is None:
            return self._done_before_model()
        model = self.answered_by.model
        usage = self.usage
        return self._with_audio(price(model, {
            **token_units(model, usage.prompt_tokens, usage.completion_tokens,
                          usage.cached_tokens),
            **self._web_units(model)}), self.heard_seconds)

    def heard(self, seconds: int) -> None:
        """Audio parts heard so far: charged with the chat, or alone when it fails."""
        self.heard_seconds += seconds

    def _done_before_model(self) -> Cost | None:
        """For a chat no model answered: the searches the provider answered and the pages
        scraped, priced on the requested model's entry as an answered chat's would be, and
        the audio heard (None: none of that was done)."""
        model = self.candidates[0].model
        cost = self._with_audio(price(model, self._web_units(model)), self.heard_seconds)
        return cost if cost.lines else None

    def delivered(self) -> tuple[Cost | None, int]:
        """What was delivered so far and its tokens, read when the bill closes. Once a
        model answered: what it sent, with the web read and the audio heard, and the tokens
        measured. Before: what was done for the request is charged whatever the model then
        does (the web searched and scraped, audio heard), and the count is the prompt's
        estimate, as the completion counted at admission was never generated (the runner
        counts none of it when every model refused for capacity)."""
        usage = self.usage
        tokens = prompt_estimate(self.req) if self.answered_by is None else \
            usage.prompt_tokens + usage.completion_tokens
        return self.cost(), tokens

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
