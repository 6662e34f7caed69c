"""Where the cheap authenticated route's time goes, layer by layer, in the real Gateway replica.

Starts `make bench`'s platform (Ray, the Gateway of `make run` throughput-optimised, a bare
Serve no-op app beside it), measures `GET /api_keys/rate_limits` against the no-op with wrk
(concurrency 8 and 1, as `cheap_route_vs_noop` does), then samples the Gateway replica with
py-spy during a run at concurrency 8 and sorts every sample of the request path into one
layer (the innermost that it is in):

    serve ingress        uvicorn and Serve's direct ingress around the app (the no-op has it too)
    service headers      the outermost middleware: the request id, the headers it stamps
    outcome + metrics    how the request ended: metrics, the error budgets
    starlette/fastapi    the middleware stack, routing, solving the route's dependencies
    auth                 the key looked up, its error budget, its balance headers
    route                the route's own body: balances, tiers, the JSON answer
    limits read          the key's counts read for the rate-limit headers (with the actor call
                         that carries it, which runs as a task of its own)
    sending              the answer handed to the server

    .venv/bin/python benchmarks/cheap_route_profile.py [--seconds 8] [--rounds 3]

py-spy comes from PyPI (`.venv/bin/pip install py-spy`); without it only the rates print.
"""

from __future__ import annotations

import argparse
import collections
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

# (layer, a frame that puts a sample in it); a sample goes to the last layer whose frame it has
LAYERS = (
    ("serve ingress", "RequestResponseCycle.run_asgi"),
    ("serve ingress", "Replica._direct_ingress_asgi"),
    ("service headers", "ServiceHeadersMiddleware.__call__ (serve_app"),
    ("starlette/fastapi", "Site.__call__ (serve_app"),
    ("outcome + metrics", "create_app.<locals>.finished"),
    ("starlette/fastapi", "CallerGate.__call__"),
    ("auth", "current_key (serve_app"),
    ("route", "run_endpoint_function"),
    ("sending", "Response.__call__"),
    ("service headers", "send_with_headers (serve_app"),
    ("limits read", "key_rate_limit_headers"),
    ("limits read", "DecisionBatcher._flush"),  # the read's call to the Ray limiter actor
    ("serve ingress", "send_user_message"),
)


def layer_of(stack: str) -> str | None:
    found = None
    best = -1
    for layer, frame in LAYERS:
        at = stack.rfind(frame)
        if at > best:
            found, best = layer, at
    return found


def profile(pid: str, seconds: int, out: Path) -> dict[str, float]:
    """Share of the replica's request-path samples in each layer."""
    subprocess.run([shutil.which("py-spy") or str(Path(sys.executable).parent / "py-spy"),
                    "record", "-p", pid, "-d", str(seconds), "-r", "200", "-f", "raw",
                    "-o", str(out), "--nonblocking"], check=True, capture_output=True)
    layers: collections.Counter[str] = collections.Counter()
    for line in out.read_text().splitlines():
        stack, _, count = line.rpartition(" ")
        layer = layer_of(stack)
        if layer is not None:
            layers[layer] += int(count)
    total = sum(layers.values()) or 1
    return {layer: n / total for layer, n in layers.most_common()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=int, default=8)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()

    import bench
    from clients import wrk

    data = Path(tempfile.mkdtemp(prefix="cheap-route-"))
    key = bench.benchmark_key(data)
    platform = bench.Platform(data, ["embedding"])
    auth = {"Authorization": f"Bearer {key}"}
    route = f"{platform.base}/api_keys/rate_limits"
    try:
        wrk(route, 8, 2, headers=auth)
        wrk(platform.noop, 8, 2)
        for _ in range(args.rounds):
            ours, noop = wrk(route, 8, args.seconds, headers=auth), wrk(platform.noop, 8,
                                                                        args.seconds)
            ours1, noop1 = wrk(route, 1, args.seconds, headers=auth), wrk(platform.noop, 1,
                                                                          args.seconds)
            print(f"c=8: {ours['rps']:.0f} vs no-op {noop['rps']:.0f} req/s, "
                  f"ratio {ours['rps'] / noop['rps']:.3f}; c=1 p50: {ours1['p50_ms']:.2f} vs "
                  f"{noop1['p50_ms']:.2f} ms, added {ours1['p50_ms'] - noop1['p50_ms']:.2f} ms",
                  flush=True)
        pids = subprocess.run(["pgrep", "-f", "ServeReplica:inference:Gateway"],
                              capture_output=True, text=True).stdout.split()
        spy = shutil.which("py-spy") or Path(sys.executable).parent / "py-spy"
        if not pids or not Path(spy).exists():
            print("no profile: py-spy is not installed (.venv/bin/pip install py-spy)")
            return
        load = threading.Thread(target=wrk, args=(route, 8, args.seconds + 3),
                                kwargs={"headers": auth})
        load.start()
        time.sleep(1)
        shares = profile(pids[0], args.seconds, data / "gateway.raw")
        load.join()
        print("the Gateway replica's samples at concurrency 8, by layer:")
        for layer, share in shares.items():
            print(f"  {share * 100:5.1f}%  {layer}")
    finally:
        platform.stop()


if __name__ == "__main__":
    main()
