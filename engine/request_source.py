"""Requests queued as the scheduler's admission reaches them, not all before the first step."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from engine.request_intake import RequestError
from engine.sampling_params import SamplingParams

Request = tuple[str, str | list[int], SamplingParams | dict[str, Any] | None]  # (id, prompt, params)


class RequestSource:
    """The scheduler's ``source`` for one ``LLMEngine.add_requests`` call: each call queues the next
    request ``add`` accepts and says whether it queued one.

    A request ``add`` refuses (``RequestError``) goes to ``refused`` and the next one is tried.
    Any other exception, from ``add`` or ``refused``, must not escape a schedule: it ends the
    source and goes to ``end`` for the caller. ``end`` runs as the last request is queued, not one
    call later, so the engine stops counting the source as work with that request; the engine
    keeps only what ``end`` hands it, so an ended source (the caller's prompts and callbacks) is
    freed with the scheduler's reference."""

    def __init__(
        self, requests: list[Request], add: Callable[[str, str | list[int], Any], None],
        refused: Callable[[str, str | list[int], RequestError], None], end: Callable[[Exception | None], None],
    ) -> None:
        self.requests = requests
        self._fed = 0
        self._add, self._refused, self._end = add, refused, end

    def __call__(self) -> bool:
        try:
            while self._fed < len(self.requests):
                request_id, prompt, params = self.requests[self._fed]
                self._fed += 1
                try:
                    self._add(request_id, prompt, params)
                except RequestError as e:
                    self._refused(request_id, prompt, e)
                    continue
                if self._fed == len(self.requests):
                    self._end(None)
                return True
        except Exception as e:  # noqa: BLE001 - add or refused: for the caller
            self._end(e)
            return False
        self._end(None)
        return False
