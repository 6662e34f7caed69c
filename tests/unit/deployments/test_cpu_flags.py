"""The CPU's flags, read once from /proc/cpuinfo: what picks bfloat16 for a CPU engine."""

from __future__ import annotations

import builtins
import io

import pytest

from deployments.engines import cpu_flags as module

CPUINFO = ("processor\t: 0\nvendor_id\t: AuthenticAMD\n"
           "flags\t\t: fpu sse2 avx2 avx512f avx512_bf16\n\nprocessor\t: 1\n"
           "flags\t\t: fpu sse2 avx2 avx512f avx512_bf16\n")


@pytest.fixture
def cpuinfo(monkeypatch):
    """/proc/cpuinfo reads as the given text (None: the file does not exist); PyTorch's
    kernels not capped."""
    real_open = builtins.open
    monkeypatch.delenv("ATEN_CPU_CAPABILITY", raising=False)

    def use(text: str | None) -> None:
        def fake_open(path, *args, **kwargs):
            if path != "/proc/cpuinfo":
                return real_open(path, *args, **kwargs)
            if text is None:
                raise FileNotFoundError(path)
            return io.StringIO(text)

        monkeypatch.setattr(builtins, "open", fake_open)
        module.cpu_flags.cache_clear()

    yield use
    module.cpu_flags.cache_clear()


def test_flags_are_the_words_of_the_flags_line(cpuinfo):
    cpuinfo(CPUINFO)
    assert module.cpu_flags() == {"fpu", "sse2", "avx2", "avx512f", "avx512_bf16"}
    assert module.cpu_has_bf16()


def test_a_cpu_without_bf16_gets_none(cpuinfo):
    cpuinfo(CPUINFO.replace(" avx512_bf16", ""))
    assert not module.cpu_has_bf16()


def test_an_engine_runs_bf16_only_where_the_cpu_computes_it(cpuinfo):
    cpuinfo(CPUINFO)
    assert module.cpu_dtype() == "bfloat16"
    cpuinfo(CPUINFO.replace(" avx512_bf16", ""))
    assert module.cpu_dtype() == "float32"


def test_a_flag_is_matched_whole_not_as_part_of_another(cpuinfo):
    cpuinfo("flags\t: avx512_bf16x amx_bf16_not\n")
    assert not module.cpu_has_bf16()


def test_no_cpuinfo_means_no_flags(cpuinfo):
    cpuinfo(None)
    assert module.cpu_flags() == frozenset()
    assert not module.cpu_has_bf16()


@pytest.mark.parametrize("capability", ["avx2", "default"])
def test_kernels_capped_below_avx512_compute_without_bf16(cpuinfo, monkeypatch, capability):
    cpuinfo(CPUINFO)
    monkeypatch.setenv("ATEN_CPU_CAPABILITY", capability)
    assert not module.cpu_has_bf16()


def test_kernels_allowed_avx512_keep_the_cpus_bf16(cpuinfo, monkeypatch):
    cpuinfo(CPUINFO)
    monkeypatch.setenv("ATEN_CPU_CAPABILITY", "avx512")
    assert module.cpu_has_bf16()
