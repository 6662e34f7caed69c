"""`make bench`'s fairness part: one account floods the chat engine while another sends short
chats, with the engine's fair-share gate on and then off (deployments/fair_share.py).

  noisy_neighbour_ttft   account B's median time to first token (short streamed chats, one at a
                         time) while account A keeps 24 streams of 128 tokens open, divided by
                         B's alone (goal <= 1.5x)
  flood_throughput       tokens/s the engine served over that flood with the gate on, divided
                         by the same flood with the gate off (catalog `fair_share: false`: the
                         engine's own first-come-first-served queue); goal >= 0.95x
  noisy_neighbour_embeddings   the same for embeddings: B's median latency of single inputs
  flood_throughput_embeddings  while A sends batches of 256 inputs at concurrency 8, and the
                               texts/s then, fair order on against off (deployments/
                               fair_batches.py)

Each platform start (gate on, gate off) is its own Serve application on the same DATA_DIR;
the tokens come from the text deployment's own count (`stats()`), not from the clients.
"""

from __future__ import annotations

import asyncio
import json
import statistics
import sys
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

import httpx
import yaml
from figures import Figure, rate_figure, slowdown_figure

EMBED_BATCH, EMBED_CONCURRENCY = 256, 8
EMBED_SENTENCE = "Sentence number {} about lighthouses, storms and the sea."
FLOOD_STREAMS = 24
FLOOD_TOKENS = 128
SHORT_TOKENS = 8
SHORT_PROMPT = "Say hi."
FLOOD_PROMPT = "Write a long, detailed story about a lighthouse keeper and a storm."


def two_accounts(settings_of: Callable[[], object]) -> tuple[str, str]:
    """INFERENCE keys of two accounts of the `benchmark` tier (the first account's, and a new
    one's): the same share each."""
    from serve_app import cli

    settings = settings_of()
    keys = []
    account = cli.run(["create-account", "--usd", "100000"], settings)
    for account_id in (None, account["accountId"]):
        where = ["--account", account_id] if account_id else []
        cli.run(["set-tier", "benchmark", *where], settings)
        keys.append(cli.run(["create-key", "--type", "INFERENCE", *where], settings)["apiKey"])
    return keys[0], keys[1]


def catalog_without_gate(catalog: Path, models: tuple[str, ...], into: Path) -> Path:
    """The benchmark catalog with the fair-share order of `models` off."""
    data = yaml.safe_load(catalog.read_text())
    for entry in data["models"]:
        if entry["id"] in models:
            entry.setdefault("engine_options", {})["fair_share"] = False
    into.write_text(yaml.safe_dump(data))
    return into


async def _first_token_ms(client: httpx.AsyncClient, base: str, key: str, model: str
                          ) -> float:
    body = {"model": model, "temperature": 0, "max_tokens": SHORT_TOKENS, "stream": True,
            "messages": [{"role": "user", "content": SHORT_PROMPT}]}
    started = time.perf_counter()
    first = None
    async with client.stream("POST", f"{base}/chat/completions", json=body,
                             headers={"Authorization": f"Bearer {key}"}) as resp:
        if resp.status_code != 200:
            raise RuntimeError(f"B's chat: {resp.status_code} {await resp.aread()!r}")
        async for line in resp.aiter_lines():
            if first is None and line.startswith("data: {") and '"content":"' in line:
                first = (time.perf_counter() - started) * 1000
    assert first is not None, "a stream without content"
    return first


async def _flood(client: httpx.AsyncClient, base: str, key: str, model: str,
                 until: float, refused: list[int]) -> None:
    """One of A's streams, opened again as soon as it ends, until `until`."""
    body = {"model": model, "temperature": 0.7, "max_tokens": FLOOD_TOKENS, "stream": True,
            "messages": [{"role": "user", "content": FLOOD_PROMPT}]}
    while time.perf_counter() < until:
        async with client.stream("POST", f"{base}/chat/completions", json=body,
                                 headers={"Authorization": f"Bearer {key}"}) as resp:
            if resp.status_code == 503:
                refused.append(1)
                await asyncio.sleep(float(resp.headers.get("retry-after", "1")))
                continue
            async for _ in resp.aiter_lines():
                if time.perf_counter() >= until:
                    return


