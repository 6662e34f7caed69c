"""Files and pages turned into text by the extraction workers (chat/extraction.py), each attack
performed for real on the worker processes: PDFs that expand or that take too long, too many
pages, zip bombs and lying zips dressed as DOCX, entity bombs. The whole chat flow (status,
body, ledger) is in tests/unit/flows/test_chat_files.py."""

from __future__ import annotations

import base64
import io
import zipfile
from collections.abc import AsyncIterator

import pytest
import pytest_asyncio

from serve_app.chat.extraction import ExtractionFailed, Extractor
from serve_app.chat.files import FileReader
from serve_app.chat.ooxml import Refused, ZipLimits, ooxml_text
from serve_app.errors import ApiError
from serve_app.schemas.chat import FileData, FilePart
from tests.unit.chat import documents


@pytest_asyncio.fixture(loop_scope="function")
async def extractor() -> AsyncIterator[Extractor]:
    pool = Extractor(workers=1)
    yield pool
    await pool.close()


def _zipped(document_part: bytes) -> bytes:
    out = io.BytesIO()
    with zipfile.ZipFile(out, "w") as package:
        package.writestr("word/document.xml", document_part)
    return out.getvalue()


def _part(data: bytes | str, filename: str | None = None, media_type: str | None = None
          ) -> FilePart:
    raw = data.encode() if isinstance(data, str) else data
    encoded = documents.data_url(raw, media_type) if media_type else \
        base64.b64encode(raw).decode()
    return FilePart(type="file", file=FileData(filename=filename, file_data=encoded))


async def test_a_pdf_is_read_page_by_page(extractor: Extractor):
    made = documents.pdf([["Zebras have stripes."], ["Lions have manes."]])
    got = await extractor.run("pdf", made)
    assert "Zebras have stripes." in got.text and "Lions have manes." in got.text
    assert got.pages == 2 and not got.truncated


async def test_docx_pptx_and_xlsx_are_read_as_text(extractor: Extractor):
    word = await extractor.run("ooxml", documents.docx(["First paragraph.", "Second one."]))
    assert word.text == "First paragraph.\nSecond one."
    slides = await extractor.run("ooxml", documents.pptx([["Title slide"], ["Point A"]]))
    assert slides.text == "Slide 1:\nTitle slide\nSlide 2:\nPoint A"
    sheet = await extractor.run("ooxml", documents.xlsx(
        {"Prices": [["fruit", "usd"], ["apple", 3]], "Notes": [["ripe"]]}))
    assert sheet.text == "Sheet Prices:\nfruit\tusd\napple\t3\nSheet Notes:\nripe"


async def test_a_pdf_that_expands_past_the_stream_cap_is_refused(extractor: Extractor):
    """A few hundred KB that decode to 60 MB of text operators: refused at the decoder's cap,
    before any text is built."""
    bomb = documents.expanding_pdf(60_000_000)
    assert len(bomb) < 300_000
    with pytest.raises(ExtractionFailed) as refused:
        await extractor.run("pdf", bomb)
    assert refused.value.reason == "too_large"
    assert "expands past the 8 MB" in refused.value.message


async def test_a_pdf_that_takes_too_long_is_stopped_and_its_worker_replaced():
    """3 MB of text operators (within the cap) take pypdf tens of seconds: the worker is
    killed at the deadline, and the next file gets a fresh one."""
    pool = Extractor(workers=1)  # the usual deadline for the others: no 1 s to race
    try:
        await pool.run("pdf", documents.pdf([["warm up"]]))
        (first,) = pool.worker_pids
        with pytest.raises(ExtractionFailed) as refused:
            await pool.run("pdf", documents.expanding_pdf(5_000_000), deadline_s=1.0)
        assert refused.value.reason == "timed_out"
        assert refused.value.message == "the file could not be read within 1 s"
        assert pool.worker_pids == []  # killed
        again = await pool.run("pdf", documents.pdf([["after the attack"]]))
        assert again.text == "after the attack"
        assert pool.worker_pids != [first]
    finally:
        await pool.close()


async def test_a_pdf_with_too_many_pages_is_refused(extractor: Extractor):
    many = documents.pdf([[f"page {n}"] for n in range(501)])
    with pytest.raises(ExtractionFailed) as refused:
        await extractor.run("pdf", many)
    assert refused.value.reason == "too_many_pages"
    assert refused.value.message == "the PDF has 501 pages; at most 500 are read"


async def test_the_text_is_capped_and_reading_stops_there(extractor: Extractor):
    pages = [[f"page {n} " + "word " * 150] for n in range(40)]
    got = await extractor.run("pdf", documents.pdf(pages), max_chars=2_000)
    assert len(got.text) == 2_000 and got.truncated
    assert "page 0" in got.text and "page 39" not in got.text


