"""Time windows of billing: the DIEM epoch (a UTC day) and a key's `limitPeriod` window."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta


def epoch_day(now: datetime) -> str:
    return now.astimezone(UTC).strftime("%Y-%m-%d")


def next_epoch(now: datetime) -> datetime:
    day = now.astimezone(UTC).replace(hour=0, minute=0, second=0, microsecond=0)
    return day + timedelta(days=1)


def window_start(period: str, now: datetime) -> str:
    """The id of the window `now` falls in: `EPOCH` is a UTC day, `MONTH` a UTC calendar month,
    `LIFETIME` one window for ever."""
    now = now.astimezone(UTC)
    if period == "EPOCH":
        return now.strftime("D%Y-%m-%d")
    if period == "MONTH":
        return now.strftime("M%Y-%m")
    return "LIFETIME"
