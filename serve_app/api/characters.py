"""`/characters`: public personas whose prompt chat uses through `character_slug`, and their
reviews. Any key reads them; an ADMIN key of the operator's account (or the CLI) creates
them."""

from __future__ import annotations

from typing import Annotated

from fastapi import Query, Response

from serve_app import characters
from serve_app.api.deps import Context, CurrentKey, JsonBody, OperatorKey, Services, run_db
from serve_app.api.guarded_route import guarded_router
from serve_app.http.render import json_response
from serve_app.pipeline import respond
from serve_app.schemas.characters import CreateCharacterRequest, CreateReviewRequest

router = guarded_router(prefix="/characters", tags=["Characters"])


@router.get("", summary="List characters")
async def list_characters(
    ctx: Context, key: CurrentKey, services: Services,
    limit: Annotated[int, Query(gt=0, le=100)] = 50,
    offset: Annotated[int, Query(ge=0, le=1_000_000)] = 0,
    search: Annotated[str | None, Query(max_length=200)] = None,
    tags: Annotated[list[str] | None, Query(max_length=20)] = None,
) -> Response:
    default_model = characters.default_character_model(services.catalog)
    data = await run_db(services, lambda s: characters.list_characters(
        s, limit=limit, offset=offset, search=search, tags=tags or [],
        default_model=default_model))
    return json_response(ctx, {"data": data, "object": "list"})


@router.post("", dependencies=[JsonBody], summary="Create a character (operator)")
async def create_character(body: CreateCharacterRequest, ctx: Context, key: OperatorKey,
                           services: Services) -> Response:
    data = await run_db(services, lambda s: characters.create_character(
        s, catalog=services.catalog, **body.columns()))
    return json_response(ctx, {"data": data, "success": True})


@router.get("/{slug}", summary="Get a character")
async def get_character(slug: str, ctx: Context, key: CurrentKey, services: Services) -> Response:
    default_model = characters.default_character_model(services.catalog)
    data = await run_db(services, lambda s: characters.get_character(
        s, slug, default_model=default_model))
    return json_response(ctx, {"data": data, "object": "character"})


@router.get("/{slug}/reviews", summary="Reviews of a character (preview)")
async def character_reviews(
    slug: str, ctx: Context, key: CurrentKey, services: Services,
    page: Annotated[int, Query(gt=0, le=1_000_000)] = 1,
    pageSize: Annotated[int, Query(gt=0, le=100)] = 20,
) -> Response:
    data = await run_db(services, lambda s: characters.review_page(
        s, slug, page, pageSize, key.account_id))
    pagination = data["pagination"]
    respond.pagination_headers(ctx, page_size=pagination["pageSize"], page=pagination["page"],
                               total=pagination["total"], total_pages=pagination["totalPages"])
    return json_response(ctx, data)


@router.post("/{slug}/reviews", dependencies=[JsonBody], summary="Add a review (operator)")
async def add_review(slug: str, body: CreateReviewRequest, ctx: Context, key: OperatorKey,
                     services: Services) -> Response:
    data = await run_db(services, lambda s: characters.add_review(
        s, slug, account_id=key.account_id, **body.columns()))
    return json_response(ctx, {"data": data, "success": True})
