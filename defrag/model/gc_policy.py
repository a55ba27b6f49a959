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
from collections.abc import Iterator
from contextlib import contextmanager

YOUNG_EVERY = 100_000
"""Allocations between two young-generation collections during a timeline run (Python's
default: 700). At the default the collector took ~20% of a 48 h run (10.6 → 8.4 s median on a
quiet machine, the same result digest)."""


@contextmanager
def gc_deferred(young_every: int | None = None) -> Iterator[None]:
    """Collect the young generation at most every ``young_every`` allocations (never lower
    than the threshold already set), or not at all when None; restored after the block."""
    enabled, thresholds = gc.isenabled(), gc.get_threshold()
    if young_every is None:
        gc.disable()
    else:
        gc.set_threshold(max(young_every, thresholds[0]), *thresholds[1:])
    try:
        yield
    finally:
        gc.set_threshold(*thresholds)
        if enabled:
            gc.enable()
        else:
            gc.disable()


__all__ = ["YOUNG_EVERY", "gc_deferred"]
