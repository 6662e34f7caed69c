"""`make run`: start a local Ray instance and the platform on it, and stop both on Ctrl-C.

Ray listens on RAY_PORT (default 6380: Redis owns 6379). Serve runs `configs/local.yaml` in
throughput-optimised mode with the Gateway's own HTTP port pinned to PORT;
`python -m serve_app.launch CONFIG` runs another Serve config (the image's entrypoint passes
SERVE_CONFIG so).

The start is staged: the chat engines load first, alone, and the other model deployments
(embeddings, images, audio, video) follow once chat answers. On two cores every replica that
loads at the same time slows the others; the chat engine is the slowest to load, and the one
a user tries first. A deployment the config scales to zero (`min_replicas: 0`: the media ones
of configs/local.yaml) is not waited for: its first request starts its replica.

When a chat engine started eager on a cold compile cache and its background compile finishes
(deployments/engines/vllm_compile_fill.py), its deployment is deployed again with replicas that
start compiled; a compiled replica starts beside the eager one, which answers until the new one
is ready and then stops (Serve's rolling replacement with `max_surge_percent`).
"""

from __future__ import annotations

import contextlib
import copy
import os
import queue
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Collection
from pathlib import Path
from typing import TYPE_CHECKING

import httpx
import yaml

from serve_app.process_tree import ray_processes, reap
from serve_app.request_id import SERVE_CALLBACK
from serve_app.settings import PROJECT_ROOT, LaunchSettings, Settings

if TYPE_CHECKING:
    from serve_app.models.catalog import Catalog

READY_TIMEOUT_S = 600.0
SERVE_PROXY_PORT = 8001  # http_options.port of configs/local.yaml
CONFIG = PROJECT_ROOT / "configs" / "local.yaml"  # the default Serve config
FIRST_MODEL_TYPES = {"text"}  # the deployments of these models load in the first stage
# Set on a chat deployment's replicas, to the compile's key, to replace them by compiled ones:
# Serve restarts the replicas of a deployment whose actor options change.
COMPILED_ENV = "ENGINE_COMPILE_FILLED"
# What Ray's and Serve's processes do when nobody calls (docs/getting-started.md, "Idle"); an
# operator's own value wins. Serve's controller runs its control loop ten times a second by
# default, and every replica and handle exports its metrics as often: once a second still
# starts a replica for the first request to a deployment at zero within a second (its start
# takes seconds), and Prometheus reads the metrics every few seconds at most.
IDLE_SETTINGS = {
    "RAY_SERVE_CONTROL_LOOP_INTERVAL_S": "1.0",
    "RAY_SERVE_METRICS_EXPORT_INTERVAL_MS": "1000",
}
# The model replicas at the lowest CPU priority (deployments/priority.py), the Gateway, Serve's
# proxy and controller at the normal one: Ray would start every worker at nice 15
# (RAY_worker_niceness), where the request path weighs only about twice an engine at 19 and
# yields to every process at 0 (a load generator on the same cores); at 0 it weighs about 68
# times an engine. An operator's own values win (ENGINE_NICENESS=0: the engines as the Gateway).
ENGINE_NICENESS = "19"
RAY_WORKER_NICENESS = "0"


def first_stage(config: dict, deferred: set[str]) -> dict:
    """`config` with the `deferred` deployments at zero replicas (they still scale up from zero
    if a request comes for them before the second stage)."""
    staged = copy.deepcopy(config)
    for app in staged["applications"]:
        for deployment in app.get("deployments", []):
            if deployment["name"] in deferred:
                deployment.pop("num_replicas", None)
                upper = (deployment.get("autoscaling_config") or {}).get("max_replicas", 1)
                deployment["autoscaling_config"] = {"min_replicas": 0, "initial_replicas": 0,
                                                    "max_replicas": upper}
    return staged


def deferred_deployments(config: dict, catalog: Catalog) -> set[str]:
    """The model deployments of `config` that serve no model of FIRST_MODEL_TYPES."""
    first = {m.deployment for m in catalog.models if m.type in FIRST_MODEL_TYPES}
    return {name for app in config["applications"]
            for name in (app.get("args") or {}).get("model_deployments") or []
            if name not in first}


