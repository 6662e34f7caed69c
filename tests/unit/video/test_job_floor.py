"""A job priced by its inputs is admitted on its floor: the least it can cost given what the
request says (each reference clip at its shortest, 1 s, plus the output seconds asked; an
upscale's asked seconds at the lowest tier), not one nano. An account that cannot pay that
gets its 402 before a byte is fetched (issue 25, item 3: an account holding 1 nano had the
Gateway fetch, probe and store ten reference clips before the real price refused it)."""

from __future__ import annotations

from tests.unit.conftest import account_key
from tests.unit.flows.books import nanos
from tests.unit.video.api import post, stored, wait
from tests.unit.video.clips import clip

CLIPS = 10  # the most a request may name
# clip-follower: 256x256 at 1:1 = 0.065536 MP, 0.1 USD per MP-second of references and output
FLOOR_USD = "0.0720896"  # 0.0065536 USD/s x (10 clips x 1 s + 1 s of output)


def follow(urls: list[str]) -> dict:
    return {"model": "clip-follower", "prompt": "follow them", "duration": "1s",
            "aspect_ratio": "1:1", "reference_video_urls": urls}


def test_ten_reference_clips_are_not_fetched_for_an_account_below_their_floor(
        gateway, fakes, media, books):
    poor, account_id = account_key(gateway, "0.07")  # more than a nano, less than the floor
    urls = [media.publish(f"ref-{i}.mp4", clip(2.0), "video/mp4") for i in range(CLIPS)]

    resp = post(gateway, poor, "queue", follow(urls))

    assert resp.status_code == 402, resp.text
    assert resp.json()["code"] == "INSUFFICIENT_BALANCE"
    assert media.requests == []  # was: all ten fetched, probed and stored first
    assert stored(gateway) == []
    assert books.open_holds() == 0 and books.entries() == 0
    assert books.balance_nanos(account_id) == nanos("0.07")
    assert fakes["video-generation"].calls == []


def test_an_account_that_can_pay_the_floor_is_held_the_real_price_once_the_clips_are_probed(
        gateway, fakes, media, books):
    payer, _ = account_key(gateway, "1")
    urls = [media.publish(f"ref-{i}.mp4", clip(2.0), "video/mp4") for i in range(CLIPS)]
    fakes["video-generation"].pause()

    resp = post(gateway, payer, "queue", follow(urls))

    assert resp.status_code == 200, resp.text
    # the clips last 2 s each: 0.0065536 USD/s x (20 + 1) s, above the floor
    assert books.held(resp.headers["cf-ray"]) == nanos("0.1376256")
    assert nanos("0.1376256") > nanos(FLOOR_USD)
    fakes["video-generation"].resume()
    assert wait(gateway, payer, "clip-follower", resp.json()["queue_id"]).status_code == 200


def test_an_upscale_of_fixed_length_is_refused_on_its_floor_for_quote_and_queue(
        gateway, media, books):
    """clip-upscaler's lowest tier is 0.01 USD/s: 2 s cost at least 0.02, whatever the clip."""
    poor, account_id = account_key(gateway, "0.015")
    url = media.publish("clip.mp4", clip(2.0), "video/mp4")
    body = {"model": "clip-upscaler", "duration": "2s", "video_url": url}
    for path in ("quote", "queue"):
        resp = post(gateway, poor, path, {**body, "prompt": "sharper"} if path == "queue"
                    else body)

        assert resp.status_code == 402, (path, resp.text)
    assert media.requests == []
    assert books.open_holds() == 0 and books.entries() == 0
    assert books.balance_nanos(account_id) == nanos("0.015")
