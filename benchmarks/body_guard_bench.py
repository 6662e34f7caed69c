"""What a caller not known yet, a large body or a crafted image costs the Gateway's event loop.

In process, no Serve: the site (`create_prefixed_app`) on the test client's loop, called as an
ASGI server calls it. Prints, for each case, how long it took and the event loop's longest
stall meanwhile (a 5 ms ticker's worst lateness), and the cheap authenticated route's time
per request (`GET /api_keys/rate_limits`, the `make bench` figure) on its own.

    .venv/bin/python benchmarks/body_guard_bench.py          # this tree
    PYTHONPATH=/tmp/before .venv/bin/python /tmp/before/benchmarks/body_guard_bench.py

(the second after `git archive <commit> | tar -x -C /tmp/before`, to compare with an older
tree: the script uses nothing newer than the test fixtures).
"""

from __future__ import annotations

import asyncio
import base64
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from serve_app.images.inputs import inspect_image
from serve_app.settings import Settings
from tests.unit.conftest import make_gateway

MB = 1024 * 1024
NESTED_30MB = b"[" + b"[]," * (10 * MB) + b"[]]"  # ten million empty lists
PADDED_JPEG = b"\xff\xd8\xff" + b"\xff" * (25 * MB - 4)


async def call(app, method: str, path: str, body: bytes, headers: dict[str, str]) -> int:
    sent = False

    async def receive() -> dict[str, Any]:
        nonlocal sent
        if not sent:
            sent = True
            return {"type": "http.request", "body": body, "more_body": False}
        await asyncio.Event().wait()
        raise AssertionError

    status = 0

    async def send(message: dict[str, Any]) -> None:
        nonlocal status
        if message["type"] == "http.response.start":
            status = message["status"]

    head = {"host": "testserver", "content-length": str(len(body)), **headers}
    await app({"type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1",
               "method": method, "scheme": "http", "path": path, "raw_path": path.encode(),
               "query_string": b"", "root_path": "", "client": ("203.0.113.5", 5000),
               "server": ("testserver", 80),
               "headers": [(k.encode(), v.encode()) for k, v in head.items()]},
              receive, send)
    return status


async def stalls(work: Callable[[], Awaitable[Any]]) -> tuple[Any, float, float]:
    """(what `work()` returned, seconds it took, the loop's longest stall meanwhile)."""
    worst = 0.0

    async def ticker() -> None:
        nonlocal worst
        while True:
            before = time.perf_counter()
            await asyncio.sleep(0.005)
            worst = max(worst, time.perf_counter() - before - 0.005)

    tick = asyncio.create_task(ticker())
    await asyncio.sleep(0.02)
    started = time.perf_counter()
    result = await work()
    took = time.perf_counter() - started
    await asyncio.sleep(0.01)  # the ticker notes a stall that lasted to the end
    tick.cancel()
    return result, took, worst


async def cheap(app, auth: dict[str, str], n: int = 3000) -> float:
    """Microseconds a request of the cheap authenticated route, one at a time: the best of
    ten batches (the machine is shared; the best batch is the least disturbed)."""
    for _ in range(200):
        await call(app, "GET", "/api/v1/api_keys/rate_limits", b"", auth)
    batches = []
    for _ in range(10):
        started = time.perf_counter()
        for _ in range(n // 10):
            await call(app, "GET", "/api/v1/api_keys/rate_limits", b"", auth)
        batches.append((time.perf_counter() - started) / (n // 10) * 1e6)
    return min(batches)


async def inspect() -> str:
    try:
        inspect_image(PADDED_JPEG, "image")
    except Exception as exc:  # the refusal is what is timed
        return type(exc).__name__
    return "accepted"


async def cases(app, key: str) -> None:
    auth = {"authorization": f"Bearer {key}"}
    json_type = {"content-type": "application/json"}
    print(f"cheap route, in process: {await cheap(app, auth):.0f} us a request")
    statuses, took, worst = await stalls(lambda: asyncio.gather(*(
        call(app, "POST", "/api/v1/chat/completions", NESTED_30MB, json_type)
        for _ in range(4))))
    print(f"4 anonymous 30 MB [[],...] bodies: {statuses} in {took:.2f} s, loop stalled up "
          f"to {worst * 1000:.0f} ms")
    status, took, worst = await stalls(lambda: call(
        app, "POST", "/api/v1/chat/completions", NESTED_30MB, {**auth, **json_type}))
    print(f"a known key's 30 MB [[],...] body: {status} in {took:.2f} s, loop stalled up to "
          f"{worst * 1000:.0f} ms")
    image = b'{"image": "' + base64.b64encode(b"\x00" * 24 * MB) + b'"}'
    status, took, worst = await stalls(lambda: call(
        app, "POST", "/api/v1/image/upscale", image, {**auth, **json_type}))
    print(f"a known key's 32 MB base64 body (parsed, then refused): {status} in {took:.2f} s, "
          f"loop stalled up to {worst * 1000:.0f} ms")
    result, took, _ = await stalls(inspect)
    print(f"inspect_image of the 25 MB marker-padded JPEG: {result} in {took * 1000:.1f} ms "
          "(on the loop: the stall is the time)")
    print(f"cheap route, in process, again: {await cheap(app, auth):.0f} us a request")


async def cheap_only(app, key: str) -> None:
    auth = {"authorization": f"Bearer {key}"}
    print(f"cheap route, in process: {await cheap(app, auth, 10_000):.0f} us a request")


def main() -> None:
    """`body_guard_bench.py cheap`: the cheap route alone (for alternating A/B runs)."""
    run = cheap_only if sys.argv[1:] == ["cheap"] else cases
    with tempfile.TemporaryDirectory() as data:
        for gw in make_gateway(Settings(data_dir=Path(data), initial_credit_usd=10)):
            gw.client.portal.call(run, gw.client.app, gw.create_key()["apiKey"])


if __name__ == "__main__":
    main()
