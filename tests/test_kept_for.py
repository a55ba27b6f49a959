"""``defrag/model/carried.KeptFor``: a value is made once for the very same objects and again
for others, equal or not (a new snapshot equal to the last is still another snapshot)."""

from __future__ import annotations

import threading

from defrag.model.carried import KeptFor


def test_the_same_objects_get_the_value_made_for_them_once() -> None:
    kept: KeptFor[list[int]] = KeptFor()
    made: list[int] = []
    a, b = object(), object()

    def make() -> list[int]:
        made.append(1)
        return [len(made)]

    first = kept.get((a, b), make)
    assert kept.get((a, b), make) is first and len(made) == 1
    assert kept.get((a,), make) is not first  # fewer objects: another key
    assert kept.get((a, object()), make) == [3]
    assert kept.get(([], []), make) is not kept.get(([], []), make)  # equal is not the same
    assert len(made) == 5


def test_callers_at_once_share_one_making() -> None:
    kept: KeptFor[object] = KeptFor()
    key = (object(),)
    made: list[object] = []
    gate = threading.Barrier(8)
    got: list[object] = []

    def ask() -> None:
        gate.wait()
        got.append(kept.get(key, lambda: made.append(object()) or made[-1]))

    threads = [threading.Thread(target=ask) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(made) == 1 and all(g is made[0] for g in got)
