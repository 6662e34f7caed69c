"""The JSON-RPC nodes behind `/crypto/rpc/{network}`, from the operator's config
(configs/crypto_rpc.yaml, `CRYPTO_RPC_NODES`): network slug -> node URL, chain family and base
credits, plus the price per credit, the caps and the timeout.

Node URLs come only from this file (never from a caller). A URL may name environment
variables as `${NAME}` (providers put their API key in the URL); a network whose URL is unset
or empty after expansion is not offered. The file is read and checked once per replica at
start: a malformed file fails the start rather than a request.
"""

from __future__ import annotations

import logging
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass
from decimal import Decimal
from pathlib import Path
from typing import Annotated, Literal
from urllib.parse import urlsplit

import yaml
from pydantic import BaseModel, ConfigDict, Field, StringConstraints, ValidationError

logger = logging.getLogger("serve_app.crypto")

Family = Literal["evm", "solana", "starknet"]
NetworkSlug = Annotated[str, StringConstraints(pattern=r"^[a-z0-9][a-z0-9-]{0,62}$")]

# The reference's figures: ~7e-7 USD per credit, 100 requests a minute and 10,000,000 credits
# per rolling 24 hours per caller, and 20 credits for EVM chains and Starknet.
DEFAULT_PRICE_PER_CREDIT_USD = Decimal("0.0000007")
DEFAULT_REQUESTS_PER_MINUTE = 100
DEFAULT_CREDITS_PER_DAY = 10_000_000
DEFAULT_BASE_CREDITS = 20
DEFAULT_TIMEOUT_S = 15.0
DEFAULT_MAX_RESPONSE_BYTES = 32 * 1024 * 1024
# The largest answer kept for Idempotency-Key replays (a bigger one is answered, not kept):
# a transaction's hash or a call's result is small; what is bigger is a read worth redoing.
DEFAULT_MAX_STORED_BYTES = 1024 * 1024

_VARIABLE = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)\}")


def expand_env(value: str, environ: Mapping[str, str] | None = None) -> str:
    """`${NAME}` replaced by the variable's value; an unset variable expands to ''."""
    env = os.environ if environ is None else environ
    return _VARIABLE.sub(lambda m: env.get(m.group(1), ""), value)


class NodeEntry(BaseModel):
    """One network of the file."""

    model_config = ConfigDict(extra="forbid")

    url: str = ""
    family: Family
    base_credits: int = Field(default=DEFAULT_BASE_CREDITS, gt=0)


class CapsEntry(BaseModel):
    model_config = ConfigDict(extra="forbid")

    requests_per_minute: int = Field(default=DEFAULT_REQUESTS_PER_MINUTE, gt=0)
    credits_per_day: int = Field(default=DEFAULT_CREDITS_PER_DAY, gt=0)


class NodesFile(BaseModel):
    """configs/crypto_rpc.yaml."""

    model_config = ConfigDict(extra="forbid")

    price_per_credit_usd: Decimal = Field(default=DEFAULT_PRICE_PER_CREDIT_USD, gt=0)
    limits: CapsEntry = Field(default_factory=CapsEntry)
    timeout_s: float = Field(default=DEFAULT_TIMEOUT_S, gt=0)
    max_response_bytes: int = Field(default=DEFAULT_MAX_RESPONSE_BYTES, gt=0)
    max_stored_bytes: int = Field(default=DEFAULT_MAX_STORED_BYTES, ge=0)
    networks: dict[NetworkSlug, NodeEntry] = Field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class Network:
    """A network we offer: its slug, node URL (a secret: never logged nor answered), chain
    family and credits per standard call."""

    slug: str
    url: str = ""
    family: Family = "evm"
    base_credits: int = DEFAULT_BASE_CREDITS

    def __repr__(self) -> str:  # keep the URL (and any key in it) out of logs
        return f"Network({self.slug!r}, {self.family}, {self.base_credits} credits)"


@dataclass(frozen=True)
class NodeConfig:
    networks: dict[str, Network]
    price_per_credit_usd: Decimal = DEFAULT_PRICE_PER_CREDIT_USD
    requests_per_minute: int = DEFAULT_REQUESTS_PER_MINUTE
    credits_per_day: int = DEFAULT_CREDITS_PER_DAY
    timeout_s: float = DEFAULT_TIMEOUT_S
    max_response_bytes: int = DEFAULT_MAX_RESPONSE_BYTES
    max_stored_bytes: int = DEFAULT_MAX_STORED_BYTES

    @property
    def slugs(self) -> list[str]:
        return sorted(self.networks)


def _check_url(slug: str, url: str) -> None:
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        # Not the URL itself in the message: it may carry the provider's key.
        raise ValueError(f"crypto RPC network {slug!r}: the node URL must be an http(s) URL "
                         f"with a host (got scheme {parts.scheme or '(none)'!r})")


def parse_nodes(data: object, environ: Mapping[str, str] | None = None) -> NodeConfig:
    """The config from the file's parsed YAML, URLs expanded; networks without a URL left out."""
    try:
        parsed = NodesFile.model_validate(data or {})
    except ValidationError as exc:
        raise ValueError(f"invalid crypto RPC node config: {exc}") from exc
    networks: dict[str, Network] = {}
    for slug, entry in parsed.networks.items():
        url = expand_env(entry.url, environ).strip()
        if not url:
            continue
        _check_url(slug, url)
        networks[slug] = Network(slug, url, entry.family, entry.base_credits)
    return NodeConfig(networks=networks, price_per_credit_usd=parsed.price_per_credit_usd,
                      requests_per_minute=parsed.limits.requests_per_minute,
                      credits_per_day=parsed.limits.credits_per_day,
                      timeout_s=parsed.timeout_s, max_response_bytes=parsed.max_response_bytes,
                      max_stored_bytes=parsed.max_stored_bytes)


def load_nodes(path: Path, environ: Mapping[str, str] | None = None) -> NodeConfig:
    """Read and check the file at `path` (a missing file is an error: the setting names it)."""
    try:
        text = path.read_text()
    except OSError as exc:
        raise ValueError(f"cannot read the crypto RPC node config {path}: {exc}") from exc
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise ValueError(f"crypto RPC node config {path} is not valid YAML: {exc}") from exc
    config = parse_nodes(data, environ)
    logger.info("crypto RPC: %d network(s) offered from %s", len(config.networks), path)
    return config
