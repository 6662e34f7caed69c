"""File parts of chat messages, extracted to text before the model sees them."""

from __future__ import annotations

import base64
import binascii
import io
import re

from serve_app.errors import invalid_request

MAX_FILE_BYTES = 10 * 1024 * 1024
MAX_FILE_CHARS = 100_000
_DATA_URL = re.compile(r"^data:([\w.+/-]+)?(;[\w=.-]+)*;base64,", re.I)
_TEXT_SUFFIXES = (".txt", ".md", ".csv", ".json", ".xml", ".html", ".htm", ".py", ".yaml",
                  ".yml", ".log", ".tsv")


def _decode(file_data: str) -> tuple[bytes, str]:
    media_type = ""
    match = _DATA_URL.match(file_data)
    if match:
        media_type = (match.group(1) or "").lower()
        file_data = file_data[match.end():]
    # Check the size before decoding: base64 is 4 characters per 3 bytes.
    if len(file_data) * 3 // 4 > MAX_FILE_BYTES:
        raise invalid_request(f"file is larger than {MAX_FILE_BYTES // (1024 * 1024)} MB",
                              "messages")
    try:
        return base64.b64decode(file_data, validate=True), media_type
    except (binascii.Error, ValueError) as exc:
        raise invalid_request("file_data is not valid base64", "messages") from exc


def _pdf_text(data: bytes) -> str:
    from pypdf import PdfReader
    from pypdf.errors import PdfReadError

    try:
        reader = PdfReader(io.BytesIO(data))
        return "\n\n".join(page.extract_text() or "" for page in reader.pages)
    except (PdfReadError, ValueError, KeyError) as exc:
        raise invalid_request(f"the PDF could not be read: {exc}", "messages") from exc


def extract_file_text(file_data: str | None, filename: str | None) -> str:
    if not file_data:
        raise invalid_request("file parts need file_data (base64 or a data: URL)", "messages")
    data, media_type = _decode(file_data)
    name = (filename or "").lower()
    if media_type == "application/pdf" or name.endswith(".pdf") or data.startswith(b"%PDF"):
        text = _pdf_text(data)
    elif media_type.startswith("text/") or media_type in ("application/json", "") \
            or name.endswith(_TEXT_SUFFIXES):
        try:
            text = data.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise invalid_request("the file is neither UTF-8 text nor a PDF",
                                  "messages") from exc
    else:
        raise invalid_request(f"files of type {media_type or name!r} cannot be read as text",
                              "messages")
    return text[:MAX_FILE_CHARS]
