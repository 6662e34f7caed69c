"""What a client of the published reference sends, route by route: the calls of the sweep
(test_reference_contract.py) and of the refusals (test_reference_refusals.py)."""

from __future__ import annotations

import base64
import io
import struct
import uuid
from collections.abc import Callable
from dataclasses import dataclass

import httpx
from PIL import Image

from serve_app.wallets.x402 import BASE_NETWORK
from tests.fakes import DeploymentHandle
from tests.unit.conftest import Gateway, account_key
from tests.unit.wallets.wallet_gateway import CHAT_URL
from tests.wallets import Wallet, signed_in

API = "/api/v1"
JSON_ONLY = {"Accept": "application/json"}
TEXT = "smollm2-135m-instruct"
EMBEDDING = "text-embedding-all-minilm-l6-v2"
CHAT = {"model": TEXT, "messages": [{"role": "user", "content": "Say hello."}]}
VIDEO = {"model": "wan-text-to-video-test", "prompt": "a kite over a beach", "duration": "1s",
         "resolution": "256p", "aspect_ratio": "16:9"}
AUDIO = {"model": "piper-narrator", "prompt": "Once upon a time, a fox."}
# The fake deployment that runs each queued family's jobs.
DEPLOYMENT = {"video": "video-generation", "audio": "speech"}


@dataclass
class Caller:
    """A client of the reference with an account of its own on the gateway: its ADMIN key
    and an INFERENCE key ($10 of credit)."""

    gw: Gateway
    handles: dict[str, DeploymentHandle]
    admin_key: str
    key: str

    @classmethod
    def of_new_account(cls, gw: Gateway, handles: dict[str, DeploymentHandle]) -> Caller:
        admin_key = gw.cli("create-account", "--usd", "10")["apiKey"]
        created = gw.client.post(f"{API}/api_keys", headers=gw.auth(admin_key),
                                 json={"apiKeyType": "INFERENCE", "description": "client"})
        assert created.status_code == 200, created.text
        return cls(gw, handles, admin_key, created.json()["data"]["apiKey"])

    def auth(self, admin: bool = False) -> dict[str, str]:
        return self.gw.auth(self.admin_key if admin else self.key)

    def get(self, path: str, admin: bool = False, headers: dict | None = None,
            **kw) -> httpx.Response:
        return self.gw.client.get(API + path, headers=self.auth(admin) | (headers or {}), **kw)

    def post(self, path: str, body: dict | None = None, admin: bool = False,
             headers: dict | None = None, **kw) -> httpx.Response:
        if body is not None:
            kw["json"] = body
        return self.gw.client.post(API + path, headers=self.auth(admin) | (headers or {}),
                                   **kw)

    def patch(self, path: str, body: dict) -> httpx.Response:
        return self.gw.client.patch(API + path, headers=self.auth(admin=True), json=body)

    def delete(self, path: str, **kw) -> httpx.Response:
        return self.gw.client.delete(API + path, headers=self.auth(admin=True), **kw)

    def anonymous(self, method: str, path: str, **kw) -> httpx.Response:
        return self.gw.client.request(method, API + path, **kw)

    def operator(self, path: str, body: dict) -> httpx.Response:
        """A POST with the operator's key (the gateway's first admin key)."""
        return self.gw.client.post(API + path, headers=self.gw.auth(), json=body)

    def ok(self, resp: httpx.Response) -> dict:
        assert resp.status_code == 200, resp.text
        return resp.json()

    def spare_key_id(self) -> str:
        return self.ok(self.post("/api_keys", {"apiKeyType": "INFERENCE",
                                               "description": "spare"}, admin=True))["data"]["id"]

    def poor_key(self) -> dict[str, str]:
        """Authorization of an INFERENCE key of another account, one without credit."""
        return self.gw.auth(account_key(self.gw, "0")[0])


Call = Callable[[Caller], httpx.Response]


# ---- media -----------------------------------------------------------------------------------

def png(side: int = 256) -> str:
    out = io.BytesIO()
    Image.new("RGB", (side, side), (200, 80, 40)).save(out, format="PNG")
    return base64.b64encode(out.getvalue()).decode()


def wav(seconds: float = 1.0, rate: int = 8000) -> bytes:
    """A silent 16-bit mono WAV file."""
    data = b"\x00\x00" * int(seconds * rate)
    return (b"RIFF" + struct.pack("<I", 36 + len(data)) + b"WAVEfmt "
            + struct.pack("<IHHIIHH", 16, 1, 1, rate, rate * 2, 2, 16)
            + b"data" + struct.pack("<I", len(data)) + data)


# ---- state first, through the API -------------------------------------------------------------

def queued(c: Caller, family: str, body: dict) -> dict:
    """A job queued; the body of its retrieve and complete."""
    answer = c.ok(c.post(f"/{family}/queue", body))
    return {"model": body["model"], "queue_id": answer["queue_id"]}


def running(c: Caller, family: str, body: dict) -> httpx.Response:
    """The retrieve (as a JSON client) of a job its model is still working on: the fake
    deployment holds the job until the answer is in."""
    deployment = c.handles[DEPLOYMENT[family]]
    deployment.pause()
    try:
        return c.post(f"/{family}/retrieve", queued(c, family, body), headers=JSON_ONLY)
    finally:
        deployment.resume()


def finished(c: Caller, family: str, body: dict) -> dict:
    """A job polled as a JSON client polls until it is no longer PROCESSING (a finished
    audio job answers its audio)."""
    job = queued(c, family, body)
    while True:
        answer = c.post(f"/{family}/retrieve", job, headers=JSON_ONLY)
        assert answer.status_code == 200, answer.text
        if not answer.headers["content-type"].startswith("application/json") \
                or answer.json()["status"] != "PROCESSING":
            return job


def character(c: Caller) -> str:
    """The slug of a new character with one review (created with the operator routes)."""
    slug = f"sage-{uuid.uuid4().hex[:8]}"
    c.ok(c.operator("/characters", {"slug": slug, "name": "Sage",
                                    "systemPrompt": "You are a calm sage."}))
    c.ok(c.operator(f"/characters/{slug}/reviews", {"username": "ada", "rating": 5,
                                                    "message": "Wise.", "locale": "en"}))
    return slug


def used(c: Caller) -> Caller:
    """`c` after one chat completion (usage to report)."""
    c.ok(c.post("/chat/completions", CHAT))
    return c


def top_up(c: Caller, wallet: Wallet) -> httpx.Response:
    """The reference's top-up: ask without a payment (402), pay the Base entry."""
    asked = c.anonymous("POST", "/x402/top-up", params={"amount": 5})
    assert asked.status_code == 402, asked.text
    return c.anonymous("POST", "/x402/top-up", headers=wallet.pay(asked, BASE_NETWORK))


def wallet_read(kind: str) -> Call:
    """`GET /x402/<kind>/{walletAddress}` of a topped-up wallet, signed in."""
    def call(c: Caller) -> httpx.Response:
        wallet = Wallet()
        c.ok(top_up(c, wallet))
        url = f"/x402/{kind}/{wallet.address}"
        headers = signed_in(c.gw.client, wallet, f"http://testserver{API}{url}", CHAT_URL)
        return c.anonymous("GET", url, headers=headers)
    return call


def transcription(**fields: str) -> Call:
    def call(c: Caller) -> httpx.Response:
        return c.post("/audio/transcriptions",
                      files={"file": ("hello.wav", wav(), "audio/wav")},
                      data={"model": "whisper-base", **fields})
    return call
