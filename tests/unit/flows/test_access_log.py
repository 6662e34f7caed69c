"""The access log: one JSON line per request once its answer is out, found by the request id
the client sent, with what the request was charged and never a key."""

from __future__ import annotations

import json
import logging

import pytest

from serve_app.access_log import account_hash
from tests.unit.flows.sse import DONE, events


@pytest.fixture
def access_lines(caplog):
    caplog.set_level(logging.INFO, logger="serve_app.access")

    def lines() -> list[dict]:
        return [json.loads(r.getMessage()) for r in caplog.records
                if r.name == "serve_app.access"]

    return lines


def test_a_streamed_chat_has_one_line_under_the_clients_request_id(fake_gateway, key, books,
                                                                  access_lines):
    resp = fake_gateway.client.post(
        "/api/v1/chat/completions", headers={**fake_gateway.auth(key), "X-Request-ID": "ab-12"},
        json={"model": "chat-primary", "messages": [{"role": "user", "content": "Hi"}],
              "stream": True, "stream_options": {"include_usage": True}})
    assert resp.status_code == 200
    sent = events(resp.text)
    assert sent[-1] == DONE
    usage = sent[-2]["usage"]

    (line,) = [entry for entry in access_lines() if entry["request_id"] == "ab-12"]
    charge = books.only_charge("ab-12")
    assert line["method"] == "POST"
    assert line["route"] == "/chat/completions"
    assert line["status"] == 200
    assert line["error_code"] is None
    assert line["model"] == "chat-primary"
    assert line["account"] == account_hash(fake_gateway.account_id)
    assert line["tokens_in"] == usage["prompt_tokens"]
    assert line["tokens_out"] == usage["completion_tokens"]
    assert line["cost_nanos_usd"] == charge.total_nanos > 0
    assert 0 < line["ttft_ms"] <= line["duration_ms"]
    assert 0 <= line["gate_wait_ms"] <= line["ttft_ms"]  # the replica's gate, as it told
    assert line["client"] == "testclient"
    assert key not in json.dumps(line) and fake_gateway.account_id not in json.dumps(line)


def test_a_unary_chat_logs_the_gates_wait_and_no_first_token(fake_gateway, key, access_lines):
    resp = fake_gateway.client.post(
        "/api/v1/chat/completions", headers=fake_gateway.auth(key),
        json={"model": "chat-primary", "messages": [{"role": "user", "content": "Hi"}]})
    assert resp.status_code == 200

    (line,) = [entry for entry in access_lines()
               if entry["request_id"] == resp.headers["cf-ray"]]
    assert line["ttft_ms"] is None
    assert 0 <= line["gate_wait_ms"] <= line["duration_ms"]
    assert line["tokens_out"] == resp.json()["usage"]["completion_tokens"]


def test_an_error_answer_logs_its_code(fake_gateway, key, access_lines):
    resp = fake_gateway.client.post(
        "/api/v1/chat/completions", headers=fake_gateway.auth(key),
        json={"model": "no-such-model", "messages": [{"role": "user", "content": "Hi"}]})
    assert resp.status_code == 404

    (line,) = [entry for entry in access_lines()
               if entry["request_id"] == resp.headers["cf-ray"]]
    assert (line["status"], line["error_code"]) == (404, "MODEL_NOT_FOUND")
    assert line["tokens_in"] == line["tokens_out"] == line["cost_nanos_usd"] == 0
    assert line["ttft_ms"] is None


def test_every_request_has_exactly_one_line(fake_gateway, access_lines):
    answers = [fake_gateway.client.get("/api/v1/models"),
               fake_gateway.client.get("/api/v1/api_keys"),  # 401
               fake_gateway.client.get("/elsewhere"),  # the site's 404
               fake_gateway.client.get("/health")]
    ids = [resp.headers["cf-ray"] for resp in answers]
    logged = [entry["request_id"] for entry in access_lines()]
    assert sorted(logged) == sorted(ids)
    by_id = {entry["request_id"]: entry for entry in access_lines()}
    assert [by_id[i]["status"] for i in ids] == [200, 401, 404, 200]
    assert by_id[ids[0]]["route"] == "/models"
    assert by_id[ids[1]]["error_code"] == "AUTHENTICATION_FAILED"


def test_in_a_serve_replica_a_line_reaches_serves_logger_as_it_is(monkeypatch):
    """A Serve replica's stderr is Serve's StreamToLogger, which walks the stack for every
    line written to it: the access lines are handed to its logger directly, unchanged."""
    import sys

    from ray.serve._private.logging_utils import StreamToLogger

    from serve_app import access_log

    received: list[logging.LogRecord] = []

    class Keep(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            received.append(record)

    replica_logger = logging.getLogger("test.serve-replica")
    monkeypatch.setattr(replica_logger, "handlers", [Keep()])
    monkeypatch.setattr(replica_logger, "propagate", False)
    monkeypatch.setattr(sys, "stderr", StreamToLogger(replica_logger, logging.INFO, sys.stderr))
    monkeypatch.setattr(access_log.logger, "handlers", [])
    monkeypatch.setattr(access_log.logger, "propagate", True)
    monkeypatch.setattr(access_log.logger, "level", logging.INFO)

    def no_stack_walk() -> int:
        raise AssertionError("the line went through the stderr redirect")

    monkeypatch.setattr(StreamToLogger, "get_stacklevel", staticmethod(no_stack_walk))
    access_log.write_access_lines_bare()
    line = json.dumps({"request_id": "req-1", "status": 200}, separators=(",", ":"))

    access_log.logger.info("%s", line)

    assert [r.getMessage() for r in received] == [line]
    assert access_log.logger.propagate is False  # once, not also through the root logger
