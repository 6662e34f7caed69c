"""The worker of a background response: it drives a generation detached from the request
that asked for it, on a task of this replica, which owns the billed events from then on. It
numbers nothing itself for a response (the events come numbered, chat/response_objects.py;
a chat stream's it numbers) but appends each to the event log before anyone may read it,
renews its lease on the row, and settles the hold exactly once, where a streamed answer does
(`SETTLE`: what the engine made, whether anyone watched), or when it is cut short (a cancel:
the model is stopped first, then what it made is charged and the rest of the hold released).

A worker that lost its lease while alive finds its next append refused (the sweep ended the
log, or another replica took the response over and claimed it) or its renewal failing: it
stops the engine and writes nothing more; once the response has ended, what the model made is
charged only if its hold is still there (a replica that took it over settled it for all)."""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from datetime import timedelta

from serve_app.errors import ApiError, stream_error_body
from serve_app.pipeline.bill import SETTLE, Bill, BilledEvents, aclose
from serve_app.responses.events import EventLog
from serve_app.responses.progress import Progress, compact
from serve_app.responses.store import ResponseStore

logger = logging.getLogger("serve_app.responses")

STOPPED = "The generation was stopped (the Gateway replica that ran it shut down)"


class LeaseLost(Exception):
    """The response is no longer this worker's: the sweep of another replica failed it."""


@dataclass(eq=False)
class Drive:
    task: asyncio.Task
    cancelled: bool = False  # by a cancel (not by a shutdown)
    lost: bool = False  # its lease (the sweep ended the response)
    handing_over: bool = False  # stopped by its replica's shutdown: another may continue it


