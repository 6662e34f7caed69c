"""Where the time of one request goes, as a `Server-Timing` response header
(`auth;dur=0.12, limits;dur=0.80, hold;dur=0.95, model;dur=15.2, settle;dur=1.10, app;dur=18.6`).

Each step of a request (docs/architecture/request.md) records its wall time here; the
middleware that identifies requests writes the header when the response starts. Browsers'
developer tools and the benchmarks read it; a few `perf_counter` calls per request cost nothing
measurable.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager


class StepTimes:
    __slots__ = ("_started", "steps")

    def __init__(self) -> None:
        self._started = time.perf_counter()
        self.steps: list[tuple[str, float]] = []

    @contextmanager
    def step(self, name: str) -> Iterator[None]:
        start = time.perf_counter()
        try:
            yield
        finally:
            self.steps.append((name, (time.perf_counter() - start) * 1000))

    def record(self, name: str, ms: float) -> None:
        """A step measured elsewhere (the engine's own time, reported by its deployment)."""
        self.steps.append((name, ms))

    def elapsed_ms(self) -> float:
        """Milliseconds since the request arrived."""
        return (time.perf_counter() - self._started) * 1000

    def header(self) -> str:
        """The header value: each step, then `app`, the time since the request arrived."""
        total = (time.perf_counter() - self._started) * 1000
        return ", ".join(f"{name};dur={ms:.2f}" for name, ms in [*self.steps, ("app", total)])
