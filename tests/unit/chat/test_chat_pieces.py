"""The engine-independent pieces of chat: output filters, tool calls, the SSRF guard (files and
pages: test_file_extraction.py)."""

from __future__ import annotations

import asyncio

import pytest

from serve_app.chat.filters import CaretCitations, FilterChain, ThinkStripper
from serve_app.chat.tools import forced_call_schema, parse_calls
from serve_app.chat.web import find_urls
from serve_app.net_guard import BlockedAddress, GuardedFetcher, is_public
from serve_app.schemas.chat import ChatCompletionRequest


def _feed(f, pieces: list[str]) -> str:
    return "".join(f.feed(p) for p in pieces) + f.flush()


def test_think_blocks_are_stripped_even_when_split_across_chunks():
    assert _feed(ThinkStripper(), ["Hi <thi", "nk>secret</th", "ink> there"]) == "Hi  there"
    assert _feed(ThinkStripper(), ["<think>never closed"]) == ""
    assert _feed(ThinkStripper(), ["a < b and <thin"]) == "a < b and <thin"


def test_bracket_citations_become_carets():
    assert _feed(CaretCitations(), ["Paris [1", ", 2] is big [3]."]) == "Paris ^1,2^ is big ^3^."
    assert _feed(CaretCitations(), ["items[0] stays, [x] too"]) == "items[0] stays, [x] too"


def test_filter_chain_applies_in_order():
    chain = FilterChain([ThinkStripper(), CaretCitations()])
    assert _feed(chain, ["<think>[9]</think>Fact [2]"]) == "Fact ^2^"


def test_tool_calls_are_parsed_from_tagged_or_bare_json():
    known = {"get_time"}
    tagged = parse_calls('<tool_call>{"name": "get_time", "arguments": {"city": "Oslo"}}'
                         '</tool_call>', known)
    assert tagged[0]["function"]["name"] == "get_time"
    bare = parse_calls('{"name":"get_time","arguments":{"city":"a\tb"}}', known)
    assert bare and bare[0]["id"].startswith("call_")
    assert parse_calls("It is noon.", known) is None
    assert parse_calls('{"name": "rm_rf", "arguments": {}}', known) is None


def test_forced_schema_names_the_chosen_tool():
    req = ChatCompletionRequest.model_validate({
        "model": "m", "messages": [{"role": "user", "content": "x"}],
        "tools": [{"type": "function", "function": {"name": "a"}},
                  {"type": "function", "function": {"name": "b"}}],
        "tool_choice": {"type": "function", "function": {"name": "b"}}})
    schema = forced_call_schema(req)
    assert schema["properties"]["name"]["const"] == "b"


def test_urls_are_found_and_capped_at_five():
    text = " ".join(f"https://example.org/{i}." for i in range(8))
    assert find_urls(text) == [f"https://example.org/{i}" for i in range(5)]


@pytest.mark.parametrize("address,public", [
    ("127.0.0.1", False), ("10.1.2.3", False), ("192.168.0.1", False), ("169.254.169.254", False),
    ("::1", False), ("::ffff:127.0.0.1", False), ("fc00::1", False), ("8.8.8.8", True),
])
def test_private_addresses_are_not_public(address, public):
    assert is_public(address) is public


def test_fetcher_refuses_private_hosts_and_other_schemes():
    fetcher = GuardedFetcher()
    for url in ("http://127.0.0.1:9/", "http://localhost/", "file:///etc/passwd",
                "ftp://example.org/", "http://169.254.169.254/latest/meta-data"):
        with pytest.raises(BlockedAddress):
            asyncio.run(fetcher.fetch(url))


def test_held_stream_text_goes_out_up_to_a_possible_call():
    from serve_app.chat.tools import release

    assert release("Let me check. ") == ("Let me check. ", "")
    assert release('<tool_call>{"na') == ("", '<tool_call>{"na')
    assert release("</think><tool_call>{") == ("</think>", "<tool_call>{")
    assert release("Thinking done.<tool") == ("Thinking done.", "<tool")
    assert release('  {"name"') == ("", '  {"name"')  # a bare call at the start
