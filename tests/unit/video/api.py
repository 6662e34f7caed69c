"""The video API as a client uses it in these tests: post, poll until done, and what the
result store holds."""

from __future__ import annotations

import time

import httpx


def post(gateway, key: str, path: str, body: dict) -> httpx.Response:
    return gateway.client.post(f"/api/v1/video/{path}", headers=gateway.auth(key), json=body)


def wait(gateway, key: str, model: str, queue_id: str, timeout_s: float = 120) -> httpx.Response:
    """Poll `/video/retrieve` as a client does until the job is no longer PROCESSING."""
    deadline = time.monotonic() + timeout_s
    while True:
        resp = post(gateway, key, "retrieve", {"model": model, "queue_id": queue_id})
        if not (resp.status_code == 200 and resp.headers["content-type"].startswith(
                "application/json") and resp.json().get("status") == "PROCESSING"):
            return resp
        assert time.monotonic() < deadline, "the job was not made in time"
        time.sleep(0.05)


def stored(gateway) -> list[str]:
    """The names of the files in the gateway's result store."""
    root = gateway.settings.data_dir / "results"
    return sorted(p.name for p in root.rglob("*") if p.is_file()) if root.exists() else []


def stored_when(gateway, expected: list[str], timeout_s: float = 120) -> list[str]:
    """The store's files once they are `expected`, or as they are when the time is up (a job
    answers COMPLETED a moment before its runner has deleted its inputs)."""
    deadline = time.monotonic() + timeout_s
    while stored(gateway) != expected and time.monotonic() < deadline:
        time.sleep(0.05)
    return stored(gateway)
