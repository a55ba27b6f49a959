"""When Python's cyclic garbage collector runs while defrag builds many objects: one policy.

defrag's bulk work (a simulated timeline, a snapshot's conversion of every Kubernetes object)
makes hundreds of thousands to millions of objects that either die young by reference counting
or live on without forming reference cycles. The cyclic collector cannot free any of them, yet
at its default thresholds it walks them again and again: about 20% of a 48 h timeline run and a
third of the CPU of a 40,000-pod conversion. So, for the bulk work only and never beyond it:

* **young collections rarer** (``young_every=N``): the youngest generation is collected every N
  allocations instead of Python's 700 (the older generations' ratios are kept), so cycles are
  still reclaimed during a long run — the timeline, whose hooks may make a few;
* **paused** (``young_every=None``): no collection at all, for a bounded burst of conversions
  that makes no cycles (a list or a build of Kubernetes objects).

Both restore the collector as it was — enabled or not, the same thresholds — when the block
ends, also when it raises. Taking long-lived objects out of the collector's sight after a large
list (``gc.freeze``) is the watched store's business (``adapters/kube_watch.settle``).
"""

from __future__ import annotations

import gc
import threading
from collections.abc import Iterator
from contextlib import contextmanager

YOUNG_EVERY = 100_000
"""Allocations between two young-generation collections during a timeline run (Python's
default: 700). At the default the collector took ~20% of a 48 h run (10.6 → 8.4 s median on a
quiet machine, the same result digest)."""


_lock = threading.Lock()
_active: list[int | None] = []
"""The policies of the blocks open now, in every thread (the collector is the process's)."""
_saved: tuple[bool, tuple[int, int, int]] = (True, (700, 10, 10))
"""The collector as it was when the first of them opened."""


def _apply() -> None:
    """The strictest policy of the open blocks: paused if any is; else the rarest young
    collections (never below the saved threshold); none open, the saved collector back."""
    enabled, thresholds = _saved
    young = [y for y in _active if y is not None]
    if young:
        gc.set_threshold(max(*young, thresholds[0]), *thresholds[1:])
    else:
        gc.set_threshold(*thresholds)
    if enabled and None not in _active:
        gc.enable()
    else:
        gc.disable()


@contextmanager
def gc_deferred(young_every: int | None = None) -> Iterator[None]:
    """Collect the young generation at most every ``young_every`` allocations (never lower
    than the threshold already set), or not at all when None; restored after the block.

    One state for the whole process, as the collector is: each block saving the collector as
    it found it and putting that back, two threads' blocks that overlapped left it off for
    good (the second saved "paused" while the first ran, and restored it after the first had
    enabled the collector again) — a daemon whose watch threads relisted while its cycle built
    then made cyclic garbage that nothing collected. The first block to open saves the
    collector, the last to close restores it, and while any is open the strictest policy of
    the open ones holds."""
    global _saved
    with _lock:
        if not _active:
            _saved = (gc.isenabled(), gc.get_threshold())
        _active.append(young_every)
        _apply()
    try:
        yield
    finally:
        with _lock:
            _active.remove(young_every)
            _apply()


__all__ = ["YOUNG_EVERY", "gc_deferred"]
