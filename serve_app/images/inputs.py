"""Image inputs shared by every image endpoint: getting the bytes, and checking the image.

Two stages. At the gateway, `MediaSourceReader` (which also reads the videos and audio of other
services) and `read_image_body` get the bytes (raw base64, a data URL, an http(s) URL or a
multipart upload) and refuse anything of 25 MB or more
before it is read whole or decoded; `inspect_image` then checks the image from its header
alone (format, size, frames, mode) without decoding a pixel, in a worker thread with a deadline
(`ImageInspector`, which counts the images it refuses toward the account's budget). In the
model replica,
`decode_image` decodes. Both stages apply the same rules (rules.py): the gateway raises
`ApiError`, the replica `ImageInputError`, a `ValueError` it can report as data.
"""

from __future__ import annotations

import asyncio
import base64
import re
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from dataclasses import field as dataclass_field
from typing import Any
from urllib.parse import urlsplit

import httpx
from starlette.datastructures import UploadFile
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.formparsers import MultiPartException
from starlette.requests import Request
from starlette.types import Message, Receive

from serve_app.errors import (
    ApiError,
    invalid_request,
    payload_too_large,
)
from serve_app.images.rules import (
    CORRUPT,
    MAX_IMAGE_BYTES,
    ImageInputError,
    displayed_size,
    open_checked,
    too_large_message,
)
from serve_app.json_bodies import parse_json
from serve_app.limits.rate_limits import RateLimits
from serve_app.net_guard import (
    BlockedAddress,
    FetchTimedOut,
    GuardedFetcher,
    RefusedEncoding,
    TooLarge,
    TooManyRedirects,
)

IMAGE_FETCH_TIMEOUT_S = 15.0
MAX_FORM_FIELDS = 64
# The longest an image's header may take to read in the worker (it takes milliseconds: the
# header walk is bounded, rules.open_checked); past it the image is refused as unreadable.
IMAGE_INSPECT_TIMEOUT_S = 5.0


_URL_SCHEME = re.compile(r"[a-z][a-z0-9+.-]*://")
_WHITESPACE = re.compile(r"\s")


@dataclass(frozen=True, slots=True)
class ImageInput:
    """One image, checked from its header but not decoded. Width and height are as displayed,
    after the EXIF orientation (which `decode_image` applies)."""

    data: bytes = dataclass_field(repr=False)
    width: int
    height: int
    format: str
    mode: str
    field: str

    @property
    def pixels(self) -> int:
        return self.width * self.height


def to_api_error(err: ImageInputError) -> ApiError:
    """The answer the client gets for an `ImageInputError` (also one raised in a replica)."""
    if err.status == 413:
        return payload_too_large(err.message)
    refused = invalid_request(err.message, err.field)
    refused.code = err.code
    return refused


def inspect_image(data: bytes, field: str, *, min_pixels: int | None = None,
                  max_pixels: int | None = None) -> ImageInput:
    """Check an image from its header, without decoding it (a bounded walk, rules.open_checked:
    milliseconds; the gateway's requests run it in `ImageInspector`'s workers).

    Raises ApiError: 400 naming `field` for a refused image, 413 for 25 MB or more.
    """
    try:
        image, image_format = open_checked(data, field, min_pixels=min_pixels,
                                            max_pixels=max_pixels)
    except ImageInputError as exc:
        raise to_api_error(exc) from exc
    with image:
        width, height = displayed_size(image)
        return ImageInput(data=data, width=width, height=height, format=image_format,
                          mode=image.mode, field=field)


