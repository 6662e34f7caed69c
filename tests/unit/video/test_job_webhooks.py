"""Completion webhooks as a client's receiver sees them: a real HTTP server on loopback (let
through the private-address guard by WEBHOOK_ALLOWED_HOSTS, never by the fetch allow-list) gets
the job's event, signed by the Standard Webhooks convention so that the `standardwebhooks`
package verifies it (a rotation signs with both secrets for its grace period); a receiver that
fails is tried again on the backoff (a controlled clock); one that never answers holds neither
the loop nor another tenant's delivery; a private callback_url is a 400 with nothing charged,
an allow-listed internal host too; a failed job's event carries no internal text."""

from __future__ import annotations

import asyncio
import base64
import json
import shutil
import threading
import time
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
from sqlalchemy import select
from sqlmodel import Session
from standardwebhooks.webhooks import Webhook, WebhookVerificationError

from serve_app.db.engine import make_engine
from serve_app.db.tables import JobRow, WebhookDelivery, utcnow
from serve_app.jobs.webhooks import ROTATION_GRACE, TRY_DEADLINE_S, TRY_TIMEOUT_S
from serve_app.jobs.worker import FAILED_MESSAGE
from tests.unit.conftest import account_key
from tests.unit.video.conftest import CATALOG
from tests.unit.video.media_server import MediaServer

JOB = {"model": "clip-maker", "prompt": "rain on a window", "duration": "1s",
       "resolution": "256p", "aspect_ratio": "1:1"}


def verifies(secret: str, headers: dict[str, str], body: bytes) -> bool:
    """What a receiver does with the `standardwebhooks` package (docs/api/video.md)."""
    try:
        Webhook(secret).verify(body, headers)
    except WebhookVerificationError:
        return False
    return True


def signed_by(secret: str, headers: dict[str, str], body: bytes) -> bool:
    """Whether one of the header's signatures is `secret`'s (at any timestamp: for events
    sent at a controlled clock, which the package's freshness check would refuse)."""
    sent_at = datetime.fromtimestamp(int(headers["webhook-timestamp"]), UTC)
    expected = Webhook(secret).sign(headers["webhook-id"], sent_at, body.decode())
    return expected in headers["webhook-signature"].split(" ")


class Receiver:
    """A webhook receiver on loopback: answers each POST with the next of `statuses`
    (then 200) and records what it got. `hang`: takes each POST and never answers, until
    `release` (`arrived` counts the POSTs it holds)."""

    def __init__(self, *, hang: bool = False) -> None:
        self.received: list[tuple[dict[str, str], bytes]] = []
        self.statuses: list[int] = []
        self.got = threading.Condition()
        self.released = threading.Event()
        self.arrived = 0
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args) -> None:
                pass

            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("content-length", 0)))
                if hang:
                    with receiver.got:
                        receiver.arrived += 1
                        receiver.got.notify_all()
                    receiver.released.wait()
                    return
                status = receiver.statuses.pop(0) if receiver.statuses else 200
                self.send_response(status)
                self.send_header("Content-Length", "0")
                self.end_headers()
                with receiver.got:
                    receiver.received.append(({k.lower(): v for k, v in self.headers.items()},
                                              body))
                    receiver.got.notify_all()

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    @property
    def host(self) -> str:
        return f"127.0.0.1:{self.server.server_port}"

    def wait_for(self, count: int, timeout_s: float = 60) -> None:
        with self.got:
            assert self.got.wait_for(lambda: len(self.received) >= count, timeout_s), \
                f"{len(self.received)} of {count} deliveries arrived"

    def wait_for_held(self, count: int, timeout_s: float = 60) -> None:
        with self.got:
            assert self.got.wait_for(lambda: self.arrived >= count, timeout_s), \
                f"{self.arrived} of {count} deliveries arrived"

    def close(self) -> None:
        self.released.set()
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def receiver() -> Iterator[Receiver]:
    running = Receiver()
    yield running
    running.close()


