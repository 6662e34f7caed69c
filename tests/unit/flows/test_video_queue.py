"""A queued video job: `/video/queue` holds the quoted price, the job worker (running in the
gateway's lifespan) has the video deployment make it and settles the quote, `/video/retrieve`
answers the MP4."""

from __future__ import annotations

import io
import time

import av

from deployments.protocol import PLATFORM_TENANT, MediaJob, Tenant
from tests.fakes import crashed
from tests.unit.conftest import account_key
from tests.unit.flows.books import nanos

JOB = {"model": "clip-maker", "prompt": "a red fox running through snow", "duration": "2s",
       "resolution": "256p", "aspect_ratio": "16:9"}
QUOTE_USD = "0.02"  # 2 s at 256p, 0.01 USD per second (catalog.yaml)


def _post(gateway, key: str, path: str, body: dict):
    return gateway.client.post(f"/api/v1/video/{path}", headers=gateway.auth(key), json=body)


def _retrieve_when_done(gateway, key: str, queue_id: str, timeout_s: float = 120):
    """Poll `/video/retrieve` as a client does until the job is no longer PROCESSING."""
    deadline = time.monotonic() + timeout_s
    while True:
        resp = _post(gateway, key, "retrieve", {"model": JOB["model"], "queue_id": queue_id})
        processing = resp.headers["content-type"].startswith("application/json") \
            and resp.status_code == 200 and resp.json().get("status") == "PROCESSING"
        if not processing:
            return resp
        assert time.monotonic() < deadline, "the job was not made in time"
        time.sleep(0.05)


def test_the_quote_is_the_catalog_price_of_the_asked_clip(fake_gateway, key):
    resp = _post(fake_gateway, key, "quote", {k: JOB[k] for k in
                                              ("model", "duration", "resolution")})

    assert resp.status_code == 200, resp.text
    assert resp.json() == {"quote": float(QUOTE_USD)}


def test_a_queued_video_is_made_by_the_runner_and_retrieved_as_mp4(fake_gateway, fakes, key):
    queued = _post(fake_gateway, key, "queue", JOB)

    assert queued.status_code == 200, queued.text
    assert queued.json()["model"] == "clip-maker"
    assert queued.headers["x-service-model-id"] == "clip-maker"
    queue_id = queued.json()["queue_id"]
    done = _retrieve_when_done(fake_gateway, key, queue_id)
    assert done.status_code == 200, done.text
    assert done.headers["content-type"] == "video/mp4"
    assert done.content == fakes["video-generation"].made[0]
    with av.open(io.BytesIO(done.content)) as clip:
        assert clip.streams.video[0].codec_context.name == "h264"
    (call,) = fakes["video-generation"].calls
    model_id, job = call.args
    assert isinstance(job, MediaJob)
    assert (call.method, model_id, job.inputs) == ("generate", "clip-maker", {})
    assert job.params["prompt"] == JOB["prompt"] and job.params["seconds"] == 2


def _chat_tenant(gateway, fakes, key: str) -> Tenant:
    """The tenant the caller's own chat request is served as."""
    resp = gateway.client.post("/api/v1/chat/completions", headers=gateway.auth(key), json={
        "model": "chat-primary", "messages": [{"role": "user", "content": "Name a fox"}],
        "max_tokens": 5})
    assert resp.status_code == 200, resp.text
    tenant = fakes["text-xs"].requests[-1].tenant
    assert tenant is not None and tenant != PLATFORM_TENANT
    return tenant


def _made_as(gateway, fakes, key: str) -> Tenant | None:
    """The tenant the video engine was told a job queued with `key` is for."""
    queued = _post(gateway, key, "queue", JOB)
    assert queued.status_code == 200, queued.text
    assert _retrieve_when_done(gateway, key, queued.json()["queue_id"]).status_code == 200
    job = fakes["video-generation"].calls_to("generate")[-1].args[1]
    return job.tenant


def test_a_queued_video_runs_at_the_engine_as_the_callers_tenant(fake_gateway, fakes, key):
    caller = _chat_tenant(fake_gateway, fakes, key)

    assert _made_as(fake_gateway, fakes, key) == caller
    other, other_account = account_key(fake_gateway, "5")
    fake_gateway.cli("set-tier", "scale", "--account", other_account)
    scaled = _chat_tenant(fake_gateway, fakes, other)
    assert scaled != caller and (scaled.tier, scaled.weight) == ("scale", 4.0)
    assert _made_as(fake_gateway, fakes, other) == scaled  # its tier's share and label kept


def test_a_queued_video_holds_its_quote_while_made_then_is_charged_it(fake_gateway, fakes,
                                                                      key, books):
    video = fakes["video-generation"]
    video.pause()
    before = books.balance_nanos()

    queued = _post(fake_gateway, key, "queue", JOB)

    assert queued.status_code == 200, queued.text
    assert queued.headers["x-service-balance-usd"] == "10"
    request_id = queued.headers["cf-ray"]
    waiting = _post(fake_gateway, key, "retrieve", {"model": JOB["model"],
                                                    "queue_id": queued.json()["queue_id"]})
    assert waiting.json()["status"] == "PROCESSING"
    assert books.held(request_id) == nanos(QUOTE_USD)
    assert books.balance_nanos() == before - nanos(QUOTE_USD)
    assert books.charges(request_id) == []

    video.resume()
    done = _retrieve_when_done(fake_gateway, key, queued.json()["queue_id"])

    assert done.status_code == 200, done.text
    charge = books.only_charge(request_id)
    assert charge.model_id == "clip-maker"
    assert charge.total_nanos == nanos(QUOTE_USD)
    assert books.balance_nanos() == before - nanos(QUOTE_USD)
    assert books.open_holds() == 0


def test_a_video_job_that_fails_answers_its_error_and_charges_nothing(fake_gateway, fakes,
                                                                      key, books):
    fakes["video-generation"].fail_with(crashed())
    before = books.balance_nanos()

    queued = _post(fake_gateway, key, "queue", JOB)
    done = _retrieve_when_done(fake_gateway, key, queued.json()["queue_id"])

    assert done.status_code == 500
    assert done.json()["code"] == "INFERENCE_FAILED"
    assert books.charges(queued.headers["cf-ray"]) == []
    assert books.balance_nanos() == before
    assert books.open_holds() == 0


def test_a_streamed_video_is_queued_without_a_download_url(fake_gateway, fakes, key):
    """Its retrieve streams the MP4, so (as the reference answers such models) the queue
    result names no delivery link: tests/unit/video/test_video_delivery.py has the rest."""
    queued = _post(fake_gateway, key, "queue", JOB)

    assert queued.status_code == 200, queued.text
    assert set(queued.json()) == {"model", "queue_id"}
    done = _retrieve_when_done(fake_gateway, key, queued.json()["queue_id"])
    assert done.headers["content-type"] == "video/mp4"
    assert done.content == fakes["video-generation"].made[0]
