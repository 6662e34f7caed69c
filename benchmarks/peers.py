"""The stack a user would pick instead of ours, on the same weights: vLLM's own OpenAI server
(`vllm serve FOLDER` with our engine's `max_num_seqs`, `max_model_len` and dtype, its defaults
otherwise), alone and with LiteLLM's proxy in front of it (keys checked against its master
key); and, where our engine picks another dtype than vLLM's own on this CPU, vLLM's server
with its own dtype too (what a user of it gets: the `peer_default_*` figures). All are
measured with the clients that measure our API (benchmarks/clients.py); a peer that answers
nothing in a window counts 0 there, with its log named.

LiteLLM goes into a virtualenv of its own under .cache/peers (installed here, from the
registry, on first use): it is never a dependency of the project.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager
from pathlib import Path

import httpx
import yaml
from clients import stream_chats, wrk
from figures import Figure, ceiling_figure, rate_figure, with_litellm

ROOT = Path(__file__).resolve().parent.parent
PEERS_DIR = ROOT / ".cache" / "peers"
LITELLM_VENV = PEERS_DIR / "litellm"
LITELLM_VERSION = "1.108.7"
LITELLM_KEY = "sk-litellm-benchmark-master-key-0001"
SENTENCE = "Sentence number 1 about lighthouses, storms and the sea."
# Our text engine's settings that the peer gets too (deployments/engines/text.py); everything
# else is vLLM's default. Its dtype too: `our_dtype()`.
TEXT_SETTINGS = ["--max-num-seqs", "10", "--max-model-len", "2048"]
# What our API is sent in the comparison, beside each request's body: the conversation as the
# peers' engines get it. A catalog's `service_system_prompt` (the local one has one) replaces
# the model's own default system prompt, and SmolLM2's engine would then read 39 prompt tokens
# of "Say hi." against the peers' 33; its cost is measured apart (benchmarks/layers.py).
SAME_CONVERSATION = {"service_parameters": {"include_service_system_prompt": False}}
# vLLM's own choice of dtype on a CPU, whatever the CPU: the peer "as a user gets it" runs it.
VLLM_DEFAULT_DTYPE = "bfloat16"
# Our Gateway in front of a server (`engine: openai`): given the server's base URL (up to /v1)
# and its model name, a running platform's (API base, key, catalog model id) until it ends.
InFront = Callable[[str, str], AbstractContextManager[tuple[str, str, str]]]


def our_dtype() -> str:
    """The dtype our text engine picks on this CPU (imported here: this module is loaded
    before the repository is on sys.path)."""
    from deployments.engines.cpu_flags import cpu_dtype

    return cpu_dtype()


READY_TIMEOUT_S = 900


def litellm_bin() -> Path:
    """LiteLLM's proxy CLI in its own virtualenv, installed at LITELLM_VERSION if missing."""
    python = LITELLM_VENV / "bin" / "python"
    if not python.exists():
        subprocess.run([sys.executable, "-m", "venv", str(LITELLM_VENV)], check=True)
    installed = subprocess.run([str(python), "-c", "import importlib.metadata as m; "
                                "print(m.version('litellm'))"], capture_output=True, text=True)
    if installed.stdout.strip() != LITELLM_VERSION:
        print(f"    installing LiteLLM {LITELLM_VERSION} into {LITELLM_VENV}", flush=True)
        subprocess.run([str(python), "-m", "pip", "install", "--quiet",
                        f"litellm[proxy]=={LITELLM_VERSION}"], check=True)
    return LITELLM_VENV / "bin" / "litellm"


def peer_environment(engine_env: dict[str, str]) -> dict[str, str]:
    """This process's environment without our engine's settings (the peers run with their
    own defaults), plus what running offline needs, the device of vLLM's CPU build, and our KV
    cache size (1 GiB; vLLM's CPU default sizes it from the machine's memory)."""
    env = {k: v for k, v in os.environ.items()
           if k not in engine_env and not k.startswith("RAY_")}
    env.update({"HF_HUB_OFFLINE": "1", "VLLM_NO_USAGE_STATS": "1", "DO_NOT_TRACK": "1",
                "VLLM_TARGET_DEVICE": engine_env["VLLM_TARGET_DEVICE"],
                "VLLM_CPU_KVCACHE_SPACE": engine_env["VLLM_CPU_KVCACHE_SPACE"],
                "LITELLM_LOCAL_MODEL_COST_MAP": "True"})
    return env


