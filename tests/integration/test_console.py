"""The web console in a real browser (Debian's headless Chromium, driven by Playwright) against
the running platform: sign in, read the charts after a few real requests, create and revoke a
key, stream a chat. Screenshots are saved under test-artifacts/console/."""

from __future__ import annotations

import io
import re
import shutil
from pathlib import Path

import httpx
import pytest
from PIL import Image, ImageDraw

from serve_app.cli import run as cli
from serve_app.settings import Settings

CHROMIUM = shutil.which("chromium")
ARTIFACTS = Path(__file__).resolve().parents[2] / "test-artifacts" / "console"

pytestmark = pytest.mark.skipif(
    CHROMIUM is None, reason="Debian's chromium is not installed (make test installs it)")


@pytest.fixture(scope="module")
def browser():
    from playwright.sync_api import sync_playwright

    with sync_playwright() as playwright:
        # As root (CI), Chromium's sandbox needs user namespaces it may not have.
        launched = playwright.chromium.launch(executable_path=CHROMIUM, headless=True,
                                              args=["--no-sandbox"])
        yield launched
        launched.close()


@pytest.fixture(scope="module")
def account(platform, tmp_path_factory) -> str:
    """An account of its own with a few real requests: its ADMIN key."""
    settings = Settings(data_dir=tmp_path_factory.mktemp("console"),
                        database_url=platform.database_url("sqlite"))
    admin = cli(["create-account", "--usd", "5"], settings=settings)["apiKey"]
    auth = {"Authorization": f"Bearer {admin}"}
    for prompt in ("Count to three.", "Name a colour."):
        resp = httpx.post(f"{platform.base_url}/chat/completions", headers=auth, timeout=120,
                          json={"model": "tiny-chat", "max_tokens": 8,
                                "messages": [{"role": "user", "content": prompt}]})
        assert resp.status_code == 200, resp.text
    resp = httpx.post(f"{platform.base_url}/embeddings", headers=auth, timeout=60,
                      json={"model": "text-embedding-all-minilm-l6-v2", "input": "hello"})
    assert resp.status_code == 200, resp.text
    return admin


def shot(page, name: str) -> None:
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=str(ARTIFACTS / f"{name}.png"), full_page=True)


def width_is(page, image, width: int, timeout_ms: int = 120_000) -> None:
    """Wait until the shown image has loaded at `width` pixels. Polled from the test:
    Playwright's `wait_for_function` polls by evaluating a string in the page, which the
    console's CSP (no 'unsafe-eval') refuses as soon as the first check is false."""
    waited = 0
    while (found := image.evaluate("img => img.naturalWidth")) != width:
        assert waited < timeout_ms, f"the image is {found} px wide, not {width}"
        page.wait_for_timeout(100)
        waited += 100