class ImageInspector:
    """`inspect_image` for the gateway's requests: in one of a few worker threads, never on the
    event loop, within a deadline; every image it refuses counts toward its account's budget
    of refused images (`RateLimits.image_refused`), and an account past it is refused (429)
    before its next image is read."""

    def __init__(self, limits: RateLimits | None, *, timeout_s: float = IMAGE_INSPECT_TIMEOUT_S,
                 workers: int = 2) -> None:
        self.limits = limits
        self.timeout_s = timeout_s
        self._workers = ThreadPoolExecutor(max_workers=workers,
                                           thread_name_prefix="image-inspect")

    async def inspect(self, data: bytes, field: str, *, account_id: str,
                      min_pixels: int | None = None,
                      max_pixels: int | None = None) -> ImageInput:
        """Raises ApiError: 400 naming `field` for a refused image (unreadable in time
        included), 413 for 25 MB or more, 429 when the account's budget is spent."""
        if self.limits is not None:
            self.limits.check_refused_images(account_id)
        work = self._workers.submit(inspect_image, data, field, min_pixels=min_pixels,
                                    max_pixels=max_pixels)
        try:
            async with asyncio.timeout(self.timeout_s):
                return await asyncio.wrap_future(work)
        except TimeoutError:
            work.cancel()
            refused: ApiError = to_api_error(ImageInputError(
                f"{CORRUPT}: its header could not be read in {self.timeout_s:g} s", field,
                code="CORRUPTED_IMAGE"))
        except ApiError as exc:
            refused = exc
        if self.limits is not None:
            await self.limits.image_refused(account_id)
        raise refused

    def close(self) -> None:
        self._workers.shutdown(wait=False, cancel_futures=True)


# --------------------------------------------------------------------------------------------
# Where the bytes come from


def image_fetcher(allowed_hosts: frozenset[str] = frozenset(),
                  timeout_s: float = IMAGE_FETCH_TIMEOUT_S) -> GuardedFetcher:
    """The fetcher for image URLs: public addresses only (plus `allowed_hosts`), under 25 MB."""
    return GuardedFetcher(allowed_hosts=allowed_hosts, timeout_s=timeout_s,
                          max_bytes=MAX_IMAGE_BYTES - 1)


def _decode_base64(text: str, field: str) -> bytes:
    """Base64 to bytes, refusing 25 MB or more from the length alone, before decoding."""
    if _WHITESPACE.search(text):  # line-wrapped base64 (the `base64` tool wraps at 76)
        text = "".join(text.split())
    if not text:
        raise invalid_request("must be a non-empty base64 string", field)
    padding = 2 if text.endswith("==") else 1 if text.endswith("=") else 0
    size = len(text) * 3 // 4 - padding
    if size >= MAX_IMAGE_BYTES:
        raise payload_too_large(too_large_message(field, size))
    text += "=" * (-len(text) % 4)  # tolerate missing padding
    try:
        return base64.b64decode(text, validate=True)
    except ValueError as exc:  # binascii.Error, or non-ASCII characters
        raise invalid_request("is not valid base64", field) from exc


_EXAMPLE_DATA_URL = {"image": "data:image/png;base64,...", "video": "data:video/mp4;base64,...",
                     "audio": "data:audio/mpeg;base64,..."}


def _data_url_payload(value: str, field: str, media: str = "image") -> str:
    example = _EXAMPLE_DATA_URL[media]
    header, comma, payload = value.partition(",")
    if not comma:
        raise invalid_request(f"is not a valid data URL ({example})", field)
    params = [part.strip().lower() for part in header[len("data:"):].split(";")]
    if len(params) < 2 or params[-1] != "base64":
        raise invalid_request(f"data URLs must be base64-encoded ({example})", field)
    media_type = params[0]
    # No type, or one that says nothing of the content, is left to the header check.
    if media_type and media_type != "application/octet-stream" \
            and not media_type.startswith(f"{media}/"):
        raise invalid_request(f"data URL media type {media_type!r} is not an {media} type"
                              if media == "image" else
                              f"data URL media type {media_type!r} is not a {media} type", field)
    return payload


