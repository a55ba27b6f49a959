"""Which pods differ between two snapshots' pod mappings, found once for every part that keeps
something from the last snapshot.

Pods are frozen: the same object under a key is the same pod, so the keys whose object is not
the very one of the last mapping (added, removed or replaced) are every change. Found by a walk
over the keys, compared in C (``map``/``compress``, no Python frame per pod); the parts of one
cycle that bring something kept up to its snapshot (the planner's seating, the spreading rule's
placements) ask of the same two mappings, so the last answer is kept for them (the mappings held
and compared by identity: a cluster's pods never change in place).
"""

from __future__ import annotations

import operator
from collections.abc import Mapping
from itertools import compress

from defrag.model.carried import KeptFor
from defrag.model.resources import Pod


def changed_keys(old: Mapping[str, Pod], new: Mapping[str, Pod], limit: int) -> list[str] | None:
    """The keys whose pod differs between ``old`` and ``new`` (added or replaced, in ``new``'s
    order, then removed), or None when there are more than ``limit`` of them."""
    if old is new:
        return []
    found = _kept.get((old, new), lambda: walked(old, new))
    return None if len(found) > limit else list(found)


def walked(old: Mapping[str, Pod], new: Mapping[str, Pod]) -> list[str]:
    """The keys whose pod differs (as :func:`changed_keys`), walked now: for an asker whose
    mappings no other part asks about (nothing kept, nothing evicted)."""
    changed = list(compress(new.keys(), map(operator.is_not, new.values(), map(old.get, new))))
    if len(old) + sum(1 for k in changed if k not in old) != len(new):
        changed += [k for k in old.keys() - new.keys()]
    return changed


_kept: KeptFor[list[str]] = KeptFor()


__all__ = ["changed_keys", "walked"]
