"""One media job on its way into the queue, in the order that keeps abuse cheap:

0. entered (`async with`), the job's bill (pipeline/bill.py) starts the limiter's decision;
   the service checks the request meanwhile (its 400s come after a 429);
1. `admit`: held before anything is read: the job's price when it is known without its
   inputs, otherwise its floor, the least it can cost given what the request says (an
   account that cannot pay that gets its 402 before any byte is fetched), then the model
   online (503); then the account's caps on open jobs and stored bytes (caps.py, 429);
2. `keep`: each input, once read and checked, is spooled to the result store under the job's
   key and dropped from memory (one at a time, never all of them at once), within the
   account's stored-bytes cap;
3. `hold`: the job's real price, once the inputs told it (an upscale's length), replaces the
   first hold (`Bill.rehold`, as a chat's files do);
4. `queue`: the row is written, with the caller's fair-share tenant among its params (the
   job takes its turns at the engines as the account that queued it, as its direct requests
   do), and the bill passed on; the job worker takes the job and its hold from there
   (`Bill.resume`).

Used as `async with`: whatever fails on the way releases the hold and deletes what was kept,
so nothing is charged or stored for a job that was not queued.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from contextlib import AbstractAsyncContextManager
from types import TracebackType

from serve_app.accounts.key_store import KeyRecord
from serve_app.billing.pricing import Cost, PricedLine
from serve_app.db.tables import JobRow
from serve_app.jobs.caps import JobCaps, PendingIntakes, over_cap
from serve_app.jobs.job_queue import JobQueue, JobView, input_key, result_key
from serve_app.jobs.store import ResultStore
from serve_app.jobs.worker import TENANT_PARAM, JobWorker, tenant_param
from serve_app.models.router import RoutedModel
from serve_app.pipeline.bill import Bill
from serve_app.pipeline.context import RequestContext
from serve_app.pipeline.runner import RequestRunner

logger = logging.getLogger("serve_app.jobs")

# The least a hold before the inputs are read may be: the job's floor (the least it can
# cost given what the request says, pricing/video.py `floor_plan`), and never nothing.
FLOOR_HOLD_NANOS = 1


def least_hold(floor: Cost) -> Cost:
    """What admits a job whose price is known only once its inputs are read: its floor, or
    one nano when the floor is free (the account must still be able to pay something)."""
    if floor.nanos >= FLOOR_HOLD_NANOS:
        return floor
    return Cost(floor.model, (PricedLine("video_seconds", 0, FLOOR_HOLD_NANOS, 0.0),))


class JobIntake:
    """A job's intake (the module's docstring); `async with` it."""

    def __init__(self, *, request_runner: RequestRunner, jobs: JobQueue,
                 results: ResultStore, worker: JobWorker, caps: JobCaps,
                 pending: PendingIntakes, ctx: RequestContext, key: KeyRecord,
                 routed: RoutedModel, kind: str, callback_url: str | None = None) -> None:
        self.jobs = jobs
        self.results, self.worker, self.caps = results, worker, caps
        self.pending = pending
        self.ctx, self.key, self.routed = ctx, key, routed
        model = routed.model
        self.job = JobRow(kind=kind, model_id=model.id, request_id=ctx.request_id,
                            account_id=key.account_id,
                            api_key_id=key.id if not key.wallet_address else None,
                            wallet_address=key.wallet_address, callback_url=callback_url)
        self.job.inputs = {}
        self.kept_bytes = 0
        self._reserved = False  # counted in `pending` until its row is written or it fails
        self._billing: AbstractAsyncContextManager[Bill] = request_runner.admit(ctx, key,
                                                                                routed)
        self._tenant = request_runner.admission.tenant(key)  # whose turn it is at the engines
        self._bill: Bill | None = None
        self._written = False
        self._queued = False

    @property
    def queue_id(self) -> str:
        return self.job.queue_id

    @property
    def bill(self) -> Bill:
        assert self._bill is not None, "enter the intake first"
        return self._bill

    async def admit(self, least: Cost) -> None:
        """Hold `least`: the job's price, or, when that is known only once the inputs are
        read, its floor (the least it can cost: `hold` replaces it); the bill orders the
        refusals (429, the service's 400s, 403, 402, 503). Then 429 when the account has its
        most open jobs or stored bytes."""
        await self.bill.hold(least_hold(least))
        account = self.key.account_id
        async with self.pending.lock(account):  # check and reserve, one request at a time
            open_jobs, stored = await self.jobs.account_usage(account)
            self.caps.check_open(open_jobs + self.pending.jobs(account))
            self.caps.check_stored(stored + self.pending.bytes(account))
            self.pending.add(account, jobs=1)
            self._reserved = True

    async def keep(self, name: str, data: bytes, media_type: str) -> None:
        """Spool one checked input to the result store (the caller then drops its bytes);
        429 when it would take the account past its stored-bytes cap (what its jobs keep,
        and what this replica's jobs not yet written keep, this one's included)."""
        account = self.key.account_id
        async with self.pending.lock(account):
            _, stored = await self.jobs.account_usage(account)
            self.caps.check_stored(stored + self.pending.bytes(account), len(data))
            self.pending.add(account, kept=len(data))
            self.kept_bytes += len(data)
        stored_key = input_key(self.job.queue_id, name)
        # named before the write: deleted on failure even if the write got halfway
        self.job.inputs = {**self.job.inputs, name: stored_key}
        await self.results.put(stored_key, data, media_type)

    async def hold(self, cost: Cost) -> None:
        """Hold the job's real price in place of what `admit` held (402 when the account
        cannot pay it: the first hold is then already given back)."""
        await self.bill.rehold(cost)

    async def queue(self, cost: Cost, params: dict) -> JobView:
        """Write the job at `cost` (what was held), `params` with the caller's tenant. The
        write finishes even when the client leaves meanwhile, so that its outcome is known: a
        job its client never heard of is withdrawn (nobody could retrieve it), and released
        on the way out."""
        assert cost.nanos == self.bill.held_nanos, "hold the job's price before queueing it"
        job = self.job
        job.params = {**params, TENANT_PARAM: tenant_param(self._tenant)}
        job.stored_bytes = self.kept_bytes
        job.cost_lines = [[line.line_type, line.units, line.nanos, line.price_per_unit_usd]
                          for line in cost.lines]
        async with self.pending.lock(job.account_id):
            view = await self._write(job)
            self._unreserve()  # its row counts now
        self._queued = True
        self.bill.pass_on()  # the job keeps its hold: the job worker settles it
        self.worker.wake()
        return view

    async def _write(self, job: JobRow) -> JobView:
        """The row, written only if the account's caps still hold (another replica may have
        taken the last place meanwhile: 429). The write finishes even when the client leaves
        meanwhile; a job written for a client that left is withdrawn."""
        writing = asyncio.ensure_future(
            self.jobs.add_within(job, self.caps.open_jobs, self.caps.stored_bytes))
        try:
            with self.ctx.step("queue"):
                view = await asyncio.shield(writing)
        except BaseException as exc:
            with contextlib.suppress(BaseException):
                if await writing is not None:
                    self._written = True
                    if isinstance(exc, asyncio.CancelledError):
                        await self.jobs.withdraw(job.queue_id, "The client left before the "
                                                               "job was queued; nothing was "
                                                               "charged")
            raise
        if view is None:
            open_jobs, stored = await self.jobs.account_usage(job.account_id)
            self.caps.check_open(open_jobs)
            self.caps.check_stored(stored, job.stored_bytes)
            raise over_cap("This account's jobs reached their cap while this one was being "
                           "queued; retry once one has finished")
        return view

    def _unreserve(self) -> None:
        if self._reserved:
            self.pending.add(self.key.account_id, jobs=-1, kept=-self.kept_bytes)
            self._reserved = False

    async def __aenter__(self) -> JobIntake:
        self._bill = await self._billing.__aenter__()
        return self

    async def __aexit__(self, exc_type: type[BaseException] | None,
                        exc: BaseException | None, tb: TracebackType | None) -> None:
        """A job not queued is charged nothing and keeps nothing: the hold goes back (the
        bill's exit: a 429 of the limiter still answers first), the inputs go."""
        if self._queued:
            await self._billing.__aexit__(exc_type, exc, tb)  # passed on: nothing to do
            return
        self._unreserve()
        try:
            await self._billing.__aexit__(exc_type, exc, tb)
        finally:
            await self._delete_kept()

    async def _delete_kept(self) -> None:
        # a withdrawn job's media too: a runner may have made it before the withdrawal
        kept = [*self.job.inputs.values(), *([result_key(self.queue_id)] if self._written
                                             else [])]
        all_gone = True
        for stored in kept:
            try:
                await self.results.delete(stored)
            except Exception:  # the expiry sweep deletes it with its withdrawn job
                all_gone = False
                logger.warning("could not delete %s of job %s", stored, self.job.queue_id,
                               exc_info=True)
        if self._written and all_gone:  # else left to the sweep, which then looks again
            with contextlib.suppress(Exception):
                await self.jobs.mark_deleted(self.job.queue_id)
