"""Runtime settings, read from environment variables (documented in README.md)."""

from __future__ import annotations

from decimal import Decimal
from functools import lru_cache
from pathlib import Path
from typing import Literal

from pydantic import Field, field_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from serve_app.client_address import TrustedProxies, parse_trusted_proxies

PROJECT_ROOT = Path(__file__).resolve().parent.parent


class Settings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="", extra="ignore", case_sensitive=False)

    host: str = "127.0.0.1"
    port: int = 8000
    data_dir: Path = Path("./data")
    database_url: str | None = None
    redis_url: str | None = None
    admin_api_key: str | None = None
    initial_credit_usd: Decimal = Field(default=Decimal("10"), ge=0)
    model_catalog: Path = PROJECT_ROOT / "configs" / "models.yaml"
    # The named rate-limit tiers accounts can be set to (serve_app/limits/policy.py).
    rate_limit_tiers: Path = PROJECT_ROOT / "configs" / "rate_limit_tiers.yaml"
    # How long a cached API key stays valid without a change notice; bounds staleness
    # should an invalidation notice ever be missed.
    key_cache_ttl_s: float = 60.0
    # How often each ingress replica looks for keys changed outside the API (admin CLI)
    # and writes batched `lastUsedAt` stamps.
    key_sync_interval_s: float = 2.0
    # Embedding calls one Gateway replica keeps in flight per model: each carries every request
    # that queued meanwhile. A call beside a running one waits until it carries
    # `embedding_min_texts_beside` texts, so under load two calls alternate in halves and the
    # replica never waits for the ingress (see serve_app/embeddings/batcher.py). Raise the
    # first to keep several embedding replicas busy from one Gateway.
    embedding_calls_in_flight: int = Field(default=2, ge=1)
    embedding_min_texts_beside: int = Field(default=16, ge=1)
    # Web search provider for `enable_web_search` (see serve_app/chat/web.py); unset: none.
    web_search_url: str | None = None
    web_search_api_key: str | None = None
    # `host:port` pairs the server may fetch although they are private (comma-separated).
    web_fetch_allowed_hosts: str = ""
    # `host:port` pairs a job's `callback_url` may name although they are private
    # (comma-separated; a receiver on the operator's own network, tests). Callbacks never
    # use WEB_FETCH_ALLOWED_HOSTS: that list is for the operator's internal services.
    webhook_allowed_hosts: str = ""
    # Where rate-limit counts live: `redis` (REDIS_URL), `ray` (one actor per cluster),
    # `local` (this process only); `auto` picks Redis when REDIS_URL is set, else Ray under
    # Serve, else local.
    rate_limit_backend: Literal["auto", "local", "ray", "redis"] = "auto"
    # Prefix of the rate-limit keys in Redis (several platforms can share one server).
    redis_prefix: str = "inference"

    # Wallet access (SIGN-IN-WITH-X and x402 top-ups; README "Wallet access").
    # Domains a SIWX message may name, comma-separated; empty: the host the request was sent to.
    siwx_domains: str = ""
    # x402 facilitator for top-ups: its base URL (`/verify`, `/settle`), `dev` for the bundled
    # development facilitator (moves no money; loopback only), unset: top-ups answer 503.
    x402_facilitator_url: str | None = None
    # Where top-ups are paid: the operator's receiving wallets, and the Solana fee payer
    # (the facilitator's address that signs and pays the transaction fee).
    x402_pay_to_evm: str | None = None
    x402_pay_to_solana: str | None = None
    x402_solana_fee_payer: str | None = None
    x402_min_top_up_usd: Decimal = Field(default=Decimal("5"), ge=0)
    # Top-up attempts (a payment header sent) per minute from one client address (the
    # reference's 10 a minute per IP), and from all clients together, counted before the
    # header is decoded (429 past them).
    x402_top_ups_per_client_per_minute: int = Field(default=10, ge=1)
    x402_top_ups_per_minute: int = Field(default=600, ge=1)
    # Requests of one signed-in wallet in flight at once on each Gateway replica (429
    # X402_CONCURRENCY_LIMIT past them).
    x402_requests_in_flight_per_wallet: int = Field(default=5, ge=1)
    # Wallet sign-ins (SIGN-IN-WITH-X headers) a minute from one client address on each
    # Gateway replica, counted before the signature is checked and the nonce written (429).
    siwx_sign_ins_per_client_per_minute: int = Field(default=300, ge=1)
    # The web console's built files (console/dist, `npm run build`), served under /console.
    console_dir: Path = PROJECT_ROOT / "console" / "dist"
    # Where queued jobs keep their inputs and results: unset, DATA_DIR/results; a directory;
    # or s3://bucket/prefix?endpoint=http://host:9000 (serve_app/jobs/store.py).
    result_store_url: str | None = None
    # The API's public base as clients reach it (e.g. https://api.example.com/api/v1), for links
    # the server hands out (a video's download_url); unset: the base of the request's own URL,
    # which behind a TLS-terminating proxy is the proxy's plain-HTTP view.
    public_api_url: str | None = None
    # Jobs each Gateway replica has its runner send to one video or audio deployment at once.
    job_slots_per_deployment: int = Field(default=2, ge=1, le=64)
    # How long a job worker's claim on a job lasts unless renewed (it renews every third of
    # it): a runner that died gives its jobs up after this long.
    job_lease_s: float = Field(default=30.0, gt=0)
    # Requests of one account that may read media inputs (fetch, decode, probe) at once on
    # each Gateway replica; more are refused with a 429 (video jobs have no rate limit).
    media_fetches_per_account: int = Field(default=2, ge=1)
    # The longest a request may wait for its turn at a busy engine: one whose expected wait
    # is longer gets 503 MODEL_AT_CAPACITY with Retry-After (deployments/fair_share.py).
    max_queue_wait_s: float = Field(default=30.0, gt=0)
    # The longest a request waits for a model deployment scaled to zero to start a replica
    # (`min_replicas: 0`); past it, 503 MODEL_AT_CAPACITY with Retry-After while the replica
    # keeps starting (serve_app/models/calls.py).
    cold_start_wait_s: float = Field(default=120.0, gt=0)
    # Per-account caps on queued video and audio jobs: jobs queued or running at once, and
    # the megabytes their inputs and finished media keep in the result store (429 past them).
    job_open_per_account: int = Field(default=20, ge=1)
    job_stored_mb_per_account: int = Field(default=2048, ge=1)
    # Background responses (`/responses` with `background: true`): how long a finished one
    # and its events are kept, and per account how many may be kept at once and the
    # megabytes they may keep (429 past them).
    responses_kept_s: float = Field(default=3600.0, gt=0)
    responses_per_account: int = Field(default=100, ge=1)
    responses_stored_mb_per_account: int = Field(default=64, ge=1)
    responses_followers_per_account: int = Field(default=16, ge=1)
    # The longest a background response whose model refuses it for load (503
    # MODEL_AT_CAPACITY) before it started stays queued, trying again after each refusal's
    # Retry-After; past it, it fails with that refusal (serve_app/responses/capacity_wait.py).
    responses_capacity_wait_s: float = Field(default=600.0, gt=0)
    # The longest a request body may take to arrive (408 past it), and how many bodies over
    # 1 MB one client address may have on their way at once (429 past it).
    body_timeout_s: float = Field(default=60.0, gt=0)
    large_bodies_per_client: int = Field(default=2, ge=1)
    # The operator's own proxies (addresses or networks, comma-separated): only from them are
    # `Forwarded` and `X-Forwarded-For` read for the client's address (client_address.py).
    trusted_proxies: str = ""
    # The longest an image's header may take to read in the gateway's workers (bounded walk:
    # milliseconds); past it the image is refused as unreadable (400 CORRUPTED_IMAGE).
    image_inspect_timeout_s: float = Field(default=5.0, gt=0)
    # Completion webhooks of queued jobs: tries of one event, and the wait before the first
    # retry (doubled after each failed try: 6 tries over about 31 minutes by default).
    webhook_max_attempts: int = Field(default=6, ge=1, le=20)
    webhook_first_retry_s: float = Field(default=60.0, gt=0)
    # JSON-RPC nodes of `/crypto/rpc/{network}` (configs/crypto_rpc.yaml documents the format).
    crypto_rpc_nodes: Path = PROJECT_ROOT / "configs" / "crypto_rpc.yaml"

    @property
    def allowed_fetch_hosts(self) -> frozenset[str]:
        return frozenset(h.strip() for h in self.web_fetch_allowed_hosts.split(",") if h.strip())

    @property
    def allowed_webhook_hosts(self) -> frozenset[str]:
        return frozenset(h.strip() for h in self.webhook_allowed_hosts.split(",") if h.strip())

    @property
    def accepted_siwx_domains(self) -> frozenset[str]:
        return frozenset(d.strip().lower() for d in self.siwx_domains.split(",") if d.strip())

    @field_validator("trusted_proxies")
    @classmethod
    def _proxy_networks(cls, value: str) -> str:
        parse_trusted_proxies(value)  # a typo refuses the settings, not a silent rule
        return value

    @property
    def trusted_proxy_rule(self) -> TrustedProxies:
        return TrustedProxies(parse_trusted_proxies(self.trusted_proxies))

    @field_validator("data_dir", "model_catalog", "rate_limit_tiers", "crypto_rpc_nodes",
                     "console_dir")
    @classmethod
    def _absolute(cls, value: Path) -> Path:
        # Replicas may run in another working directory: pin paths now.
        return value.expanduser().resolve()

    @property
    def resolved_database_url(self) -> str:
        if self.database_url:
            return self.database_url
        return f"sqlite:///{self.data_dir / 'platform.db'}"


@lru_cache(maxsize=1)
def get_settings() -> Settings:
    return Settings()


class LaunchSettings(BaseSettings):
    """What `make run` (serve_app/launch.py) reads besides Settings: the local Ray instance."""

    model_config = SettingsConfigDict(env_prefix="", extra="ignore", case_sensitive=False)

    ray_port: int = 6380
    ray_tmpdir: Path = Path("/tmp/ray-platform")
    ray_num_cpus: int | None = None  # None: every core
    metrics_port: int = 9464  # Ray's metrics agent: every replica's metrics, for Prometheus
