"""Web augmentation of a chat: scraping URLs the user names, and searching through a provider.

The search provider is an HTTP service configured by `WEB_SEARCH_URL`: it receives
`POST {"query": str, "limit": int}` and answers `{"results": [{"title", "url", "content"}]}`.
Scraping fetches at most five URLs found in the last user message, through the SSRF guard.
"""

from __future__ import annotations

import asyncio
import json
import logging
import re
from dataclasses import asdict, dataclass

from bs4 import BeautifulSoup

from serve_app.net_guard import BlockedAddress, GuardedFetcher

logger = logging.getLogger("serve_app.web")

MAX_SCRAPE_URLS = 5
MAX_DOCUMENT_CHARS = 8000
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


def html_to_text(html: bytes, content_type: str) -> tuple[str, str]:
    """(title, readable text) of a page; plain text passes through."""
    if "html" not in content_type:
        return "", html.decode("utf-8", errors="replace")
    soup = BeautifulSoup(html, "html.parser")
    for tag in soup(["script", "style", "noscript", "template", "svg"]):
        tag.decompose()
    title = soup.title.get_text(strip=True) if soup.title else ""
    text = re.sub(r"\n\s*\n+", "\n\n", soup.get_text("\n", strip=True))
    return title, text


class WebTools:
    def __init__(self, fetcher: GuardedFetcher, search_url: str | None,
                 search_api_key: str | None = None) -> None:
        self.fetcher = fetcher
        self.search_url = search_url
        self.search_api_key = search_api_key

    @property
    def search_available(self) -> bool:
        return bool(self.search_url)

    async def scrape(self, urls: list[str]) -> list[WebDocument]:
        """The pages that could be fetched (failures are skipped, and not billed)."""
        results = await asyncio.gather(*(self._scrape_one(u) for u in urls[:MAX_SCRAPE_URLS]))
        return [doc for doc in results if doc is not None]

    async def _scrape_one(self, url: str) -> WebDocument | None:
        try:
            fetched = await self.fetcher.fetch(url)
        except (BlockedAddress, OSError, Exception) as exc:  # any failure: skip this URL
            logger.info("not scraped %s: %s", url, exc)
            return None
        if fetched.status != 200:
            return None
        title, text = html_to_text(fetched.body, fetched.content_type)
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
                                               headers=headers)
            payload = json.loads(fetched.body)
        except Exception as exc:
            raise WebUnavailable(f"web search failed: {exc}") from exc
        if fetched.status != 200:
            raise WebUnavailable(f"web search failed with status {fetched.status}")
        return [WebDocument(title=str(r.get("title", "")), url=str(r.get("url", "")),
                            content=str(r.get("content", ""))[:MAX_DOCUMENT_CHARS])
                for r in payload.get("results", [])[:limit] if isinstance(r, dict)]
