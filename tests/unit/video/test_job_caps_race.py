"""An account's concurrent job requests on one replica cannot all pass the open-jobs cap
(issue 25, item 3): forty text-to-video jobs at once (they fetch nothing, so no fetch slot
spaces them out) all read the cap before any was written; now twenty are queued and held,
the other twenty are 429 with nothing held."""

from __future__ import annotations

import threading

from tests.unit.video.api import post

CAP = 20  # JOB_OPEN_PER_ACCOUNT's default
BODY = {"model": "clip-maker", "prompt": "waves", "duration": "1s", "resolution": "256p",
        "aspect_ratio": "1:1"}


def test_forty_concurrent_queues_of_one_account_stop_at_the_cap(gateway, fakes, key, books):
    fakes["video-generation"].pause()  # the jobs stay open
    answers: list = []
    start = threading.Barrier(2 * CAP)

    def queue() -> None:
        start.wait()
        answers.append(post(gateway, key, "queue", BODY))

    threads = [threading.Thread(target=queue) for _ in range(2 * CAP)]
    try:
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()

        codes = sorted(answer.status_code for answer in answers)
        assert codes == [200] * CAP + [429] * CAP, codes
        refused = next(a for a in answers if a.status_code == 429).json()
        assert refused["code"] == "RATE_LIMIT_EXCEEDED"
        assert f"at most {CAP}" in refused["error"]
        assert books.open_holds() == CAP
        assert all(books.held(a.headers["cf-ray"]) for a in answers if a.status_code == 200)
        assert books.entries() == 0
    finally:
        fakes["video-generation"].resume()