async def _embed_flood(client: httpx.AsyncClient, base: str, key: str, model: str,
                       until: float, refused: list[int]) -> None:
    """One of A's embedding requests of `EMBED_BATCH` inputs, sent again as soon as it is
    answered, until `until`."""
    batch = [EMBED_SENTENCE.format(i) for i in range(EMBED_BATCH)]
    while time.perf_counter() < until:
        resp = await client.post(f"{base}/embeddings", json={"model": model, "input": batch},
                                 headers={"Authorization": f"Bearer {key}"})
        if resp.status_code == 503:
            refused.append(1)
            await asyncio.sleep(float(resp.headers.get("retry-after", "1")))


async def flood(kind: str, base: str, key: str, model: str, seconds: float) -> int:
    """Account A's flood for `seconds` (chat: `FLOOD_STREAMS` streams; embeddings:
    `EMBED_CONCURRENCY` requests of `EMBED_BATCH` inputs); how many were refused (503)."""
    refused: list[int] = []
    until = time.perf_counter() + seconds
    one, count = (_flood, FLOOD_STREAMS) if kind == "chat" else (_embed_flood,
                                                                 EMBED_CONCURRENCY)
    async with httpx.AsyncClient(timeout=httpx.Timeout(seconds + 120),
                                 limits=httpx.Limits(max_connections=count + 2)) as client:
        await asyncio.gather(*(one(client, base, key, model, until, refused)
                               for _ in range(count)))
    return len(refused)


async def _flood_process(kind: str, base: str, key: str, model: str, seconds: float
                         ) -> asyncio.subprocess.Process:
    """A's flood in a process of its own: its clients' parsing must not delay B's, which this
    process times."""
    return await asyncio.create_subprocess_exec(
        sys.executable, __file__, "flood", kind, base, key, model, str(seconds),
        stdout=asyncio.subprocess.PIPE)


async def _flood_ended(process: asyncio.subprocess.Process) -> int:
    out, _ = await process.communicate()
    return int(out.decode().strip().splitlines()[-1])


async def noisy_neighbour(base: str, keys: tuple[str, str], model: str, seconds: float,
                          served: Callable[[], Awaitable[float]], b_chats: int = 8
                          ) -> dict[str, float]:
    """B's median first token alone, then under A's flood (B sends `b_chats` chats one at a
    time, within `seconds`), and the engine's tokens/s over the flood window."""
    key_a, key_b = keys
    timeout = httpx.Timeout(seconds + 120)
    limits = httpx.Limits(max_connections=FLOOD_STREAMS + 8)
    async with httpx.AsyncClient(timeout=timeout, limits=limits) as client:
        await _first_token_ms(client, base, key_b, model)  # warm-up
        alone = [await _first_token_ms(client, base, key_b, model) for _ in range(b_chats)]
        started = time.perf_counter()
        until = started + seconds
        before = await served()
        flood = await _flood_process("chat", base, key_a, model, seconds)
        await asyncio.sleep(min(5.0, seconds / 4))  # A's streams are all open
        crowded = []
        while len(crowded) < b_chats and time.perf_counter() < until:
            try:
                crowded.append(await asyncio.wait_for(
                    _first_token_ms(client, base, key_b, model),
                    timeout=max(1.0, until - time.perf_counter() + 60)))
            except TimeoutError:
                break
        refused = await _flood_ended(flood)
        tokens_per_s = (await served() - before) / (time.perf_counter() - started)
    return {"alone_ms": statistics.median(alone),
            "crowded_ms": statistics.median(crowded) if crowded else float("inf"),
            "crowded_n": len(crowded), "tokens_per_s": tokens_per_s, "refused": refused}


async def _embed_ms(client: httpx.AsyncClient, base: str, key: str, model: str,
                    inputs: list[str]) -> float:
    started = time.perf_counter()
    resp = await client.post(f"{base}/embeddings", json={"model": model, "input": inputs},
                             headers={"Authorization": f"Bearer {key}"})
    if resp.status_code != 200:
        raise RuntimeError(f"embeddings: {resp.status_code} {resp.text[:200]}")
    return (time.perf_counter() - started) * 1000


