"""Step 4 of a request: decide (budgets and per-minute limits in one call to the backend),
refuse with 429, correct the token count after the work, count failed, unsupported-feature and
left-before-the-answer (499) requests, and log what was refused. What the rate-limit headers
say comes back as a `LimitState`; the pipeline writes them (serve_app/pipeline/respond.py)
with limit_headers.py, which builds every rate-limit header."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

from sqlalchemy import delete, select
from sqlalchemy.engine import Engine
from sqlmodel import Session

from serve_app.accounts.key_store import KeyRecord
from serve_app.client_gone import CLIENT_CLOSED_REQUEST
from serve_app.db.tables import RateLimitEvent
from serve_app.errors import ApiError, retry_after, retry_after_s
from serve_app.limits.backends import LimiterBackend
from serve_app.limits.core import OK, OVER_REQUESTS, Outcome
from serve_app.limits.limit_headers import LimitState, limit_headers
from serve_app.limits.policy import (
    API_KEY_CREATIONS_PER_MINUTE,
    BUDGET_WINDOW_MS,
    CLIENT_GONE_ACCOUNT_MAX,
    CLIENT_GONE_MAX,
    FAILED_REQUESTS_MAX,
    REFUSED_IMAGES_MAX,
    UNSUPPORTED_FEATURE_MAX,
    WINDOW_MS,
    Limits,
    RateLimitTiers,
    limits_for,
)
from serve_app.limits.shared_counts import SharedCountsRead
from serve_app.metrics import metrics
from serve_app.models.catalog import CatalogModel

logger = logging.getLogger("serve_app.limits")

# A flood of refusals logs one event per (key, model, type) per second and replica.
_LOG_EVERY_S = 1.0
# What the log keeps of an account: the newest events the route shows, none older than this.
LOG_EVENTS_KEPT = 50
LOG_EVENTS_DAYS = 30


class RateLimited(ApiError):
    """429 for a per-minute limit, with the count its headers report (None: the model has
    no request limit, so no headers) and `Retry-After`, the seconds to the window's reset,
    which the SDKs wait for before they retry."""

    def __init__(self, message: str, state: LimitState | None) -> None:
        wait = {} if state is None else retry_after((state.reset_at_ms - state.now_ms) / 1000)
        super().__init__(429, message, code="RATE_LIMIT_EXCEEDED", headers=wait)
        self.state = state


@dataclass
class Ticket:
    """An admitted request: its bucket and window, and the tokens counted for it so far."""

    limiter: RateLimits
    bucket: str
    window_ms: int
    tokens: int
    state: LimitState

    def correct(self, measured_tokens: int) -> None:
        """Replace the estimate by the measured total (prompt and completion). The correction
        is sent before the answer leaves, but not waited for: a lost one is not worth a 500,
        nor a round trip on every request."""
        delta, self.tokens = measured_tokens - self.tokens, measured_tokens
        if delta:
            self.limiter.counts_read.forget(self.bucket.split("|", 1)[0])
            with contextlib.suppress(Exception):
                self.limiter.backend.adjust_soon(self.bucket, self.window_ms, delta)


def _caller(key: KeyRecord) -> str:
    return "wallet" if key.wallet_address else "API key"


def _limit_state(limits: Limits, outcome: Outcome, now: int, key: KeyRecord) -> LimitState:
    tpm = limits.tokens_per_minute
    return LimitState(
        requests_limit=limits.requests_per_minute,
        requests_remaining=max(0, limits.requests_per_minute - outcome.requests),
        reset_at_ms=outcome.window_ms + WINDOW_MS,
        tokens_limit=tpm, tokens_remaining=max(0, tpm - outcome.tokens) if tpm else None,
        now_ms=now, caller_type="user" if key.wallet_address else "api_key")


def _failed_key(owner: str, model_id: str) -> str:
    return f"{owner}|{model_id}|FAILED"


def _unsupported_key(owner: str, model_id: str) -> str:
    return f"{owner}|{model_id}|UNSUPPORTED"


def _gone_keys(key: KeyRecord) -> tuple[tuple[str, int, str], tuple[str, int, str]]:
    """The 499 budgets of a key and of its account: (budget key, threshold, whose)."""
    return ((f"{key.id}||GONE", CLIENT_GONE_MAX, "API key"),
            (f"account:{key.account_id}||GONE", CLIENT_GONE_ACCOUNT_MAX, "account"))


_FAILED, _GONE, _UNSUPPORTED = (
    "FAILED_REQUESTS", "CLIENT_GONE_REQUESTS", "UNSUPPORTED_FEATURE_REQUESTS")


class RateLimits:
    def __init__(self, backend: LimiterBackend, engine: Engine,
                 clock: Callable[[], float] = time.time,
                 tiers: RateLimitTiers | None = None) -> None:
        self.backend = backend
        self.tiers = tiers or RateLimitTiers.builtin()  # loaded once per replica
        self._engine = engine
        self.clock = clock
        self._logged: dict[tuple, float] = {}
        self._tripped: dict[str, int] = {}  # key id -> ms until its model-less budget refills
        self._images_tripped: dict[str, int] = {}  # account id -> ms until it refills
        # key id or account id -> (ms until its 499 budget refills, threshold, whose)
        self._gone_tripped: dict[str, tuple[int, int, str]] = {}
        self._tasks: set[asyncio.Task] = set()
        # bucket -> (window start, requests, tokens) of its last decision here: the room the
        # key had, as far as this replica knows.
        self._last_counts: dict[str, tuple[int, int, int]] = {}
        self._published: dict[tuple[str, bool], list[dict[str, Any]]] = {}
        self._classes: dict[tuple[str, bool], list[Limits]] = {}
        self.counts_read = SharedCountsRead(backend)  # for the headers of model-less routes

    def published(self, models: list[CatalogModel], tier: str, is_partner: bool
                  ) -> list[dict[str, Any]]:
        """The per-model limits of a tier as `GET /api_keys/rate_limits` lists them: `models`
        (the catalog) and the tiers are fixed for a replica's life, so each tier's list is
        built once."""
        entries = self._published.get((tier, is_partner))
        if entries is None:
            entries = []
            for model in models:
                limits = limits_for(model, is_partner=is_partner, tier=tier, tiers=self.tiers)
                if limits is None:
                    continue
                amounts = [{"amount": limits.requests_per_minute, "type": "RPM"}]
                if limits.tokens_per_minute:
                    amounts.append({"amount": limits.tokens_per_minute, "type": "TPM"})
                entries.append({"apiModelId": model.id, "rateLimits": amounts})
            self._published[(tier, is_partner)] = entries
        return entries

    def _limits_of(self, models: list[CatalogModel], key: KeyRecord) -> list[Limits]:
        """The distinct per-minute limits (one per bucket) a key of this tier has over
        `models` (the catalog), in catalog order; built once per tier."""
        mark = (key.rate_limit_tier, key.is_partner)
        found = self._classes.get(mark)
        if found is None:
            seen: dict[str, Limits] = {}
            for model in models:
                limits = limits_for(model, is_partner=key.is_partner, tier=key.rate_limit_tier,
                                    tiers=self.tiers)
                if limits is not None and limits.requests_per_minute:
                    seen.setdefault(limits.bucket, limits)
            found = self._classes[mark] = list(seen.values())
        return found

    async def current(self, key: KeyRecord, models: list[CatalogModel], *,
                      timeout_s: float | None = None) -> LimitState | None:
        """The key's window nearest its limits (the largest share of its requests or tokens
        used; the first of the catalog when none is used), read from the shared count without
        counting a request or writing anything: the rate-limit headers of an answer that made
        no decision (a route without a model). None: the catalog limits nothing.
        `timeout_s`: the longest a read of the shared count may take (TimeoutError)."""
        classes = self._limits_of(models, key)
        if not classes:
            return None
        now = self._now_ms()
        counts = await self.counts_read.counts(
            key.id, [f"{key.id}|{c.bucket}" for c in classes], now, timeout_s)
        best: tuple[float, Limits, Outcome] | None = None
        for i, limits in enumerate(classes):
            start, requests, tokens = counts[3 * i:3 * i + 3]
            used = requests / limits.requests_per_minute
            if limits.tokens_per_minute:
                used = max(used, tokens / limits.tokens_per_minute)
            if best is None or used > best[0]:
                best = (used, limits, Outcome(window_ms=start or now, requests=requests,
                                              tokens=tokens))
        assert best is not None
        return _limit_state(best[1], best[2], now, key)

    def _bucket(self, key: KeyRecord, model: CatalogModel) -> tuple[Limits, str]:
        limits = limits_for(model, is_partner=key.is_partner, tier=key.rate_limit_tier,
                            tiers=self.tiers) or Limits(0, None, "unlimited")
        return limits, f"{key.id}|{limits.bucket}"

    def has_room(self, key: KeyRecord, model: CatalogModel, tokens: int) -> bool:
        """Whether the key's last count here, in the current window, left it well inside its
        limits (a tenth of each to spare): its next request is very likely admitted."""
        limits, bucket = self._bucket(key, model)
        last = self._last_counts.get(bucket)
        if last is None or self._tripped.get(key.id):
            return False
        window_ms, requests, used = last
        if self._now_ms() >= window_ms + WINDOW_MS:
            return False
        rpm, tpm = limits.requests_per_minute, limits.tokens_per_minute
        return (not rpm or requests < rpm * 0.9) and (not tpm or used + tokens < tpm * 0.9)

    def _now_ms(self) -> int:
        return int(self.clock() * 1000)

    async def admit(self, key: KeyRecord, model: CatalogModel, tokens: int, *,
                    feature_budget: bool = False) -> Ticket | None:
        """Admit a request for `model` (budgets, then requests and tokens per minute) or raise
        429. `tokens`: the most the request may use (chat: the prompt estimate and its
        completion limit); more than the tokens per minute is refused outright.
        `feature_budget`: the route counts unsupported-feature requests (chat, responses).
        None: the model is not rate limited."""
        limits, bucket = self._bucket(key, model)
        tpm = limits.tokens_per_minute
        if tpm and tokens > tpm:
            # Could never fit, even in an empty window (which the backend's rule would admit
            # whatever its size): refused without counting, whatever the key's count.
            self._log(key, model.id, limits.tier, "TPM")
            metrics().limiter.inc(tags={"outcome": "refused_tpm"})
            raise RateLimited(f"Rate limit exceeded: this request may use up to {tokens} tokens "
                              f"(its prompt and max_tokens for each choice), more than the {tpm} "
                              f"tokens per minute for model {model.id} with this {_caller(key)}; "
                              "lower max_tokens", None)
        gone_key, gone_account = _gone_keys(key)
        budgets = [(_failed_key(key.id, model.id), FAILED_REQUESTS_MAX),
                   (_failed_key(key.id, ""), FAILED_REQUESTS_MAX),
                   gone_key[:2], gone_account[:2]]
        # (kind, whose) of each budget: the outcome names the 1-based position of a spent one
        kinds = [(_FAILED, "API key"), (_FAILED, "API key"), (_GONE, gone_key[2]),
                 (_GONE, gone_account[2])]
        if feature_budget:
            budgets.append((_unsupported_key(key.id, model.id), UNSUPPORTED_FEATURE_MAX))
            kinds.append((_UNSUPPORTED, "API key"))
        now = self._now_ms()
        outcome = await self.backend.decide(bucket, limits.requests_per_minute,
                                            limits.tokens_per_minute or 0, tokens, budgets, now)
        self.counts_read.forget(key.id)
        if len(self._last_counts) > 100_000:
            self._last_counts.clear()
        if outcome.budget or outcome.code != OK:
            self._last_counts.pop(bucket, None)
        else:
            self._last_counts[bucket] = (outcome.window_ms, outcome.requests, outcome.tokens)
        if outcome.budget:
            kind, whose = kinds[outcome.budget - 1]
            self._log(key, model.id, limits.tier, kind)
            metrics().limiter.inc(tags={"outcome": "refused_budget"})
            raise self._budget_error(kind, outcome, model.id, whose)
        state = _limit_state(limits, outcome, now, key) if limits.requests_per_minute else None
        if outcome.code != OK:
            kind = "RPM" if outcome.code == OVER_REQUESTS else "TPM"
            self._log(key, model.id, limits.tier, kind)
            metrics().limiter.inc(tags={"outcome": f"refused_{kind.lower()}"})
            what = ("requests" if kind == "RPM" else "tokens")
            amount = (limits.requests_per_minute if kind == "RPM"
                      else limits.tokens_per_minute)
            raise RateLimited(f"Rate limit exceeded: {amount} {what} per minute for model "
                              f"{model.id} with this {_caller(key)}; retry after the reset in "
                              "x-ratelimit-reset-requests", state)
        metrics().limiter.inc(tags={"outcome": "admitted"})
        if state is None:
            return None
        return Ticket(self, bucket, outcome.window_ms, tokens, state)

    def _budget_error(self, kind: str, outcome: Outcome, model_id: str,
                      whose: str = "API key") -> ApiError:
        if kind == _GONE:
            message = (f"Too many requests left before their answer: more than {outcome.limit} "
                       f"requests of this {whose} were closed by the client before the answer "
                       f"began in {BUDGET_WINDOW_MS // 1000} seconds; wait for the answers")
        else:
            what = "failed" if kind == _FAILED else "unsupported-feature"
            message = (f"Too many {what} requests: more than {outcome.limit} {what} requests "
                       f"in {BUDGET_WINDOW_MS // 1000} seconds for model "
                       f"{model_id or '(any)'} with this API key")
        return ApiError(429, message, code="RATE_LIMIT_EXCEEDED",
                        headers=self._budget_headers(outcome.resets_ms),
                        extra={"customMessage": message})

    def _budget_headers(self, resets_ms: int) -> dict[str, str]:
        """A spent budget's 429 headers: when it resets (Unix seconds, as the reset of a
        window is told), and `Retry-After` (seconds from now), which the SDKs wait for."""
        wait_s = retry_after_s((resets_ms - self._now_ms()) / 1000)
        return limit_headers(budget_resets_s=math.ceil(resets_ms / 1000), retry_after_s=wait_s)

    async def admit_key_creation(self, key: KeyRecord) -> LimitState:
        """API key creation: 20 per minute per account."""
        now = self._now_ms()
        outcome = await self.backend.decide(f"{key.account_id}|api_key_create",
                                            API_KEY_CREATIONS_PER_MINUTE, 0, 0, [], now)
        limits = Limits(API_KEY_CREATIONS_PER_MINUTE, None, "api_key_create")
        state = _limit_state(limits, outcome, now, key)
        if outcome.code != OK:
            self._log(key, None, "paid", "RPM")
            raise RateLimited(f"Rate limit exceeded: at most {API_KEY_CREATIONS_PER_MINUTE} "
                              "API keys may be created per minute", state)
        return state

    async def count_account(self, account_id: str, name: str, per_minute: int) -> Outcome:
        """One request counted against an account-wide per-minute cap of its own (`name`),
        outside the per-model limits (the crypto RPC proxy)."""
        return await self.backend.decide(f"{account_id}|{name}", per_minute, 0, 0, [],
                                         self._now_ms())

    def request_finished(self, key: KeyRecord | None, model_id: str, status: int,
                         request_id: str, *, unsupported_feature: bool = False,
                         caller_failure: bool = True) -> None:
        """Count a failed request (any endpoint) toward its key's error budget: not a refusal
        by a limit (429), a client that left (499), an unsupported feature (its own budget),
        nor a failure that is not the caller's (a model at capacity)."""
        if key is not None and status == CLIENT_CLOSED_REQUEST:
            self._spawn(self._count_gone(key, request_id))
            return
        if key is None or status < 400 or status == 429 \
                or unsupported_feature or not caller_failure:
            return
        self._spawn(self._count_failure(key, model_id, request_id))

    async def _count_gone(self, key: KeyRecord, request_id: str) -> None:
        """Count a request its client left before the answer began toward its key's and its
        account's 499 budgets; past one, this replica refuses the key (or the account) at
        once, before its next request is admitted (`check_failed_budget`)."""
        now = self._now_ms()
        for (budget, limit, whose), owner in zip(_gone_keys(key), (key.id, key.account_id),
                                                 strict=True):
            count = await self.backend.record(budget, now, request_id)
            if count > limit:
                self._gone_tripped[owner] = (now + BUDGET_WINDOW_MS, limit, whose)

    async def _count_failure(self, key: KeyRecord, model_id: str, request_id: str) -> None:
        now = self._now_ms()
        count = await self.backend.record(_failed_key(key.id, model_id), now, request_id)
        if not model_id and count > FAILED_REQUESTS_MAX:
            # Endpoints without a model make no limiter call: they read this mark. Each replica
            # that counts a failure past the threshold sets it, from the shared count.
            self._tripped[key.id] = now + BUDGET_WINDOW_MS

    def check_failed_budget(self, key: KeyRecord) -> None:
        """429 for a key whose failed-request budget (endpoints without a model) is spent, or
        whose key's or account's 499 budget is (every endpoint)."""
        for owner in (key.id, key.account_id):
            gone = self._gone_tripped.get(owner)
            if gone is None:
                continue
            until, limit, whose = gone
            if self._now_ms() >= until:
                del self._gone_tripped[owner]
                continue
            raise self._budget_error(_GONE, Outcome(
                budget=3, limit=limit, count=limit + 1, resets_ms=until), "", whose)
        until = self._tripped.get(key.id)
        if until is None:
            return
        if self._now_ms() >= until:
            del self._tripped[key.id]
            return
        raise self._budget_error("FAILED_REQUESTS", Outcome(
            budget=1, limit=FAILED_REQUESTS_MAX, count=FAILED_REQUESTS_MAX + 1,
            resets_ms=until), "")

    async def image_refused(self, account_id: str) -> None:
        """Count an image refused after its header was read toward the account's budget."""
        now = self._now_ms()
        try:
            count = await self.backend.record(f"{account_id}|images|REFUSED", now,
                                              uuid.uuid4().hex)
        except Exception as exc:  # the refusal stands; only its count is lost
            logger.warning("refused image count lost: %s", exc)
            return
        if count > REFUSED_IMAGES_MAX:
            self._images_tripped[account_id] = now + BUDGET_WINDOW_MS

    def check_refused_images(self, account_id: str) -> None:
        """429 for an account whose budget of refused images is spent, before its next image
        is read."""
        until = self._images_tripped.get(account_id)
        if until is None:
            return
        if self._now_ms() >= until:
            del self._images_tripped[account_id]
            return
        message = (f"Too many refused images: more than {REFUSED_IMAGES_MAX} images of this "
                   f"account were refused in {BUDGET_WINDOW_MS // 1000} seconds; send readable "
                   "PNG, JPEG or WebP files")
        raise ApiError(429, message, code="RATE_LIMIT_EXCEEDED",
                       headers=self._budget_headers(until))

    def unsupported_feature(self, key: KeyRecord, model_id: str, request_id: str) -> None:
        """Count an unsupported-feature request (its own budget, not the failed one)."""
        self._spawn(self.backend.record(_unsupported_key(key.id, model_id), self._now_ms(),
                                        request_id))

    def _spawn(self, coro) -> None:
        task = asyncio.get_running_loop().create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._finished_task)

    def _finished_task(self, task: asyncio.Task) -> None:
        self._tasks.discard(task)
        if not task.cancelled() and task.exception() is not None:
            logger.warning("error budget count lost: %s", task.exception())

    def _log(self, key: KeyRecord, model_id: str | None, tier: str, kind: str) -> None:
        """Remember a refusal for `GET /api_keys/rate_limits/log`, without slowing the 429."""
        logger.info("rate limit %s for key %s model %s", kind, key.id, model_id)
        mark = (key.id, model_id, kind)
        now = time.monotonic()
        if now - self._logged.get(mark, 0.0) < _LOG_EVERY_S:
            return
        self._logged[mark] = now
        if len(self._logged) > 10_000:
            self._logged.clear()
        key_id = None if key.wallet_address else key.id
        event = RateLimitEvent(account_id=key.account_id, api_key_id=key_id, model_id=model_id,
                               tier=tier, limit_type=kind,
                               created_at=datetime.fromtimestamp(self.clock(), UTC))

        def write() -> None:
            with Session(self._engine) as session:
                session.add(event)
                session.flush()
                _forget_old_events(session, key.account_id, event.created_at)
                session.commit()

        self._spawn(asyncio.to_thread(write))

    async def close(self) -> None:
        for task in list(self._tasks):
            with contextlib.suppress(Exception):
                await asyncio.wait_for(task, 2)
        await self.backend.close()


def _forget_old_events(session: Session, account_id: str, now: datetime) -> None:
    """Every stored row expires: an account keeps its newest `LOG_EVENTS_KEPT` events (all the
    log route shows) and none older than `LOG_EVENTS_DAYS`; older events of any account go
    too, a bounded number per write."""
    table = RateLimitEvent.__table__
    newest = select(table.c.id).where(table.c.account_id == account_id) \
        .order_by(table.c.created_at.desc(), table.c.id.desc()).limit(LOG_EVENTS_KEPT)
    session.execute(delete(table).where(table.c.account_id == account_id,
                                        table.c.id.not_in(newest.scalar_subquery())))
    expired = select(table.c.id).where(table.c.created_at < now - timedelta(
        days=LOG_EVENTS_DAYS)).limit(500)
    session.execute(delete(table).where(table.c.id.in_(expired.scalar_subquery())))
