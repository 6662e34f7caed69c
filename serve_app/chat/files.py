"""File parts of chat messages, turned into text before the prompt is built: the model (and
the prompt composer, chat/prompt.py) sees a text part `[File: name]` followed by the file's
text, and the hold is sized from that text.

Plain text is decoded here; PDF, DOCX, PPTX and XLSX go to the extraction workers
(chat/extraction.py) with their caps: size before decoding, pages, decoded streams, zip
members and expanded size, output and time. The workers are few and shared by every tenant, so
one request reads its documents under one of its account's extraction slots (the extractor's
`accounts`, which scraped pages share; else 429), all of them within `request_s`, and waits at
most `queue_wait_s` for a worker (else 503). The caller has shown it can pay before any of this
(chat/serving.py holds the floor first).
"""

from __future__ import annotations

import asyncio
import contextlib

from serve_app.chat.extraction import AccountSlots, ExtractionFailed, Extractor
from serve_app.chat.parts import decode_payload, replace_parts
from serve_app.errors import ApiError, invalid_request, payload_too_large, retry_after
from serve_app.schemas.chat import ChatCompletionRequest, FilePart, TextPart

MAX_FILE_BYTES = 10 * 1024 * 1024
MAX_FILES = 20  # file parts in one request
READERS_BUSY_RETRY_S = 2  # Retry-After while every file reader of the server is busy
_TEXT_SUFFIXES = (".txt", ".md", ".csv", ".json", ".xml", ".html", ".htm", ".py", ".yaml",
                  ".yml", ".log", ".tsv")
_OOXML_TYPES = {
    "application/vnd.openxmlformats-officedocument.wordprocessingml.document": ".docx",
    "application/vnd.openxmlformats-officedocument.presentationml.presentation": ".pptx",
    "application/vnd.openxmlformats-officedocument.spreadsheetml.sheet": ".xlsx",
}
_FIELD = "messages"


def _decode(file_data: str) -> tuple[bytes, str]:
    return decode_payload(file_data, MAX_FILE_BYTES,
                          f"A file is larger than {MAX_FILE_BYTES // (1024 * 1024)} MB",
                          "file_data is not valid base64")


def file_kind(data: bytes, media_type: str, filename: str) -> str:
    """`pdf`, `ooxml` (DOCX, PPTX, XLSX) or `text`; a 400 for anything else."""
    name = filename.lower()
    if media_type == "application/pdf" or name.endswith(".pdf") or data.startswith(b"%PDF"):
        return "pdf"
    if media_type in _OOXML_TYPES or name.endswith((".docx", ".pptx", ".xlsx")) or (
            data.startswith(b"PK\x03\x04") and not media_type.startswith("text/")):
        return "ooxml"
    if media_type.startswith("text/") or media_type in ("application/json", "") \
            or name.endswith(_TEXT_SUFFIXES):
        return "text"
    raise invalid_request(f"files of type {media_type or name!r} cannot be read as text; "
                          "send PDF, DOCX, PPTX, XLSX or UTF-8 text", _FIELD)


def _refusal(failed: ExtractionFailed, filename: str) -> ApiError:
    message = f"The file {filename!r} was refused: {failed.message}"
    if failed.reason == "too_large":
        return payload_too_large(message)
    if failed.reason == "unavailable":
        return ApiError(503, message, code="SERVICE_UNAVAILABLE")
    if failed.reason == "busy":  # the spec's 503: at capacity, try again later
        return ApiError(503, "Every file reader of this server is busy; retry shortly",
                        code="MODEL_AT_CAPACITY", headers=retry_after(READERS_BUSY_RETRY_S))
    return invalid_request(message, _FIELD)


class _AccountSlot:
    """One of the account's extraction slots, taken at the request's first document that
    needs a worker (plain text needs none) and kept until its files are read."""

    def __init__(self, slots: AccountSlots, account_id: str) -> None:
        self.slots, self.account_id = slots, account_id
        self._stack = contextlib.AsyncExitStack()
        self._held = False

    async def take(self) -> None:
        """Nothing waits for a slot: a 429 when the account's are taken."""
        if self._held:
            return
        await self._stack.enter_async_context(self.slots.slot(self.account_id, wait=False))
        self._held = True

    async def __aenter__(self) -> _AccountSlot:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self._stack.aclose()


class FileReader:
    """Turns the file parts of a chat request into text parts, through `extractor`, for at
    most `slots.per_account` requests of one account at a time."""

    def __init__(self, extractor: Extractor) -> None:
        self.extractor = extractor
        self.slots = extractor.accounts  # shared with the scraped pages

    async def text_of(self, part: FilePart, account_id: str) -> str:
        """The text of one file part (under one of the account's slots, as `inline`)."""
        async with _AccountSlot(self.slots, account_id) as slot:
            return await self._read(part, slot)

    async def _read(self, part: FilePart, slot: _AccountSlot) -> str:
        file = part.file
        if not file.file_data:
            raise invalid_request("file parts need file_data (base64 or a data: URL)", _FIELD)
        name = file.filename or "attachment"
        data, media_type = _decode(file.file_data)
        kind = file_kind(data, media_type, file.filename or "")
        max_chars = self.extractor.limits.max_chars
        if kind == "text":
            try:
                return data.decode("utf-8")[:max_chars]
            except UnicodeDecodeError as exc:
                raise invalid_request(f"The file {name!r} is neither UTF-8 text nor a PDF, "
                                      "DOCX, PPTX or XLSX document", _FIELD) from exc
        await slot.take()
        try:
            extracted = await self.extractor.run(kind, data, max_chars=max_chars)
        except ExtractionFailed as failed:
            raise _refusal(failed, name) from failed
        return extracted.text

    async def inline(self, req: ChatCompletionRequest, account_id: str
                     ) -> ChatCompletionRequest:
        """`req` with each file part replaced by a text part of its contents (the same request
        when it has none). One file at a time: a request never holds more than one worker;
        all of its files are read within the limits' `request_s`."""
        parts = [p for m in req.messages if isinstance(m.content, list) for p in m.content
                 if isinstance(p, FilePart)]
        if not parts:
            return req
        if len(parts) > MAX_FILES:
            raise invalid_request(f"at most {MAX_FILES} files may be sent in one request",
                                  _FIELD)
        budget = self.extractor.limits.request_s
        async with _AccountSlot(self.slots, account_id) as slot:
            try:
                async with asyncio.timeout(budget):
                    return await self._inlined(req, slot)
            except TimeoutError as exc:
                raise invalid_request(f"The files could not be read within {budget:g} s (all "
                                      "the files of one request together)", _FIELD) from exc

    async def _inlined(self, req: ChatCompletionRequest, slot: _AccountSlot
                       ) -> ChatCompletionRequest:
        async def as_text(part: FilePart) -> TextPart:
            text = await self._read(part, slot)
            name = part.file.filename or "attachment"
            return TextPart(type="text", text=f"[File: {name}]\n{text}")

        return await replace_parts(req, FilePart, as_text)


def has_files(req: ChatCompletionRequest) -> bool:
    return any(isinstance(p, FilePart) for m in req.messages if isinstance(m.content, list)
               for p in m.content)
