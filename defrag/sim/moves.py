"""A migration the simulator applies: what a hook (defrag's planner, a peer) decides."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from defrag.plan.model import Step


@dataclass(frozen=True, slots=True)
class Move:
    """A migration decided by a hook: pod ``pod_id`` leaves ``source_row`` for ``gpus`` of
    ``target_row`` (``gpus`` is empty for a pod that asks no GPU).

    ``target_row`` = :data:`REQUEUE` evicts the pod without a new node: it goes back to the
    waiting queue (a preemption, or a descheduler eviction the scheduler places later).
    ``for_pod`` names the pending pod the eviction frees ``source_row`` for: the timeline
    holds that node for it (``defrag.io/reserved-for``) until it starts or the hold times out.
    """

    pod_id: str
    source_row: int
    target_row: int
    gpus: tuple[int, ...]
    for_pod: str | None = None


REQUEUE = -1
"""``Move.target_row`` of an eviction without a new node."""


def plan_moves(index: Mapping[str, int], steps: Sequence[Step]) -> tuple[Move, ...]:
    """A plan's evictions as moves (``index``: node name → row): a migration to its target, a
    preemption to the queue."""
    return tuple(
        Move(
            s.pod,
            index[s.source],
            index[s.target] if s.kind == "migrate" and s.target is not None else REQUEUE,
            s.gpus if s.kind == "migrate" else (),
            s.for_pod,
        )
        for s in steps
        if s.kind in ("migrate", "preempt")
    )


__all__ = ["REQUEUE", "Move", "plan_moves"]
