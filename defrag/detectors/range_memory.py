"""What a detection keeps of a range answer for the next one, so a later detection asks only
for the span since.

A range query's points lie at ``start + k·step``, and each point's value is a function of the
series and of that point's time alone when the query reads a window ending at the point
(``quantile_over_time(0.5, x[step])``, ``last_over_time(x[w] offset -1s)``): no ``@ start()``
or ``@ end()``, nothing of the range itself. So when a later range has the same step and
lookback and ends a whole number of steps after the kept one, its points before the kept end
are the kept points, and only the span from the kept end on has to be asked.

:class:`KeptRange` is one answer as kept: each series' points over the lookback (numpy, a
seventh of the tuples' memory), which groups of series it holds whole (``covered``: a group
absent from it was not asked, so it is read over the whole lookback), and its end.
:meth:`KeptRange.since` says from when a later range may be asked (the kept end less one
step: that point is asked again, and must come back as kept — else the answer does not line up
with what was kept, a Prometheus that lost or changed data, and the whole range is read
again); :meth:`KeptRange.merged` joins the kept points and the span's answer into what the
whole range's answer would be, or None when they do not line up.

:class:`RangeMemory` holds the kept answers of one detector's reads between detections (a
daemon's cycles); :func:`remembering` makes one the current memory of a detection, and
:func:`current_memory` is how a rule finds it. A detection outside it (``defrag detect``, run
once) keeps nothing and reads every range whole.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Hashable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass

import numpy as np

from defrag.ports import Sample

Group = tuple[str, ...]
"""The values of the labels that make series one group (a GPU's): kept or asked together."""


def ms(seconds: float) -> int:
    """Unix seconds as Prometheus's milliseconds (its resolution)."""
    return round(seconds * 1000.0)


@dataclass(frozen=True, slots=True)
class KeptRange:
    """One range answer kept after a detection: its series' ``points`` by their label items
    (``(n, 2)`` arrays of time and value, in time order, within the lookback), their labels,
    the range's ``end_ms``, ``step_ms`` and ``lookback_ms``, and the groups it holds every
    series of (``covered``; None: every series the query has)."""

    end_ms: int
    step_ms: int
    lookback_ms: int
    covered: frozenset[Group] | None
    points: Mapping[tuple[tuple[str, str], ...], np.ndarray]
    labels: Mapping[tuple[tuple[str, str], ...], Mapping[str, str]]

    def since(self, end_ms: int, step_ms: int, lookback_ms: int) -> int | None:
        """The time (ms) from which a range ending at ``end_ms`` may be asked, the points
        before it taken from here: the kept range's last point but one (its last may still
        gain samples that came late; the one before is settled, and is asked again to check
        that the answers line up); None when the whole range must be read: another step or
        lookback, an end before the kept one or not a whole number of steps after it, or a
        gap so long that the kept points do not reach the new range's start."""
        if step_ms != self.step_ms or lookback_ms != self.lookback_ms or step_ms <= 0:
            return None
        ahead = end_ms - self.end_ms
        if ahead < 0 or ahead % step_ms:
            return None
        # the kept range's points are at its start + k·step, the new one's on the same grid
        # (a whole number of steps later); asked again from the kept range's last point but one
        last = self.end_ms - lookback_ms % step_ms
        since = last - step_ms
        if since < end_ms - lookback_ms:
            return None
        return since

    def merged(
        self,
        span: Sequence[Sample],
        group: Callable[[Mapping[str, str]], Group],
        asked: frozenset[Group] | None,
        since_ms: int,
        start_ms: int,
    ) -> list[Sample] | None:
        """The whole range's answer for the groups ``asked`` (None: every series), from the
        kept points at ``start_ms`` … ``since_ms`` and ``span``, the answer of the range from
        ``since_ms`` on (of those groups only; ``group`` tells a series' group by its labels);
        None when they do not line up: a point of ``span`` off the step's grid
        or before ``since_ms``, or a series whose point at ``since_ms`` (asked again) is not
        the kept one — absent on one side, or another value. Series in no particular order."""
        out: list[Sample] = []
        fresh: set[tuple[tuple[str, str], ...]] = set()
        for sample in span:
            key = tuple(sorted(sample.labels.items()))
            fresh.add(key)
            points = sample.points
            if any(
                (t_ms := ms(t)) < since_ms or (t_ms - since_ms) % self.step_ms for t, _ in points
            ):
                return None
            kept = self.points.get(key)
            again = points[0] if points and ms(points[0][0]) == since_ms else None
            before = _trimmed(kept, start_ms, since_ms) if kept is not None else None
            last = before[-1] if before is not None and len(before) else None
            was = tuple(last) if last is not None and ms(float(last[0])) == since_ms else None
            if (again is None) != (was is None) or (
                again is not None and was is not None and not _same(again[1], was[1])
            ):
                return None
            if before is None or not len(before):
                out.append(sample)
                continue
            head = tuple(map(tuple, before.tolist()))
            out.append(Sample(sample.labels, head + points[1 if again is not None else 0 :]))
        for key, kept in self.points.items():
            if key in fresh or (asked is not None and group(self.labels[key]) not in asked):
                continue
            before = _trimmed(kept, start_ms, since_ms)
            if len(before) and ms(float(before[-1][0])) == since_ms:
                return None  # a point at since_ms kept but not answered again
            if len(before):
                out.append(Sample(self.labels[key], tuple(map(tuple, before.tolist()))))
        return out


def _same(a: float, b: float) -> bool:
    """Equal values, NaN equal to NaN (Prometheus answers NaN as a value)."""
    return a == b or (a != a and b != b)


def _trimmed(points: np.ndarray, start_ms: int, since_ms: int) -> np.ndarray:
    """The kept points at ``start_ms`` … ``since_ms`` (both included)."""
    times = np.rint(points[:, 0] * 1000.0)
    lo = int(np.searchsorted(times, start_ms, side="left"))
    hi = int(np.searchsorted(times, since_ms, side="right"))
    return points[lo:hi]


def kept(
    answer: Sequence[Sample],
    covered: frozenset[Group] | None,
    end_ms: int,
    step_ms: int,
    lookback_ms: int,
) -> KeptRange:
    """``answer`` (the whole range's, ending at ``end_ms``) as kept for the next detection."""
    points: dict[tuple[tuple[str, str], ...], np.ndarray] = {}
    labels: dict[tuple[tuple[str, str], ...], Mapping[str, str]] = {}
    for sample in answer:
        key = tuple(sorted(sample.labels.items()))
        points[key] = np.array(sample.points, dtype=float).reshape(-1, 2)
        labels[key] = sample.labels
    return KeptRange(end_ms, step_ms, lookback_ms, covered, points, labels)


class RangeMemory:
    """The kept range answers of one detector's rules between detections, by what was asked
    (a key the rule makes of its query, step and lookback). One detection at a time reads and
    replaces an answer; the lock keeps two from tearing one entry."""

    def __init__(self) -> None:
        self._kept: dict[Hashable, KeptRange] = {}
        self._lock = threading.Lock()

    def get(self, key: Hashable) -> KeptRange | None:
        with self._lock:
            return self._kept.get(key)

    def put(self, key: Hashable, value: KeptRange) -> None:
        with self._lock:
            self._kept[key] = value

    def drop(self, key: Hashable) -> None:
        with self._lock:
            self._kept.pop(key, None)

    def __len__(self) -> int:
        with self._lock:
            return len(self._kept)


_CURRENT: ContextVar[RangeMemory | None] = ContextVar("defrag_range_memory", default=None)


@contextmanager
def remembering(memory: RangeMemory | None) -> Iterator[None]:
    """``memory`` is the current detection's (None: none) until the block ends."""
    token = _CURRENT.set(memory)
    try:
        yield
    finally:
        _CURRENT.reset(token)


def current_memory() -> RangeMemory | None:
    """The memory of the detection running in this context, if any."""
    return _CURRENT.get()
