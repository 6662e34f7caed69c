"""The catalog's engine options: a vLLM model's are vLLM's own engine arguments, checked by
name and type when the catalog loads; other engines' options are theirs. And the shipped
catalogs: a cluster's lists no test-weight model."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from pydantic import ValidationError

from deployments.spec import PLATFORM_OPTIONS
from serve_app.models.catalog import load_catalog
from serve_app.models.engine_options import EngineOptions
from serve_app.settings import PROJECT_ROOT

CONFIGS = PROJECT_ROOT / "configs"


def _catalog_with(tmp_path: Path, engine: str, engine_options: dict) -> Path:
    """A one-model catalog file whose model runs on `engine` with `engine_options`."""
    model = {"id": "big-chat", "type": "text", "name": "Big chat", "deployment": "text-l",
             "engine": engine, "weights": "${DATA_DIR}/models/big", "size_class": "L",
             "engine_options": engine_options,
             "pricing": {"input": {"usd": 1, "diem": 1}, "output": {"usd": 2, "diem": 2}}}
    path = tmp_path / "models.yaml"
    path.write_text(yaml.safe_dump({"models": [model]}))
    return path


def test_production_catalog_lists_no_test_weight_model():
    production = load_catalog(CONFIGS / "models.production.yaml")
    assert [m.id for m in production.models if m.test_weights] == []
    assert not any("test" in m.id for m in production.models)


def test_the_local_catalog_adds_only_test_weight_models_to_the_real_ones():
    local = load_catalog(CONFIGS / "models.yaml")
    production = load_catalog(CONFIGS / "models.production.yaml")
    only_local = {m.id for m in local.models} - {m.id for m in production.models}
    assert only_local == {m.id for m in local.models if m.test_weights}
    assert only_local >= {"stable-diffusion-test", "instruct-pix2pix-test",
                          "wan-text-to-video-test"}


def test_vllm_engine_arguments_of_the_right_types_load(tmp_path):
    catalog = load_catalog(_catalog_with(tmp_path, "vllm", {
        "tensor_parallel_size": 2, "gpu_memory_utilization": 0.85, "quantization": "awq",
        "max_model_len": 8192, "enforce_eager": False}))
    options = catalog.models[0].engine_options
    assert options.engine_arguments == {"tensor_parallel_size": 2,
                                        "gpu_memory_utilization": 0.85,
                                        "quantization": "awq", "max_model_len": 8192}


def test_a_misspelt_vllm_engine_option_fails_the_catalog_naming_model_and_option(tmp_path):
    with pytest.raises(ValidationError) as refused:
        load_catalog(_catalog_with(tmp_path, "vllm", {"tensor_paralel_size": 2}))
    message = str(refused.value)
    assert "model 'big-chat'" in message
    assert "'tensor_paralel_size' is not an engine argument of vLLM" in message
    assert "did you mean 'tensor_parallel_size'?" in message


def test_a_vllm_engine_option_of_the_wrong_type_fails_the_catalog(tmp_path):
    with pytest.raises(ValidationError) as refused:
        load_catalog(_catalog_with(tmp_path, "vllm", {"gpu_memory_utilization": "most"}))
    assert "model 'big-chat': engine option gpu_memory_utilization: 'most' is not of type " \
           "float" in str(refused.value)
    with pytest.raises(ValidationError, match="tensor_parallel_size: '2' is not of type int"):
        load_catalog(_catalog_with(tmp_path, "vllm", {"tensor_parallel_size": "2"}))


def test_the_model_argument_comes_from_the_weights(tmp_path):
    with pytest.raises(ValidationError, match="'model' is set by the platform from the "
                                              "model's `weights`"):
        load_catalog(_catalog_with(tmp_path, "vllm", {"model": "/elsewhere"}))


def test_other_engines_options_are_not_checked_against_vllm(tmp_path):
    catalog = load_catalog(_catalog_with(tmp_path, "sentence-transformers",
                                         {"threads": 2, "device": "cuda"}))
    assert catalog.models[0].engine_options.engine_arguments == {"threads": 2,
                                                                 "device": "cuda"}


def test_every_shipped_catalog_names_only_vllm_arguments():
    for name in ("models.yaml", "models.common.yaml", "models.production.yaml"):
        load_catalog(CONFIGS / name)  # raises on a bad engine option


def test_the_deployments_know_which_options_the_platform_reads():
    """A replica passes to vLLM every option but these (deployments/spec.py)."""
    assert set(EngineOptions.model_fields) == PLATFORM_OPTIONS
