"""The load generators of the benchmarks, the same for our API and for the peer stack: wrk for
request rates and latency, an httpx client for streamed chats."""

from __future__ import annotations

import asyncio
import json
import re
import statistics
import subprocess
import tempfile
import time
from pathlib import Path

import httpx

PROMPT = "Write a long, detailed story about a lighthouse keeper and a storm."

# Streams are measured this many times, on both sides, and the best run counts: a shared
# 2-core machine stalls single runs now and then.
RUNS = 2

# A delta with text in it, however the server spaces its JSON (LiteLLM writes `": "`).
_CONTENT = re.compile(r'"content":\s?"[^"]')


def best(runs: list[tuple[float, float]]) -> tuple[float, float]:
    """(the best tokens/s, the lowest median time to first token) of several runs."""
    return max(r[0] for r in runs), min(r[1] for r in runs)


def wrk(url: str, concurrency: int, seconds: int, *, headers: dict[str, str] | None = None,
        body: dict | None = None) -> dict[str, float]:
    """req/s and p50 latency (ms) from wrk; any non-2xx answer fails the benchmark."""
    cmd = ["wrk", f"-t{min(2, concurrency)}", f"-c{concurrency}", f"-d{seconds}s", "--latency"]
    for name, value in (headers or {}).items():
        cmd += ["-H", f"{name}: {value}"]
    if body is not None:
        script = Path(tempfile.mkdtemp()) / "post.lua"
        script.write_text(f"wrk.method = \"POST\"\nwrk.body = {json.dumps(json.dumps(body))}\n"
                          "wrk.headers[\"Content-Type\"] = \"application/json\"\n")
        cmd += ["-s", str(script)]
    out = subprocess.run([*cmd, url], capture_output=True, text=True, check=True).stdout
    errors = re.search(r"Non-2xx or 3xx responses: (\d+)", out)
    if errors:
        raise RuntimeError(f"{errors.group(1)} failed requests to {url}:\n{out}")
    p50 = re.search(r"^\s*50%\s+([\d.]+)(us|ms|s)\s*$", out, re.M)
    if p50 is None:  # no request completed in the window
        return {"rps": 0.0, "p50_ms": float("inf")}
    scale = {"us": 0.001, "ms": 1.0, "s": 1000.0}[p50.group(2)]
    return {"rps": float(re.search(r"Requests/sec:\s+([\d.]+)", out).group(1)),
            "p50_ms": float(p50.group(1)) * scale}


async def stream_chats(base: str, key: str, model: str, streams: int, tokens: int,
                       extra: dict | None = None) -> tuple[float, float]:
    """(completion tokens/s over all streams, median time to first token in ms): `streams`
    greedy chats at once, after one to warm up, `RUNS` times; the best run counts. `extra`:
    more fields of the request body."""
    body = {"model": model, "temperature": 0, "max_tokens": tokens, "stream": True,
            "stream_options": {"include_usage": True},
            "messages": [{"role": "user", "content": PROMPT}], **(extra or {})}
    async with httpx.AsyncClient(timeout=300, headers={"Authorization": f"Bearer {key}"},
                                 limits=httpx.Limits(max_connections=streams)) as client:
        async def one() -> tuple[int, float]:
            start, first, produced = time.perf_counter(), None, 0
            async with client.stream("POST", f"{base}/chat/completions", json=body) as resp:
                resp.raise_for_status()
                async for line in resp.aiter_lines():
                    if not line.startswith("data: {"):
                        continue
                    if first is None and _CONTENT.search(line):
                        first = time.perf_counter() - start
                    if '"usage"' in line:
                        usage = json.loads(line[6:]).get("usage")
                        if usage:
                            produced = usage["completion_tokens"]
            return produced, first or 0.0

        await one()  # warm-up
        runs = []
        for _ in range(RUNS):
            start = time.perf_counter()
            done = await asyncio.gather(*(one() for _ in range(streams)))
            if not all(d[0] for d in done):
                raise RuntimeError(f"{base}: a stream ended without its usage")
            runs.append((sum(d[0] for d in done) / (time.perf_counter() - start),
                         statistics.median(d[1] for d in done) * 1000))
    return best(runs)


def step_profile(url: str, body: dict, headers: dict[str, str], count: int = 40
                 ) -> dict[str, float]:
    """Median time of each step of one request (the `Server-Timing` header, and `client`: the
    whole request as this client saw it), one request at a time. Where the replica timed its
    engine (`engine`), `added` is the median of each request's client time minus its own
    engine time: what the path added, with the engine's drift between requests taken out."""
    steps: dict[str, list[float]] = {}
    with httpx.Client(headers=headers, timeout=120) as client:
        for i in range(count + 5):
            response = client.post(url, json=body)
            response.raise_for_status()
            if i < 5:
                continue
            timed = {}
            for part in response.headers["server-timing"].split(", "):
                name, _, value = part.partition(";dur=")
                timed[name] = float(value)
                steps.setdefault(name, []).append(float(value))
            seen = response.elapsed.total_seconds() * 1000
            steps.setdefault("client", []).append(seen)
            if "engine" in timed:
                steps.setdefault("added", []).append(seen - timed["engine"])
    return {name: statistics.median(values) for name, values in steps.items()}


def format_steps(steps: dict[str, float]) -> str:
    return ", ".join(f"{name} {ms:.2f}" for name, ms in steps.items())
