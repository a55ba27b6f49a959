"""One value kept from call to call, while it is asked for the very same objects.

What a cycle works out of one snapshot (its pending pods, each pod shape's diagnosis) is asked
for again by the next rule and by the planner, of the same snapshot. A cluster is never changed
in place (every change makes a new one), so the value made for the last objects asked about
(held, compared by identity) is theirs as long as those objects are asked about again.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Generic, TypeVar

from defrag.model.carried import Carried

T = TypeVar("T")


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


__all__ = ["KeptFor"]
