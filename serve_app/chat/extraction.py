"""Text extraction off the event loop: a few worker processes (chat/extract_worker.py) that
parse untrusted files and pages, each job under a deadline. A thread cannot be stopped, a
process can: a job that misses its deadline (or whose request is cancelled) has its worker
killed and replaced, so a pathological PDF costs one worker at most the deadline, and the
Gateway's event loop only ever writes and reads pipes.

Workers start on first use and stay for later jobs; jobs beyond the pool's size wait for a
free worker, at most `queue_wait_s` (then ExtractionFailed `busy`: the pool is shared by every
tenant of the replica, so a caller is told to retry rather than left waiting). The deadline
counts from the moment the job is handed to a ready worker.

The pool is shared fairly: every job of a request runs under one of its account's slots
(`accounts`, `EXTRACTIONS_PER_ACCOUNT` at a time per replica: file parts, chat/files.py, and
scraped pages, chat/web.py), so one account never holds more of the workers than that. Workers
start with a minimal environment: none of the Gateway's secrets (admin key, database URL,
provider keys) reach a process that parses untrusted bytes.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import struct
import sys
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from serve_app.jobs.caps import over_cap

logger = logging.getLogger("serve_app.chat.extraction")

_SOURCE_ROOT = str(Path(__file__).resolve().parents[2])  # where `serve_app` is importable
_WORKER_START_S = 60.0  # a worker's own start (Python and its parsers), under load
EXTRACTIONS_PER_ACCOUNT = 1  # requests of one account with documents or pages parsed at once
# What a worker inherits of the Gateway's environment: the interpreter's needs, nothing else.
_WORKER_ENVIRONMENT = ("PATH", "HOME", "LANG", "LC_ALL", "LC_CTYPE", "TMPDIR", "PYTHONHOME")


def worker_environment(parent: Mapping[str, str]) -> dict[str, str]:
    """The environment a worker starts with: `_WORKER_ENVIRONMENT` of `parent`, and
    PYTHONPATH with the Gateway's sources first."""
    env = {name: parent[name] for name in _WORKER_ENVIRONMENT if name in parent}
    env["PYTHONPATH"] = os.pathsep.join(p for p in (_SOURCE_ROOT, parent.get("PYTHONPATH"))
                                        if p)
    return env


class AccountSlots:
    """At most `per_account` extraction requests of one account at a time in this replica.
    A file request is refused at once when they are taken (429, `slot(wait=False)`); a
    scraped page waits for one (its scrape's deadline bounds the wait)."""

    def __init__(self, per_account: int = EXTRACTIONS_PER_ACCOUNT) -> None:
        self.per_account = max(1, per_account)
        self._gates: dict[str, asyncio.Semaphore] = {}
        self._users: dict[str, int] = {}  # holders and waiters, per account
        self._held: dict[str, int] = {}

    def busy(self, account_id: str) -> int:
        """Slots of the account taken now."""
        return self._held.get(account_id, 0)

    def waiting(self, account_id: str) -> int:
        """The account's jobs waiting for one of its slots."""
        return self._users.get(account_id, 0) - self.busy(account_id)

    @contextlib.asynccontextmanager
    async def slot(self, account_id: str, *, wait: bool = False) -> AsyncIterator[None]:
        if not wait and self.busy(account_id) >= self.per_account:
            raise over_cap(f"Documents of {self.per_account} other request(s) of this account "
                           f"are being read; at most {self.per_account} at a time: retry "
                           "once one is answered")
        gate = self._gates.setdefault(account_id, asyncio.Semaphore(self.per_account))
        self._users[account_id] = self._users.get(account_id, 0) + 1
        try:
            async with gate:
                self._held[account_id] = self._held.get(account_id, 0) + 1
                try:
                    yield
                finally:
                    self._held[account_id] -= 1
        finally:
            left = self._users[account_id] - 1
            if left:
                self._users[account_id] = left
            else:  # nobody holds or waits: the account costs nothing here
                del self._users[account_id], self._gates[account_id]
                self._held.pop(account_id, None)


@dataclass(frozen=True)
class ExtractionLimits:
    deadline_s: float = 15.0  # one file or page, once a worker has it
    request_s: float = 30.0  # every file of one chat request together, waits included
    queue_wait_s: float = 10.0  # the most a job waits for a free worker
    max_chars: int = 100_000  # text kept of one file
    max_pages: int = 500  # a PDF with more is refused
    max_stream_bytes: int = 8 * 1024 * 1024  # one PDF stream, decoded
    max_members: int = 2_000  # parts of an OOXML zip
    max_unzipped_bytes: int = 64 * 1024 * 1024  # an OOXML zip, expanded
    memory_bytes: int = 1024 * 1024 * 1024  # a worker's address space


class ExtractionFailed(Exception):
    """A file that cannot be turned into text. `reason`: `too_large`, `too_many_pages`,
    `unreadable`, `timed_out`, `unavailable` (no worker could start) or `busy` (no worker was
    free within `queue_wait_s`); `message` is for the client."""

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(message)
        self.reason = reason
        self.message = message


@dataclass(frozen=True)
class Extracted:
    text: str
    title: str = ""
    pages: int = 0
    truncated: bool = False


