"""Image bytes in and out of the image deployments: decoding (upright, RGB or RGBA) and encoding
(PNG, JPEG, WebP).

The Gateway applies every input rule from the header before it sends the bytes
(serve_app/images/rules.py: formats, modes, sizes, animation); what can still go wrong here is
what only decoding finds (truncated or corrupt data), reported as `ImageDecodeError` with the
Gateway's codes and messages. The pixel bound is checked again, before any pixel is decoded.
"""

from __future__ import annotations

import io
from typing import Any

from PIL import Image, ImageOps

ACCEPTED_FORMATS = ("PNG", "JPEG", "WEBP")
# No endpoint takes more pixels than this (the Gateway's ABSOLUTE_MAX_PIXELS); Pillow's own
# guard at the same bound.
MAX_PIXELS = 8192 * 8192
Image.MAX_IMAGE_PIXELS = MAX_PIXELS

_ALPHA_MODES = frozenset({"LA", "PA", "RGBA"})
UNREADABLE = "image could not be read: not a PNG, JPEG or WebP file"
CORRUPT = "image data is truncated or corrupt"


class ImageDecodeError(ValueError):
    """An input that cannot be decoded; reported to the Gateway as data (status, code, field)."""

    def __init__(self, message: str, field: str, status: int = 400,
                 code: str = "CORRUPTED_IMAGE") -> None:
        super().__init__(message)
        self.field = field
        self.status = status
        self.code = code

    def __reduce__(self) -> tuple[Any, ...]:
        return type(self), (str(self), self.field, self.status, self.code)


def decode_image(data: bytes, field: str) -> Image.Image:
    """Decode an image upright (EXIF orientation applied), in RGB, or RGBA when it has alpha.
    CPU-bound: the deployment runs it in a worker thread."""
    try:
        image = Image.open(io.BytesIO(data), formats=ACCEPTED_FORMATS)
    except (Image.DecompressionBombError, Image.DecompressionBombWarning) as exc:
        raise ImageDecodeError(f"image has too many pixels; at most {MAX_PIXELS} are allowed",
                               field, code="IMAGE_TOO_LARGE") from exc
    except Exception as exc:  # untrusted bytes: any parser failure means unreadable
        raise ImageDecodeError(UNREADABLE, field) from exc
    with image:
        width, height = image.size
        if width * height > MAX_PIXELS:
            raise ImageDecodeError(f"image is {width}x{height} = {width * height} pixels; at "
                                   f"most {MAX_PIXELS} are allowed", field,
                                   code="IMAGE_TOO_LARGE")
        try:
            image.load()
        except Exception as exc:  # truncated data, a header that lies about the size...
            raise ImageDecodeError(CORRUPT, field) from exc
        try:
            upright = ImageOps.exif_transpose(image)
        except Exception:  # unreadable EXIF: keep the image as stored
            upright = image.copy()
        has_alpha = upright.mode in _ALPHA_MODES or "transparency" in upright.info
        target = "RGBA" if has_alpha else "RGB"
        if upright.mode == target:
            return upright
        try:
            return upright.convert(target)
        except (ValueError, OSError) as exc:  # e.g. a transparency entry that does not fit
            raise ImageDecodeError(CORRUPT, field) from exc


# Pillow's encoder names and options per output format.
_ENCODERS: dict[str, tuple[str, dict[str, Any]]] = {
    "png": ("PNG", {"optimize": False, "compress_level": 6}),
    "jpeg": ("JPEG", {"quality": 92}),
    "webp": ("WEBP", {"quality": 90}),
}


def encode_image(image: Image.Image, fmt: str) -> bytes:
    name, options = _ENCODERS[fmt]
    if name == "JPEG" and image.mode not in ("RGB", "L"):
        image = image.convert("RGB")  # JPEG has no alpha
    out = io.BytesIO()
    image.save(out, name, **options)
    return out.getvalue()
