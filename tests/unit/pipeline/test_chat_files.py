"""Chat with file parts through admission, the extraction workers, the text deployment and
settlement: what the model sees, what is held and charged, and the attacks (a PDF that
expands, one that stalls its worker, too many pages, a zip bomb), each refused with nothing
charged and without stalling anyone else."""

from __future__ import annotations

import os
import signal
import threading
from pathlib import Path

import pytest
import yaml

from tests.unit.chat import documents
from tests.unit.pipeline.books import per_million
from tests.unit.pipeline.conftest import CATALOG

INPUT_USD, OUTPUT_USD = 10, 20  # chat-long's prices, per million tokens
TPM = 200


@pytest.fixture
def gateway_catalog(tmp_path: Path) -> Path:
    """The pipeline catalog plus `chat-long` (a context of a million tokens), and
    `chat-limited`, whose tokens per minute are fewer than its completion cap."""
    catalog = yaml.safe_load(CATALOG.read_text())
    primary = next(m for m in catalog["models"] if m["id"] == "chat-primary")
    catalog["models"].append({**primary, "id": "chat-long", "name": "Long context",
                              "context_length": 1_000_000, "traits": []})
    catalog["models"].append({**primary, "id": "chat-limited", "name": "Limited", "traits": [],
                              "rate_limits": {"requests_per_minute": 100,
                                              "tokens_per_minute": TPM}})
    path = tmp_path / "files-catalog.yaml"
    path.write_text(yaml.safe_dump(catalog))
    return path


def _file(data: bytes, filename: str, media_type: str) -> dict:
    return {"type": "file", "file": {"filename": filename,
                                     "file_data": documents.data_url(data, media_type)}}


def _chat(gateway, key: str, *parts: dict, model: str = "chat-long", **body):
    return gateway.client.post("/api/v1/chat/completions", headers=gateway.auth(key), json={
        "model": model, "messages": [{"role": "user", "content": [
            {"type": "text", "text": "Summarise this."}, *parts]}], **body})


def _user_text(fakes) -> str:
    return fakes["text-xs"].requests[-1].messages[-1]["content"]


def _nothing_charged(books, before: int) -> None:
    assert books.entries() == 0
    assert books.open_holds() == 0
    assert books.balance_nanos() == before


def test_a_pdfs_text_reaches_the_model_and_is_charged_in_full(fake_gateway, fakes, key,
                                                               books):
    """The hold is sized from the extracted text: a 4 KB PDF that reads as about 40,000 words
    (before, its hold came from the body's few KB, and the settlement was cut to it)."""
    words = [" ".join(["a"] * 100) for _ in range(400)]
    made = documents.pdf([words[i:i + 40] for i in range(0, 400, 40)])
    assert len(made) < 4_000

    resp = _chat(fake_gateway, key, _file(made, "words.pdf", documents.PDF_TYPE))

    assert resp.status_code == 200, resp.text
    seen = _user_text(fakes)
    assert seen.startswith("Summarise this.\n\n[File: words.pdf]\na a a")
    assert seen.count("a") >= 40_000
    usage = resp.json()["usage"]
    assert usage["prompt_tokens"] > 30_000 > 5 * len(resp.request.content)
    charge = books.only_charge(resp.headers["cf-ray"])
    assert charge.lines["input"] == (usage["prompt_tokens"],
                                     per_million(INPUT_USD, usage["prompt_tokens"]))
    assert charge.lines["output"] == (usage["completion_tokens"],
                                      per_million(OUTPUT_USD, usage["completion_tokens"]))
    assert books.open_holds() == 0


def test_docx_pptx_and_xlsx_parts_reach_the_model_as_text(fake_gateway, fakes, key):
    resp = _chat(fake_gateway, key,
                 _file(documents.docx(["Memo: ship on Friday."]), "memo.docx",
                       documents.DOCX_TYPE),
                 _file(documents.pptx([["Roadmap"], ["Q3: launch"]]), "deck.pptx",
                       documents.PPTX_TYPE),
                 _file(documents.xlsx({"Budget": [["item", "usd"], ["ads", 400]]}),
                       "budget.xlsx", documents.XLSX_TYPE))

    assert resp.status_code == 200, resp.text
    assert _user_text(fakes) == (
        "Summarise this.\n\n[File: memo.docx]\nMemo: ship on Friday.\n\n"
        "[File: deck.pptx]\nSlide 1:\nRoadmap\nSlide 2:\nQ3: launch\n\n"
        "[File: budget.xlsx]\nSheet Budget:\nitem\tusd\nads\t400")


