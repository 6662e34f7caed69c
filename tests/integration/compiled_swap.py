"""Driver of the compiled-swap test, run as its own process on a cluster of its own (like
autoscaling.py): the platform with its chat model on a cold compile cache starts the engine
eager and compiles it in the background; when that compile's record says done, `make run`'s
own step (serve_app/launch.py, `roll_onto_compiled`) deploys the chat deployment again with
compiled replicas, while a client streams chats without pause. Prints one JSON object: every
chat's outcome, how many ran during the move, and what the chat replica reports after.

    python -m tests.integration.compiled_swap ADDRESS PORT DATA_DIR DATABASE_URL REDIS_URL
"""

from __future__ import annotations

import json
import sys
import threading
import time
from pathlib import Path
from typing import Any

import httpx
import yaml

from deployments.engines.vllm_compile_fill import records
from deployments.registry import vllm_cpu_env
from serve_app.launch import roll_onto_compiled
from tests.integration.autoscaling import _account
from tests.integration.multinode import ADMIN_KEY, CATALOG, _wait_running

MODEL = "tiny-chat"
FILL_DEADLINE_S = 600.0


def cold_catalog(data_dir: Path) -> Path:
    """The test catalog with the tiny chat model as a user's is: no `enforce_eager`, so a
    cold cache starts it eager and compiles it behind."""
    catalog = yaml.safe_load(CATALOG.read_text())
    for model in catalog["models"]:
        if model["id"] == MODEL:
            model["engine_options"].pop("enforce_eager", None)
    path = data_dir / "catalog.yaml"
    path.write_text(yaml.safe_dump(catalog))
    return path


def serve_config(data_dir: Path, database_url: str, redis_url: str) -> dict[str, Any]:
    return {"applications": [{
        "name": "inference", "route_prefix": "/", "import_path": "serve_app.app:build_app",
        "args": {"settings": {"data_dir": str(data_dir), "database_url": database_url,
                              "redis_url": redis_url, "redis_prefix": "compiled-swap",
                              "admin_api_key": ADMIN_KEY, "initial_credit_usd": 50,
                              "model_catalog": str(cold_catalog(data_dir)),
                              # both nodes run on this machine: one directory is shared
                              "result_store_url": f"{data_dir}/results"},
                 "model_deployments": ["text-xs"]},
        "deployments": [
            # the compile cache under DATA_DIR, as `make run` gives every replica
            {"name": "text-xs", "ray_actor_options": {"num_cpus": 0.5, "runtime_env": {
                "env_vars": {**vllm_cpu_env(), "DATA_DIR": str(data_dir)}}}},
        ]}]}


class Chats:
    """Streams one short chat after another from a thread, each outcome kept."""

    def __init__(self, base: str, key: str) -> None:
        self.base, self.key = base, key
        self.outcomes: list[dict[str, Any]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def start(self) -> Chats:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=120)

    def _run(self) -> None:
        with httpx.Client(timeout=120) as client:
            while not self._stop.is_set():
                self.outcomes.append(self._chat(client))

    def _chat(self, client: httpx.Client) -> dict[str, Any]:
        began, status, finish, error, text = time.monotonic(), None, None, None, ""
        try:
            with client.stream("POST", f"{self.base}/chat/completions",
                               headers={"Authorization": f"Bearer {self.key}"},
                               json={"model": MODEL, "stream": True, "max_tokens": 16,
                                     "temperature": 0,
                                     "messages": [{"role": "user", "content": "Hello"}]}
                               ) as resp:
                status = resp.status_code
                for line in resp.iter_lines():
                    if line.startswith("data: {"):
                        for choice in json.loads(line[6:]).get("choices", []):
                            text += choice.get("delta", {}).get("content") or ""
                            finish = choice.get("finish_reason") or finish
        except httpx.HTTPError as exc:
            error = f"{type(exc).__name__}: {exc}"
        return {"began": began, "status": status, "finish": finish, "error": error,
                "text": text}


def main(address: str, port: int, data_dir: str, database_url: str, redis_url: str
         ) -> dict[str, Any]:
    import ray
    from ray import serve
    from ray.serve.context import _get_global_client
    from ray.serve.schema import ServeDeploySchema

    root = Path(data_dir)
    config = serve_config(root, database_url, redis_url)
    ray.init(address=address, log_to_driver=False)
    serve.start(http_options={"host": "127.0.0.1", "port": port}, proxy_location="HeadOnly")
    _get_global_client().deploy_apps(ServeDeploySchema.model_validate(config))
    _wait_running(serve)
    base = f"http://127.0.0.1:{port}/api/v1"
    _, key, _ = _account(base, database_url, data_dir)
    handle = serve.get_deployment_handle("text-xs", app_name="inference")
    before = handle.stats.remote().result()[MODEL]
    # the background compile's own record of its end: what `make run` waits for
    deadline, done = time.monotonic() + FILL_DEADLINE_S, None
    while done is None and time.monotonic() < deadline:
        done = next((r for r in records(root / "cache" / "vllm") if r.get("state") == "done"),
                    None)
        time.sleep(1)
    assert done is not None, records(root / "cache" / "vllm")

    chats = Chats(base, key).start()
    while not chats.outcomes:  # chats answer before the move begins
        time.sleep(0.1)
    move_began = time.monotonic()
    roll_onto_compiled(int(address.rsplit(":", 1)[1]), config, {"text-xs"}, done)
    move_ended = time.monotonic()
    time.sleep(3)  # and after it
    chats.stop()

    after = handle.stats.remote().result()[MODEL]
    deadline = time.monotonic() + 120  # the eager replica stops once its requests are done
    while time.monotonic() < deadline and serve.status().applications["inference"].deployments[
            "text-xs"].replica_states != {"RUNNING": 1}:
        time.sleep(1)
    replicas = serve.status().applications["inference"].deployments["text-xs"].replica_states
    return {"compiled_before": before["compiled"], "compiled_after": after["compiled"],
            "fill": {k: done.get(k) for k in ("state", "seconds")},
            "move_s": round(move_ended - move_began, 1),
            "during_move": sum(move_began <= o["began"] <= move_ended for o in chats.outcomes),
            "outcomes": [{k: v for k, v in o.items() if k != "began"} for o in chats.outcomes],
            "replicas_after": replicas}


if __name__ == "__main__":
    address, port, data_dir, database_url, redis_url = sys.argv[1:]
    print(json.dumps(main(address, int(port), data_dir, database_url, redis_url)), flush=True)
