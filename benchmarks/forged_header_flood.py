"""The cheap route's latency while a flood of forged wallet headers with bodies of nested arrays
and no Content-Type runs, against a Gateway served by plain uvicorn (no Ray, no models: the
flood is refused before any model is involved).

Starts the Gateway of a checkout (`--tree`, this one by default; `--pythonpath` puts another
FastAPI in front, e.g. one installed with `pip install --target`), then for `--seconds`:

* a flood process keeps `--connections` requests on their way to `POST /chat/completions`,
  each with a SIGN-IN-WITH-X header that decodes but whose signature is zeros and a body of
  `[[],[],...]` (`--body-mb`, no Content-Type), and counts the answers by status;
* this process asks the cheap route (`GET /api_keys/rate_limits` with the admin key) one
  request at a time and times each answer.

Prints the cheap route's median and worst latency alone and under the flood, and the flood's
answers.

    .venv/bin/python benchmarks/forged_header_flood.py [--seconds 20] [--connections 8]
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import collections
import json
import multiprocessing
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parent.parent
ADMIN_KEY = "sk-forged-flood-admin-key-000000000001"
MB = 1024 * 1024


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def forged_header(host: str) -> str:
    """A SIGN-IN-WITH-X header that decodes (a sign-in message of the right layout for this
    host) and proves nothing: its signature is zeros."""
    address = "0x" + "11" * 20
    message = (f"{host} wants you to sign in with your Ethereum account:\n{address}\n\n"
               f"Sign in\n\nURI: http://{host}\nVersion: 1\nChain ID: 8453\n"
               "Nonce: abcdefgh12345678\nIssued At: 2026-01-01T00:00:00Z")
    payload = {"address": address, "message": message, "signature": "0x" + "00" * 65,
               "chainId": "eip155:8453"}
    return base64.b64encode(json.dumps(payload).encode()).decode()


def flood(base: str, header: str, body_mb: float, connections: int, seconds: float,
          counts: dict) -> None:
    """Keep `connections` forged requests on their way for `seconds`; tally the statuses."""
    body = b"[" + b"[]," * int(body_mb * MB / 3) + b"[]]"

    async def run() -> None:
        tally: collections.Counter[str] = collections.Counter()
        until = time.monotonic() + seconds
        async with httpx.AsyncClient(timeout=60) as client:
            async def one() -> None:
                while time.monotonic() < until:
                    try:
                        resp = await client.post(f"{base}/chat/completions", content=body,
                                                 headers={"sign-in-with-x": header})
                        tally[str(resp.status_code)] += 1
                    except httpx.HTTPError as exc:
                        tally[type(exc).__name__] += 1

            await asyncio.gather(*(one() for _ in range(connections)))
        counts.update(tally)

    asyncio.run(run())


async def cheap_latencies(base: str, seconds: float) -> list[float]:
    auth = {"Authorization": f"Bearer {ADMIN_KEY}"}
    times: list[float] = []
    until = time.monotonic() + seconds
    async with httpx.AsyncClient(timeout=120) as client:
        while time.monotonic() < until:
            started = time.perf_counter()
            resp = await client.get(f"{base}/api_keys/rate_limits", headers=auth)
            resp.raise_for_status()
            times.append(time.perf_counter() - started)
            await asyncio.sleep(0.02)
    return times


def summary(times: list[float]) -> str:
    return (f"{len(times)} answers, median {statistics.median(times) * 1000:.1f} ms, "
            f"worst {max(times) * 1000:.1f} ms")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tree", type=Path, default=ROOT, help="checkout whose Gateway runs")
    parser.add_argument("--pythonpath", default="", help="put before the checkout on the path")
    parser.add_argument("--seconds", type=float, default=20.0)
    parser.add_argument("--connections", type=int, default=8)
    parser.add_argument("--body-mb", type=float, default=1.0)
    args = parser.parse_args()

    port = free_port()
    host = f"127.0.0.1:{port}"
    base = f"http://{host}/api/v1"
    data_dir = Path(tempfile.mkdtemp(prefix="forged-flood-"))
    path = os.pathsep.join(p for p in (args.pythonpath, str(args.tree.resolve())) if p)
    env = {**os.environ, "DATA_DIR": str(data_dir), "ADMIN_API_KEY": ADMIN_KEY,
           "SIWX_DOMAINS": host, "PYTHONPATH": path, "PORT": str(port)}
    subprocess.run([sys.executable, "-c", "from serve_app.accounts.provisioning import "
                    "bootstrap; from serve_app.settings import Settings; bootstrap(Settings())"],
                   env=env, cwd=args.tree, check=True, capture_output=True)
    log = (data_dir / "gateway.log").open("wb")  # its access log: a line a request
    gateway = subprocess.Popen(
        [sys.executable, "-m", "uvicorn", "--factory", "serve_app.gateway:create_uvicorn_app",
         "--host", "127.0.0.1", "--port", str(port), "--log-level", "warning"],
        env=env, cwd=args.tree, stdout=log, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 120
        while True:
            try:
                if httpx.get(f"{base}/models", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            if time.monotonic() > deadline or gateway.poll() is not None:
                raise SystemExit(f"the Gateway did not answer; see {data_dir / 'gateway.log'}")
            time.sleep(0.5)
        version = subprocess.run(
            [sys.executable, "-c", "import fastapi; print(fastapi.__version__)"],
            env=env, cwd=args.tree, capture_output=True, text=True).stdout.strip()
        print(f"Gateway of {args.tree} on FastAPI {version}, uvicorn at {base}", flush=True)
        alone = asyncio.run(cheap_latencies(base, 5.0))
        print(f"cheap route alone: {summary(alone)}", flush=True)
        with multiprocessing.Manager() as manager:
            counts = manager.dict()
            flooder = multiprocessing.Process(target=flood, args=(
                base, forged_header(host), args.body_mb, args.connections, args.seconds,
                counts))
            flooder.start()
            time.sleep(1.0)  # the flood under way
            during = asyncio.run(cheap_latencies(base, args.seconds - 2.0))
            flooder.join()
            answers = dict(counts)
        print(f"cheap route under the flood: {summary(during)}")
        print(f"flood ({args.connections} connections, {args.body_mb:g} MB of nested arrays, "
              f"forged wallet header, no Content-Type): answers {answers}")
    finally:
        gateway.terminate()
        gateway.wait()


if __name__ == "__main__":
    main()
