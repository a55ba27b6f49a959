"""The last value a step made, carried to the next step under one lock.

A cycle's work at fleet scale is mostly the same as the last cycle's: between two snapshots a few
pods change while every other object is the same (frozen) one. So a part keeps what it made
last (the seating, the shape counts, the placements, a report's rows) and makes the next from
it and the new input, or from nothing when the kept one does not serve. Every such part needs
the same three things, which this class is: the last value, a lock under which the next one is
made (the daemon's cycle, its HTTP handlers and a simulator's threads may ask at once), and
nothing kept when a step raises half-way (a value changed in place and left half-done would be
carried on).
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Generic, TypeVar

T = TypeVar("T")


class Carried(Generic[T]):
    """The last value made, and the (re-entrant) lock under which the next is made from it."""

    def __init__(self) -> None:
        self.lock = threading.RLock()
        """Held while a step runs; a caller that reads the value after the step (or changes
        it) holds it around both."""
        self._last: T | None = None

    def step(self, make: Callable[[T | None], T]) -> T:
        """``make(last)`` (``last``: the value kept, None at first), kept as the last value and
        returned. When ``make`` raises nothing is kept."""
        with self.lock:
            last, self._last = self._last, None
            value = make(last)
            self._last = value
            return value


__all__ = ["Carried"]
