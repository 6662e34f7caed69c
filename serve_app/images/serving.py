"""Image requests between the router and the image deployments, each on its bill
(pipeline/bill.py): the model, the checks of the request and the most it may cost, then,
once admitted and held, the inputs (read and checked from their headers), one call to the
deployment, and the settlement of what it did cost. Nothing is charged when any step fails:
the hold goes back.
"""

from __future__ import annotations

import base64
import time
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

from deployments.protocol import (
    Chunk,
    ImageRequest,
    ImageResult,
    Sampling,
    Tenant,
    TextRequest,
)
from serve_app.accounts.key_store import KeyRecord
from serve_app.billing.pricing.images import image_cost
from serve_app.errors import ApiError, invalid_request
from serve_app.images import sizing
from serve_app.images.inputs import ImageInput, ImageInspector
from serve_app.models.calls import call_model, stream_model
from serve_app.models.catalog import Catalog, CatalogModel, ImageOperation
from serve_app.models.router import ModelRouter, RoutedModel
from serve_app.pipeline import respond
from serve_app.pipeline.context import RequestContext
from serve_app.pipeline.runner import RequestRunner
from serve_app.schemas.images import (
    BackgroundRemoveRequest,
    GenerateRequest,
    MultiEditRequest,
    OpenAIImageRequest,
    UpscaleRequest,
)

ENHANCE_SYSTEM_PROMPT = (
    "You rewrite instructions for an image model. Make the user's instruction clear and "
    "specific in one or two sentences: name the subject, the change, and the style. Answer "
    "with the rewritten instruction only.")
ENHANCE_MAX_TOKENS = 120


@dataclass
class Produced:
    """What the image deployment made, with what the answer's headers need."""

    model: CatalogModel
    images: list[bytes]
    media_type: str
    width: int
    height: int
    blurred: bool
    timing: dict[str, float] = field(default_factory=dict)


