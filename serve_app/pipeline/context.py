"""What one request carries through the pipeline: its id, its caller, where its time went, and
the headers its answer will carry. Steps write here; only the outermost middleware turns it
into HTTP, so limits and billing never see FastAPI's `Request`."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Protocol

from serve_app.timing import StepTimes

if TYPE_CHECKING:
    from serve_app.accounts.key_store import KeyRecord


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

    def step(self, name: str) -> AbstractContextManager[None]:
        """`with ctx.step("hold"): ...` records the step's wall time for `Server-Timing`."""
        return self.times.step(name)

    def record(self, name: str, ms: float) -> None:
        """A step measured elsewhere (a replica's own time)."""
        self.times.record(name, ms)

    def header_items(self) -> Iterator[tuple[str, str]]:
        for name, value in self.headers.items():
            yield name, value if isinstance(value, str) else str(value)
