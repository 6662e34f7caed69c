"""The extraction workers shared fairly, on real worker processes and pages served on loopback:
scraped pages and file parts run under the same per-account slots, a page is parsed only up to
its cap, and the workers start without the Gateway's secrets."""

from __future__ import annotations

import asyncio
import base64
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path

import pytest
import pytest_asyncio

from serve_app.chat import extraction
from serve_app.chat.extraction import Extractor, worker_environment
from serve_app.chat.files import FileReader
from serve_app.chat.web import MAX_PARSED_PAGE_BYTES, WebTools
from serve_app.errors import ApiError
from serve_app.net_guard import GuardedFetcher
from serve_app.schemas.chat import FileData, FilePart
from tests.unit.chat import documents
from tests.unit.support.test_net_guard import Web, answer

PAGE = b"<html><head><title>Lions</title></head><body><p>Lions have manes.</p></body></html>"
SECRETS = {"ADMIN_API_KEY": "sk-admin-secret", "DATABASE_URL": "postgresql://u:pw@db/x",
           "WEB_SEARCH_API_KEY": "search-secret", "X402_PRIVATE_KEY": "0xsecret"}


@pytest.fixture
def web() -> Iterator[Web]:
    server = Web()
    yield server
    server.close()


@pytest_asyncio.fixture(loop_scope="function")
async def pool() -> AsyncIterator[Extractor]:
    """Two workers, as a Gateway replica has; one slot per account."""
    workers = Extractor(workers=2, per_account=1)
    yield workers
    await workers.close()


def _docx_part(text: str) -> FilePart:
    return FilePart(type="file", file=FileData(
        filename="memo.docx", file_data=base64.b64encode(documents.docx([text])).decode()))


async def _until(condition: Callable[[], bool]) -> None:
    """Let the loop run until `condition()` holds (the test's own timeout bounds it)."""
    while not condition():
        await asyncio.sleep(0.01)


async def test_pages_wait_for_their_accounts_slot_and_leave_the_other_worker_to_others(
        web: Web, pool: Extractor):
    """The attack: one account's scraped pages took every worker (a 2 MB page of <p>x</p>
    holds one for over 10 s), so other tenants' documents were refused 503. Now its pages
    run under its slot: while it holds it (here: a document of its own being read), its page
    waits outside the pool, another account's document is read on a free worker, and the
    same account's next document is refused 429; once the slot is free the page is read."""
    web.routes["/lions"] = answer(PAGE)
    tools = WebTools(GuardedFetcher(allowed_hosts=frozenset({web.host})), None,
                     extractor=pool)
    files = FileReader(pool)
    async with pool.accounts.slot("heavy"):
        scraping = asyncio.ensure_future(tools.scrape([web.url("/lions")], "heavy"))
        await _until(lambda: pool.accounts.waiting("heavy") == 1)  # the page waits
        assert pool.busy == 0  # nothing of the heavy account's is in a worker

        other = await files.text_of(_docx_part("Another tenant's memo."), "light")
        assert other == "Another tenant's memo."
        with pytest.raises(ApiError) as refused:
            await files.text_of(_docx_part("A second memo."), "heavy")
        assert (refused.value.status, refused.value.code) == (429, "RATE_LIMIT_EXCEEDED")
        assert not scraping.done()
    (page,) = await scraping
    assert page.title == "Lions" and "Lions have manes." in page.content
    assert pool.accounts.busy("heavy") == 0 and pool.accounts.waiting("heavy") == 0


async def test_the_pages_of_one_scrape_take_one_worker_at_a_time(web: Web, pool: Extractor):
    """Five pages of one request: never more than the account's one slot in the pool."""
    for i in range(5):
        web.routes[f"/p{i}"] = answer(PAGE)
    tools = WebTools(GuardedFetcher(allowed_hosts=frozenset({web.host})), None,
                     extractor=pool)

    docs = await tools.scrape([web.url(f"/p{i}") for i in range(5)], "heavy")

    assert len(docs) == 5
    # one after the other on one worker: a second one was never needed (workers start on
    # demand, when every running one is busy)
    assert len(pool.worker_pids) == 1


async def test_a_page_is_parsed_only_up_to_its_cap(web: Web, pool: Extractor):
    """Past `MAX_PARSED_PAGE_BYTES` nothing is parsed: the text after the cap is not read
    (before, the whole page went to a worker)."""
    padding = b"<!--" + b"x" * (MAX_PARSED_PAGE_BYTES + 4096) + b"-->"
    web.routes["/long"] = answer(b"<html><title>Long</title><p>Before the cap.</p>" + padding
                                 + b"<p>After the cap.</p></html>")
    tools = WebTools(GuardedFetcher(allowed_hosts=frozenset({web.host})), None,
                     extractor=pool)

    (page,) = await tools.scrape([web.url("/long")], "acct")

    assert "Before the cap." in page.content and "After the cap." not in page.content


async def test_workers_start_without_the_gateways_secrets(monkeypatch: pytest.MonkeyPatch,
                                                          pool: Extractor):
    """The attack surface: a parser bug in a worker would have read the admin key, the
    database URL and the provider keys from its environment. Now it has none of them."""
    for name, value in SECRETS.items():
        monkeypatch.setenv(name, value)
    await pool.run("html", PAGE, content_type="text/html")  # a worker starts

    (pid,) = pool.worker_pids
    environ = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
    names = {entry.split(b"=", 1)[0].decode() for entry in environ if entry}
    assert names <= {*extraction._WORKER_ENVIRONMENT, "PYTHONPATH"}
    assert not any(value.encode() in entry for value in SECRETS.values() for entry in environ)


def test_the_worker_environment_keeps_what_python_needs():
    env = worker_environment({"PATH": "/bin", "HOME": "/h", "LANG": "C.UTF-8",
                              "PYTHONPATH": "/extra", **SECRETS})
    assert env["PATH"] == "/bin" and env["HOME"] == "/h" and env["LANG"] == "C.UTF-8"
    assert env["PYTHONPATH"].split(":")[1] == "/extra"
    assert not set(SECRETS) & set(env)
