"""Video requests between the router and the job queue: the quote, and the checks of a queued
job (prompt, policy, consent, input media fetched through the private-address guard and probed)
before its quoted price is held and it is queued.

What a model takes follows its catalog `operation`: text-to-video a prompt; image-to-video an
`image_url`; reference-to-video `reference_video_urls` (and optionally an `image_url`);
video-upscale and video-interpolate a `video_url`. Media fields a model does not use are
refused rather than silently dropped.
"""

from __future__ import annotations

import re
from typing import Any

from fastapi import Request

from serve_app.accounts.key_store import KeyRecord
from serve_app.billing.pricing.video import SourceVideo, VideoAsk, floor_plan, plan_video
from serve_app.errors import ApiError, invalid_request
from serve_app.images.inputs import ImageInspector, MediaSourceReader
from serve_app.jobs.intake import JobIntake, least_hold
from serve_app.jobs.service import JobService, delivery_url
from serve_app.models.catalog import CatalogModel
from serve_app.models.router import ModelRouter
from serve_app.pipeline.context import RequestContext
from serve_app.schemas.video import QueueVideoRequest, QuoteVideoRequest
from serve_app.video.consent import FACE_MEDIA_ROLES, consent_given, needs_consent, policy_of
from serve_app.video.faces import FaceDetector
from serve_app.video.probe import probe

DEFAULT_PROMPT_LIMIT = 2500
# Media fields each operation takes.
MEDIA_FIELDS: dict[str, frozenset[str]] = {
    "text-to-video": frozenset(),
    "image-to-video": frozenset({"image_url"}),
    "reference-to-video": frozenset({"reference_video_urls", "image_url"}),
    "video-upscale": frozenset({"video_url"}),
    "video-interpolate": frozenset({"video_url"}),
}
ALL_MEDIA_FIELDS = ("image_url", "end_image_url", "audio_url", "video_url",
                    "reference_image_urls", "reference_video_urls", "reference_audio_urls",
                    "reference_document_urls", "scene_image_urls", "elements", "keyframes")
# Operations priced by the source clip of `video_url` (a quote reads it for them alone).
SOURCE_PRICED = frozenset({"video-upscale", "video-interpolate"})
# Reference clips: each 1 to 15 s, at most 150 s together.
REFERENCE_CLIP_SECONDS = (1.0, 15.0)
MAX_REFERENCE_TOTAL_SECONDS = 150.0
MIN_IMAGE_PIXELS = 64 * 64


