"""Image and video parts of a chat (`image_url`, `video_url`) for a vision model, read by the
Gateway in two steps; the model receives checked bytes (deployments/protocol.py `ChatImage`,
`ChatVideo`), never a URL.

1. `collect`, once the limiter has counted the caller and before the hold: the parts are
   counted against the model's bounds (catalog `engine_options.vision`, chat/vision.py) and
   must be in user messages; inline data (base64 or a data URL) is checked: its size from the
   base64 length before decoding (25 MB), an image's pixels from its header, a video probed
   (container, length, size, frame rate). Nothing is fetched yet: an inline part that is
   refused is refused before any URL is fetched.
2. The hold covers every part's tokens: from its pixels, a URL's part at the model's most.
3. `fetch`, after the hold: each URL is fetched (no private addresses, every redirect
   checked, 25 MB as sent and decoded) and checked as inline data is.

Both steps read media under the account's media slots (`MEDIA_FETCHES_PER_ACCOUNT`).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

from deployments.protocol import ChatImage, ChatVideo
from serve_app.billing.pricing.video import SourceVideo
from serve_app.chat.vision import VisionSpec
from serve_app.errors import ApiError, invalid_request
from serve_app.images.inputs import ImageInspector, MediaSourceReader
from serve_app.jobs.caps import FetchSlots
from serve_app.models.catalog import CatalogModel
from serve_app.schemas.chat import ChatCompletionRequest, ImagePart, VideoPart

# Images a chat takes: at most 16.8 megapixels (what the model's processor shrinks anyway);
# videos at most 1920x1080 (or 1080x1920) at 60 frames a second: the replica decodes the
# whole clip to pick its frames.
MAX_IMAGE_PIXELS = 4096 * 4096
MAX_VIDEO_PIXELS = 1920 * 1080
MAX_VIDEO_FPS = 60.0

# What an image or video part counts in the rate limiter's estimate of a prompt's tokens
# (its data does not count): about what Qwen2-VL makes of a large image. The count is
# corrected to the measured tokens once the model has answered.
PART_TOKENS_ESTIMATE = 1280

VideoProbe = Callable[[bytes, str], Awaitable[SourceVideo]]


@dataclass
class MediaItem:
    """One image or video part: where it came from, then what it was found to be."""

    kind: str  # "image" or "video"
    field: str  # e.g. messages[1].content[0].image_url
    source: str  # as sent: base64, a data URL or an http(s) URL
    image: ChatImage | None = None
    video: ChatVideo | None = None

    @property
    def is_url(self) -> bool:
        return self.source.lstrip()[:8].lower().startswith(("http://", "https://"))

    @property
    def ready(self) -> bool:
        return self.image is not None or self.video is not None

    def tokens(self, spec: VisionSpec) -> int:
        """The most tokens this part becomes on a model of `spec`."""
        if self.image is not None:
            return spec.image_tokens(self.image.width, self.image.height)
        if self.video is not None:
            return spec.video_tokens(self.video.width, self.video.height,
                                     spec.frames_for(self.video.seconds))
        return spec.most_image_tokens() if self.kind == "image" else spec.most_video_tokens()


@dataclass
class ChatMedia:
    """The image and video parts of one request, in the order of the conversation."""

    spec: VisionSpec  # the requested model's
    items: list[MediaItem] = field(default_factory=list)

    def tokens(self, spec: VisionSpec) -> int:
        return sum(item.tokens(spec) for item in self.items)

    def payload_chars(self) -> int:
        """Characters of the parts' data and URLs in the request body."""
        return sum(len(item.source) for item in self.items)

    @property
    def pending(self) -> list[MediaItem]:
        return [item for item in self.items if not item.ready]

    @property
    def images(self) -> tuple[ChatImage, ...]:
        return tuple(item.image for item in self.items if item.image is not None)

    @property
    def videos(self) -> tuple[ChatVideo, ...]:
        return tuple(item.video for item in self.items if item.video is not None)


def has_media(req: ChatCompletionRequest) -> bool:
    return any(isinstance(part, ImagePart | VideoPart) for message in req.messages
               if isinstance(message.content, list) for part in message.content)


