"""What a detection keeps of a range answer for the next one, so a later detection asks only
for the span since.

A range query's points lie at ``start + k·step``, and each point's value is a function of the
series and of that point's time alone when the query reads a window ending at the point
(``quantile_over_time(0.5, x[step])``, ``last_over_time(x[w] offset -1s)``): no ``@ start()``
or ``@ end()``, nothing of the range itself. So when a later range has the same step and
lookback and ends a whole number of steps after the kept one, its points before the kept end
are the kept points, and only the span from the kept end on has to be asked.

:class:`KeptRange` is one answer as kept: each series' points over the lookback (two float
arrays, a seventh of the tuples' memory), which groups of series it holds whole (``covered``:
a group absent from it was not asked, so it is read over the whole lookback), and its end.
:meth:`KeptRange.since` says from when a later range may be asked (the kept range's last point
but one: that point is asked again, and must come back as kept — else the answer does not
line up with what was kept, a Prometheus that lost or changed data, and the whole range is
read again); :meth:`KeptRange.merged` joins the kept points and the span's answer into what the
whole range's answer would be, or None when they do not line up.

:class:`RangeMemory` holds the kept answers of one detector's reads between detections (a
daemon's cycles); :func:`remembering` makes one the current memory of a detection, and
:func:`current_memory` is how a rule finds it. A detection outside it (``defrag detect``, run
once) keeps nothing and reads every range whole.
"""

from __future__ import annotations

import bisect
import threading
from collections.abc import Callable, Hashable, Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass
from itertools import chain
from operator import itemgetter

import numpy as np

from defrag.ports import Sample

Group = tuple[str, ...]
"""The values of the labels that make series one group (a GPU's): kept or asked together."""


def ms(seconds: float) -> int:
    """Unix seconds as Prometheus's milliseconds (its resolution)."""
    return round(seconds * 1000.0)


Key = tuple[tuple[str, str], ...]
"""A series' labels as sorted (name, value) pairs."""


@dataclass(frozen=True, slots=True)
class KeptRange:
    """One range answer kept after a detection: every series' points in one block (``times``
    and ``values``, each series' run in time order), each series' run (``runs``: its start and
    end in the block) and ``labels`` by its label pairs; the range's ``end_ms``, ``step_ms``
    and ``lookback_ms``; and the groups it holds every series of (``covered``; None: every
    series the query has)."""

    end_ms: int
    step_ms: int
    lookback_ms: int
    covered: frozenset[Group] | None
    times: np.ndarray
    values: np.ndarray
    runs: Mapping[Key, tuple[int, int]]
    labels: Mapping[Key, Mapping[str, str]]

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
        span: Sequence[tuple[Key, Sample]],
        group: Callable[[Mapping[str, str]], Group],
        asked: frozenset[Group] | None,
        since_ms: int,
        start_ms: int,
    ) -> list[tuple[Key, Sample]] | None:
        """The whole range's answer for the groups ``asked`` (None: every series), from the
        kept points at ``start_ms`` … ``since_ms`` and ``span``, the answer of the range from
        ``since_ms`` on (of those groups only, each series with its label pairs, :func:`keyed`;
        ``group`` tells a series' group by its labels);
        None when they do not line up: a point of ``span`` off the step's grid
        or before ``since_ms``, or a series whose point at ``since_ms`` (asked again) is not
        the kept one — absent on one side, or another value. Each series with its label pairs,
        in no particular order.

        Times are compared as the floats they are: Prometheus writes a point's time as its
        milliseconds ÷ 1000, the float nearest that decimal, which ``ms / 1000.0`` is too."""
        out: list[tuple[Key, Sample]] = []
        fresh: set[Key] = set()
        start_s, since_s = start_ms / 1000.0, since_ms / 1000.0
        times, values = self.times.tolist(), self.values.tolist()  # floats, as answered

        def head(run: tuple[int, int]) -> tuple[int, int]:
            """The run's points at ``start_s`` … ``since_s``, both included."""
            lo = bisect.bisect_left(times, start_s, *run)
            return lo, bisect.bisect_right(times, since_s, lo, run[1])

        for key, sample in span:
            fresh.add(key)
            points = sample.points
            if any(
                (t_ms := ms(t)) < since_ms or (t_ms - since_ms) % self.step_ms for t, _ in points
            ):
                return None
            run = self.runs.get(key)
            lo, hi = head(run) if run is not None else (0, 0)
            again = points[0] if points and points[0][0] == since_s else None
            was = hi > lo and times[hi - 1] == since_s
            if (again is None) == was or (
                again is not None and not _same(again[1], values[hi - 1])
            ):
                return None
            if hi == lo:
                out.append((key, sample))
                continue
            kept_points = tuple(zip(times[lo:hi], values[lo:hi], strict=True))
            rest = points[1 if again is not None else 0 :]
            out.append((key, Sample(sample.labels, kept_points + rest)))
        for key, run in self.runs.items():
            if key in fresh or (asked is not None and group(self.labels[key]) not in asked):
                continue
            lo, hi = head(run)
            if hi > lo and times[hi - 1] == since_s:
                return None  # a point at since_ms kept but not answered again
            if hi > lo:
                kept_points = tuple(zip(times[lo:hi], values[lo:hi], strict=True))
                out.append((key, Sample(self.labels[key], kept_points)))
        return out


def _same(a: float, b: float) -> bool:
    """Equal values, NaN equal to NaN (Prometheus answers NaN as a value)."""
    return a == b or (a != a and b != b)


def keyed(samples: Iterable[Sample]) -> list[tuple[Key, Sample]]:
    """Each series with its label pairs, sorted by them: the order Prometheus answers a range
    query in (promql's Matrix sort, labels.Compare: (name, value) pairs by name, shorter first
    on a tie)."""
    return sorted(((tuple(sorted(s.labels.items())), s) for s in samples), key=itemgetter(0))


def kept(
    answer: Sequence[tuple[Key, Sample]],
    covered: frozenset[Group] | None,
    end_ms: int,
    step_ms: int,
    lookback_ms: int,
) -> KeptRange:
    """``answer`` (the whole range's, ending at ``end_ms``, each series with its label pairs)
    as kept for the next detection: its points in two float arrays (a seventh of the tuples'
    memory)."""
    counts = [len(sample.points) for _, sample in answer]
    flat = np.fromiter(
        chain.from_iterable(chain.from_iterable(sample.points for _, sample in answer)),
        dtype=float,
        count=2 * sum(counts),
    )
    ends = np.cumsum(counts).tolist()
    runs: dict[Key, tuple[int, int]] = {}
    labels: dict[Key, Mapping[str, str]] = {}
    for (key, sample), end, count in zip(answer, ends, counts, strict=True):
        runs[key] = (end - count, end)
        labels[key] = sample.labels
    return KeptRange(
        end_ms, step_ms, lookback_ms, covered, flat[0::2].copy(), flat[1::2].copy(), runs, labels
    )


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
