"""The job worker: takes queued media jobs from the job table and has their deployments make
them. Every Gateway replica runs one; they share the table, never a job (leases).

One job: claim it (a lease, renewed while it runs), read its inputs from the result store,
one call to its model's deployment (or, for a kind made by several models, its maker: a
voice change is heard, then spoken), the media into the result store, the job marked COMPLETED
(only while the lease is still this runner's), then the quoted price settled against the hold
taken when it was queued. A failure marks it FAILED, then releases the hold. Every path
changes the job's state first and the money second, so the money follows the state:

- a runner that dies mid-job leaves a lease that runs out: the next runner tries the job
  again, or fails it and releases the hold once it has had its tries;
- a runner that dies between COMPLETED and the settlement leaves a completed job with a hold:
  the sweep settles it (settling is keyed by the job's request id: once, however often);
- a runner that lost its lease cannot mark the job COMPLETED, so it charges nothing;
- a job no runner will take (its model left the catalog, or waited a day for a deployment
  that never came back) is failed and released by the sweep.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import socket
import time
import uuid
from collections import defaultdict
from collections.abc import Awaitable, Callable, Mapping
from datetime import timedelta
from typing import Any

from sqlalchemy import true

from deployments.protocol import MediaJob, MediaResult, Tenant
from serve_app.billing.ledger import Payer
from serve_app.billing.pricing import Cost, PricedLine
from serve_app.billing.service import Billing
from serve_app.db.tables import JobStatus, utcnow
from serve_app.errors import ApiError
from serve_app.jobs import downloads
from serve_app.jobs.job_queue import JobQueue, JobView, result_key
from serve_app.jobs.store import ResultStore
from serve_app.jobs.wake import run_rounds
from serve_app.models.calls import call_model
from serve_app.models.catalog import Catalog, CatalogModel
from serve_app.models.router import ModelRouter
from serve_app.pipeline.bill import Bill

logger = logging.getLogger("serve_app.jobs")

# Catalog types whose models take queued jobs (a video job is made by its video deployment, a
# queued speech job by its speech deployment, other kinds by a JobMaker).
QUEUED_MODEL_TYPES = ("video", "music")
# How a job of a kind no single deployment makes is made (a voice change: transcription,
# then speech): its model and the job -> the media. Given by the composition root.
JobMaker = Callable[[CatalogModel, MediaJob], Awaitable[MediaResult]]
POLL_INTERVAL_S = 1.0
SWEEP_INTERVAL_S = 10.0
# A deployment whose queue was full gets no new job from this runner for this long.
FULL_BACKOFF_S = 2.0
# A job still queued after this long is failed and released: its deployment never came back.
MAX_QUEUED = timedelta(hours=24)
# A made job's media is deleted this long after it was made: its download link's lifetime
# (links are signed when the job is queued, so none outlives the media).
RESULT_LIFETIME_S = downloads.VALID_FOR_S


# The job's param naming whose job it is at the engine's fair-share gate (`tenant_param`).
TENANT_PARAM = "tenant"
# What a failed job says when its failure is the platform's (the details go to the log only).
FAILED_MESSAGE = "The generation failed; nothing was charged"


class ChargedFailure(ApiError):
    """A job that failed after its work was done (a voice change whose source held no speech:
    it was decoded and heard in full): failed, and its price settled, not released."""


def tenant_param(tenant: Tenant) -> dict[str, Any]:
    """A tenant as a job's params keep it (JSON)."""
    return {"id": tenant.id, "weight": tenant.weight, "tier": tenant.tier}


def job_tenant(params: Mapping[str, Any]) -> Tenant | None:
    """The tenant a job was queued by; None for a job queued without one."""
    kept = params.get(TENANT_PARAM)
    if not isinstance(kept, dict) or not isinstance(kept.get("id"), str):
        return None
    tier = kept.get("tier")  # absent in a job queued before tiers were kept: the default's
    return Tenant(kept["id"], float(kept.get("weight", 1.0)),
                  tier=tier if isinstance(tier, str) else "default")


def job_cost(model: CatalogModel, job: JobView) -> Cost:
    return Cost(model, tuple(PricedLine(str(t), int(u), int(n), float(p))
                             for t, u, n, p in job.cost_lines))


