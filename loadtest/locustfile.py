"""Locust scenarios against a running platform (a laptop or a cluster), one user class per
endpoint family, weighted into a mix of what clients of such a platform do. Run by
`loadtest/run.py` (`make loadtest`), which prepares the account and keys, runs Locust
headless with CSV and HTML reports, and reconciles the ledger afterwards.

Every answer the clients see is written to `LOADTEST_RECORD` (one JSON line per request: its
`CF-RAY`, route, status and the usage it reported), so the reconciliation can match the
ledger to what clients were told. Streamed chat reports time to first token and tokens per
second as their own rows (`METRIC` type).

    LOADTEST_KEYS=keys.json LOADTEST_RECORD=record.jsonl locust -f loadtest/locustfile.py ...
"""

from __future__ import annotations

import base64
import io
import itertools
import json
import os
import random
import threading
import time
from pathlib import Path
from typing import Any

from locust import HttpUser, between, events, task

KEYS: dict[str, Any] = json.loads(Path(os.environ["LOADTEST_KEYS"]).read_text()) \
    if os.environ.get("LOADTEST_KEYS") else {"inference": [os.environ.get("API_KEY", "")],
                                             "admin": os.environ.get("ADMIN_KEY", "")}
MODELS: dict[str, str] = {"chat": "default", "embedding": "default", "speech": "tts-1",
                          "video": "default", "audio_job": "default",
                          **KEYS.get("models", {})}
_inference = itertools.cycle(KEYS["inference"])
_record_lock = threading.Lock()
# one file for the whole run, appended to by every user of this process
_record = open(os.environ["LOADTEST_RECORD"], "a", encoding="utf-8") \
    if os.environ.get("LOADTEST_RECORD") else None  # noqa: SIM115
WORDS = ["river", "stone", "lantern", "orchard", "harbor", "meadow", "copper", "violet",
         "signal", "window", "garden", "letter", "engine", "winter", "summer", "market"]


