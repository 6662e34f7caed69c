"""The base of a catalog model's typed sections (`constraints`, `engine_options`)."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, ModelWrapValidatorHandler, PrivateAttr, model_validator


class Section(BaseModel):
    """A catalog mapping read into typed fields. Unknown keys are refused, so a typo in the
    catalog fails at load. It keeps the keys the catalog gave, in the catalog's order:
    `given()` answers the mapping as written (the public record and the engines get that)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    _given: tuple[str, ...] = PrivateAttr(default=())

    @model_validator(mode="wrap")
    @classmethod
    def _keep_keys(cls, data: Any, handler: ModelWrapValidatorHandler[Section]) -> Section:
        made = handler(data)
        if isinstance(data, dict):
            made._given = tuple(data)
        return made

    def given(self) -> dict[str, Any]:
        """The keys the catalog gave, in its order, as plain data (nested sections too)."""
        names = {field.alias or name: name for name, field in type(self).model_fields.items()}
        extra = self.__pydantic_extra__ or {}
        return {key: _plain(getattr(self, names[key]) if key in names else extra[key])
                for key in self._given}


def _plain(value: Any) -> Any:
    if isinstance(value, Section):
        return value.given()
    if isinstance(value, list):
        return [_plain(item) for item in value]
    if isinstance(value, dict):
        return {key: _plain(item) for key, item in value.items()}
    return value
