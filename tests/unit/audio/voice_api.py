"""The voice-changer API as a client uses it in these tests: queue an upload or a URL, poll
until done, and the job's row."""

from __future__ import annotations

import time

import httpx

from serve_app.db.engine import make_engine
from serve_app.db.tables import JobRow, LedgerEntry

VC = "/api/v1/audio/voice-changer"


def queue_file(gateway, key: str, data: bytes, *, filename: str = "voice.wav",
               content_type: str = "audio/wav", headers: dict | None = None,
               **fields: str) -> httpx.Response:
    return gateway.client.post(f"{VC}/queue", headers={**gateway.auth(key), **(headers or {})},
                               data={"model": "changer", **fields},
                               files={"file": (filename, data, content_type)})


def queue_json(gateway, key: str, body: dict, headers: dict | None = None) -> httpx.Response:
    return gateway.client.post(f"{VC}/queue", headers={**gateway.auth(key), **(headers or {})},
                               json=body)


def call(gateway, key: str, path: str, body: dict) -> httpx.Response:
    return gateway.client.post(f"/api/v1/audio/{path}", headers=gateway.auth(key), json=body)


def wait(gateway, key: str, queue_id: str, timeout_s: float = 120) -> httpx.Response:
    """Poll `/audio/voice-changer/retrieve` as a client does until it is not PROCESSING."""
    deadline = time.monotonic() + timeout_s
    while True:
        resp = call(gateway, key, "voice-changer/retrieve",
                    {"model": "changer", "queue_id": queue_id})
        if not (resp.status_code == 200 and resp.headers["content-type"].startswith(
                "application/json") and resp.json().get("status") == "PROCESSING"):
            return resp
        assert time.monotonic() < deadline, "the voice change was not made in time"
        time.sleep(0.05)


def job_rows(gateway) -> list[JobRow]:
    from sqlmodel import Session, select

    engine = make_engine(gateway.settings.resolved_database_url)
    try:
        with Session(engine) as session:
            return list(session.exec(select(JobRow)).all())
    finally:
        engine.dispose()


def ledger_entry(gateway, request_id: str) -> LedgerEntry | None:
    from sqlmodel import Session

    engine = make_engine(gateway.settings.resolved_database_url)
    try:
        with Session(engine) as session:
            return session.get(LedgerEntry, request_id)
    finally:
        engine.dispose()
