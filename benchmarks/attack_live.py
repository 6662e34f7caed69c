"""The Gateway under the attacks of an unknown caller and a cheap crafted image, live on Serve.

Starts the platform as `make bench` does (Serve in throughput-optimised mode, one Gateway
replica, the embedding and image-upscale deployments), then, while a client polls the cheap
authenticated route (`GET /api_keys/rate_limits`) one request at a time, sends at once four
anonymous 30 MB bodies of `[[],[],...]` to `/chat/completions` and one 25 MB marker-padded
JPEG (`FF D8 FF` and 0xFF padding) to `/image/upscale` with a valid key. Prints the cheap
route's latency before and during the attack (median and worst), what each attack was
answered, and the Gateway replica's resident memory before and at its peak.

    .venv/bin/python benchmarks/attack_live.py
"""

from __future__ import annotations

import asyncio
import base64
import json
import statistics
import sys
import time
from pathlib import Path

import httpx
import psutil

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench import Platform, benchmark_key, prepare_data_dir

MB = 1024 * 1024
NESTED_30MB = b"[" + b"[]," * (10 * MB) + b"[]]"
PADDED_JPEG = b"\xff\xd8\xff" + b"\xff" * (25 * MB - 4)


def gateway_rss() -> int:
    """Resident bytes of the Gateway replica's process (0 if not found)."""
    for proc in psutil.process_iter(["cmdline"]):
        if any("ServeReplica:inference:Gateway" in part for part in proc.info["cmdline"] or []):
            return proc.memory_info().rss
    return 0


async def attack(base: str, key: str) -> dict:
    auth = {"Authorization": f"Bearer {key}"}
    async with httpx.AsyncClient(timeout=120) as client:
        async def cheap() -> float:
            started = time.perf_counter()
            resp = await client.get(f"{base}/api_keys/rate_limits", headers=auth)
            resp.raise_for_status()
            return (time.perf_counter() - started) * 1000

        for _ in range(20):
            await cheap()
        before = [await cheap() for _ in range(50)]
        rss_before, rss_peak = gateway_rss(), 0
        answers: list[str] = []

        async def anonymous() -> None:
            resp = await client.post(f"{base}/chat/completions", content=NESTED_30MB,
                                     headers={"content-type": "application/json"})
            answers.append(f"anonymous 30 MB: {resp.status_code}")

        async def padded_jpeg() -> None:
            body = json.dumps({"image": base64.b64encode(PADDED_JPEG).decode(), "scale": 2})
            resp = await client.post(f"{base}/image/upscale", content=body,
                                     headers={**auth, "content-type": "application/json"})
            answers.append(f"padded JPEG: {resp.status_code} {resp.text[:80]}")

        attacks = [asyncio.create_task(anonymous()) for _ in range(4)]
        attacks.append(asyncio.create_task(padded_jpeg()))
        during: list[float] = []
        while not all(a.done() for a in attacks):
            during.append(await cheap())
            rss_peak = max(rss_peak, gateway_rss())
            await asyncio.sleep(0.05)
        await asyncio.gather(*attacks)
        for _ in range(10):  # and just after
            during.append(await cheap())
    return {"cheap_before_ms": {"p50": round(statistics.median(before), 2),
                                "max": round(max(before), 2)},
            "cheap_during_ms": {"p50": round(statistics.median(during), 2),
                                "max": round(max(during), 2), "n": len(during)},
            "answers": sorted(answers),
            "gateway_rss_mb": {"before": rss_before // MB, "peak": rss_peak // MB,
                               "grew": (rss_peak - rss_before) // MB}}


def main() -> None:
    data_dir = prepare_data_dir()
    key = benchmark_key(data_dir)
    # `make run`'s catalog: its upscaler (the benchmark catalog has none)
    platform = Platform(data_dir, ["embedding", "image-upscale"],
                        Path(__file__).resolve().parent.parent / "configs" / "models.yaml")
    try:
        print(json.dumps(asyncio.run(attack(platform.base, key)), indent=2))
    finally:
        platform.stop()


if __name__ == "__main__":
    main()