class JobWorker:
    def __init__(self, queue: JobQueue, results: ResultStore, billing: Billing,
                 catalog: Catalog, router: ModelRouter, *, slots_per_deployment: int = 2,
                 poll_interval_s: float = POLL_INTERVAL_S,
                 makers: Mapping[str, JobMaker] | None = None) -> None:
        self.queue, self.results, self.billing = queue, results, billing
        self.catalog, self.router = catalog, router
        # Job kinds made by a maker rather than by one call to the model's deployment.
        self.makers: dict[str, JobMaker] = dict(makers or {})
        self.slots = slots_per_deployment
        self.poll_interval_s = poll_interval_s
        self.owner = f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"
        self._wake = asyncio.Event()
        self._running: dict[str, set[asyncio.Task]] = defaultdict(set)
        self._full_until: dict[str, float] = {}  # deployment -> monotonic time

    def wake(self) -> None:
        """A job was queued (or a slot freed): look at the table now."""
        self._wake.set()

    def _served(self) -> dict[str, list[str]]:
        """Deployment -> ids of its queued-job models that are running here."""
        served: dict[str, list[str]] = defaultdict(list)
        for model in self.catalog.models:
            if model.type in QUEUED_MODEL_TYPES and self.router.is_online(model):
                served[model.deployment].append(model.id)
        return served

    async def run(self) -> None:
        await run_rounds(self.fill, self.sweep, wake=self._wake,
                         poll_interval_s=self.poll_interval_s,
                         sweep_interval_s=SWEEP_INTERVAL_S, name="job worker")

    async def fill(self) -> None:
        """Claim jobs until every served deployment has its slots busy or nothing waits."""
        for deployment, model_ids in self._served().items():
            running = self._running[deployment]
            if self._full_until.get(deployment, 0.0) > time.monotonic():
                continue
            while len(running) < self.slots:
                job = await self.queue.claim(self.owner, model_ids)
                if job is None:
                    break
                task = asyncio.create_task(self._execute(job, deployment),
                                           name=f"job-{job.queue_id}")
                running.add(task)
                task.add_done_callback(lambda t, r=running: (r.discard(t), self.wake()))

    async def sweep(self) -> None:
        """Fail and release the jobs whose runner died on their last try, and the jobs no
        runner will take; settle the completed jobs whose runner died before settling."""
        served = [m for ids in self._served().values() for m in ids]
        if served:
            for job in await self.queue.worn_out(served):
                await self._fail_unowned(job, self.queue.worn_out_condition(),
                                         "The generation was interrupted and could not be "
                                         "finished; nothing was charged")
        known = [m.id for m in self.catalog.models if m.type in QUEUED_MODEL_TYPES]
        for job in await self.queue.stranded(known, utcnow() - MAX_QUEUED):
            await self._fail_unowned(job, true(), "No deployment could make this job; "
                                                  "nothing was charged")
        for job in await self.queue.completed_unsettled():
            model = self.catalog.by_id.get(job.model_id)
            if model is not None:
                logger.warning("settling job %s, completed without its settlement",
                               job.queue_id)
                await self._settle(job, job_cost(model, job))
        await self.expire()

    async def _fail_unowned(self, job: JobView, condition: Any, message: str) -> None:
        if await self.queue.fail_if(job.queue_id, condition, 500, "INFERENCE_FAILED",
                                    message):
            logger.warning("job %s failed: %s", job.queue_id, message)
            await self._settle(job, None)
            await self._delete_files(job)

    async def expire(self) -> None:
        """Delete the files ended jobs still keep: a failed job's inputs (its runner died
        before deleting them), a made job's media once its download link has expired."""
        made_before = self.queue.clock() - timedelta(seconds=RESULT_LIFETIME_S)
        for job in await self.queue.expired(made_before):
            await self._delete_files(job)

    async def _delete_files(self, job: JobView) -> None:
        """Delete everything the job keeps in the store (inputs and media), then note it. The
        media's key is deleted even when the row names none: a runner may have put it
        without managing to mark the job complete."""
        for stored in (*job.inputs.values(), result_key(job.queue_id)):
            await self.results.delete(stored)
        await self.queue.mark_deleted(job.queue_id)

    async def _drop_if_failed(self, job: JobView) -> None:
        """Media this runner put for a job it no longer owns: deleted when the job has
        failed meanwhile (worn out, withdrawn; its files were deleted before the media came,
        and no sweep looks at it again). A job another runner now makes or made keeps it:
        that runner writes the same key."""
        now = await self.queue.get(job.queue_id)
        if now is None or now.status == JobStatus.FAILED:
            logger.warning("job %s failed while it was being made: its media is deleted",
                           job.queue_id)
            await self.results.delete(result_key(job.queue_id))

    async def _delete_inputs(self, job: JobView) -> None:
        for stored in job.inputs.values():
            await self.results.delete(stored)

    async def _settle(self, job: JobView, cost: Cost | None) -> None:
        """Charge the job `cost` (None: release it), on the bill its intake passed on (the
        hold taken when it was queued, keyed by its request id), as a request's is settled
        (pipeline/bill.py), exactly once."""
        bill = Bill.resume(self.billing, job.request_id,
                           Payer(job.account_id, job.api_key_id,
                                 wallet_address=job.wallet_address), job.created_at)
        bill.deliver(cost)
        await bill.close()

    async def _renew_lease(self, job: JobView, work: asyncio.Task) -> None:
        while not work.done():
            await asyncio.sleep(self.queue.lease.total_seconds() / 3)
            try:
                ours = await self.queue.renew(job.queue_id, self.owner)
            except Exception:  # the database hiccupped: try again at the next beat
                logger.exception("renewing the lease of job %s failed", job.queue_id)
                continue
            if not ours:
                logger.warning("job %s is no longer ours: stopping it", job.queue_id)
                work.cancel()
                return

    async def _execute(self, job: JobView, deployment: str) -> None:
        work = asyncio.create_task(self._make(job))
        renewing = asyncio.create_task(self._renew_lease(job, work))
        try:
            await work
        except asyncio.CancelledError:
            return  # shutting down, or the lease was lost: the job's next runner takes over
        except ApiError as exc:
            if exc.code == "MODEL_AT_CAPACITY":  # its queue is full: try again later
                self._full_until[deployment] = time.monotonic() + FULL_BACKOFF_S
                await self.queue.requeue(job.queue_id, self.owner, count_try=False)
                return
            if exc.code == "MODEL_OFFLINE" and job.attempts < self.queue.max_attempts:
                await self.queue.requeue(job.queue_id, self.owner, count_try=True)
                return
            if exc.status >= 500:  # the platform's failure: its words stay in the log
                logger.warning("job %s failed: %s %s", job.queue_id, exc.code, exc.message)
            message = exc.message if exc.status < 500 else FAILED_MESSAGE
            await self._fail(job, exc.status, exc.code or "INFERENCE_FAILED", message,
                             charged=isinstance(exc, ChargedFailure))
        except Exception:
            logger.exception("job %s failed", job.queue_id)
            await self._fail(job, 500, "INFERENCE_FAILED", FAILED_MESSAGE)
        finally:
            renewing.cancel()

    async def _fail(self, job: JobView, status: int, code: str, message: str, *,
                    charged: bool = False) -> None:
        # The job is marked first: should this replica die before the release, the hold
        # sweeper releases a hold that no open job keeps (and the expiry, its inputs).
        # `charged`: its work was done (ChargedFailure), so its price is settled, and before
        # the job is marked, so that whoever reads it failed (retrieve, its webhook) finds the
        # charge: a replica dying between the two leaves a job tried again, and settling is
        # keyed by the job's request id (once, however often).
        model = self.catalog.by_id.get(job.model_id)
        if charged and model is not None:
            await self._settle(job, job_cost(model, job))
            if await self.queue.fail(job.queue_id, self.owner, status, code, message):
                await self._delete_files(job)
            return
        if await self.queue.fail(job.queue_id, self.owner, status, code, message):
            await self._settle(job, None)
            await self._delete_files(job)

    async def _make(self, job: JobView) -> None:
        model = self.catalog.by_id[job.model_id]  # claimed among the served models
        inputs: dict[str, bytes] = {}
        for name, stored in job.inputs.items():
            data = await self.results.get(stored)
            if data is None:
                raise ApiError(500, f"The job's input {name!r} is missing from the store",
                               code="INFERENCE_FAILED")
            inputs[name] = data
        work = MediaJob(dict(job.params), inputs, job_tenant(job.params))
        maker = self.makers.get(job.kind)
        if maker is not None:
            out = await maker(model, work)
        elif job.kind == "video":
            out = await call_model(self.router.video(model).generate, model.id, model.id, work)
        else:  # queued speech
            out = await call_model(self.router.speech(model).synthesize, model.id, model.id,
                                   work)
        key = result_key(job.queue_id)
        storing = asyncio.ensure_future(self.results.put(key, out.media, out.media_type))
        try:
            await asyncio.shield(storing)  # a lost lease cancels us: the write goes on
        except asyncio.CancelledError:
            with contextlib.suppress(Exception):
                await storing
                await self._drop_if_failed(job)
            raise
        if not await self.queue.complete(job.queue_id, self.owner, key, out.media_type,
                                         job.stored_bytes + len(out.media)):
            logger.warning("job %s finished after it was no longer this runner's",
                           job.queue_id)
            await self._drop_if_failed(job)
            return
        await self._settle(job, job_cost(model, job))
        # Made: the inputs have served (the media stays until it is deleted or expires).
        await self._delete_inputs(job)
        await self.queue.set_stored_bytes(job.queue_id, len(out.media))
