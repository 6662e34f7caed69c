"""A text answer's priced lines: the prompt's cached tokens at the cache-read price."""

from __future__ import annotations

from serve_app.billing.pricing import price, token_units
from serve_app.models.catalog import CatalogModel


def _model(**pricing) -> CatalogModel:
    return CatalogModel(id="chat-a", type="text", name="Chat A", deployment="text-xs",
                        engine="vllm", size_class="XS",
                        pricing={"input": {"usd": 1}, "output": {"usd": 2}, **pricing})


def test_cached_tokens_are_billed_at_the_cache_read_price():
    model = _model(cache_input={"usd": 0.25, "diem": 0.25})

    cost = price(model, token_units(model, 1000, 10, cached_tokens=800))

    assert cost.units == {"input": 200, "cache_read": 800, "output": 10}
    assert cost.nanos == (200 * 1 + 800 * 0.25 + 10 * 2) * 1000  # per million: nano-USD


def test_without_a_cache_read_price_the_whole_prompt_is_input():
    model = _model()

    assert price(model, token_units(model, 1000, 10, cached_tokens=800)).units == {
        "input": 1000, "output": 10}


def test_a_cached_count_beyond_the_prompt_is_capped():
    model = _model(cache_input={"usd": 0.25})

    assert token_units(model, 100, 0, cached_tokens=500) == {
        "input": 0, "cache_read": 100, "output": 0}
    assert token_units(model, 100, 0, cached_tokens=-3)["input"] == 100
