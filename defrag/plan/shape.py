"""A pod's shape: the pod as the scheduler's filters and scores read it, its identity left out.

Pending pods come in few shapes (a job's replicas, a job array, a gang share one template):
asking the scheduler's questions — could any node ever hold it, does one fit now, why not —
once per shape instead of once per pod gives the same answers, because nothing those answers
read tells two pods of one shape apart. :func:`shape_of` is that key.

What is left out is what the filters, the score functions and the GPU choice never read: the
pod's name and namespace (only the answers' labels carry them), its uid, labels, annotations,
owner, gang, priority and class, QoS and timestamps. Every other field is in the key, so a
field added to :class:`~defrag.model.resources.Pod` later counts as shape until shown
otherwise. A policy that draws its scores from a generator (``random``) answers a second time
differently, and the draws it makes are part of what the planner sees next: for it nothing
is reused (:func:`repeatable`).
"""

from __future__ import annotations

from collections.abc import Hashable, Mapping
from dataclasses import fields
from operator import attrgetter

from defrag.model.resources import Pod
from defrag.scoring.framework import Policy
from defrag.scoring.policies.random_policy import RandomPolicy

IDENTITY = frozenset(
    {
        "name",
        "namespace",
        "uid",
        "labels",
        "annotations",
        "owner",
        "gang",
        "priority",
        "priority_class",
        "qos",
        "created_at",
        "pending_since",
        "pending_reason",
        "scheduled_at",
    }
)
"""The fields of a pod no scheduling answer reads."""

_HASHED = tuple(f.name for f in fields(Pod) if f.name not in IDENTITY and f.hash is not False)
_MAPPINGS = tuple(f.name for f in fields(Pod) if f.name not in IDENTITY and f.hash is False)
_read_hashed = attrgetter(*_HASHED)


def shape_of(pod: Pod) -> Hashable:
    """The pod without its identity (:data:`IDENTITY`): equal for two pods every scheduling
    answer treats alike. Mapping fields (the node selector) count by their items."""
    maps: tuple[tuple[tuple[str, str], ...], ...] = tuple(
        tuple(sorted(_mapping(pod, name).items())) for name in _MAPPINGS
    )
    return (_read_hashed(pod), maps)


def _mapping(pod: Pod, name: str) -> Mapping[str, str]:
    value: Mapping[str, str] = getattr(pod, name)
    return value


def repeatable(policy: Policy) -> bool:
    """Whether ``policy`` answers the same question the same way twice (no draws of a
    generator): only then may an answer be reused for another pod of the same shape."""
    return not isinstance(policy, RandomPolicy)


__all__ = ["IDENTITY", "repeatable", "shape_of"]