class ImageService:
    """Image requests between the router and the image deployments: the model, admission,
    the inputs, one call, the settlement of what it did cost."""

    def __init__(self, catalog: Catalog, router: ModelRouter, runner: RequestRunner,
                 inspector: ImageInspector | None = None) -> None:
        self.catalog = catalog
        self.router = router
        self.runner = runner
        self.admission = runner.admission
        self.inspector = inspector or ImageInspector(runner.admission.limits)

    def model_for(self, operation: ImageOperation, name: str | None) -> RoutedModel:
        """The model of an image operation: by name (id, alias or trait), or the operation's
        default model when the endpoint takes no model (upscale, background removal)."""
        if name is None or name == "default":
            models = self.catalog.for_operation(operation)
            if not models:
                raise ApiError(503, f"No model serves image {operation} on this platform",
                               code="MODEL_OFFLINE")
            return RoutedModel(model=models[0], router="direct" if name is None else "alias")
        routed = self.router.resolve(name)
        if routed.model.operation != operation:
            raise invalid_request(f"model {routed.model.id!r} cannot serve image {operation}; "
                                  f"use one of {self._ids(operation)}", "model")
        return routed

    def _ids(self, operation: ImageOperation) -> str:
        return ", ".join(m.id for m in self.catalog.for_operation(operation)) or "(none)"

    async def _run(self, ctx: RequestContext, model: CatalogModel,
                   inputs: list[ImageInput], params: dict[str, Any], fmt: str) -> Produced:
        handle = self.router.image(model)
        request = ImageRequest(images=[i.data for i in inputs], fields=[i.field for i in inputs],
                               params=params, format=fmt,
                               tenant=self.admission.tenant(ctx.caller) if ctx.caller else None)
        started = time.perf_counter()
        with ctx.step("model"):
            out: ImageResult = await call_model(handle.run, model.id, model.id, request)
        ctx.record("replica", out.replica_ms)
        total = (time.perf_counter() - started) * 1000
        return Produced(model, out.images, f"image/{fmt}", out.width, out.height,
                        out.blurred, timing={"inferenceDuration": out.replica_ms,
                                             "inferenceQueueTime": max(0.0, total
                                                                       - out.replica_ms)})

    async def upscale(self, ctx: RequestContext, key: KeyRecord, body: UpscaleRequest,
                      source: Callable[[], Awaitable[bytes]]) -> Produced:
        routed = self.model_for("upscale", None)
        model = routed.model

        async with self.runner.admit(ctx, key, routed) as bill:
            await bill.hold(image_cost(model, scale=body.scale))
            data = await source()
            image = await self.inspector.inspect(data, "image", account_id=key.account_id,
                                                 min_pixels=sizing.UPSCALE_MIN_PIXELS)
            scale = sizing.effective_scale(image.width, image.height, body.scale)
            params = {"scale": scale, "creativity": body.clamped_creativity}
            produced = await self._run(ctx, model, [image], params, "png")
            respond.upscale_factor_header(ctx, scale)
            bill.deliver(image_cost(model, scale=scale))
        return produced

    async def remove_background(self, ctx: RequestContext, key: KeyRecord,
                                body: BackgroundRemoveRequest,
                                source: Callable[[], Awaitable[bytes]]) -> Produced:
        routed = self.model_for("background-remove", None)
        model = routed.model

        async with self.runner.admit(ctx, key, routed) as bill:
            await bill.hold(image_cost(model))
            image = await self.inspector.inspect(await source(), "image",
                                                 account_id=key.account_id,
                                                 max_pixels=sizing.EDIT_MAX_PIXELS)
            produced = await self._run(ctx, model, [image], {}, "png")
            bill.deliver(image_cost(model))
        return produced

    async def _enhanced(self, ctx: RequestContext, prompt: str) -> str | None:
        """The rewritten prompt, also sent URL-encoded in `x-service-enhanced-prompt`; None when
        no rewrite came back (then it is not charged)."""
        with ctx.step("enhance"):
            enhanced = await self.enhance_prompt(
                ctx.request_id, prompt,
                self.admission.tenant(ctx.caller) if ctx.caller else None)
        if enhanced:
            respond.enhanced_prompt_header(ctx, enhanced)
        return enhanced

    async def enhance_prompt(self, request_id: str, prompt: str,
                             tenant: Tenant | None = None) -> str | None:
        """The prompt rewritten by the default text model (a turn of `tenant`'s at its
        engine), or None when no text model answers (then nothing is charged for it)."""
        try:
            routed = self.router.resolve("default", "text")
            handle = self.router.text(routed.model)
        except ApiError:
            return None
        engine_request = TextRequest(
            request_id=f"{request_id}-enhance",
            messages=[{"role": "system", "content": ENHANCE_SYSTEM_PROMPT},
                      {"role": "user", "content": prompt}],
            sampling=Sampling(max_tokens=ENHANCE_MAX_TOKENS, temperature=0.2, n=1),
            tenant=tenant,
        )
        text = ""
        try:
            async for chunk in stream_model(handle.generate, routed.model.id, routed.model.id,
                                            engine_request):
                if isinstance(chunk, Chunk):
                    text += chunk.text
        except ApiError:
            return None
        text = " ".join(text.split())
        return text or None

    async def edit(self, ctx: RequestContext, key: KeyRecord, body: MultiEditRequest,
                   sources: list[Callable[[], Awaitable[bytes]]], fields: list[str]) -> Produced:
        routed = self.model_for("edit", body.model_name)
        model = routed.model
        quality = _quality(model, body.quality)
        enhance = _wants_enhancement(model, body.enhance_prompt)

        async with self.runner.admit(ctx, key, routed) as bill:
            _edit_limits(model, body, len(sources))
            resolution = sizing.resolution_of(model, body.resolution)
            await bill.hold(image_cost(model, resolution=resolution, quality=quality,
                                       input_images=len(sources), enhanced=enhance))
            inputs = [await self.inspector.inspect(
                await read(), name, account_id=key.account_id,
                min_pixels=sizing.EDIT_MIN_PIXELS, max_pixels=sizing.EDIT_MAX_PIXELS)
                for read, name in zip(sources, fields, strict=True)]
            size = sizing.output_size(model, body.aspect_ratio, resolution, inputs[0].width,
                                      inputs[0].height)
            fmt = {"jpg": "jpeg"}.get(body.output_format or "", body.output_format) or \
                sizing.default_output_format(size.resolution)
            enhanced = await self._enhanced(ctx, body.prompt) if enhance else None
            params = {"prompt": enhanced or body.prompt, "width": size.width, "height": size.height,
                      "safe_mode": body.safe_mode, "seed": None, "steps": _steps(model, None),
                      "optimize_prompt": not body.disable_prompt_optimization_thinking
                      if model.capabilities.get("supportsOptimizePromptThinking") else None}
            produced = await self._run(ctx, model, inputs, params, fmt)
            respond.content_headers(ctx, blurred=produced.blurred and body.safe_mode)
            bill.deliver(image_cost(model, resolution=size.resolution, quality=quality,
                                    input_images=len(inputs), enhanced=enhanced is not None))
        return produced

    def styled_prompt(self, prompt: str, style: str | None) -> str:
        if style is None:
            return prompt
        styles = {s.lower(): s for s in self.catalog.image_styles}
        if style.lower() not in styles:
            raise invalid_request(f"style_preset {style!r} is not one of GET /image/styles",
                                  "style_preset")
        return f"{prompt}, in {styles[style.lower()]} style"

    async def generate(self, ctx: RequestContext, key: KeyRecord,
                       body: GenerateRequest) -> Produced:
        routed = self.model_for("generate", body.model)
        model = routed.model
        resolution = body.resolution if body.resolution in model.pricing.get(
            "resolutions", {}) else None
        quality = _quality(model, body.quality)
        enhance = _wants_enhancement(model, body.enhance_prompt)

        async with self.runner.admit(ctx, key, routed) as bill:
            _check_prompt_length(model, body.prompt)
            prompt = self.styled_prompt(body.prompt, body.style_preset)
            await bill.hold(image_cost(model, outputs=body.variants, resolution=resolution,
                                       quality=quality, enhanced=enhance))
            enhanced = await self._enhanced(ctx, prompt) if enhance else None
            params = {"prompt": enhanced or prompt, "negative_prompt": body.negative_prompt,
                      "width": sizing.fit_divisor(body.width, model),
                      "height": sizing.fit_divisor(body.height, model),
                      "steps": _steps(model, body.steps), "cfg_scale": body.cfg_scale or 7.5,
                      # 0, the published default, means "not given": a random seed
                      "seed": body.seed or None, "variants": body.variants,
                      "safe_mode": body.safe_mode}
            produced = await self._run(ctx, model, [], params, body.format)
            respond.content_headers(ctx, blurred=produced.blurred and body.safe_mode)
            bill.deliver(image_cost(model, outputs=len(produced.images),
                                    resolution=resolution, quality=quality,
                                    enhanced=enhanced is not None))
        return produced

    def native_generation(self, body: OpenAIImageRequest) -> GenerateRequest:
        """`/images/generations` as the native generation request: its size within the native
        bound (1280 px a side), its moderation as safe mode; another API's model name is the
        default image model, as published."""
        width, height = (1024, 1024) if body.size in (None, "auto") else (
            int(part) for part in body.size.split("x"))
        if max(width, height) > 1280:
            width, height = (round(width * 1280 / max(width, height)),
                             round(height * 1280 / max(width, height)))
        model = body.model or "default"
        if model != "default" and self.catalog.find(model) is None:
            model = "default"
        return GenerateRequest(model=model, prompt=body.prompt, width=width, height=height,
                               format=body.output_format or "png",
                               safe_mode=body.moderation != "low")


