"""A clock for code that takes one (a `() -> float` of seconds): it reads `now` until the test
moves it."""

from __future__ import annotations


class FakeClock:
    def __init__(self, now: float = 1000.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now