class _Worker:
    def __init__(self, process: asyncio.subprocess.Process) -> None:
        self.process = process
        self.jobs = 0

    @property
    def pid(self) -> int:
        return self.process.pid

    async def answer(self, max_size: int) -> dict[str, Any]:
        assert self.process.stdout is not None
        (size,) = struct.unpack(">I", await self.process.stdout.readexactly(4))
        if size > max_size:
            raise ExtractionFailed("unreadable", "the file's text could not be read")
        return json.loads(await self.process.stdout.readexactly(size))

    async def ask(self, header: dict[str, Any], data: bytes, max_size: int) -> dict[str, Any]:
        assert self.process.stdin is not None
        head = json.dumps(header).encode()
        self.process.stdin.write(struct.pack(">II", len(head), len(data)) + head)
        self.process.stdin.write(data)
        await self.process.stdin.drain()
        self.jobs += 1
        return await self.answer(max_size)

    async def kill(self) -> None:
        with contextlib.suppress(ProcessLookupError):
            self.process.kill()
        with contextlib.suppress(Exception):
            await asyncio.shield(self.process.wait())


class Extractor:
    """The pool of extraction workers of one Gateway replica."""

    def __init__(self, workers: int = 2, limits: ExtractionLimits | None = None,
                 per_account: int = EXTRACTIONS_PER_ACCOUNT) -> None:
        self.size = max(1, workers)
        self.limits = limits or ExtractionLimits()
        self.accounts = AccountSlots(per_account)  # every caller's jobs run under one
        self._idle: list[_Worker] = []
        self._all: set[_Worker] = set()
        self._slots: asyncio.Semaphore | None = None
        self._closed = False
        self.busy = 0  # jobs handed to a worker and not answered yet

    @property
    def worker_pids(self) -> list[int]:
        """The workers alive now (idle or busy)."""
        return [w.pid for w in self._all if w.process.returncode is None]

    async def _spawn(self) -> _Worker:
        env = worker_environment(os.environ)
        process = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "serve_app.chat.extract_worker",
            str(self.limits.memory_bytes), stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.DEVNULL, env=env)
        worker = _Worker(process)
        self._all.add(worker)
        try:
            await asyncio.wait_for(worker.answer(64), _WORKER_START_S)
        except BaseException as exc:
            await self._discard(worker)
            if isinstance(exc, asyncio.CancelledError):
                raise
            logger.error("an extraction worker did not start: %r", exc)
            raise ExtractionFailed("unavailable", "files cannot be read right now") from exc
        return worker

    async def _discard(self, worker: _Worker) -> None:
        self._all.discard(worker)
        await worker.kill()

    async def run(self, kind: str, data: bytes, *, content_type: str = "",
                  max_chars: int | None = None, deadline_s: float | None = None) -> Extracted:
        """The text of `data` (`kind`: `pdf`, `ooxml` or `html`), by a worker within the
        deadline; ExtractionFailed otherwise."""
        if self._closed:
            raise ExtractionFailed("unavailable", "files cannot be read right now")
        limits = self.limits
        max_chars = max_chars or limits.max_chars
        deadline = deadline_s or limits.deadline_s
        header = {"kind": kind, "content_type": content_type, "max_chars": max_chars,
                  "max_pages": limits.max_pages, "max_stream_bytes": limits.max_stream_bytes,
                  "max_members": limits.max_members,
                  "max_unzipped_bytes": limits.max_unzipped_bytes}
        if self._slots is None:
            self._slots = asyncio.Semaphore(self.size)
        try:
            async with asyncio.timeout(limits.queue_wait_s):
                await self._slots.acquire()  # a permit granted as it times out is given back
        except TimeoutError as exc:
            raise ExtractionFailed("busy", "every file reader of this server is busy") from exc
        try:
            worker = self._idle.pop() if self._idle else None
            if worker is None or worker.process.returncode is not None:  # died while idle
                if worker is not None:
                    await self._discard(worker)
                worker = await self._spawn()
            answered: dict[str, Any] | None = None
            self.busy += 1
            try:
                answered = await asyncio.wait_for(
                    worker.ask(header, data, 12 * max_chars + 65_536), deadline)
            except TimeoutError as exc:
                raise ExtractionFailed("timed_out", f"the file could not be read within "
                                                    f"{deadline:g} s") from exc
            except (asyncio.IncompleteReadError, ConnectionError, ValueError) as exc:
                logger.warning("an extraction worker failed: %r", exc)
                raise ExtractionFailed("unreadable", "the file could not be read") from exc
            finally:
                self.busy -= 1
                if answered is not None and answered.get("ok") and not self._closed:
                    self._idle.append(worker)
                else:  # timed out, cancelled, broken, or a failure that may have hurt it
                    await self._discard(worker)
        finally:
            self._slots.release()
        assert answered is not None
        if not answered.get("ok"):
            raise ExtractionFailed(str(answered.get("reason", "unreadable")),
                                   str(answered.get("message", "the file could not be read")))
        return Extracted(text=str(answered.get("text", "")),
                         title=str(answered.get("title", "")),
                         pages=int(answered.get("pages", 0)),
                         truncated=bool(answered.get("truncated")))

    async def close(self) -> None:
        self._closed = True
        workers, self._idle = list(self._all), []
        for worker in workers:
            await self._discard(worker)
