"""The source audio of a voice change: its bytes (an upload, or fetched from `audio_url`), what
it is (judged from its first bytes, never from its name or declared type) and how long it
lasts (measured from its packets, not from what its header claims).

A file that is several files back to back (a chained Ogg, FLAC files concatenated) restarts
its timestamps at each join while a decoder plays every part: an Ogg file of more than one
logical stream is refused, and wherever timestamps go back the parts are added up, so the
length billed is never less than what the engine decodes (the engine also stops decoding at
the billed length, deployments/engines/audio.py `decode_audio`).

FFmpeg is never left to guess what a file is: the demuxer is named from the file's magic
signature and anything else is refused unopened; no protocol may be opened from inside the
file. The measure reads packets without decoding them, in a worker thread of its own pool,
stops as soon as the file is past the model's longest source, and has a deadline: a file
built to be slow to read cannot hold the Gateway's event loop or its default threads.
"""

from __future__ import annotations

import asyncio
import io
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

from serve_app.errors import ApiError, nest_errors

MAX_AUDIO_BYTES = 25 * 1024 * 1024  # files must be smaller
FETCH_TIMEOUT_S = 30.0  # the whole fetch of an `audio_url`
PROBE_TIMEOUT_S = 10.0  # a probe reads packets only: milliseconds for a 25 MB file
# What a file is, as its first bytes say, -> the FFmpeg demuxer that opens it. Formats
# recognised but never accepted by a voice changer are named only to say so.
DEMUXERS = {"mp3": "mp3", "wav": "wav", "ogg": "ogg", "flac": "flac"}
OPEN_OPTIONS = {"protocol_whitelist": "none"}

_probes = ThreadPoolExecutor(max_workers=2, thread_name_prefix="audio-probe")


@dataclass(frozen=True, slots=True)
class SourceAudio:
    """A checked source: its format (a `DEMUXERS` key) and its length in seconds."""

    format: str
    seconds: float


def refused(field: str, message: str, status: int = 400,
            code: str = "INVALID_AUDIO_FORMAT") -> ApiError:
    return ApiError(status, f"{field}: {message}", code=code,
                    details=nest_errors([((field,), message)]))


def sniff(data: bytes) -> str | None:
    """The format of an audio file from its magic signature: `mp3`, `wav`, `ogg`, `flac`; for
    other media `mp4`, `webm`, `aac`; None for anything else."""
    head = data[:12]
    if head[:4] == b"RIFF" and head[8:12] == b"WAVE":
        return "wav"
    if head[:4] == b"fLaC":
        return "flac"
    if head[:4] == b"OggS":
        return "ogg"
    if head[:3] == b"ID3":
        return "mp3"
    if len(head) >= 2 and head[0] == 0xFF and head[1] & 0xE0 == 0xE0:
        # an MPEG audio frame: layer bits 00 are ADTS (AAC), version bits 01 are reserved
        if head[1] & 0x06 == 0:
            return "aac"
        if head[1] & 0x18 != 0x08:
            return "mp3"
    if head[4:8] in (b"ftyp", b"moov", b"mdat"):
        return "mp4"
    if head[:4] == b"\x1a\x45\xdf\xa3":
        return "webm"
    return None


def _is_video(stream: Any) -> bool:
    """A video track (an MP3's or FLAC's cover picture is not one)."""
    from av.stream import Disposition

    return stream.type == "video" and not stream.disposition & Disposition.attached_pic


OGG_PAGE_HEADER = 27  # bytes before a page's segment table
OGG_BEGINS_STREAM = 0x02  # header type flag of a logical stream's first page


def ogg_streams(data: bytes) -> int | None:
    """How many logical streams an Ogg file begins, chained (one after another) or grouped
    (side by side); None when its pages do not follow one another from the first byte (a
    decoder would skip the gap: what hides behind it is not looked for)."""
    streams, at = 0, 0
    while at < len(data):
        if data[at:at + 4] != b"OggS" or at + OGG_PAGE_HEADER > len(data):
            return None
        segments = data[at + 26]
        table = data[at + OGG_PAGE_HEADER:at + OGG_PAGE_HEADER + segments]
        if len(table) < segments:
            return None
        if data[at + 5] & OGG_BEGINS_STREAM:
            streams += 1
        at += OGG_PAGE_HEADER + segments + sum(table)
    return streams


