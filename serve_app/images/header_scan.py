"""A bound on the work Pillow's header parsers may do, checked before `Image.open` runs them.

Pillow reads a JPEG's markers and a PNG's chunks in Python, one step at a time, until the
image data starts. A file can make that walk long without being large: a JPEG of `FF D8 FF`
and 25 MB of `0xFF` fill bytes takes Pillow about 11 s (0.44 us a byte), a PNG of millions of
empty chunks as long. This module walks the same structure the way Pillow does, skipping runs
of fill and junk bytes at C speed, and refuses a header with more wasted bytes or segments
than any real encoder writes. What it lets through, Pillow parses in milliseconds.
"""

from __future__ import annotations

import re

from PIL.JpegImagePlugin import MARKER

# Bytes Pillow would walk one at a time before the image data: fill bytes (0xFF runs),
# junk between segments, markers without a length. Real encoders write a handful, if any.
MAX_WASTED_BYTES = 16 * 1024
# Segments (JPEG) or chunks (PNG) before the image data. Real files have a few dozen; an ICC
# profile split across APP2 segments has at most 255.
MAX_SEGMENTS = 1024

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
_FILL = re.compile(rb"\xff+")
_PNG_DATA_CHUNKS = frozenset({b"IDAT", b"fdAT", b"IEND"})


class HeaderTooCostly(ValueError):
    """The header would take Pillow too long to read: the message says what is wrong."""


def check_header_cost(data: bytes) -> None:
    """Raise HeaderTooCostly when Pillow's header parser would walk too far in `data`.

    Formats without a Python-level walk (WebP: libwebp parses it) and data that is no JPEG or
    PNG at all pass: `Image.open` refuses those at once."""
    if data.startswith(b"\xff\xd8\xff"):
        _check_jpeg(data)
    elif data.startswith(PNG_SIGNATURE):
        _check_png(data)


def _check_jpeg(data: bytes) -> None:
    """Pillow's JpegImageFile._open, step for step: it holds an 0xFF, reads the next byte;
    0xFF again is fill, a known marker is a segment (with a length, skipped whole, unless it
    has no handler), 0x00 an escaped 0xFF, then it reads byte by byte up to the next 0xFF.
    Each run is looked at no further than the bound: microseconds, whatever the file."""
    size = len(data)
    pos = 3  # Pillow has read `FF D8 FF` and holds the last 0xFF
    wasted = segments = 0
    while pos < size:
        marker = 0xFF00 | data[pos]
        pos += 1
        if marker == 0xFFFF:  # a run of fill bytes, looked at no further than the bound
            end = _FILL.match(data, pos, pos + MAX_WASTED_BYTES + 1)
            stop = end.end() if end else pos
            wasted += stop - pos + 1
            pos = stop
            if wasted > MAX_WASTED_BYTES:
                raise HeaderTooCostly(f"more than {MAX_WASTED_BYTES} fill or junk bytes "
                                      "between its JPEG markers")
            continue
        if marker in MARKER:
            segments += 1
            if segments > MAX_SEGMENTS:
                raise HeaderTooCostly(f"more than {MAX_SEGMENTS} JPEG segments before "
                                      "the image data")
            if MARKER[marker][2] is not None:
                if marker == 0xFFDA:  # start of scan: Pillow stops here
                    return
                if pos + 2 > size:
                    return
                pos += int.from_bytes(data[pos:pos + 2], "big")
            else:
                wasted += 2
        elif marker != 0xFF00:
            return  # Pillow raises "no marker found" here, at once
        # Pillow now reads one byte at a time until it meets an 0xFF.
        window = min(size, pos + MAX_WASTED_BYTES + 1)
        found = data.find(b"\xff", pos, window)
        stop = window if found < 0 else found
        wasted += stop - pos
        if wasted > MAX_WASTED_BYTES:
            raise HeaderTooCostly(f"more than {MAX_WASTED_BYTES} fill or junk bytes between "
                                  "its JPEG markers")
        pos = stop + 1


def _check_png(data: bytes) -> None:
    """Pillow's PngImageFile._open reads chunk after chunk until the image data (IDAT)."""
    size = len(data)
    pos = len(PNG_SIGNATURE)
    for _ in range(MAX_SEGMENTS):
        if pos + 8 > size:
            return
        length = int.from_bytes(data[pos:pos + 4], "big")
        if data[pos + 4:pos + 8] in _PNG_DATA_CHUNKS:
            return
        pos += 12 + length  # length, type, data, CRC
    raise HeaderTooCostly(f"more than {MAX_SEGMENTS} PNG chunks before the image data")
