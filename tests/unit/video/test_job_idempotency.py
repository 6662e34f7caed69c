"""`Idempotency-Key` on the queue routes, as a client that lost an answer retries: the same
key and fields answer the first answer and queue and charge nothing more; other fields are a
409; two at once make one job; a key is forgotten after its 24 hours."""

from __future__ import annotations

import asyncio
import threading
from datetime import timedelta

from sqlalchemy import func, select
from sqlmodel import Session
from starlette.responses import Response

from serve_app.db.engine import make_engine
from serve_app.db.tables import JobRow, QueueIdempotency, utcnow
from serve_app.jobs import idempotency
from tests.unit.flows.books import nanos

JOB = {"model": "clip-maker", "prompt": "rain on a window", "duration": "1s",
       "resolution": "256p", "aspect_ratio": "1:1"}
JOB_USD = "0.01"  # 1 s at 256p (catalog.yaml)
SPEECH = {"model": "narrator", "prompt": "The quick brown fox.", "voice": "joe"}


def _queue(gateway, key: str, body: dict, idem: str | None, route: str = "video/queue"):
    headers = {**gateway.auth(key), **({"Idempotency-Key": idem} if idem else {})}
    return gateway.client.post(f"/api/v1/{route}", headers=headers, json=body)


def _count(gateway, table) -> int:
    engine = make_engine(gateway.settings.resolved_database_url)
    try:
        with Session(engine) as session:
            return session.execute(select(func.count()).select_from(table)).scalar_one()
    finally:
        engine.dispose()


def test_the_same_key_and_body_answer_the_first_answer_and_queue_and_charge_once(
        gateway, key, books):
    before = books.balance_nanos()

    first = _queue(gateway, key, JOB, "order-1")
    again = _queue(gateway, key, dict(reversed(list(JOB.items()))), "order-1")

    assert first.status_code == again.status_code == 200, (first.text, again.text)
    assert again.json() == first.json()
    assert again.headers["idempotent-replayed"] == "true"
    assert "idempotent-replayed" not in first.headers
    assert _count(gateway, JobRow) == 1
    assert books.balance_nanos() == before - nanos(JOB_USD)  # held once, whatever happens


def test_queued_audio_takes_the_key_too(gateway, key):
    first = _queue(gateway, key, SPEECH, "speech-1", "audio/queue")
    again = _queue(gateway, key, SPEECH, "speech-1", "audio/queue")

    assert first.status_code == again.status_code == 200, (first.text, again.text)
    assert again.json() == first.json()
    assert _count(gateway, JobRow) == 1


def test_the_same_key_with_another_body_or_route_is_a_409(gateway, key, books):
    assert _queue(gateway, key, JOB, "order-2").status_code == 200
    held = books.balance_nanos()

    other = _queue(gateway, key, {**JOB, "prompt": "snow on a window"}, "order-2")
    elsewhere = _queue(gateway, key, SPEECH, "order-2", "audio/queue")

    for refused in (other, elsewhere):
        assert refused.status_code == 409, refused.text
        assert refused.json() == {"error": refused.json()["error"],
                                  "code": "IDEMPOTENCY_KEY_REUSED"}
    assert _count(gateway, JobRow) == 1
    assert books.balance_nanos() == held


def test_keys_are_per_account(gateway, key):
    from tests.unit.conftest import account_key

    other_key, _ = account_key(gateway, "5")
    mine = _queue(gateway, key, JOB, "shared-name")
    theirs = _queue(gateway, other_key, JOB, "shared-name")

    assert mine.status_code == theirs.status_code == 200
    assert mine.json()["queue_id"] != theirs.json()["queue_id"]


def test_a_key_still_being_queued_is_a_409_in_progress_with_nothing_charged(gateway, key,
                                                                            books):
    keys = gateway.services.job_service.keys
    engine = make_engine(gateway.settings.resolved_database_url)
    digest = idempotency.request_digest("video/queue", JOB)
    with Session(engine) as session:  # the first request has claimed it and not answered
        assert idempotency.claim(session, gateway.account_id, "busy", digest,
                                 utcnow()) is None
        session.commit()
    engine.dispose()
    keys.wait_s = 0
    before = books.balance_nanos()

    twin = _queue(gateway, gateway.admin_key, JOB, "busy")

    assert twin.status_code == 409, twin.text
    assert twin.json()["code"] == "IDEMPOTENCY_KEY_IN_PROGRESS"
    assert _count(gateway, JobRow) == 0
    assert books.balance_nanos() == before


def test_two_requests_with_the_same_key_at_once_make_one_job(gateway, key, books):
    before = books.balance_nanos()
    start = threading.Barrier(2)
    answers = []

    def send() -> None:
        start.wait()
        answers.append(_queue(gateway, key, JOB, "at-once"))

    threads = [threading.Thread(target=send) for _ in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()

    assert {a.status_code for a in answers} <= {200, 409}, [a.text for a in answers]
    made = {a.json()["queue_id"] for a in answers if a.status_code == 200}
    assert len(made) == 1
    assert all(a.json()["code"] == "IDEMPOTENCY_KEY_IN_PROGRESS"
               for a in answers if a.status_code == 409)
    assert _count(gateway, JobRow) == 1
    assert books.balance_nanos() == before - nanos(JOB_USD)


def test_a_key_is_forgotten_after_24_hours_and_swept(gateway, key, books):
    keys = gateway.services.job_service.keys
    first = _queue(gateway, key, JOB, "daily")
    later = [utcnow() + timedelta(hours=23, minutes=59)]
    keys.clock = lambda: later[0]

    assert _queue(gateway, key, JOB, "daily").json() == first.json()  # still within 24 h

    later[0] = utcnow() + timedelta(hours=24, seconds=1)
    fresh = _queue(gateway, key, JOB, "daily")

    assert fresh.status_code == 200, fresh.text
    assert fresh.json()["queue_id"] != first.json()["queue_id"]
    assert _count(gateway, JobRow) == 2
    assert _queue(gateway, key, JOB, "other").status_code == 200
    assert _count(gateway, QueueIdempotency) == 2

    later[0] = utcnow() + timedelta(hours=48, seconds=2)
    assert asyncio.run(keys.sweep()) == 2
    assert _count(gateway, QueueIdempotency) == 0


def test_a_malformed_key_is_a_400(gateway, key):
    resp = _queue(gateway, key, JOB, "not a key!")

    assert resp.status_code == 400
    assert _count(gateway, JobRow) == 0


def test_the_body_is_hashed_only_when_a_key_is_sent_and_off_the_event_loop(gateway):
    """A 65 MB `/video/queue` body's hash held the loop 0.1-0.2 s on every queue call, key or
    not: now it runs only for a key, in a worker thread."""
    keys = idempotency.QueueKeys(gateway.services.engine)
    hashed_on: list[int] = []

    def digest_of() -> str:
        hashed_on.append(threading.get_ident())
        return idempotency.request_digest("video/queue", JOB)

    async def answer() -> Response:
        return Response(b"{}", media_type="application/json")

    async def queue_twice() -> int:
        await keys.once(gateway.account_id, None, digest_of, answer)
        assert hashed_on == []  # no key: nothing hashed
        await keys.once(gateway.account_id, "order-9", digest_of, answer)
        return threading.get_ident()

    loop_thread = gateway.client.portal.call(queue_twice)
    assert len(hashed_on) == 1 and hashed_on[0] != loop_thread