@pytest.fixture
def silent() -> Iterator[Receiver]:
    """A receiver that takes every POST and never answers."""
    running = Receiver(hang=True)
    yield running
    running.close()


@pytest.fixture
def silent_ones() -> Iterator[list[Receiver]]:
    """Five more silent receivers (one account's many)."""
    running = [Receiver(hang=True) for _ in range(5)]
    yield running
    for one in running:
        one.close()


@pytest.fixture
def gateway_settings(tmp_path: Path, media: MediaServer, receiver: Receiver,
                     silent: Receiver, silent_ones: list[Receiver]) -> dict:
    hosts = [receiver.host, silent.host, *(one.host for one in silent_ones)]
    return {"data_dir": tmp_path, "initial_credit_usd": 10, "model_catalog": CATALOG,
            "web_fetch_allowed_hosts": media.host, "webhook_allowed_hosts": ",".join(hosts)}


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


def test_a_finished_job_posts_an_event_the_standardwebhooks_package_verifies(gateway, key,
                                                                            receiver):
    url = f"http://{receiver.host}/hooks/jobs"
    queued = _queue(gateway, key, {**JOB, "callback_url": url})
    assert queued.status_code == 200, queued.text

    receiver.wait_for(1)

    headers, body = receiver.received[0]
    assert headers["content-type"] == "application/json"
    assert verifies(_secret(gateway), headers, body)
    assert not verifies("whsec_" + base64.b64encode(b"another account's secret").decode(),
                        headers, body)
    assert not verifies(_secret(gateway), headers, body + b" ")  # the body as sent, only
    event = Webhook(_secret(gateway)).verify(body, headers)
    assert event["id"] == headers["webhook-id"]
    assert event["type"] == "job.completed" and event["status"] == "COMPLETED"
    assert event["queue_id"] == queued.json()["queue_id"]
    assert event["model"] == "clip-maker" and isinstance(event["created"], int)
    row = _delivery_when(gateway, event["queue_id"], lambda r: r.delivered_at is not None)
    assert row.attempts == 1


def test_a_failed_job_posts_job_failed_without_internal_text(gateway, key, receiver):
    store = gateway.services.results.root  # a file where the media would go: the write fails
    shutil.rmtree(store, ignore_errors=True)
    store.write_bytes(b"")
    queued = _queue(gateway, key, {**JOB, "callback_url": f"http://{receiver.host}/h"})

    receiver.wait_for(1)

    event = json.loads(receiver.received[0][1])
    assert (event["type"], event["queue_id"]) == ("job.failed", queued.json()["queue_id"])
    assert event["error"] == {"code": "INFERENCE_FAILED", "message": FAILED_MESSAGE}
    assert event["credits_refunded"] is True
    retrieved = gateway.client.post("/api/v1/video/retrieve", headers=gateway.auth(key),
                                    json={"model": "clip-maker",
                                          "queue_id": queued.json()["queue_id"]})
    assert retrieved.status_code == 500, retrieved.text
    assert retrieved.json()["error"] == FAILED_MESSAGE and str(store) not in retrieved.text


