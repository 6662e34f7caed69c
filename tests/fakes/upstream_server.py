"""A real OpenAI-compatible server on a socket (127.0.0.1, a free port), standing in for the
engines an operator already runs (vLLM's, SGLang's, TGI's server): `engine: openai` models
talk to it over HTTP exactly as they would to those.

It answers `/v1/chat/completions` as a stream of chunks (the reply's words, one token each,
then the usage when `stream_options.include_usage` asks) or, with `stream` false, as one
chat completion (`n` choices of the reply, its words' logprobs when asked, the usage unless
`report_usage` is off), `/v1/embeddings` (vectors of EMBEDDING_DIMENSIONS, not unit length,
and a usage of each input's words plus two, summed) and `/v1/models`. `behaviour` sets
how it answers next: "ok", a status to refuse with ("429", "503", "400", "500"), "cut" (the
connection drops after `cut_after` words; a non-streamed answer's body is cut in half),
"slow" (a word every `slow_interval_s`, many words; a non-streamed answer never comes: a
client that leaves is seen as `left`), "malformed" (a 200 whose body is no chat
completion), "down" (every path answers 500, `/models` too).
"""

from __future__ import annotations

import asyncio
import json
import threading
from collections.abc import AsyncIterator, Iterator
from contextlib import contextmanager
from typing import Any

import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

REPLY = "Hello from the upstream server, one word at a time."
PROMPT_TOKENS = 17  # what the server reports of every prompt
CACHED_TOKENS = 5
EMBEDDING_DIMENSIONS = 3


def embedding_tokens(text: str) -> int:
    """What the server reports of one input's tokens."""
    return len(text.split()) + 2


