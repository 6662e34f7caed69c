"""The rules an image input must meet, read from its header before any pixel is decoded,
and the decoding itself: Pillow only, so the model replicas that decode share the gateway's
rules without its web stack. `ImageInputError` is a `ValueError` a replica reports as data."""

from __future__ import annotations

from io import BytesIO
from typing import Any

from PIL import Image, ImageOps

from serve_app.images.header_scan import HeaderTooCostly, check_header_cost

MAX_IMAGE_BYTES = 25 * 1024 * 1024  # images must be smaller: 25 MB or more is refused
# No endpoint takes more pixels than this, whatever its own bound (256 MB once RGBA).
ABSOLUTE_MAX_PIXELS = 8192 * 8192
IMAGE_FETCH_TIMEOUT_S = 15.0
MAX_FORM_FIELDS = 64

# Pillow's own guard, at the same bound: at open time, before any pixel is decoded, it warns
# above it and raises DecompressionBombError above twice it. Our check refuses both.
Image.MAX_IMAGE_PIXELS = ABSOLUTE_MAX_PIXELS

ACCEPTED_FORMATS = ("PNG", "JPEG", "WEBP")
ACCEPTED_MODES = frozenset({"1", "L", "LA", "P", "PA", "RGB", "RGBA"})
_ALPHA_MODES = frozenset({"LA", "PA", "RGBA"})

NOT_ACCEPTED_FORMAT = "image must be a PNG, JPEG or WebP file"
UNREADABLE = "image could not be read: not a PNG, JPEG or WebP file"
CORRUPT = "image data is truncated or corrupt"
ANIMATED = "animated images are not supported"
CMYK = "CMYK images are not supported; convert to RGB"
SIXTEEN_BIT = "16-bit images are not supported; use 8 bits per channel"

# Images we recognise but do not take, to say so rather than "could not be read".
_OTHER_SIGNATURES = (
    (b"GIF87a", "GIF"), (b"GIF89a", "GIF"), (b"BM", "BMP"), (b"II*\x00", "TIFF"),
    (b"MM\x00*", "TIFF"), (b"\x00\x00\x01\x00", "ICO"), (b"8BPS", "PSD"),
    (b"\xff\x0a", "JPEG XL"), (b"\x00\x00\x00\x0cJXL ", "JPEG XL"),
)
_HEIF_BRANDS = {b"heic": "HEIC", b"heix": "HEIC", b"mif1": "HEIF", b"avif": "AVIF",
                b"avis": "AVIF"}
_ORIENTATION_TAG = 0x0112
_SWAPPED_ORIENTATIONS = frozenset({5, 6, 7, 8})


class ImageInputError(ValueError):
    """An image we refuse. `str()` is the client's message; `status` is 400, or 413 for size."""

    def __init__(self, message: str, field: str, status: int = 400,
                 code: str = "INVALID_REQUEST") -> None:
        super().__init__(message)
        self.message = message
        self.field = field
        self.status = status
        self.code = code  # INVALID_REQUEST, IMAGE_TOO_SMALL, IMAGE_TOO_LARGE, CORRUPTED_IMAGE

    def __reduce__(self) -> tuple[Any, ...]:
        # Picklable as itself (replica errors may cross process boundaries).
        return type(self), (self.message, self.field, self.status, self.code)



def too_large_message(field: str, size: int | None) -> str:
    what = f"is {size} bytes" if size is not None else "is 25 MB or more"
    return (f"the file in {field!r} {what}; files must be smaller than 25 MB "
            f"({MAX_IMAGE_BYTES} bytes)")




# --------------------------------------------------------------------------------------------
# The rules, from the header


def _other_format(data: bytes) -> str | None:
    for signature, name in _OTHER_SIGNATURES:
        if data.startswith(signature):
            return name
    if data[4:8] == b"ftyp":
        return _HEIF_BRANDS.get(data[8:12])
    head = data[:256].lstrip().lower()
    if head.startswith(b"<svg") or (head.startswith(b"<?xml") and b"<svg" in data[:4096]):
        return "SVG"
    return None


