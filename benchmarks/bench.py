"""`make bench`: every speed figure of the request path beside its reference, in one run.

Each figure is measured through the API (Serve in throughput-optimised mode, as `make run`
runs it) and against a reference measured in the same run on the same machine:

  embeddings_c32          POST /embeddings at concurrency 32 (wrk) / the embedding engine
                          on batches of 32 in this process
  embeddings_c1_added_ms  p50 latency at concurrency 1 minus the engine's own time per text
                          (the replica's forward pass, from Server-Timing, just after); its
                          ceiling is the floor (a Serve hop plus a durable charge, both
                          measured in the run: floor.py) + 5 ms
  chat_stream_smollm2_s1  streamed tokens/s through the API / vLLM in this process, 1 stream
  chat_stream_smollm2_s8  the same, 8 streams
  chat_ttft_added_ms      time to first token through the API minus the engine's, 1 stream
  chat_stream_tiny_s4     the tiny test model, 4 streams
  cheap_route_vs_noop     GET /api_keys/rate_limits / a bare Serve no-op route, concurrency 8
  chat_1token_c8          1-token chats/s at concurrency 8 through the API / in this process
  noisy_neighbour_ttft    one account's short chats' first token while another keeps 24 long
  flood_throughput        streams open, and the engine's throughput then (fairness.py); the
                          same for embeddings (noisy_neighbour_embeddings,
                          flood_throughput_embeddings)
  start_to_first_chat_s   `make run` (weights prepared) until its first chat answers, on a
                          DATA_DIR that a first start already left its compiled graphs in
                          (that first start: start_to_first_chat_cold_s)

Against the stack a user would pick instead (peers.py: vLLM's own OpenAI server on the same
folders, with LiteLLM's proxy in front of it in a second column), the same clients:

  peer_1token_c8          1-token chats/s at concurrency 8 (wrk) / vLLM's server's
  peer_ttft_ms            median time to first token, 1 stream, minus vLLM's server's
  peer_stream_s1          one 128-token stream's tokens/s / vLLM's server's
  peer_stream_s8          8 streams' tokens/s / vLLM's server's
  peer_embeddings_c32     POST /embeddings at concurrency 32 / vLLM's server on the embedder
  peer_cheap_route        GET /api_keys/rate_limits at concurrency 8 / LiteLLM's
                          authenticated GET /v1/models (its key checked, no model called)

Our Gateway in front of that same vLLM server (a catalog model `engine: openai` pointing at
it, deployments/engines/openai_upstream.py), against the server direct, LiteLLM in front of
it alongside (goals: within 5% on rates, +5 ms on the first token, ahead of LiteLLM):

  upstream_1token_c8      1-token chats/s at concurrency 8 / the server's
  upstream_ttft_ms        median time to first token, 1 stream, minus the server's
  upstream_stream_s1      one 128-token stream's tokens/s / the server's (s8: 8 streams)

The platform measured (`--platform`): `bench`, benchmarks/catalog.yaml's two deployments in
this process's Ray; `full`, what `make run` serves (`python -m serve_app.launch` on
configs/local.yaml: every modality of the local catalog) on a DATA_DIR kept between runs under
.cache/bench-full (so its chat model's compile cache is warm from the second run on), measured
as the peers are (`full_peer_*`) and, with the embeddings part, at concurrency 32 against the
engine in process (`full_embeddings_c32`, goal 0.8); `both`.

Figures ending in `_ms`/`_s` hold the figure itself as `ratio`, with its ceiling as `goal`.
The API keys belong to an account on the `benchmark` rate-limit tier, so no request is refused
for its rate; the limiter still decides every request. Results go to `bench-results.json`.

    make bench                    # all of it (~12 minutes on 2 cores)
    .venv/bin/python benchmarks/bench.py --only peers --platform both --seconds 5
    .venv/bin/python benchmarks/bench.py --only embeddings --platform full --seconds 5
    .venv/bin/python benchmarks/bench.py --only embeddings,cheap_route
    .venv/bin/python benchmarks/bench.py --only peers --seconds 5
    .venv/bin/python benchmarks/bench.py --only chat,peers --isa avx2   # an AVX2-only CPU's kernels
"""

from __future__ import annotations

