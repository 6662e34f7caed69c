"""Gateway overhead: req/s and p50/p99 latency at concurrency 1, 8 and 32, in one run, for

  1. an authenticated route through the full gateway on Serve (direct ingress, the `make run`
     setup): `GET /api/v1/api_keys/{id}` (cached key check + one primary-key read),
  2. the same route through Serve's HTTP proxy (the fallback port),
  3. a bare Serve route (FastAPI ingress returning a constant),
  4. the same gateway app under plain uvicorn, one worker, no Ray,

and the ratios between them. Load comes from `wrk` on 127.0.0.1 (apt-get install wrk).

    .venv/bin/python benchmarks/gateway_bench.py [--duration 10]
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

ADMIN_KEY = "sk-benchmark-admin-key-0000000000001"
CONCURRENCY = (1, 8, 32)
BASE_PORT = 18500


def wrk(url: str, concurrency: int, duration: int, headers: dict[str, str]) -> dict:
    cmd = ["wrk", f"-t{min(2, concurrency)}", f"-c{concurrency}", f"-d{duration}s", "--latency"]
    for name, value in headers.items():
        cmd += ["-H", f"{name}: {value}"]
    out = subprocess.run([*cmd, url], capture_output=True, text=True, check=True).stdout

    def ms(label: str) -> float:
        m = re.search(rf"^\s*{label}%\s+([\d.]+)(us|ms|s)\s*$", out, re.M)
        value, unit = float(m.group(1)), m.group(2)
        return value / 1000 if unit == "us" else value * 1000 if unit == "s" else value

    rps = float(re.search(r"Requests/sec:\s+([\d.]+)", out).group(1))
    errors = re.search(r"Non-2xx or 3xx responses: (\d+)", out)
    return {"rps": rps, "p50": ms("50"), "p99": ms("99"),
            "non2xx": int(errors.group(1)) if errors else 0}


def wait_ok(url: str, headers: dict[str, str] | None = None, timeout_s: float = 120) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            if httpx.get(url, headers=headers, timeout=2).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.3)
    raise TimeoutError(url)


def measure(name: str, url: str, headers: dict[str, str], duration: int, results: dict) -> None:
    wait_ok(url, headers)
    wrk(url, 8, 2, headers)  # warm-up
    for c in CONCURRENCY:
        r = wrk(url, c, duration, headers)
        results[(name, c)] = r
        print(f"  {name:<34} c={c:<3} {r['rps']:>8.0f} req/s  p50 {r['p50']:>7.2f} ms  "
              f"p99 {r['p99']:>7.2f} ms" + (f"  non-2xx {r['non2xx']}" if r["non2xx"] else ""),
              flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--duration", type=int, default=10, help="seconds per point")
    args = parser.parse_args()
    if shutil.which("wrk") is None:
        raise SystemExit("wrk is needed: apt-get install wrk")

    data_dir = Path(tempfile.mkdtemp(prefix="gateway-bench-"))
    env = {"DATA_DIR": str(data_dir), "ADMIN_API_KEY": ADMIN_KEY}
    os.environ.update(env)
    from serve_app.accounts.provisioning import bootstrap
    from serve_app.settings import Settings

    bootstrap(Settings())
    auth = {"Authorization": f"Bearer {ADMIN_KEY}"}
    results: dict = {}

    # 4. Plain uvicorn, one worker.
    port = BASE_PORT + 10
    uvicorn = subprocess.Popen(
        [sys.executable, "-m", "uvicorn", "--factory", "serve_app.gateway:create_uvicorn_app",
         "--host", "127.0.0.1", "--port", str(port), "--no-access-log", "--log-level",
         "warning"], cwd=ROOT, env={**os.environ, **env})
    try:
        wait_ok(f"http://127.0.0.1:{port}/api/v1/models")
        key_id = httpx.get(f"http://127.0.0.1:{port}/api/v1/api_keys",
                           headers=auth).json()["data"][0]["id"]
        route = f"/api/v1/api_keys/{key_id}"
        print("plain uvicorn (no Ray):", flush=True)
        measure("gateway, plain uvicorn", f"http://127.0.0.1:{port}{route}", auth,
                args.duration, results)
    finally:
        uvicorn.terminate()
        uvicorn.wait()

    # 1-3. Serve, throughput-optimised, as `make run` runs it.
    os.environ.update({
        "RAY_SERVE_THROUGHPUT_OPTIMIZED": "1",
        "RAY_SERVE_DIRECT_INGRESS_MIN_HTTP_PORT": str(BASE_PORT),
        "RAY_SERVE_DIRECT_INGRESS_MAX_HTTP_PORT": str(BASE_PORT + 1),
        "RAY_SERVE_PORT_QUARANTINE_S": "0",
        "RAY_SERVE_DEFAULT_HTTP_HOST": "127.0.0.1",
        "RAY_AUTH_MODE": "disabled",
        "RAY_USAGE_STATS_ENABLED": "0",
    })
    import ray
    from fastapi import FastAPI
    from ray import serve

    from serve_app.app import build_app

    proxy_port = BASE_PORT + 20
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    try:
        serve.start(http_options={"host": "127.0.0.1", "port": proxy_port},
                    logging_config={"enable_access_log": False})
        # The gateway alone: model engines would compete for the two cores.
        serve.run(build_app({"model_deployments": []}), name="inference", route_prefix="/")
        print("Ray Serve, throughput-optimised:", flush=True)
        measure("gateway, Serve direct ingress", f"http://127.0.0.1:{BASE_PORT}{route}", auth,
                args.duration, results)
        measure("gateway, Serve proxy", f"http://127.0.0.1:{proxy_port}{route}", auth,
                args.duration, results)
        serve.delete("inference")

        bare_app = FastAPI()

        @serve.deployment(ray_actor_options={"num_cpus": 0.25}, max_ongoing_requests=256)
        @serve.ingress(bare_app)
        class Bare:
            @bare_app.get("/ping")
            def ping(self) -> dict:
                return {"ok": True}

        serve.run(Bare.bind(), name="bare", route_prefix="/bare")
        measure("bare Serve route", f"http://127.0.0.1:{BASE_PORT}/bare/ping", {},
                args.duration, results)
    finally:
        from serve_app.process_tree import ray_processes, reap

        tree = ray_processes()
        ray.shutdown()
        reap(tree)
        shutil.rmtree(data_dir, ignore_errors=True)

    print("\nratios (req/s):")
    for c in CONCURRENCY:
        full = results[("gateway, Serve direct ingress", c)]["rps"]
        print(f"  c={c:<3} gateway on Serve / plain uvicorn = "
              f"{full / results[('gateway, plain uvicorn', c)]['rps']:.2f}   "
              f"gateway on Serve / bare Serve route = "
              f"{full / results[('bare Serve route', c)]['rps']:.2f}   "
              f"Serve proxy / direct ingress = "
              f"{results[('gateway, Serve proxy', c)]['rps'] / full:.2f}")


if __name__ == "__main__":
    main()
