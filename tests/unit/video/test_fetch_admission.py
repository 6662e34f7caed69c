"""No work before the caller is counted and can pay: a video job's inputs, and the clip a quote
prices, are fetched only after the caller's hold (402 first, no byte fetched), a bounded number
at a time per account (429 past it), spooled to the result store, and the real price held once
the clip is probed. Whatever fails on the way leaves nothing held, charged or stored."""

from __future__ import annotations

import threading

from tests.unit.conftest import account_key
from tests.unit.flows.books import nanos
from tests.unit.video.api import post, stored, wait
from tests.unit.video.clips import clip, data_url, png

UPSCALE = {"model": "clip-upscaler", "prompt": "sharper", "duration": "auto"}
CONSENT = {"seedance": {"confirmed_terms_and_privacy": True, "confirmed_legal_right": True,
                        "confirmed_screening_acknowledged": True}}
UPSCALE_USD = "0.02"  # 160x120 x2 = 320x240, the 480p tier at 0.01 USD/s, over 2 s


def test_a_caller_without_credit_gets_402_before_any_input_is_fetched(gateway, media, books):
    broke, account_id = account_key(gateway, "0")
    video_url = media.publish("clip.mp4", clip(2.0), "video/mp4")
    image_url = media.publish("sky.png", png(), "image/png")
    attempts = [
        ("queue", {**UPSCALE, "video_url": video_url}),
        ("quote", {"model": "clip-upscaler", "duration": "auto", "video_url": video_url}),
        ("queue", {"model": "face-animator", "prompt": "a sky", "duration": "1s",
                   "aspect_ratio": "1:1", "image_url": image_url, "consents": CONSENT}),
    ]
    for path, body in attempts:
        resp = post(gateway, broke, path, body)

        assert resp.status_code == 402, (path, resp.text)
        assert resp.json()["code"] == "INSUFFICIENT_BALANCE"
    assert media.requests == []  # not one byte was asked for
    assert books.entries() == 0 and books.open_holds() == 0
    assert books.balance_nanos(account_id) == 0
    assert stored(gateway) == []


def test_an_upscale_is_held_at_its_probed_price_from_an_input_kept_in_the_store(
        gateway, fakes, media, key, books):
    source = clip(2.0)
    body = {**UPSCALE, "video_url": media.publish("clip.mp4", source, "video/mp4")}
    quote = post(gateway, key, "quote", {k: v for k, v in body.items() if k != "prompt"})
    assert quote.status_code == 200, quote.text
    assert quote.json() == {"quote": float(UPSCALE_USD)}
    assert books.open_holds() == 0 and books.entries() == 0  # the quote's hold went back
    fakes["video-enhance"].pause()

    queued = post(gateway, key, "queue", body)

    assert queued.status_code == 200, queued.text
    request_id = queued.headers["cf-ray"]
    assert books.held(request_id) == nanos(UPSCALE_USD)
    queue_id = queued.json()["queue_id"]
    assert stored(gateway) == ["input-video"]
    kept = gateway.settings.data_dir / "results" / "jobs" / queue_id / "input-video"
    assert kept.read_bytes() == source
    fakes["video-enhance"].resume()
    assert wait(gateway, key, body["model"], queue_id).status_code == 200


def test_a_clip_that_fails_its_probe_leaves_nothing_held_or_stored(gateway, media, key, books):
    before = books.balance_nanos()
    body = {**UPSCALE, "video_url": media.publish("bad.mp4", b"not a video", "video/mp4")}

    resp = post(gateway, key, "queue", body)

    assert resp.status_code == 400, resp.text
    assert resp.json()["code"] == "INVALID_VIDEO_FORMAT"
    assert media.requests == ["/files/bad.mp4"]
    assert books.open_holds() == 0 and books.entries() == 0
    assert books.balance_nanos() == before
    assert stored(gateway) == []


def test_a_caller_who_cannot_pay_the_probed_price_gets_402_and_keeps_nothing(
        gateway, media, books):
    poor, account_id = account_key(gateway, "0.01")  # the clip costs 0.02
    body = {**UPSCALE, "video_url": media.publish("clip.mp4", clip(2.0), "video/mp4")}

    resp = post(gateway, poor, "queue", body)

    assert resp.status_code == 402, resp.text
    assert resp.json()["code"] == "INSUFFICIENT_BALANCE"
    assert books.open_holds() == 0 and books.entries() == 0
    assert books.balance_nanos(account_id) == nanos("0.01")
    assert stored(gateway) == []


def test_an_account_fetches_a_bounded_number_of_inputs_at_once(gateway, media, key, books):
    """MEDIA_FETCHES_PER_ACCOUNT is 1 here: while one request of the account is fetching,
    its next one is a 429 that fetches nothing; another account is not held back."""
    body = {**UPSCALE, "video_url": media.publish("clip.mp4", clip(2.0), "video/mp4")}
    quote = {"model": "clip-upscaler", "duration": "auto", "video_url": body["video_url"]}
    media.hold()
    first: dict = {}
    fetching = threading.Thread(target=lambda: first.update(
        resp=post(gateway, key, "queue", body)))
    fetching.start()
    try:
        media.wait_for_request()

        second = post(gateway, key, "quote", quote)

        assert second.status_code == 429, second.text
        assert second.json()["code"] == "RATE_LIMIT_EXCEEDED"
        assert "at most 1" in second.json()["error"]
        assert media.requests == ["/files/clip.mp4"]  # the refused one fetched nothing
        other, _ = account_key(gateway, "1")
        elsewhere = threading.Thread(target=lambda: first.update(
            other=post(gateway, other, "quote", quote)))
        elsewhere.start()
        media.wait_for_request()  # the other account's fetch went out beside the first
    finally:
        media.release()
        fetching.join()
    elsewhere.join()
    assert first["resp"].status_code == 200, first["resp"].text
    assert first["other"].status_code == 200, first["other"].text
    assert books.held(first["resp"].headers["cf-ray"]) == nanos(UPSCALE_USD)
    again = post(gateway, key, "quote", quote)  # the slot is free again
    assert again.status_code == 200, again.text
    assert wait(gateway, key, body["model"], first["resp"].json()["queue_id"]).status_code == 200


def test_a_quote_ignores_a_video_url_its_price_does_not_depend_on(gateway, media, key, books):
    """Clients of the published interface send `video_url` with every quote: a model that
    takes none, or is not priced by it, answers its price without fetching it."""
    video_url = media.publish("clip.mp4", clip(2.0), "video/mp4")
    for body, usd in (
            ({"model": "clip-maker", "duration": "2s", "resolution": "256p"}, "0.02"),
            ({"model": "face-animator", "duration": "1s", "aspect_ratio": "1:1"},
             "0.0131072")):  # 256x256 = 0.065536 MP x 0.2 x 1 s
        resp = post(gateway, key, "quote", {**body, "video_url": video_url})

        assert resp.status_code == 200, resp.text
        assert nanos(resp.json()["quote"]) == nanos(usd)
    assert media.requests == []
    assert books.open_holds() == 0 and books.entries() == 0


def test_a_data_url_input_is_checked_after_the_hold_too(gateway, key, books):
    """Decoding and probing a data URL is work as well: a 402 comes first."""
    broke, _ = account_key(gateway, "0")
    body = {**UPSCALE, "video_url": data_url(b"not a video", "video/mp4")}

    assert post(gateway, broke, "queue", body).status_code == 402
    assert post(gateway, key, "queue", body).status_code == 400
    assert books.open_holds() == 0 and books.entries() == 0