import argparse
import asyncio
import os
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx
import isa
import yaml
from clients import PROMPT, RUNS, best, format_steps, step_profile, stream_chats, wrk
from fairness import measure_fairness, two_accounts
from figures import Figure, Progress, ceiling_figure, rate_figure, report, write
from floor import durable_charge_ms, serve_hop_ms
from peers import (
    SAME_CONVERSATION,
    VLLM_DEFAULT_DTYPE,
    authenticated_get,
    chat_figures,
    embedding_figure,
    measure_peers,
    our_dtype,
    peer_figures,
    upstream_figures,
)

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
# The text deployment's engine environment (deployments/text.py), and the one thread that Ray
# gives a replica of a fraction of a CPU (OMP_NUM_THREADS=1): the engine in process runs as
# the deployment's engine does.
ENGINE_ENV = {"VLLM_TARGET_DEVICE": "cpu", "VLLM_CPU_KVCACHE_SPACE": "1",
              "VLLM_WORKER_MULTIPROC_METHOD": "spawn",
              "VLLM_ENABLE_V1_MULTIPROCESSING": "0", "OMP_NUM_THREADS": "1",
              "TOKENIZERS_PARALLELISM": "false", "HF_HUB_OFFLINE": "1",
              "VLLM_LOGGING_LEVEL": "WARNING", "VLLM_NO_USAGE_STATS": "1"}
os.environ.update(ENGINE_ENV)

SMOLLM2, TINY = "smollm2-135m-instruct", "tiny-chat"
EMBEDDER = "text-embedding-all-minilm-l6-v2"
ADMIN_KEY = "sk-benchmark-admin-key-0000000000001"
# BENCH_CATALOG: another catalog for the platform (say, with `enforce_eager: true` on SmolLM2
# to measure the engine as it ran before it was compiled).
CATALOG = Path(os.environ.get("BENCH_CATALOG", ROOT / "benchmarks" / "catalog.yaml"))
MODELS_DIR = ROOT / ".cache" / "models"
RESULTS = ROOT / "bench-results.json"
SENTENCE = "Sentence number 1 about lighthouses, storms and the sea."
# What embeddings at concurrency 1 may add above the floor (a Serve hop and a durable charge,
# measured in the same run: floor.py).
FLOOR_MARGIN_MS = 5
PARTS = ("embeddings", "chat", "cheap_route", "startup", "peers", "fairness")
PLATFORMS = {"bench": ("bench",), "full": ("full",), "both": ("bench", "full")}
# The catalog `make run` serves (serve_app.settings' default), and its DATA_DIR, kept between
# runs (its compile cache, its database).
FULL_CATALOG = ROOT / "configs" / "models.yaml"
FULL_DATA_DIR = ROOT / ".cache" / "bench-full"
# The catalog model of our Gateway in front of vLLM's server (`engine: openai`).
UPSTREAM_MODEL = "smollm2-upstream"


# ---------------------------------------------------------------- references in process

async def engine_figures(path: Path, options: dict, tokens: int, seconds: float,
                         streams: tuple[int, ...], short: bool) -> dict[str, float]:
    """One engine in this process: tokens/s (and TTFT) at each count of `streams`, and, with
    `short`, 1-token chats/s at concurrency 8."""
    from deployments.engines.text import VLLMEngine

    engine = VLLMEngine(str(path), options)
    out: dict[str, float] = {}
    try:
        for count in streams:
            out[f"s{count}"], out[f"ttft{count}"] = await _engine_streams(engine, count, tokens)
        if short:
            out["short8"] = await _engine_short_chats(engine, 8, seconds)
    finally:
        engine.shutdown()
    return out


async def _engine_streams(engine, streams: int, tokens: int) -> tuple[float, float]:
    from deployments.protocol import Chunk, Sampling, TextRequest

    messages = [{"role": "user", "content": PROMPT}]

    async def one(i: int) -> tuple[int, float]:
        start, first, produced = time.perf_counter(), None, 0
        request = TextRequest(request_id=f"bench-{time.time_ns()}-{i}", messages=messages,
                              sampling=Sampling(temperature=0, max_tokens=tokens, n=1))
        async for chunk in engine.generate(request):
            if isinstance(chunk, Chunk) and chunk.tokens:
                first = first or time.perf_counter() - start
                produced += chunk.tokens
        return produced, first or 0.0

    await one(-1)
    runs = []
    for _ in range(RUNS):
        start = time.perf_counter()
        done = await asyncio.gather(*(one(i) for i in range(streams)))
        runs.append((sum(d[0] for d in done) / (time.perf_counter() - start),
                     statistics.median(d[1] for d in done) * 1000))
    return best(runs)


