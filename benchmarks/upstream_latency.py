"""What our Gateway adds to one request at a time before a server already running: a vLLM
server's (or any OpenAI-compatible one's) 1-token chat and the first token of a short stream,
direct and through the platform of `make bench` with the server as its `engine: openai`
model (bench.gateway_in_front), in alternation, every stream read to its end (a stream left
at its first token holds the engine for a step, and the next request waits for it).

Start the server first, in its own session (the platform's stop ends every process this
script started), e.g. vLLM's on the benchmark model with our engine's settings (its CPU build
told so: on an AVX2-only CPU it stopped at once with "Illegal instruction" without):

    VLLM_TARGET_DEVICE=cpu VLLM_CPU_KVCACHE_SPACE=1 \\
    .venv/bin/python benchmarks/vllm_serve.py serve .cache/models/smollm2-135m-instruct \\
        --served-model-name smollm2-135m-instruct --port 8011 --max-num-seqs 10 \\
        --max-model-len 2048 --dtype float32 &
    .venv/bin/python benchmarks/upstream_latency.py --url http://127.0.0.1:8011 [--pairs 30]

Prints the medians, direct and ours, and our `Server-Timing` steps of the unary chats.
"""

from __future__ import annotations

import argparse
import statistics
import time

import bench
import httpx

MESSAGES = [{"role": "user", "content": "Say hi."}]


def unary(client: httpx.Client, base: str, model: str) -> tuple[float, str]:
    """(ms, the Server-Timing header) of one 1-token chat."""
    start = time.perf_counter()
    answer = client.post(f"{base}/chat/completions", json={
        "model": model, "max_tokens": 1, "temperature": 0, "messages": MESSAGES})
    answer.raise_for_status()
    return (time.perf_counter() - start) * 1000, answer.headers.get("server-timing", "")


def first_token(client: httpx.Client, base: str, model: str) -> float:
    """ms to the first chunk with text of an 8-token stream, read to its end."""
    start, first = time.perf_counter(), None
    with client.stream("POST", f"{base}/chat/completions", json={
            "model": model, "max_tokens": 8, "temperature": 0, "stream": True,
            "messages": MESSAGES}) as answer:
        answer.raise_for_status()
        for line in answer.iter_lines():
            compact = line.replace(" ", "")
            if first is None and '"content":"' in compact and '"content":""' not in compact:
                first = (time.perf_counter() - start) * 1000
    if first is None:
        raise RuntimeError(f"{base}: a stream without text")
    return first


def steps(headers: list[str]) -> dict[str, float]:
    """The median of each `Server-Timing` step."""
    timed: dict[str, list[float]] = {}
    for header in headers:
        for part in header.split(", "):
            name, _, value = part.partition(";dur=")
            if value:
                timed.setdefault(name, []).append(float(value))
    return {name: round(statistics.median(values), 2) for name, values in timed.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--url", required=True, help="the server, without /v1")
    parser.add_argument("--model", default=bench.SMOLLM2, help="its model name")
    parser.add_argument("--pairs", type=int, default=30)
    args = parser.parse_args()
    direct_base = f"{args.url.rstrip('/')}/v1"
    data_dir = bench.prepare_data_dir()
    key = bench.benchmark_key(data_dir)
    with bench.gateway_in_front(data_dir, key)(direct_base, args.model) as (base, ours_key,
                                                                            model):
        direct = httpx.Client(timeout=120)
        ours = httpx.Client(timeout=120, headers={"Authorization": f"Bearer {ours_key}"})
        sides = ((direct, direct_base, args.model), (ours, base, model))
        for _ in range(5):  # warm-up
            for client, at, name in sides:
                unary(client, at, name)
                first_token(client, at, name)
        times: dict[str, list[float]] = {"unary": [], "unary_ours": [], "first": [],
                                         "first_ours": []}
        timing: list[str] = []
        for _ in range(args.pairs):
            times["unary"].append(unary(direct, direct_base, args.model)[0])
            ms, header = unary(ours, base, model)
            times["unary_ours"].append(ms)
            timing.append(header)
            times["first"].append(first_token(direct, direct_base, args.model))
            times["first_ours"].append(first_token(ours, base, model))
        med = {name: statistics.median(values) for name, values in times.items()}
        print(f"1-token chat: direct {med['unary']:.1f} ms, ours {med['unary_ours']:.1f} ms "
              f"({med['unary_ours'] - med['unary']:+.1f}); first token: direct "
              f"{med['first']:.1f} ms, ours {med['first_ours']:.1f} ms "
              f"({med['first_ours'] - med['first']:+.1f}); {args.pairs} pairs")
        print(f"our steps (unary, medians, ms): {steps(timing)}")


if __name__ == "__main__":
    main()