def always_running(config: dict, names: Collection[str]) -> set[str]:
    """Those of `names` that `config` keeps at least one replica of (the others scale to zero
    and start on their first request)."""
    return {deployment["name"] for app in config["applications"]
            for deployment in app.get("deployments", []) if deployment["name"] in names
            and (deployment.get("autoscaling_config") or {}).get(
                "min_replicas", deployment.get("num_replicas", 1)) != 0}


def compiled_deployments(config: dict, catalog: Catalog, data_dir: Path, model: str) -> set[str]:
    """The deployments of `config` serving the chat model whose weights folder is named
    `model` (a compile fill's record names its model so)."""
    names = {deployment["name"] for app in config["applications"]
             for deployment in app.get("deployments", [])}
    return {m.deployment for m in catalog.models if m.type in FIRST_MODEL_TYPES
            and m.deployment in names
            and Path(m.weights_spec(data_dir) or "").name == model}


def compiled_config(config: dict, deployments: Collection[str], key: str) -> dict:
    """`config` with the replicas of `deployments` replaced by ones that start compiled (their
    cache, `key`, now filled): new actor options make Serve replace them, and a surge of one
    replica each lets the old one answer until its replacement is ready."""
    rolled = copy.deepcopy(config)
    for app in rolled["applications"]:
        for deployment in app.get("deployments", []):
            if deployment["name"] in deployments:
                if "ray_actor_options" not in deployment:  # the code's own, else replaced
                    from deployments.registry import deployment_options

                    deployment["ray_actor_options"] = copy.deepcopy(
                        deployment_options(deployment["name"]).get("ray_actor_options", {}))
                runtime_env = deployment["ray_actor_options"].setdefault("runtime_env", {})
                runtime_env.setdefault("env_vars", {})[COMPILED_ENV] = key
                deployment["max_surge_percent"] = 100
    return rolled


def ray_environment(settings: Settings) -> dict[str, str]:
    """Environment of every Ray process of the local instance."""
    env = dict(os.environ)
    env.update({name: env.get(name, value) for name, value in IDLE_SETTINGS.items()})
    env.update({
        "RAY_SERVE_THROUGHPUT_OPTIMIZED": "1",
        "RAY_SERVE_DIRECT_INGRESS_MIN_HTTP_PORT": str(settings.port),
        # The port range is half-open: [PORT, PORT + 1) is exactly PORT.
        "RAY_SERVE_DIRECT_INGRESS_MAX_HTTP_PORT": str(settings.port + 1),
        # The quarantine protects HAProxy's stale slots; without HAProxy it would only keep a
        # restarted Gateway replica off PORT for minutes.
        "RAY_SERVE_PORT_QUARANTINE_S": env.get("RAY_SERVE_PORT_QUARANTINE_S", "0"),
        "RAY_SERVE_DEFAULT_HTTP_HOST": settings.host,
        # A token file left by an earlier `ray.init()` would otherwise turn token auth on.
        "RAY_AUTH_MODE": env.get("RAY_AUTH_MODE", "disabled"),
        "RAY_USAGE_STATS_ENABLED": "0",
        # Serve's own request-id middleware echoes a client's X-Request-ID whatever it is;
        # this hook, outside it, drops one the Gateway would not use (serve_app/request_id.py).
        "RAY_SERVE_HTTP_PROXY_CALLBACK_IMPORT_PATH": env.get(
            "RAY_SERVE_HTTP_PROXY_CALLBACK_IMPORT_PATH", SERVE_CALLBACK),
        "RAY_SERVE_LOG_TO_STDERR": env.get("RAY_SERVE_LOG_TO_STDERR", "0"),
        # Throughput-optimised mode holds replica log records until 1000 have gathered: an
        # error would not reach the log file for hours. Serve's own access log is off; the
        # Gateway's access line (serve_app/access_log.py) is one record per request, written at
        # once for about 20 us in process.
        "RAY_SERVE_REQUEST_PATH_LOG_BUFFER_SIZE": env.get(
            "RAY_SERVE_REQUEST_PATH_LOG_BUFFER_SIZE", "1"),
        "ENGINE_NICENESS": env.get("ENGINE_NICENESS", ENGINE_NICENESS),
        "RAY_worker_niceness": env.get("RAY_worker_niceness", RAY_WORKER_NICENESS),
        "DATA_DIR": str(settings.data_dir),
        "PYTHONPATH": os.pathsep.join(filter(None, [str(PROJECT_ROOT),
                                                    env.get("PYTHONPATH")])),
    })
    return env


