"""Whether a run should stop, asked between engine steps but not at every one.

``should_stop`` may ask Redis (a fleet job's cancel flag), so ``StopPoll`` asks it at most
every ``interval_s`` (an embedded run's flag and Event are cheap: 0). A check that fails is
logged and read as "carry on": a broker hiccup must not cancel a job.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

log = logging.getLogger(__name__)


class StopPoll:
    """``poll()``: ``should_stop()``, asked at most every ``interval_s``; False in between."""

    def __init__(self, should_stop: Callable[[], bool] | None, interval_s: float = 1.0) -> None:
        self.should_stop, self.interval_s = should_stop, interval_s
        self._last = 0.0

    def __call__(self) -> bool:
        if self.should_stop is None:
            return False
        now = time.monotonic()
        if now - self._last < self.interval_s:
            return False
        self._last = now
        try:
            return bool(self.should_stop())
        except Exception as exc:
            log.warning("cancel check failed, carrying on: %s", exc)
            return False