def test_console_signs_in_charts_usage_manages_keys_and_streams_chat(platform, browser,
                                                                     account):
    from playwright.sync_api import expect

    origin = platform.base_url.removesuffix("/api/v1")
    page = browser.new_page(viewport={"width": 1280, "height": 900})
    errors: list[str] = []
    # The browser itself logs "Failed to load resource" for each API error answer (the wrong
    # key below); anything else logged as an error is the console's fault.
    page.on("console", lambda m: errors.append(m.text) if m.type == "error"
            and not m.text.startswith("Failed to load resource") else None)
    page.goto(f"{origin}/console/")

    # Sign in: a wrong key is refused with the API's words, the right one opens the console.
    page.get_by_test_id("api-key").fill("sk-not-a-key")
    page.get_by_test_id("sign-in").click()
    expect(page.get_by_test_id("sign-in-error")).to_contain_text("Authentication failed")
    page.get_by_test_id("api-key").fill(account)
    page.get_by_test_id("sign-in").click()

    # Usage: the charts drew the three requests and their spend; the history lists them.
    page.get_by_test_id("nav-usage").click()
    requests_chart = page.get_by_test_id("chart-requests-by-date")
    expect(requests_chart).to_have_attribute("data-total", re.compile(r"^[3-9]"))
    spend = float(page.get_by_test_id("chart-by-model").get_attribute("data-total") or 0)
    assert spend > 0
    expect(page.get_by_test_id("usage-history").locator("tbody tr")).not_to_have_count(0)
    balance = httpx.get(f"{platform.base_url}/billing/balance",
                        headers={"Authorization": f"Bearer {account}"}).json()
    expect(page.get_by_test_id("balance-usd")).to_contain_text(
        f"${balance['balances']['usd']:.2f}")
    shot(page, "usage")

    # Keys: create one (its secret shown once), then revoke it.
    page.get_by_test_id("nav-keys").click()
    page.get_by_test_id("new-key-description").fill("from the browser")
    page.get_by_test_id("create-key").click()
    secret = page.get_by_test_id("new-key-secret")
    expect(secret).to_contain_text(re.compile(r"\S{20,}"))
    auth = {"Authorization": f"Bearer {account}"}
    keys = httpx.get(f"{platform.base_url}/api_keys", headers=auth).json()["data"]
    created = next(k for k in keys if k["description"] == "from the browser")
    row = page.locator(f'[data-key-id="{created["id"]}"]')
    expect(row).to_be_visible()
    shot(page, "keys")
    page.get_by_test_id(f"revoke-{created['id']}").click()
    page.get_by_test_id(f"confirm-revoke-{created['id']}").click()
    expect(row).to_have_count(0)
    keys = httpx.get(f"{platform.base_url}/api_keys", headers=auth).json()["data"]
    assert created["id"] not in {k["id"] for k in keys}

    # Playground: a streamed chat, with the headers that matter.
    page.get_by_test_id("nav-playground").click()
    page.get_by_test_id("chat-model").select_option("smollm2-135m-instruct")  # real weights
    page.get_by_test_id("chat-max-tokens").fill("16")
    page.get_by_test_id("chat-input").fill("What is the capital of France?")
    page.get_by_test_id("chat-send").click()
    output = page.get_by_test_id("chat-output")
    expect(output).to_have_attribute("data-done", "true", timeout=120_000)
    assert output.inner_text().strip()
    expect(page.get_by_test_id("response-headers")).to_contain_text(
        # the request id (CF-RAY): ours, or under Serve the id its proxy gave the request
        re.compile(r"[0-9a-f]{32}|[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}"))
    page.get_by_test_id("embed-input").fill("hello")
    page.get_by_test_id("embed-send").click()
    expect(page.get_by_test_id("embed-output")).to_contain_text("384")  # MiniLM's dimensions
    shot(page, "playground")

    # Images: upscale and background removal of an uploaded file, shown in the page.
    picture, square = io.BytesIO(), Image.new("RGB", (256, 256), (30, 90, 160))
    ImageDraw.Draw(square).ellipse((64, 48, 192, 208), fill=(240, 190, 40))
    square.save(picture, "PNG")
    page.get_by_test_id("image-file").set_input_files(
        {"name": "square.png", "mimeType": "image/png", "buffer": picture.getvalue()})
    page.get_by_test_id("image-op").select_option("upscale")
    page.get_by_test_id("image-scale").select_option("2")
    page.get_by_test_id("image-send").click()
    result = page.get_by_test_id("image-output")
    expect(result).to_be_visible(timeout=120_000)
    width_is(page, result, 512)
    expect(page.get_by_test_id("response-headers")).to_contain_text("upscaler")
    page.get_by_test_id("image-op").select_option("background-remove")
    page.get_by_test_id("image-send").click()
    expect(page.get_by_test_id("response-headers")).to_contain_text("background-remover",
                                                                    timeout=120_000)
    width_is(page, result, 256)
    shot(page, "playground-images")

    # A phone-width screen: nothing wider than the screen.
    page.set_viewport_size({"width": 375, "height": 800})
    page.get_by_test_id("nav-usage").click()
    expect(page.get_by_test_id("usage-history").locator("tbody tr")).not_to_have_count(0)
    shot(page, "usage-phone")
    width = page.evaluate("document.documentElement.scrollWidth")
    wide = page.evaluate("""[...document.querySelectorAll('body *')]
        .filter(e => e.getBoundingClientRect().right > 376)
        .slice(0, 5).map(e => e.tagName + '.' + e.className + '#' + (e.dataset.testid || ''))""")
    assert width <= 375, f"the page is {width}px wide on a 375px screen: {wide}"
    assert not errors, errors
    page.close()


def test_the_key_stays_in_the_session_unless_asked(platform, browser, account):
    origin = platform.base_url.removesuffix("/api/v1")
    context = browser.new_context()
    page = context.new_page()
    page.goto(f"{origin}/console/")
    page.get_by_test_id("api-key").fill(account)
    page.get_by_test_id("sign-in").click()
    page.get_by_test_id("nav-usage").wait_for()
    assert page.evaluate("Object.values(localStorage).join()").find(account) < 0
    page.get_by_test_id("sign-out").click()
    assert page.evaluate("Object.values(sessionStorage).join()").find(account) < 0
    page.get_by_test_id("api-key").fill(account)
    page.get_by_test_id("remember-key").check()
    page.get_by_test_id("sign-in").click()
    page.get_by_test_id("nav-usage").wait_for()
    assert account in page.evaluate("Object.values(localStorage).join()")
    context.close()