def _require_free_port(host: str, port: int) -> None:
    """Serve gives up on a port it cannot bind; say so plainly before starting anything."""
    with socket.socket() as probe:
        try:
            probe.bind((host, port))
        except OSError as exc:
            raise SystemExit(f"{host}:{port} is in use ({exc.strerror}); stop what holds it "
                             "or set PORT") from exc


def _bin(name: str) -> str:
    candidate = Path(sys.executable).parent / name
    return str(candidate) if candidate.exists() else name


def _prune_ray_sessions(temp_dir: Path, keep: int = 2) -> None:
    """Ray never deletes old session folders (logs grow without bound): keep the newest few."""
    sessions = sorted(temp_dir.glob("session_2*"), key=lambda p: p.stat().st_mtime)
    for old in sessions[:-keep]:
        shutil.rmtree(old, ignore_errors=True)


def _wait_ready(url: str, serve_proc: subprocess.Popen) -> None:
    deadline = time.monotonic() + READY_TIMEOUT_S
    while time.monotonic() < deadline:
        if serve_proc.poll() is not None:
            raise RuntimeError(f"serve run exited with code {serve_proc.returncode}")
        with contextlib.suppress(httpx.HTTPError):
            if httpx.get(url, timeout=2).status_code == 200:
                return
        time.sleep(0.5)
    raise TimeoutError(f"{url} did not answer within {READY_TIMEOUT_S:.0f}s")


def _wait_running(serve_proc: subprocess.Popen, what: str,
                  with_replicas: Collection[str] = ()) -> None:
    """Wait until every deployment of the application runs (its models are loaded) and each
    of `with_replicas` has a running replica."""
    from ray import serve

    deadline = time.monotonic() + READY_TIMEOUT_S
    while time.monotonic() < deadline:
        if serve_proc.poll() is not None:
            raise RuntimeError(f"serve run exited with code {serve_proc.returncode}")
        app = serve.status().applications.get("inference")
        if app is not None and app.status == "RUNNING" and all(
                app.deployments[name].replica_states.get("RUNNING", 0) > 0
                for name in with_replicas if name in app.deployments):
            return
        if app is not None and app.status == "DEPLOY_FAILED":
            raise RuntimeError(f"the application failed to deploy: {app.message}")
        time.sleep(0.5)
    raise TimeoutError(f"{what} not loaded within {READY_TIMEOUT_S:.0f}s")


def _load_in_stages(ray_port: int, serve_proc: subprocess.Popen, config: dict,
                    deferred: set[str], started: float) -> None:
    """Wait for the first stage, then deploy the whole config (the deployments already running
    are left as they are: only the deferred ones change) and wait for it."""
    import ray
    from ray.serve.context import _get_global_client
    from ray.serve.schema import ServeDeploySchema

    ray.init(address=f"127.0.0.1:{ray_port}", logging_level="ERROR", log_to_driver=False)
    try:
        if deferred:
            _wait_running(serve_proc, "the chat models")
            print(f"\n  Chat answering after {time.monotonic() - started:.1f}s; loading the "
                  "other models...", flush=True)
            _get_global_client().deploy_apps(ServeDeploySchema.model_validate(config))
        # The application still reads RUNNING for a moment after the new config lands: the
        # deferred deployments' own replicas say when the second stage is done.
        _wait_running(serve_proc, "the models", always_running(config, deferred))
    finally:
        ray.shutdown()  # disconnects this driver; the cluster keeps running


def _follow_compile_fills(env: dict[str, str], since: float) -> queue.Queue[dict]:
    """Print, from a daemon thread, each background compile a chat replica starts on a cold
    compile cache (deployments/engines/vllm_compile_fill.py), and when it ends; the records
    of those that finished are put in the queue returned."""
    from deployments.engines.vllm_compile import cache_root
    from deployments.engines.vllm_compile_fill import records

    finished: queue.Queue[dict] = queue.Queue()
    root = cache_root(env)
    if root is None:
        return finished

    def follow() -> None:
        told: dict[str, str] = {}
        while True:
            for record, line in fill_news(records(root), told, since):
                print(line, flush=True)
                if record.get("state") == "done":
                    finished.put(record)
            time.sleep(1)

    threading.Thread(target=follow, name="compile-fills", daemon=True).start()
    return finished