def _check_header(image: Image.Image, field: str, min_pixels: int | None, limit: int) -> str:
    """Apply the rules to an opened, undecoded image; returns its format."""
    # Pillow names a JPEG that carries extra pictures (stereo pairs, phone previews) MPO.
    image_format = "JPEG" if image.format == "MPO" else (image.format or "")
    if image_format not in ACCEPTED_FORMATS:
        raise ImageInputError(NOT_ACCEPTED_FORMAT, field)
    width, height = image.size
    if width <= 0 or height <= 0:
        raise ImageInputError(f"image has no pixels ({width}x{height})", field)
    pixels = width * height
    if min_pixels is not None and pixels < min_pixels:
        raise ImageInputError(
            f"image is {width}x{height} = {pixels} pixels; at least {min_pixels} are required",
            field, code="IMAGE_TOO_SMALL")
    if pixels > limit:
        raise ImageInputError(
            f"image is {width}x{height} = {pixels} pixels; at most {limit} are allowed", field,
            code="IMAGE_TOO_LARGE")
    if image.format != "MPO" and getattr(image, "n_frames", 1) > 1:
        raise ImageInputError(ANIMATED, field)
    mode = image.mode
    if mode == "CMYK":
        raise ImageInputError(CMYK, field)
    if mode.startswith(("I", "F")):  # I;16, I;16B..., I (32-bit int), F (float)
        raise ImageInputError(SIXTEEN_BIT, field)
    if mode not in ACCEPTED_MODES:
        raise ImageInputError(f"images in mode {mode} are not supported; convert to RGB", field)
    return image_format


def open_checked(data: bytes, field: str, *, min_pixels: int | None,
                  max_pixels: int | None) -> tuple[Image.Image, str]:
    """Open (which reads the header only) and apply every rule; the caller closes the image."""
    if len(data) >= MAX_IMAGE_BYTES:
        raise ImageInputError(too_large_message(field, len(data)), field, 413)
    limit = ABSOLUTE_MAX_PIXELS if max_pixels is None else min(max_pixels, ABSOLUTE_MAX_PIXELS)
    try:
        check_header_cost(data)  # before Pillow walks the header in Python
    except HeaderTooCostly as exc:
        raise ImageInputError(f"image could not be read: {exc}", field,
                              code="CORRUPTED_IMAGE") from exc
    try:
        image = Image.open(BytesIO(data), formats=ACCEPTED_FORMATS)
    except (Image.DecompressionBombError, Image.DecompressionBombWarning) as exc:
        raise ImageInputError(f"image has too many pixels; at most {limit} are allowed",
                              field, code="IMAGE_TOO_LARGE") from exc
    except Exception as exc:  # untrusted bytes: any parser failure means unreadable
        other = _other_format(data)
        message = f"{NOT_ACCEPTED_FORMAT}, not {other}" if other else UNREADABLE
        raise ImageInputError(message, field, code="CORRUPTED_IMAGE") from exc
    try:
        return image, _check_header(image, field, min_pixels, limit)
    except BaseException:
        image.close()
        raise


def displayed_size(image: Image.Image) -> tuple[int, int]:
    """Width and height once the EXIF orientation is applied, from the metadata read with the
    header (Image.getexif itself: a PNG's override would decode the image to look further)."""
    try:
        orientation = Image.Image.getexif(image).get(_ORIENTATION_TAG, 1)
    except Exception:  # unreadable EXIF: decode_image keeps the image as stored too
        orientation = 1
    width, height = image.size
    return (height, width) if orientation in _SWAPPED_ORIENTATIONS else (width, height)



def decode_image(data: bytes, field: str, *, max_pixels: int | None = None) -> Image.Image:
    """Decode an image upright (EXIF orientation applied), in RGB, or RGBA when it has alpha.

    CPU-bound: run it in a worker thread or the model replica, not on the event loop.
    Raises ImageInputError (a ValueError) with the same rules and messages as `inspect_image`.
    """
    image, _ = open_checked(data, field, min_pixels=None, max_pixels=max_pixels)
    with image:
        try:
            image.load()
        except Exception as exc:  # truncated data, a header that lies about the size...
            raise ImageInputError(CORRUPT, field, code="CORRUPTED_IMAGE") from exc
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
            raise ImageInputError(CORRUPT, field, code="CORRUPTED_IMAGE") from exc
