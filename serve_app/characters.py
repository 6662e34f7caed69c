"""Characters and their reviews: the records of `/characters` and the operator's tools."""

from __future__ import annotations

from typing import Any

from sqlalchemy import func
from sqlmodel import Session, col, select

from serve_app.db.tables import Character, CharacterReview, iso_z, utcnow
from serve_app.errors import ApiError


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


def character_record(row: Character, stats: tuple[int, int]) -> dict[str, Any]:
    count, total = stats
    return {
        "adult": row.adult, "author": row.author, "createdAt": iso_z(row.created_at),
        "description": row.description or None, "featured": row.featured, "id": row.id,
        "modelId": row.model_id, "name": row.name, "photoUrl": row.photo_url,
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
                    tags: list[str]) -> list[dict[str, Any]]:
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
    return [character_record(r, stats.get(r.id, (0, 0))) for r in rows]


def get_character(session: Session, slug: str) -> dict[str, Any]:
    row = find_character(session, slug)
    return character_record(row, _stats(session, [row.id]).get(row.id, (0, 0)))


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


def create_character(session: Session, **fields: Any) -> dict[str, Any]:
    if session.exec(select(Character).where(Character.slug == fields["slug"])).first():
        raise ApiError(409, f"Character {fields['slug']!r} already exists",
                       code="INVALID_REQUEST")
    row = Character(**fields)
    session.add(row)
    session.commit()
    session.refresh(row)
    return character_record(row, (0, 0))


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
