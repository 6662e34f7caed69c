"""One command for a load run against a running platform (`make run` in another shell):

    make loadtest                                  # 200 users for 10 minutes
    .venv/bin/python loadtest/run.py --steps 25,50,100,200 --step-seconds 120
    .venv/bin/python loadtest/run.py --mix tenants --steps 100   # one heavy account, many light

Prepares an account on the `benchmark` rate-limit tier (so the run measures the platform, not
the default 500 requests a minute) with ten inference keys, one of them with a small USD
consumption limit, and a few accounts of their own for the background responses and resumed
streams; runs Locust headless for each step of users (CSV and HTML reports under
`loadtest/results/<time>/`); waits for background responses and queued jobs to finish;
reconciles each account's ledger (reconcile.py); prints a summary per step (throughput,
p50/p95/p99 per route, errors by status) and writes it to `summary.json` and `summary.md`
beside the reports.

It reads DATA_DIR / DATABASE_URL like the platform, to reach the same database.
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import subprocess
import sys
import time
from collections import Counter, defaultdict
from datetime import UTC, datetime
from pathlib import Path

import httpx
from eth_account import Account

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))

from loadtest.reconcile import audit_books, reconcile  # noqa: E402
from serve_app.cli import run as cli  # noqa: E402

KEYS = 10
LIMITED_KEY_USD = 0.02
WALLETS = 4
WALLET_USD = 5
# Accounts of the resumable mix (locustfile.ResumableUser): the responses one account keeps
# and the streams it follows at once are bounded per account (RESPONSES_PER_ACCOUNT,
# RESPONSES_FOLLOWERS_PER_ACCOUNT), so its users share a few.
RESUME_ACCOUNTS = 4
RUNNING = {"queued", "in_progress"}


def prepare_payer(host: str, description: str) -> dict:
    """An account of its own with one inference key (the heavy tenant of the two-tenant
    mix, an account of the resumable mix)."""
    made = cli(["create-account", "--usd", "10000"])
    cli(["set-tier", "benchmark", "--account", made["accountId"]])
    resp = httpx.post(f"{host}/api/v1/api_keys", timeout=30,
                      headers={"Authorization": f"Bearer {made['apiKey']}"},
                      json={"apiKeyType": "INFERENCE", "description": description})
    resp.raise_for_status()
    return {"account": made["accountId"], "key": resp.json()["data"]["apiKey"],
            "start_nanos": 10000 * 10**9}


def wait_for_background(host: str, record: Path, prepared: dict, limit_s: float) -> int:
    """Wait until every background response and resumable chat stream of the run has ended
    (each settles when its generation ends, whether a client reads it or not); how many
    were still running after `limit_s`."""
    keys = {payer["label"]: payer["key"] for payer in prepared.get("resume", [])}
    running: dict[str, tuple[str, str]] = {}
    with open(record, encoding="utf-8") as lines:
        for answer in map(json.loads, lines):
            if answer.get("response_id") and answer.get("payer") in keys:
                route = "chat/completions" if answer.get("kind") == "chat" else "responses"
                running[answer["response_id"]] = (route, keys[answer["payer"]])
    deadline = time.monotonic() + limit_s
    while running and time.monotonic() < deadline:
        for response_id, (route, key) in list(running.items()):
            resp = httpx.get(f"{host}/api/v1/{route}/{response_id}", timeout=60,
                             headers={"Authorization": f"Bearer {key}"})
            if resp.status_code == 404 or (resp.status_code == 200
                                           and resp.json()["status"] not in RUNNING):
                del running[response_id]  # ended (or deleted by its client)
        if running:
            time.sleep(5)
    return len(running)


def prepare(host: str, out: Path, mix: str = "all") -> dict:
    made = cli(["create-account", "--usd", "10000"])
    cli(["set-tier", "benchmark", "--account", made["accountId"]])
    admin = {"Authorization": f"Bearer {made['apiKey']}"}
    keys = []
    for i in range(KEYS):
        body = {"apiKeyType": "INFERENCE", "description": f"load {i}"}
        if i == 0:
            body["consumptionLimit"] = {"usd": LIMITED_KEY_USD}
        resp = httpx.post(f"{host}/api/v1/api_keys", headers=admin, json=body, timeout=30)
        resp.raise_for_status()
        keys.append(resp.json()["data"]["apiKey"])
    balance = httpx.get(f"{host}/api/v1/billing/balance", headers=admin, timeout=30).json()
    start = round((float(balance["balances"]["usd"]) + float(balance["balances"]["diem"] or 0))
                  * 1e9)
    wallets = []
    for _ in range(WALLETS):  # wallets with credit of their own (their accounts made here)
        wallet = Account.create()
        wallet_account = cli(["stake", "--wallet", wallet.address, "--tokens", "0"])["id"]
        cli(["credit", "--usd", str(WALLET_USD), "--account", wallet_account,
             "--reason", "load test wallet", "--actor", "loadtest"])
        cli(["set-tier", "benchmark", "--account", wallet_account])
        wallets.append({"key": wallet.key.hex(), "address": wallet.address,
                        "account": wallet_account, "start_nanos": WALLET_USD * 10**9})
    prepared = {"account": made["accountId"], "admin": made["apiKey"], "inference": keys,
                "start_nanos": start, "wallets": [w["key"] for w in wallets],
                "wallet_accounts": wallets}
    if mix == "tenants":
        heavy = prepare_payer(host, "heavy tenant")
        prepared.update(heavy=heavy["key"], heavy_account=heavy)
    else:
        prepared["resume"] = [{**prepare_payer(host, f"resume {i}"), "label": f"resume-{i}"}
                              for i in range(RESUME_ACCOUNTS)]
    (out / "keys.json").write_text(json.dumps(prepared))
    return prepared


LOCUSTFILES = {"all": "locustfile.py", "tenants": "tenants.py"}


def run_step(host: str, users: int, seconds: int, out: Path, env: dict,
             mix: str = "all") -> Path:
    prefix = out / f"u{users}"
    subprocess.run([sys.executable, "-m", "locust", "-f", str(HERE / LOCUSTFILES[mix]),
                    "--headless", "--host", host, "-u", str(users),
                    "-r", str(max(1, users // 10)), "-t", f"{seconds}s", "--stop-timeout", "30",
                    "--csv", str(prefix), "--html", f"{prefix}.html", "--only-summary",
                    "--loglevel", "WARNING"], env=env, check=False)
    return prefix


def step_summary(prefix: Path, record: Path, since: float) -> dict:
    with open(f"{prefix}_stats.csv", encoding="utf-8") as stats:
        rows = list(csv.DictReader(stats))
    routes = {r["Name"]: {"requests": int(r["Request Count"]),
                          "failures": int(r["Failure Count"]),
                          "rps": round(float(r["Requests/s"]), 2),
                          "p50_ms": r["50%"], "p95_ms": r["95%"], "p99_ms": r["99%"]}
              for r in rows if r["Type"] != "METRIC" and r["Name"] != "Aggregated"}
    metrics = {r["Name"]: {"p50": r["50%"], "p95": r["95%"]} for r in rows
               if r["Type"] == "METRIC"}
    total = next(r for r in rows if r["Name"] == "Aggregated")
    statuses: dict[str, Counter] = defaultdict(Counter)
    refusals: dict[str, list[dict]] = defaultdict(list)
    with open(record, encoding="utf-8") as lines:
        for line in lines:
            answer = json.loads(line)
            if answer.get("t", since) >= since:
                statuses[answer["route"]][answer["status"]] += 1
                if answer["status"] >= 400:
                    refusals[answer["route"]].append(answer)
    return {"rps": round(float(total["Requests/s"]), 2),
            "requests": int(total["Request Count"]), "failures": int(total["Failure Count"]),
            "routes": routes, "metrics": metrics,
            "statuses": {route: dict(c) for route, c in statuses.items()},
            "refusals": {route: refusal_summary(answers)
                         for route, answers in refusals.items()}}


def refusal_summary(answers: list[dict]) -> dict[str, dict]:
    """Per status and error code: how many, and the Retry-After they were given (least,
    median, most, in seconds) where they were given one."""
    groups: dict[str, list[dict]] = defaultdict(list)
    for answer in answers:
        groups[f"{answer['status']} {answer.get('code') or '-'}"].append(answer)
    summary = {}
    for name, group in sorted(groups.items()):
        waits = sorted(float(a["retry_after"]) for a in group if "retry_after" in a)
        summary[name] = {"count": len(group)}
        if waits:
            summary[name]["retry_after_s"] = [waits[0], waits[len(waits) // 2], waits[-1]]
    return summary


def markdown(summary: dict) -> str:
    out = []
    for step in summary["steps"]:
        out.append(f"### {step['users']} users, {step['seconds']} s: {step['rps']} requests/s, "
                   f"{step['failures']} of {step['requests']} failed\n")
        out.append("| route | requests | req/s | p50 ms | p95 ms | p99 ms | failures |")
        out.append("|---|---|---|---|---|---|---|")
        for name, r in sorted(step["routes"].items()):
            out.append(f"| {name} | {r['requests']} | {r['rps']} | {r['p50_ms']} | "
                       f"{r['p95_ms']} | {r['p99_ms']} | {r['failures']} |")
        for name, m in sorted(step["metrics"].items()):
            out.append(f"| {name} (metric) | | | {m['p50']} | {m['p95']} | | |")
        for route, codes in sorted(step.get("refusals", {}).items()):
            for code, r in codes.items():
                waits = r.get("retry_after_s")
                said = (f", Retry-After {waits[0]:g}/{waits[1]:g}/{waits[2]:g} s "
                        "(least/median/most)") if waits else ""
                out.append(f"\nRefused on {route}: {r['count']} x {code}{said}")
        out.append("")
    out.append("Answers by status, per route (the whole run): " + json.dumps(
        summary["reconciliation"]["statuses"]))
    out.append("")
    out.append("Reconciliation: " + json.dumps(summary["reconciliation"]))
    for address, result in summary.get("wallet_reconciliation", {}).items():
        out.append("")
        label = f"Wallet {address}" if address.startswith("0x") else address.capitalize()
        out.append(f"{label}: " + json.dumps(result))
    if "audit" in summary:
        out += ["", "Audit (every account's balance is its journal's sum less its holds): "
                + json.dumps(summary["audit"])]
    return "\n".join(out)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--host", default=os.environ.get("LOADTEST_HOST",
                                                         "http://127.0.0.1:8000"))
    parser.add_argument("--steps", default="200", help="users per step, comma-separated")
    parser.add_argument("--step-seconds", type=int, default=600)
    parser.add_argument("--mix", choices=sorted(LOCUSTFILES), default="all",
                        help="all: every endpoint family; tenants: one heavy account's long "
                             "streams beside many light users' short chats (loadtest/tenants.py)")
    args = parser.parse_args()
    out = HERE / "results" / datetime.now(UTC).strftime("%Y%m%d-%H%M%S")
    out.mkdir(parents=True)
    prepared = prepare(args.host, out, args.mix)
    record = out / "record.jsonl"
    env = {**os.environ, "LOADTEST_KEYS": str(out / "keys.json"),
           "LOADTEST_RECORD": str(record)}
    summary: dict = {"host": args.host, "steps": []}
    for users in (int(u) for u in args.steps.split(",")):
        print(f"[loadtest] {users} users for {args.step_seconds} s ...", flush=True)
        started = time.time()
        prefix = run_step(args.host, users, args.step_seconds, out, env, args.mix)
        step = step_summary(prefix, record, started)
        step.update(users=users, seconds=args.step_seconds)
        summary["steps"].append(step)
        print(f"[loadtest] {users} users: {step['rps']} requests/s, "
              f"{step['failures']} failures of {step['requests']}", flush=True)
    print("[loadtest] waiting for background responses to end ...", flush=True)
    summary["background_still_running"] = wait_for_background(args.host, record, prepared,
                                                               limit_s=900)
    print("[loadtest] waiting 60 s for queued jobs and in-flight holds ...", flush=True)
    time.sleep(60)
    summary["reconciliation"] = reconcile(prepared["account"], str(record),
                                          prepared["start_nanos"])
    summary["wallet_reconciliation"] = {
        w["address"]: reconcile(w["account"], str(record), w["start_nanos"], w["address"])
        for w in prepared["wallet_accounts"]}
    if "heavy_account" in prepared:
        heavy = prepared["heavy_account"]
        summary["wallet_reconciliation"]["heavy tenant"] = reconcile(
            heavy["account"], str(record), heavy["start_nanos"], payer="heavy")
    for payer in prepared.get("resume", []):
        summary["wallet_reconciliation"][payer["label"]] = reconcile(
            payer["account"], str(record), payer["start_nanos"], payer=payer["label"])
    summary["audit"] = audit_books()
    (out / "summary.json").write_text(json.dumps(summary, indent=2))
    (out / "summary.md").write_text(markdown(summary))
    print(markdown(summary))
    print(f"[loadtest] reports in {out}")
    reconciled = summary["reconciliation"]["reconciled"] and all(
        r["reconciled"] for r in summary["wallet_reconciliation"].values()) \
        and summary["audit"]["ok"]
    return 0 if reconciled else 1


if __name__ == "__main__":
    sys.exit(main())
