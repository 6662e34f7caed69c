"""A benchmark figure beside its reference, its goal, and the printed and written report."""

from __future__ import annotations

import json
import time
from dataclasses import asdict, dataclass
from pathlib import Path


@dataclass
class Figure:
    """`ratio` is ours / reference for a rate; for a figure whose name ends in `_ms` or `_s` it
    is the figure itself (or ours - reference), with `goal` its ceiling. A peer figure also
    carries LiteLLM + vLLM's own value and ours against it (`litellm`, `litellm_ratio`); a
    ceiling set above a measured floor carries the floor."""

    name: str
    unit: str
    ours: float
    reference: float
    ratio: float | None
    goal: float
    litellm: float | None = None
    litellm_ratio: float | None = None
    # What no build of the platform can go below, measured in the same run (in `goal`).
    floor: float | None = None
    # A ratio whose goal is a ceiling (a slowdown: ours / reference at most `goal`).
    at_most: bool = False
    # Why a figure has no ratio (a reference that answered nothing, with its log).
    note: str | None = None

    @property
    def ceiling(self) -> bool:
        return self.at_most or self.name.endswith(("_ms", "_s"))

    @property
    def met(self) -> bool:
        if self.ratio is None:  # the reference answered nothing: met when ours answered
            return self.ours > 0 and not self.ceiling
        within = self.ratio <= self.goal if self.ceiling else self.ratio >= self.goal
        if self.litellm is None:
            return within
        ahead = self.ours < self.litellm if self.ceiling else self.ours > self.litellm
        return within and ahead


def rate_figure(name: str, unit: str, ours: float, reference: float, goal: float,
                note: str | None = None) -> Figure:
    """ours / reference; a reference of 0 (it answered nothing in the window) leaves the
    ratio empty, with `note` saying where to look."""
    ratio = round(ours / reference, 3) if reference > 0 else None
    return Figure(name, unit, round(ours, 2), round(reference, 2), ratio, goal,
                  note=note if ratio is None else None)


def slowdown_figure(name: str, unit: str, ours: float, reference: float,
                    goal: float) -> Figure:
    """ours / reference, at most `goal` (how many times longer ours took)."""
    return Figure(name, unit, round(ours, 2), round(reference, 2),
                  round(ours / reference, 3) if reference > 0 else None, goal, at_most=True)


def ceiling_figure(name: str, unit: str, ours: float, reference: float, goal: float,
                   *, added: bool = True) -> Figure:
    value = ours - reference if added else ours
    return Figure(name, unit, round(ours, 2), round(reference, 2), round(value, 2), goal)


def with_litellm(figure: Figure, litellm: float) -> Figure:
    """The figure with LiteLLM + vLLM's value alongside: ours / LiteLLM's for a rate, ours -
    LiteLLM's for a time."""
    figure.litellm = round(litellm, 2)
    figure.litellm_ratio = round(figure.ours - litellm, 2) if figure.ceiling \
        else round(figure.ours / litellm, 3) if litellm > 0 else None
    return figure


class Progress:
    def __init__(self, steps: int) -> None:
        self.steps, self.done, self.started = steps, 0, time.monotonic()

    def __call__(self, what: str) -> None:
        self.done += 1
        print(f"[{self.done}/{self.steps} {time.monotonic() - self.started:5.0f}s] {what}",
              flush=True)


def write(figures: list[Figure], results: Path) -> None:
    """The figures so far, as JSON: written after every step, so that a run that dies later
    keeps what it measured."""
    results.write_text(json.dumps([asdict(f) for f in figures], indent=2) + "\n")


def report(figures: list[Figure], results: Path) -> None:
    print(f"\n{'figure':<26} {'unit':<8} {'ours':>9} {'reference':>10} {'ratio':>8} "
          f"{'goal':>7} {'litellm':>9} {'vs it':>7}  met")
    for f in figures:
        litellm = f"{f.litellm:>9.2f} {f.litellm_ratio!s:>7}" if f.litellm is not None \
            else f"{'':>9} {'':>7}"
        ratio = f"{f.ratio:>8.3f}" if f.ratio is not None else f"{'-':>8}"
        print(f"{f.name:<26} {f.unit:<8} {f.ours:>9.2f} {f.reference:>10.2f} {ratio} "
              f"{f.goal:>7} {litellm}  {'yes' if f.met else 'NO'}"
              + (f" (floor {f.floor})" if f.floor is not None else "")
              + (f" ({f.note})" if f.note else ""))
    write(figures, results)
    print(f"\nwritten to {results}")
