"""The Gateway's own work per 1-token chat, in process: Python calls and CPU per request.

Builds the Gateway as the flow tests do (tests/unit/flows: the real app, its SQLite ledger and
its billing writer, the model deployment's real class on a fake engine, no Ray), then sends
1-token chats one at a time through the ASGI app from the same event loop (httpx's ASGI
transport: no socket), unary and streamed (`stream_options.include_usage`). For each kind it
prints, per request:

    calls       Python function calls in every thread, split into the Gateway's side (the
                app, its middleware, billing, the libraries it calls) and the rest (the
                client, the fake deployment and engine, which run in other processes in
                production)
    cpu ms      the process's CPU time (every thread: the billing writer's too)
    files       with --files N: the N source files with the most calls per request
    top         with --top N: the N functions with the most own time (cProfile, the event
                loop's thread; --sort cumtime, --only serve_app to narrow it)

Deterministic enough to compare two commits: the call counts repeat to within a few calls.

    .venv/bin/python benchmarks/chat_path_profile.py [--requests 200] [--top 25] [--sort cumtime]
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import cProfile
import logging
import os
import pstats
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

CATALOG = ROOT / "tests" / "unit" / "flows" / "catalog.yaml"
MODEL = "chat-primary"
WARM_UP = 20
# Code that runs outside the Gateway's process in production (the client, Serve's replica
# and its engine): its calls are counted apart.
NOT_GATEWAY = ("/httpx/", "/httpcore/", "/h11/", "/anyio/", f"{ROOT}/tests/",
               f"{ROOT}/deployments/")


class CallCounter:
    """Python calls in every thread, by whether their code is the Gateway's side."""

    def __init__(self) -> None:
        self.by_file: collections.Counter[str] = collections.Counter()

    def _profile(self, frame, event, _arg):
        if event == "call":
            self.by_file[frame.f_code.co_filename] += 1

    def __enter__(self) -> CallCounter:
        threading.setprofile(self._profile)
        sys.setprofile(self._profile)
        return self

    def __exit__(self, *_: object) -> None:
        sys.setprofile(None)
        threading.setprofile(None)  # type: ignore[arg-type]

    def split(self) -> tuple[int, int]:
        other = sum(n for f, n in self.by_file.items() if any(p in f for p in NOT_GATEWAY))
        return sum(self.by_file.values()) - other, other


async def run(requests: int, top: int, sort: str, only: str, files: int) -> None:
    import httpx

    from serve_app import cli
    from serve_app.accounts.provisioning import bootstrap
    from serve_app.gateway import create_prefixed_app
    from serve_app.models.catalog import load_catalog
    from serve_app.services import GatewayServices
    from serve_app.settings import Settings
    from tests.fakes import fake_deployments

    # The access lines and the other records are written, as in production, to nowhere.
    logging.basicConfig(stream=open(os.devnull, "w"), format="%(message)s")  # noqa: SIM115
    data = Path(tempfile.mkdtemp(prefix="chat-path-profile-"))
    settings = Settings(data_dir=data, initial_credit_usd=1000, model_catalog=CATALOG)
    bootstrap(settings)
    cli.run(["set-tier", "benchmark"], settings)  # the limiter decides, refuses none
    key = cli.run(["create-key", "--type", "INFERENCE", "--description", "profile"],
                  settings)["apiKey"]
    services = GatewayServices.build(settings, handles=fake_deployments(load_catalog(CATALOG)))
    app = create_prefixed_app(services)
    await services.start()
    try:
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app),
                                     base_url="http://testserver/api/v1") as client:
            auth = {"Authorization": f"Bearer {key}"}
            body = {"model": MODEL, "max_tokens": 1, "temperature": 0,
                    "messages": [{"role": "user", "content": "Say hi."}]}
            streamed = {**body, "stream": True, "stream_options": {"include_usage": True}}
            for name, payload in (("unary", body), ("streamed", streamed)):
                async def chat(payload: dict = payload) -> None:
                    resp = await client.post("/chat/completions", headers=auth, json=payload)
                    if resp.status_code != 200:
                        raise SystemExit(f"{resp.status_code}: {resp.text}")

                for _ in range(WARM_UP):
                    await chat()
                with CallCounter() as counter:
                    for _ in range(requests):
                        await chat()
                gateway_calls, other_calls = counter.split()
                cpu, wall = time.process_time(), time.perf_counter()
                for _ in range(requests):
                    await chat()
                cpu, wall = time.process_time() - cpu, time.perf_counter() - wall
                profiler = cProfile.Profile()
                profiler.enable()
                for _ in range(requests):
                    await chat()
                profiler.disable()
                print(f"{name}: {gateway_calls / requests:.0f} Gateway calls per request "
                      f"(+{other_calls / requests:.0f} client and fake deployment), "
                      f"{cpu / requests * 1000:.2f} ms CPU, {wall / requests * 1000:.2f} ms wall",
                      flush=True)
                if files:
                    for file, n in counter.by_file.most_common(files):
                        print(f"  {n / requests:7.1f}  {file.removeprefix(str(ROOT) + '/')}")
                if top:
                    stats = pstats.Stats(profiler).sort_stats(sort)
                    stats.print_stats(only, top)
    finally:
        await services.stop()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--requests", type=int, default=200)
    parser.add_argument("--top", type=int, default=0, help="functions to list")
    parser.add_argument("--sort", default="tottime", help="cProfile's order: tottime, cumtime")
    parser.add_argument("--only", default="", help="list only functions whose file has this")
    parser.add_argument("--files", type=int, default=0, help="files to list by calls")
    args = parser.parse_args()
    asyncio.run(run(args.requests, args.top, args.sort, args.only, args.files))


if __name__ == "__main__":
    main()
