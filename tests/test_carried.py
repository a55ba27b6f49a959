"""The last value carried to the next step (defrag/model/carried.py)."""

from __future__ import annotations

import threading

import pytest

from defrag.model.carried import Carried


def test_each_step_is_made_from_the_last() -> None:
    carried: Carried[list[int]] = Carried()
    seen: list[list[int] | None] = []

    def step(last: list[int] | None) -> list[int]:
        seen.append(None if last is None else list(last))
        return [*(last or []), len(seen)]

    assert carried.step(step) == [1]
    assert carried.step(step) == [1, 2]
    assert seen == [None, [1]]


def test_a_step_that_raises_leaves_nothing_to_carry() -> None:
    """A value changed in place by a step that failed half-way is not handed to the next."""
    carried: Carried[list[int]] = Carried()
    carried.step(lambda last: [1])

    def half_way(last: list[int] | None) -> list[int]:
        assert last is not None
        last.append(99)
        raise RuntimeError("half-way")

    with pytest.raises(RuntimeError):
        carried.step(half_way)
    assert carried.step(lambda last: last if last is not None else [0]) == [0]


def test_a_caller_holding_the_lock_may_step_and_read() -> None:
    carried: Carried[int] = Carried()
    with carried.lock:
        assert carried.step(lambda last: 1) == 1


def test_steps_from_many_threads_are_made_one_at_a_time() -> None:
    carried: Carried[int] = Carried()
    inside = threading.Event()
    overlaps: list[int] = []

    def step(last: int | None) -> int:
        if inside.is_set():
            overlaps.append(1)
        inside.set()
        value = (last or 0) + 1
        inside.clear()
        return value

    def work() -> None:
        for _ in range(200):
            carried.step(step)

    threads = [threading.Thread(target=work) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert overlaps == []
    assert carried.step(lambda last: last or 0) == 800
