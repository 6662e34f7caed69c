"""Consent is asked for media that shows a face, and only then: image-to-video looks for faces
in its inputs (OpenCV's frontal-face cascade, once the caller is held) and answers 409
`needs_consent` under the published flow name (`consents.seedance`, `face-media` accepted as
an alias) when one shows a face and no consent came; a plain picture needs none. A refusal
holds, charges and keeps nothing."""

from __future__ import annotations

import pytest

from deployments.engines.video import encode_mp4
from serve_app.video.faces import BUNDLED_CASCADE, FaceDetector, cascade_path
from tests.fakes.faces import drawn_face, drawn_face_png
from tests.unit.conftest import account_key
from tests.unit.flows.books import nanos
from tests.unit.video.api import post, stored, wait
from tests.unit.video.clips import clip, data_url, png

BODY = {"model": "face-animator", "prompt": "the wind picks up", "duration": "1s",
        "aspect_ratio": "1:1"}
QUOTE_USD = "0.0131072"  # 256x256 = 0.065536 MP x 0.2 USD x 1 s
CONFIRMED = {"confirmed_terms_and_privacy": True, "confirmed_legal_right": True,
             "confirmed_screening_acknowledged": True}


def test_a_plain_sky_blue_picture_needs_no_consent(gateway, media, key, books):
    sky = media.publish("sky.png", png((320, 320), (135, 206, 235)), "image/png")

    resp = post(gateway, key, "queue", {**BODY, "image_url": sky})

    assert resp.status_code == 200, resp.text
    assert wait(gateway, key, BODY["model"], resp.json()["queue_id"]).status_code == 200
    assert books.only_charge(resp.headers["cf-ray"]).total_nanos == nanos(QUOTE_USD)


def test_a_picture_with_a_face_needs_consent_and_nothing_is_held_or_kept(
        gateway, fakes, media, key, books):
    before = books.balance_nanos()
    face = media.publish("face.png", drawn_face_png((320, 320)), "image/png")

    resp = post(gateway, key, "queue", {**BODY, "image_url": face})

    assert resp.status_code == 409, resp.text
    needs = resp.json()
    assert needs["error"]["code"] == "needs_consent"
    assert "consents.seedance" in needs["error"]["message"]
    assert (needs["consent_flow"], needs["face_media_roles"]) == ("seedance", ["image"])
    assert needs["consent"]["consent_version"] == "2026-11-01"
    assert needs["consent"]["policy_text"] and needs["docs_url"] == "/console/#consent"
    assert set(needs) == {"error", "consent_flow", "face_media_roles", "consent", "docs_url"}
    assert books.open_holds() == 0 and books.entries() == 0
    assert books.balance_nanos() == before
    assert stored(gateway) == []
    assert fakes["video-generation"].calls == []


@pytest.mark.parametrize("flow", ["seedance", "face-media"])
def test_consent_under_the_published_name_or_its_alias_lets_a_face_through(gateway, media,
                                                                           key, books, flow):
    face = media.publish("face.png", drawn_face_png((320, 320)), "image/png")

    resp = post(gateway, key, "queue", {**BODY, "image_url": face, "consents": {flow: CONFIRMED}})

    assert resp.status_code == 200, resp.text
    assert wait(gateway, key, BODY["model"], resp.json()["queue_id"]).status_code == 200
    assert books.only_charge(resp.headers["cf-ray"]).total_nanos == nanos(QUOTE_USD)


def test_an_unconfirmed_consent_is_no_consent(gateway, key):
    partial = {**CONFIRMED, "confirmed_legal_right": False}
    body = {**BODY, "image_url": data_url(drawn_face_png(), "image/png"),
            "consents": {"seedance": partial}}

    assert post(gateway, key, "queue", body).status_code == 409


def test_faces_are_looked_for_only_once_the_caller_is_held(gateway, media, books):
    """A caller who cannot pay gets its 402 with the face picture never fetched."""
    broke, _ = account_key(gateway, "0")
    face = media.publish("face.png", drawn_face_png(), "image/png")

    resp = post(gateway, broke, "queue", {**BODY, "image_url": face})

    assert resp.status_code == 402, resp.text
    assert media.requests == []


def test_the_detector_finds_the_drawn_face_in_pictures_and_clips_and_none_in_plain_ones():
    """The detector's own answers, the cascade it reads (OpenCV's when its wheel ships one,
    else the copy kept in serve_app/video/cascades) and the frames it decodes."""
    detector = FaceDetector()
    assert cascade_path().is_file() and BUNDLED_CASCADE.is_file()
    for size in ((128, 128), (320, 240), (640, 480), (1024, 768)):
        assert detector.image_faces(drawn_face_png(size)) == 1, size
    assert detector.image_faces(png((320, 240))) == 0
    assert detector.image_faces(png((320, 240), (200, 80, 40))) == 0
    assert detector.video_faces(encode_mp4([drawn_face((320, 240))] * 8, 8)) == 1
    assert detector.video_faces(clip(1.0)) == 0
