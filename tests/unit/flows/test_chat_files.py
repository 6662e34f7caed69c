"""Chat with file parts through admission, the extraction workers, the text deployment and
settlement: what the model sees, what is held and charged, and the attacks (a PDF that
expands, one that stalls its worker, too many pages, a zip bomb), each refused with nothing
charged and without stalling anyone else."""

from __future__ import annotations

import contextlib
import os
import signal
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from serve_app.chat.extraction import ExtractionLimits, Extractor
from serve_app.chat.files import FileReader
from tests.unit.chat import documents
from tests.unit.flows.books import Books, per_million
from tests.unit.flows.conftest import CATALOG

INPUT_USD, OUTPUT_USD = 10, 20  # chat-long's prices, per million tokens
TPM = 200


@pytest.fixture
def gateway_catalog(tmp_path: Path) -> Path:
    """The flows catalog plus `chat-long` (a context of a million tokens), and
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
    extractor = fake_gateway.services.extractor
    usual = extractor.limits
    extractor.limits = type(extractor.limits)(deadline_s=1.0)
    before = books.balance_nanos()

    resp = _chat(fake_gateway, key, _file(documents.expanding_pdf(5_000_000), "slow.pdf",
                                          documents.PDF_TYPE))

    assert resp.status_code == 400, resp.text
    assert resp.json()["error"] == ("The file 'slow.pdf' was refused: the file could not be "
                                    "read within 1 s")
    _nothing_charged(books, before)
    extractor.limits = usual  # the next file read as usual, with no 1 s deadline to race
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
    extractor = fake_gateway.services.extractor
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
    assert fake_gateway.services.extractor.worker_pids == []
    assert fakes["text-xs"].calls == []
    assert books.entries() == 0


# ---- reading files costs the server: only a caller who can pay gets it, in bounds ------------

def _account_key(gateway, usd: str) -> tuple[str, str]:
    """An INFERENCE key of a new account holding `usd`, and that account's id."""
    account = gateway.cli("create-account", "--usd", usd)
    resp = gateway.client.post("/api/v1/api_keys", headers=gateway.auth(account["apiKey"]),
                               json={"apiKeyType": "INFERENCE", "description": "files"})
    assert resp.status_code == 200, resp.text
    return resp.json()["data"]["apiKey"], account["accountId"]


def test_a_caller_without_credit_gets_402_before_any_file_is_read(fake_gateway, fakes, books):
    """The attack: a $0 key sends a PDF; the worker used to parse it, then answer 402."""
    broke, account_id = _account_key(fake_gateway, "0")

    resp = _chat(fake_gateway, broke, _file(documents.pdf([["parse me"]]), "x.pdf",
                                            documents.PDF_TYPE))

    assert resp.status_code == 402, resp.text
    assert resp.json()["code"] == "INSUFFICIENT_BALANCE"
    assert fake_gateway.services.extractor.worker_pids == []  # no worker was even started
    assert fakes["text-xs"].calls == []
    assert books.entries() == 0 and books.open_holds() == 0
    assert books.balance_nanos(account_id) == 0


def test_a_fresh_wallet_gets_402_before_any_file_is_read(tmp_path: Path, gateway_catalog: Path,
                                                         fakes):
    """Each new wallet has its own limiter bucket and no account row: none gets a free
    parse, and nothing is written for it."""
    from serve_app.settings import Settings
    from tests.unit.conftest import make_gateway
    from tests.wallets import Wallet, signed_in

    origin = "http://testserver/api/v1"
    for gateway in make_gateway(Settings(data_dir=tmp_path, model_catalog=gateway_catalog,
                                         siwx_domains="testserver"), handles=fakes):
        books = Books(gateway)
        for _ in range(2):
            headers = signed_in(gateway.client, Wallet(), f"{origin}/chat/completions")
            resp = gateway.client.post("/api/v1/chat/completions", headers=headers, json={
                "model": "chat-long", "messages": [{"role": "user", "content": [
                    _file(documents.pdf([["parse me"]]), "x.pdf", documents.PDF_TYPE)]}]})
            assert resp.status_code == 402, resp.text
            assert resp.json()["code"] == "PAYMENT_REQUIRED"
        assert gateway.services.extractor.worker_pids == []
        assert books.entries() == 0 and books.open_holds() == 0
        books.close()


def test_the_floor_is_the_known_text_a_key_cannot_pay_for_reads_nothing(fake_gateway, fakes,
                                                                         books):
    """A key whose spending limit is below the price of the prompt's own text (40,000
    characters at chat-long's input price, $0.0004) is refused before its PDF is read."""
    limited = fake_gateway.create_key(consumptionLimit={"usd": 0.0002})["apiKey"]

    resp = _chat(fake_gateway, limited, {"type": "text", "text": "word " * 8_000},
                 _file(documents.pdf([["parse me"]]), "x.pdf", documents.PDF_TYPE))

    assert resp.status_code == 402, resp.text
    assert resp.json()["code"] == "API_KEY_USD_SPEND_LIMIT_EXCEEDED"
    assert fake_gateway.services.extractor.worker_pids == []
    assert books.entries() == 0 and books.open_holds() == 0


