"""Completion webhooks as a client's receiver sees them: a real HTTP server on loopback (let
through the private-address guard by WEB_FETCH_ALLOWED_HOSTS) gets the job's event, signed so
that the documented snippet verifies it; a receiver that fails is tried again on the backoff
(a controlled clock); a private callback_url is a 400 with nothing charged."""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import json
import threading
import time
from collections.abc import Iterator
from datetime import timedelta
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
from sqlalchemy import select
from sqlmodel import Session

from serve_app.db.engine import make_engine
from serve_app.db.tables import JobRow, WebhookDelivery, utcnow
from tests.fakes import crashed
from tests.unit.video.conftest import CATALOG
from tests.unit.video.media_server import MediaServer

JOB = {"model": "clip-maker", "prompt": "rain on a window", "duration": "1s",
       "resolution": "256p", "aspect_ratio": "1:1"}


def verify(secret: str, header: str, body: bytes, tolerance_s: int = 300,
           now: float | None = None) -> bool:
    """The verification snippet of docs/api/video.md."""
    parts = dict(item.split("=", 1) for item in header.split(","))
    timestamp = int(parts["t"])
    expected = hmac.new(secret.encode(), f"{timestamp}.".encode() + body,
                        hashlib.sha256).hexdigest()
    fresh = abs((time.time() if now is None else now) - timestamp) <= tolerance_s
    return fresh and hmac.compare_digest(expected, parts["v1"])


class Receiver:
    """A webhook receiver on loopback: answers each POST with the next of `statuses`
    (then 200) and records what it got."""

    def __init__(self) -> None:
        self.received: list[tuple[dict[str, str], bytes]] = []
        self.statuses: list[int] = []
        self.got = threading.Condition()
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args) -> None:
                pass

            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("content-length", 0)))
                status = receiver.statuses.pop(0) if receiver.statuses else 200
                self.send_response(status)
                self.send_header("Content-Length", "0")
                self.end_headers()
                with receiver.got:
                    receiver.received.append(({k.lower(): v for k, v in self.headers.items()},
                                              body))
                    receiver.got.notify_all()

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    @property
    def host(self) -> str:
        return f"127.0.0.1:{self.server.server_port}"

    def wait_for(self, count: int, timeout_s: float = 60) -> None:
        with self.got:
            assert self.got.wait_for(lambda: len(self.received) >= count, timeout_s), \
                f"{len(self.received)} of {count} deliveries arrived"

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def receiver() -> Iterator[Receiver]:
    running = Receiver()
    yield running
    running.close()


@pytest.fixture
def gateway_settings(tmp_path: Path, media: MediaServer, receiver: Receiver) -> dict:
    return {"data_dir": tmp_path, "initial_credit_usd": 10, "model_catalog": CATALOG,
            "web_fetch_allowed_hosts": f"{media.host},{receiver.host}"}


def _queue(gateway, key: str, body: dict):
    return gateway.client.post("/api/v1/video/queue", headers=gateway.auth(key), json=body)


def _secret(gateway) -> str:
    resp = gateway.client.get("/api/v1/webhooks/secret", headers=gateway.auth())
    assert resp.status_code == 200, resp.text
    return resp.json()["data"]["secret"]


def _delivery(gateway, queue_id: str) -> WebhookDelivery | None:
    engine = make_engine(gateway.settings.resolved_database_url)
    try:
        with Session(engine) as session:
            return session.execute(select(WebhookDelivery).where(
                WebhookDelivery.queue_id == queue_id)).scalar_one_or_none()
    finally:
        engine.dispose()


def _delivery_when(gateway, queue_id: str, done, timeout_s: float = 60) -> WebhookDelivery:
    deadline = time.monotonic() + timeout_s
    while True:
        row = _delivery(gateway, queue_id)
        if row is not None and done(row):
            return row
        assert time.monotonic() < deadline, "the delivery did not get there in time"
        time.sleep(0.05)


def test_a_finished_job_posts_a_signed_event_the_snippet_verifies(gateway, key, receiver):
    url = f"http://{receiver.host}/hooks/jobs"
    queued = _queue(gateway, key, {**JOB, "callback_url": url})
    assert queued.status_code == 200, queued.text

    receiver.wait_for(1)

    headers, body = receiver.received[0]
    assert headers["content-type"] == "application/json"
    assert verify(_secret(gateway), headers["x-webhook-signature"], body)
    assert not verify("whsec_" + "0" * 64, headers["x-webhook-signature"], body)
    event = json.loads(body)
    assert event["type"] == "job.completed" and event["status"] == "COMPLETED"
    assert event["queue_id"] == queued.json()["queue_id"]
    assert event["model"] == "clip-maker" and isinstance(event["created"], int)
    row = _delivery_when(gateway, event["queue_id"], lambda r: r.delivered_at is not None)
    assert row.attempts == 1


