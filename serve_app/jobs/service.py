"""Queued media jobs as the routes see them: queue one (hold its quoted price, keep its input
files, write its row), answer a poll (status and timing, then the media), complete one (delete
its media). The worker (worker.py) does the work between.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from datetime import datetime

from fastapi import Request, Response
from pydantic import BaseModel
from sqlalchemy.engine import Engine

from serve_app.accounts.key_store import KeyRecord
from serve_app.accounts.provisioning import DOWNLOAD_SECRET, ensure_secret
from serve_app.db.engine import run_in_session
from serve_app.db.tables import JobStatus, utcnow
from serve_app.errors import ApiError, invalid_request
from serve_app.http import render
from serve_app.jobs import downloads
from serve_app.jobs.caps import FetchSlots, JobCaps, PendingIntakes
from serve_app.jobs.idempotency import QueueKeys, request_digest
from serve_app.jobs.intake import JobIntake
from serve_app.jobs.job_queue import OPEN_STATUSES, JobQueue, JobView, result_key
from serve_app.jobs.store import ResultStore
from serve_app.jobs.webhooks import check_callback_url
from serve_app.jobs.worker import JobWorker
from serve_app.models.catalog import Catalog, CatalogModel
from serve_app.models.router import ModelRouter, RoutedModel
from serve_app.net_guard import GuardedFetcher
from serve_app.pipeline import respond
from serve_app.pipeline.context import RequestContext
from serve_app.pipeline.runner import RequestRunner
from serve_app.schemas.video import JobRequest, RetrieveRequest

# The catalog type of each kind of job's models (`default` means that type's default).
MODEL_TYPE_OF_KIND = {"video": "video", "audio": "music", "voice-change": "music"}
# Kinds whose finished media is audio: retrieve names its format and the time it took.
AUDIO_KINDS = frozenset({"audio", "voice-change"})
# Kinds whose failure says whether the credits held for the job went back.
REFUND_TOLD_KINDS = frozenset({"voice-change"})
# Until a model has finished a job, this is its estimated run time (the P80 of its jobs).
DEFAULT_EXECUTION_MS = 60_000.0


class JobService:
    """Queued media jobs as the routes see them: queue (admitted, inputs kept, row written),
    retrieve, download by signed link, complete."""

    def __init__(self, router: ModelRouter, catalog: Catalog, request_runner: RequestRunner,
                 jobs: JobQueue, results: ResultStore, job_worker: JobWorker,
                 database: Engine, fetch_slots: FetchSlots | None = None,
                 caps: JobCaps | None = None, keys: QueueKeys | None = None,
                 callback_guard: GuardedFetcher | None = None) -> None:
        self.router = router
        self.catalog = catalog
        self.request_runner = request_runner
        self.jobs = jobs
        self.results = results
        self.job_worker = job_worker
        self.database = database
        self.fetch_slots = fetch_slots or FetchSlots()
        self.caps = caps or JobCaps()
        self.pending = PendingIntakes()  # this replica's jobs admitted, not yet written
        self.keys = keys or QueueKeys(database)
        self.callback_guard = callback_guard or GuardedFetcher()

    async def queued(self, ctx: RequestContext, key: KeyRecord, route: str, body: BaseModel,
                     idempotency_key: str | None,
                     work: Callable[[], Awaitable[dict]],
                     digested: dict[str, str] | None = None) -> Response:
        """A queue route's answer: its `callback_url` checked (400 before anything is held),
        then `work` run once per `Idempotency-Key` (idempotency.py). `digested`: what else
        makes two requests the same besides their fields (an uploaded file's hash)."""
        callback_url = getattr(body, "callback_url", None)
        if callback_url is not None:
            await check_callback_url(self.callback_guard, callback_url)
        def digest() -> str:
            return request_digest(route, {**body.model_dump(mode="json", exclude_unset=True),
                                          **(digested or {})})

        async def answer() -> Response:
            return render.json_response(ctx, await work())
        return await self.keys.once(key.account_id, idempotency_key, digest, answer)

    def intake(self, ctx: RequestContext, key: KeyRecord, routed: RoutedModel,
               kind: str, callback_url: str | None = None) -> JobIntake:
        """A job on its way into the queue (intake.py): admit, keep its inputs, hold its
        price, queue it; `async with` it so that a failure leaves nothing held or kept."""
        return JobIntake(request_runner=self.request_runner, jobs=self.jobs,
                         results=self.results, worker=self.job_worker, caps=self.caps,
                         pending=self.pending, ctx=ctx, key=key, routed=routed, kind=kind,
                         callback_url=callback_url)

    async def download_secret(self) -> str:
        return await run_in_session(self.database, lambda s: ensure_secret(s, DOWNLOAD_SECRET))

    async def download(self, queue_id: str, expires: int,
                       signature: str) -> Response:
        """A finished job's media through its signed delivery URL (no API key)."""
        if not downloads.is_valid(await self.download_secret(), queue_id, expires, signature):
            raise ApiError(403, "This download link is invalid or has expired; retrieve the job "
                                "again with your API key", code="UNAUTHORIZED")
        job = await self.jobs.get(queue_id)
        if job is None or job.status != JobStatus.COMPLETED or job.media_deleted \
                or not job.result_key:
            raise ApiError(404, f"The media of request {queue_id!r} is not available: it is not "
                                "finished yet, or was deleted", code="MEDIA_NOT_FOUND")
        media = await self.results.get(job.result_key)
        if media is None:
            raise ApiError(404, f"The media of request {queue_id!r} was deleted",
                           code="MEDIA_NOT_FOUND")
        return _media_response(job, media)

    async def _own_job(self, key: KeyRecord, body: JobRequest,
                       kind: str) -> tuple[JobView, CatalogModel]:
        """The caller's job of this kind; any other queue id is unknown to them (404)."""
        job = await self.jobs.get(body.queue_id)
        if job is None or job.kind != kind or job.account_id != key.account_id:
            raise ApiError(404, f"No {kind} request {body.queue_id!r}: it is unknown, expired or "
                                "deleted", code="MEDIA_NOT_FOUND")
        model = self.catalog.find(body.model, MODEL_TYPE_OF_KIND[kind])  # ids, aliases, traits
        if model is None or model.id != job.model_id:
            raise invalid_request(f"queue_id {body.queue_id!r} was queued for model "
                                  f"{job.model_id!r}, not {body.model!r}", "model")
        return job, model

    async def retrieve(self, ctx: RequestContext, key: KeyRecord,
                       body: RetrieveRequest, kind: str, accept: str | None = None) -> Response:
        """The job's status and timing while it runs; its error if it failed; once it is done,
        its media (deleted then when asked), or for a video job the JSON `COMPLETED` status
        when the media is not streamed: the model delivers by `download_url`, or the client's
        `Accept` excludes the video (`application/json`)."""
        job, model = await self._own_job(key, body, kind)
        respond.model_headers(ctx, model, "direct")
        if job.status in OPEN_STATUSES:
            return render.json_response(ctx, await self._status(job, "PROCESSING"))
        if job.status == JobStatus.FAILED:
            extra = ({"credits_refunded": not await self.jobs.charged(job.request_id)}
                     if kind in REFUND_TOLD_KINDS else None)
            raise ApiError(job.error_status or 500, job.error or "The generation failed",
                           code=job.error_code or "INFERENCE_FAILED", extra=extra)
        if job.media_deleted or not job.result_key:
            raise _media_deleted(kind, job)
        if kind in AUDIO_KINDS:
            _audio_headers(ctx, job)
        if kind == "video" and (model.delivery == "download_url"
                                or not accepts(accept, job.media_type or "video/mp4")):
            return render.json_response(ctx, await self._status(job, "COMPLETED"))
        media = await self.results.get(job.result_key)
        if media is None:
            raise _media_deleted(kind, job)
        if body.delete_media_on_completion:
            await self._delete_media(job)
        return _media_response(job, media)

    async def _status(self, job: JobView, status: str) -> dict[str, str | int]:
        """A job's JSON status: its model's estimated run time (P80) and how long it has run
        (until it finished, for a finished one), in ms."""
        average = await self.jobs.p80_execution_ms(job.model_id)
        return {"status": status,
                "average_execution_time": round(average or DEFAULT_EXECUTION_MS),
                "execution_duration": round(_ms_since(job.created_at, job.finished_at))}

    async def _delete_media(self, job: JobView) -> None:
        """The media (under its key even when the row names none: a failed job's runner may
        have put it) and the inputs."""
        await self.jobs.mark_deleted(job.queue_id)
        await self.results.delete(result_key(job.queue_id))
        for stored in job.inputs.values():
            await self.results.delete(stored)

    async def complete(self, key: KeyRecord, body: JobRequest,
                       kind: str) -> dict:
        """Delete a finished job's media from the store (once it was downloaded)."""
        job, _ = await self._own_job(key, body, kind)
        if job.status in OPEN_STATUSES:
            raise invalid_request(f"{kind} request {job.queue_id!r} is still being made; "
                                  "retrieve it once it is complete", "queue_id")
        await self._delete_media(job)
        return {"success": True}


def delivery_url(request: Request, public_api_url: str | None, secret: str,
                 queue_id: str) -> str:
    """The job's signed `download_url`: on the configured public API base, or else on the
    base of the URL the request came in on."""
    base = (public_api_url.rstrip("/") if public_api_url
            else str(request.url).split("?", 1)[0].rsplit("/video/", 1)[0])
    return downloads.download_url(base, secret, queue_id)


def _media_response(job: JobView, media: bytes) -> Response:
    return Response(media, media_type=job.media_type or "application/octet-stream",
                    headers={"Content-Disposition":
                             f'attachment; filename="{job.queue_id}{_suffix(job)}"'})


def accepts(accept: str | None, media_type: str) -> bool:
    """Whether an `Accept` header takes `media_type` (no header takes anything): the most
    specific range that matches it decides (`type/subtype`, then `type/*`, then `*/*`), and
    one whose `q` is 0 refuses it."""
    if not accept or not accept.strip():
        return True
    major = media_type.split("/", 1)[0]
    best: tuple[int, float] | None = None  # (specificity, q)
    for part in accept.split(","):
        media_range, *params = [piece.strip() for piece in part.split(";")]
        media_range = media_range.lower()
        if media_range == media_type:
            specificity = 2
        elif media_range == f"{major}/*":
            specificity = 1
        elif media_range in ("*/*", "*"):
            specificity = 0
        else:
            continue
        q = 1.0
        for param in params:
            name, _, value = param.partition("=")
            if name.strip().lower() == "q":
                try:
                    q = float(value)
                except ValueError:
                    q = 0.0
        if best is None or specificity > best[0]:
            best = (specificity, q)
    return best is not None and best[1] > 0


def _audio_headers(ctx: RequestContext, job: JobView) -> None:
    """A finished audio job's format (`mp3`, ...) and the time it took to make, in ms."""
    took = (_ms_since(job.started_at, job.finished_at)
            if job.started_at is not None and job.finished_at is not None else None)
    respond.audio_job_headers(ctx, AUDIO_FORMAT_OF.get(job.media_type or ""), took)


def _media_deleted(kind: str, job: JobView) -> ApiError:
    return ApiError(404, f"The media of {kind} request {job.queue_id!r} was deleted",
                    code="MEDIA_NOT_FOUND")


def _ms_since(start: datetime, end: datetime | None = None) -> float:
    return max(0.0, ((end or utcnow()) - start).total_seconds() * 1000)


AUDIO_FORMAT_OF = {"audio/mpeg": "mp3", "audio/wav": "wav", "audio/flac": "flac",
                   "audio/opus": "opus", "audio/aac": "aac", "audio/pcm": "pcm"}


def _suffix(job: JobView) -> str:
    return {"video/mp4": ".mp4", "audio/mpeg": ".mp3", "audio/wav": ".wav",
            "audio/flac": ".flac", "audio/opus": ".opus"}.get(job.media_type or "", "")