async def _engine_short_chats(engine, concurrency: int, seconds: float) -> float:
    """1-token chats per second, `concurrency` loops."""
    from deployments.protocol import Sampling, TextRequest

    messages = [{"role": "user", "content": "Say hi."}]
    count = 0

    async def loop(i: int, until: float) -> None:
        nonlocal count
        n = 0
        while time.perf_counter() < until:
            request = TextRequest(request_id=f"short-{i}-{n}-{time.time_ns()}",
                                  messages=messages,
                                  sampling=Sampling(temperature=0, max_tokens=1, n=1))
            async for _ in engine.generate(request):
                pass
            n += 1
            count += 1

    await asyncio.gather(*(loop(i, time.perf_counter() + 2) for i in range(concurrency)))
    count = 0
    start = time.perf_counter()
    await asyncio.gather(*(loop(i, start + seconds) for i in range(concurrency)))
    return count / (time.perf_counter() - start)


def embedder_folder() -> Path:
    """The embedding model's weights folder (the catalog's spec, resolved)."""
    from deployments.weights.store import resolve_weights
    from serve_app.models.catalog import load_catalog

    return resolve_weights(load_catalog(CATALOG).find(EMBEDDER, "embedding").weights)


def embedder_options(catalog: Path) -> dict:
    """The embedder's engine options in `catalog`."""
    from serve_app.models.catalog import load_catalog

    return dict(load_catalog(catalog).find(EMBEDDER, "embedding").engine_options.given())


def embedding_engine_figures(seconds: float = 4.0, catalog: Path = CATALOG
                             ) -> tuple[float, float]:
    """(texts/s on batches of 32, ms per single text): the deployment's engine, with the
    torch threads `catalog` gives it, in this process."""
    from deployments.engines.embedding import SentenceTransformersEngine
    from deployments.weights.store import resolve_weights
    from serve_app.models.catalog import load_catalog

    model = load_catalog(catalog).find(EMBEDDER, "embedding")
    engine = SentenceTransformersEngine(str(resolve_weights(model.weights)),
                                        model.engine_options.given())
    batch = [f"Sentence number {i} about lighthouses, storms and the sea." for i in range(32)]
    engine.embed(batch)
    start, done = time.perf_counter(), 0
    while time.perf_counter() - start < seconds:
        engine.embed(batch)
        done += len(batch)
    rate32 = done / (time.perf_counter() - start)
    times = []
    for _ in range(100):
        one = time.perf_counter()
        engine.embed([SENTENCE])
        times.append((time.perf_counter() - one) * 1000)
    return rate32, statistics.median(times)


# ---------------------------------------------------------------- the platform

def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def prepare_data_dir() -> Path:
    """A fresh DATA_DIR whose models/ is the repository's built weights (built once)."""
    from deployments.weights.text import build_tiny_chat_model, convert_smollm2

    convert_smollm2(MODELS_DIR / SMOLLM2)
    build_tiny_chat_model(MODELS_DIR / TINY)
    data_dir = Path(tempfile.mkdtemp(prefix="bench-"))
    (data_dir / "models").symlink_to(MODELS_DIR)
    return data_dir


def bench_settings(data_dir: Path):
    from serve_app.settings import Settings

    return Settings(data_dir=data_dir, model_catalog=CATALOG, admin_api_key=ADMIN_KEY,
                    initial_credit_usd=100000)


def benchmark_key(data_dir: Path) -> str:
    """An INFERENCE key of the first account, moved to the `benchmark` rate-limit tier with
    the operator's own command (`inference-admin set-tier benchmark`)."""
    from serve_app import cli

    settings = bench_settings(data_dir)
    cli.run(["set-tier", "benchmark"], settings)
    return cli.run(["create-key", "--type", "INFERENCE", "--description", "benchmark"],
                   settings)["apiKey"]


