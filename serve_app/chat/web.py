"""Web augmentation of a chat: scraping URLs the user names, and searching through a provider.

The search provider is an HTTP service configured by `WEB_SEARCH_URL`: it receives
`POST {"query": str, "limit": int}` and answers `{"results": [{"title", "url", "content"}]}`.
Scraping fetches at most five URLs found in the last user message, through the SSRF guard, each
within `SCRAPE_FETCH_DEADLINE_S` and all of them within `SCRAPE_DEADLINE_S` (a page that misses
either is skipped, like one that failed); an HTML page is parsed by the extraction workers
(chat/extraction.py), never on the event loop: its first `MAX_PARSED_PAGE_BYTES` only, under
one of its account's extraction slots (shared with file parts; a page waits for it within the
deadlines), so that one account's pages never take every worker from other tenants. The search
provider's key goes only to the origin of `WEB_SEARCH_URL`, never on to another host it
redirects to (net_guard).
"""

from __future__ import annotations

import asyncio
import json
import logging
import re
from dataclasses import asdict, dataclass

import httpx

from serve_app.chat.extraction import ExtractionFailed, Extractor
from serve_app.net_guard import (
    BlockedAddress,
    FetchTimedOut,
    GuardedFetcher,
    RefusedEncoding,
    TooLarge,
)

logger = logging.getLogger("serve_app.web")

MAX_SCRAPE_URLS = 5
MAX_DOCUMENT_CHARS = 8000
# What of an HTML page is parsed: a page of `<p>x</p>` takes a worker about 5 s a megabyte,
# and the text kept of a page (MAX_DOCUMENT_CHARS) comes from far less.
MAX_PARSED_PAGE_BYTES = 1024 * 1024
# Deadlines over the per-read timeout, which a server sending a byte at a time never misses:
# one scraped page (its redirects included), all the pages of one request, one search.
SCRAPE_FETCH_DEADLINE_S = 10.0
SCRAPE_DEADLINE_S = 20.0
SEARCH_DEADLINE_S = 20.0
URL_PATTERN = re.compile(r"https?://[^\s<>\"')\]]+")


@dataclass(frozen=True)
class WebDocument:
    title: str
    url: str
    content: str

    def as_dict(self) -> dict[str, str]:
        return asdict(self)


class WebUnavailable(Exception):
    pass


def find_urls(text: str) -> list[str]:
    seen: list[str] = []
    for match in URL_PATTERN.findall(text):
        url = match.rstrip(".,;:!?")
        if url not in seen:
            seen.append(url)
    return seen[:MAX_SCRAPE_URLS]


def _why(exc: Exception) -> str:
    """What a client may read of a failed search (nothing of the provider's address)."""
    if isinstance(exc, (FetchTimedOut, httpx.TimeoutException)):
        return ": timed out"
    if isinstance(exc, TooLarge):
        return ": the provider's answer is too large"
    if isinstance(exc, RefusedEncoding):
        return f": the provider's answer was refused: {exc.reason}"
    return ""


class WebTools:
    def __init__(self, fetcher: GuardedFetcher, search_url: str | None,
                 search_api_key: str | None = None, *, extractor: Extractor,
                 fetch_deadline_s: float = SCRAPE_FETCH_DEADLINE_S,
                 scrape_deadline_s: float = SCRAPE_DEADLINE_S,
                 search_deadline_s: float = SEARCH_DEADLINE_S) -> None:
        self.fetcher = fetcher
        self.extractor = extractor  # pages are parsed by its workers, off the event loop
        self.search_url = search_url
        self.search_api_key = search_api_key
        self.fetch_deadline_s = fetch_deadline_s
        self.scrape_deadline_s = scrape_deadline_s
        self.search_deadline_s = search_deadline_s

    @property
    def search_available(self) -> bool:
        return bool(self.search_url)

    async def scrape(self, urls: list[str], account_id: str) -> list[WebDocument]:
        """The pages that could be fetched within the deadlines, in the order of `urls`
        (failures are skipped, and not billed); `account_id`: whose extraction slots parse
        them."""
        tasks = [asyncio.ensure_future(self._scrape_one(u, account_id))
                 for u in urls[:MAX_SCRAPE_URLS]]
        if not tasks:
            return []
        try:
            _, late = await asyncio.wait(tasks, timeout=self.scrape_deadline_s)
        finally:
            for task in tasks:
                task.cancel()  # the late ones (or all, should this request be cancelled)
        if late:
            await asyncio.gather(*late, return_exceptions=True)
            logger.info("not scraped within %g s: %d of %d URLs", self.scrape_deadline_s,
                        len(late), len(tasks))
        return [doc for task in tasks if task not in late and (doc := task.result()) is not None]

    async def _scrape_one(self, url: str, account_id: str) -> WebDocument | None:
        try:
            fetched = await self.fetcher.fetch(url, deadline_s=self.fetch_deadline_s)
        except (BlockedAddress, OSError, Exception) as exc:  # any failure: skip this URL
            logger.info("not scraped %s: %s", url, exc)
            return None
        if fetched.status != 200:
            return None
        title, text = "", ""
        if "html" in fetched.content_type:
            try:
                async with self.extractor.accounts.slot(account_id, wait=True):
                    page = await self.extractor.run(
                        "html", fetched.body[:MAX_PARSED_PAGE_BYTES],
                        content_type=fetched.content_type, max_chars=MAX_DOCUMENT_CHARS,
                        deadline_s=self.fetch_deadline_s)
            except ExtractionFailed as exc:
                logger.info("not scraped %s: %s", url, exc)
                return None
            title, text = page.title, page.text
        else:
            text = fetched.body[:4 * MAX_DOCUMENT_CHARS].decode("utf-8", errors="replace")
        if not text.strip():
            return None
        return WebDocument(title=title or url, url=url, content=text[:MAX_DOCUMENT_CHARS])

    async def search(self, query: str, limit: int = 5) -> list[WebDocument]:
        if not self.search_url:
            raise WebUnavailable("web search is not configured on this server")
        headers = {"Authorization": f"Bearer {self.search_api_key}"} if self.search_api_key \
            else None
        try:
            fetched = await self.fetcher.fetch(self.search_url, method="POST",
                                               json={"query": query, "limit": limit},
                                               headers=headers,
                                               deadline_s=self.search_deadline_s)
            payload = json.loads(fetched.body)
        except Exception as exc:  # the detail may name the provider's URL: logged, not shown
            logger.warning("web search failed: %r", exc)
            raise WebUnavailable(f"web search failed{_why(exc)}") from exc
        if fetched.status != 200:
            raise WebUnavailable(f"web search failed with status {fetched.status}")
        return [WebDocument(title=str(r.get("title", "")), url=str(r.get("url", "")),
                            content=str(r.get("content", ""))[:MAX_DOCUMENT_CHARS])
                for r in payload.get("results", [])[:limit] if isinstance(r, dict)]