def roll_onto_compiled(ray_port: int, config: dict, deployments: set[str], record: dict
                        ) -> dict:
    """Deploy `config` with `deployments` replaced by compiled replicas, and wait until they
    answer (serve_app/compiled_probe.py); returns the config now deployed."""
    import ray
    from ray.serve.context import _get_global_client
    from ray.serve.schema import ServeDeploySchema

    model, started = record.get("model", "?"), time.monotonic()
    rolled = compiled_config(config, deployments, record["key"])
    address = f"127.0.0.1:{ray_port}"
    joined = not ray.is_initialized()  # a driver already connected (a test) stays so
    if joined:
        ray.init(address=address, logging_level="ERROR", log_to_driver=False)
    try:
        _get_global_client().deploy_apps(ServeDeploySchema.model_validate(rolled))
    finally:
        if joined:
            ray.shutdown()
    print(f"\n  {model}: a compiled replica is starting beside the eager one, which answers "
          "meanwhile...", flush=True)
    (app,) = {app["name"] for app in rolled["applications"]
              for deployment in app.get("deployments", []) if deployment["name"] in deployments}
    subprocess.run([sys.executable, "-m", "serve_app.compiled_probe", address, app,
                    str(READY_TIMEOUT_S), *sorted(deployments)], check=True, cwd=PROJECT_ROOT)
    print(f"\n  {model} now runs compiled, without a restart (the compiled replica took over "
          f"after {time.monotonic() - started:.0f}s; the eager one stops once its requests "
          "are answered)", flush=True)
    return rolled


def fill_news(records: list[dict], told: dict[str, str], since: float
              ) -> list[tuple[dict, str]]:
    """Each fill started since `since` whose state is new, with a line that tells it
    (`told`: each fill's state already told, updated)."""
    news = []
    for record in records:
        key, state = record.get("key", ""), record.get("state", "")
        if record.get("started", 0) >= since and told.get(key) != state:
            told[key] = state
            news.append((record, _fill_line(record)))
    return news


def _fill_line(record: dict) -> str:
    model, state = record.get("model", "?"), record.get("state")
    if state == "compiling":
        return (f"\n  {model}: compile cache cold, so chat runs uncompiled (eager) for now; "
                "compiling it in the background at idle priority, then chat moves onto it "
                f"without a restart ({record.get('log')})")
    if state == "done":
        return (f"\n  {model} compiled in the background in {record.get('seconds', 0):.0f}s: "
                "moving chat onto it (and the next start runs it compiled)")
    return (f"\n  {model}'s background compile failed ({record.get('error')}); the next start "
            f"tries again ({record.get('log')})")


