"""The Gateway's site: the API under /api/v1, the console's built files under /console with
security headers, a 404 in the standard error shape elsewhere."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from serve_app.settings import Settings
from tests.unit.conftest import Gateway, make_gateway


@pytest.fixture
def built(tmp_path: Path) -> Iterator[Gateway]:
    dist = tmp_path / "dist"
    (dist / "assets").mkdir(parents=True)
    (dist / "index.html").write_text("<!doctype html><title>Console</title>")
    (dist / "assets" / "app.js").write_text("console.log('hi')")
    yield from make_gateway(Settings(data_dir=tmp_path, console_dir=dist))


def test_console_files_are_served_with_security_headers(built: Gateway) -> None:
    page = built.client.get("/console/")
    assert page.status_code == 200 and "<title>Console</title>" in page.text
    csp = page.headers["content-security-policy"]
    assert "script-src 'self'" in csp and "frame-ancestors 'none'" in csp
    assert page.headers["x-frame-options"] == "DENY"
    assert page.headers["referrer-policy"] == "no-referrer"
    assert page.headers["cf-ray"]  # the service headers, as on every answer
    script = built.client.get("/console/assets/app.js")
    assert script.status_code == 200 and "javascript" in script.headers["content-type"]
    redirect = built.client.get("/console", follow_redirects=False)
    assert redirect.status_code == 308 and redirect.headers["location"] == "/console/"


def test_paths_outside_the_site_are_standard_404s(built: Gateway) -> None:
    for path in ("/", "/consoles", "/api/v2/models", "/api/v1x"):
        resp = built.client.get(path)
        assert resp.status_code == 404, path
        assert resp.json()["error"] == "Not found"
    assert built.client.get("/api/v1/models").status_code == 200


def test_an_unbuilt_console_says_how_to_build_it(tmp_path: Path) -> None:
    for gateway in make_gateway(Settings(data_dir=tmp_path, console_dir=tmp_path / "none")):
        resp = gateway.client.get("/console/")
        assert resp.status_code == 503
        assert "make install" in resp.json()["error"]