class VideoService:
    """Video quotes and queued video jobs: the model, the checks, the inputs fetched and
    probed, then the job queued at its quoted price."""

    def __init__(self, router: ModelRouter, media_sources: MediaSourceReader,
                 job_service: JobService, public_api_url: str | None,
                 faces: FaceDetector | None = None,
                 inspector: ImageInspector | None = None) -> None:
        self.router = router
        self.media_sources = media_sources
        # Image headers read in its workers within a deadline; refusals spend the account's
        # budget of refused images.
        self.inspector = inspector or ImageInspector(job_service.request_runner.admission.limits)
        self.job_service = job_service
        self.public_api_url = public_api_url
        self.faces = faces or FaceDetector()

    def video_model(self, name: str) -> Any:
        routed = self.router.resolve(name, "video")
        if routed.model.operation not in MEDIA_FIELDS:
            raise ApiError(500, f"the catalog gives video model {routed.model.id} no operation",
                           code="UNKNOWN_ERROR")
        return routed

    async def _video(self, value: str, field: str) -> tuple[bytes, SourceVideo]:
        data = await self.media_sources.read(value, field, allow_urls=True, media="video")
        return data, await probe(data, field)

    async def quote(self, ctx: RequestContext, key: KeyRecord,
                    body: QuoteVideoRequest) -> dict[str, float]:
        """The price of a job. Only a model priced by its source clip reads `video_url`
        (counted, paid for and bounded as a queue's inputs are); others ignore it, as clients
        of the published interface send it with every quote."""
        routed = self.video_model(body.model)
        model = routed.model
        source = None
        if body.video_url is not None and model.operation in SOURCE_PRICED:
            # counted, then able to pay the least the job can cost (held, given back after:
            # a price charges nothing), then one of the account's fetch slots (429)
            async with self.job_service.request_runner.admit(
                    ctx, key, routed, calls_model=False, model_headers=False) as bill:
                await bill.hold(least_hold(floor_plan(model, _ask(body)).cost))
                async with self.job_service.fetch_slots.slot(key.account_id):
                    _, source = await self._video(body.video_url, "video_url")
        return {"quote": plan_video(model, _ask(body), source).quote_usd}

    async def _inputs(self, body: QueueVideoRequest, intake: JobIntake, account_id: str,
                      faces: list[str] | None) -> SourceVideo | None:
        """The media the job needs, one at a time: fetched (size-capped), checked from their
        headers, then spooled to the result store and dropped from memory. `faces`: where to
        note the roles of the media that show a face (None: not looked for)."""

        async def look(data: bytes, field: str, media: str) -> None:
            """A client's media whose pixels do not decode is a 400 (faces.py)."""
            role = FACE_MEDIA_ROLES[field.split("[", 1)[0]]
            if faces is not None and role not in faces and \
                    await self.faces.shows_face(data, media, field):
                faces.append(role)

        source = None
        if body.image_url:
            data = await self.media_sources.read(body.image_url, "image_url", allow_urls=True)
            image = await self.inspector.inspect(data, "image_url", account_id=account_id,
                                                 min_pixels=MIN_IMAGE_PIXELS)
            await look(data, "image_url", "image")
            await intake.keep("image", data, f"image/{image.format.lower()}")
            del data, image
        if body.video_url:
            data, source = await self._video(body.video_url, "video_url")
            await look(data, "video_url", "video")
            await intake.keep("video", data, "video/mp4")
            del data
        if body.reference_video_urls:
            clips = []
            for i, url in enumerate(body.reference_video_urls):
                field = f"reference_video_urls[{i}]"
                data, clip = await self._video(url, field)
                low, high = REFERENCE_CLIP_SECONDS
                if not low <= clip.seconds <= high:
                    raise invalid_request(f"the clip is {clip.seconds:g} s; reference clips must "
                                          f"be {low:g} to {high:g} s", field)
                clips.append(clip)
                await look(data, field, "video")
                await intake.keep(f"reference-{i}", data, "video/mp4")
                del data
            total = sum(c.seconds for c in clips)
            if total > MAX_REFERENCE_TOTAL_SECONDS:
                raise invalid_request(f"the reference clips last {total:g} s together; at most "
                                      f"{MAX_REFERENCE_TOTAL_SECONDS:g} s", "reference_video_urls")
            source = SourceVideo(total, clips[0].width, clips[0].height, clips[0].fps)
        return source

    async def queue(self, request: Request, ctx: RequestContext, key: KeyRecord,
                    body: QueueVideoRequest) -> dict[str, str]:
        """Admitted (jobs/intake.py, pipeline/bill.py: 429, then the checks that need no
        input, 400 and 422, then the hold, then 503) before any input is read: held is the
        job's price when it does not depend on the inputs, else its floor (the least it can
        cost with the clips it names, pricing/video.py), replaced by the price once the inputs
        are probed. A model
        with a consent policy looks for faces in the inputs (in a worker thread, once the
        caller is held) unless consent was given: a face without it is a 409."""
        routed = self.video_model(body.model)
        model = routed.model
        policy = policy_of(model)
        faces: list[str] | None = [] if policy and not consent_given(
            policy, body.consents) else None
        ask = _ask(body)

        async with self.job_service.intake(ctx, key, routed, "video",
                                           body.callback_url) as intake:
            _check_prompt(model, body)  # 400, 422
            _check_media_fields(model, body)
            await intake.admit(plan_video(model, ask, None).cost
                               if not _priced_by_inputs(model) else
                               floor_plan(model, ask, len(body.reference_video_urls or [])
                                          * REFERENCE_CLIP_SECONDS[0]).cost)
            source = None
            if any(getattr(body, f) for f in MEDIA_FIELDS[model.operation]):
                async with self.job_service.fetch_slots.slot(key.account_id):
                    source = await self._inputs(body, intake, key.account_id, faces)
            if faces and policy:
                raise needs_consent(model, policy, faces)
            plan = plan_video(model, ask, source)  # no source: the price quoted
            await intake.hold(plan.cost)
            params = {"prompt": body.prompt, "negative_prompt": body.negative_prompt,
                      "seconds": plan.seconds, "width": plan.width, "height": plan.height,
                      "fps": plan.fps, "audio": plan.audio, "seed": 0,
                      "upscale_factor": body.upscale_factor
                      or model.video_constraints.default_upscale_factor,
                      "target_fps": body.target_fps, "slowdown_factor": body.slowdown_factor,
                      "enhancement_model": body.enhancement_model,
                      "creativity": body.creativity}
            # read before queueing: once the job is queued, nothing may fail the answer
            secret = await self.job_service.download_secret() \
                if model.delivery == "download_url" else None
            job = await intake.queue(plan.cost, params)
        queued = {"model": model.id, "queue_id": job.queue_id}
        if secret is not None:  # a short-lived delivery URL; retrieve then answers JSON only
            queued["download_url"] = delivery_url(request, self.public_api_url, secret,
                                                  job.queue_id)
        return queued


