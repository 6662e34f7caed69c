"""Values shared by the wire (serve_app/schemas) and the tables (serve_app/db/tables.py):
both import them from here, so request models never import the database layer."""

from __future__ import annotations

from enum import StrEnum


class ApiKeyType(StrEnum):
    INFERENCE = "INFERENCE"
    ADMIN = "ADMIN"


class LimitPeriod(StrEnum):
    EPOCH = "EPOCH"
    MONTH = "MONTH"
    LIFETIME = "LIFETIME"


class ModelPrivacy(StrEnum):
    ALL = "ALL"
    PRIVATE_TEXT = "PRIVATE_TEXT"
    PRIVATE_ONLY = "PRIVATE_ONLY"
