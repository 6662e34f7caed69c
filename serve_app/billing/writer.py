"""Group commit: money operations of one replica run on one worker thread, as many as are
waiting in one transaction. Each caller is answered only after the commit that holds its
operation, so a charge is durable before the request is answered, and a busy replica pays for
one commit per batch instead of one per request.

On SQLite, an operation of a quiet replica (the caller says so) that finds the writer idle
(nothing queued, no batch running) runs at once on the caller's thread instead, in a
transaction that does not wait for the database's lock: a local commit takes a fraction of a
millisecond, less than the two thread handoffs it spares. One that finds the lock taken, or
fails in any other way than a refusal, is rolled back and queued as before. A busy replica's
operations always queue: run on the event loop one by one, they would each pay a commit and
hold the loop, where the queue shares one commit among many.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import queue
import random
import threading
import time
from collections.abc import Callable
from typing import Any, TypeVar

from sqlalchemy.engine import Engine
from sqlalchemy.exc import DBAPIError
from sqlmodel import Session

from serve_app.db.engine import is_database_outage
from serve_app.errors import ApiError

logger = logging.getLogger("serve_app.billing")

T = TypeVar("T")
Operation = Callable[[Session], Any]

MAX_BATCH = 64
RETRIES = 8
OUTAGE_WAIT_S = 30.0  # how long an operation waits for an unreachable database
OUTAGE_POLL_S = 0.5


class _Job:
    __slots__ = ("future", "loop", "op")

    def __init__(self, op: Operation, future: asyncio.Future, loop: asyncio.AbstractEventLoop):
        self.op, self.future, self.loop = op, future, loop

    def answer(self, result: Any = None, error: BaseException | None = None) -> None:
        def deliver() -> None:
            if self.future.done():
                return
            if error is not None:
                self.future.set_exception(error)
            else:
                self.future.set_result(result)

        # The caller's loop may have closed meanwhile (a stopped replica): no one waits for
        # this answer, and the other operations of the batch still get theirs.
        with contextlib.suppress(RuntimeError):
            self.loop.call_soon_threadsafe(deliver)


class BatchWriter:
    """Runs operations (functions of a session) in batched transactions on a worker thread.

    An operation that refuses (raises ApiError, e.g. 402) must do so before it writes: the
    batch goes on without it. A database error (lock timeout, deadlock, serialization) rolls
    the batch back, and its operations are retried one by one; while the database is
    unreachable they wait for it, up to `outage_wait_s`.
    """

    def __init__(self, engine: Engine, max_batch: int = MAX_BATCH,
                 outage_wait_s: float = OUTAGE_WAIT_S, *,
                 inline_engine: Engine | None = None) -> None:
        """`inline_engine`: the same database, through connections that never wait for its
        lock (db/engine.py `make_engine(..., lock_wait_s=0)`): operations that find the
        writer idle run through it on the caller's thread (see above)."""
        self._engine = engine
        self._inline_engine = inline_engine
        self._pending = 0  # operations queued or in a batch not yet answered
        self.outage_wait_s = outage_wait_s
        self._down_since: float | None = None
        self._max_batch = max_batch
        self._jobs: queue.SimpleQueue[_Job | None] = queue.SimpleQueue()
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()
        self.batches = 0
        self.operations = 0
        self.inline = 0  # of the operations, those run on the caller's thread

    def _ensure_thread(self) -> None:
        with self._lock:
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(target=self._run, name="billing-writer",
                                                daemon=True)
                self._thread.start()

    def submit(self, op: Operation) -> asyncio.Future:
        """Queue an operation (operations run in the order they were queued)."""
        loop = asyncio.get_running_loop()
        future: asyncio.Future = loop.create_future()
        self._ensure_thread()
        with self._lock:
            self._pending += 1
        self._jobs.put(_Job(op, future, loop))
        return future

    async def run(self, op: Callable[[Session], T], *, quiet: bool = False) -> T:
        """Run `op` to its commit and return its result. `quiet`: the caller is the only
        request of its replica in flight, so the operation may run on its thread (above)."""
        if quiet and self._inline_engine is not None and self._pending == 0:
            # No await before it runs: a caller cancelled now (a client that hung up) still
            # has its operation committed, as a queued one is.
            ran, result = self._run_inline(op)
            if ran:
                return result  # type: ignore[return-value]
        future = self.submit(op)
        # The operation runs to its commit even if the caller is cancelled (a client that hung
        # up): shield it, so the ledger never misses a write that the database has.
        return await asyncio.shield(future)

    def _run_inline(self, op: Callable[[Session], T]) -> tuple[bool, T | None]:
        """(True, its result) once committed; a refusal (ApiError) is raised as it is, having
        written nothing; (False, None) when it did not run to its commit and was rolled back
        (the lock was taken, a database error): the caller queues it."""
        assert self._inline_engine is not None
        try:
            with Session(self._inline_engine, expire_on_commit=False) as session:
                result = op(session)
                session.commit()
        except ApiError:
            raise
        except Exception as exc:
            logger.debug("billing operation queued after %s on the caller's thread",
                         type(exc).__name__)
            return False, None
        self.inline += 1
        self.operations += 1
        return True, result

    def close(self) -> None:
        if self._thread is not None and self._thread.is_alive():
            self._jobs.put(None)
            self._thread.join(timeout=10)
        if self._inline_engine is not None:
            self._inline_engine.dispose()

    def _run(self) -> None:
        while True:
            first = self._jobs.get()
            if first is None:
                return
            batch = [first]
            while len(batch) < self._max_batch:
                try:
                    job = self._jobs.get_nowait()
                except queue.Empty:
                    break
                if job is None:
                    self._jobs.put(None)
                    break
                batch.append(job)
            try:
                self._run_batch(batch)
            finally:
                with self._lock:
                    self._pending -= len(batch)

    def _run_batch(self, batch: list[_Job]) -> None:
        if len(batch) > 1:
            try:
                results = self._transaction(batch)
            except Exception as exc:
                logger.info("billing batch of %d rolled back (%s); retrying one by one",
                            len(batch), type(exc).__name__)
            else:
                for job, (result, error) in zip(batch, results, strict=True):
                    job.answer(result, error)
                return
        for job in batch:
            self._run_alone(job)

    def _run_alone(self, job: _Job) -> None:
        attempt = 0
        while True:
            try:
                (result, error), = self._transaction([job])
            except DBAPIError as exc:
                if is_database_outage(exc):
                    # The server is down or restarting: wait for it, so that a settle after an
                    # answer the client already has is not lost to a restart of a few seconds.
                    # The writer is one thread, so the operations behind wait too; once the
                    # outage is older than outage_wait_s, each fails after one try.
                    self._down_since = self._down_since or time.monotonic()
                    if time.monotonic() - self._down_since < self.outage_wait_s:
                        time.sleep(OUTAGE_POLL_S)
                        continue
                    job.answer(error=exc)
                    return
                attempt += 1
                if attempt >= RETRIES:
                    job.answer(error=exc)
                    return
                time.sleep(random.uniform(0.001, 0.01) * attempt)
            except Exception as exc:
                job.answer(error=exc)
                return
            else:
                job.answer(result, error)
                return

    def _transaction(self, batch: list[_Job]) -> list[tuple[Any, BaseException | None]]:
        results: list[tuple[Any, BaseException | None]] = []
        with Session(self._engine, expire_on_commit=False) as session:
            for job in batch:
                try:
                    results.append((job.op(session), None))
                except ApiError as exc:  # a refusal: nothing of this operation was written
                    results.append((None, exc))
            session.commit()
        self._down_since = None
        self.batches += 1
        self.operations += len(batch)
        return results
