"""Queued video as the reference delivers it. A model whose retrieve streams sends no
`download_url`; its retrieve answers the MP4 to a client that accepts video (no `Accept`,
`*/*`, `video/*`, `video/mp4`) and the JSON `COMPLETED` status to one whose `Accept` excludes
video (`application/json`). A model that delivers by link (catalog `delivery: download_url`)
sends a signed `download_url`, and its retrieve answers JSON status only (PROCESSING, then
COMPLETED), the video coming from the link, without a key."""

from __future__ import annotations

import time

import pytest

from serve_app.jobs.service import accepts
from tests.reference_api import response_schema, schema_errors
from tests.unit.video.api import post

STREAMED = {"model": "clip-maker", "prompt": "a kite over a beach", "duration": "1s",
            "resolution": "256p", "aspect_ratio": "16:9"}
BY_LINK = {**STREAMED, "model": "clip-maker-by-link"}
JSON_ONLY = {"Accept": "application/json"}


def _retrieve(gateway, key: str, body: dict, queue_id: str, headers: dict | None = None,
              **extra):
    return gateway.client.post("/api/v1/video/retrieve",
                               headers={**gateway.auth(key), **(headers or {})},
                               json={"model": body["model"], "queue_id": queue_id, **extra})


def _status_when_done(gateway, key: str, body: dict, queue_id: str) -> dict:
    """Poll as a JSON client does until the job is no longer PROCESSING (however long the
    fake deployment takes: there is no deadline to race)."""
    while True:
        resp = _retrieve(gateway, key, body, queue_id, JSON_ONLY)
        assert resp.status_code == 200, resp.text
        assert resp.headers["content-type"].startswith("application/json")
        if resp.json()["status"] != "PROCESSING":
            return resp.json()
        time.sleep(0.02)


def _assert_reference_status(answer: dict, status: str) -> None:
    schema = response_schema("/video/retrieve", "post")
    assert schema_errors(schema, answer) == []
    assert answer["status"] == status
    assert set(answer) == {"status", "average_execution_time", "execution_duration"}


def test_a_streamed_video_has_no_download_url_and_json_clients_see_completed(gateway, fakes,
                                                                             key):
    queued = post(gateway, key, "queue", STREAMED)

    assert queued.status_code == 200, queued.text
    assert set(queued.json()) == {"model", "queue_id"}
    assert schema_errors(response_schema("/video/queue", "post"), queued.json()) == []
    done = _status_when_done(gateway, key, STREAMED, queued.json()["queue_id"])
    _assert_reference_status(done, "COMPLETED")
    by_query = gateway.client.get(
        "/api/v1/video/retrieve", headers={**gateway.auth(key), **JSON_ONLY},
        params={"model": STREAMED["model"], "queue_id": queued.json()["queue_id"]})
    assert by_query.status_code == 200 and by_query.json()["status"] == "COMPLETED"


@pytest.mark.parametrize("accept", [None, "*/*", "video/mp4", "video/*",
                                    "application/json, video/mp4;q=0.5",
                                    "application/json, */*;q=0.1"])
def test_a_client_that_accepts_video_gets_the_mp4(gateway, fakes, key, accept):
    queued = post(gateway, key, "queue", STREAMED).json()
    _status_when_done(gateway, key, STREAMED, queued["queue_id"])

    resp = _retrieve(gateway, key, STREAMED, queued["queue_id"],
                     {"Accept": accept} if accept else None)

    assert resp.status_code == 200, resp.text
    assert resp.headers["content-type"] == "video/mp4"
    assert resp.content == fakes["video-generation"].made[0]


def test_a_json_answer_does_not_delete_the_media_it_did_not_send(gateway, fakes, key):
    queued = post(gateway, key, "queue", STREAMED).json()
    _status_when_done(gateway, key, STREAMED, queued["queue_id"])

    status = _retrieve(gateway, key, STREAMED, queued["queue_id"], JSON_ONLY,
                       delete_media_on_completion=True)
    video = _retrieve(gateway, key, STREAMED, queued["queue_id"],
                      delete_media_on_completion=True)
    gone = _retrieve(gateway, key, STREAMED, queued["queue_id"], JSON_ONLY)

    assert status.json()["status"] == "COMPLETED"
    assert video.content == fakes["video-generation"].made[0]
    assert gone.status_code == 404 and gone.json()["code"] == "MEDIA_NOT_FOUND"


def test_a_model_delivering_by_link_answers_json_status_only(gateway, fakes, key):
    video = fakes["video-generation"]
    video.pause()
    queued = post(gateway, key, "queue", BY_LINK)
    assert queued.status_code == 200, queued.text
    assert set(queued.json()) == {"model", "queue_id", "download_url"}
    assert schema_errors(response_schema("/video/queue", "post"), queued.json()) == []
    queue_id = queued.json()["queue_id"]
    waiting = _retrieve(gateway, key, BY_LINK, queue_id)  # no Accept: still JSON
    _assert_reference_status(waiting.json(), "PROCESSING")
    assert gateway.client.get(queued.json()["download_url"]).status_code == 404  # not made yet

    video.resume()
    _status_when_done(gateway, key, BY_LINK, queue_id)
    for accept in (None, "*/*", "video/mp4"):
        done = _retrieve(gateway, key, BY_LINK, queue_id, {"Accept": accept} if accept else None,
                         delete_media_on_completion=True)
        assert done.headers["content-type"].startswith("application/json")
        _assert_reference_status(done.json(), "COMPLETED")
    download = gateway.client.get(queued.json()["download_url"])  # no key
    assert download.status_code == 200
    assert download.headers["content-type"] == "video/mp4"
    assert download.content == video.made[0]

    completed = post(gateway, key, "complete", {"model": BY_LINK["model"], "queue_id": queue_id})
    assert completed.json() == {"success": True}
    assert gateway.client.get(queued.json()["download_url"]).status_code == 404
    gone = _retrieve(gateway, key, BY_LINK, queue_id)
    assert gone.status_code == 404 and gone.json()["code"] == "MEDIA_NOT_FOUND"


@pytest.mark.parametrize(("accept", "takes_video"), [
    (None, True), ("", True), ("*/*", True), ("video/*", True), ("video/mp4", True),
    ("VIDEO/MP4", True), ("application/json, */*;q=0.1", True),
    ("application/json", False), ("text/plain, application/*", False),
    ("*/*, video/*;q=0", False), ("video/mp4;q=0", False), ("video/webm", False),
    ("video/*;q=0, video/mp4", True), ("video/mp4;q=oops", False),
])
def test_accept_headers_that_take_an_mp4(accept, takes_video):
    assert accepts(accept, "video/mp4") is takes_video
