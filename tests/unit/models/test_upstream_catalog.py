"""A catalog model on a server the operator runs (`engine: openai`): its section is checked when
the catalog loads like every other (unknown keys, missing fields, a key variable not set are
errors naming the model), and the key itself is never in the catalog."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml
from pydantic import ValidationError

from serve_app.models.catalog import load_catalog


def _catalog_with(tmp_path: Path, engine_options: dict[str, Any]) -> Path:
    model = {"id": "pool-chat", "type": "text", "name": "Pool chat", "deployment": "text-xs",
             "engine": "openai", "size_class": "M", "engine_options": engine_options,
             "pricing": {"input": {"usd": 1, "diem": 1}, "output": {"usd": 2, "diem": 2}}}
    path = tmp_path / "models.yaml"
    path.write_text(yaml.safe_dump({"models": [model]}))
    return path


WHOLE = {"base_url": "http://gpu-pool.internal:8000/v1", "upstream_model": "Qwen/Qwen3-8B",
         "api_key_env": "POOL_KEY_FOR_TEST", "read_timeout_s": 120, "max_concurrency": 32}


def test_a_whole_upstream_entry_loads_and_reaches_the_replica_as_written(tmp_path, monkeypatch):
    monkeypatch.setenv("POOL_KEY_FOR_TEST", "sk-upstream")
    model = load_catalog(_catalog_with(tmp_path, WHOLE)).models[0]
    assert model.engine == "openai"
    assert model.engine_options.given() == WHOLE  # the variable's name, never the key


def test_an_unknown_upstream_option_fails_the_catalog_naming_model_and_option(
        tmp_path, monkeypatch):
    monkeypatch.setenv("POOL_KEY_FOR_TEST", "sk-upstream")
    with pytest.raises(ValidationError) as refused:
        load_catalog(_catalog_with(tmp_path, {**WHOLE, "read_timeout": 120}))
    message = str(refused.value)
    assert "'pool-chat'" in message and "engine_options.read_timeout" in message
    assert "not an option of an openai engine" in message


def test_an_upstream_without_its_model_name_fails_the_catalog(tmp_path, monkeypatch):
    monkeypatch.setenv("POOL_KEY_FOR_TEST", "sk-upstream")
    options = {k: v for k, v in WHOLE.items() if k != "upstream_model"}
    with pytest.raises(ValidationError) as refused:
        load_catalog(_catalog_with(tmp_path, options))
    assert "'pool-chat'" in str(refused.value)
    assert "engine_options.upstream_model" in str(refused.value)


def test_a_key_variable_not_set_fails_the_catalog_naming_model_and_variable(
        tmp_path, monkeypatch):
    monkeypatch.delenv("POOL_KEY_FOR_TEST", raising=False)
    with pytest.raises(ValidationError) as refused:
        load_catalog(_catalog_with(tmp_path, WHOLE))
    message = str(refused.value)
    assert "'pool-chat'" in message and "POOL_KEY_FOR_TEST" in message
    assert "not set in the environment" in message


@pytest.mark.parametrize("wrong", [{"base_url": "gpu-pool:8000/v1"},
                                   {"max_concurrency": 0}, {"read_timeout_s": -1},
                                   {"native_tools": "sometimes"}])
def test_an_upstream_option_of_the_wrong_form_fails_the_catalog(tmp_path, monkeypatch, wrong):
    monkeypatch.setenv("POOL_KEY_FOR_TEST", "sk-upstream")
    with pytest.raises(ValidationError) as refused:
        load_catalog(_catalog_with(tmp_path, {**WHOLE, **wrong}))
    assert f"engine_options.{next(iter(wrong))}" in str(refused.value)


def test_an_upstream_that_needs_no_key_names_no_variable(tmp_path):
    options = {k: v for k, v in WHOLE.items() if k != "api_key_env"}
    assert load_catalog(_catalog_with(tmp_path, options)).models[0].engine == "openai"


def test_tools_go_to_the_server_as_they_came_only_where_the_entry_says_it_parses_them(
        tmp_path, monkeypatch):
    monkeypatch.setenv("POOL_KEY_FOR_TEST", "sk-upstream")
    assert not load_catalog(_catalog_with(tmp_path, WHOLE)).models[0].native_tools
    native = load_catalog(_catalog_with(tmp_path, {**WHOLE, "native_tools": True}))
    assert native.models[0].native_tools
