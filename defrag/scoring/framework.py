"""The scheduling framework's value types: placements, verdicts, policies (checks answer with
:class:`defrag.model.status.Status`)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Protocol, runtime_checkable

from defrag.model.arrays import BoolArray, FloatArray, NodeArrays
from defrag.model.resources import Pod


@dataclass(frozen=True, slots=True)
class Placement:
    """Where the scheduler puts a pod: the node (and its row in NodeArrays), GPU slots, score."""

    pod: str
    node: str
    row: int
    gpus: tuple[int, ...]
    score: int


@dataclass(frozen=True, slots=True)
class Unschedulable:
    """No node fits; ``reasons`` counts the nodes each filter rejected."""

    pod: str
    reasons: Mapping[str, int] = field(default_factory=dict, hash=False)
    nodes: int = 0

    @property
    def summary(self) -> str:
        parts = ", ".join(f"{n} {reason}" for reason, n in sorted(self.reasons.items()))
        return f"0/{self.nodes} nodes fit" + (f": {parts}" if parts else "")


@dataclass(frozen=True, slots=True)
class NodeVerdict:
    """One node's answer for one pod: a score, or the reasons it was filtered out."""

    node: str
    score: int | None
    reasons: tuple[str, ...] = ()


class Policy(Protocol):
    """A score function over every node at once, and an in-node GPU choice."""

    name: str

    def score(self, pod: Pod, arrays: NodeArrays, feasible: BoolArray) -> FloatArray:
        """Scores in 0..100 for every row (values where ``feasible`` is False are ignored)."""
        ...

    def choose_gpus(self, pod: Pod, arrays: NodeArrays, row: int) -> tuple[int, ...]:
        """The GPU slots the pod takes on the chosen node."""
        ...


@runtime_checkable
class TieBreak(Protocol):
    """A policy that says which of the feasible nodes sharing the best score the scheduler
    picks (:func:`~defrag.scoring.scheduler.select`); without it, the first (rows are sorted
    by name)."""

    def tie_order(self, pod: Pod, arrays: NodeArrays) -> FloatArray:
        """One value per row: among rows of equal best score the highest wins, the first of
        equal values."""
        ...


@runtime_checkable
class FreshScores(Protocol):
    """A policy the scheduler may score in one pass (:func:`~defrag.scoring.scheduler.schedule`):
    its scores come in a fresh array the caller may overwrite, with no NaN, and none below 0 on
    a row the filters pass."""

    def fresh_scores(self, pod: Pod, arrays: NodeArrays) -> FloatArray | None:
        """:meth:`Policy.score` of every row the filters pass, in a new array with no NaN,
        every such row's value ≥ 0 (other rows: any number); None where the policy cannot
        promise that for these nodes (the scheduler then scores the long way)."""
        ...
