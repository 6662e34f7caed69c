"""The first admin key, generated on an empty database, reaches the person starting the
platform once (a terminal) and never a log record: Ray writes driver and replica logs to
files."""

from __future__ import annotations

import io
import logging
from pathlib import Path

import pytest

from serve_app.accounts import provisioning
from serve_app.app import build_app
from serve_app.cli import run as cli
from serve_app.settings import Settings


class Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


@pytest.fixture
def generated(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Every admin key bootstrap generates."""
    keys: list[str] = []

    def generate() -> str:
        keys.append(secret := real())
        return secret

    real = provisioning.generate_secret
    monkeypatch.setattr(provisioning, "generate_secret", generate)
    return keys


def _logged(caplog: pytest.LogCaptureFixture) -> str:
    return "\n".join(f"{r.name} {r.getMessage()} {r.args!r} {r.exc_text or ''}"
                     for r in caplog.records)


@pytest.mark.parametrize("terminal", [True, False])
def test_build_app_shows_the_key_on_a_terminal_only_and_never_logs_it(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture,
        generated: list[str], terminal: bool) -> None:
    stderr = Terminal() if terminal else io.StringIO()
    monkeypatch.setattr("sys.stderr", stderr)
    caplog.set_level(logging.DEBUG)  # the root: every logger that propagates
    for name in ("serve_app", "ray", "alembic", "sqlalchemy"):
        caplog.set_level(logging.DEBUG, logger=name)
    build_app({"settings": {"data_dir": str(tmp_path)}, "model_deployments": []})
    build_app({"settings": {"data_dir": str(tmp_path)}, "model_deployments": []})  # not empty
    assert len(generated) == 1
    key = generated[0]
    assert caplog.records  # the capture works (migrations log)
    assert key not in _logged(caplog)
    assert (key in stderr.getvalue()) is terminal
    assert stderr.getvalue().count(key) == (1 if terminal else 0)  # shown once
    if not terminal:
        assert "inference-admin create-key" in caplog.text


def test_the_admin_cli_prints_the_key_on_stderr_and_never_logs_it(
        tmp_path: Path, capsys: pytest.CaptureFixture, caplog: pytest.LogCaptureFixture,
        generated: list[str]) -> None:
    caplog.set_level(logging.DEBUG)
    cli(["accounts"], settings=Settings(data_dir=tmp_path))
    key = generated[0]
    out, err = capsys.readouterr()
    assert key in err and key not in out
    assert key not in _logged(caplog)
    assert key not in repr(provisioning.bootstrap(Settings(data_dir=tmp_path / "other")))