@contextlib.contextmanager
def server(name: str, cmd: list[str], env: dict[str, str], ready_url: str,
           logs: Path) -> Iterator[None]:
    """A server process in its own session, until `ready_url` answers 200; stopped (SIGINT,
    then SIGKILL) on the way out. Its output goes to `logs/<name>.log`."""
    log = (logs / f"{name}.log").open("w")
    proc = subprocess.Popen(cmd, env=env, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT,
                            start_new_session=True)
    try:
        deadline = time.monotonic() + READY_TIMEOUT_S
        while True:
            if proc.poll() is not None:
                raise RuntimeError(f"{name} exited with {proc.returncode}: see {log.name}")
            with contextlib.suppress(httpx.HTTPError):
                if httpx.get(ready_url, timeout=2).status_code == 200:
                    break
            if time.monotonic() > deadline:
                raise TimeoutError(f"{name} not ready in {READY_TIMEOUT_S} s: see {log.name}")
            time.sleep(0.5)
        yield
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGINT)
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        log.close()


def vllm_serve(folder: Path, name: str, port: int, extra: list[str]) -> list[str]:
    return [sys.executable, str(ROOT / "benchmarks" / "vllm_serve.py"), "serve", str(folder),
            "--served-model-name", name, "--host", "127.0.0.1", "--port", str(port), *extra]


def litellm_config(path: Path, models: dict[str, int]) -> Path:
    """One `hosted_vllm/` model per served model name, at its vLLM server's port."""
    path.write_text(yaml.safe_dump({
        "model_list": [{"model_name": name,
                        "litellm_params": {"model": f"hosted_vllm/{name}",
                                           "api_base": f"http://127.0.0.1:{port}/v1"}}
                       for name, port in models.items()],
        "general_settings": {"master_key": LITELLM_KEY}}))
    return path


def chat_figures(base: str, key: str, model: str, tokens: int, seconds: int,
                 extra: dict | None = None, *, log: Path | None = None) -> dict[str, float]:
    """What `make bench` compares with the peers, the same way for every stack: 1-token chats/s
    at concurrency 8 (wrk), one stream's tokens/s and median time to first token, 8 streams'
    tokens/s. `extra`: more fields of every request body. `log`: a peer's log; a figure it
    fails to deliver (no answer in the window, an error) is then 0 (a time: infinite) and
    the log is named, instead of ending the run."""
    out: dict[str, float] = {}

    def measured(names: tuple[str, ...], measure) -> None:
        try:
            values = measure()
        except Exception as exc:
            if log is None:
                raise
            print(f"    {base}: {names} not measured ({exc}); see {log}", flush=True)
            values = tuple(float("inf") if n.startswith("ttft") else 0.0 for n in names)
        out.update(zip(names, values, strict=True))

    measured(("s1", "ttft1"), lambda: asyncio.run(
        stream_chats(base, key, model, 1, tokens, extra)))
    measured(("s8",), lambda: asyncio.run(
        stream_chats(base, key, model, 8, tokens, extra))[:1])
    body = {"model": model, "max_tokens": 1, "temperature": 0,
            "messages": [{"role": "user", "content": "Say hi."}], **(extra or {})}
    auth = {"Authorization": f"Bearer {key}"}

    def short() -> tuple[float]:
        wrk(f"{base}/chat/completions", 8, 2, headers=auth, body=body)  # warm-up
        return (wrk(f"{base}/chat/completions", 8, seconds, headers=auth, body=body)["rps"],)

    def prompt_tokens() -> tuple[float]:
        answer = httpx.post(f"{base}/chat/completions", json=body, headers=auth, timeout=120)
        answer.raise_for_status()
        return (float(answer.json()["usage"]["prompt_tokens"]),)

    measured(("prompt_tokens",), prompt_tokens)
    measured(("short8",), short)
    return out


def embedding_figure(base: str, key: str, model: str, seconds: int) -> float:
    """POST /embeddings of one sentence at concurrency 32 (wrk), texts/s."""
    body, auth = {"model": model, "input": SENTENCE}, {"Authorization": f"Bearer {key}"}
    wrk(f"{base}/embeddings", 8, 3, headers=auth, body=body)  # warm-up
    return wrk(f"{base}/embeddings", 32, seconds, headers=auth, body=body)["rps"]


def authenticated_get(url: str, key: str, seconds: int) -> float:
    """GETs per second at concurrency 8 of a route that checks the key and calls no model:
    our `/api_keys/rate_limits` (an account's key looked up, its limits read), LiteLLM's
    `/v1/models` (its master key compared, the list read from its configuration)."""
    auth = {"Authorization": f"Bearer {key}"}
    wrk(url, 8, 2, headers=auth)  # warm-up
    return wrk(url, 8, seconds, headers=auth)["rps"]


