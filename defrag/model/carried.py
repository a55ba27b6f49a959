"""The last value a step made, carried to the next step under one lock.

A cycle's work at fleet scale is mostly the same as the last cycle's: between two snapshots a few
pods change while every other object is the same (frozen) one. So a part keeps what it made
last (the seating, the shape counts, the placements, a report's rows) and makes the next from
it and the new input, or from nothing when the kept one does not serve. Every such part needs
the same three things, which this class is: the last value, a lock under which the next one is
made (the daemon's cycle, its HTTP handlers and a simulator's threads may ask at once), and
nothing kept when a step raises half-way (a value changed in place and left half-done would be
carried on).

:class:`KeptFor` is the simplest such part: the value made for the very objects asked about last
(held, compared by identity), made again for any other — what one snapshot's rules and the
planner ask twice (its pending pods, each pod shape's diagnosis, the pods changed since the last
snapshot). A cluster is never changed in place, so the value made for it stays its own.
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


class KeptFor(Generic[T]):
    """The value last made for a tuple of objects, made again when other objects are asked
    about. Thread-safe: one caller makes it, the others get the one made."""

    def __init__(self) -> None:
        self._carried: Carried[tuple[tuple[object, ...], T]] = Carried()

    def get(self, key: tuple[object, ...], make: Callable[[], T]) -> T:
        def step(last: tuple[tuple[object, ...], T] | None) -> tuple[tuple[object, ...], T]:
            return last if last is not None and _same(key, last[0]) else (key, make())

        return self._carried.step(step)[1]


def _same(a: tuple[object, ...], b: tuple[object, ...]) -> bool:
    return len(a) == len(b) and all(x is y for x, y in zip(a, b, strict=True))


__all__ = ["Carried", "KeptFor"]
