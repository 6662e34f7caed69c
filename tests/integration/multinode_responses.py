"""Driver of the multi-node test of background responses, run as its own process
(tests/integration/two_nodes.py): the platform on a two-node cluster with PostgreSQL and
Redis, a Gateway replica on each node, the text model pinned to the head. Background
responses are created until some are driven by the second node's Gateway replica and under
way; then the second node is killed (that replica with it). The surviving replica's sweep
takes them over: every response is waited for until it has ended, then streamed from its
first event through the surviving Gateway. Prints one JSON object: what it saw.

    python -m tests.integration.multinode_responses ADDRESS PORT DATA_DIR DATABASE_URL REDIS_URL
"""

from __future__ import annotations

import json
import sys
import time
import uuid
from typing import Any

import httpx

from tests.integration.multinode import ADMIN_KEY, _node_roles, deploy, kill_second_node

MODEL = "tiny-chat"  # the smallest text model of tests/integration/catalog.yaml
MOST_RESPONSES = 16  # created until SECOND_NODE_AT_LEAST of them run on the second node
SECOND_NODE_AT_LEAST = 2
MAX_OUTPUT_TOKENS = 900  # long enough to be under way when the node dies
# Text kept before the node dies: 1000 characters of the model's counting are some 160
# tokens (about 6 characters a token), above the 87 its 1024-token context leaves beside the
# 37-token prompt and MAX_OUTPUT_TOKENS.
KEPT_CHARS = 1000
LEASE_S = 6  # the responses' lease (job_lease_s): a dead replica's run out within it
DEADLINE_S = 600  # generous: a broken build only


def _pin_text_model_to_the_head() -> None:
    """The text deployment's replica asks for the head's resource, so it stays alive when
    the second node dies (the Gateway replica there, and what it drove, is what is lost)."""
    import deployments.registry as registry

    options_of = registry.deployment_options

    def pinned(name: str) -> dict[str, Any]:
        options = options_of(name)
        if name == "text-xs":
            actor = options.setdefault("ray_actor_options", {})
            actor["resources"] = {**actor.get("resources", {}), "head_node": 0.01}
        return options
    registry.deployment_options = pinned


def _gateway_pids() -> dict[int, str]:
    """The pid of each live Gateway replica -> the role of its node."""
    from ray._private.state import actors

    roles = _node_roles()
    return {int(actor["Pid"]): roles.get(actor["Address"]["NodeID"], "?")
            for actor in actors(actor_state_name="ALIVE").values()
            if (actor.get("ActorClassName") or "").endswith(":Gateway")}


def _rows(database_url: str, ids: list[str]) -> dict[str, tuple[str, str | None]]:
    """Response id -> (status, lease owner) as the shared database has them."""
    from sqlmodel import Session, col, select

    from serve_app.db.engine import make_engine
    from serve_app.db.tables import StoredResponse

    engine = make_engine(database_url)
    try:
        with Session(engine) as session:
            rows = session.exec(select(StoredResponse).where(col(StoredResponse.id).in_(ids)))
            return {row.id: (row.status, row.lease_owner) for row in rows}
    finally:
        engine.dispose()


def _books(database_url: str, request_ids: list[str]) -> dict[str, Any]:
    """Per request: its ledger entries; and the holds left open."""
    from sqlmodel import Session, col, func, select

    from serve_app.db.engine import make_engine
    from serve_app.db.tables import LedgerEntry, Reservation

    engine = make_engine(database_url)
    try:
        with Session(engine) as session:
            charges = {r: session.exec(select(func.count()).select_from(LedgerEntry)
                                       .where(col(LedgerEntry.request_id) == r)).one()
                       for r in request_ids}
            holds = session.exec(select(func.count()).select_from(Reservation)
                                 .where(col(Reservation.request_id).in_(request_ids))).one()
            return {"charges": charges, "open_holds": int(holds)}
    finally:
        engine.dispose()


def _owner_role(owner: str | None, pids: dict[int, str]) -> str | None:
    """The node role of a lease owner (`host:pid:tag`)."""
    if owner is None:
        return None
    return pids.get(int(owner.split(":")[1]), "?")


def _text_kept(redis_url: str, response_id: str) -> int:
    """The characters of output text the response's events kept so far."""
    import redis

    client = redis.Redis.from_url(redis_url)
    try:
        events = [json.loads(e) for e in
                  client.lrange(f"multinode:responses:{{{response_id}}}:events", 0, -1)]
    finally:
        client.close()
    return sum(len(e.get("delta", "")) for e in events
               if e.get("type") == "response.output_text.delta")


