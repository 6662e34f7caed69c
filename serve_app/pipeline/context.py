"""What one request carries through the pipeline: its id, its caller, where its time went, and
the headers its answer will carry. Steps write here; only the outermost middleware turns it
into HTTP, so limits and billing never see FastAPI's `Request`."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import AbstractContextManager, contextmanager
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Protocol

from serve_app.timing import StepTimes

if TYPE_CHECKING:
    from serve_app.accounts.key_store import KeyRecord
    from serve_app.tracing import RequestTrace


class LateHeader(Protocol):
    """A header value known only when the answer starts (a wallet's remaining credit)."""

    def __str__(self) -> str: ...


@dataclass(eq=False, slots=True)
class RequestContext:
    request_id: str
    accept_encoding: str = ""
    times: StepTimes = field(default_factory=StepTimes)
    headers: dict[str, str | LateHeader] = field(default_factory=dict)
    caller: KeyRecord | None = None
    # The Bearer key found valid before the body was read (serve_app/caller_gate.py): the
    # route's auth takes it rather than looking the key up again.
    authenticated_key: KeyRecord | None = None
    # The model whose limits counted the request: failures count toward its error budget.
    limit_model: str = ""
    # Refused as an unsupported feature: counted by its own budget, not the failed one.
    unsupported_feature: bool = False
    # False when the request failed through no fault of its caller (a model at capacity):
    # its error budget does not count it.
    caller_failure: bool = True
    # What the access log tells of the request once it ends (serve_app/access_log.py), set by
    # the steps that know it: the route's template, what settlement charged, when a stream's
    # first piece came back, how long the model replica's fair-share gate kept it waiting.
    route: str = ""
    tokens_in: int = 0
    tokens_out: int = 0
    charged_nanos: int = 0
    first_token_ms: float | None = None
    gate_wait_ms: float | None = None
    # The request's trace (serve_app/tracing.py), None when tracing is off.
    trace: RequestTrace | None = None

    def step(self, name: str) -> AbstractContextManager[None]:
        """`with ctx.step("hold"): ...` records the step's wall time for `Server-Timing`, and
        its span when the request is traced."""
        if self.trace is None:
            return self.times.step(name)
        return self._traced_step(name)

    @contextmanager
    def _traced_step(self, name: str) -> Iterator[None]:
        assert self.trace is not None
        with self.trace.step(name), self.times.step(name):
            yield

    def record(self, name: str, ms: float) -> None:
        """A step measured elsewhere (a replica's own time)."""
        self.times.record(name, ms)
        if self.trace is not None:
            self.trace.past_step(name, ms)

    def charged(self, units: dict[str, int], nanos: int) -> None:
        """What settlement charged: tokens in (prompt, cache reads and writes), tokens out, and
        the cost in nano-USD."""
        self.tokens_in = (units.get("input", 0) + units.get("cache_read", 0)
                          + units.get("cache_write", 0))
        self.tokens_out = units.get("output", 0)
        self.charged_nanos = nanos

    def header_items(self) -> Iterator[tuple[str, str]]:
        for name, value in self.headers.items():
            yield name, value if isinstance(value, str) else str(value)
