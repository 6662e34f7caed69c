"""vLLM's own measurements of a text engine, into Ray's metrics (deployments/metrics.py).

A stat logger of vLLM's interface (`StatLoggerBase`, vllm/v1/metrics/loggers.py), given to
`AsyncLLM` with the platform's `disable_log_stats=True` kept: vLLM then gathers its scheduler's
and each step's statistics for this logger alone (not its own Prometheus registry, not its
periodic log lines). Nothing is timed here: time to first token, time per output token, the
end-to-end and queue times are vLLM's figures, passed on. `record` runs on the engine's output
loop once per step, so it only adds numbers.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

from vllm.v1.metrics.loggers import StatLoggerBase

from deployments.metrics import engine_metrics


class RayEngineStats(StatLoggerBase):
    """vLLM's statistics of one engine, labelled by `tags` (`{"model": <catalog id>}`; the
    engine's owner may name the model once the engine is built: the dict is shared)."""

    def __init__(self, vllm_config: Any, engine_index: int = 0, *,
                 tags: dict[str, str]) -> None:
        self.engine_index = engine_index
        self.tags = tags
        self.metrics = engine_metrics()

    def record(self, scheduler_stats: Any, iteration_stats: Any, mm_cache_stats: Any = None,
               engine_idx: int = 0) -> None:
        m, tags = self.metrics, self.tags
        if scheduler_stats is not None:
            m.running.set(scheduler_stats.num_running_reqs, tags=tags)
            m.waiting.set(scheduler_stats.num_waiting_reqs, tags=tags)
            m.kv_cache_usage.set(scheduler_stats.kv_cache_usage, tags=tags)
            prefix = scheduler_stats.prefix_cache_stats
            if prefix is not None and prefix.queries:
                m.prefix_cache_queries.inc(prefix.queries, tags=tags)
                if prefix.hits:
                    m.prefix_cache_hits.inc(prefix.hits, tags=tags)
        if iteration_stats is None:
            return
        if iteration_stats.num_prompt_tokens:
            m.prompt_tokens.inc(iteration_stats.num_prompt_tokens, tags=tags)
        if iteration_stats.num_generation_tokens:
            m.generation_tokens.inc(iteration_stats.num_generation_tokens, tags=tags)
        if iteration_stats.num_preempted_reqs:
            m.preemptions.inc(iteration_stats.num_preempted_reqs, tags=tags)
        for seconds in iteration_stats.time_to_first_tokens_iter:
            m.ttft.observe(seconds, tags=tags)
        for finished in iteration_stats.finished_requests:
            m.e2e.observe(finished.e2e_latency, tags=tags)
            m.queue.observe(finished.queued_time, tags=tags)
            if finished.num_generation_tokens > 1:
                m.tpot.observe(finished.mean_time_per_output_token, tags=tags)

    def log_engine_initialized(self) -> None:
        pass


def stat_loggers(tags: dict[str, str]) -> list[Callable[[Any, int], StatLoggerBase]]:
    """The `stat_loggers` argument of `AsyncLLM.from_engine_args`, its metrics labelled by
    `tags`; none with ENGINE_STAT_LOGGING=0 (vLLM then gathers no statistics at all)."""
    if os.environ.get("ENGINE_STAT_LOGGING", "1") == "0":
        return []

    def factory(vllm_config: Any, engine_index: int = 0) -> StatLoggerBase:
        return RayEngineStats(vllm_config, engine_index, tags=tags)

    return [factory]