class Drives:
    """The generations this replica drives (`owner`: its name on their leases). `notify`
    wakes the readers of a response's new events, `ended` those of its end (follow.py)."""

    def __init__(self, store: ResponseStore, events: EventLog, *, owner: str,
                 kept: timedelta, notify: Callable[[str], None],
                 ended: Callable[[str], Awaitable[None]]) -> None:
        self.store, self.events, self.owner, self.kept = store, events, owner, kept
        self.notify, self.ended = notify, ended
        self.running: dict[str, Drive] = {}
        self._endings: set[asyncio.Task] = set()
        self._leaving: set[asyncio.Task] = set()  # bills of lost leases, settled at the end

    def start(self, response_id: str, source: BilledEvents, progress: Progress) -> Drive:
        """Drive `source` (whose row is written, leased to this replica) on a task."""
        task = asyncio.create_task(self._drive(response_id, source, progress),
                                   name=f"response-{response_id}")
        drive = self.running[response_id] = Drive(task)
        task.add_done_callback(lambda done: self._unstarted(done, response_id, source, progress))
        return drive

    def _unstarted(self, task: asyncio.Task, response_id: str, source: BilledEvents,
                   progress: Progress) -> None:
        """A drive cancelled before its first step runs none of its code: it still ends
        (its hold released, its row written), on a task of its own."""
        if task.cancelled() and not progress.ending:
            ending = asyncio.create_task(self._finish(response_id, source, progress,
                                                      asyncio.CancelledError()))
            self._endings.add(ending)
            ending.add_done_callback(self._endings.discard)

    async def cancel(self, response_id: str) -> bool:
        """Stop the generation driven here (False: none is): it ends cancelled."""
        drive = self.running.get(response_id)
        if drive is None:
            return False
        drive.cancelled = True
        drive.task.cancel()
        await asyncio.wait([drive.task])
        if self._endings:  # it was cancelled before its first step: it ends aside
            await asyncio.wait(list(self._endings))
        return True

    async def stop(self) -> None:
        """Stop every generation driven here: one that keeps what would continue it is
        handed over (its lease given up, its hold left for the replica that takes it over);
        any other charges what it made and fails."""
        drives = list(self.running.values())
        for drive in drives:
            drive.handing_over = True
            drive.task.cancel()
        if drives:
            await asyncio.wait([drive.task for drive in drives])
        if self._endings:
            await asyncio.wait(list(self._endings))
        leaving = list(self._leaving)
        for task in leaving:
            task.cancel()
        if leaving:
            await asyncio.wait(leaving)

    # -- one generation

    async def _record(self, response_id: str, event: str, progress: Progress) -> None:
        if progress.chat:
            await self._record_chunk(response_id, event, progress)
            return
        payload = json.loads(event.split("data: ", 1)[1])
        if "response" in payload:  # the object the events carry has the stored one's id
            payload["response"]["id"] = response_id
        data = compact(payload)
        if payload["type"] == "response.output_text.delta" and progress.note_prompt is not None:
            await self._note_prompt(response_id, progress)
        if not await self.events.append(response_id, int(payload["sequence_number"]), data,
                                        self.owner):
            raise LeaseLost(response_id)
        progress.saw(payload, len(data))
        if payload["type"] == "response.created" and not await self.store.write(
                response_id, self.owner, status="in_progress", response=progress.response):
            raise LeaseLost(response_id)
        self.notify(response_id)

    async def _note_prompt(self, response_id: str, progress: Progress) -> None:
        """Keep the prompt's tokens with the continuation before any text is kept: whoever
        continues the text counts what it was made of from them."""
        assert progress.note_prompt is not None
        noted = progress.note_prompt()
        if noted is None:  # not known yet
            return
        progress.note_prompt = None
        if not await self.store.write(response_id, self.owner, continuation=noted):
            raise LeaseLost(response_id)
        progress.kept_bytes = len(noted)

    async def _record_chunk(self, response_id: str, event: str, progress: Progress) -> None:
        """A chat stream's event (a chunk, an error, `[DONE]`), numbered here."""
        data = event.split("data: ", 1)[1].rstrip("\n")
        if data != "[DONE]":
            payload = json.loads(data)
            if "id" in payload:  # the chunks carry the stream's id
                payload["id"] = response_id
            progress.failed = progress.failed or "error" in payload
            data = compact(payload)
        seq = progress.seq + 1
        if not await self.events.append(response_id, seq, data, self.owner):
            raise LeaseLost(response_id)
        progress.seq, progress.stored_bytes = seq, progress.stored_bytes + len(data)
        self.notify(response_id)

    async def _drive(self, response_id: str, source: BilledEvents, progress: Progress) -> None:
        renewing = asyncio.create_task(self._renew(response_id, progress))
        failure: BaseException | None = None
        try:
            async for event in source.events:
                if event is SETTLE:
                    break
                assert isinstance(event, str)
                await self._record(response_id, event, progress)
        except BaseException as exc:  # a cancel, a shutdown, a failure of the model's
            failure = exc
        try:
            await asyncio.shield(self._finish(response_id, source, progress, failure))
        finally:
            renewing.cancel()

    async def _finish(self, response_id: str, source: BilledEvents, progress: Progress,
                      failure: BaseException | None) -> None:
        progress.ending = True
        try:
            await self._end(response_id, source, progress, failure)
        except LeaseLost:  # ended by the sweep while this end was written: its end stands
            logger.warning("background response %s was ended by the sweep", response_id)
        except Exception:
            logger.exception("background response %s did not end cleanly", response_id)
        finally:
            self.running.pop(response_id, None)
            await self.ended(response_id)

    async def _end(self, response_id: str, source: BilledEvents, progress: Progress,
                   failure: BaseException | None) -> None:
        """Settle once (the model stopped first when cut short), keep the last events, and
        write the response's end."""
        drive = self.running.get(response_id)
        lost = isinstance(failure, LeaseLost) or (drive is not None and drive.lost)
        if lost:  # never charged once released (the sweep's verdict stands)
            source.billed.charge_only_if_held()
        handed = False
        try:
            if failure is not None:  # a source with a stop of its own is stopped by it
                await source.halt()
        finally:
            if lost:
                await self._leave(response_id, source.billed)
            else:
                handed = await self._hand_over(response_id, drive, failure)
                if handed:
                    source.billed.pass_on()  # settled by the replica that takes it over
                else:
                    await source.billed.close(failure)
        if lost:
            logger.warning("background response %s is no longer this worker's (taken over, "
                           "or failed by the sweep): it stopped", response_id)
            return
        if handed:
            logger.info("background response %s handed over: this replica stops",
                        response_id)
            return
        if failure is None:
            async for event in source.events:  # the last ones: response.completed (failed)
                assert isinstance(event, str)
                await self._record(response_id, event, progress)
            if progress.chat:
                status = "failed" if progress.failed else "completed"
            else:
                status = "completed" if progress.last_kind == "response.completed" \
                    else "failed"
            final = {**progress.response, "status": status}
        else:
            if drive is not None and drive.cancelled:
                final = progress.cut_short("cancelled")
            else:
                error = failure if isinstance(failure, ApiError) else ApiError(
                    500, STOPPED if isinstance(failure, asyncio.CancelledError)
                    else "Inference failed", code="INFERENCE_FAILED")
                if not isinstance(failure, (ApiError, asyncio.CancelledError)):
                    logger.error("background response %s failed", response_id,
                                 exc_info=failure)
                final = {**progress.cut_short("failed"),
                         "error": stream_error_body(error, "responses")}
                if progress.chat:  # the chat stream's error event, then its end
                    await self._record(response_id, "data: " + compact(
                        stream_error_body(error, "chat")), progress)
                    await self._record(response_id, "data: [DONE]", progress)
                else:
                    failed = {"type": "response.failed", "sequence_number": progress.seq + 1,
                              "response": final}
                    await self._record(response_id, f"data: {compact(failed)}\n\n",
                                       progress)
        size = progress.stored_bytes + len(compact(final))
        await self.store.write(response_id, self.owner, status=final["status"],
                               response=final, stored_bytes=size, ended=True,
                               kept_for=self.kept)

    async def _hand_over(self, response_id: str, drive: Drive | None,
                         failure: BaseException | None) -> bool:
        """A generation stopped by its replica's shutdown (not by a cancel) whose response
        can be continued: its lease given up, for another replica's sweep (True)."""
        if drive is None or not drive.handing_over or drive.cancelled \
                or not isinstance(failure, asyncio.CancelledError):
            return False
        try:
            return await self.store.hand_over(response_id, self.owner)
        except Exception:  # the database: it fails here, as before takeovers existed
            logger.exception("handing response %s over failed", response_id)
            return False

    async def _leave(self, response_id: str, billed: Bill) -> None:
        """Settle the bill of a worker whose response is no longer its own, once the
        response has ended: its hold may be another's now (a replica took the response over,
        and settles it for all that was made), or the sweep failed it (then what this worker
        made is charged while the hold is still there). Charged only if still held, so
        never twice. Read once here; a response still open is waited for aside."""
        if await self._still_open(response_id):
            leaving = asyncio.create_task(self._settle_when_ended(response_id, billed))
            self._leaving.add(leaving)
            leaving.add_done_callback(self._leaving.discard)
            return
        await billed.close(LeaseLost(response_id))

    async def _still_open(self, response_id: str) -> bool:
        try:
            view = await self.store.get(response_id)
        except Exception:  # unknown: taken as open, read again later
            logger.exception("reading response %s failed", response_id)
            return True
        return view is not None and not view.ended

    async def _settle_when_ended(self, response_id: str, billed: Bill) -> None:
        try:
            while await self._still_open(response_id):
                await asyncio.sleep(self.store.lease.total_seconds() / 3)
        except asyncio.CancelledError:  # shutting down: the hold is left to its new worker
            billed.pass_on()
            raise
        await billed.close(LeaseLost(response_id))

    async def _renew(self, response_id: str, progress: Progress) -> None:
        """Keep the lease while the generation runs, note its bytes, and stop it when a
        cancel was asked through another replica, or the lease was lost."""
        while True:
            await asyncio.sleep(self.store.lease.total_seconds() / 3)
            try:
                ours = await self.store.write(
                    response_id, self.owner,
                    stored_bytes=progress.stored_bytes + progress.kept_bytes)
                view = await self.store.get(response_id)
            except Exception:  # the database hiccupped: try again at the next beat
                logger.exception("renewing the lease of response %s failed", response_id)
                continue
            drive = self.running.get(response_id)
            if drive is None:
                return
            if view is None or not ours or view.cancel_requested:
                if not ours:
                    logger.warning("response %s is no longer ours: stopping it", response_id)
                drive.cancelled = view is not None and view.cancel_requested
                drive.lost = not ours
                drive.task.cancel()
                return


async def abandon(source: BilledEvents, failure: BaseException) -> None:
    """A generation that will not run: its events closed (the model never started), its hold
    released."""
    try:
        await aclose(source.events)
    finally:
        await source.billed.close(failure)
