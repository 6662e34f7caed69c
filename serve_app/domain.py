"""Values shared by the wire (serve_app/schemas), the tables (serve_app/db/tables.py) and the
rest of the app: each imports them from here, so request models never import the tables."""

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


# The rate-limit tier of an account that was given none (configs/rate_limit_tiers.yaml).
DEFAULT_RATE_LIMIT_TIER = "default"