class MediaSourceReader:
    """Turns a JSON string (raw base64, a data URL, or an http(s) URL) into the bytes of an
    image (or, with `media`, of a video or an audio file)."""

    def __init__(self, fetcher: GuardedFetcher, *, total_timeout_s: float | None = None) -> None:
        self.fetcher = fetcher
        # One deadline for the whole fetch: the fetcher's timeout applies to each read, which
        # a server sending a byte at a time would never hit.
        self.total_timeout_s = total_timeout_s or 2 * fetcher.timeout_s

    async def read(self, value: str, field: str, *, allow_urls: bool,
                   media: str = "image") -> bytes:
        """Raises ApiError: 400 naming `field`, 413 for 25 MB or more."""
        text = value.strip() if isinstance(value, str) else ""
        if not text:
            raise invalid_request(f"must be a non-empty base64 string or {media} URL"
                                  if allow_urls else "must be a non-empty base64 string", field)
        head = text[:16].lower()
        if head.startswith("data:"):
            return _decode_base64(_data_url_payload(text, field, media), field)
        if head.startswith(("http://", "https://")):
            if not allow_urls:
                raise invalid_request(
                    f"{media} URLs are not accepted here; send the {media} as base64 or a "
                    "data URL", field)
            return await self._fetch(text, field, media)
        if _URL_SCHEME.match(head):
            raise invalid_request(f"only http and https {media} URLs are supported", field)
        return _decode_base64(text, field)

    async def _fetch(self, url: str, field: str, media: str = "image") -> bytes:
        try:
            host = urlsplit(url).hostname
            _ = urlsplit(url).port  # raises ValueError for a bad port
        except ValueError as exc:
            raise invalid_request("is not a valid URL", field) from exc
        if not host:
            raise invalid_request("is not a valid URL", field)
        try:
            async with asyncio.timeout(self.total_timeout_s):
                fetched = await self.fetcher.fetch(url)
        except TooLarge as exc:  # as sent, or once decoded
            raise payload_too_large(too_large_message(field, None)) from exc
        except TooManyRedirects as exc:
            raise invalid_request(f"could not fetch {media} URL: too many redirects",
                                  field) from exc
        except RefusedEncoding as exc:
            raise invalid_request(f"could not fetch {media} URL: {exc.reason}", field) from exc
        except (TimeoutError, httpx.TimeoutException, FetchTimedOut) as exc:
            raise invalid_request(f"could not fetch {media} URL: timed out", field) from exc
        except BlockedAddress as exc:
            raise invalid_request(f"{media} URL host {host} is not reachable from here",
                                  field) from exc
        except (httpx.HTTPError, httpx.InvalidURL, OSError, ValueError) as exc:
            raise invalid_request(f"could not fetch {media} URL", field) from exc
        if not 200 <= fetched.status < 300:
            raise invalid_request(
                f"could not fetch {media} URL: the server answered HTTP {fetched.status}",
                field)
        if len(fetched.body) >= MAX_IMAGE_BYTES:  # a fetcher built with a larger cap
            raise payload_too_large(too_large_message(field, len(fetched.body)))
        return fetched.body


# --------------------------------------------------------------------------------------------
# Request bodies


def _body_too_large(limit: int) -> ApiError:
    return payload_too_large(f"Request body exceeds {limit} bytes")


def _capped(receive: Receive, limit: int) -> Receive:
    """`receive` that refuses the body once more than `limit` bytes have come (chunked
    bodies declare no length)."""
    received = 0

    async def capped_receive() -> Message:
        nonlocal received
        message = await receive()
        if message["type"] == "http.request":
            received += len(message.get("body", b""))
            if received > limit:
                raise _body_too_large(limit)
        return message

    return capped_receive


def _unsupported_media_type(content_type: str, multipart: bool) -> ApiError:
    accepted = "application/json or multipart/form-data" if multipart else "application/json"
    return ApiError(415, f"Invalid content type {content_type or '(none)'!r}; use {accepted}",
                    code="INVALID_CONTENT_TYPE")