def measure_peers(text: tuple[str, Path] | None, embedder: tuple[str, Path] | None,
                  engine_env: dict[str, str], tokens: int, seconds: int, step, free_port,
                  in_front: InFront | None = None) -> dict[str, dict[str, float]]:
    """{"vllm": figures, "litellm": figures}: each vLLM server (the chat model, then the
    embedder) alone and behind one LiteLLM proxy, one server at a time; with `in_front`,
    also behind our Gateway ("upstream": a catalog model `engine: openai` on the same chat
    server, measured after the other two, while LiteLLM's proxy idles as it did for them)."""
    env = peer_environment(engine_env)
    logs = Path(tempfile.mkdtemp(prefix="bench-peers-"))
    ports = {"text": free_port(), "embedding": free_port(), "litellm": free_port()}
    served = {}
    if text:
        served[text[0]] = ports["text"]
    if embedder:
        served[embedder[0]] = ports["embedding"]
    litellm = [str(litellm_bin()), "--config", str(litellm_config(logs / "litellm.yaml", served)),
               "--host", "127.0.0.1", "--port", str(ports["litellm"])]
    proxy = f"http://127.0.0.1:{ports['litellm']}"
    out: dict[str, dict[str, float]] = {"vllm": {}, "litellm": {}}
    print(f"    peer logs in {logs}", flush=True)
    with server("litellm", litellm, env, f"{proxy}/health/liveliness", logs):
        try:
            out["litellm"]["cheap8"] = authenticated_get(f"{proxy}/v1/models", LITELLM_KEY,
                                                         seconds)
        except (RuntimeError, subprocess.CalledProcessError) as failed:  # 0, never a crash
            print(f"    LiteLLM's GET failed ({failed}): see {logs / 'litellm.log'}", flush=True)
            out["litellm"]["cheap8"] = 0.0
        step(f"LiteLLM's authenticated GET /v1/models: {out['litellm']['cheap8']:.0f}/s at 8")
        if text:
            name, folder = text
            url = f"http://127.0.0.1:{ports['text']}"
            same = [*TEXT_SETTINGS, "--dtype", our_dtype()]
            print(f"    vLLM's server with our engine's settings: {' '.join(same)}", flush=True)
            with server("vllm-text", vllm_serve(folder, name, ports["text"], same),
                        env, f"{url}/health", logs):
                step("vLLM's OpenAI server up (chat model) beside LiteLLM's proxy")
                out["vllm"].update(chat_figures(f"{url}/v1", "none", name, tokens, seconds,
                                                log=logs / "vllm-text.log"))
                out["litellm"].update(chat_figures(f"{proxy}/v1", LITELLM_KEY, name, tokens,
                                                   seconds, log=logs / "litellm.log"))
                if in_front is not None:
                    with in_front(f"{url}/v1", name) as (base, key, model):
                        out["upstream"] = chat_figures(base, key, model, tokens, seconds)
                    step("our Gateway in front of the same server (engine: openai): "
                         + _one(out["upstream"]))
            step("peers, chat: " + _summary(out))
            if our_dtype() != VLLM_DEFAULT_DTYPE:
                # What a user of vLLM's server gets on this CPU: its own dtype.
                with server("vllm-text-default", vllm_serve(folder, name, ports["text"],
                                                            TEXT_SETTINGS),
                            env, f"{url}/health", logs):
                    out["vllm_default"] = chat_figures(
                        f"{url}/v1", "none", name, tokens, seconds,
                        log=logs / "vllm-text-default.log")
                step(f"vLLM's server with its own dtype ({VLLM_DEFAULT_DTYPE}): "
                     + _one(out["vllm_default"]))
        if embedder:
            name, folder = embedder
            url = f"http://127.0.0.1:{ports['embedding']}"
            with server("vllm-embedding", vllm_serve(folder, name, ports["embedding"], []),
                        env, f"{url}/health", logs):
                out["vllm"]["emb32"] = embedding_figure(f"{url}/v1", "none", name, seconds)
                try:
                    out["litellm"]["emb32"] = embedding_figure(f"{proxy}/v1", LITELLM_KEY,
                                                               name, seconds)
                except (RuntimeError, subprocess.CalledProcessError) as failed:  # 0, no crash
                    print(f"    LiteLLM's embeddings failed ({failed}): see "
                          f"{logs / 'litellm.log'}", flush=True)
                    out["litellm"]["emb32"] = 0.0
            step(f"peers, embeddings at 32: vLLM {out['vllm']['emb32']:.0f}/s, LiteLLM + vLLM "
                 f"{out['litellm']['emb32']:.0f}/s")
    return out


