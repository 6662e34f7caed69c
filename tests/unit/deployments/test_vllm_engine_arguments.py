"""A vLLM model's engine arguments reach vLLM, and a model whose engine runs on several GPUs
(tensor parallelism) gets a replica with those GPUs."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
import yaml
from ray import serve

from deployments.engines.text import vllm_engine_args
from deployments.registry import bind, deployment_options
from deployments.spec import replica_options
from serve_app.models.catalog import CatalogModel, load_catalog
from serve_app.models.vllm_arguments import vllm_arguments

AsyncEngineArgs = pytest.importorskip("vllm.engine.arg_utils").AsyncEngineArgs


def _model(tmp_path: Path, **engine_options) -> CatalogModel:
    model = {"id": "big-chat", "type": "text", "name": "Big chat", "deployment": "text-l",
             "engine": "vllm", "weights": "${DATA_DIR}/models/big", "size_class": "L",
             "engine_options": engine_options,
             "pricing": {"input": {"usd": 1, "diem": 1}, "output": {"usd": 2, "diem": 2}}}
    path = tmp_path / "models.yaml"
    path.write_text(yaml.safe_dump({"models": [model]}))
    return load_catalog(path).models[0]


def _weights_folder(tmp_path: Path) -> str:
    """A model folder on the machine: vLLM's arguments look a model name up otherwise."""
    folder = tmp_path / "models" / "big"
    folder.mkdir(parents=True)
    return str(folder)


def test_the_catalogs_engine_arguments_are_in_the_engines_arguments(tmp_path):
    model = _model(tmp_path, tensor_parallel_size=2, gpu_memory_utilization=0.85,
                   quantization="awq", max_model_len=8192, max_num_seqs=64,
                   enforce_eager=True)
    options = {k: v for k, v in model.engine_options.given().items() if k != "build"}
    weights = _weights_folder(tmp_path)
    args = vllm_engine_args(weights, options,
                            {"enforce_eager": True, "max_num_batched_tokens": None}, 72)
    assert isinstance(args, AsyncEngineArgs)
    assert args.tensor_parallel_size == 2
    assert args.gpu_memory_utilization == 0.85
    assert args.quantization == "awq"
    assert args.max_model_len == 8192
    assert (args.model, args.tokenizer) == (weights, weights)
    # The platform's own: the batch with its fair-share room, the compile choice.
    assert args.max_num_seqs == 72
    assert args.enforce_eager is True
    assert args.enable_prefix_caching is True


def test_the_platforms_defaults_stand_where_the_catalog_says_nothing(tmp_path):
    args = vllm_engine_args(_weights_folder(tmp_path), {},
                            {"enforce_eager": False, "max_num_batched_tokens": 512}, 11)
    assert args.tensor_parallel_size == 1
    assert args.max_model_len == 2048
    assert args.max_num_batched_tokens == 512
    assert args.structured_outputs_config.disable_any_whitespace is True


def test_the_argument_names_read_from_vllms_source_are_its_dataclass_fields():
    read = vllm_arguments()
    assert read is not None
    assert set(read.types) == {f.name for f in dataclasses.fields(AsyncEngineArgs)}
    for name, kind in (("tensor_parallel_size", int), ("gpu_memory_utilization", float),
                       ("enforce_eager", bool), ("max_model_len", int)):
        assert read.types[name] is kind


def test_a_tensor_parallel_model_gets_one_gpu_bundle_per_worker_on_one_node(tmp_path):
    model = _model(tmp_path, tensor_parallel_size=2)
    options = replica_options({"ray_actor_options": {"num_cpus": 8, "num_gpus": 2},
                               "max_ongoing_requests": 64}, [model])
    assert options["placement_group_bundles"] == [{"CPU": 8.0, "GPU": 1.0}, {"GPU": 1.0}]
    assert options["placement_group_strategy"] == "STRICT_PACK"
    # The replica sits in the first bundle; its engine's workers hold the GPUs.
    assert options["ray_actor_options"] == {"num_cpus": 8}
    assert options["max_ongoing_requests"] == 64
    # Serve accepts them (it refuses a replica that does not fit its first bundle).
    serve.deployment(lambda: None).options(name="text-l", **options)


def test_pipeline_and_tensor_parallelism_multiply(tmp_path):
    model = _model(tmp_path, tensor_parallel_size=2, pipeline_parallel_size=2)
    options = replica_options({"ray_actor_options": {"num_cpus": 4}}, [model])
    assert [b["GPU"] for b in options["placement_group_bundles"]] == [1.0] * 4


def test_a_one_gpu_model_keeps_the_deployments_options(tmp_path):
    model = _model(tmp_path, gpu_memory_utilization=0.9)
    given = {"ray_actor_options": {"num_cpus": 4, "num_gpus": 1}}
    assert replica_options(given, [model]) == given


def test_binding_a_tensor_parallel_model_places_its_replica_on_the_bundles(tmp_path):
    model = _model(tmp_path, tensor_parallel_size=2)
    app = bind("text-l", [model], {"data_dir": str(tmp_path)})
    cpus = deployment_options("text-l")["ray_actor_options"]["num_cpus"]
    bound = app._bound_deployment  # what Serve deploys: no public reader of its options
    assert bound._replica_config.placement_group_bundles == [
        {"CPU": float(cpus), "GPU": 1.0}, {"GPU": 1.0}]
    assert bound.ray_actor_options.get("num_gpus", 0) == 0
