"""The collector policy (defrag/model/gc_policy.py): what it sets inside the block, and that the
collector is as it was after it — enabled or not, the same thresholds — also when it raises."""

from __future__ import annotations

import gc
import threading
from collections.abc import Iterator
from contextlib import nullcontext

import pytest

from defrag.adapters.kube_convert import paused_gc
from defrag.model.gc_policy import YOUNG_EVERY, gc_deferred


@pytest.fixture(autouse=True)
def _collector_kept() -> Iterator[None]:
    enabled, thresholds = gc.isenabled(), gc.get_threshold()
    yield
    gc.set_threshold(*thresholds)
    gc.enable() if enabled else gc.disable()


class _Boom(Exception):
    pass


# (young_every, enabled before, thresholds before, enabled inside, thresholds inside)
CASES = [
    # rarer young collections: the first threshold raised, the older generations' kept
    (YOUNG_EVERY, True, (700, 10, 10), True, (100_000, 10, 10)),
    # never lowered: a threshold already above it stays
    (1_000, True, (5_000, 3, 4), True, (5_000, 3, 4)),
    # a disabled collector stays disabled inside and after
    (YOUNG_EVERY, False, (700, 10, 10), False, (100_000, 10, 10)),
    # paused: no collection inside; thresholds untouched
    (None, True, (700, 10, 10), False, (700, 10, 10)),
    (None, False, (900, 7, 7), False, (900, 7, 7)),
]


@pytest.mark.parametrize("raises", [False, True])
@pytest.mark.parametrize(("young", "enabled", "before", "enabled_in", "inside"), CASES)
def test_gc_deferred_sets_then_restores(
    young: int | None,
    enabled: bool,
    before: tuple[int, int, int],
    enabled_in: bool,
    inside: tuple[int, int, int],
    raises: bool,
) -> None:
    gc.set_threshold(*before)
    gc.enable() if enabled else gc.disable()
    seen: list[tuple[bool, tuple[int, int, int]]] = []
    with pytest.raises(_Boom) if raises else nullcontext(), gc_deferred(young):
        seen.append((gc.isenabled(), gc.get_threshold()))
        if raises:
            raise _Boom
    assert seen == [(enabled_in, inside)]
    assert (gc.isenabled(), gc.get_threshold()) == (enabled, before)


def test_a_body_that_enables_the_collector_is_undone() -> None:
    gc.disable()
    with gc_deferred(YOUNG_EVERY):
        gc.enable()
    assert not gc.isenabled()


@pytest.mark.parametrize("raises", [False, True])
def test_paused_gc_is_the_policy_paused(raises: bool) -> None:
    gc.enable()
    with pytest.raises(_Boom) if raises else nullcontext(), paused_gc():
        assert not gc.isenabled()
        if raises:
            raise _Boom
    assert gc.isenabled()


def test_blocks_of_two_threads_that_overlap_leave_the_collector_as_it_was() -> None:
    """Before: each block put back the collector as it had found it, so when a watch thread's
    list (paused) began during the cycle's build (paused) and ended after it, the list put
    back "paused" — the collector stayed off for the rest of the process's life. Seen in the
    long soak: a replica's young generation at a million allocations and no collection in 10
    minutes, its RSS growing by whole copies of the cluster. Now the collector is back as it
    was once the last block of any thread has closed, and paused while any is open."""
    gc.enable()
    gc.set_threshold(700, 10, 10)
    first_in, second_in, first_out = threading.Event(), threading.Event(), threading.Event()
    seen: dict[str, bool] = {}

    def first() -> None:
        with paused_gc():
            first_in.set()
            second_in.wait(10)
        seen["after the first closed, the second still open"] = gc.isenabled()
        first_out.set()

    def second() -> None:
        first_in.wait(10)
        with gc_deferred(YOUNG_EVERY):
            second_in.set()
            first_out.wait(10)
            seen["inside the second, rarer young collections"] = gc.get_threshold()[0] == (
                YOUNG_EVERY
            )

    threads = [threading.Thread(target=first), threading.Thread(target=second)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(20)
    assert seen == {
        "after the first closed, the second still open": True,
        "inside the second, rarer young collections": True,
    }
    assert gc.isenabled()
    assert gc.get_threshold() == (700, 10, 10)


def test_overlapping_pauses_of_two_threads_leave_the_collector_enabled() -> None:
    """The soak's case exactly: two paused blocks, the first closing while the second is open."""
    gc.enable()
    first_in, second_in, first_out = threading.Event(), threading.Event(), threading.Event()
    inside: list[bool] = []

    def first() -> None:
        with paused_gc():
            first_in.set()
            second_in.wait(10)
        first_out.set()

    def second() -> None:
        first_in.wait(10)
        with paused_gc():
            second_in.set()
            first_out.wait(10)
            inside.append(gc.isenabled())

    threads = [threading.Thread(target=first), threading.Thread(target=second)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(20)
    assert inside == [False]  # still paused while the second was open
    assert gc.isenabled()
