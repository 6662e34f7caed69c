"""Whether media shows a face, for the models that need consent before they take face media:
OpenCV's frontal-face Haar cascade over a picture, or over a few keyframes of a clip.

The cascade is OpenCV's own (`cv2.data.haarcascades`) when its wheel ships it; OpenCV 5's
wheels do not, so the copy kept in `cascades/` (from Debian's opencv-data) is read then.
Detection decodes pixels, so it runs in a worker thread, on a picture scaled to `MAX_SIDE`.
"""

from __future__ import annotations

import asyncio
import io
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from serve_app.errors import ApiError, invalid_request
from serve_app.video.probe import open_clip

CASCADE_NAME = "haarcascade_frontalface_default.xml"
BUNDLED_CASCADE = Path(__file__).with_name("cascades") / CASCADE_NAME
# Pictures and frames are looked at this large at most (faces of a few percent of the side
# are still found; detection time stays in the tens of milliseconds).
MAX_SIDE = 640
# Keyframes of a clip looked at (the first ones: decoding them needs no other frame).
VIDEO_KEYFRAMES = 4
# A face is found where this many overlapping windows agree (OpenCV's usual value).
MIN_NEIGHBOURS = 5
MIN_FACE_PIXELS = 24


def cascade_path() -> Path:
    import cv2

    shipped = Path(getattr(cv2.data, "haarcascades", "") or "/nonexistent") / CASCADE_NAME
    return shipped if shipped.is_file() else BUNDLED_CASCADE


class FaceDetector:
    """`await detector.shows_face(data, "image" | "video", field)`; safe from any number of
    threads (each thread loads its own classifier: OpenCV's is not shared safely)."""

    def __init__(self, cascade: Path | None = None) -> None:
        self.cascade = cascade
        self._local = threading.local()

    def _classifier(self) -> Any:
        classifier = getattr(self._local, "classifier", None)
        if classifier is None:
            import cv2

            path = self.cascade or cascade_path()
            classifier = cv2.CascadeClassifier(str(path))
            if classifier.empty():
                raise RuntimeError(f"the face cascade {path} could not be loaded")
            self._local.classifier = classifier
        return classifier

    def _faces(self, grey: Any) -> int:
        """Faces in a greyscale picture (a uint8 array), scaled down to MAX_SIDE first."""
        import cv2

        height, width = grey.shape[:2]
        scale = MAX_SIDE / max(height, width)
        if scale < 1:
            grey = cv2.resize(grey, (max(1, round(width * scale)), max(1, round(height * scale))),
                              interpolation=cv2.INTER_AREA)
        found = self._classifier().detectMultiScale(
            cv2.equalizeHist(grey), scaleFactor=1.1, minNeighbors=MIN_NEIGHBOURS,
            minSize=(MIN_FACE_PIXELS, MIN_FACE_PIXELS))
        return len(found)

    def image_faces(self, data: bytes, field: str = "image_url") -> int:
        """Faces in a picture already checked by `inspect_image` (its first frame); a picture
        whose pixels cannot be decoded (its header was fine) is a 400 CORRUPTED_IMAGE."""
        import numpy as np
        from PIL import Image, ImageOps

        try:
            with Image.open(io.BytesIO(data)) as image:
                image.draft("L", (MAX_SIDE, MAX_SIDE))  # JPEG: decode at a reduced size
                upright = ImageOps.exif_transpose(image)
                grey = upright.convert("L")
                grey.thumbnail((MAX_SIDE, MAX_SIDE))
                pixels = np.asarray(grey)
        except Exception as exc:  # untrusted bytes: any decoder failure means unreadable
            raise unreadable_image(field) from exc
        return self._faces(pixels)

    def video_faces(self, data: bytes, field: str = "video_url") -> int:
        """Faces in the first keyframes of a clip already probed; a clip none of whose first
        keyframes decodes (its container was fine) is a 400 INVALID_VIDEO_FORMAT."""
        found = 0
        for i, grey in enumerate(self._keyframes(data, field)):
            found = self._faces(grey)
            if found or i + 1 >= VIDEO_KEYFRAMES:
                break
        return found

    @staticmethod
    def _keyframes(data: bytes, field: str) -> Iterator[Any]:
        """The clip's first keyframes in greyscale; refused when one cannot be decoded, or
        when there is none."""
        import av

        decoded = 0
        try:
            with open_clip(data, field) as container:
                stream = container.streams.video[0]
                stream.codec_context.skip_frame = "NONKEY"
                for frame in container.decode(stream):
                    decoded += 1
                    yield frame.to_ndarray(format="gray")
                    if decoded >= VIDEO_KEYFRAMES:
                        return
        except (av.FFmpegError, ValueError, OSError, IndexError) as exc:
            raise unreadable_video(field) from exc
        if not decoded:
            raise unreadable_video(field)

    async def shows_face(self, data: bytes, media: str, field: str) -> bool:
        """Whether the picture (`media` "image") or clip ("video") of `field` shows a face;
        ApiError 400 when its pixels cannot be decoded."""
        if media == "video":
            return await asyncio.to_thread(self.video_faces, data, field) > 0
        return await asyncio.to_thread(self.image_faces, data, field) > 0


def unreadable_image(field: str) -> ApiError:
    refused = invalid_request(f"{field}: the image data is truncated or corrupt", field)
    refused.code = "CORRUPTED_IMAGE"
    return refused


def unreadable_video(field: str) -> ApiError:
    refused = invalid_request(f"{field}: the video's frames cannot be decoded", field)
    refused.code = "INVALID_VIDEO_FORMAT"
    return refused
