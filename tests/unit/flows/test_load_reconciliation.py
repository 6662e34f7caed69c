"""The load test's reconciliation (loadtest/reconcile.py) of background responses, as the load
mix uses them: a stream cut after event k and resumed, polled and deleted, a cancelled one. Each
is charged once, under the request that created it; the reads (resume, polls, cancel, delete)
are charged nothing; the books reconcile to the nano-dollar."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import pytest

from loadtest.reconcile import reconcile
from tests.fakes import FakeTextDeployment

REPLY = "one two three four five six seven eight"
WAIT_S = 60  # a bound for a broken build only: the test waits on the response's status


@pytest.fixture
def text(fakes) -> FakeTextDeployment:
    fake = fakes["text-xs"]
    for engine in fake.engines.values():
        engine.reply, engine.pieces = REPLY, len(REPLY.split())
    return fake


def _line(resp: Any, route: str, **extra: Any) -> str:
    """A line of the load test's record (loadtest/locustfile.py `record`)."""
    return json.dumps({"cf_ray": resp.headers["CF-RAY"], "route": route,
                       "status": resp.status_code, "usage": {}, "t": time.time(), **extra})


def _ended(client, auth: dict[str, str], response_id: str) -> tuple[Any, dict]:
    for _ in range(WAIT_S * 20):
        got = client.get(f"/api/v1/responses/{response_id}", headers=auth)
        if got.json()["status"] not in ("queued", "in_progress"):
            return got, got.json()
        time.sleep(0.05)
    raise AssertionError("the response never ended")


def test_cut_resumed_and_cancelled_responses_are_charged_once_and_their_reads_nothing(
        fake_gateway, key, text, books, tmp_path: Path, monkeypatch):
    monkeypatch.setenv("DATA_DIR", str(tmp_path))  # the reconciliation reads this database
    client, auth = fake_gateway.client, fake_gateway.auth(key)
    start = books.balance_nanos()
    lines = []
    body = {"model": "chat-primary", "input": "Count", "background": True}

    with client.stream("POST", "/api/v1/responses", headers=auth,
                       json={**body, "stream": True}) as cut:
        seen = []
        for line in cut.iter_lines():
            if line.startswith("data: "):
                seen.append(json.loads(line[6:]))
                if seen[-1]["sequence_number"] == 3:
                    break  # the connection drops here
    response_id = seen[0]["response"]["id"]
    resumed = client.get(f"/api/v1/responses/{response_id}?stream=true&starting_after=3",
                         headers=auth)
    polled, final = _ended(client, auth, response_id)
    deleted = client.delete(f"/api/v1/responses/{response_id}", headers=auth)
    usage = {"prompt_tokens": final["usage"]["input_tokens"],
             "completion_tokens": final["usage"]["output_tokens"]}
    lines += [_line(cut, "responses", usage=usage, response_id=response_id,
                    final=final["status"])]
    lines += [_line(read, "responses/read", read=True) for read in (resumed, polled, deleted)]

    created = client.post("/api/v1/responses", headers=auth, json=body)
    cancelled = client.post(f"/api/v1/responses/{created.json()['id']}/cancel", headers=auth)
    status = cancelled.json()["status"]
    lines += [_line(created, "responses", response_id=created.json()["id"], final=status,
                    **({} if status == "completed" else {"charge": "maybe"})),
              _line(cancelled, "responses/read", read=True)]
    record = tmp_path / "record.jsonl"
    record.write_text("\n".join(lines) + "\n")

    result = reconcile(fake_gateway.account_id, str(record), start)

    assert final["status"] == "completed" and status in ("cancelled", "completed")
    assert result["reconciled"], result
    assert result["missing_entries"] == result["wrong_units"] == 0
    assert result["background"]["created"] == 2
    assert result["background"]["reads"] == 4 and result["background"]["charged_reads"] == 0
    assert result["background"]["charged"] + result["background"]["cut_short_uncharged"] == 2
    assert result["balance_matches"] and result["open_holds"] == 0
