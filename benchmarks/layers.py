"""Three layers of ours that the peer comparison does not show one at a time (issue 26, item 1):

- the default system prompt: `make run` serves configs/models.yaml, whose
  `service_system_prompt` goes before every conversation; `make bench`'s catalog has none.
  Measured: the peers' chat figures through the API on SmolLM2, with that prompt and with
  `service_parameters.include_service_system_prompt: false`, alternating;
- the stream-merge window (deployments/streaming.py, one piece per 20 ms at most): the SSE
  pieces of one 128-token stream against its tokens (as many pieces as tokens: nothing merged);
- prompt assembly in the Gateway: validating a chat request and composing the messages the
  engine gets (the service prompt included), in this process.

    .venv/bin/python benchmarks/layers.py [--seconds 10] [--rounds 2]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import httpx
import yaml

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

from peers import SAME_CONVERSATION as WITHOUT_PROMPT  # noqa: E402  (after the path)

from deployments.catalog_file import read_catalog_file  # noqa: E402


def catalog_with_service_prompt() -> Path:
    """The benchmark catalog plus `make run`'s service system prompt."""
    catalog = yaml.safe_load((ROOT / "benchmarks" / "catalog.yaml").read_text())
    served = read_catalog_file(ROOT / "configs" / "models.yaml")  # its includes read too
    catalog["service_system_prompt"] = served["service_system_prompt"]
    path = Path(tempfile.mkdtemp(prefix="bench-layers-")) / "catalog.yaml"
    path.write_text(yaml.safe_dump(catalog))
    return path


def stream_pieces(base: str, key: str, model: str, tokens: int) -> tuple[int, int]:
    """(SSE pieces with text, completion tokens) of one greedy stream."""
    from clients import PROMPT

    body = {"model": model, "temperature": 0, "max_tokens": tokens, "stream": True,
            "stream_options": {"include_usage": True},
            "messages": [{"role": "user", "content": PROMPT}]}
    pieces = produced = 0
    with httpx.Client(timeout=300, headers={"Authorization": f"Bearer {key}"}) as client, \
            client.stream("POST", f"{base}/chat/completions", json=body) as resp:
        resp.raise_for_status()
        for line in resp.iter_lines():
            if not line.startswith("data: {"):
                continue
            event = json.loads(line[6:])
            if any(c.get("delta", {}).get("content") for c in event.get("choices", [])):
                pieces += 1
            if event.get("usage"):
                produced = event["usage"]["completion_tokens"]
    return pieces, produced


def assembly_us(catalog_path: Path, model_id: str, count: int = 2000) -> tuple[float, float]:
    """(µs to validate a chat request, µs to compose its engine messages), medians."""
    from clients import PROMPT

    from serve_app.chat.prompt import Composition, engine_messages
    from serve_app.models.catalog import load_catalog
    from serve_app.schemas.chat import ChatCompletionRequest

    catalog = load_catalog(catalog_path)
    body = {"model": model_id, "max_tokens": 1, "temperature": 0,
            "messages": [{"role": "user", "content": PROMPT}]}
    validate, compose = [], []
    for _ in range(count):
        started = time.perf_counter()
        req = ChatCompletionRequest.model_validate(body)
        validated = time.perf_counter()
        comp = Composition()
        comp.service_prompt = catalog.service_system_prompt
        engine_messages(req, comp)
        composed = time.perf_counter()
        validate.append((validated - started) * 1e6)
        compose.append((composed - validated) * 1e6)
    return statistics.median(validate), statistics.median(compose)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--seconds", type=int, default=10, help="seconds per wrk point")
    parser.add_argument("--rounds", type=int, default=2, help="alternations with/without")
    parser.add_argument("--tokens", type=int, default=128)
    args = parser.parse_args()
    catalog = catalog_with_service_prompt()
    os.environ["BENCH_CATALOG"] = str(catalog)  # read by bench on import
    import bench
    from peers import chat_figures

    validate, compose = assembly_us(catalog, bench.SMOLLM2)
    print(f"prompt assembly in the Gateway: validation {validate:.0f} µs, composing the "
          f"engine's messages {compose:.1f} µs (p50)", flush=True)
    data_dir = bench.prepare_data_dir()
    key = bench.benchmark_key(data_dir)
    platform = bench.Platform(data_dir, ["text-xs"])
    try:
        pieces, produced = stream_pieces(platform.base, key, bench.SMOLLM2, args.tokens)
        print(f"stream-merge window: {pieces} SSE pieces for {produced} tokens", flush=True)
        for round_ in range(1, args.rounds + 1):
            for label, extra in (("with the service prompt", None),
                                 ("without it", WITHOUT_PROMPT)):
                got = chat_figures(platform.base, key, bench.SMOLLM2, args.tokens,
                                   args.seconds, extra)
                print(f"round {round_}, {label}: {got['short8']:.1f} 1-token chats/s (8), "
                      f"TTFT {got['ttft1']:.1f} ms, {got['s1']:.1f} tok/s (1), "
                      f"{got['s8']:.1f} tok/s (8)", flush=True)
    finally:
        platform.stop()


if __name__ == "__main__":
    main()