class Platform:
    """Ray + the Serve application of `make run` (throughput-optimised, one Gateway replica on
    its own port), with the benchmark catalog, and a bare no-op app beside it."""

    def __init__(self, data_dir: Path, deployments: list[str], catalog: Path = CATALOG) -> None:
        self.port = free_port()
        os.environ.update({
            "RAY_SERVE_THROUGHPUT_OPTIMIZED": "1",
            "RAY_SERVE_DIRECT_INGRESS_MIN_HTTP_PORT": str(self.port),
            "RAY_SERVE_DIRECT_INGRESS_MAX_HTTP_PORT": str(self.port + 2),
            "RAY_SERVE_PORT_QUARANTINE_S": "0", "RAY_SERVE_DEFAULT_HTTP_HOST": "127.0.0.1",
            "RAY_AUTH_MODE": "disabled", "RAY_USAGE_STATS_ENABLED": "0"})
        import ray
        from ray import serve

        from serve_app.app import build_app

        ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False,
                 runtime_env={"env_vars": ENGINE_ENV})
        serve.start(http_options={"host": "127.0.0.1", "port": free_port()})
        quiet = {"enable_access_log": False}
        serve.run(build_app({"settings": {"data_dir": str(data_dir), "admin_api_key": ADMIN_KEY,
                                          "model_catalog": str(catalog),
                                          "initial_credit_usd": 100000},
                             "model_deployments": deployments}),
                  name="inference", route_prefix="/", logging_config=quiet)
        serve.run(_noop_app(), name="noop", route_prefix="/noop", logging_config=quiet)
        self.base = f"http://127.0.0.1:{self.port}/api/v1"
        self.noop = self._find_noop()

    def _find_noop(self) -> str:
        for port in range(self.port, self.port + 2):
            url = f"http://127.0.0.1:{port}/noop/ping"
            try:
                if httpx.get(url, timeout=2).status_code == 200:
                    return url
            except httpx.HTTPError:
                pass
        raise RuntimeError("the no-op application is not answering")

    def stop(self) -> None:
        import ray

        from serve_app.process_tree import ray_processes, reap

        tree = ray_processes()
        ray.shutdown()
        reap(tree)


def gateway_in_front(data_dir: Path, key: str) -> Callable[[str, str], Iterator]:
    """Our platform whose catalog's one chat model is a server already running (`engine:
    openai` at `base_url`, its name `served`), on the text deployment that `make bench` runs,
    with `key`'s account: (API base, key, model id) while the block runs."""

    @contextmanager
    def in_front(base_url: str, served: str) -> Iterator[tuple[str, str, str]]:
        catalog = data_dir / "upstream-catalog.yaml"
        catalog.write_text(yaml.safe_dump({
            "models": [{
                "id": UPSTREAM_MODEL, "type": "text", "name": "SmolLM2 on vLLM's server",
                "deployment": "text-xs", "engine": "openai", "size_class": "XS",
                "privacy": "private", "context_length": 2048, "max_completion_tokens": 1024,
                # The server's own batch (peers.TEXT_SETTINGS): the gate sends no more.
                "engine_options": {"base_url": base_url, "upstream_model": served,
                                   "usage_every_chunk": True, "max_concurrency": 10},
                "pricing": {"input": {"usd": 0.05, "diem": 0.05},
                            "output": {"usd": 0.1, "diem": 0.1}}}],
            "traits": {"text": {"default": UPSTREAM_MODEL}}}))
        platform = Platform(data_dir, ["text-xs"], catalog)
        try:
            yield platform.base, key, UPSTREAM_MODEL
        finally:
            platform.stop()

    return in_front


def _noop_app():
    from fastapi import FastAPI
    from ray import serve

    app = FastAPI()

    @serve.deployment(name="noop-model", ray_actor_options={"num_cpus": 0.1},
                      max_ongoing_requests=256)
    class NoopModel:
        async def ping(self) -> dict:
            return {"ok": True}

    @serve.deployment(name="noop", ray_actor_options={"num_cpus": 0.25},
                      max_ongoing_requests=256)
    @serve.ingress(app)
    class Noop:
        def __init__(self, model) -> None:
            self.model = model

        @app.get("/ping")
        async def ping(self) -> dict:  # async: a plain def would run in a worker thread
            return {"ok": True}

        @app.get("/hop")
        async def hop(self) -> dict:
            """One handle call to another deployment: the Serve hop of a model request."""
            return await self.model.ping.remote()

    return Noop.bind(NoopModel.bind())


def start_to_first_chat(data_dir: Path) -> float:
    """Seconds from `python -m serve_app.launch` (what `make run` runs) on a DATA_DIR with
    prepared weights until its first chat completion answers 200."""
    with launched(data_dir) as (_, seconds):
        return seconds