def _stop(serve_proc: subprocess.Popen | None, env: dict[str, str], temp_dir: Path) -> None:
    tree = ray_processes(str(temp_dir))
    # `serve run` in the background ignores SIGINT: end it by PID before stopping Ray, or it
    # keeps retrying a cluster that is gone.
    if serve_proc is not None and serve_proc.poll() is None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(serve_proc.pid, signal.SIGTERM)
        try:
            serve_proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(serve_proc.pid, signal.SIGKILL)
            serve_proc.wait()
    subprocess.run([_bin("ray"), "stop", "--force"], env=env, check=False,
                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    reap(tree)


def serve_config(argv: list[str]) -> Path:
    """The Serve config named on the command line (a relative path is taken from the working
    directory, then from the checkout), else configs/local.yaml."""
    if len(argv) > 1:
        raise SystemExit("usage: python -m serve_app.launch [SERVE_CONFIG.yaml]")
    if not argv:
        return CONFIG
    given = Path(argv[0])
    for candidate in (given, PROJECT_ROOT / given):
        if candidate.is_file():
            return candidate
    raise SystemExit(f"the Serve config {given} does not exist")


def main(argv: list[str] | None = None) -> int:
    started = time.monotonic()
    config_path = serve_config(sys.argv[1:] if argv is None else argv)
    settings, launch = Settings(), LaunchSettings()
    if settings.port in (SERVE_PROXY_PORT, ray_port := launch.ray_port):
        raise SystemExit(f"PORT={settings.port} is taken by Serve's proxy ({SERVE_PROXY_PORT}) "
                         f"or Ray ({ray_port}): choose another")
    _require_free_port(settings.host, settings.port)
    temp_dir = launch.ray_tmpdir
    temp_dir.mkdir(parents=True, exist_ok=True)
    _prune_ray_sessions(temp_dir)
    env = ray_environment(settings)
    num_cpus = str(launch.ray_num_cpus or os.cpu_count() or 2)
    metrics_port = launch.metrics_port

    serve_proc: subprocess.Popen | None = None
    stopping = False

    def on_signal(signum, _frame):
        nonlocal stopping
        if not stopping:
            stopping = True
            raise KeyboardInterrupt

    # Install both explicitly: a shell that starts us in the background leaves SIGINT ignored.
    signal.signal(signal.SIGINT, on_signal)
    signal.signal(signal.SIGTERM, on_signal)
    try:
        # Ray starts while the database and the weights are made ready (seconds saved).
        ray_start = subprocess.Popen(
            [_bin("ray"), "start", "--head", f"--port={ray_port}", "--node-ip-address=127.0.0.1",
             f"--num-cpus={num_cpus}", "--include-dashboard=false", "--disable-usage-stats",
             f"--temp-dir={temp_dir}", f"--metrics-export-port={metrics_port}"],
            env=env, stdout=subprocess.DEVNULL,
        )
        # Imported once Ray is starting: the database layer takes most of a second to import.
        from deployments.weights.registry import weights_to_build
        from serve_app.accounts.provisioning import bootstrap
        from serve_app.models.catalog import load_catalog

        result = bootstrap(settings)
        # Prepare the weights the catalog asks for here (copies of the folders `make install`
        # built ahead, or built now), with progress on the console, rather than silently
        # inside a replica.
        catalog = load_catalog(settings.model_catalog)
        if weights_to_build(catalog.models, settings.data_dir):
            subprocess.run([sys.executable, "-m", "deployments.weights", "prepare",
                            "--catalog", str(settings.model_catalog),
                            "--data-dir", str(settings.data_dir)], check=True, cwd=PROJECT_ROOT,
                           env={**os.environ, "DATA_DIR": str(settings.data_dir)})
        if result.generated_admin_key:
            print("\n  First admin API key (shown once, store it now):\n"
                  f"    {result.generated_admin_key}\n", flush=True)
        config = yaml.safe_load(config_path.read_text())
        deferred = deferred_deployments(config, catalog)
        first_config = temp_dir / "first-stage.yaml"
        first_config.write_text(yaml.safe_dump(first_stage(config, deferred)))
        if ray_start.wait() != 0:
            raise SystemExit(f"ray start failed with code {ray_start.returncode}")
        serve_proc = subprocess.Popen(
            [_bin("serve"), "run", "--address", f"127.0.0.1:{ray_port}", str(first_config)],
            env=env, cwd=PROJECT_ROOT, start_new_session=True,
        )
        compiled = _follow_compile_fills(env, time.time())
        base_url = f"http://{settings.host}:{settings.port}/api/v1"
        _wait_ready(f"{base_url}/models", serve_proc)
        print(f"\n  API answering after {time.monotonic() - started:.1f}s; loading models...",
              flush=True)
        _load_in_stages(ray_port, serve_proc, config, deferred, started)
        on_first_use = sorted(deferred - always_running(config, deferred))
        print(f"\n  Platform ready in {time.monotonic() - started:.1f}s\n"
              f"  Base URL: {base_url}\n  Docs:     {base_url}/docs\n"
              f"  Metrics:  http://127.0.0.1:{metrics_port}/metrics (Prometheus)\n"
              + (f"  Started on first use (idle ones stop again): {', '.join(on_first_use)};\n"
                 "  a first request to one waits while its replica starts, seconds.\n"
                 if on_first_use else "")
              + "  Ctrl-C stops everything.\n", flush=True)
        while serve_proc.poll() is None:
            with contextlib.suppress(queue.Empty):
                record = compiled.get(timeout=1)
                names = compiled_deployments(config, catalog, settings.data_dir,
                                             record.get("model", ""))
                if names:
                    try:
                        config = roll_onto_compiled(ray_port, config, names, record)
                    except Exception as exc:  # the eager replica keeps answering
                        print(f"\n  {record.get('model')}: the move onto the compiled engine "
                              f"failed ({exc}); the next start runs it compiled", flush=True)
        return serve_proc.returncode or 0
    except KeyboardInterrupt:
        print("\nStopping...", flush=True)
        return 0
    finally:
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        _stop(serve_proc, env, temp_dir)


if __name__ == "__main__":
    sys.exit(main())