async def test_a_zip_bomb_is_refused_before_it_is_expanded(extractor: Extractor):
    bomb = documents.zip_bomb_docx(80 * 1024 * 1024)
    assert len(bomb) < 200_000
    with pytest.raises(ExtractionFailed) as refused:
        await extractor.run("ooxml", bomb)
    assert (refused.value.reason, refused.value.message) == (
        "too_large", "the file unpacks to more than 64 MB")


async def test_a_zip_understating_a_part_is_read_no_further_than_declared(
        extractor: Extractor):
    with pytest.raises(ExtractionFailed) as refused:
        await extractor.run("ooxml", documents.lying_docx("hidden", 10_000_000))
    assert refused.value.reason == "unreadable"
    assert "could not be unpacked" in refused.value.message


@pytest.mark.parametrize("encoding", ["UTF-8", "UTF-16", "UTF-16BE", "UTF-16LE"])
async def test_an_entity_bomb_is_refused_unread_in_any_encoding(extractor: Extractor,
                                                                encoding: str):
    """The attack: the part in UTF-16, where `<!DOCTYPE` is not those bytes; the parser
    itself refuses the DTD."""
    bomb = documents.entity_bomb_docx(encoding)
    part = zipfile.ZipFile(io.BytesIO(bomb)).read("word/document.xml")
    assert (b"<!DOCTYPE" in part) == (encoding == "UTF-8")  # the old byte search's blind spot
    with pytest.raises(ExtractionFailed) as refused:
        await extractor.run("ooxml", bomb)
    assert refused.value.reason == "unreadable"
    assert refused.value.message == ("the part word/document.xml declares a DTD, which OOXML "
                                     "never does")


def test_a_dtd_is_refused_by_the_parser_in_any_encoding():
    """In process: the parser refuses a bare DOCTYPE (no entities) as it meets it; a part in
    an encoding it cannot read (UTF-32) is refused as unreadable."""
    for encoding in ("UTF-8", "UTF-16", "UTF-16BE", "ISO-8859-1"):
        part = f'<?xml version="1.0" encoding="{encoding}"?><!DOCTYPE x><x/>'.encode(encoding)
        with pytest.raises(Refused, match="declares a DTD"):
            ooxml_text(_zipped(part), 100, ZipLimits())
    utf32 = '<?xml version="1.0" encoding="UTF-32"?><!DOCTYPE x><x/>'.encode("utf-32")
    with pytest.raises(Refused, match="is not well-formed XML"):
        ooxml_text(_zipped(utf32), 100, ZipLimits())


async def test_a_utf16_document_is_read(extractor: Extractor):
    word = await extractor.run("ooxml", documents.utf16_docx("Grüße aus Köln."))
    assert word.text == "Grüße aus Köln."


async def test_html_is_reduced_to_readable_text(extractor: Extractor):
    page = await extractor.run("html", b"<html><title>T</title><script>bad()</script>"
                                       b"<p>Good</p>", content_type="text/html")
    assert page.title == "T" and "Good" in page.text and "bad" not in page.text


async def test_file_parts_are_typed_and_checked_before_any_worker(extractor: Extractor):
    reader = FileReader(extractor)
    assert await reader.text_of(_part("hello file", "a.txt"), "acct") == "hello file"
    assert await reader.text_of(_part("hello file", None, "text/plain"), "acct") \
        == "hello file"
    word = await reader.text_of(_part(documents.docx(["Hi"]), "memo.docx"), "acct")
    assert word == "Hi"
    with pytest.raises(ApiError) as bad_base64:
        await reader.text_of(FilePart(type="file", file=FileData(file_data="not base64!!")),
                             "acct")
    assert bad_base64.value.status == 400
    with pytest.raises(ApiError) as image:
        await reader.text_of(_part(b"\x89PNG\x00\xff", "a.png", "image/png"), "acct")
    assert image.value.status == 400 and "cannot be read as text" in image.value.message
    with pytest.raises(ApiError) as binary:
        await reader.text_of(_part(b"\x89PNG\x00\xff", "a.png"), "acct")
    assert binary.value.status == 400 and "neither UTF-8 text nor" in binary.value.message
    with pytest.raises(ApiError) as huge:
        await reader.text_of(FilePart(type="file", file=FileData(
            file_data="A" * (14 * 1024 * 1024))), "acct")
    assert (huge.value.status, huge.value.code) == (413, "PAYLOAD_TOO_LARGE")
    assert extractor.worker_pids != []  # only the DOCX reached a worker