def test_a_rotated_secret_signs_beside_the_old_one_for_its_grace(gateway, key, receiver):
    old = _secret(gateway)
    rotated = gateway.client.post("/api/v1/webhooks/secret", headers=gateway.auth())
    assert rotated.status_code == 200
    new = rotated.json()["data"]["secret"]
    assert new != old and _secret(gateway) == new
    assert rotated.json()["data"]["previous_secret_signs_until"] >= int(
        (datetime.now(UTC) + ROTATION_GRACE - timedelta(minutes=1)).timestamp())
    assert gateway.client.get("/api/v1/webhooks/secret",
                              headers=gateway.auth(key)).status_code in (401, 403)

    _queue(gateway, key, {**JOB, "callback_url": f"http://{receiver.host}/h"})
    receiver.wait_for(1)

    headers, body = receiver.received[0]
    assert len(headers["webhook-signature"].split(" ")) == 2
    assert verifies(new, headers, body)  # a receiver already on the new secret
    assert verifies(old, headers, body)  # and one still on the old: an event in flight

    webhooks = gateway.services.webhooks
    later = utcnow() + ROTATION_GRACE + timedelta(seconds=1)
    webhooks.clock = lambda: later
    _queue(gateway, key, {**JOB, "callback_url": f"http://{receiver.host}/h"})
    receiver.wait_for(2)

    headers, body = receiver.received[1]
    assert len(headers["webhook-signature"].split(" ")) == 1  # the grace is over
    assert signed_by(new, headers, body) and not signed_by(old, headers, body)


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
    first_try, second_try = receiver.received
    assert first_try[0]["webhook-id"] == second_try[0]["webhook-id"]  # one event, two tries
    assert signed_by(_secret(gateway), *second_try)


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


def test_a_silent_receiver_never_delays_another_tenants_delivery(gateway, key, receiver,
                                                                 silent):
    # The silent receiver's tries are held open for as long as the test needs (their own
    # deadline lengthened), so that the other delivery can only arrive beside them.
    gateway.services.webhooks.guard.deadline_s = 3600
    gateway.services.webhooks.guard.timeout_s = 3600
    for _ in range(3):
        assert _queue(gateway, key, {**JOB, "callback_url": f"http://{silent.host}/h"}
                      ).status_code == 200
    silent.wait_for_held(2)  # its receiver's places are taken, its tries hang
    other, _ = account_key(gateway, "5")

    queued = _queue(gateway, other, {**JOB, "callback_url": f"http://{receiver.host}/h"})
    receiver.wait_for(1)

    assert json.loads(receiver.received[0][1])["queue_id"] == queued.json()["queue_id"]
    assert silent.arrived == 2  # at most two tries at one receiver at once; none recorded
    silent.released.set()


def test_an_account_of_many_silent_receivers_holds_four_places_and_no_more(
        gateway, key, receiver, silent_ones):
    gateway.services.webhooks.guard.deadline_s = 3600  # held open until the test ends
    gateway.services.webhooks.guard.timeout_s = 3600
    for one in silent_ones:
        assert _queue(gateway, key, {**JOB, "callback_url": f"http://{one.host}/h"}
                      ).status_code == 200
    deadline = time.monotonic() + 60
    while sum(one.arrived for one in silent_ones) < 4:
        assert time.monotonic() < deadline, "the silent receivers' tries did not start"
        time.sleep(0.05)
    other, _ = account_key(gateway, "5")

    queued = _queue(gateway, other, {**JOB, "callback_url": f"http://{receiver.host}/h"})
    receiver.wait_for(1)

    assert json.loads(receiver.received[0][1])["queue_id"] == queued.json()["queue_id"]
    assert sum(one.arrived for one in silent_ones) == 4  # the fifth waits for a place


def test_a_silent_receiver_costs_a_try_its_deadline_and_no_more(gateway, key, silent):
    callbacks = gateway.services.webhooks.guard
    assert callbacks.timeout_s == TRY_TIMEOUT_S <= 5 and callbacks.deadline_s == TRY_DEADLINE_S
    queue_id = _queue(gateway, key, {**JOB, "callback_url": f"http://{silent.host}/h"}
                      ).json()["queue_id"]

    row = _delivery_when(gateway, queue_id, lambda r: r.attempts == 1,
                         timeout_s=TRY_DEADLINE_S + 60)

    assert row.delivered_at is None and row.last_error == "no answer in time"


def test_a_callback_on_a_host_of_the_fetch_allow_list_is_refused(gateway, key, books, media):
    before = books.balance_nanos()

    resp = _queue(gateway, key, {**JOB, "callback_url": f"http://{media.host}/internal"})

    assert resp.status_code == 400, resp.text
    assert "callback_url" in resp.json()["error"]
    assert books.balance_nanos() == before and books.open_holds() == 0


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