def test_a_failed_job_posts_job_failed(gateway, fakes, key, receiver):
    fakes["video-generation"].fail_with(crashed())
    queued = _queue(gateway, key, {**JOB, "callback_url": f"http://{receiver.host}/h"})

    receiver.wait_for(1)

    event = json.loads(receiver.received[0][1])
    assert (event["type"], event["queue_id"]) == ("job.failed", queued.json()["queue_id"])
    assert event["error"]["code"] == "INFERENCE_FAILED" and event["credits_refunded"] is True


def test_a_rotated_secret_signs_what_follows(gateway, key, receiver):
    old = _secret(gateway)
    rotated = gateway.client.post("/api/v1/webhooks/secret", headers=gateway.auth())
    assert rotated.status_code == 200
    new = rotated.json()["data"]["secret"]
    assert new != old and _secret(gateway) == new
    assert gateway.client.get("/api/v1/webhooks/secret",
                              headers=gateway.auth(key)).status_code in (401, 403)

    _queue(gateway, key, {**JOB, "callback_url": f"http://{receiver.host}/h"})
    receiver.wait_for(1)

    headers, body = receiver.received[0]
    assert verify(new, headers["x-webhook-signature"], body)
    assert not verify(old, headers["x-webhook-signature"], body)


def test_a_failing_receiver_is_tried_again_after_the_backoff(gateway, key, receiver):
    webhooks = gateway.services.webhooks
    now = [utcnow()]
    webhooks.clock = lambda: now[0]
    receiver.statuses = [503]
    queue_id = _queue(gateway, key, {**JOB, "callback_url": f"http://{receiver.host}/h"}
                      ).json()["queue_id"]

    first = _delivery_when(gateway, queue_id, lambda r: r.attempts == 1)
    assert first.delivered_at is None and first.last_error == "answered 503"
    assert abs((first.next_attempt_at.replace(tzinfo=now[0].tzinfo) - now[0])
               - timedelta(minutes=1)) < timedelta(seconds=1)
    assert asyncio.run(webhooks.deliver_due()) == 0  # not due before its minute

    now[0] += timedelta(minutes=1, seconds=1)
    webhooks.wake()
    receiver.wait_for(2)

    done = _delivery_when(gateway, queue_id, lambda r: r.delivered_at is not None)
    assert done.attempts == 2
    headers, body = receiver.received[1]
    assert verify(_secret(gateway), headers["x-webhook-signature"], body,
                  now=now[0].timestamp())


def test_a_receiver_that_never_answers_is_given_up_after_its_tries(gateway, key, receiver):
    webhooks = gateway.services.webhooks
    webhooks.max_attempts = 3
    now = [utcnow()]
    webhooks.clock = lambda: now[0]
    receiver.statuses = [500] * 10
    queue_id = _queue(gateway, key, {**JOB, "callback_url": f"http://{receiver.host}/h"}
                      ).json()["queue_id"]

    for tries in (1, 2, 3):
        _delivery_when(gateway, queue_id, lambda r, n=tries: r.attempts == n)
        now[0] += timedelta(hours=1)
        webhooks.wake()

    row = _delivery_when(gateway, queue_id, lambda r: r.next_attempt_at is None)
    assert row.attempts == 3 and row.delivered_at is None
    assert len(receiver.received) == 3
    now[0] += timedelta(days=3, seconds=1)
    assert asyncio.run(webhooks.sweep()) == 1  # every delivery row expires
    assert _delivery(gateway, queue_id) is None


@pytest.mark.parametrize("url", ["http://10.0.0.7/hook", "http://127.0.0.1:9/hook",
                                 "ftp://example.com/hook", "http://[::1]/hook",
                                 "http://169.254.169.254/latest"])
def test_a_private_or_odd_callback_url_is_a_400_with_nothing_charged(gateway, key, books,
                                                                     url):
    before = books.balance_nanos()

    resp = _queue(gateway, key, {**JOB, "callback_url": url})

    assert resp.status_code == 400, resp.text
    assert "callback_url" in resp.json()["error"]
    assert books.balance_nanos() == before and books.open_holds() == 0
    engine = make_engine(gateway.settings.resolved_database_url)
    with Session(engine) as session:
        assert session.execute(select(JobRow)).first() is None
    engine.dispose()
