"""`make image-check`: build the image, start it, ask it for its models and one chat, stop it.

The container runs under `buildah run --isolation chroot` (no container engine needed) inside a
network and PID namespace of its own (`unshare`): its ports never meet the host's, and the
`ray stop` of its shutdown sees only its own processes. Prints the image's size, the build's
time and the times from start to the API and to the first chat. Python's standard library only:
it runs with the host's python3.
"""

from __future__ import annotations

import argparse
import json
import os
import secrets
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

PORT = 8000
CHAT_MODEL = "smollm2-135m-instruct"
START_TIMEOUT_S = 1200.0
LOG = Path(".cache/image/check.log")


def _request(method: str, path: str, key: str | None = None,
             body: dict | None = None) -> tuple[int, dict]:
    request = urllib.request.Request(
        f"http://127.0.0.1:{PORT}{path}", method=method,
        data=json.dumps(body).encode() if body is not None else None,
        headers={"content-type": "application/json",
                 **({"authorization": f"Bearer {key}"} if key else {})})
    try:
        with urllib.request.urlopen(request, timeout=600) as response:
            return response.status, json.loads(response.read() or b"{}")
    except urllib.error.HTTPError as exc:
        return exc.code, {"error": exc.read().decode(errors="replace")[:500]}


def _until_ok(what: str, call, container: subprocess.Popen, deadline: float) -> tuple[int, dict]:
    """Call `call` until it answers 200 (a connection refused or a 503 while the platform
    starts is retried); fail if the container exits or the deadline passes."""
    last: object = None
    while time.monotonic() < deadline:
        if container.poll() is not None:
            raise SystemExit(f"the container exited with code {container.returncode} before "
                             f"{what} answered (log: {LOG})")
        try:
            status, body = call()
            if status == 200:
                return status, body
            last = (status, body)
        except OSError as exc:
            last = exc
        time.sleep(1)
    raise SystemExit(f"{what} did not answer within {START_TIMEOUT_S:.0f}s: {last}")


def _launch_pids() -> list[int]:
    """The platform's launcher in this PID namespace (the container's main process)."""
    pids = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                cmdline = (entry / "cmdline").read_bytes().split(b"\0")
            except OSError:
                continue
            if b"serve_app.launch" in cmdline:
                pids.append(int(entry.name))
    return pids


def serve_and_ask(image: str) -> dict:
    """Inside the namespaces: start the image, time the API and a chat, stop it."""
    subprocess.run(["ip", "link", "set", "lo", "up"], check=True)
    key = "sk-image-check-" + secrets.token_hex(16)
    container = subprocess.run(["buildah", "from", "--pull-never", image], check=True,
                               capture_output=True, text=True).stdout.strip()
    try:
        subprocess.run(["buildah", "config", "--env", f"ADMIN_API_KEY={key}",
                        "--env", f"PORT={PORT}", container], check=True)
        LOG.parent.mkdir(parents=True, exist_ok=True)
        with LOG.open("w") as log:
            started = time.monotonic()
            running = subprocess.Popen(
                ["buildah", "run", "--isolation", "chroot", "--user", "platform", container,
                 "--", "/app/deploy/image/entrypoint.sh"], stdout=log, stderr=subprocess.STDOUT)
            try:
                deadline = started + START_TIMEOUT_S
                _, models = _until_ok("/api/v1/models",
                                      lambda: _request("GET", "/api/v1/models"),
                                      running, deadline)
                api_s = time.monotonic() - started
                ids = [m.get("id") for m in models.get("data", [])]
                if CHAT_MODEL not in ids:
                    raise SystemExit(f"/api/v1/models does not list {CHAT_MODEL}: {ids}")
                _, reply = _until_ok("a chat", lambda: _request(
                    "POST", "/api/v1/chat/completions", key,
                    {"model": CHAT_MODEL, "max_tokens": 16,
                     "messages": [{"role": "user", "content": "What is the capital of France?"}]}),
                    running, deadline)
                chat_s = time.monotonic() - started
                health = _request("GET", "/health")[0]
            finally:
                for pid in _launch_pids():
                    os.kill(pid, signal.SIGTERM)  # the launcher stops Ray and its engines
                try:
                    running.wait(timeout=120)
                except subprocess.TimeoutExpired:
                    running.kill()
                    running.wait()
        return {"api_s": round(api_s, 1), "chat_s": round(chat_s, 1), "models": len(ids),
                "reply": reply["choices"][0]["message"]["content"], "health_status": health}
    finally:
        subprocess.run(["buildah", "rm", container], check=False, capture_output=True)


def image_size_bytes(image: str) -> int:
    out = subprocess.run(["podman", "image", "inspect", "--format", "{{.Size}}", image],
                         check=True, capture_output=True, text=True).stdout
    return int(out.strip())


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--image", required=True)
    parser.add_argument("--build", help="the shell command that builds the image")
    parser.add_argument("--inside", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.inside:
        print(json.dumps(serve_and_ask(args.image)))
        return 0

    figures: dict[str, object] = {"image": args.image}
    if args.build:
        started = time.monotonic()
        subprocess.run(args.build, shell=True, check=True)
        figures["build_s"] = round(time.monotonic() - started, 1)
    figures["size_gb"] = round(image_size_bytes(args.image) / 1e9, 2)
    print(f"starting {args.image} (log: {LOG})", flush=True)
    inside = subprocess.run(
        ["unshare", "--net", "--pid", "--fork", "--mount-proc",
         sys.executable, __file__, "--inside", "--image", args.image],
        stdout=subprocess.PIPE, text=True)
    if inside.returncode != 0:
        print(f"image check failed; the container's log ends:\n"
              f"{LOG.read_text()[-3000:] if LOG.exists() else ''}", file=sys.stderr)
        return 1
    figures.update(json.loads(inside.stdout.strip().splitlines()[-1]))
    print("image check passed: " + json.dumps(figures))
    if figures["health_status"] != 200:
        print(f"warning: /health answered {figures['health_status']}, so the image's "
              "HEALTHCHECK would fail", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
