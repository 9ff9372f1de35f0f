"""A settable clock for tests of anything that takes `clock: Callable[[], int]` (ms)."""

from __future__ import annotations

__all__ = ["ManualClock"]


class ManualClock:
    """Returns `now_ms` until told otherwise; picklable, so Beam DoFns can carry it."""

    def __init__(self, now_ms: int) -> None:
        self.now_ms = now_ms

    def __call__(self) -> int:
        return self.now_ms

    def advance(self, ms: int) -> None:
        self.now_ms += ms