def _png(size: int = 256) -> str:
    from PIL import Image, ImageDraw

    image = Image.new("RGB", (size, size), (40, 90, 160))
    ImageDraw.Draw(image).ellipse((size // 4, size // 4, 3 * size // 4, 3 * size // 4),
                                  fill=(220, 180, 40))
    out = io.BytesIO()
    image.save(out, "PNG")
    return base64.b64encode(out.getvalue()).decode()


PNG = _png()


def record(resp: Any, route: str, usage: dict | None = None, wallet: str | None = None,
           payer: str | None = None, **extra: Any) -> None:
    """One line per answer, for the reconciliation (`wallet`: the payer, when not a key;
    `payer`: the label of an account other than the prepared one; `extra`: what else the
    reconciliation reads, such as a background response's id)."""
    if _record is None:
        return
    answer = {"cf_ray": resp.headers.get("CF-RAY"), "route": route,
              "status": resp.status_code, "usage": usage or {}, "t": time.time(), **extra}
    if wallet:
        answer["wallet"] = wallet
    if payer:
        answer["payer"] = payer
    if resp.status_code >= 400:  # a refusal: its code, and when it said to come back
        answer["code"] = _error_code(resp)
        if "Retry-After" in resp.headers:
            answer["retry_after"] = resp.headers["Retry-After"]
    with _record_lock:
        _record.write(json.dumps(answer) + "\n")
        _record.flush()


def _error_code(resp: Any) -> str | None:
    """The error's `code` from the spec's error body (None when the body is not one)."""
    try:
        body = resp.json()
    except ValueError:
        return None
    return body.get("code") if isinstance(body, dict) else None


def _refused(resp: Any) -> None:
    """A refusal: one with `Retry-After` (the model at capacity, a rate limit) is an honest
    answer, counted by status in the report, and the user waits it before its next request,
    as a client that honours it would; anything else is a failure."""
    if resp.status_code in (429, 503) and "Retry-After" in resp.headers:
        resp.success()
        time.sleep(float(resp.headers["Retry-After"]))
    else:
        resp.failure(f"HTTP {resp.status_code}")


def _metric(name: str, value: float) -> None:
    events.request.fire(request_type="METRIC", name=name, response_time=value,
                        response_length=0, exception=None, context={})


def _sentence(n: int) -> str:
    return " ".join(random.choice(WORDS) for _ in range(n))


class _Keyed(HttpUser):
    abstract = True

    def on_start(self) -> None:
        self.client.headers["Authorization"] = f"Bearer {next(_inference)}"


class ChatUser(_Keyed):
    """Streamed chat, the main load: time to first token and tokens per second."""

    weight = 4
    wait_time = between(0.5, 2.0)

    @task
    def stream(self) -> None:
        body = {"model": MODELS["chat"], "stream": True, "max_tokens": 32,
                "stream_options": {"include_usage": True},
                "messages": [{"role": "user", "content": f"Write about {_sentence(6)}."}]}
        started = time.perf_counter()
        first = None
        tokens = 0
        usage: dict = {}
        with self.client.post("/api/v1/chat/completions", json=body, stream=True,
                              name="POST /chat/completions (stream)", catch_response=True,
                              timeout=120) as resp:
            if resp.status_code != 200:
                record(resp, "chat")
                _refused(resp)
                return
            # the stream has started: should the run stop this user before the stream ends,
            # the reconciliation knows the client had it (charged for what was generated)
            record(resp, "chat")
            for line in resp.iter_lines():
                if not line or not line.startswith(b"data: ") or line == b"data: [DONE]":
                    continue
                chunk = json.loads(line[6:])
                if chunk.get("usage"):
                    usage = chunk["usage"]
                if chunk.get("choices") and chunk["choices"][0].get("delta", {}).get("content"):
                    tokens += 1
                    first = first or time.perf_counter()
            record(resp, "chat", usage)
        if first is not None:
            _metric("chat time to first token (ms)", (first - started) * 1000)
            spent = time.perf_counter() - first
            if spent > 0 and usage.get("completion_tokens", 0) > 1:
                _metric("chat tokens/s per stream (x1000)",
                        1000 * (usage["completion_tokens"] - 1) / spent)


class EmbeddingsUser(_Keyed):
    weight = 4
    wait_time = between(0.2, 1.0)

    @task
    def embed(self) -> None:
        inputs = [_sentence(12) for _ in range(random.choice((1, 1, 4, 16)))]
        with self.client.post("/api/v1/embeddings", name="POST /embeddings",
                              json={"model": MODELS["embedding"], "input": inputs},
                              catch_response=True) as resp:
            record(resp, "embeddings", resp.json().get("usage") if resp.status_code == 200
                   else None)
            if resp.status_code != 200:
                _refused(resp)


_wallets = itertools.cycle(KEYS.get("wallets") or [None])


class WalletUser(HttpUser):
    """A wallet with no API key, paying from its credit: every request is signed with
    SIGN-IN-WITH-X on the challenge of a 402 (the x402 protocol's own client signs), so each
    costs two round trips, as for any wallet client."""

    weight = 1
    wait_time = between(0.5, 2.0)

    def on_start(self) -> None:
        from eth_account import Account

        key = next(_wallets)
        self.wallet = Account.from_key(key) if key else None

    def _signed(self, url: str, body: dict) -> dict[str, str] | None:
        import asyncio

        import gevent
        from x402.extensions.sign_in_with_x import create_siwx_payload, encode_siwx_header

        with self.client.post(url, json=body, name="POST /embeddings (wallet challenge)",
                              catch_response=True) as asked:
            if asked.status_code != 402:
                asked.failure(f"HTTP {asked.status_code}, not the 402 challenge")
                return None
            asked.success()
            challenge = asked.json()["extensions"]["sign-in-with-x"]
        info = {**challenge["info"], "chainId": "eip155:8453", "type": "eip191"}
        # asyncio cannot run in several of gevent's greenlets of one thread at once: sign on
        # a thread of gevent's pool, each with its own event loop
        payload = gevent.get_hub().threadpool.apply(
            asyncio.run, (create_siwx_payload(info, self.wallet, self.host + url),))
        return {"SIGN-IN-WITH-X": encode_siwx_header(payload)}

    @task
    def embed(self) -> None:
        if self.wallet is None:
            return
        url = "/api/v1/embeddings"
        body = {"model": MODELS["embedding"], "input": _sentence(12)}
        headers = self._signed(url, body)
        if headers is None:
            return
        resp = self.client.post(url, json=body, headers=headers, name="POST /embeddings (wallet)")
        record(resp, "embeddings", resp.json().get("usage") if resp.status_code == 200
               else None, wallet=self.wallet.address)


class ImageUser(_Keyed):
    weight = 1
    wait_time = between(2.0, 5.0)

    @task(3)
    def upscale(self) -> None:
        resp = self.client.post("/api/v1/image/upscale", name="POST /image/upscale",
                                json={"image": PNG, "scale": 2}, timeout=120)
        record(resp, "image/upscale")

    @task(1)
    def remove_background(self) -> None:
        resp = self.client.post("/api/v1/image/background-remove",
                                name="POST /image/background-remove", json={"image": PNG},
                                timeout=120)
        record(resp, "image/background-remove")


class AudioUser(_Keyed):
    weight = 1
    wait_time = between(1.0, 3.0)

    @task(3)
    def speak(self) -> None:
        resp = self.client.post("/api/v1/audio/speech", name="POST /audio/speech",
                                json={"model": MODELS["speech"], "input": _sentence(10),
                                      "response_format": "mp3"}, timeout=120)
        record(resp, "audio/speech")

    @task(1)
    def narrate_job(self) -> None:
        _job(self, "audio", MODELS["audio_job"], {"prompt": _sentence(15)})


class VideoUser(_Keyed):
    weight = 1
    wait_time = between(5.0, 10.0)

    @task
    def clip(self) -> None:
        _job(self, "video", MODELS["video"], {
            "prompt": _sentence(8), "duration": "1s", "resolution": "256p",
            "aspect_ratio": "1:1"})


def _job(user: HttpUser, kind: str, model: str, body: dict) -> None:
    """Queue a job, poll it to completion, delete its media: the whole client flow."""
    resp = user.client.post(f"/api/v1/{kind}/queue", name=f"POST /{kind}/queue",
                            json={"model": model, **body})
    record(resp, f"{kind}/queue")
    if resp.status_code != 200:
        return
    queue_id, started = resp.json()["queue_id"], time.perf_counter()
    done = {"model": model, "queue_id": queue_id}
    with user.client.rename_request(f"POST /{kind}/retrieve"):
        while time.perf_counter() - started < 600:
            polled = user.client.post(f"/api/v1/{kind}/retrieve", json=done, timeout=60)
            if polled.status_code != 200 or not polled.headers.get(
                    "content-type", "").startswith("application/json"):
                break
            time.sleep(1.0)
    if polled.status_code == 200:
        _metric(f"{kind} job, queue to media (ms)", (time.perf_counter() - started) * 1000)
    user.client.post(f"/api/v1/{kind}/complete", json=done, name=f"POST /{kind}/complete")


_resume_payers = itertools.cycle(KEYS.get("resume") or [None])
ENDED = {"completed", "failed", "cancelled", "incomplete"}  # a response's last statuses
RESUME_TRIES = 60  # a resume refused for following too many streams waits and tries again


def _events(resp: Any) -> Any:
    """The server-sent events of `resp`: (its `id:` number or None, its data)."""
    seq = None
    for line in resp.iter_lines():
        if line.startswith(b"id: "):
            seq = int(line[4:])
        elif line.startswith(b"data: "):
            yield seq, line[6:].decode()
            seq = None


def _chat_usage(usage: dict | None) -> dict:
    """A response object's usage in a chat completion's names (what reconcile.py compares)."""
    if not usage:
        return {}
    return {"prompt_tokens": usage.get("input_tokens", 0),
            "completion_tokens": usage.get("output_tokens", 0)}


def _finished(chunk: dict) -> bool:
    """A chat chunk that ends its choice (a finish_reason)."""
    return any(choice.get("finish_reason") for choice in chunk.get("choices") or [])


def _output_text(response: dict) -> str:
    return "".join(part.get("text", "") for item in response.get("output") or []
                   if item.get("type") == "message" for part in item.get("content") or [])


class ResumableUser(HttpUser):
    """Generation that outlives the connection (docs/api/background-responses.md): background
    responses polled later, streams cut after a random number of events and resumed after it
    (`starting_after`, `Last-Event-ID`), each resumed event checked to follow the last one
    received, and some cancelled. The users share a few accounts of their own (a bound on
    the responses one account keeps and the streams it follows applies per account), which
    the reconciliation checks apart: each response charged once, nothing for the reads."""

    weight = 2
    wait_time = between(1.0, 3.0)

    def on_start(self) -> None:
        payer = next(_resume_payers)
        self.payer = payer["label"] if payer else None
        key = payer["key"] if payer else next(_inference)
        self.client.headers["Authorization"] = f"Bearer {key}"

    # -- what a client does

    @task(2)
    def poll(self) -> None:
        """A background response fetched later: polled until it has ended, then deleted."""
        created = self._create(stream=False)
        if created is None:
            return
        resp, response_id = created
        final = self._until_ended(response_id)
        self._settled(resp, response_id, final)
        self._delete(response_id)

    @task(3)
    def cut_and_resume(self) -> None:
        """A background response streamed from its creation, the connection cut after event
        k, resumed with `starting_after=k`: events k+1 to the end, each once, and their text
        with the first part's is the response's output."""
        cut_after = random.randint(1, 16)
        created = self._create(stream=True, cut_after=cut_after)
        if created is None:
            return
        resp, response_id, last, text = created
        if last is not None:  # cut: the rest comes from the resume
            resumed = self._resume(f"/api/v1/responses/{response_id}",
                                   {"stream": "true", "starting_after": last}, {},
                                   "GET /responses/{id} (resume)", last, chat=False)
            if resumed is None:
                return
            text += resumed
        final = self._until_ended(response_id)
        self._settled(resp, response_id, final)
        if final is not None and final["status"] == "completed" \
                and text != _output_text(final):
            _failure("GET /responses/{id} (resumed text)",
                     "the text of the cut stream and its resume is not the response's output")
        self._delete(response_id)

    @task(3)
    def chat_cut_and_resume(self) -> None:
        """A resumable chat stream (`stream_options.resumable`) cut after event k and resumed
        with `Last-Event-ID: k`: events k+1 to `[DONE]`, each once."""
        cut_after = random.randint(1, 16)
        body = {"model": MODELS["chat"], "stream": True, "max_tokens": 32,
                "stream_options": {"include_usage": True, "resumable": True},
                "messages": [{"role": "user", "content": f"Write about {_sentence(6)}."}]}
        stream_id, usage, last, finished = None, {}, None, False
        with self.client.post("/api/v1/chat/completions", json=body, stream=True,
                              name="POST /chat/completions (resumable)", catch_response=True,
                              timeout=300) as resp:
            if not self._admitted(resp, "chat"):
                return
            for expected, (seq, data) in enumerate(_events(resp)):
                if seq != expected:
                    resp.failure(f"event {seq} where {expected} was due")
                    record(resp, "chat", payer=self.payer, response_id=stream_id,
                           kind="chat")
                    return
                if data != "[DONE]":
                    chunk = json.loads(data)
                    usage = chunk.get("usage") or usage
                    finished = finished or _finished(chunk)
                    if stream_id is None:
                        stream_id = chunk.get("id")
                        record(resp, "chat", payer=self.payer, response_id=stream_id,
                               kind="chat")
                if seq == cut_after and data != "[DONE]":
                    last = seq
                    resp.close()  # the connection is cut here
                    break
        if stream_id is None:
            return
        if last is not None:
            chunks = self._resume(f"/api/v1/chat/completions/{stream_id}", {"stream": "true"},
                                  {"Last-Event-ID": str(last)},
                                  "GET /chat/completions/{id} (resume)", last, chat=True)
            if chunks is None:
                return
            usage, finished = chunks[0] or usage, finished or chunks[1]
        record(resp, "chat", usage, payer=self.payer, response_id=stream_id, kind="chat")
        if not finished:
            _failure("chat stream unfinished", f"cut after event {last}: the stream ended "
                     "without a finish_reason (its generation stopped)")

    @task(1)
    def cancel(self) -> None:
        """A background response cancelled a moment after its creation: the answer is the
        cancelled object (or the ended one, had it ended), and it stays so."""
        created = self._create(stream=False)
        if created is None:
            return
        resp, response_id = created
        time.sleep(random.uniform(0.0, 5.0))
        with self.client.post(f"/api/v1/responses/{response_id}/cancel",
                              name="POST /responses/{id}/cancel", catch_response=True,
                              timeout=120) as cancelled:
            record(cancelled, "responses/read", payer=self.payer, read=True)
            if cancelled.status_code != 200 or cancelled.json().get("status") not in ENDED:
                cancelled.failure(f"HTTP {cancelled.status_code}: "
                                  f"{cancelled.text[:200]}")
                return
            final = cancelled.json()
        later = self._get(response_id)
        if later is not None and later["status"] != final["status"]:
            _failure("POST /responses/{id}/cancel",
                     f"cancelled as {final['status']}, later {later['status']}")
        self._settled(resp, response_id, final, cancelled=True)
        self._delete(response_id)

    # -- its steps

    def _admitted(self, resp: Any, route: str) -> bool:
        """A creation answered 200; a refusal with `Retry-After` (the model at capacity,
        the account's bound on kept responses) waits it, as a client that honours it."""
        if resp.status_code == 200:
            return True
        record(resp, route, payer=self.payer)
        _refused(resp)
        return False

    def _create(self, *, stream: bool, cut_after: int | None = None) -> Any:
        """`POST /responses` with `background: true`: (the answer, the id), or, streamed,
        (the answer, the id, the event it was cut after or None, the text received)."""
        body = {"model": MODELS["chat"], "input": f"Write about {_sentence(6)}.",
                "background": True, "stream": stream, "max_output_tokens": 32}
        name = "POST /responses (background, stream)" if stream \
            else "POST /responses (background)"
        with self.client.post("/api/v1/responses", json=body, stream=stream, name=name,
                              catch_response=True, timeout=300) as resp:
            if not self._admitted(resp, "responses"):
                return None
            if not stream:
                response_id = resp.json()["id"]
                record(resp, "responses", payer=self.payer, response_id=response_id,
                       kind="response")
                return resp, response_id
            response_id, text = None, ""
            for expected, (seq, data) in enumerate(_events(resp)):
                event = json.loads(data)
                if seq != expected or event.get("sequence_number") != expected:
                    resp.failure(f"event {seq} where {expected} was due")
                    return None
                if response_id is None:
                    response_id = event["response"]["id"]
                    record(resp, "responses", payer=self.payer, response_id=response_id,
                           kind="response")
                if event["type"] == "response.output_text.delta":
                    text += event["delta"]
                if seq == cut_after and event["type"] not in (
                        "response.completed", "response.failed"):
                    resp.close()  # the connection is cut here
                    return resp, response_id, seq, text
            if response_id is None:
                resp.failure("the stream ended before its first event")
                return None
            return resp, response_id, None, text

    def _resume(self, url: str, params: dict, headers: dict, name: str, last: int, *,
                chat: bool) -> Any:
        """Follow a stream again after event `last`: each event must be the next one, to the
        end. The text of a response's deltas, or a chat stream's usage ({} without one) and
        whether a choice finished; None when the resume failed (a Locust failure named
        `name`)."""
        for _ in range(RESUME_TRIES):
            with self.client.get(url, params=params, headers=headers, stream=True, name=name,
                                 catch_response=True, timeout=300) as again:
                record(again, "responses/read", payer=self.payer, read=True)
                if again.status_code == 429:  # this account follows its most at once
                    again.success()
                    time.sleep(float(again.headers.get("Retry-After", "1")))
                    continue
                if again.status_code != 200:
                    again.failure(f"HTTP {again.status_code}: {again.text[:200]}")
                    return None
                expected, text, usage, ended, finished = last + 1, "", {}, False, False
                for seq, data in _events(again):
                    if seq != expected:
                        again.failure(f"cut after event {last}, the resume sent {seq} "
                                      f"where {expected} was due")
                        return None
                    expected += 1
                    if chat:
                        ended = data == "[DONE]"
                        if not ended:
                            chunk = json.loads(data)
                            if "error" in chunk:
                                again.failure(f"the stream's error: {chunk['error']}")
                                return None
                            usage = chunk.get("usage") or usage
                            finished = finished or _finished(chunk)
                        continue
                    event = json.loads(data)
                    if event.get("sequence_number") != seq:
                        again.failure(f"event {seq} says it is {event.get('sequence_number')}")
                        return None
                    if event["type"] == "response.output_text.delta":
                        text += event["delta"]
                    ended = event["type"] in ("response.completed", "response.failed")
                if not ended:
                    again.failure(f"cut after event {last}, the resume stopped at event "
                                  f"{expected - 1} before the end")
                    return None
                return (usage, finished) if chat else text
        _failure(name, f"refused {RESUME_TRIES} times (429: the account follows its most)")
        return None

    def _get(self, response_id: str) -> dict | None:
        with self.client.get(f"/api/v1/responses/{response_id}", name="GET /responses/{id}",
                             catch_response=True, timeout=120) as got:
            record(got, "responses/read", payer=self.payer, read=True)
            if got.status_code != 200:
                got.failure(f"HTTP {got.status_code}: {got.text[:200]}")
                return None
            return got.json()

    def _until_ended(self, response_id: str) -> dict | None:
        """Poll until the response has ended (None: it did not within 10 minutes)."""
        started = time.perf_counter()
        while time.perf_counter() - started < 600:
            response = self._get(response_id)
            if response is None or response["status"] in ENDED:
                return response
            time.sleep(random.uniform(1.0, 3.0))
        _failure("GET /responses/{id}", "not ended after 600 s")
        return None

    def _settled(self, resp: Any, response_id: str, final: dict | None, *,
                 cancelled: bool = False) -> None:
        """Record what the client was told of the response's end: its usage when it
        completed; one cut short (cancelled, failed) may or may not have been charged, as
        its object does not say what the model made before it stopped."""
        if final is None:
            return
        if final["status"] not in ENDED:
            _failure("GET /responses/{id}", f"status {final['status']} after its end")
            return
        if final["status"] == "failed":
            _failure("background response failed", (final.get("error") or {}).get(
                "message", "no error given"))
        maybe = {} if final["status"] == "completed" else {"charge": "maybe"}
        record(resp, "responses", _chat_usage(final.get("usage")), payer=self.payer,
               response_id=response_id, kind="response", final=final["status"],
               cancelled=cancelled, **maybe)

    def _delete(self, response_id: str) -> None:
        with self.client.delete(f"/api/v1/responses/{response_id}",
                                name="DELETE /responses/{id}", catch_response=True,
                                timeout=120) as deleted:
            record(deleted, "responses/read", payer=self.payer, read=True)
            if deleted.status_code != 200 or deleted.json().get("deleted") is not True:
                deleted.failure(f"HTTP {deleted.status_code}: {deleted.text[:200]}")


def _failure(name: str, why: str) -> None:
    """A failure of a check of the client's own, as a Locust failure named `name`."""
    events.request.fire(request_type="CHECK", name=name, response_time=0, response_length=0,
                        exception=AssertionError(why), context={})


class AccountUser(HttpUser):
    """An operator's dashboard: keys, limits, balance and usage, and a key rotated now and
    then (ADMIN key; key creation is itself limited to 20 a minute)."""

    weight = 1
    wait_time = between(1.0, 3.0)

    def on_start(self) -> None:
        self.client.headers["Authorization"] = f"Bearer {KEYS['admin']}"

    @task(3)
    def keys(self) -> None:
        self.client.get("/api/v1/api_keys", name="GET /api_keys")

    @task(2)
    def limits(self) -> None:
        self.client.get("/api/v1/api_keys/rate_limits", name="GET /api_keys/rate_limits")

    @task(3)
    def balance(self) -> None:
        self.client.get("/api/v1/billing/balance", name="GET /billing/balance")

    @task(2)
    def history(self) -> None:
        self.client.get("/api/v1/billing/usage-history", name="GET /billing/usage-history",
                        params={"pageSize": 50})

    @task(1)
    def rotate(self) -> None:
        if random.random() > 0.1:
            return
        made = self.client.post("/api/v1/api_keys", name="POST /api_keys",
                                json={"apiKeyType": "INFERENCE", "description": "rotated"})
        if made.status_code == 200:
            self.client.delete(f"/api/v1/api_keys?id={made.json()['data']['id']}",
                               name="DELETE /api_keys")


class DiscoveryUser(HttpUser):
    """Clients reading the model catalog."""

    weight = 1
    wait_time = between(0.5, 2.0)

    @task
    def models(self) -> None:
        self.client.get("/api/v1/models", name="GET /models")
