"""Chat's usage-priced extras through the whole flow, against a search provider and pages
served on loopback: a search the provider answered and each page scraped are charged on the
chat's own ledger entry at the answering model's catalog price, also when the model then fails
or refuses (at the requested model's price); what failed is not; the results come back as the
published `venice_web_search_documents` tool call, in streams too."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
import yaml

from serve_app.settings import Settings
from tests.fakes import count_prompt_tokens, crashed, reported
from tests.unit.conftest import Gateway, make_gateway
from tests.unit.flows.books import Books, nanos, per_million
from tests.unit.flows.conftest import CATALOG
from tests.unit.flows.sse import DONE, events

SEARCH_USD, SCRAPE_USD = "0.01", "0.02"  # chat-primary's extras here
INPUT_USD, OUTPUT_USD = 10, 20
RESULTS = [{"title": "Zebra facts", "url": "https://example.org/zebra",
            "content": "Zebras have stripes."}]
PAGE = b"<html><head><title>Lions</title></head><body><p>Lions have manes.</p></body></html>"


class Provider:
    """A search provider and a few pages, over a real socket."""

    def __init__(self) -> None:
        self.searches: list[dict[str, Any]] = []
        self.search_status = 200
        self.pages_served = 0
        provider = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: Any) -> None:
                pass

            def _send(self, status: int, body: bytes, content_type: str) -> None:
                self.send_response(status)
                self.send_header("Content-Type", content_type)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def do_POST(self) -> None:
                provider.searches.append(json.loads(self.rfile.read(
                    int(self.headers["Content-Length"]))))
                self._send(provider.search_status, json.dumps({"results": RESULTS}).encode(),
                           "application/json")

            def do_GET(self) -> None:
                provider.pages_served += 1
                if self.path == "/lions":
                    self._send(200, PAGE, "text/html; charset=utf-8")
                else:
                    self._send(404, b"missing", "text/plain")

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        threading.Thread(target=self.server.serve_forever, args=(0.05,), daemon=True).start()
        self.host = f"127.0.0.1:{self.server.server_address[1]}"

    def url(self, path: str) -> str:
        return f"http://{self.host}{path}"

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def provider() -> Iterator[Provider]:
    server = Provider()
    yield server
    server.close()


@pytest.fixture
def gateway_catalog(tmp_path: Path) -> Path:
    """The flows catalog, chat-primary pricing its web extras."""
    catalog = yaml.safe_load(CATALOG.read_text())
    for model in catalog["models"]:
        if model["id"] == "chat-primary":
            model["capabilities"]["supportsWebSearch"] = True
            model["pricing"]["web_search"] = {"usd": float(SEARCH_USD),
                                              "diem": float(SEARCH_USD)}
            model["pricing"]["web_scraping"] = {"usd": float(SCRAPE_USD),
                                                "diem": float(SCRAPE_USD)}
    path = tmp_path / "web-catalog.yaml"
    path.write_text(yaml.safe_dump(catalog))
    return path


@pytest.fixture
def web_gateway(tmp_path: Path, gateway_catalog: Path, fakes, provider: Provider
                ) -> Iterator[Gateway]:
    yield from make_gateway(Settings(
        data_dir=tmp_path, initial_credit_usd=10, model_catalog=gateway_catalog,
        web_search_url=provider.url("/search"), web_fetch_allowed_hosts=provider.host),
        handles=fakes)


@pytest.fixture
def web_key(web_gateway: Gateway) -> str:
    return web_gateway.create_key()["apiKey"]


@pytest.fixture
def web_books(web_gateway: Gateway) -> Iterator[Books]:
    books = Books(web_gateway)
    yield books
    books.close()


def _chat(gateway: Gateway, key: str, text: str = "Tell me about zebras", **params):
    stream = params.pop("stream", False)
    return gateway.client.post("/api/v1/chat/completions", headers=gateway.auth(key), json={
        "model": "chat-primary", "messages": [{"role": "user", "content": text}],
        "stream": stream, "service_parameters": params})


def _token_lines(usage: dict[str, int]) -> dict[str, tuple[int, int]]:
    return {"input": (usage["prompt_tokens"], per_million(INPUT_USD, usage["prompt_tokens"])),
            "output": (usage["completion_tokens"],
                       per_million(OUTPUT_USD, usage["completion_tokens"]))}


def test_a_web_search_is_charged_on_the_chats_own_entry(web_gateway, web_key, web_books,
                                                        provider):
    before = web_books.balance_nanos()

    resp = _chat(web_gateway, web_key, enable_web_search="on")

    assert resp.status_code == 200, resp.text
    assert len(provider.searches) == 1
    charge = web_books.only_charge(resp.headers["cf-ray"])
    assert charge.lines == {**_token_lines(resp.json()["usage"]),
                            "web_search": (1, nanos(SEARCH_USD))}
    assert web_books.balance_nanos() == before - charge.total_nanos
    skus = {line["sku"]: line for line in web_books.usage_history(resp.headers["cf-ray"])}
    assert skus["chat-primary-llm-web-search-unit"]["pricePerUnitUsd"] == float(SEARCH_USD)
    assert skus["chat-primary-llm-web-search-unit"]["units"] == 1
    analytics = web_gateway.client.get("/api/v1/billing/usage-analytics",
                                       headers=web_gateway.auth()).json()
    (model,) = analytics["byModel"]
    assert {b["type"] for b in model["breakdown"]} == {"Input", "Output", "Web Search"}


def test_only_the_pages_scraped_are_charged_and_no_search_runs(web_gateway, web_key,
                                                               web_books, provider):
    text = f"Compare {provider.url('/lions')} and {provider.url('/gone')}"

    resp = _chat(web_gateway, web_key, text, enable_web_scraping=True,
                 enable_web_search="auto")

    assert resp.status_code == 200, resp.text
    assert [d["title"] for d in resp.json()["service_parameters"]["web_search_citations"]] \
        == ["Lions"]
    assert provider.searches == []  # the scraped page takes the search's place
    charge = web_books.only_charge(resp.headers["cf-ray"])
    assert charge.lines == {**_token_lines(resp.json()["usage"]),
                            "web_scraping": (1, nanos(SCRAPE_USD))}


def test_a_failed_search_is_not_charged(web_gateway, web_key, web_books, provider):
    provider.search_status = 500

    resp = _chat(web_gateway, web_key, enable_web_search="auto")

    assert resp.status_code == 200, resp.text
    assert len(provider.searches) == 1
    charge = web_books.only_charge(resp.headers["cf-ray"])
    assert charge.lines == _token_lines(resp.json()["usage"])


# ---- what was done is charged, whatever happens after ----------------------------------------

def test_a_search_whose_model_fails_charges_the_search(web_gateway, web_key, web_books, fakes,
                                                       provider):
    """The attack: ask for a search, make the model fail (before, the chat failed and the
    search was free). The search the provider answered is charged alone, nothing held."""
    before = web_books.balance_nanos()
    fakes["text-xs"].fail_with(crashed())

    resp = _chat(web_gateway, web_key, enable_web_search="on")

    assert resp.status_code == 500, resp.text
    assert len(provider.searches) == 1
    charge = web_books.only_charge(resp.headers["cf-ray"])
    assert charge.model_id == "chat-primary"
    assert charge.lines == {"web_search": (1, nanos(SEARCH_USD))}
    assert web_books.balance_nanos() == before - charge.total_nanos
    assert web_books.open_holds() == 0


def test_pages_scraped_for_a_chat_the_engine_refuses_are_charged(web_gateway, web_key,
                                                                 web_books, fakes, provider):
    """The engine's own refusal (here a 400 it alone can find) comes after the pages were
    read: they are charged, the tokens it never generated are not."""
    before = web_books.balance_nanos()
    fakes["text-xs"].fail_with(reported(400, "Invalid generation parameters: no"))

    resp = _chat(web_gateway, web_key, f"Read {provider.url('/lions')}",
                 enable_web_scraping=True)

    assert resp.status_code == 400, resp.text
    charge = web_books.only_charge(resp.headers["cf-ray"])
    assert charge.lines == {"web_scraping": (1, nanos(SCRAPE_USD))}
    assert web_books.balance_nanos() == before - charge.total_nanos
    assert web_books.open_holds() == 0


@pytest.mark.parametrize("stream", [False, True], ids=["unary", "stream"])
def test_n_over_one_at_temperature_0_is_refused_before_the_web_is_read(
        web_gateway, web_key, web_books, fakes, provider, stream):
    """The attack: `n: 2` at temperature 0, which vLLM refuses, after a search and a scrape.
    Now a 400 before the hold: nothing searched, scraped, run or charged."""
    before = web_books.balance_nanos()

    resp = web_gateway.client.post(
        "/api/v1/chat/completions", headers=web_gateway.auth(web_key), json={
            "model": "chat-primary", "n": 2, "temperature": 0, "stream": stream,
            "messages": [{"role": "user", "content": f"Read {provider.url('/lions')}"}],
            "service_parameters": {"enable_web_search": "on", "enable_web_scraping": True}})

    assert resp.status_code == 400, resp.text
    assert resp.json()["code"] == "INVALID_REQUEST"
    assert "n" in resp.json()["details"]
    assert provider.searches == [] and fakes["text-xs"].calls == []
    assert web_books.entries() == 0 and web_books.open_holds() == 0
    assert web_books.balance_nanos() == before


def test_n_over_one_samples_at_a_temperature(web_gateway, web_key):
    resp = web_gateway.client.post(
        "/api/v1/chat/completions", headers=web_gateway.auth(web_key), json={
            "model": "chat-primary", "n": 2, "temperature": 0.7,
            "messages": [{"role": "user", "content": "Hi"}]})

    assert resp.status_code == 200, resp.text
    assert len(resp.json()["choices"]) == 2


def test_a_stream_that_breaks_charges_what_it_delivered_and_the_search(
        web_gateway, web_key, web_books, fakes):
    """The model breaks after its first piece: the prompt it read, the tokens sent and the
    search are charged (before, the whole hold was released)."""
    fakes["text-xs"].fail_with(crashed(), after_pieces=1)
    before = web_books.balance_nanos()

    resp = _chat(web_gateway, web_key, enable_web_search="on", stream=True)

    assert resp.status_code == 200, resp.text
    sent = events(resp.text)
    assert sent[-1] == DONE and sent[-2]["code"] == "INFERENCE_FAILED"
    delivered = "".join(c["choices"][0]["delta"].get("content") or "" for c in sent[:-2]
                        if c.get("choices"))
    assert delivered and delivered != fakes["text-xs"].reply
    (request,) = fakes["text-xs"].requests
    charge = web_books.only_charge(resp.headers["cf-ray"])
    prompt = count_prompt_tokens(request.messages)
    completion = len(delivered.split())
    assert charge.lines == {
        "input": (prompt, per_million(INPUT_USD, prompt)),
        "output": (completion, per_million(OUTPUT_USD, completion)),
        "web_search": (1, nanos(SEARCH_USD))}
    assert web_books.balance_nanos() == before - charge.total_nanos
    assert web_books.open_holds() == 0


def test_results_as_documents_use_the_published_tool_call(web_gateway, web_key):
    resp = _chat(web_gateway, web_key, enable_web_search="on",
                 return_search_results_as_documents=True)

    assert resp.status_code == 200, resp.text
    (call,) = resp.json()["choices"][0]["message"]["tool_calls"]
    assert call["type"] == "function"
    assert call["function"]["name"] == "venice_web_search_documents"
    assert json.loads(call["function"]["arguments"]) == {"documents": RESULTS}


def test_results_as_documents_come_first_in_a_stream_and_the_stream_is_charged(
        web_gateway, web_key, web_books, fakes):
    resp = _chat(web_gateway, web_key, enable_web_search="on", stream=True,
                 return_search_results_as_documents=True, include_search_results_in_stream=True)

    assert resp.status_code == 200, resp.text
    sent = events(resp.text)
    assert sent[-1] == DONE
    assert sent[0]["service_parameters"]["web_search_citations"] == RESULTS
    first = sent[1]["choices"][0]
    assert first["delta"]["role"] == "assistant"
    (call,) = first["delta"]["tool_calls"]
    assert (call["index"], call["function"]["name"]) == (0, "venice_web_search_documents")
    assert json.loads(call["function"]["arguments"]) == {"documents": RESULTS}
    text = "".join(c["choices"][0]["delta"].get("content") or "" for c in sent[2:-1]
                   if c["choices"])
    assert text == fakes["text-xs"].reply
    charge = web_books.only_charge(resp.headers["cf-ray"])
    assert charge.lines["web_search"] == (1, nanos(SEARCH_USD))


def test_a_hold_too_small_for_the_search_is_refused_before_it_runs(web_gateway, web_books,
                                                                   provider):
    """The hold covers the extras: a key whose limit covers the most the tokens may cost
    (the whole context, as for any web prompt, and the completion cap) but not the search too
    is refused with a 402 before the provider is asked."""
    tokens = per_million(INPUT_USD, 4096) + per_million(OUTPUT_USD, 256)  # chat-primary's caps
    limit_usd = (tokens + nanos(SEARCH_USD) // 2) / 1e9
    limited = web_gateway.create_key(consumptionLimit={"usd": limit_usd})["apiKey"]
    assert _chat(web_gateway, limited).status_code == 200  # without the search it fits

    resp = _chat(web_gateway, limited, enable_web_search="on")

    assert resp.status_code == 402, resp.text
    assert provider.searches == []
    assert web_books.entries() == 1  # the first chat's