# ---- upscale -----------------------------------------------------------------------------


# ---- background removal ------------------------------------------------------------------


# ---- edits -------------------------------------------------------------------------------

def _edit_limits(model: CatalogModel, body: MultiEditRequest, count: int) -> None:
    _check_prompt_length(model, body.prompt)
    most = int(model.capabilities.get("maxInputImages", 1))
    if count < 1:
        raise invalid_request("at least one image is required", "images")
    if count > most:
        raise invalid_request(f"{count} images sent; {model.id} accepts at most {most}",
                              "images")


def _quality(model: CatalogModel, requested: str | None) -> str | None:
    """The quality tier of models that publish `qualities`; others ignore the field."""
    qualities = model.image_constraints.qualities
    if not qualities:
        return None
    return requested or model.image_constraints.default_quality or qualities[-1]


def _check_prompt_length(model: CatalogModel, prompt: str) -> None:
    limit = model.image_constraints.prompt_character_limit
    if limit and len(prompt) > limit:
        raise invalid_request(f"prompt is {len(prompt)} characters; {model.id} accepts "
                              f"at most {int(limit)}", "prompt")


def _wants_enhancement(model: CatalogModel, asked: bool) -> bool:
    """Only models that price the rewrite (`enhancePrompt`) offer it."""
    return bool(asked and model.pricing.get("enhancePrompt") is not None)


# ---- generation --------------------------------------------------------------------------


def _steps(model: CatalogModel, requested: int | None) -> int:
    steps = model.image_constraints.steps
    default = steps.default if steps and steps.default is not None else 8
    most = steps.max if steps and steps.max is not None else 50
    return min(requested or default, most)


def generate_payload(body: GenerateRequest, produced: Produced,
                     started: float) -> dict[str, Any]:
    """The published JSON answer of `/image/generate`."""
    return {
        "id": f"generate-image-{uuid.uuid4().hex}",
        "images": [base64.b64encode(image).decode("ascii") for image in produced.images],
        "request": body.model_dump(mode="json"),
        "timing": {"inferenceDuration": produced.timing.get("inferenceDuration", 0.0),
                   "inferencePreprocessingTime": 0.0,
                   "inferenceQueueTime": produced.timing.get("inferenceQueueTime", 0.0),
                   "total": (time.perf_counter() - started) * 1000},
    }