def test_a_caller_who_can_pay_the_floor_but_not_the_text_is_charged_nothing(fake_gateway, fakes,
                                                                           books):
    """The floor is only a floor: once the file's 40,000 words are read, the hold at their
    size is refused (402) and nothing stays held or charged."""
    limited = fake_gateway.create_key(consumptionLimit={"usd": 0.0002})["apiKey"]
    words = [" ".join(["a"] * 100) for _ in range(400)]

    resp = _chat(fake_gateway, limited, _file(documents.pdf(
        [words[i:i + 40] for i in range(0, 400, 40)]), "words.pdf", documents.PDF_TYPE))

    assert resp.status_code == 402, resp.text
    assert fakes["text-xs"].calls == []
    assert books.entries() == 0 and books.open_holds() == 0


@contextlib.contextmanager
def _reading_frozen(gateway, key: str, extractor) -> Iterator[list]:
    """A chat of `key` whose PDF is being read by a frozen worker (SIGSTOP) while the block
    runs; thawed after it, its answer is appended to the list yielded."""
    warm = _chat(gateway, key, _file(documents.pdf([["warm"]]), "warm.pdf",
                                     documents.PDF_TYPE))
    assert warm.status_code == 200, warm.text
    (worker,) = extractor.worker_pids
    os.kill(worker, signal.SIGSTOP)
    answers: list = []
    reading = threading.Thread(target=lambda: answers.append(_chat(
        gateway, key, _file(documents.pdf([["frozen"]]), "f.pdf", documents.PDF_TYPE))))
    try:
        reading.start()
        while extractor.busy == 0 and not threading.Event().wait(0.01):
            assert reading.is_alive(), answers
        yield answers
    finally:
        os.kill(worker, signal.SIGCONT)
        reading.join()


def test_one_account_reads_one_request_of_documents_at_a_time(fake_gateway, fakes, key, books):
    """While one of its requests has a worker, the account's next request with a document
    gets 429 at once (the pool is shared by every tenant), nothing held; a plain text file
    needs no worker and is read meanwhile."""
    extractor = fake_gateway.services.extractor
    with _reading_frozen(fake_gateway, key, extractor) as answers:
        second = _chat(fake_gateway, key, _file(documents.docx(["second"]), "b.docx",
                                                documents.DOCX_TYPE))
        assert second.status_code == 429, second.text
        assert second.json()["code"] == "RATE_LIMIT_EXCEEDED"
        assert "at most 1 at a time" in second.json()["error"]
        assert books.held(second.headers["cf-ray"]) is None and books.charges(
            second.headers["cf-ray"]) == []
        plain = _chat(fake_gateway, key, _file(b"notes", "n.txt", "text/plain"))
        assert plain.status_code == 200, plain.text
        assert extractor.busy == 1
    (first,) = answers
    assert first.status_code == 200, first.text
    assert books.open_holds() == 0


def _small_pool(gateway, limits: ExtractionLimits) -> Iterator[Extractor]:
    """The chat's file reader on a pool of one worker with these limits."""
    pool = Extractor(workers=1, limits=limits)
    chat = gateway.services.chat
    real, chat.files = chat.files, FileReader(pool)
    yield pool
    chat.files = real
    gateway.client.portal.call(pool.close)


@pytest.fixture
def small_pool(fake_gateway) -> Iterator[Extractor]:
    """One worker, waited for half a second at most (each request's files have the usual
    time: the request whose file is being read is not racing the wait of the other)."""
    yield from _small_pool(fake_gateway, ExtractionLimits(queue_wait_s=0.5))


@pytest.fixture
def short_request_pool(fake_gateway) -> Iterator[Extractor]:
    """One worker; all the files of a request read within 1 s."""
    yield from _small_pool(fake_gateway, ExtractionLimits(request_s=1.0))


def test_a_busy_pool_answers_503_instead_of_a_wait_without_end(fake_gateway, fakes, key, books,
                                                                small_pool):
    """Another account's request finds the only worker busy: a 503 once `queue_wait_s` has
    passed, in the spec's error shape, with nothing held or charged."""
    other, account_id = _account_key(fake_gateway, "10")
    with _reading_frozen(fake_gateway, key, small_pool) as answers:
        before = books.balance_nanos(account_id)
        resp = _chat(fake_gateway, other, _file(documents.pdf([["wait"]]), "w.pdf",
                                                documents.PDF_TYPE))
        assert resp.status_code == 503, resp.text
        assert resp.json() == {"code": "MODEL_AT_CAPACITY", "error": (
            "Every file reader of this server is busy; retry shortly")}
        assert resp.headers["retry-after"] == "2"
        assert books.balance_nanos(account_id) == before
        assert books.charges(resp.headers["cf-ray"]) == []
    (first,) = answers
    assert first.status_code == 200, first.text
    assert books.open_holds() == 0


def test_the_files_of_one_request_are_read_within_its_time_limit(fake_gateway, fakes, key,
                                                                 books, short_request_pool):
    """A file a worker would chew on for tens of seconds (each within the per-file deadline
    of 15 s) is cut at the request's limit (1 s here): its worker is killed, 400, nothing
    charged."""
    before = books.balance_nanos()

    resp = _chat(fake_gateway, key, _file(documents.expanding_pdf(5_000_000), "slow.pdf",
                                          documents.PDF_TYPE))

    assert resp.status_code == 400, resp.text
    assert resp.json()["error"] == ("The files could not be read within 1 s (all the files of "
                                    "one request together)")
    assert short_request_pool.worker_pids == []
    _nothing_charged(books, before)
