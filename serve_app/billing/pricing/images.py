"""What an image request costs, from the catalog's image prices."""

from __future__ import annotations

from decimal import Decimal

from serve_app.billing.pricing import Cost, PricedLine, catalog_usd, nanos_of
from serve_app.models.catalog import CatalogModel


def upscale_tier(model: CatalogModel, scale: float) -> str:
    """The catalog's upscale tier (`2x`, `4x`, ...) that pays for `scale`: the smallest tier
    at least as large, else the largest."""
    tiers = sorted((float(name.rstrip("x")), name) for name in model.pricing.get("upscale", {}))
    if not tiers:
        raise ValueError(f"model {model.id} has no upscale prices")
    for factor, name in tiers:
        if scale <= factor + 1e-9:
            return name
    return tiers[-1][1]


def image_cost(model: CatalogModel, *, outputs: int = 1, scale: float | None = None,
               resolution: str | None = None, quality: str | None = None,
               input_images: int = 1, enhanced: bool = False) -> Cost:
    """The price of one image request, by the catalog's image prices:

    - upscale: `pricing.upscale["2x" | "4x" ...]` by the effective scale (upscale_tier);
    - edits: `pricing.inpaint`, or `resolutions[resolution]`, or `quality[resolution][quality]`,
      plus `inputImages.additional` per input image beyond `inputImages.included`;
    - generation and background removal: `pricing.generation`, or the resolution/quality
      tables as for edits, per output image;
    - `enhancePrompt` when a prompt rewrite was generated.
    """
    pricing = model.pricing
    if model.operation == "upscale":
        per_image = catalog_usd(pricing["upscale"][upscale_tier(model, scale or 2)])
    else:
        per_image = catalog_usd(
            pricing.get("inpaint" if model.operation == "edit" else "generation"))
        if resolution is not None and resolution in pricing.get("resolutions", {}):
            per_image = catalog_usd(pricing["resolutions"][resolution])
        tier = pricing.get("quality", {}).get(resolution or "1K", {})
        if quality is not None and quality in tier:
            per_image = catalog_usd(tier[quality])
    if per_image is None:
        raise ValueError(f"model {model.id} has no price for this request")
    lines = [PricedLine("image", outputs, nanos_of(per_image, outputs), float(per_image))]
    extra = pricing.get("inputImages")
    if extra and input_images > int(extra.get("included", 0)):
        count = input_images - int(extra.get("included", 0))
        each = catalog_usd(extra.get("additional")) or Decimal(0)
        lines.append(PricedLine("input_images", count, nanos_of(each, count), float(each)))
    if enhanced:
        each = catalog_usd(pricing.get("enhancePrompt")) or Decimal(0)
        lines.append(PricedLine("prompt_enhancement", 1, nanos_of(each), float(each)))
    return Cost(model, tuple(line for line in lines if line.nanos > 0))
