"""The evictions the daemon remembers, so that no workload is evicted twice within a while.

A pod evicted to make room comes back as a new pod: with the same name under a StatefulSet,
with a new one under a Job or a training operator — the same run, restarted again. So an
eviction is remembered under the pod's ``namespace/name`` and, for any controller but a
ReplicaSet (whose replacement is another replica, not the evicted one again), under its
controller's ``namespace/Kind/name``. A victim either key names within the guard is refused
with the constraint :data:`RECENTLY_EVICTED`.

The memory is the daemon's own (its evictions as they went out) and lasts as long as the
process; a restarted daemon starts with none — the window budgets still bound what it evicts.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from types import MappingProxyType

from defrag.model.resources import Pod
from defrag.model.status import Status
from defrag.model.utc import utc
from defrag.plan.owners import owner_key

RECENTLY_EVICTED = "recently-evicted"
"""Evicted (or its workload evicted) within ``planner.evict_again_after_s``."""

DEFAULT_GUARD = timedelta(days=1)

FRESH_REPLICA_KINDS = frozenset({"ReplicaSet"})
"""Controllers whose replacement pod is another replica, not the evicted pod run again."""


def eviction_keys(pod: Pod) -> tuple[str, ...]:
    """The keys an eviction of ``pod`` is remembered under."""
    owner = owner_key(pod)
    if owner is None or pod.owner is None or pod.owner.kind in FRESH_REPLICA_KINDS:
        return (pod.key,)
    return (pod.key, owner)


@dataclass(frozen=True, slots=True)
class RecentEvictions:
    """Key (:func:`eviction_keys`) → when it was last evicted."""

    at: Mapping[str, datetime] = field(default_factory=lambda: MappingProxyType({}), hash=False)

    def record(self, pods: Iterable[Pod], now: datetime) -> RecentEvictions:
        """These evictions added, at ``now``."""
        merged = dict(self.at)
        for pod in pods:
            for key in eviction_keys(pod):
                merged[key] = utc(now)
        return RecentEvictions(MappingProxyType(merged))

    def pruned(self, now: datetime, guard: timedelta) -> RecentEvictions:
        """Only what is still within ``guard`` of ``now``."""
        cut = utc(now) - guard
        kept = {k: t for k, t in self.at.items() if t > cut}
        return self if len(kept) == len(self.at) else RecentEvictions(MappingProxyType(kept))

    def check(self, pod: Pod, now: datetime | None, guard: timedelta | None) -> Status:
        """Whether ``pod`` may be evicted again at ``now``: not when it (or its workload) was
        evicted less than ``guard`` ago."""
        if guard is None or now is None or not self.at:
            return Status.success()
        for key in eviction_keys(pod):
            when = self.at.get(key)
            if when is not None and utc(now) - when < guard:
                what = "this pod" if key == pod.key else key
                return Status.fail(
                    f"{RECENTLY_EVICTED}: {what} was evicted at "
                    f"{when.strftime('%Y-%m-%d %H:%M')} UTC, within "
                    f"planner.evict_again_after_s ({guard.total_seconds() / 3600:g} h)"
                )
        return Status.success()

    def __len__(self) -> int:
        return len(self.at)


NONE = RecentEvictions()

__all__ = [
    "DEFAULT_GUARD",
    "FRESH_REPLICA_KINDS",
    "NONE",
    "RECENTLY_EVICTED",
    "RecentEvictions",
    "eviction_keys",
]