@contextmanager
def launched(data_dir: Path) -> Iterator[tuple[str, float]]:
    """`make run`'s platform (`python -m serve_app.launch` on configs/local.yaml) on
    `data_dir`, from its start until its first chat answers: (its API base, the seconds that
    took), until the block ends."""
    port = free_port()
    env = {**os.environ, "PORT": str(port), "DATA_DIR": str(data_dir),
           "ADMIN_API_KEY": ADMIN_KEY, "RAY_PORT": str(free_port()),
           "RAY_TMPDIR": tempfile.mkdtemp(prefix="bench-ray-")}
    for name in ("RAY_SERVE_DIRECT_INGRESS_MIN_HTTP_PORT", "RAY_SERVE_DIRECT_INGRESS_MAX_HTTP_PORT",
                 "RAY_SERVE_THROUGHPUT_OPTIMIZED"):
        env.pop(name, None)
    started = time.monotonic()
    proc = subprocess.Popen([sys.executable, "-m", "serve_app.launch"], cwd=ROOT, env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            start_new_session=True)
    url = f"http://127.0.0.1:{port}/api/v1/chat/completions"
    body = {"model": SMOLLM2, "max_tokens": 4, "messages": [{"role": "user", "content": "Hi"}]}
    try:
        while True:
            if time.monotonic() - started > 600:
                raise TimeoutError("no chat answer within 600 s")
            if proc.poll() is not None:
                raise RuntimeError(f"make run exited with {proc.returncode}")
            try:
                resp = httpx.post(url, json=body, timeout=30,
                                  headers={"Authorization": f"Bearer {ADMIN_KEY}"})
                if resp.status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            time.sleep(0.25)
        yield f"http://127.0.0.1:{port}/api/v1", time.monotonic() - started
    finally:
        os.killpg(proc.pid, signal.SIGINT)
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)


# ---------------------------------------------------------------- the run

