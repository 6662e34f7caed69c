"""Operator requests that create characters and reviews."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field


class CreateCharacterRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    slug: str = Field(min_length=1, max_length=128, pattern=r"^[a-z0-9][a-z0-9-]*$")
    name: str = Field(min_length=1, max_length=128)
    description: str = Field(default="", max_length=2000)
    systemPrompt: str = Field(default="", max_length=20000)
    author: str = Field(default="", max_length=64)
    tags: list[str] = Field(default_factory=list, max_length=20)
    photoUrl: str | None = Field(default=None, max_length=500)
    adult: bool = False
    webEnabled: bool = False
    featured: bool = False
    modelId: str | None = Field(default=None, max_length=200)

    def columns(self) -> dict:
        return {"slug": self.slug, "name": self.name, "description": self.description,
                "system_prompt": self.systemPrompt, "author": self.author, "tags": self.tags,
                "photo_url": self.photoUrl, "adult": self.adult,
                "web_enabled": self.webEnabled, "featured": self.featured,
                "model_id": self.modelId}


class CreateReviewRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    username: str = Field(min_length=1, max_length=64)
    rating: int = Field(ge=1, le=5)
    message: str | None = Field(default=None, max_length=4000)
    locale: str | None = Field(default=None, max_length=16)
    userAvatarUrl: str | None = Field(default=None, max_length=500)

    def columns(self) -> dict:
        return {"username": self.username, "rating": self.rating, "message": self.message,
                "locale": self.locale, "user_avatar_url": self.userAvatarUrl}
