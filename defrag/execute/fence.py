"""Fencing: the executor writes only while this replica still holds the leadership it acted on.

Leadership is elected once per cycle, but one execution can last many minutes (evictions,
replacement waits). A :class:`Fence` is asked before *every* write — taint, journal and
reservation annotations, each eviction — and an execution that no longer owns its plan stops
there (:class:`LostLeadership`). The drain journal records the :class:`Tenure` that wrote it (the
holder identity and the Lease's ``leaseTransitions`` when it was acquired), so another replica's
reconcile can tell a drain whose owner still holds the Lease (left alone) from a crashed or
deposed owner's (finished or rolled back).

The Kubernetes adapter's :class:`~defrag.adapters.kube.LeaseElector` is a fence; a single
replica (or the simulated cluster) uses :class:`NoFence`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol, runtime_checkable


@dataclass(frozen=True, slots=True)
class Tenure:
    """One holding of the Lease: who, and which acquisition (``leaseTransitions`` then)."""

    identity: str = ""
    generation: int = 0

    def __str__(self) -> str:
        return f"{self.identity or '?'} (lease generation {self.generation})"


@runtime_checkable
class Fence(Protocol):
    def still_leader(self) -> bool:
        """Whether this replica holds the Lease right now (False when that cannot be told)."""
        ...

    def tenure(self) -> Tenure:
        """The holding this replica's writes are made under."""
        ...

    def holds(self, tenure: Tenure) -> bool:
        """Whether ``tenure`` (another replica's, read from a journal) still holds the Lease
        unexpired; True when that cannot be told (never undo a drain on a guess)."""
        ...


class NoFence:
    """No election: always the leader, and no other owner can hold anything."""

    def still_leader(self) -> bool:
        return True

    def tenure(self) -> Tenure:
        return Tenure()

    def holds(self, tenure: Tenure) -> bool:
        return False


class LostLeadership(RuntimeError):
    """Raised before a write the executor no longer owns."""