def _one(f: dict[str, float]) -> str:
    return (f"{f['short8']:.1f} 1-token chats/s (8), TTFT {f['ttft1']:.0f} ms, "
            f"{f['s1']:.1f} tok/s (1), {f['s8']:.1f} tok/s (8)")


def _summary(out: dict[str, dict[str, float]]) -> str:
    return "; ".join(f"{who} {_one(f)}" for who, f in (("vLLM", out["vllm"]),
                                                       ("LiteLLM + vLLM", out["litellm"])))


def peer_figures(ours: dict[str, float], peers: dict[str, dict[str, float]],
                 prefix: str = "") -> list[Figure]:
    """Ours against vLLM's server alone (the ratio and goal), LiteLLM + vLLM alongside.
    `prefix`: the platform measured, in each figure's name (`full_`: the local catalog)."""
    vllm, litellm = peers["vllm"], peers["litellm"]
    if ours.get("prompt_tokens") != vllm.get("prompt_tokens"):
        print(f"    unequal work: the 1-token chat's prompt is {ours.get('prompt_tokens')} tokens "
              f"through ours, {vllm.get('prompt_tokens')} through vLLM's server", flush=True)
    figures = []
    if "short8" in ours and "short8" in vllm:
        figures += [
            with_litellm(rate_figure(f"{prefix}peer_1token_c8", "req/s", ours["short8"],
                                     vllm["short8"], 0.95), litellm["short8"]),
            with_litellm(ceiling_figure(f"{prefix}peer_ttft_ms", "ms", ours["ttft1"],
                                        vllm["ttft1"], 10), litellm["ttft1"]),
            with_litellm(rate_figure(f"{prefix}peer_stream_s1", "tok/s", ours["s1"],
                                     vllm["s1"], 0.95), litellm["s1"]),
            with_litellm(rate_figure(f"{prefix}peer_stream_s8", "tok/s", ours["s8"],
                                     vllm["s8"], 0.95), litellm["s8"])]
    default = peers.get("vllm_default")
    if default and "short8" in ours:
        # Against vLLM's server as a user gets it on this CPU (its own dtype).
        figures += [
            rate_figure(f"{prefix}peer_default_1token_c8", "req/s", ours["short8"],
                        default["short8"], 0.95),
            ceiling_figure(f"{prefix}peer_default_ttft_ms", "ms", ours["ttft1"],
                           default["ttft1"], 10),
            rate_figure(f"{prefix}peer_default_stream_s1", "tok/s", ours["s1"], default["s1"],
                        0.95),
            rate_figure(f"{prefix}peer_default_stream_s8", "tok/s", ours["s8"], default["s8"],
                        0.95)]
    if "cheap8" in ours and "cheap8" in litellm:
        figures.append(rate_figure(f"{prefix}peer_cheap_route", "req/s", ours["cheap8"],
                                   litellm["cheap8"], 5.0,
                                   note="LiteLLM's GET answered nothing: its log, peer logs"))
    if "emb32" in ours and "emb32" in vllm:
        figures.append(with_litellm(rate_figure(f"{prefix}peer_embeddings_c32", "texts/s",
                                                ours["emb32"], vllm["emb32"], 0.95),
                                    litellm["emb32"]))
    return figures


def upstream_figures(peers: dict[str, dict[str, float]]) -> list[Figure]:
    """Our Gateway in front of vLLM's server (`engine: openai`) against the same server
    direct: 1-token chats at 8 within 5%, first token at most 5 ms later, one stream within
    5%; LiteLLM in front of the same server alongside (ours ahead of it on each)."""
    up, vllm, litellm = peers.get("upstream"), peers["vllm"], peers["litellm"]
    if not up or "short8" not in vllm:
        return []
    return [
        with_litellm(rate_figure("upstream_1token_c8", "req/s", up["short8"], vllm["short8"],
                                 0.95), litellm["short8"]),
        with_litellm(ceiling_figure("upstream_ttft_ms", "ms", up["ttft1"], vllm["ttft1"], 5),
                     litellm["ttft1"]),
        with_litellm(rate_figure("upstream_stream_s1", "tok/s", up["s1"], vllm["s1"], 0.95),
                     litellm["s1"]),
        with_litellm(rate_figure("upstream_stream_s8", "tok/s", up["s8"], vllm["s8"], 0.95),
                     litellm["s8"])]
