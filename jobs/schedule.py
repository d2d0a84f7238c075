"""A job's ``schedule``: a 5-field cron expression (UTC) or a fixed interval (``every 30s``).

Cron is what people write for nightly jobs; the interval form exists for short periods
(tests, polling a landing bucket) that cron's one-minute resolution cannot express.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from croniter import croniter

_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400}
_EVERY = re.compile(
    r"every\s+(\d+(?:\.\d+)?)\s*(s|secs?|seconds?|m|mins?|minutes?|h|hrs?|hours?|d|days?)\Z", re.IGNORECASE
)
_MACROS = {
    "@hourly": "0 * * * *",
    "@daily": "0 0 * * *",
    "@midnight": "0 0 * * *",
    "@weekly": "0 0 * * 0",
    "@monthly": "0 0 1 * *",
    "@yearly": "0 0 1 1 *",
    "@annually": "0 0 1 1 *",
}


@dataclass(frozen=True)
class Schedule:
    """Either ``cron`` (5 fields) or ``seconds`` (an interval) is set."""

    cron: str | None = None
    seconds: float | None = None

    def celery(self) -> Any:
        """The matching ``celery.schedules`` object for a beat entry."""
        from celery.schedules import crontab, schedule

        if self.seconds is not None:
            return schedule(run_every=self.seconds)
        minute, hour, day_of_month, month_of_year, day_of_week = self.cron.split()
        return crontab(
            minute=minute, hour=hour, day_of_month=day_of_month, month_of_year=month_of_year, day_of_week=day_of_week
        )


def parse_schedule(text: str) -> Schedule:
    """Raises ValueError saying what a valid schedule looks like."""
    text = " ".join(str(text).split())
    every = _EVERY.match(text)
    if every:
        seconds = float(every.group(1)) * _UNITS[every.group(2)[0].lower()]
        if seconds < 1:
            raise ValueError(f"interval {text!r} is shorter than one second")
        return Schedule(seconds=seconds)
    cron = _MACROS.get(text.lower(), text)
    if len(cron.split()) != 5 or not croniter.is_valid(cron):
        raise ValueError(
            f"{text!r} is not a schedule: expected a 5-field cron expression "
            "('minute hour day-of-month month day-of-week', e.g. '0 2 * * *', in UTC), "
            "a macro like '@daily', or an interval like 'every 30s' / 'every 5m'"
        )
    return Schedule(cron=cron)
