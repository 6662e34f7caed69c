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
           payer: str | None = None) -> None:
    """One line per answer, for the reconciliation (`wallet`: the payer, when not a key;
    `payer`: the label of an account other than the prepared one)."""
    if _record is None:
        return
    answer = {"cf_ray": resp.headers.get("CF-RAY"), "route": route,
              "status": resp.status_code, "usage": usage or {}, "t": time.time()}
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
                resp.failure(f"HTTP {resp.status_code}")
                record(resp, "chat")
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
        resp = self.client.post("/api/v1/embeddings", name="POST /embeddings",
                                json={"model": MODELS["embedding"], "input": inputs})
        record(resp, "embeddings", resp.json().get("usage") if resp.status_code == 200
               else None)


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