def _priced_by_inputs(model: CatalogModel) -> bool:
    """Whether the job's price depends on its input clips (their length, their size)."""
    return model.operation in SOURCE_PRICED or model.operation == "reference-to-video"


def _ask(body: QuoteVideoRequest | QueueVideoRequest) -> VideoAsk:
    return VideoAsk(
        duration=body.duration, aspect_ratio=body.aspect_ratio, resolution=body.resolution,
        upscale_factor=body.upscale_factor, enhancement_model=body.enhancement_model,
        target_fps=body.target_fps, slowdown_factor=body.slowdown_factor, audio=body.audio,
        reference_video_total_duration=getattr(body, "reference_video_total_duration", None))


def _check_prompt(model: CatalogModel, body: QueueVideoRequest) -> None:
    given = model.video_constraints.prompt_character_limit
    limit = DEFAULT_PROMPT_LIMIT if given is None else given
    for field in ("prompt", "negative_prompt"):
        text = getattr(body, field)
        if text is not None and len(text) > limit:
            raise invalid_request(f"{field} is {len(text)} characters; {model.id} takes at "
                                  f"most {limit}", field)
    refused = [term for term in model.video_constraints.refused_terms
               if re.search(rf"\b{re.escape(term)}\b", body.prompt, re.IGNORECASE)]
    if refused:
        suggestion = body.prompt
        for term in refused:
            suggestion = re.sub(rf"\s*\b{re.escape(term)}\b", "", suggestion,
                                flags=re.IGNORECASE)
        raise ApiError(422, f"The prompt was refused by {model.id}'s content policy "
                            f"({', '.join(refused)})", code="CONTENT_POLICY_VIOLATION",
                       extra={"suggested_prompt": " ".join(suggestion.split())})


def _check_media_fields(model: CatalogModel, body: QueueVideoRequest) -> None:
    if body.camera_trajectory is not None and not body.image_url:
        raise invalid_request("image_url is required with camera_trajectory: the camera moves "
                              "around that image", "image_url")
    taken = MEDIA_FIELDS[model.operation]
    for field in ALL_MEDIA_FIELDS:
        if getattr(body, field) not in (None, []) and field not in taken:
            raise invalid_request(f"{model.id} ({model.operation}) does not use {field}"
                                  + (f"; it takes {', '.join(sorted(taken))}" if taken else ""),
                                  field)
    if model.operation == "image-to-video" and not body.image_url:
        raise invalid_request(f"image_url is required: {model.id} animates an image",
                              "image_url")
    if model.operation == "reference-to-video" and not body.reference_video_urls:
        raise invalid_request(f"reference_video_urls is required: {model.id} follows "
                              "reference clips", "reference_video_urls")
    if model.operation in ("video-upscale", "video-interpolate") and not body.video_url:
        raise invalid_request(f"video_url is required: {model.id} works on a source clip",
                              "video_url")

