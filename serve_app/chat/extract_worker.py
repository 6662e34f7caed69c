"""The extraction worker: a child process of a Gateway replica that turns untrusted files (PDF,
DOCX, PPTX, XLSX) and scraped HTML into text, so that no parser ever runs on the Gateway's
event loop. The parent (chat/extraction.py) kills it when a job misses its deadline; here each
job is bounded by a page cap, the decoders' output caps and an output cap, and the whole
process by an address-space limit and a lower CPU priority.

Run as `python -m serve_app.chat.extract_worker MEMORY_BYTES`. It speaks length-prefixed
frames on stdin/stdout: a job is `>II` (header length, data length), a JSON header
(`kind`, `max_chars`, `max_pages`, `max_stream_bytes`, `max_members`, `max_unzipped_bytes`,
`content_type`) and the data; each answer (and one `{}` once ready) is `>I` length and JSON:
`{ok, text, title, pages, truncated}` or `{ok: false, reason, message}`. Imports nothing of
the Gateway but the OOXML reader.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import re
import struct
import sys
from typing import Any, BinaryIO

from serve_app.chat.ooxml import Refused, ZipLimits, ooxml_text

_HIDDEN_TAGS = ["script", "style", "noscript", "template", "svg"]


def _confine(memory_bytes: int) -> None:
    import resource

    if memory_bytes > 0:
        with contextlib.suppress(ValueError, OSError):
            resource.setrlimit(resource.RLIMIT_AS, (memory_bytes, memory_bytes))
    with contextlib.suppress(OSError):
        os.nice(10)  # the Gateway's event loop comes first on a small machine


def _pdf(data: bytes, header: dict[str, Any]) -> dict[str, Any]:
    from pypdf import PdfReader, overwrite_configuration
    from pypdf.errors import FileNotDecryptedError, LimitReachedError, PdfReadError, PyPdfError

    cap = int(header["max_stream_bytes"])
    overwrite_configuration(
        zlib_maximum_output_length=cap, lzw_maximum_output_length=cap,
        run_length_maximum_output_length=cap, brotli_maximum_output_length=cap,
        array_based_stream_maximum_output_length=cap, maximum_declared_stream_length=cap,
        image_maximum_buffer_size=cap, disable_legacy_handling=True)
    max_chars, max_pages = int(header["max_chars"]), int(header["max_pages"])
    try:
        reader = PdfReader(io.BytesIO(data))
        if reader.is_encrypted and not reader.decrypt(""):
            raise Refused("unreadable", "the PDF is encrypted")
        pages = len(reader.pages)
        if pages > max_pages:
            return {"ok": False, "reason": "too_many_pages",
                    "message": f"the PDF has {pages} pages; at most {max_pages} are read"}
        parts, size, truncated = [], 0, False
        for page in reader.pages:
            text = page.extract_text() or ""
            parts.append(text)
            size += len(text) + 2
            if size >= max_chars:
                truncated = True
                break
    except LimitReachedError as exc:
        raise Refused("too_large", f"the PDF's content expands past the "
                                   f"{cap // (1024 * 1024)} MB a stream may hold") from exc
    except FileNotDecryptedError as exc:
        raise Refused("unreadable", "the PDF is encrypted") from exc
    except (PdfReadError, PyPdfError, ValueError, KeyError, TypeError, AttributeError,
            IndexError, RecursionError) as exc:
        raise Refused("unreadable", f"the PDF could not be read: {exc}"[:300]) from exc
    text = "\n\n".join(parts)
    return {"ok": True, "text": text[:max_chars], "pages": pages,
            "truncated": truncated or len(text) > max_chars}


def _html(data: bytes, header: dict[str, Any]) -> dict[str, Any]:
    from bs4 import BeautifulSoup

    max_chars = int(header["max_chars"])
    if "html" not in header.get("content_type", ""):
        text = data.decode("utf-8", errors="replace")
        return {"ok": True, "title": "", "text": text[:max_chars],
                "truncated": len(text) > max_chars}
    soup = BeautifulSoup(data, "html.parser")
    for tag in soup(_HIDDEN_TAGS):
        tag.decompose()
    title = soup.title.get_text(strip=True) if soup.title else ""
    text = re.sub(r"\n\s*\n+", "\n\n", soup.get_text("\n", strip=True))
    return {"ok": True, "title": title[:500], "text": text[:max_chars],
            "truncated": len(text) > max_chars}


def _ooxml(data: bytes, header: dict[str, Any]) -> dict[str, Any]:
    limits = ZipLimits(max_members=int(header["max_members"]),
                       max_unzipped_bytes=int(header["max_unzipped_bytes"]))
    text, truncated = ooxml_text(data, int(header["max_chars"]), limits)
    return {"ok": True, "text": text, "truncated": truncated}


_KINDS = {"pdf": _pdf, "html": _html, "ooxml": _ooxml}


def run_job(header: dict[str, Any], data: bytes) -> dict[str, Any]:
    """One job's answer; never raises for a bad file."""
    try:
        return _KINDS[header["kind"]](data, header)
    except Refused as refused:
        return {"ok": False, "reason": refused.reason, "message": refused.message}
    except MemoryError:
        return {"ok": False, "reason": "too_large",
                "message": "the file needs more memory to read than a file may use"}
    except Exception as exc:  # a parser's own bug on a malformed file
        return {"ok": False, "reason": "unreadable",
                "message": f"the file could not be read ({type(exc).__name__})"}


def _read_exact(stream: BinaryIO, size: int) -> bytes | None:
    chunks, left = [], size
    while left:
        chunk = stream.read(left)
        if not chunk:
            return None
        chunks.append(chunk)
        left -= len(chunk)
    return b"".join(chunks)


def _send(out: BinaryIO, answer: dict[str, Any]) -> None:
    body = json.dumps(answer).encode()
    out.write(struct.pack(">I", len(body)) + body)
    out.flush()


def main(argv: list[str]) -> None:
    _confine(int(argv[0]) if argv else 0)
    jobs = sys.stdin.buffer
    answers = os.fdopen(os.dup(1), "wb")
    os.dup2(2, 1)  # a parser's stray print cannot corrupt the answers
    import bs4  # noqa: F401  (loaded before the first deadline starts)
    import pypdf  # noqa: F401

    _send(answers, {})
    while True:
        head = _read_exact(jobs, 8)
        if head is None:
            return
        header_size, data_size = struct.unpack(">II", head)
        header_bytes = _read_exact(jobs, header_size)
        data = _read_exact(jobs, data_size)
        if header_bytes is None or data is None:
            return
        _send(answers, run_job(json.loads(header_bytes), data))


if __name__ == "__main__":
    main(sys.argv[1:])
