"""`make bench`'s fairness part: one account floods the chat engine while another sends short
chats, with the engine's fair-share gate on and then off (deployments/fair_share.py).

  noisy_neighbour_ttft   account B's median time to first token (short streamed chats, one at a
                         time) while account A keeps 24 streams of 128 tokens open, divided by
                         B's alone (goal <= 1.5x)
  flood_throughput       tokens/s the engine served over that flood with the gate on, divided
                         by the same flood with the gate off (catalog `fair_share: false`: the
                         engine's own first-come-first-served queue); goal >= 0.95x

Each platform start (gate on, gate off) is its own Serve application on the same DATA_DIR;
the tokens come from the text deployment's own count (`stats()`), not from the clients.
"""

from __future__ import annotations

import asyncio
import json
import statistics
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

import httpx
import yaml
from figures import Figure, rate_figure, slowdown_figure

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


def catalog_without_gate(catalog: Path, model: str, into: Path) -> Path:
    """The benchmark catalog with `model`'s fair-share gate off."""
    data = yaml.safe_load(catalog.read_text())
    for entry in data["models"]:
        if entry["id"] == model:
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
        refused: list[int] = []
        started = time.perf_counter()
        until = started + seconds
        before = await served()
        flood = [asyncio.create_task(_flood(client, base, key_a, model, until, refused))
                 for _ in range(FLOOD_STREAMS)]
        await asyncio.sleep(min(5.0, seconds / 4))  # A's streams are all open
        crowded = []
        while len(crowded) < b_chats and time.perf_counter() < until:
            try:
                crowded.append(await asyncio.wait_for(
                    _first_token_ms(client, base, key_b, model),
                    timeout=max(1.0, until - time.perf_counter() + 60)))
            except TimeoutError:
                break
        await asyncio.gather(*flood)
        tokens_per_s = (await served() - before) / (time.perf_counter() - started)
    return {"alone_ms": statistics.median(alone),
            "crowded_ms": statistics.median(crowded) if crowded else float("inf"),
            "crowded_n": len(crowded), "tokens_per_s": tokens_per_s,
            "refused": len(refused)}


def engine_served(model: str) -> Callable[[], Awaitable[float]]:
    """The text deployment's count of what its engine served for `model`, read by a Serve
    handle (`TextDeployment.stats`)."""
    from ray import serve

    handle = serve.get_deployment_handle("text-xs", app_name="inference")

    async def read() -> float:
        stats = await handle.stats.remote()
        return float(stats[model]["fair_share"]["units_served"])

    return read


def measure_fairness(start_platform: Callable[[Path], object], catalog: Path, model: str,
                     keys: tuple[str, str], seconds: float, step: Callable[[str], None],
                     scratch: Path) -> list[Figure]:
    """Both figures: the flood with the gate on, then on a platform started again with the
    gate off. `start_platform(catalog)` starts one (its `.base` and `.stop()`)."""
    runs = {}
    for gate, path in (("on", catalog),
                       ("off", catalog_without_gate(catalog, model, scratch / "no-gate.yaml"))):
        platform = start_platform(path)
        try:
            runs[gate] = asyncio.run(noisy_neighbour(
                platform.base, keys, model, seconds, engine_served(model),
                b_chats=8 if gate == "on" else 3))
        finally:
            platform.stop()
        run = runs[gate]
        step(f"gate {gate}: B's first token {run['alone_ms']:.0f} ms alone, "
             f"{run['crowded_ms']:.0f} ms under A's {FLOOD_STREAMS} streams "
             f"({run['crowded_n']} chats); engine {run['tokens_per_s']:.0f} tokens/s; "
             f"{run['refused']} of A's refused (503)")
    on, off = runs["on"], runs["off"]
    print("    " + json.dumps({"gate_on": on, "gate_off": off}), flush=True)
    return [slowdown_figure("noisy_neighbour_ttft", "ms", on["crowded_ms"], on["alone_ms"], 1.5),
            rate_figure("flood_throughput", "tok/s", on["tokens_per_s"], off["tokens_per_s"],
                        0.95)]