def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--only", default=",".join(PARTS),
                        help=f"comma-separated parts: {', '.join(PARTS)}")
    parser.add_argument("--seconds", type=int, default=10, help="seconds per wrk point")
    parser.add_argument("--tokens", type=int, default=128, help="tokens per streamed chat")
    parser.add_argument("--isa", choices=isa.CHOICES, default="native",
                        help="avx2: every engine and peer on the kernels of a CPU without "
                             "AVX-512 (benchmarks/isa.py)")
    parser.add_argument("--platform", choices=tuple(PLATFORMS), default="bench",
                        help="bench: benchmarks/catalog.yaml's two deployments; full: what "
                             "make run serves (configs/local.yaml), measured as the peers "
                             "are and, with the embeddings part, at 32 against the engine in "
                             "process; both")
    args = parser.parse_args()
    isa.run_as(args.isa)
    parts = set(args.only.split(","))
    unknown = parts - set(PARTS)
    if unknown:
        raise SystemExit(f"unknown parts {sorted(unknown)}; choose from {PARTS}")
    chat, peers = "chat" in parts, "peers" in parts
    embeddings, platforms = "embeddings" in parts, PLATFORMS[args.platform]
    steps = 1 + embeddings + 2 * chat + ("startup" in parts) \
        + peers * (6 + (our_dtype() != VLLM_DEFAULT_DTYPE)) + 4 * ("fairness" in parts) \
        + ("bench" in platforms) * (embeddings + chat + ("cheap_route" in parts)
                                    + bool(parts - {"startup", "fairness"})) \
        + ("full" in platforms) * (peers or embeddings) * (1 + peers + embeddings)
    step = Progress(steps)
    data_dir = prepare_data_dir()
    step("weights ready (SmolLM2 converted, tiny model built)")
    ref: dict[str, float] = {}
    smollm2 = {"max_model_len": 2048, "max_num_seqs": 10}  # as the platform runs it
    tiny = {"max_model_len": 1024, "max_num_seqs": 8}
    if chat:
        ref.update(asyncio.run(engine_figures(MODELS_DIR / SMOLLM2, smollm2, args.tokens,
                                              args.seconds, (1, 8), short=True)))
        step(f"vLLM in process, SmolLM2: {ref['s1']:.1f} tok/s (1 stream, TTFT "
             f"{ref['ttft1']:.0f} ms), {ref['s8']:.1f} tok/s (8), {ref['short8']:.1f} "
             "1-token chats/s (8)")
        tiny_ref = asyncio.run(engine_figures(MODELS_DIR / TINY, tiny, args.tokens,
                                              args.seconds, (4,), short=False))
        ref["tiny4"] = tiny_ref["s4"]
        step(f"vLLM in process, tiny model: {ref['tiny4']:.0f} tok/s (4 streams)")
    if "embeddings" in parts:
        ref["emb32"], ref["emb1_ms"] = embedding_engine_figures()
        step(f"embedding engine in process: {ref['emb32']:.0f} texts/s on batches of 32, "
             f"{ref['emb1_ms']:.1f} ms per single text")
        ref["emb32_full"] = ref["emb32"]
        if "full" in platforms and embedder_options(FULL_CATALOG) != embedder_options(CATALOG):
            ref["emb32_full"], _ = embedding_engine_figures(catalog=FULL_CATALOG)
            print(f"    with the options of {FULL_CATALOG.name}: {ref['emb32_full']:.0f} texts/s",
                  flush=True)

    figures: list[Figure] = []

    def add(measured: list[Figure]) -> None:
        """Keep the figures of a part, written at once: a run that dies later keeps them."""
        figures.extend(measured)
        write(figures, RESULTS)

    ours: dict[str, float] = {}
    ours_full: dict[str, float] = {}
    if parts - {"startup", "fairness"}:
        key = benchmark_key(data_dir)
    if parts - {"startup", "fairness"} and "bench" in platforms:
        platform = Platform(data_dir, ["embedding", *(["text-xs"] if chat or peers else [])])
        step(f"platform up at {platform.base}")
        try:
            add(measure_api(platform, key, parts, ref, args, step))
            if peers:
                ours = chat_figures(platform.base, key, SMOLLM2, args.tokens, args.seconds,
                                    SAME_CONVERSATION)
                ours["emb32"] = embedding_figure(platform.base, key, EMBEDDER, args.seconds)
                ours["cheap8"] = authenticated_get(f"{platform.base}/api_keys/rate_limits",
                                                   key, args.seconds)
                step(f"ours, as the peers are measured: {ours['short8']:.1f} 1-token chats/s "
                     f"(8), TTFT {ours['ttft1']:.0f} ms, {ours['s1']:.1f} tok/s (1), "
                     f"{ours['s8']:.1f} tok/s (8), {ours['emb32']:.0f} embeddings/s (32), "
                     f"{ours['cheap8']:.0f} GET /api_keys/rate_limits/s (8)")
        finally:
            platform.stop()
    if (peers or "embeddings" in parts) and "full" in platforms:
        full_figures, ours_full = measure_full(args, parts, ref, step)
        add(full_figures)
    if peers:
        found = measure_peers((SMOLLM2, MODELS_DIR / SMOLLM2), (EMBEDDER, embedder_folder()),
                              ENGINE_ENV, args.tokens, args.seconds, step, free_port,
                              in_front=gateway_in_front(data_dir, key))
        if ours:
            add(peer_figures(ours, found))
        if ours_full:
            add(peer_figures(ours_full, found, prefix="full_"))
        add(upstream_figures(found))
    if "fairness" in parts:
        # Two accounts of one share each: one floods, the other chats (fairness.py).
        keys = two_accounts(lambda: bench_settings(data_dir))
        add(measure_fairness(
            lambda catalog: Platform(data_dir, ["text-xs", "embedding"], catalog), CATALOG,
            (SMOLLM2, EMBEDDER), keys,
            4 * args.seconds, step, Path(tempfile.mkdtemp(prefix="bench-fair-"))))
    if "startup" in parts:
        # The first start compiles the chat model into DATA_DIR's compile cache; the second,
        # on the same DATA_DIR, loads it: the start every later `make run` has.
        fresh = prepare_data_dir()
        first, again = start_to_first_chat(fresh), start_to_first_chat(fresh)
        add([ceiling_figure("start_to_first_chat_s", "s", again, 0, 40, added=False),
             ceiling_figure("start_to_first_chat_cold_s", "s", first, 0, 300, added=False)])
        step(f"make run to first chat: {again:.1f} s ({first:.1f} s the first time, "
             "compiling)")
    report(figures, RESULTS)


