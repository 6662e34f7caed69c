"""How long the Gateway takes to refuse what it must not process: a decompression bomb of an
image (refused from its header), compressed answers to its own fetches (a stacked gzip bomb
refused from its headers, a gzip bomb decoded up to the cap), and a trickling page cut at its
deadline. The unit tests assert that these are refused and how much is decoded; the time each
takes is a figure of the machine, printed here.

    .venv/bin/python benchmarks/refusals_bench.py [--repeat N]

Each figure is the median of N runs (default 5), in milliseconds.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from serve_app.errors import ApiError
from serve_app.images.inputs import MediaSourceReader, image_fetcher, inspect_image
from serve_app.net_guard import FetchTimedOut, GuardedFetcher
from tests.unit.images.test_image_inputs import png_declaring
from tests.unit.support.test_net_guard import BOMB, STACKED_BOMB, Web, answer, trickle


def _median_ms(run: Callable[[], object], repeat: int) -> float:
    times = []
    for _ in range(repeat):
        started = time.perf_counter()
        run()
        times.append((time.perf_counter() - started) * 1000)
    return statistics.median(times)


def _refused(work: Callable[[], object]) -> Callable[[], None]:
    def run() -> None:
        try:
            work()
        except ApiError:
            return
        raise AssertionError("not refused")
    return run


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=5)
    repeat = parser.parse_args().repeat

    png_bomb = png_declaring(60000, 60000, bytes(10_000_000))  # 3.6 gigapixels in ~10 kB
    figures = {"image bomb refused from its header":
               _median_ms(_refused(lambda: inspect_image(png_bomb, "image")), repeat)}

    web = Web()
    try:
        web.routes["/stacked"] = answer(STACKED_BOMB, "image/png", Content_Encoding="gzip, gzip")
        web.routes["/bomb"] = answer(BOMB, "image/png", Content_Encoding="gzip")
        web.routes["/slow"] = trickle
        reader = MediaSourceReader(image_fetcher(allowed_hosts=frozenset({web.host})))
        for name, path in (("stacked gzip bomb refused from its headers", "/stacked"),
                           ("gzip bomb (1 GiB) decoded up to the 25 MB cap", "/bomb")):
            figures[name] = _median_ms(_refused(
                lambda path=path: asyncio.run(reader.read(web.url(path), "image",
                                                          allow_urls=True))), repeat)
        cut = GuardedFetcher(allowed_hosts=frozenset({web.host}), deadline_s=0.5)

        def fetch_trickle() -> None:
            try:
                asyncio.run(cut.fetch(web.url("/slow")))
            except FetchTimedOut:
                return
            raise AssertionError("the trickle was not cut")
        figures["trickling page cut at a 500 ms deadline"] = _median_ms(fetch_trickle, repeat)
    finally:
        web.close()

    width = max(len(name) for name in figures)
    for name, ms in figures.items():
        print(f"{name:<{width}}  {ms:8.1f} ms")


if __name__ == "__main__":
    main()
