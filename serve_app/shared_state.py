"""What the replicas of several nodes must share, and the rule that refuses a multi-node start
without it.

Every Gateway replica reads and writes the accounts, keys and ledger, and the inputs and
results of queued jobs; on several nodes a replica may run on any of them. So the database must
be a server (PostgreSQL), not the SQLite file each node would keep under its own DATA_DIR, and
the result store a bucket or a directory every node mounts, not DATA_DIR/results. `build_app`
refuses such a start (`refuse_per_node_state`); `inference-admin check-config` reports the same
rule beside what it only warns about (serve_app/config_check.py).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from serve_app.settings import Settings

Level = Literal["OK", "WARNING", "ERROR"]


@dataclass(frozen=True)
class Finding:
    """One line of a check: its level, what it is about, and what to do."""

    level: Level
    subject: str
    text: str

    def line(self) -> str:
        return f"{self.level:<7} {self.subject}: {self.text}"


class PerNodeState(RuntimeError):
    """A multi-node start on state that each node would keep for itself."""


def multi_node_findings(settings: Settings) -> list[Finding]:
    """The settings a multi-node platform needs: errors where state would be per node
    (`refuse_per_node_state` refuses those), warnings for what works but is unwise."""
    findings = []
    database = settings.resolved_database_url
    if database.startswith("sqlite"):
        where = "DATA_DIR/platform.db" if not settings.database_url else database
        findings.append(Finding("ERROR", "DATABASE_URL", (
            f"a SQLite file ({where}) that each node would keep for itself: set "
            "DATABASE_URL=postgresql://USER:PASSWORD@HOST:5432/DATABASE")))
    else:
        findings.append(Finding("OK", "DATABASE_URL", f"{database.split(':', 1)[0]} server"))
    store = settings.result_store_url
    if not store:
        findings.append(Finding("ERROR", "RESULT_STORE_URL", (
            "unset: queued jobs keep their files in DATA_DIR/results on the node that made "
            "them; set RESULT_STORE_URL=s3://BUCKET/PREFIX?endpoint=http://HOST:9000 (or the "
            "path of a volume every node mounts)")))
    elif store.startswith("s3://"):
        findings.append(Finding("OK", "RESULT_STORE_URL", "an S3-compatible bucket"))
    else:
        findings.append(Finding("WARNING", "RESULT_STORE_URL", (
            f"a directory ({store}): every node must mount the same volume there")))
    if settings.redis_url:
        findings.append(Finding("OK", "REDIS_URL", "rate limits counted in Redis"))
    else:
        findings.append(Finding("ERROR", "REDIS_URL", (
            "unset: rate limits are counted in one Ray actor, lost with its node; set "
            "REDIS_URL=redis://HOST:6379/0")))
    if settings.admin_api_key:
        findings.append(Finding("OK", "ADMIN_API_KEY", "set (the first ADMIN key of an empty "
                                                       "database)"))
    else:
        findings.append(Finding("WARNING", "ADMIN_API_KEY", (
            "unset: on an empty database the first admin key is printed only where "
            "`serve` runs on a terminal; set it (20+ characters) in the nodes' secrets")))
    return findings


def refuse_per_node_state(settings: Settings, *, nodes: int, declared: bool) -> None:
    """Raise `PerNodeState`, saying what to set, when the platform would run on several
    nodes (`nodes` > 1 in the Ray cluster, or the config `declared` it: an autoscaled
    cluster may start on its head alone) with a per-node SQLite file or result store."""
    if nodes <= 1 and not declared:
        return
    per_node = [f for f in multi_node_findings(settings)
                if f.level == "ERROR" and f.subject in ("DATABASE_URL", "RESULT_STORE_URL")]
    if per_node:
        why = f"{nodes} Ray nodes" if nodes > 1 else "the config's multi_node: true"
        raise PerNodeState(f"refusing to start on several nodes ({why}) with state kept per "
                           "node: " + "; ".join(f"{f.subject}: {f.text}" for f in per_node))


def ray_nodes() -> int:
    """The live nodes of the Ray cluster this process is connected to (1 when it is not)."""
    import ray

    if not ray.is_initialized():
        return 1
    return sum(1 for node in ray.nodes() if node.get("Alive"))
