"""Rate-limit decisions per second and the latency they add, for each backend, with one
ingress replica and with two.

A "replica" is a Ray actor with its own event loop, as a Gateway replica is; it runs
`--concurrency` request loops that each ask for a decision and wait for it. The Redis backend
talks to REDIS_URL (default redis://127.0.0.1:6379/0); the Ray backend to the limiter actor.
The local backend (no sharing) is the floor.

    .venv/bin/python benchmarks/limiter_bench.py [--seconds 5]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import sys
import time
import uuid
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import ray  # noqa: E402

REDIS_URL = os.environ.get("REDIS_URL", "redis://127.0.0.1:6379/0")


@ray.remote(num_cpus=0)
class Replica:
    def __init__(self, backend: str) -> None:
        sys.path.insert(0, str(ROOT))
        from serve_app.limits.backends import LocalLimiter, RayLimiter
        from serve_app.limits.redis_backend import RedisLimiter

        self.backend = {"local": LocalLimiter, "ray": RayLimiter,
                        "redis": lambda: RedisLimiter(REDIS_URL, prefix="bench")}[backend]()

    async def run(self, seconds: float, concurrency: int, start_at: float) -> tuple[int, list]:
        await asyncio.sleep(max(0.0, start_at - time.time()))
        deadline = time.perf_counter() + seconds
        latencies: list[float] = []
        budgets = [("bench|m|FAILED", 50), ("bench||FAILED", 50)]

        async def loop(worker: int) -> int:
            done = 0
            bucket = f"{uuid.uuid4().hex}|class:XS"
            while time.perf_counter() < deadline:
                t = time.perf_counter()
                await self.backend.decide(bucket, 10**9, 10**9, 10, budgets,
                                          int(time.time() * 1000))
                latencies.append(time.perf_counter() - t)
                done += 1
            return done

        counts = await asyncio.gather(*[loop(i) for i in range(concurrency)])
        return sum(counts), latencies


def measure(backend: str, replicas: int, concurrency: int, seconds: float) -> dict:
    actors = [Replica.remote(backend) for _ in range(replicas)]
    ray.get([a.__ray_ready__.remote() for a in actors])
    # A short warm-up creates the limiter actor / connections.
    ray.get([a.run.remote(0.5, 1, time.time()) for a in actors])
    start = time.time() + 0.5
    results = ray.get([a.run.remote(seconds, concurrency, start) for a in actors])
    for a in actors:
        ray.kill(a)
    total = sum(n for n, _ in results)
    lat = sorted(x for _, lats in results for x in lats)
    return {"rate": total / seconds, "p50": statistics.median(lat) * 1000,
            "p99": lat[int(len(lat) * 0.99)] * 1000}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--seconds", type=float, default=5.0)
    args = parser.parse_args()
    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False,
             namespace="limiter-bench", runtime_env={"env_vars": {"PYTHONPATH": str(ROOT)}})
    print(f"{'backend':8} {'replicas':>8} {'conc':>5} {'decisions/s':>12} {'p50 ms':>8} "
          f"{'p99 ms':>8}")
    rows = {}
    for backend in ("local", "ray", "redis"):
        for replicas in (1, 2):
            for concurrency in (1, 32):
                r = measure(backend, replicas, concurrency, args.seconds)
                rows[(backend, replicas, concurrency)] = r
                print(f"{backend:8} {replicas:>8} {concurrency:>5} {r['rate']:>12.0f} "
                      f"{r['p50']:>8.3f} {r['p99']:>8.3f}", flush=True)
    print("\nratios, same replicas and concurrency:")
    for replicas in (1, 2):
        for concurrency in (1, 32):
            ray_row, redis_row = rows[("ray", replicas, concurrency)], rows[
                ("redis", replicas, concurrency)]
            print(f"  replicas={replicas} c={concurrency}: decisions/s ray/redis "
                  f"{ray_row['rate'] / redis_row['rate']:.2f}; p50 ray/redis "
                  f"{ray_row['p50'] / redis_row['p50']:.2f}")
    for backend in ("ray", "redis"):
        two, one = rows[(backend, 2, 32)]["rate"], rows[(backend, 1, 32)]["rate"]
        print(f"  {backend}: two replicas / one, c=32: {two / one:.2f}")
    ray.shutdown()


if __name__ == "__main__":
    main()