def measure_full(args: argparse.Namespace, parts: set[str], ref: dict[str, float],
                 step: Progress) -> tuple[list[Figure], dict[str, float]]:
    """Through the platform `make run` serves (every modality of the local catalog, on
    FULL_DATA_DIR): the embeddings part's figure against the engine in process
    (`full_embeddings_c32`), and what the peers are measured on."""
    FULL_DATA_DIR.mkdir(parents=True, exist_ok=True)
    if not (FULL_DATA_DIR / "models").exists():
        (FULL_DATA_DIR / "models").symlink_to(MODELS_DIR)
    key = benchmark_key(FULL_DATA_DIR)
    figures: list[Figure] = []
    ours: dict[str, float] = {}
    launched_at = time.time()
    with launched(FULL_DATA_DIR) as (base, seconds):
        # Chat answers first and the embedder loads after it (make run's stages): measure
        # once it has, not beside its load, as a user who waits for "Platform ready" would.
        wait_for_answer(f"{base}/embeddings", {"model": EMBEDDER, "input": SENTENCE},
                        {"Authorization": f"Bearer {key}"})
        step(f"the full platform (make run's) up at {base}: first chat after {seconds:.0f} s, "
             f"every model that always runs loaded after {time.time() - launched_at:.0f} s")
        if "embeddings" in parts:
            figures.append(full_embeddings(base, key, ref, args.seconds, step))
        if "peers" in parts:
            ours = chat_figures(base, key, SMOLLM2, args.tokens, args.seconds, SAME_CONVERSATION)
            ours["emb32"] = embedding_figure(base, key, EMBEDDER, args.seconds)
            ours["cheap8"] = authenticated_get(f"{base}/api_keys/rate_limits", key,
                                               args.seconds)
    if compiled_during(FULL_DATA_DIR, launched_at):
        print("    the chat model compiled in the background during this run (a cold compile "
              "cache), taking CPU from what was measured: run again to measure on a warm one",
              flush=True)
    if ours:
        step(f"ours on the full platform, as the peers are measured: {ours['short8']:.1f} "
             f"1-token chats/s (8), TTFT {ours['ttft1']:.0f} ms, {ours['s1']:.1f} tok/s (1), "
             f"{ours['s8']:.1f} tok/s (8), {ours['emb32']:.0f} embeddings/s (32), "
             f"{ours['cheap8']:.0f} GET /api_keys/rate_limits/s (8)")
    return figures, ours


def full_embeddings(base: str, key: str, ref: dict[str, float], seconds: int,
                    step: Progress) -> Figure:
    """`full_embeddings_c32`: POST /embeddings at concurrency 32 on the full platform, against
    the engine in process with the options of the catalog it serves; its latency at
    concurrency 1 and step profile are printed."""
    auth = {"Authorization": f"Bearer {key}"}
    body = {"model": EMBEDDER, "input": SENTENCE}
    url = f"{base}/embeddings"
    wrk(url, 8, 3, headers=auth, body=body)  # warm-up
    c1 = wrk(url, 1, seconds, headers=auth, body=body)
    print("    steps (ms, p50, concurrency 1): "
          + format_steps(step_profile(url, body, auth, 100)), flush=True)
    c32 = wrk(url, 32, seconds, headers=auth, body=body)
    step(f"POST /embeddings on the full platform: {c32['rps']:.0f}/s at 32 (the engine in "
         f"process: {ref['emb32_full']:.0f} texts/s), p50 {c1['p50_ms']:.1f} ms at 1")
    return rate_figure("full_embeddings_c32", "texts/s", c32["rps"], ref["emb32_full"], 0.8)


def wait_for_answer(url: str, body: dict, headers: dict[str, str], timeout_s: float = 600
                    ) -> None:
    """Until `url` answers `body` with a 200."""
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            if httpx.post(url, json=body, headers=headers, timeout=30).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        if time.monotonic() > deadline:
            raise TimeoutError(f"{url} did not answer within {timeout_s:.0f} s")
        time.sleep(0.5)


def compiled_during(data_dir: Path, since: float) -> bool:
    """Whether a background compile of the chat model started on `data_dir` since `since`."""
    from deployments.engines.vllm_compile import cache_root
    from deployments.engines.vllm_compile_fill import records

    root = cache_root({"DATA_DIR": str(data_dir)})
    return root is not None and any(r.get("started", 0) >= since for r in records(root))