async def read_image_body(request: Request, *, file_fields: frozenset[str],
                          multipart: bool = True, max_body_bytes: int, max_files: int,
                          max_fields: int = MAX_FORM_FIELDS,
                          ) -> tuple[dict[str, Any], dict[str, list[bytes]]]:
    """The body of an image request: (JSON object or plain form fields, uploaded files).

    Call it before anything else reads the body. JSON gives (object, {}). Multipart gives the
    text fields (repeated ones, and names ending in `[]`, as lists) and the bytes of the file
    parts, by field name with any `[]` dropped; a file in a field not in `file_fields` is a
    400, a text value in a file field is left among the text fields. Bodies over
    `max_body_bytes` and files of 25 MB or more are 413s; other content types 415.
    """
    declared = request.headers.get("content-length", "").strip()
    if declared.isdigit() and int(declared) > max_body_bytes:
        raise _body_too_large(max_body_bytes)
    content_type = request.headers.get("content-type", "")
    media_type = content_type.split(";", 1)[0].strip().lower()
    capped = Request(request.scope, _capped(request.receive, max_body_bytes))
    if media_type == "application/json" or media_type.endswith("+json"):
        return await _read_json(capped), {}
    if multipart and media_type == "multipart/form-data":
        return await _read_multipart(capped, file_fields, max_body_bytes=max_body_bytes,
                                     max_files=max_files, max_fields=max_fields)
    if not content_type and declared in ("", "0") \
            and "transfer-encoding" not in request.headers:
        return {}, {}  # no body at all: validation reports the missing fields
    raise _unsupported_media_type(content_type, multipart)


async def _read_json(request: Request) -> dict[str, Any]:
    value = await parse_json(await request.body())  # a large one in a worker, counted first
    if not isinstance(value, dict):
        raise invalid_request("Request body must be a JSON object")
    return value


async def _read_multipart(request: Request, file_fields: frozenset[str], *,
                          max_body_bytes: int, max_files: int, max_fields: int,
                          ) -> tuple[dict[str, Any], dict[str, list[bytes]]]:
    try:
        # Text parts are held in memory up to the body cap (base64 images may come as text);
        # file parts are spooled to disk past 1 MB.
        form = await request.form(max_files=max_files, max_fields=max_fields,
                                  max_part_size=max_body_bytes)
    except MultiPartException as exc:
        raise invalid_request(f"Invalid multipart body: {exc.message}") from exc
    except StarletteHTTPException as exc:  # how starlette reports the above inside an app
        raise invalid_request(f"Invalid multipart body: {exc.detail}") from exc
    fields: dict[str, Any] = {}
    files: dict[str, list[bytes]] = {}
    try:
        for name, value in form.multi_items():
            key = name.removesuffix("[]")
            if isinstance(value, UploadFile):
                if not value.filename and not value.size:
                    continue  # a file input left empty in a browser form
                if key not in file_fields:
                    raise invalid_request(f"field {name!r} does not take a file upload", key)
                if value.size is None or value.size >= MAX_IMAGE_BYTES:
                    raise payload_too_large(too_large_message(key, value.size))
                files.setdefault(key, []).append(await value.read())
            elif name.endswith("[]") or key in fields:
                _as_list(fields, key).append(value)
            else:
                fields[key] = value
    finally:
        await form.close()
    return fields, files


def _as_list(fields: dict[str, Any], key: str) -> list[Any]:
    current = fields.get(key)
    if not isinstance(current, list):
        current = fields[key] = [] if current is None else [current]
    return current


def check_anon_user_id(value: Any) -> str | None:
    """The optional `anon_user_id`: 1 to 128 printable ASCII characters, without `||`."""
    if value is None:
        return None
    if not isinstance(value, str):
        raise invalid_request("anon_user_id must be a string", "anon_user_id")
    if not 1 <= len(value) <= 128:
        raise invalid_request("anon_user_id must be 1 to 128 characters long", "anon_user_id")
    if any(not " " <= ch <= "~" for ch in value):
        raise invalid_request(
            "anon_user_id must contain printable ASCII characters only (0x20 to 0x7E)",
            "anon_user_id")
    if "||" in value:
        raise invalid_request("anon_user_id must not contain '||'", "anon_user_id")
    return value
