"""What following a background response costs its readers (serve_app/responses/follow.py): a
writer appends events at a steady pace, as a worker does, while one reader follows them on
the writer's replica and one on another replica (another `Followers`, its own clients of the
same database or Redis). For each reader: the reads of the response's row and of its events
per event delivered, and the median time from an append to the reader's having the event;
and the process's CPU time per event (writer and readers together).

    .venv/bin/python benchmarks/responses_follow.py [--events 400] [--every-ms 5]
                                                    [--redis redis://...]
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import tempfile
import time
import uuid
from datetime import timedelta
from typing import Any

from sqlalchemy import Engine

from serve_app.db.engine import make_engine, migrate
from serve_app.db.tables import StoredResponse, utcnow
from serve_app.responses.events import EventLog, RedisEventLog, TableEventLog
from serve_app.responses.follow import Followers
from serve_app.responses.progress import compact
from serve_app.responses.store import ResponseStore, ResponseView

OWNER = "bench-writer"


class Counted(ResponseStore):
    """The store, counting its reads of a response's row."""

    gets = 0

    async def get(self, response_id: str) -> ResponseView | None:
        self.gets += 1
        return await super().get(response_id)


class CountedLog:
    """An event log, counting its reads (every other call passed through)."""

    def __init__(self, log: EventLog) -> None:
        self.log, self.reads = log, 0

    async def read(self, response_id: str, after: int) -> list[tuple[int, str]]:
        self.reads += 1
        return await self.log.read(response_id, after)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.log, name)


def _event(seq: int) -> str:
    return compact({"type": "response.output_text.delta", "sequence_number": seq,
                    "item_id": "msg_x", "output_index": 0, "content_index": 0,
                    "delta": "word ", "logprobs": []})


async def _read(followers: Followers, response_id: str, sent: dict[int, float],
                lags: list[float]) -> int:
    count = 0
    async for event in followers.follow("acct", response_id, -1, resumed=False):
        seq = int(event.split("\n", 1)[0].removeprefix("id: "))
        lags.append(time.perf_counter() - sent[seq])
        count += 1
    return count


def _add_row(engine: Engine, response_id: str) -> None:
    from sqlmodel import Session
    now = utcnow()
    with Session(engine) as session:
        session.add(StoredResponse(
            id=response_id, account_id="acct", request_id=response_id, status="in_progress",
            response=compact({"id": response_id, "object": "response"}), lease_owner=OWNER,
            lease_expires_at=now + timedelta(minutes=5), expires_at=now + timedelta(hours=1)))
        session.commit()


async def measure(name: str, engine: Engine, open_log, events: int, every_s: float) -> None:
    response_id = f"resp_{uuid.uuid4().hex}"
    _add_row(engine, response_id)
    lease = timedelta(minutes=5)
    replicas = []
    for origin in (OWNER, "another"):  # the writer's replica, then another
        store, log = Counted(engine, lease=lease), CountedLog(open_log())
        replicas.append((store, log, Followers(store, log, followers_per_account=16,
                                               origin=origin)))
    here, there = replicas[0][2], replicas[1][2]
    listening = [asyncio.create_task(followers.listen()) for followers in (here, there)]
    await asyncio.sleep(0.2)  # the subscriptions made
    sent: dict[int, float] = {}
    lags: list[list[float]] = [[], []]
    readers = [asyncio.create_task(_read(f, response_id, sent, lags[i]))
               for i, f in enumerate((here, there))]
    await asyncio.sleep(0.1)
    for store, log, _ in replicas:
        store.gets, log.reads = 0, 0
    writer_store, writer_log = replicas[0][0], replicas[0][1].log
    await writer_log.claim(response_id, OWNER)
    cpu = time.process_time()
    for seq in range(events):
        sent[seq] = time.perf_counter()
        await writer_log.append(response_id, seq, _event(seq), OWNER)
        here.notify(response_id)
        await asyncio.sleep(every_s)
    await writer_store.write(response_id, OWNER, status="completed", ended=True)
    await here.end(response_id)
    counts = await asyncio.gather(*readers)
    cpu = time.process_time() - cpu
    for task in listening:
        task.cancel()
    for (store, log, _), where, lag, count in zip(replicas, ("here", "another replica"),
                                                  lags, counts, strict=True):
        assert count == events, (where, count)
        print(f"{name}, reader {where}: {store.gets / events:.3f} row reads and "
              f"{log.reads / events:.3f} event reads per event; from append to reader "
              f"median {statistics.median(lag) * 1e3:.2f} ms, p95 "
              f"{sorted(lag)[int(0.95 * len(lag))] * 1e3:.2f} ms")
        await log.close()
    print(f"{name}: CPU {cpu / events * 1e3:.3f} ms per event (writer and both readers)")


async def main(events: int, every_s: float, redis_url: str) -> None:
    url = f"sqlite:///{tempfile.mkdtemp()}/follow.db"
    migrate(url)
    engine = make_engine(url)
    await measure("database table (SQLite)", engine, lambda: TableEventLog(engine), events,
                  every_s)
    prefix = f"bench-{uuid.uuid4().hex[:6]}"
    await measure("Redis", engine, lambda: RedisEventLog(redis_url, prefix=prefix, kept_s=60),
                  events, every_s)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--events", type=int, default=400)
    parser.add_argument("--every-ms", type=float, default=5.0)
    parser.add_argument("--redis", default="redis://127.0.0.1:6379/0")
    args = parser.parse_args()
    asyncio.run(main(args.events, args.every_ms / 1000, args.redis))
