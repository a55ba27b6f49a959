"""Kept range answers: a later range merged from the kept points and the span since is the
whole range's answer, and anything that does not line up reads the whole range."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from defrag.detectors.range_memory import (
    KeptRange,
    RangeMemory,
    current_memory,
    kept,
    keyed,
    remembering,
)
from defrag.ports import Sample

STEP = 300_000  # ms
LOOKBACK = 6 * 3600_000
T0 = 1_772_452_800_123  # ms, not on whole seconds (as a recording group's evaluations)


class Fleet:
    """A Prometheus stand-in: each series has a value at every grid time of its life, a
    function of the series and the time alone (as a window ending at the point gives)."""

    def __init__(self, lives: list[tuple[int, int, int]], seed: int) -> None:
        self.lives = lives  # (group, first, last) in steps from T0
        self.seed = seed

    def value(self, i: int, k: int) -> float:
        rng = np.random.default_rng([self.seed, i, k + 10_000])
        x = float(rng.normal(1000.0, 300.0))
        return float("nan") if x < 300 else round(x, 1)

    def range(self, start: int, end: int, groups: frozenset[int] | None = None) -> list[Sample]:
        out = []
        for i, (group, first, last) in enumerate(self.lives):
            if groups is not None and group not in groups:
                continue
            points = tuple(
                ((T0 + k * STEP) / 1000.0, self.value(i, k))
                for k in range(first, last + 1)
                if start <= T0 + k * STEP <= end
            )
            if points:
                out.append(Sample({"gpu": str(group), "pod": f"p{i}"}, points))
        return out


def merge(
    before: KeptRange,
    span: list[Sample],
    group: object,
    asked: frozenset[tuple[str, ...]] | None,
    since: int,
    start: int,
) -> list[Sample] | None:
    """:meth:`KeptRange.merged` of a plain answer, the series without their label pairs."""
    out = before.merged(keyed(span), group_of, asked, since, start)
    return None if out is None else [sample for _, sample in out]


def group_of(labels: object) -> tuple[str, ...]:
    assert isinstance(labels, dict)
    return (labels["gpu"],)


def group(labels: object) -> tuple[str, ...]:
    assert isinstance(labels, dict)
    return (labels["gpu"],)


def by_labels(samples: list[Sample]) -> list[Sample]:
    return sorted(samples, key=lambda s: sorted(s.labels.items()))


def same(a: list[Sample], b: list[Sample]) -> bool:
    """Equal answers, NaN equal to NaN."""
    a, b = by_labels(a), by_labels(b)
    return len(a) == len(b) and all(
        x.labels == y.labels and np.array_equal(x.points, y.points, equal_nan=True)
        for x, y in zip(a, b, strict=True)
    )


lives = st.lists(
    st.tuples(st.integers(0, 3), st.integers(-90, 90), st.integers(0, 120)).map(
        lambda t: (t[0], t[1], t[1] + t[2])
    ),
    max_size=12,
)


@settings(max_examples=300, deadline=None)
@given(
    lives=lives,
    seed=st.integers(0, 1000),
    first_end=st.integers(0, 80),
    ahead=st.integers(0, 80),
    covered=st.sets(st.integers(0, 3)),
    wanted=st.sets(st.integers(0, 3)),
)
def test_the_merged_range_is_the_whole_ranges_answer(
    lives: list[tuple[int, int, int]],
    seed: int,
    first_end: int,
    ahead: int,
    covered: set[int],
    wanted: set[int],
) -> None:
    fleet = Fleet(lives, seed)
    end0 = T0 + first_end * STEP
    end1 = end0 + ahead * STEP
    asked0 = frozenset(covered)
    before = kept(
        keyed(fleet.range(end0 - LOOKBACK, end0, asked0)), _strs(asked0), end0, STEP, LOOKBACK
    )
    since = before.since(end1, STEP, LOOKBACK)
    if ahead * STEP > LOOKBACK - STEP:
        assert since is None  # the kept points do not reach the new range's start
        return
    assert since == end0 - STEP
    old = frozenset(wanted) & asked0
    span = fleet.range(since, end1, old)
    merged = merge(before, span, group, _strs(old), since, end1 - LOOKBACK)
    assert merged is not None
    assert same(merged, fleet.range(end1 - LOOKBACK, end1, old))


def _strs(groups: frozenset[int]) -> frozenset[tuple[str, ...]]:
    return frozenset((str(g),) for g in groups)


def test_every_series_when_nothing_narrows_the_read() -> None:
    fleet = Fleet([(0, -80, 60), (1, 10, 200), (2, 61, 300)], seed=3)
    before = kept(keyed(fleet.range(T0 - LOOKBACK, T0)), None, T0, STEP, LOOKBACK)
    end = T0 + 70 * STEP
    since = before.since(end, STEP, LOOKBACK)
    assert since is not None
    merged = merge(before, fleet.range(since, end), group, None, since, end - LOOKBACK)
    assert merged is not None and same(merged, fleet.range(end - LOOKBACK, end))
    assert {s.labels["pod"] for s in merged} == {"p0", "p1", "p2"}  # p2 began after the kept end


def test_the_whole_range_is_read_when_the_ranges_do_not_share_points() -> None:
    before = kept([], None, T0, STEP, LOOKBACK)
    assert before.since(T0, STEP, LOOKBACK) == T0 - STEP  # the same end: the last two points
    assert before.since(T0 + 2 * STEP, STEP, LOOKBACK) == T0 - STEP
    assert before.since(T0 + STEP + 1, STEP, LOOKBACK) is None  # off the step's grid
    assert before.since(T0 - STEP, STEP, LOOKBACK) is None  # before the kept end
    assert before.since(T0 + STEP, STEP * 2, LOOKBACK) is None  # another step
    assert before.since(T0 + STEP, STEP, LOOKBACK - STEP) is None  # another lookback
    assert before.since(T0 + LOOKBACK, STEP, LOOKBACK) is None  # past the kept points
    assert before.since(T0 + LOOKBACK - STEP, STEP, LOOKBACK) == T0 - STEP  # just within


def test_a_lookback_off_the_step_asks_from_the_kept_ranges_last_point_but_one() -> None:
    lookback = 1000 * 1000  # 1000 s: points at start, +300, +600, +900 s, none at the end

    def answer(start: int, end: int, since: int | None = None) -> list[Sample]:
        grid = range(start, end + 1, STEP)  # a range's points: its start + k·step
        points = tuple((t / 1000.0, float(t % 7919)) for t in grid if since is None or t >= since)
        return [Sample({"gpu": "0", "pod": "p0"}, points)]

    before = kept(keyed(answer(T0 - lookback, T0)), None, T0, STEP, lookback)
    end = T0 + 2 * STEP
    since = before.since(end, STEP, lookback)
    assert since == T0 - 100_000 - STEP  # the kept grid's last point is 100 s before its end
    span = answer(end - lookback, end, since)
    merged = merge(before, span, group, None, since, end - lookback)
    assert merged == answer(end - lookback, end)


def test_answers_that_do_not_line_up_are_refused() -> None:
    fleet = Fleet([(0, -80, 60), (1, -80, 60)], seed=7)
    before = kept(keyed(fleet.range(T0 - LOOKBACK, T0)), None, T0, STEP, LOOKBACK)
    end = T0 + STEP
    since = before.since(end, STEP, LOOKBACK)
    assert since is not None
    start = end - LOOKBACK
    span = fleet.range(since, end)
    assert merge(before, span, group, None, since, start) is not None

    def changed(sample: Sample, value: float) -> Sample:
        return replace(sample, points=((sample.points[0][0], value), *sample.points[1:]))

    # the point asked again has another value (a Prometheus that lost or rewrote data)
    assert merge(before, [changed(span[0], -1.0), span[1]], group, None, since, start) is None
    # … or is missing, or the series is: it was kept with a point there
    assert merge(before, [span[0]], group, None, since, start) is None
    gone = replace(span[1], points=span[1].points[1:])
    assert merge(before, [span[0], gone], group, None, since, start) is None
    # a series never kept answers a point at the time asked again: it has a past
    stranger = Sample({"gpu": "9", "pod": "x"}, span[0].points)
    assert merge(before, [*span, stranger], group, None, since, start) is None
    # a point off the step's grid, or before the time asked
    off = replace(span[0], points=((span[0].points[0][0] + 1.0, 5.0), *span[0].points[1:]))
    assert merge(before, [off, span[1]], group, None, since, start) is None


def test_the_memory_is_the_current_detections_only_inside_remembering() -> None:
    memory = RangeMemory()
    assert current_memory() is None
    with remembering(memory):
        assert current_memory() is memory
        with remembering(None):
            assert current_memory() is None
        assert current_memory() is memory
    assert current_memory() is None
    memory.put("a", kept([], None, T0, STEP, LOOKBACK))
    assert isinstance(memory.get("a"), KeptRange) and len(memory) == 1
    memory.drop("a")
    assert memory.get("a") is None and len(memory) == 0