async def embedding_neighbour(base: str, keys: tuple[str, str], model: str, seconds: float,
                              served: Callable[[], Awaitable[float]], b_calls: int = 40
                              ) -> dict[str, float]:
    """B's median latency of one input alone, then while A keeps `EMBED_CONCURRENCY`
    requests of `EMBED_BATCH` inputs in flight; texts/s the engine encoded meanwhile."""
    key_a, key_b = keys
    async with httpx.AsyncClient(timeout=httpx.Timeout(seconds + 120)) as client:
        for _ in range(5):
            await _embed_ms(client, base, key_b, model, ["warm up"])
        alone = [await _embed_ms(client, base, key_b, model, [f"B alone {i}"])
                 for i in range(b_calls)]
        started = time.perf_counter()
        until = started + seconds
        before = await served()
        flood = await _flood_process("embeddings", base, key_a, model, seconds)
        await asyncio.sleep(min(2.0, seconds / 4))
        crowded = []
        while len(crowded) < b_calls and time.perf_counter() < until:
            crowded.append(await _embed_ms(client, base, key_b, model, [f"B {len(crowded)}"]))
        refused = await _flood_ended(flood)
        texts_per_s = (await served() - before) / (time.perf_counter() - started)
    return {"alone_ms": statistics.median(alone),
            "crowded_ms": statistics.median(crowded) if crowded else float("inf"),
            "crowded_n": len(crowded), "tokens_per_s": texts_per_s, "refused": refused}


def embeddings_served(model: str) -> Callable[[], Awaitable[float]]:
    """The embedding deployment's count of the texts its engine encoded for `model`."""
    from ray import serve

    handle = serve.get_deployment_handle("embedding", app_name="inference")

    async def read() -> float:
        stats = await handle.stats.remote()
        return float(stats.get(model, {}).get("texts_served", 0))

    return read


def engine_served(model: str) -> Callable[[], Awaitable[float]]:
    """The text deployment's count of what its engine served for `model`, read by a Serve
    handle (`TextDeployment.stats`)."""
    from ray import serve

    handle = serve.get_deployment_handle("text-xs", app_name="inference")

    async def read() -> float:
        stats = await handle.stats.remote()
        return float(stats[model]["fair_share"]["units_served"])

    return read


def measure_fairness(start_platform: Callable[[Path], object], catalog: Path,
                     models: tuple[str, str], keys: tuple[str, str], seconds: float,
                     step: Callable[[str], None], scratch: Path) -> list[Figure]:
    """The four figures: each flood with the fair order on, then on a platform started again
    with it off. `models`: (chat model, embedding model); `start_platform(catalog)` starts
    one (its `.base` and `.stop()`)."""
    chat, embedder = models
    runs: dict[str, dict[str, dict[str, float]]] = {}
    for gate, path in (("on", catalog), ("off", catalog_without_gate(
            catalog, models, scratch / "no-gate.yaml"))):
        platform = start_platform(path)
        try:
            runs[gate] = {
                "chat": asyncio.run(noisy_neighbour(
                    platform.base, keys, chat, seconds, engine_served(chat),
                    b_chats=8 if gate == "on" else 3)),
                "embeddings": asyncio.run(embedding_neighbour(
                    platform.base, keys, embedder, seconds, embeddings_served(embedder)))}
        finally:
            platform.stop()
        for kind, unit in (("chat", "tokens"), ("embeddings", "texts")):
            run = runs[gate][kind]
            step(f"{kind}, fair order {gate}: B's {'first token' if kind == 'chat' else 'answer'}"
                 f" {run['alone_ms']:.0f} ms alone, {run['crowded_ms']:.0f} ms under A's flood"
                 f" ({run['crowded_n']} requests); engine {run['tokens_per_s']:.0f} {unit}/s; "
                 f"{run['refused']} of A's refused (503)")
    on, off = runs["on"], runs["off"]
    print("    " + json.dumps(runs), flush=True)
    return [
        slowdown_figure("noisy_neighbour_ttft", "ms", on["chat"]["crowded_ms"],
                        on["chat"]["alone_ms"], 1.5),
        rate_figure("flood_throughput", "tok/s", on["chat"]["tokens_per_s"],
                    off["chat"]["tokens_per_s"], 0.95),
        slowdown_figure("noisy_neighbour_embeddings", "ms", on["embeddings"]["crowded_ms"],
                        on["embeddings"]["alone_ms"], 1.5),
        rate_figure("flood_throughput_embeddings", "texts/s",
                    on["embeddings"]["tokens_per_s"], off["embeddings"]["tokens_per_s"], 0.95)]


if __name__ == "__main__":  # the flood's own process: flood KIND BASE KEY MODEL SECONDS
    _, role, kind, base, key, model, seconds = sys.argv
    assert role == "flood", role
    print(asyncio.run(flood(kind, base, key, model, float(seconds))), flush=True)
