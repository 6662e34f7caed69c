"""Characters and their reviews: the records of `/characters` and the operator's tools.

Every character has a model (`modelId`, a string in the published record): the one it was
created with, or else the catalog's default text model. A character stored without one
(created before this rule) is answered with the default text model of the running catalog.
"""

from __future__ import annotations

from typing import Any

from sqlalchemy import func
from sqlmodel import Session, col, select

from serve_app.db.tables import Character, CharacterReview, iso_z, utcnow
from serve_app.errors import ApiError, invalid_request
from serve_app.models.catalog import Catalog


def find_character(session: Session, slug: str) -> Character:
    row = session.exec(select(Character).where(Character.slug == slug)).first()
    if row is None:
        raise ApiError(404, f"Character {slug!r} not found", code="CHARACTER_NOT_FOUND")
    return row


def _stats(session: Session, character_ids: list[str]) -> dict[str, tuple[int, int]]:
    """character id -> (review count, rating sum)."""
    if not character_ids:
        return {}
    rows = session.exec(
        select(CharacterReview.character_id, func.count(), func.sum(CharacterReview.rating))
        .where(col(CharacterReview.character_id).in_(character_ids))
        .group_by(CharacterReview.character_id)).all()
    return {cid: (int(n), int(total or 0)) for cid, n, total in rows}


def default_character_model(catalog: Catalog) -> str:
    """The model of a character created without naming one: the default text model."""
    model = catalog.default_model("text")
    if model is None:
        raise ApiError(500, "The catalog has no text model for characters to use",
                       code="UNKNOWN_ERROR")
    return model.id


def character_model(catalog: Catalog, requested: str | None) -> str:
    """The model id a new character is stored with: the named text model (by id, alias or
    trait, stored as its id), or the default text model when none is named."""
    if requested is None:
        return default_character_model(catalog)
    model = catalog.find(requested, "text")
    if model is None or model.type != "text":
        raise invalid_request(f"modelId {requested!r} is not a text model of this platform; "
                              "see GET /models?type=text", "modelId")
    return model.id


def character_record(row: Character, stats: tuple[int, int],
                     default_model: str) -> dict[str, Any]:
    """The published character record; `default_model` stands in for a model never stored."""
    count, total = stats
    return {
        "adult": row.adult, "author": row.author, "createdAt": iso_z(row.created_at),
        "description": row.description or None, "featured": row.featured, "id": row.id,
        "modelId": row.model_id or default_model, "name": row.name, "photoUrl": row.photo_url,
        "shareUrl": None, "slug": row.slug,
        "stats": {"averageRating": round(total / count, 2) if count else 0, "imports": 0,
                  "ratingCount": count, "ratingSum": total, "userRating": None},
        "tags": list(row.tags or []), "updatedAt": iso_z(row.updated_at),
        "webEnabled": row.web_enabled,
    }


def review_record(row: CharacterReview, account_id: str | None) -> dict[str, Any]:
    """The published review shape; `isOwner` when the reader's account wrote it."""
    return {"characterId": row.character_id, "createdAt": iso_z(row.created_at), "id": row.id,
            "isOwner": account_id is not None and row.account_id == account_id,
            "locale": row.locale, "message": row.message, "rating": row.rating,
            "userAvatarUrl": row.user_avatar_url, "username": row.username}


def list_characters(session: Session, *, limit: int, offset: int, search: str | None,
                    tags: list[str], default_model: str) -> list[dict[str, Any]]:
    query = select(Character)
    if search:
        pattern = f"%{search.lower()}%"
        query = query.where(func.lower(Character.name).like(pattern)
                            | func.lower(Character.description).like(pattern))
    rows = list(session.exec(query.order_by(Character.created_at, Character.id)).all())
    if tags:
        rows = [r for r in rows if set(tags) & set(r.tags or [])]
    rows = rows[offset:offset + limit]
    stats = _stats(session, [r.id for r in rows])
    return [character_record(r, stats.get(r.id, (0, 0)), default_model) for r in rows]


def get_character(session: Session, slug: str, *, default_model: str) -> dict[str, Any]:
    row = find_character(session, slug)
    return character_record(row, _stats(session, [row.id]).get(row.id, (0, 0)), default_model)


def review_page(session: Session, slug: str, page: int, page_size: int,
                account_id: str | None) -> dict[str, Any]:
    character = find_character(session, slug)
    total, rating_sum = _stats(session, [character.id]).get(character.id, (0, 0))
    rows = session.exec(
        select(CharacterReview).where(CharacterReview.character_id == character.id)
        .order_by(col(CharacterReview.created_at).desc(), CharacterReview.id)
        .offset((page - 1) * page_size).limit(page_size)).all()
    return {
        "object": "list",
        "data": [review_record(r, account_id) for r in rows],
        "pagination": {"page": page, "pageSize": page_size, "total": total,
                       "totalPages": -(-total // page_size)},
        "summary": {"averageRating": round(rating_sum / total, 2) if total else 0,
                    "totalReviews": total},
    }


def create_character(session: Session, *, catalog: Catalog, **fields: Any) -> dict[str, Any]:
    """A new character; its model is the one named (checked against `catalog`), else the
    default text model."""
    fields["model_id"] = character_model(catalog, fields.get("model_id"))
    if session.exec(select(Character).where(Character.slug == fields["slug"])).first():
        raise ApiError(409, f"Character {fields['slug']!r} already exists",
                       code="INVALID_REQUEST")
    row = Character(**fields)
    session.add(row)
    session.commit()
    session.refresh(row)
    return character_record(row, (0, 0), row.model_id or "")


def add_review(session: Session, slug: str, *, account_id: str | None = None,
               **fields: Any) -> dict[str, Any]:
    character = find_character(session, slug)
    row = CharacterReview(character_id=character.id, account_id=account_id, **fields)
    character.updated_at = utcnow()
    session.add(row)
    session.add(character)
    session.commit()
    session.refresh(row)
    return review_record(row, account_id)
