"""Media probed with its container named and no nested protocol (issue 35, item 8c): FFmpeg is
not left to guess what a client's file is (a guessed playlist or concat demuxer opens the
files and URLs its text names, past the private-address guard); what is not an MP4, MOV or
WebM clip is refused unopened, and the clips are read as before."""

from __future__ import annotations

import pytest

from serve_app.errors import ApiError
from serve_app.video.probe import OPEN_OPTIONS, demuxer_of, probe_video
from tests.unit.video.api import post, stored
from tests.unit.video.clips import clip


def test_a_concat_list_naming_another_url_is_refused_and_nothing_else_is_fetched(
        gateway, fakes, media, key, books):
    inner = media.publish("inner.mp4", clip(2.0), "video/mp4")
    listing = media.publish("list.mp4", f"ffconcat version 1.0\nfile '{inner}'\n".encode(),
                            "video/mp4")
    before = books.balance_nanos()

    resp = post(gateway, key, "queue", {"model": "clip-upscaler", "prompt": "sharper",
                                        "duration": "auto", "video_url": listing})

    assert resp.status_code == 400, resp.text
    assert resp.json()["code"] == "INVALID_VIDEO_FORMAT"
    assert "not an MP4, MOV or WebM" in resp.json()["error"]
    assert [path for path in media.requests if "inner" in path] == []
    assert books.open_holds() == 0 and books.balance_nanos() == before
    assert stored(gateway) == [] and fakes["video-enhance"].calls == []


@pytest.mark.parametrize("text", [
    b"#EXTM3U\n#EXTINF:10,\nfile:///etc/hostname\n#EXT-X-ENDLIST\n",
    b"ffconcat version 1.0\nfile 'subfile,,start,0,end,0,,:/etc/hostname'\n",
    b"<?xml version='1.0'?><MPD><BaseURL>http://10.0.0.1/</BaseURL></MPD>",
])
def test_playlists_and_lists_are_refused_before_ffmpeg_opens_them(text: bytes) -> None:
    assert demuxer_of(text) is None
    with pytest.raises(ApiError) as refused:
        probe_video(text, "video_url")
    assert refused.value.status == 400 and refused.value.code == "INVALID_VIDEO_FORMAT"


def test_clips_open_with_their_demuxer_named_and_no_protocol_allowed() -> None:
    source = clip(1.0)
    assert demuxer_of(source) == "mov"
    assert OPEN_OPTIONS["protocol_whitelist"] == "none"
    probed = probe_video(source, "video_url")
    assert probed.seconds == pytest.approx(1.0, abs=0.2) and probed.width == 160