class _Timeline:
    """The length of a stream's packets, their parts added up wherever timestamps go back
    (a chain restarting at zero), and never less than the sum of their durations."""

    def __init__(self) -> None:
        self.before = 0.0  # the parts that ended before the current one
        self.end = 0.0  # the end of the current part
        self.last_start: float | None = None
        self.durations = 0.0

    def add(self, start: float, duration: float) -> None:
        if self.last_start is not None and start < self.last_start:
            self.before += self.end
            self.end = 0.0
        self.last_start = start
        self.end = max(self.end, start + duration)
        self.durations += duration

    @property
    def seconds(self) -> float:
        return max(self.before + self.end, self.durations)


def measure(data: bytes, fmt: str, field: str, most_seconds: float) -> float:
    """The length of the audio in seconds, from its packets' times (parts added up where
    they restart): 400 when it cannot be read, is a chained or grouped Ogg, has a video track
    or no audio; a length just past `most_seconds` once it is over (the packets after are not
    read)."""
    import av  # FFmpeg bindings; loaded on first use

    if fmt == "ogg":
        streams = ogg_streams(data)
        if streams is None:
            raise refused(field, "the ogg file could not be read: its pages do not follow "
                                 "one another")
        if streams > 1:
            raise refused(field, f"the ogg file holds {streams} streams (chained or grouped "
                                 "Ogg); send one stream")
    timeline = _Timeline()
    try:
        with av.open(io.BytesIO(data), mode="r", format=DEMUXERS[fmt],
                     options=OPEN_OPTIONS) as container:
            if any(_is_video(s) for s in container.streams):
                raise refused(field, "the file has a video track; send audio only")
            if not container.streams.audio:
                raise refused(field, "the file has no audio track")
            stream = container.streams.audio[0]
            base = stream.time_base
            for packet in container.demux(stream):
                if packet.pts is None or base is None:
                    continue
                timeline.add(float(packet.pts * base), float((packet.duration or 0) * base))
                if timeline.seconds > most_seconds:
                    break
    except ApiError:
        raise
    except (av.FFmpegError, ValueError, OSError, EOFError) as exc:
        raise refused(field, f"the {fmt} file could not be read") from exc
    if timeline.seconds <= 0:
        raise refused(field, "the length of the audio cannot be read")
    return round(timeline.seconds, 3)


async def check_source(data: bytes, field: str, accepted: tuple[str, ...],
                       most_seconds: float, *,
                       timeout_s: float = PROBE_TIMEOUT_S) -> SourceAudio:
    """The format and length of a source file, read in a worker thread within `timeout_s`:
    400 for a format the model does not accept (judged from the bytes) or a file that cannot
    be read in time."""
    if len(data) >= MAX_AUDIO_BYTES:
        raise ApiError(413, f"{field}: the file is {len(data)} bytes; files must be smaller "
                            f"than 25 MB ({MAX_AUDIO_BYTES} bytes)", code="PAYLOAD_TOO_LARGE",
                       raw_body={"code": "PAYLOAD_TOO_LARGE",
                                 "error": f"files must be smaller than 25 MB ({field})"})
    fmt = sniff(data)
    if fmt is None or fmt not in accepted:
        what = f"a {fmt} file" if fmt else "not an audio file this service recognises"
        raise refused(field, f"the file is {what}; send one of {', '.join(accepted)}")
    loop = asyncio.get_running_loop()
    try:
        async with asyncio.timeout(timeout_s):
            seconds = await loop.run_in_executor(_probes, measure, data, fmt, field,
                                                 most_seconds)
    except TimeoutError:
        raise refused(field, f"the file could not be read within {timeout_s:g} s") from None
    return SourceAudio(fmt, seconds)
