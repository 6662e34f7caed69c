"""vLLM runs compiled unless a model's engine options say eager, and keeps its compiled graphs
under DATA_DIR, where the next start finds them."""

from __future__ import annotations

from deployments.engines.vllm_compile import compile_settings


def test_compiled_by_default_on_every_device():
    assert compile_settings({}, {})["enforce_eager"] is False
    assert compile_settings({}, {"VLLM_TARGET_DEVICE": "cpu"})["enforce_eager"] is False


def test_a_model_can_still_ask_for_eager():
    assert compile_settings({"enforce_eager": True}, {})["enforce_eager"] is True


def test_a_compiled_text_model_on_cpu_warms_up_on_fewer_tokens():
    cpu = {"VLLM_TARGET_DEVICE": "cpu"}
    assert compile_settings({}, dict(cpu))["max_num_batched_tokens"] == 512
    # vLLM's own default elsewhere: on a GPU, for an eager engine, for a vision model (one
    # image's tokens must fit in a step), and whatever the catalog says wins
    assert compile_settings({}, {})["max_num_batched_tokens"] is None
    assert compile_settings({"enforce_eager": True}, dict(cpu))["max_num_batched_tokens"] is None
    assert compile_settings({"vision": {"frame_side": 224}},
                            dict(cpu))["max_num_batched_tokens"] is None
    assert compile_settings({"max_num_batched_tokens": 2048},
                            dict(cpu))["max_num_batched_tokens"] == 2048
    # more sequences a step than 512 tokens would hold: vLLM would refuse to start
    assert compile_settings({"max_num_seqs": 1024}, dict(cpu))["max_num_batched_tokens"] is None


def test_the_compile_cache_lives_under_data_dir(tmp_path):
    env = {"DATA_DIR": str(tmp_path)}

    compile_settings({}, env)

    assert env["VLLM_CACHE_ROOT"] == str(tmp_path / "cache" / "vllm")


def test_an_operators_own_cache_root_wins(tmp_path):
    env = {"DATA_DIR": str(tmp_path), "VLLM_CACHE_ROOT": "/srv/vllm-cache"}

    compile_settings({}, env)

    assert env["VLLM_CACHE_ROOT"] == "/srv/vllm-cache"


def test_without_data_dir_vllm_keeps_its_default():
    env: dict[str, str] = {}

    compile_settings({}, env)

    assert "VLLM_CACHE_ROOT" not in env


def test_the_cpu_build_keeps_what_dynamo_traced_and_inductors_graphs(tmp_path):
    cpu = {"VLLM_TARGET_DEVICE": "cpu", "DATA_DIR": str(tmp_path)}
    gpu = {"DATA_DIR": str(tmp_path)}

    compile_settings({}, cpu)
    compile_settings({}, gpu)

    assert cpu["VLLM_USE_AOT_COMPILE"] == "1"  # loads back with the project's plugin
    assert "TORCHINDUCTOR_CACHE_DIR" not in cpu  # vLLM keeps inductor's graphs in the artifact
    assert "VLLM_USE_AOT_COMPILE" not in gpu and "TORCHINDUCTOR_CACHE_DIR" not in gpu


def test_without_the_plugin_the_cpu_build_reuses_inductors_own_cache(tmp_path):
    # vLLM's plugin allowlist leaves ours out: a failing load would trace again every start
    cpu = {"VLLM_TARGET_DEVICE": "cpu", "DATA_DIR": str(tmp_path),
           "VLLM_PLUGINS": "lora_filesystem_resolver"}

    compile_settings({}, cpu)

    assert cpu["VLLM_USE_AOT_COMPILE"] == "0"
    assert cpu["TORCHINDUCTOR_CACHE_DIR"] == str(tmp_path / "cache" / "vllm" / "inductor_cache")


def test_torchs_default_inductor_cache_moves_under_data_dir_but_an_operators_stays(tmp_path):
    from torch._inductor.runtime.cache_dir_utils import default_cache_dir

    cpu = {"VLLM_TARGET_DEVICE": "cpu", "DATA_DIR": str(tmp_path), "VLLM_USE_AOT_COMPILE": "0"}
    imported = {**cpu, "TORCHINDUCTOR_CACHE_DIR": default_cache_dir()}  # as importing vLLM sets
    chosen = {**cpu, "TORCHINDUCTOR_CACHE_DIR": "/srv/inductor"}

    compile_settings({}, imported)
    compile_settings({}, chosen)

    assert imported["TORCHINDUCTOR_CACHE_DIR"] == str(tmp_path / "cache" / "vllm" /
                                                      "inductor_cache")
    assert chosen["TORCHINDUCTOR_CACHE_DIR"] == "/srv/inductor"


def test_an_ahead_of_time_artifact_compiled_by_inductor_loads_back():
    from types import SimpleNamespace

    from deployments.engines.vllm_aot import loading_plain_functions

    def inductor_compiled(*inputs):  # what the CPU build's artifact holds: a plain function
        return inputs

    class VllmCompiled:  # vLLM's own backend (GPUs) finalizes itself
        finalized = False

        def finalize_loading(self, _config):
            self.finalized = True

    own = VllmCompiled()
    artifacts = {"cpu": inductor_compiled, "gpu": own}
    load = loading_plain_functions(
        lambda name: SimpleNamespace(_artifacts=SimpleNamespace(compiled_fn=artifacts[name])))

    cpu, gpu = load("cpu"), load("gpu")

    cpu._artifacts.compiled_fn.finalize_loading(object())  # vLLM's call: no longer fails
    assert cpu._artifacts.compiled_fn(1, 2) == (1, 2)
    gpu._artifacts.compiled_fn.finalize_loading(object())
    assert gpu._artifacts.compiled_fn is own and own.finalized


def test_the_plugin_wraps_torchs_loader_once_and_only_on_cpu(monkeypatch):
    import torch.compiler

    from deployments.engines import vllm_aot

    original = torch.compiler.load_compiled_function
    monkeypatch.setattr(torch.compiler, "load_compiled_function", original)
    monkeypatch.delenv("VLLM_TARGET_DEVICE", raising=False)
    vllm_aot.register()
    assert torch.compiler.load_compiled_function is original

    monkeypatch.setenv("VLLM_TARGET_DEVICE", "cpu")
    vllm_aot.register()
    wrapped = torch.compiler.load_compiled_function
    vllm_aot.register()  # vLLM loads plugins in every process, maybe more than once
    assert wrapped is not original and torch.compiler.load_compiled_function is wrapped
