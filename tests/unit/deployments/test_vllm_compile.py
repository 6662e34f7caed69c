"""vLLM runs compiled unless a model's engine options say eager, and keeps its compiled graphs
under DATA_DIR, where the next start finds them."""

from __future__ import annotations

from deployments.engines.vllm_compile import compile_settings


def test_compiled_by_default_on_every_device():
    assert compile_settings({}, {})["enforce_eager"] is False
    assert compile_settings({}, {"VLLM_TARGET_DEVICE": "cpu"})["enforce_eager"] is False


def test_a_model_can_still_ask_for_eager():
    assert compile_settings({"enforce_eager": True}, {})["enforce_eager"] is True


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


def test_the_cpu_build_uses_the_compile_cache_that_loads_back(tmp_path):
    cpu = {"VLLM_TARGET_DEVICE": "cpu", "DATA_DIR": str(tmp_path)}
    gpu = {"DATA_DIR": str(tmp_path)}

    compile_settings({}, cpu)
    compile_settings({}, gpu)

    assert cpu["VLLM_USE_AOT_COMPILE"] == "0"
    assert cpu["TORCHINDUCTOR_CACHE_DIR"] == str(tmp_path / "cache" / "vllm" / "inductor_cache")
    assert "VLLM_USE_AOT_COMPILE" not in gpu and "TORCHINDUCTOR_CACHE_DIR" not in gpu


def test_torchs_default_inductor_cache_moves_under_data_dir_but_an_operators_stays(tmp_path):
    from torch._inductor.runtime.cache_dir_utils import default_cache_dir

    cpu = {"VLLM_TARGET_DEVICE": "cpu", "DATA_DIR": str(tmp_path)}
    imported = {**cpu, "TORCHINDUCTOR_CACHE_DIR": default_cache_dir()}  # as importing vLLM sets
    chosen = {**cpu, "TORCHINDUCTOR_CACHE_DIR": "/srv/inductor"}

    compile_settings({}, imported)
    compile_settings({}, chosen)

    assert imported["TORCHINDUCTOR_CACHE_DIR"] == str(tmp_path / "cache" / "vllm" /
                                                      "inductor_cache")
    assert chosen["TORCHINDUCTOR_CACHE_DIR"] == "/srv/inductor"
