"""What keeping a background response's events costs: one append (the worker, per event) and
one read of the events after a number (a reader's poll, a resume), on each event log
(serve_app/responses/events.py): the database's table (SQLite here) and Redis.

    .venv/bin/python benchmarks/responses_events.py [--events 300] [--redis redis://...]
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import tempfile
import time
import uuid

from serve_app.db.engine import make_engine, migrate
from serve_app.responses.events import EventLog, RedisEventLog, TableEventLog

EVENT = ('{"type":"response.output_text.delta","sequence_number":0,"item_id":"msg_x",'
         '"output_index":0,"content_index":0,"delta":"word ","logprobs":[]}')


async def measure(name: str, log: EventLog, events: int) -> None:
    response_id = f"resp_{uuid.uuid4().hex}"
    appends = []
    for seq in range(events):
        started = time.perf_counter()
        await log.append(response_id, seq, EVENT)
        appends.append(time.perf_counter() - started)
    reads = []
    for _ in range(50):
        started = time.perf_counter()
        tail = await log.read(response_id, events - 10)
        reads.append(time.perf_counter() - started)
    assert len(tail) == 9
    started = time.perf_counter()
    assert len(await log.read(response_id, -1)) == events
    whole = time.perf_counter() - started
    await log.delete(response_id)
    await log.close()
    print(f"{name}: append median {statistics.median(appends) * 1e3:.2f} ms, "
          f"p95 {sorted(appends)[int(0.95 * events)] * 1e3:.2f} ms; read of the last 9 median "
          f"{statistics.median(reads) * 1e3:.2f} ms; read of all {events} "
          f"{whole * 1e3:.1f} ms")


async def main(events: int, redis_url: str) -> None:
    url = f"sqlite:///{tempfile.mkdtemp()}/events.db"
    migrate(url)
    await measure("database table (SQLite)", TableEventLog(make_engine(url)), events)
    await measure("Redis", RedisEventLog(redis_url, prefix=f"bench-{uuid.uuid4().hex[:6]}",
                                         kept_s=60), events)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--events", type=int, default=300)
    parser.add_argument("--redis", default="redis://127.0.0.1:6379/0")
    args = parser.parse_args()
    asyncio.run(main(args.events, args.redis))