def media_payload(req: ChatCompletionRequest) -> tuple[int, int]:
    """Characters of the image and video parts' data and URLs, and how many parts there are."""
    sources = [part.image_url.url if isinstance(part, ImagePart) else part.video_url.url
               for message in req.messages if isinstance(message.content, list)
               for part in message.content if isinstance(part, ImagePart | VideoPart)]
    return sum(len(source) for source in sources), len(sources)


def media_items(req: ChatCompletionRequest, spec: VisionSpec) -> list[MediaItem]:
    """The parts in order, counted against the model's bounds; only user messages take
    them (a 400 otherwise)."""
    items: list[MediaItem] = []
    for i, message in enumerate(req.messages):
        if not isinstance(message.content, list):
            continue
        for j, part in enumerate(message.content):
            if not isinstance(part, ImagePart | VideoPart):
                continue
            where = f"messages[{i}].content[{j}]"
            if message.role != "user":
                raise invalid_request(f"{where}: image and video parts are accepted in user "
                                      "messages only", "messages")
            if isinstance(part, ImagePart):
                items.append(MediaItem("image", f"{where}.image_url", part.image_url.url))
            else:
                items.append(MediaItem("video", f"{where}.video_url", part.video_url.url))
    for kind, most in (("image", spec.images), ("video", spec.videos)):
        count = sum(item.kind == kind for item in items)
        if count > most:
            raise invalid_request(f"{count} {kind} parts were sent; this model takes at most "
                                  f"{most} a request", "messages")
    return items


def _named(err: ApiError, item: MediaItem) -> ApiError:
    """A refusal of the image reader, naming the part (its messages name only the field)."""
    if err.status != 400 or err.message.startswith(item.field):
        return err
    named = invalid_request(f"{item.field}: {err.message}", "messages")
    named.code = err.code
    return named


class MediaReader:
    """Reads and checks the image and video parts of chat requests."""

    def __init__(self, sources: MediaSourceReader, probe: VideoProbe, slots: FetchSlots,
                 inspector: ImageInspector | None = None) -> None:
        self.sources = sources
        self.probe = probe
        self.slots = slots
        self.inspector = inspector or ImageInspector(None)

    async def collect(self, req: ChatCompletionRequest, model: CatalogModel,
                      account_id: str) -> ChatMedia:
        """The parts of `req`, the inline ones read and checked; URLs are left for `fetch`."""
        spec = VisionSpec.of(model)
        media = ChatMedia(spec, media_items(req, spec))
        inline = [item for item in media.items if not item.is_url]
        if inline:
            async with self.slots.slot(account_id):
                for item in inline:
                    await self._read(item, spec, account_id, allow_urls=False)
        return media

    async def fetch(self, media: ChatMedia, account_id: str) -> None:
        """Fetch and check the parts given by URL (once the hold is taken)."""
        pending = media.pending
        if not pending:
            return
        async with self.slots.slot(account_id):
            for item in pending:
                await self._read(item, media.spec, account_id, allow_urls=True)

    async def _read(self, item: MediaItem, spec: VisionSpec, account_id: str, *,
                    allow_urls: bool) -> None:
        try:
            data = await self.sources.read(item.source, item.field, allow_urls=allow_urls,
                                           media=item.kind)
            if item.kind == "image":
                checked = await self.inspector.inspect(data, item.field, account_id=account_id,
                                                       max_pixels=MAX_IMAGE_PIXELS)
                item.image = ChatImage(data, checked.width, checked.height)
            else:
                item.video = await self._video(data, item.field, spec)
        except ApiError as err:
            raise _named(err, item) from err

    async def _video(self, data: bytes, where: str, spec: VisionSpec) -> ChatVideo:
        clip = await self.probe(data, where)
        if clip.seconds > spec.video_seconds:
            raise invalid_request(f"{where}: the video lasts {clip.seconds:g} s; this model "
                                  f"takes at most {spec.video_seconds:g} s", "messages")
        if clip.width * clip.height > MAX_VIDEO_PIXELS:
            raise invalid_request(f"{where}: the video is {clip.width}x{clip.height}; at most "
                                  "1920x1080 is accepted", "messages")
        if clip.fps > MAX_VIDEO_FPS:
            raise invalid_request(f"{where}: the video has {clip.fps:g} frames a second; at "
                                  f"most {MAX_VIDEO_FPS:g} are accepted", "messages")
        return ChatVideo(data, clip.seconds, clip.width, clip.height,
                         spec.frames_for(clip.seconds))
