"""What a video file is (length, size, frame rate), read from its container with PyAV (FFmpeg)
without decoding a frame. Refuses what is not an MP4, MOV or WebM video, and a clip of more
than `MAX_SOURCE_FPS` frames a second, whether its header declares them or its packets hold
them: enhancement works on every frame but is priced per second, so a 1 s clip of 700 frames
would cost one second of work it does not pay for.

FFmpeg is never left to guess what a file is: the demuxer is chosen from the file's first bytes
(MP4/MOV boxes, the Matroska/WebM header) and anything else is refused unopened, since a
guessed playlist or concat demuxer would open the files and URLs its text names; and no
protocol may be opened from inside a file (`OPEN_OPTIONS`)."""

from __future__ import annotations

import asyncio
import io
import math
from typing import Any

from serve_app.billing.pricing.video import SourceVideo
from serve_app.errors import ApiError

# FFmpeg's names of the demuxers (as named when opening, and as guessed).
ACCEPTED_CONTAINERS = ("mov", "matroska", "mov,mp4,m4a,3gp,3g2,mj2", "matroska,webm")
# The first box types of an MP4 or MOV file (bytes 4 to 8), and the EBML magic of Matroska/WebM.
_MP4_BOXES = (b"ftyp", b"moov", b"mdat", b"free", b"skip", b"wide", b"pnot")
_EBML = b"\x1a\x45\xdf\xa3"
# Nothing opened from inside the file: no protocol allowed (a custom I/O reads the bytes), no
# external data references of MOV.
OPEN_OPTIONS = {"protocol_whitelist": "none", "enable_drefs": "0"}
MAX_SOURCE_PIXELS = 3840 * 2160
# The highest frame rate a source clip may have (the highest `target_fps` a job may ask).
MAX_SOURCE_FPS = 120


def _refused(field: str, message: str) -> ApiError:
    err = ApiError(400, f"{field}: {message}", code="INVALID_VIDEO_FORMAT")
    err.details = {field: {"_errors": [message]}}
    return err


def demuxer_of(data: bytes) -> str | None:
    """The FFmpeg demuxer an accepted clip opens with (`mov`, `matroska`), from its first
    bytes; None: not an MP4, MOV or WebM file."""
    if data[4:8] in _MP4_BOXES:
        return "mov"
    if data[:4] == _EBML:
        return "matroska"
    return None


def open_clip(data: bytes, field: str) -> Any:
    """The clip's container opened with its demuxer named and no nested protocol; 400
    INVALID_VIDEO_FORMAT for a file that is not an MP4, MOV or WebM (never opened)."""
    import av  # FFmpeg bindings; loaded on first use

    demuxer = demuxer_of(data)
    if demuxer is None:
        raise _refused(field, "the file is not an MP4, MOV or WebM video")
    return av.open(io.BytesIO(data), mode="r", format=demuxer, options=OPEN_OPTIONS)


def probe_video(data: bytes, field: str) -> SourceVideo:
    import av  # FFmpeg bindings; loaded on first use

    try:
        with open_clip(data, field) as container:
            if container.format.name not in ACCEPTED_CONTAINERS:
                raise _refused(field, f"{container.format.long_name} files are not accepted; "
                                      "send MP4, MOV or WebM")
            if not container.streams.video:
                raise _refused(field, "the file has no video stream")
            stream = container.streams.video[0]
            width, height = stream.codec_context.width, stream.codec_context.height
            fps = float(stream.average_rate or stream.base_rate or 0)
            if stream.duration is not None and stream.time_base is not None:
                seconds = float(stream.duration * stream.time_base)
            elif container.duration is not None:
                seconds = container.duration / 1_000_000
            elif stream.frames and fps:
                seconds = stream.frames / fps
            else:
                raise _refused(field, "the video's length cannot be read")
            if fps > MAX_SOURCE_FPS:
                raise _refused(field, f"the video declares {fps:g} frames a second; at most "
                                      f"{MAX_SOURCE_FPS} are accepted")
            if seconds > 0:
                _check_frames(container, stream, seconds, field)
    except ApiError:
        raise
    except (av.FFmpegError, ValueError, OSError) as exc:  # not a video FFmpeg can read
        raise _refused(field, "the file is not a readable video") from exc
    if not width or not height or seconds <= 0:
        raise _refused(field, "the video has no frames")
    if width * height > MAX_SOURCE_PIXELS:
        raise _refused(field, f"the video is {width}x{height}; at most 3840x2160 is accepted")
    return SourceVideo(seconds=round(seconds, 3), width=width, height=height, fps=fps or 24.0)


def _check_frames(container: Any, stream: Any, seconds: float, field: str) -> None:
    """Count the clip's frames from its packets (demuxed, not decoded; the count stops past
    the cap): a header that understates the rate does not let more frames through."""
    most = math.floor(MAX_SOURCE_FPS * seconds) + 1
    frames = 0
    for packet in container.demux(stream):
        if packet.size:
            frames += 1
            if frames > most:
                raise _refused(field, f"the video holds more than {MAX_SOURCE_FPS} frames a "
                                      f"second ({frames}+ frames in {seconds:g} s)")


async def probe(data: bytes, field: str) -> SourceVideo:
    return await asyncio.to_thread(probe_video, data, field)
