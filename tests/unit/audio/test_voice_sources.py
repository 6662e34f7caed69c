"""What a voice change's source is and how long it lasts, judged from its bytes: the magic
signature names the format (never the name or declared type), and the length is read from the
file's packets, not from what its header claims."""

from __future__ import annotations

import asyncio
import struct

import pytest

from serve_app.audio.sources import check_source, measure, sniff
from serve_app.errors import ApiError
from tests.unit.audio.conftest import encoded, mp4_clip, wav


def test_the_magic_signature_names_the_format():
    assert sniff(wav(1)) == "wav"
    assert sniff(encoded(1, "mp3")) == "mp3"  # with its ID3 tag
    assert sniff(b"\xff\xfb\x90\x64" + bytes(400)) == "mp3"  # a bare MPEG-1 layer III frame
    assert sniff(b"\xff\xf1\x50\x80" + bytes(400)) == "aac"  # ADTS: layer bits 00
    assert sniff(encoded(1, "opus")) == "ogg"
    assert sniff(encoded(1, "flac")) == "flac"
    assert sniff(mp4_clip()) == "mp4"
    assert sniff(b"\x1a\x45\xdf\xa3" + bytes(40)) == "webm"
    assert sniff(b"<html>not audio</html>") is None
    assert sniff(b"") is None


@pytest.mark.parametrize("fmt", ["mp3", "flac", "opus"])
def test_each_accepted_format_is_measured_from_its_packets(fmt):
    data = encoded(7.5, fmt)
    seconds = measure(data, sniff(data) or "", "file", 600)
    assert 7.4 <= seconds <= 7.6


def test_a_wav_header_that_claims_more_than_it_holds_is_measured_by_what_it_holds():
    real = wav(5)
    lying = real[:40] + struct.pack("<I", 10 * 60 * 8000 * 2) + real[44:]  # "ten minutes"
    assert measure(lying, "wav", "file", 600) == pytest.approx(5, abs=0.01)


def test_the_measure_stops_once_the_source_is_over_the_longest_accepted():
    seconds = measure(wav(90), "wav", "file", 30)
    assert 30 < seconds < 90  # past the cap: the rest was not read


def test_a_video_or_an_unaccepted_format_is_refused_before_it_is_opened():
    async def checked(data: bytes) -> None:
        await check_source(data, "file", ("wav", "mp3"), 120)

    for data in (mp4_clip(), encoded(2, "flac"), b"RIFF\x00\x00\x00\x00AVI LIST"):
        with pytest.raises(ApiError) as refused:
            asyncio.run(checked(data))
        assert refused.value.status == 400 and refused.value.code == "INVALID_AUDIO_FORMAT"
        assert refused.value.details == {"_errors": [], "file": {"_errors": [
            refused.value.message.removeprefix("file: ")]}}