def measure_api(platform: Platform, key: str, parts: set[str], ref: dict[str, float],
                args: argparse.Namespace, step: Progress) -> list[Figure]:
    auth = {"Authorization": f"Bearer {key}"}
    figures: list[Figure] = []
    if "embeddings" in parts:
        body = {"model": EMBEDDER, "input": SENTENCE}
        wrk(f"{platform.base}/embeddings", 8, 3, headers=auth, body=body)  # warm-up
        c1 = wrk(f"{platform.base}/embeddings", 1, args.seconds, headers=auth, body=body)
        # Right after the wrk run at concurrency 1, so the replica's engine time of these
        # requests is that of the wrk run's (it moved by up to 2 ms between the windows of
        # one run); the key's decisions still come from a lease, as through that run.
        steps = step_profile(f"{platform.base}/embeddings", body, auth, 100)
        print("    steps (ms, p50, concurrency 1): " + format_steps(steps), flush=True)
        c32 = wrk(f"{platform.base}/embeddings", 32, args.seconds, headers=auth, body=body)
        hop, charge = serve_hop_ms(platform.noop, args.seconds), durable_charge_ms(CATALOG,
                                                                                   EMBEDDER)
        # The engine's own time is the replica's forward pass (Server-Timing `engine`) of the
        # requests just after the wrk run, not the same engine timed in this process before
        # the platform started: the two moved apart by up to 2 ms between runs of one build.
        added = ceiling_figure("embeddings_c1_added_ms", "ms", c1["p50_ms"], steps["engine"],
                               round(hop + charge + FLOOR_MARGIN_MS, 2))
        added.floor = round(hop + charge, 2)
        figures += [rate_figure("embeddings_c32", "texts/s", c32["rps"], ref["emb32"], 0.8),
                    added]
        step(f"POST /embeddings: {c32['rps']:.0f}/s at 32, p50 {c1['p50_ms']:.1f} ms at 1, of "
             f"which the engine {steps['engine']:.2f} ms in the replica ({ref['emb1_ms']:.2f} "
             f"in this process); {steps['added']:.2f} ms added per request by httpx one at a "
             f"time; floor {added.floor:.2f} ms (Serve hop {hop:.2f} + durable charge "
             f"{charge:.2f})")
    if "cheap_route" in parts:
        route = f"{platform.base}/api_keys/rate_limits"
        wrk(route, 8, 2, headers=auth)
        wrk(platform.noop, 8, 2)
        ours, noop = wrk(route, 8, args.seconds, headers=auth), wrk(platform.noop, 8,
                                                                    args.seconds)
        ours1, noop1 = wrk(route, 1, args.seconds, headers=auth), wrk(platform.noop, 1,
                                                                      args.seconds)
        figures += [rate_figure("cheap_route_vs_noop", "req/s", ours["rps"], noop["rps"], 0.6),
                    ceiling_figure("cheap_route_c1_added_ms", "ms", ours1["p50_ms"],
                                   noop1["p50_ms"], 1)]
        step(f"GET /api_keys/rate_limits {ours['rps']:.0f}/s vs no-op {noop['rps']:.0f}/s at 8;"
             f" p50 {ours1['p50_ms']:.2f} vs {noop1['p50_ms']:.2f} ms at 1")
    if "chat" in parts:
        s1, ttft1 = asyncio.run(stream_chats(platform.base, key, SMOLLM2, 1, args.tokens))
        s8, _ = asyncio.run(stream_chats(platform.base, key, SMOLLM2, 8, args.tokens))
        tiny4, _ = asyncio.run(stream_chats(platform.base, key, TINY, 4, args.tokens))
        body = {"model": SMOLLM2, "max_tokens": 1, "temperature": 0,
                "messages": [{"role": "user", "content": "Say hi."}]}
        wrk(f"{platform.base}/chat/completions", 8, 2, headers=auth, body=body)
        print("    1-token chat steps (ms, p50, concurrency 1): "
              + format_steps(step_profile(f"{platform.base}/chat/completions", body, auth, 20)),
              flush=True)
        short = wrk(f"{platform.base}/chat/completions", 8, args.seconds, headers=auth, body=body)
        figures += [
            rate_figure("chat_stream_smollm2_s1", "tok/s", s1, ref["s1"], 0.95),
            rate_figure("chat_stream_smollm2_s8", "tok/s", s8, ref["s8"], 0.95),
            ceiling_figure("chat_ttft_added_ms", "ms", ttft1, ref["ttft1"], 10),
            rate_figure("chat_stream_tiny_s4", "tok/s", tiny4, ref["tiny4"], 0.8),
            rate_figure("chat_1token_c8", "req/s", short["rps"], ref["short8"], 0.9)]
        step(f"chat through the API: SmolLM2 {s1:.1f} tok/s (TTFT {ttft1:.0f} ms), "
             f"{s8:.1f} tok/s (8); tiny {tiny4:.0f} tok/s (4); {short['rps']:.1f} 1-token "
             "chats/s (8)")
    return figures


if __name__ == "__main__":
    main()