def _sse_events(body: str) -> list[dict[str, Any]]:
    return [json.loads(line[len("data: "):]) for line in body.splitlines()
            if line.startswith("data: ")]


def _until(check, what: str) -> Any:
    """`check()` until it gives something truthy (HTTP errors of a dying replica retried)."""
    deadline = time.monotonic() + DEADLINE_S
    while time.monotonic() < deadline:
        try:
            found = check()
        except httpx.HTTPError:
            found = None
        if found:
            return found
        time.sleep(0.5)
    raise TimeoutError(what)


def main(address: str, port: int, data_dir: str, database_url: str, redis_url: str) -> dict:
    _pin_text_model_to_the_head()
    placed = deploy(address, port, data_dir, database_url, redis_url,
                    deployments=("text-xs",), settings={"job_lease_s": LEASE_S})
    base = f"http://127.0.0.1:{port}/api/v1"
    admin = {"Authorization": f"Bearer {ADMIN_KEY}"}
    key = httpx.post(f"{base}/api_keys", headers=admin, timeout=30,
                     json={"apiKeyType": "INFERENCE", "description": "multinode"}
                     ).json()["data"]["apiKey"]
    auth = {"Authorization": f"Bearer {key}"}
    pids = _gateway_pids()

    created: dict[str, str] = {}  # response id -> its request id (its hold's)
    on_second: list[str] = []
    while len(created) < MOST_RESPONSES and len(on_second) < SECOND_NODE_AT_LEAST:
        request_id = f"mn-{uuid.uuid4().hex}"
        resp = httpx.post(f"{base}/responses", timeout=60,
                          headers={**auth, "X-Request-ID": request_id},
                          json={"model": MODEL, "input": "Count from one to a thousand.",
                                "background": True, "temperature": 0,
                                "max_output_tokens": MAX_OUTPUT_TOKENS})
        resp.raise_for_status()
        response_id = resp.json()["id"]
        created[response_id] = request_id
        _, owner = _rows(database_url, [response_id])[response_id]
        if _owner_role(owner, pids) == "worker":
            on_second.append(response_id)
    # under way on the second node, with more text kept than the context leaves beside the
    # prompt and max_output_tokens: the continuation cannot ask for max_tokens on top of it
    for response_id in on_second:
        _until(lambda r=response_id: _text_kept(redis_url, r) >= KEPT_CHARS,
               f"the text of {response_id}")
    at_kill = _rows(database_url, list(created))
    kept_at_kill = {r: _text_kept(redis_url, r) for r in on_second}
    kill_second_node()
    killed = time.monotonic()
    taken_over = [r for r in on_second if at_kill[r][0] in ("queued", "in_progress")]

    ended: dict[str, str] = {}
    errors: dict[str, Any] = {}  # why each response that did not complete ended as it did
    for response_id in created:
        def status(r: str = response_id) -> str | None:
            got = httpx.get(f"{base}/responses/{r}", headers=auth, timeout=30)
            got.raise_for_status()
            found = got.json()
            if found["status"] in ("queued", "in_progress"):
                return None
            if found["status"] != "completed":
                errors[r] = found.get("error")
            return found["status"]
        ended[response_id] = _until(status, f"the end of {response_id}")
    ended_after_s = round(time.monotonic() - killed, 1)

    streams: dict[str, dict[str, Any]] = {}
    for response_id in created:
        def stream(r: str = response_id) -> list[dict[str, Any]] | None:
            got = httpx.get(f"{base}/responses/{r}", headers=auth, timeout=120,
                            params={"stream": "true"})
            got.raise_for_status()
            return _sse_events(got.text)
        events = _until(stream, f"the stream of {response_id}")
        last = events[-1]
        streams[response_id] = {
            "events": len(events),
            "contiguous": [e["sequence_number"] for e in events] == list(range(len(events))),
            "last": last["type"],
            "text_chars": sum(len(e.get("delta", "")) for e in events
                              if e["type"] == "response.output_text.delta"),
            "output_tokens": (last.get("response", {}).get("usage") or {}).get(
                "output_tokens")}
    return {"placed": placed, "created": len(created), "on_second_node": len(on_second),
            "text_chars_kept_at_kill": kept_at_kill,
            "taken_over": len(taken_over), "statuses": ended, "errors": errors,
            "ended_after_kill_s": ended_after_s,
            "streams": streams, **_books(database_url, list(created.values()))}


if __name__ == "__main__":
    address, port, data_dir, database_url, redis_url = sys.argv[1:6]
    print(json.dumps(main(address, int(port), data_dir, database_url, redis_url)))
