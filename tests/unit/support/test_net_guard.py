"""Abuse of the server's own fetches (image and video URLs, web scraping, web search), each
performed for real against HTTP servers on loopback: compression bombs, servers that trickle,
redirects to private addresses spelled as IPv6, and a search provider redirecting its key away."""

from __future__ import annotations

import asyncio
import contextlib
import gzip
import struct
import threading
import time
import tracemalloc
import zlib
from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
import pytest_asyncio

from serve_app import net_guard
from serve_app.chat.extraction import Extractor
from serve_app.chat.web import WebTools, WebUnavailable
from serve_app.errors import ApiError
from serve_app.images.inputs import MediaSourceReader, image_fetcher
from serve_app.images.rules import MAX_IMAGE_BYTES
from serve_app.net_guard import GuardedFetcher, is_public
from serve_app.settings import Settings
from tests.unit.conftest import Gateway, make_gateway

PAGE = b"<html><head><title>Zebra facts</title></head><body><p>Zebras have stripes.</p></body>"
GIB = 1 << 30


def gzip_of_zeros(size: int, block: int = 1 << 20) -> bytes:
    """A gzip file of `size` zero bytes, built without compressing them all: after a full
    flush, each further block of zeros compresses to the same bytes. (Its trailer is not
    checked: a fetch must stop long before it.)"""
    deflate = zlib.compressobj(9, zlib.DEFLATED, -zlib.MAX_WBITS)
    zeros = bytes(block)
    first = deflate.compress(zeros) + deflate.flush(zlib.Z_FULL_FLUSH)
    more = deflate.compress(zeros) + deflate.flush(zlib.Z_FULL_FLUSH)
    return (b"\x1f\x8b\x08\x00\x00\x00\x00\x00\x02\xff" + first + more * (size // block - 1)
            + deflate.flush() + struct.pack("<II", 0, size & 0xFFFFFFFF))


BOMB = gzip_of_zeros(GIB)                 # about 1 MB that decodes to 1 GiB
STACKED_BOMB = gzip.compress(BOMB)        # about 2.5 KB that decodes to 1 MB, then to 1 GiB


# ------------------------------------------------------------------------------------------
# A stand-in for the outside web


Route = Callable[[BaseHTTPRequestHandler], None]


class Web:
    """A real HTTP server on loopback answering `routes[path](handler)`; it records each
    request as (method, path, headers), and the paths whose client hung up before the end of
    a trickling answer (`cut`)."""

    def __init__(self) -> None:
        self.routes: dict[str, Route] = {}
        self.seen: list[tuple[str, str, dict[str, str]]] = []
        self.cut: set[str] = set()
        web = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: Any) -> None:
                pass

            def _answer(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                if length:
                    self.rfile.read(length)
                web.seen.append((self.command, self.path, dict(self.headers)))
                route = web.routes.get(self.path)
                if route is None:
                    send(self, 404, b"missing")
                else:
                    route(self)

            do_GET = do_POST = _answer

        class Server(ThreadingHTTPServer):
            daemon_threads = True

            def handle_error(self, request: Any, client_address: Any) -> None:
                pass  # a client that hung up on a trickle

        self.server = Server(("127.0.0.1", 0), Handler)
        self.server.web = self  # type: ignore[attr-defined]
        threading.Thread(target=self.server.serve_forever, args=(0.05,), daemon=True).start()
        self.host = f"127.0.0.1:{self.server.server_address[1]}"

    def url(self, path: str) -> str:
        return f"http://{self.host}{path}"

    def headers_at(self, path: str) -> list[dict[str, str]]:
        return [headers for _, seen_path, headers in self.seen if seen_path == path]

    async def wait_cut(self, paths: set[str]) -> None:
        """Until the client has hung up on each trickle of `paths` (it notices at its next
        byte); a trickle read to its end (20 s) is never cut."""
        deadline = time.monotonic() + 120
        while not paths <= self.cut:
            assert time.monotonic() < deadline, f"read to the end: {sorted(paths - self.cut)}"
            await asyncio.sleep(0.05)

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def send(handler: BaseHTTPRequestHandler, status: int, body: bytes,
         content_type: str = "text/html", **headers: str) -> None:
    handler.send_response(status)
    handler.send_header("Content-Type", content_type)
    handler.send_header("Content-Length", str(len(body)))
    for name, value in headers.items():
        handler.send_header(name.replace("_", "-"), value)
    handler.end_headers()
    with contextlib.suppress(OSError):  # the client stopped reading
        handler.wfile.write(body)


def answer(body: bytes, content_type: str = "text/html", **headers: str) -> Route:
    return lambda h: send(h, 200, body, content_type, **headers)


def redirect(location: str, status: int = 302) -> Route:
    return lambda h: send(h, status, b"", Location=location)


def trickle(handler: BaseHTTPRequestHandler) -> None:
    """A page that lasts 20 s: a byte every 50 ms (well within any per-read timeout). A client
    that hangs up before its end is recorded in the server's `cut`."""
    handler.send_response(200)
    handler.send_header("Content-Type", "text/html")
    handler.end_headers()
    try:
        for _ in range(400):
            handler.wfile.write(b"z")
            handler.wfile.flush()
            time.sleep(0.05)
    except OSError:  # the fetch gave up
        handler.server.web.cut.add(handler.path)  # type: ignore[attr-defined]


def slow_redirect(location: str, delay_s: float) -> Route:
    def route(handler: BaseHTTPRequestHandler) -> None:
        time.sleep(delay_s)
        send(handler, 302, b"", Location=location)
    return route


@pytest.fixture
def web() -> Iterator[Web]:
    server = Web()
    yield server
    server.close()


@pytest_asyncio.fixture(loop_scope="function")
async def extractor() -> AsyncIterator[Extractor]:
    """The extraction workers that parse scraped pages."""
    pool = Extractor(workers=1)
    yield pool
    await pool.close()


@pytest.fixture
def gateway(tmp_path: Path, web: Web) -> Iterator[Gateway]:
    """The gateway, allowed to fetch from `web` (standing for a public host)."""
    yield from make_gateway(Settings(data_dir=tmp_path, initial_credit_usd=10,
                                     web_fetch_allowed_hosts=web.host))


def quote_video(gateway: Gateway, url: str):
    """The video quote fetches `video_url` before any model runs."""
    key = gateway.auth(gateway.create_key()["apiKey"])
    return gateway.client.post("/api/v1/video/quote", headers=key, json={
        "model": "video-upscaler", "duration": "auto", "video_url": url})


@contextmanager
def measured() -> Iterator[dict[str, float]]:
    """The peak of Python memory allocated meanwhile (all threads). (How long a refusal
    takes is a figure of benchmarks/refusals_bench.py, not asserted here.)"""
    result: dict[str, float] = {}
    was_tracing = tracemalloc.is_tracing()
    if not was_tracing:
        tracemalloc.start()
    tracemalloc.reset_peak()
    base = tracemalloc.get_traced_memory()[0]
    try:
        yield result
    finally:
        result["peak_mb"] = (tracemalloc.get_traced_memory()[1] - base) / 1e6
        if not was_tracing:
            tracemalloc.stop()


@pytest.fixture
def decoded(monkeypatch: pytest.MonkeyPatch) -> dict[str, int]:
    """How many bytes each compressed answer was decoded to, by the URL it came from (an
    answer refused from its headers is never decoded: it has no entry)."""
    sizes: dict[str, int] = {}
    feed = net_guard._CappedDecoder.feed

    def counted(self: Any, data: bytes, out: bytearray, cap: int) -> None:
        before = len(out)
        try:
            feed(self, data, out, cap)
        finally:
            sizes[self.url] = sizes.get(self.url, 0) + len(out) - before

    monkeypatch.setattr(net_guard._CappedDecoder, "feed", counted)
    return sizes


# ------------------------------------------------------------------------------------------
# 1. Compressed answers


def test_a_stacked_gzip_bomb_is_refused_at_once(gateway: Gateway, web: Web,
                                                decoded: dict[str, int]):
    """2.5 KB of `gzip, gzip` decodes to 1 GiB: refused from its header, nothing decoded."""
    web.routes["/clip.mp4"] = answer(STACKED_BOMB, "video/mp4", Content_Encoding="gzip, gzip")
    with measured() as cost:
        resp = quote_video(gateway, web.url("/clip.mp4"))
    assert resp.status_code == 400, resp.text
    body = resp.json()
    assert body["code"] == "INVALID_REQUEST"
    assert body["error"] == ("could not fetch video URL: the server sent it with "
                             "Content-Encoding 'gzip, gzip' (at most one gzip or deflate layer "
                             "is accepted)")
    assert body["details"]["video_url"]["_errors"] == [body["error"]]
    assert web.headers_at("/clip.mp4")[0]["Accept-Encoding"] == "identity"
    assert decoded == {}  # not a byte of it
    assert cost["peak_mb"] < 50, cost


def test_a_gzip_bomb_is_decoded_only_up_to_the_cap(gateway: Gateway, web: Web,
                                                   decoded: dict[str, int]):
    """1 MB of gzip decoding to 1 GiB, sent although `identity` was asked for: decoded a step
    at a time, and refused as too large once past the 25 MB cap."""
    web.routes["/clip.mp4"] = answer(BOMB, "video/mp4", Content_Encoding="gzip")
    with measured() as cost:
        resp = quote_video(gateway, web.url("/clip.mp4"))
    assert resp.status_code == 413, resp.text
    assert resp.json()["code"] == "PAYLOAD_TOO_LARGE" and "25 MB" in resp.json()["error"]
    # of its 1 GiB, one byte past the cap (MAX_IMAGE_BYTES - 1) at most
    assert 0 < sum(decoded.values()) <= MAX_IMAGE_BYTES, decoded
    assert cost["peak_mb"] < 120, cost


@pytest.mark.parametrize("encoding", ["br", "compress", "gzip, deflate", "deflate, gzip"])
async def test_other_and_stacked_encodings_are_refused(web: Web, encoding: str):
    web.routes["/cat.png"] = answer(gzip.compress(b"image"), "image/png",
                                    Content_Encoding=encoding)
    reader = MediaSourceReader(image_fetcher(allowed_hosts=frozenset({web.host})))
    with pytest.raises(ApiError) as excinfo:
        await reader.read(web.url("/cat.png"), "image", allow_urls=True)
    assert excinfo.value.status == 400
    assert excinfo.value.body()["error"].startswith(
        f"could not fetch image URL: the server sent it with Content-Encoding {encoding!r}")


@pytest.mark.parametrize(("encoding", "encode"), [
    ("gzip", gzip.compress),
    ("x-gzip", gzip.compress),
    ("gzip", lambda data: gzip.compress(data[:10]) + gzip.compress(data[10:])),  # 2 members
    ("deflate", zlib.compress),
    ("deflate", lambda data: zlib.compress(data)[2:-4]),  # raw deflate, as some servers send
    ("identity", lambda data: data),
])
async def test_one_layer_of_compression_within_the_cap_is_read(web: Web, encoding: str,
                                                               encode: Callable[[bytes], bytes]):
    """A server that compresses although asked not to still works, when it is small."""
    image = b"\x89PNG\r\n\x1a\n" + bytes(range(256)) * 64
    web.routes["/cat.png"] = answer(encode(image), "image/png", Content_Encoding=encoding)
    reader = MediaSourceReader(image_fetcher(allowed_hosts=frozenset({web.host})))
    assert await reader.read(web.url("/cat.png"), "image", allow_urls=True) == image


async def test_scraping_skips_bombs_and_reads_a_compressed_page(web: Web, extractor: Extractor,
                                                               decoded: dict[str, int]):
    web.routes["/stacked"] = answer(STACKED_BOMB, Content_Encoding="gzip, gzip")
    web.routes["/bomb"] = answer(BOMB, Content_Encoding="gzip")
    web.routes["/page"] = answer(gzip.compress(PAGE), Content_Encoding="gzip")
    fetcher = GuardedFetcher(allowed_hosts=frozenset({web.host}))
    tools = WebTools(fetcher, None, extractor=extractor)
    with measured() as cost:
        docs = await tools.scrape([web.url("/stacked"), web.url("/bomb"), web.url("/page")],
                                  "account")
    assert [(d.title, d.content) for d in docs] == [
        ("Zebra facts", "Zebra facts\nZebras have stripes.")]
    # the stacked bomb refused from its headers, the other decoded one byte past the cap
    assert web.url("/stacked") not in decoded, decoded
    assert 0 < decoded[web.url("/bomb")] <= fetcher.max_bytes + 1, decoded
    assert decoded[web.url("/page")] == len(PAGE)
    assert cost["peak_mb"] < 50, cost


async def test_a_search_provider_answering_a_bomb_is_a_failed_search(
        web: Web, extractor: Extractor):
    web.routes["/search"] = answer(STACKED_BOMB, "application/json",
                                   Content_Encoding="gzip, gzip")
    tools = WebTools(GuardedFetcher(allowed_hosts=frozenset({web.host})), web.url("/search"),
                     extractor=extractor)
    with pytest.raises(WebUnavailable) as excinfo:
        await tools.search("zebras")
    assert str(excinfo.value).startswith("web search failed: the provider's answer was "
                                         "refused: the server sent it with Content-Encoding")
    assert web.host not in str(excinfo.value)


# ------------------------------------------------------------------------------------------
# 2. Deadlines


async def test_scraping_cuts_a_trickling_page_at_its_deadline(web: Web, extractor: Extractor):
    """The page's deadline (2 s here) cuts the trickle, which would last 20 s; the other page
    is read within its own."""
    web.routes["/slow"] = trickle
    web.routes["/page"] = answer(PAGE)
    tools = WebTools(GuardedFetcher(allowed_hosts=frozenset({web.host})), None,
                     extractor=extractor, fetch_deadline_s=2)
    started = time.monotonic()
    docs = await tools.scrape([web.url("/slow"), web.url("/page")], "account")
    assert [d.title for d in docs] == ["Zebra facts"]
    assert time.monotonic() - started > 1.9  # not before the deadline
    await web.wait_cut({"/slow"})  # the fetch hung up on it, before its end


async def test_scraping_ends_at_the_request_deadline_keeping_the_pages_read(
        web: Web, extractor: Extractor):
    """Four trickling URLs, each within its own (long) deadline: the request's deadline cuts
    them all, and the page that came in time is kept."""
    for i in range(4):
        web.routes[f"/slow{i}"] = trickle
    web.routes["/page"] = answer(PAGE)
    await extractor.run("html", PAGE)  # the worker started, as on a Gateway that served pages
    tools = WebTools(GuardedFetcher(allowed_hosts=frozenset({web.host})), None,
                     extractor=extractor, fetch_deadline_s=30, scrape_deadline_s=4)
    started = time.monotonic()
    docs = await tools.scrape([web.url(f"/slow{i}") for i in range(4)] + [web.url("/page")],
                              "account")
    assert [d.url for d in docs] == [web.url("/page")]
    assert time.monotonic() - started > 3.9  # not before the request's deadline
    # the trickles would last 20 s each: the request's deadline ended them
    await web.wait_cut({f"/slow{i}" for i in range(4)})


async def test_one_deadline_covers_every_redirect(web: Web):
    """Each hop answers well within the per-read timeout; together they pass the deadline
    (the image behind the last hop would be read were each hop timed on its own)."""
    for hop in range(3):
        web.routes[f"/hop{hop}"] = slow_redirect(f"/hop{hop + 1}", 0.3)
    web.routes["/hop3"] = answer(b"\x89PNG", "image/png")
    fetcher = GuardedFetcher(allowed_hosts=frozenset({web.host}), timeout_s=5, deadline_s=0.5)
    reader = MediaSourceReader(fetcher)
    with pytest.raises(ApiError) as excinfo:
        await reader.read(web.url("/hop0"), "image", allow_urls=True)
    assert excinfo.value.status == 400
    assert excinfo.value.body()["error"] == "could not fetch image URL: timed out"


def test_the_default_deadlines_are_bounded():
    tools = WebTools(GuardedFetcher(), None, extractor=Extractor())
    assert tools.fetch_deadline_s <= 10 and tools.scrape_deadline_s <= 20
    assert GuardedFetcher().deadline_s <= 30 and image_fetcher().deadline_s <= 30


# ------------------------------------------------------------------------------------------
# 3. Private IPv4 addresses inside IPv6 ones


@pytest.mark.parametrize(("address", "public"), [
    ("64:ff9b::7f00:1", False), ("64:ff9b::a9fe:a9fe", False), ("64:ff9b::808:808", True),
    ("64:ff9b:1::808:808", False),
    ("2002:7f00:0001::", False), ("2002:0a00:0001::1", False), ("2002:808:808::", True),
    ("::7f00:1", False), ("::a00:1", False), ("::808:808", True),
    ("::ffff:10.0.0.1", False), ("::ffff:8.8.8.8", True), ("::ffff:0:7f00:1", False),
    ("2001:4860:4860::8888", True),
])
def test_ipv6_addresses_are_judged_by_the_ipv4_they_embed(address: str, public: bool):
    assert is_public(address) is public


EMBEDDED_PRIVATE = ["64:ff9b::7f00:1", "2002:7f00:0001::", "::7f00:1", "::ffff:10.0.0.1",
                    "64:ff9b::a9fe:a9fe"]


@pytest.mark.parametrize("address", EMBEDDED_PRIVATE)
def test_redirects_to_embedded_private_addresses_are_refused(gateway: Gateway, web: Web,
                                                             address: str):
    """Refused before any connection, on the third hop (each hop is checked)."""
    web.routes["/clip.mp4"] = redirect("/again")
    web.routes["/again"] = redirect(f"http://[{address}]/clip.mp4")
    resp = quote_video(gateway, web.url("/clip.mp4"))
    assert resp.status_code == 400, resp.text
    assert resp.json()["error"] == "video URL host 127.0.0.1 is not reachable from here"
    assert [path for _, path, _ in web.seen] == ["/clip.mp4", "/again"]
    direct = quote_video(gateway, f"http://[{address}]/clip.mp4")
    assert direct.status_code == 400
    assert direct.json()["error"].endswith("is not reachable from here")


# ------------------------------------------------------------------------------------------
# 4. Credentials stay with their origin


RESULTS = (b'{"results": [{"title": "Zebras", "url": "https://example.org/z", '
           b'"content": "Striped."}]}')


@pytest.fixture
def elsewhere() -> Iterator[Web]:
    """Another origin (another port of the same host)."""
    server = Web()
    yield server
    server.close()


@pytest.mark.parametrize("status", [302, 307, 308])
async def test_the_search_key_is_not_sent_to_another_host(
        web: Web, extractor: Extractor, elsewhere: Web, status: int):
    web.routes["/search"] = redirect(elsewhere.url("/search"), status)
    elsewhere.routes["/search"] = answer(RESULTS, "application/json")
    fetcher = GuardedFetcher(allowed_hosts=frozenset({web.host, elsewhere.host}))
    tools = WebTools(fetcher, web.url("/search"), search_api_key="sk-secret",
                     extractor=extractor)
    docs = await tools.search("zebras")
    assert [d.content for d in docs] == ["Striped."]
    assert web.headers_at("/search")[0]["Authorization"] == "Bearer sk-secret"
    (received,) = elsewhere.headers_at("/search")
    assert "sk-secret" not in str(received) and "Authorization" not in received


async def test_the_search_key_follows_a_redirect_within_its_origin_only(
        web: Web, extractor: Extractor, elsewhere: Web):
    """Kept on a hop within the origin; once dropped, not sent again on a way back."""
    web.routes["/search"] = redirect("/v2/search", 307)
    web.routes["/v2/search"] = redirect(elsewhere.url("/bounce"), 307)
    elsewhere.routes["/bounce"] = redirect(web.url("/v3/search"), 307)
    web.routes["/v3/search"] = answer(RESULTS, "application/json")
    fetcher = GuardedFetcher(allowed_hosts=frozenset({web.host, elsewhere.host}))
    tools = WebTools(fetcher, web.url("/search"), search_api_key="sk-secret",
                     extractor=extractor)
    assert [d.title for d in await tools.search("zebras")] == ["Zebras"]
    assert web.headers_at("/v2/search")[0]["Authorization"] == "Bearer sk-secret"
    assert "Authorization" not in elsewhere.headers_at("/bounce")[0]
    assert "Authorization" not in web.headers_at("/v3/search")[0]