def test_a_pdf_that_expands_to_60_mb_is_refused_and_nothing_is_charged(fake_gateway, fakes,
                                                                        key, books):
    before = books.balance_nanos()
    bomb = documents.expanding_pdf(60_000_000)

    resp = _chat(fake_gateway, key, _file(bomb, "bomb.pdf", documents.PDF_TYPE))

    assert resp.status_code == 413, resp.text
    assert resp.json() == {"code": "PAYLOAD_TOO_LARGE", "error": (
        "The file 'bomb.pdf' was refused: the PDF's content expands past the 8 MB a stream "
        "may hold")}
    assert fakes["text-xs"].calls == []
    _nothing_charged(books, before)


def test_a_pdf_with_too_many_pages_is_a_400(fake_gateway, fakes, key, books):
    before = books.balance_nanos()
    many = documents.pdf([[f"page {n}"] for n in range(501)])

    resp = _chat(fake_gateway, key, _file(many, "long.pdf", documents.PDF_TYPE))

    assert resp.status_code == 400, resp.text
    assert resp.json()["code"] == "INVALID_REQUEST"
    assert resp.json()["error"] == ("The file 'long.pdf' was refused: the PDF has 501 pages; "
                                    "at most 500 are read")
    assert fakes["text-xs"].calls == []
    _nothing_charged(books, before)


def test_a_zip_bomb_docx_is_refused_and_nothing_is_charged(fake_gateway, fakes, key, books):
    before = books.balance_nanos()

    resp = _chat(fake_gateway, key, _file(documents.zip_bomb_docx(80 * 1024 * 1024),
                                          "bomb.docx", documents.DOCX_TYPE))

    assert resp.status_code == 413, resp.text
    assert resp.json()["error"] == ("The file 'bomb.docx' was refused: the file unpacks to "
                                    "more than 64 MB")
    assert fakes["text-xs"].calls == []
    _nothing_charged(books, before)


def test_a_pdf_that_stalls_its_worker_is_cut_at_the_deadline(fake_gateway, fakes, key, books):
    """3 MB of text operators would take pypdf tens of seconds; the worker is killed at the
    deadline (1 s here), the caller gets a 400, and the next file is read as usual."""
    extractor = fake_gateway.state.extractor
    extractor.limits = type(extractor.limits)(deadline_s=1.0)
    before = books.balance_nanos()

    resp = _chat(fake_gateway, key, _file(documents.expanding_pdf(5_000_000), "slow.pdf",
                                          documents.PDF_TYPE))

    assert resp.status_code == 400, resp.text
    assert resp.json()["error"] == ("The file 'slow.pdf' was refused: the file could not be "
                                    "read within 1 s")
    _nothing_charged(books, before)
    ok = _chat(fake_gateway, key, _file(documents.pdf([["fine"]]), "ok.pdf",
                                        documents.PDF_TYPE))
    assert ok.status_code == 200, ok.text
    assert _user_text(fakes).endswith("[File: ok.pdf]\nfine")


def test_other_requests_are_served_while_a_file_is_being_read(fake_gateway, fakes, key):
    """The worker reading a file is frozen (SIGSTOP): the Gateway still answers others
    meanwhile, since it only waits on the worker's pipe; thawed, the file's answer comes."""
    warm = _chat(fake_gateway, key, _file(documents.pdf([["warm"]]), "warm.pdf",
                                          documents.PDF_TYPE))
    assert warm.status_code == 200, warm.text
    extractor = fake_gateway.state.extractor
    (worker,) = extractor.worker_pids
    os.kill(worker, signal.SIGSTOP)
    answers: list = []
    reading = threading.Thread(target=lambda: answers.append(_chat(
        fake_gateway, key, _file(documents.pdf([["frozen text"]]), "f.pdf",
                                 documents.PDF_TYPE))))
    try:
        reading.start()
        done = threading.Event()
        while extractor.busy == 0 and not done.wait(0.01):
            assert reading.is_alive(), answers
        others = fake_gateway.client.get("/api/v1/models")
        assert others.status_code == 200
        chats = _chat(fake_gateway, key, model="chat-primary")
        assert chats.status_code == 200, chats.text
        assert extractor.busy == 1 and reading.is_alive()  # still reading the file
    finally:
        os.kill(worker, signal.SIGCONT)
        reading.join()
    (resp,) = answers
    assert resp.status_code == 200, resp.text
    assert _user_text(fakes).endswith("[File: f.pdf]\nfrozen text")


def test_a_caller_refused_by_its_limits_gets_no_file_read(fake_gateway, fakes, key, books):
    """Files are read only once the limiter has counted the caller: a 429 reads nothing."""
    resp = _chat(fake_gateway, key, _file(documents.pdf([["unread"]]), "x.pdf",
                                          documents.PDF_TYPE),
                 model="chat-limited", max_tokens=TPM + 50)

    assert resp.status_code == 429, resp.text
    assert fake_gateway.state.extractor.worker_pids == []
    assert fakes["text-xs"].calls == []
    assert books.entries() == 0