class UpstreamServer:
    """The server's state: what it was sent, how it answers next, and what it saw."""

    def __init__(self) -> None:
        self.behaviour = "ok"
        self.reply = REPLY
        self.cut_after = 3
        self.slow_interval_s = 0.02
        self.retry_after: str | None = "7"
        self.report_usage = True  # a non-streamed answer's usage
        # What a server with its own tool or reasoning parser answers in place of the reply:
        # the deltas of a stream (each its own chunk, the last finishing with `parsed_finish`)
        # and the message of a non-streamed answer.
        self.parsed_deltas: list[dict[str, Any]] | None = None
        self.parsed_message: dict[str, Any] | None = None
        self.parsed_finish = "tool_calls"
        self.bodies: list[dict[str, Any]] = []
        self.authorizations: list[str | None] = []
        self.client_ports: list[int | None] = []  # one port per connection the client opened
        self.left = threading.Event()  # a client left a slow stream: it stopped generating
        self.base_url = ""
        self.app = Starlette(routes=[
            Route("/v1/chat/completions", self._chat, methods=["POST"]),
            Route("/v1/embeddings", self._embeddings, methods=["POST"]),
            Route("/v1/models", self._models, methods=["GET"]),
        ])

    async def _models(self, request: Request) -> Response:
        if self.behaviour == "down":
            return JSONResponse({"error": {"message": "down"}}, status_code=500)
        return JSONResponse({"object": "list", "data": [{"id": "upstream-model"}]})

    async def _chat(self, request: Request) -> Response:
        body = await request.json()
        refused = self._refused(request, body)
        if refused is not None:
            return refused
        if not body.get("stream"):
            return await self._completion(request, body, self.behaviour)
        return StreamingResponse(self._chunks(body, self.behaviour),
                                 media_type="text/event-stream")

    async def _completion(self, request: Request, body: dict[str, Any], behaviour: str
                          ) -> Response:
        """A non-streamed answer: `n` choices of the reply (cut to `max_tokens` words)."""
        if behaviour == "slow":  # generating until the client leaves (vLLM's server stops)
            while not await request.is_disconnected():
                await asyncio.sleep(self.slow_interval_s)
            self.left.set()
            return Response(status_code=499)
        if behaviour == "malformed":
            return JSONResponse({"object": "chat.completion", "detail": "no choices here"})
        words, finish = _words(self.reply, body.get("max_tokens"))
        logprobs = ({"content": [{"token": word, "logprob": -0.5, "bytes": [],
                                  "top_logprobs": []} for word in words]}
                    if body.get("logprobs") else None)
        n = int(body.get("n") or 1)
        message = {"role": "assistant", "content": "".join(words)}
        if self.parsed_message is not None:
            message, finish = {"role": "assistant", **self.parsed_message}, self.parsed_finish
        answer = {"id": "chatcmpl-up", "object": "chat.completion", "created": 1,
                  "model": body.get("model"),
                  "choices": [{"index": i, "message": message,
                               "logprobs": logprobs, "finish_reason": finish}
                              for i in range(n)]}
        if self.report_usage:
            answer["usage"] = _usage(n * len(words))
        text = json.dumps(answer)
        if behaviour == "cut":
            text = text[:len(text) // 2]
        return Response(text, media_type="application/json")

    async def _embeddings(self, request: Request) -> Response:
        body = await request.json()
        refused = self._refused(request, body)
        if refused is not None:
            return refused
        texts = body["input"] if isinstance(body["input"], list) else [body["input"]]
        data = [{"object": "embedding", "index": i,
                 "embedding": [float(len(text)), 1.0, float(i)]}
                for i, text in reversed(list(enumerate(texts)))]  # any order: index says
        tokens = sum(embedding_tokens(text) for text in texts)
        return JSONResponse({"object": "list", "data": data, "model": body.get("model"),
                             "usage": {"prompt_tokens": tokens, "total_tokens": tokens}})

    def _refused(self, request: Request, body: dict[str, Any]) -> Response | None:
        """Records the request; the refusal `behaviour` asks for, if any."""
        self.bodies.append(body)
        self.authorizations.append(request.headers.get("authorization"))
        self.client_ports.append(request.client.port if request.client else None)
        behaviour = self.behaviour
        if behaviour == "down":
            return JSONResponse({"error": {"message": "engine dead"}}, status_code=500)
        if behaviour.isdigit():
            headers = {"Retry-After": self.retry_after} if self.retry_after else {}
            message = (f"max_tokens is too large for http://127.0.0.1:{request.url.port}"
                       if behaviour == "400" else f"refused with {behaviour}")
            return JSONResponse({"object": "error", "message": message, "type": "BadRequest",
                                 "code": int(behaviour)}, status_code=int(behaviour),
                                headers=headers)
        return None

    async def _chunks(self, body: dict[str, Any], behaviour: str) -> AsyncIterator[str]:
        words, finish = _words(self.reply * (200 if behaviour == "slow" else 1),
                               body.get("max_tokens"))
        every = bool((body.get("stream_options") or {}).get("continuous_usage_stats"))
        base = {"id": "chatcmpl-up", "object": "chat.completion.chunk", "created": 1,
                "model": body.get("model")}

        def sse(data: dict[str, Any]) -> str:
            return f"data: {json.dumps(data)}\n\n"

        yield sse({**base, "choices": [{"index": 0, "delta": {"role": "assistant",
                                                               "content": ""},
                                        "finish_reason": None}]})
        if self.parsed_deltas is not None:
            for n, delta in enumerate(self.parsed_deltas, start=1):
                last = n == len(self.parsed_deltas)
                yield sse({**base, "choices": [{"index": 0, "delta": delta, "finish_reason":
                                                self.parsed_finish if last else None}]})
            words = [""] * len(self.parsed_deltas)  # one token a delta, for the usage
        try:
            for n, word in enumerate([] if self.parsed_deltas is not None else words, start=1):
                if behaviour == "cut" and n > self.cut_after:
                    raise ConnectionResetError("the upstream's engine died")
                if behaviour == "slow":
                    await asyncio.sleep(self.slow_interval_s)
                last = n == len(words)
                yield sse({**base, "choices": [{"index": 0, "delta": {"content": word},
                                                "finish_reason": finish if last else None}],
                           **({"usage": _usage(n)} if every else {})})
        except asyncio.CancelledError:
            self.left.set()
            raise
        if (body.get("stream_options") or {}).get("include_usage"):
            yield sse({**base, "choices": [], "usage": _usage(len(words))})
        yield "data: [DONE]\n\n"


def _words(reply: str, limit: int | None) -> tuple[list[str], str]:
    """The reply's words (one token each, with their spaces), cut to `limit`, and the finish
    reason."""
    words = reply.split(" ")
    words = [w + " " for w in words[:-1]] + words[-1:]
    if limit is not None and len(words) > limit:
        return words[:limit], "length"
    return words, "stop"


def _usage(completion: int) -> dict[str, Any]:
    return {"prompt_tokens": PROMPT_TOKENS, "completion_tokens": completion,
            "total_tokens": PROMPT_TOKENS + completion,
            "prompt_tokens_details": {"cached_tokens": CACHED_TOKENS}}


@contextmanager
def upstream_server() -> Iterator[UpstreamServer]:
    """The server, listening on 127.0.0.1 in a thread of its own until the block ends."""
    server = UpstreamServer()
    config = uvicorn.Config(server.app, host="127.0.0.1", port=0, log_level="warning",
                            lifespan="off")
    runner = uvicorn.Server(config)
    thread = threading.Thread(target=runner.run, daemon=True)
    thread.start()
    while not runner.started:
        if not thread.is_alive():
            raise RuntimeError("the upstream server did not start")
        threading.Event().wait(0.01)
    port = runner.servers[0].sockets[0].getsockname()[1]
    server.base_url = f"http://127.0.0.1:{port}/v1"
    try:
        yield server
    finally:
        runner.should_exit = True
        thread.join(timeout=10)
