"""What the vLLM engine hands vLLM for a request's sampling and reasoning: values the API
accepts and vLLM refuses (top_p 0, repetition_penalty 0) are mapped so that vLLM takes them."""

from __future__ import annotations

import pytest

from deployments.engines.text import sampling_kwargs, template_kwargs
from deployments.protocol import Sampling, TextRequest

vllm = pytest.importorskip("vllm")
from vllm.exceptions import VLLMClientError  # noqa: E402


def _vllm_params(sampling: Sampling):
    return vllm.SamplingParams(n=sampling.n, max_tokens=8, **sampling_kwargs(sampling))


@pytest.mark.parametrize("n", [1, 3])
def test_top_p_zero_keeps_only_the_likeliest_token(n):
    with pytest.raises(VLLMClientError):
        vllm.SamplingParams(top_p=0)  # why it is mapped

    params = _vllm_params(Sampling(temperature=0.7, top_p=0, n=n))

    assert (params.top_k, params.top_p, params.n) == (1, 1.0, n)


def test_repetition_penalty_zero_is_no_penalty_and_large_ones_pass():
    assert _vllm_params(Sampling(repetition_penalty=0)).repetition_penalty == 1.0
    assert _vllm_params(Sampling(repetition_penalty=3.5)).repetition_penalty == 3.5


def test_other_sampling_values_reach_vllm_unchanged():
    params = _vllm_params(Sampling(temperature=0.5, top_p=0.9, top_k=-1, min_p=0.1, seed=7,
                                   stop=("\n",), logprobs=True, top_logprobs=3))

    assert (params.temperature, params.top_p, params.top_k) == (0.5, 0.9, 0)
    assert (params.min_p, params.seed, params.stop, params.logprobs) == (0.1, 7, ["\n"], 3)


@pytest.mark.parametrize(("effort", "expected"), [
    (None, {}),
    ("none", {"enable_thinking": False}),
    ("high", {"reasoning_effort": "high"}),
])
def test_the_reasoning_effort_reaches_the_chat_template(effort, expected):
    request = TextRequest(request_id="r", messages=[],
                          sampling=Sampling(reasoning_effort=effort))

    kwargs = template_kwargs(request)

    assert {k: v for k, v in kwargs.items() if k in ("enable_thinking", "reasoning_effort")} \
        == expected
    assert kwargs["add_generation_prompt"] is True
