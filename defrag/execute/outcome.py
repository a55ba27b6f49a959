"""What execution did: one outcome per planned step, and the run's summary."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Literal

from defrag.detect.findings import Finding

StepResult = Literal["planned", "evicted", "blocked", "gone", "failed", "skipped"]
"""planned: dry run; evicted/blocked (429)/gone (404, or already Terminating: not evicted, no
budget spent)/failed: what the API said; skipped: not
sent (budget, window, circuit breaker, stop, taint failure), with the reason."""


@dataclass(frozen=True, slots=True)
class StepOutcome:
    pod: str
    source: str
    target: str | None
    kind: str
    result: StepResult
    reason: str = ""
    checkpoint: str = ""
    """The checkpoint handshake's result (:mod:`defrag.execute.checkpoint`): checkpointed,
    deadline-passed, gone, request-failed, would-ask (dry run); "" when the pod was not asked."""
    checkpoint_detail: str = ""

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "pod": self.pod,
            "from": self.source,
            "to": self.target,
            "kind": self.kind,
            "result": self.result,
            "reason": self.reason,
        }
        if self.checkpoint:
            out["checkpoint"] = self.checkpoint
            out["checkpoint_detail"] = self.checkpoint_detail
        return out


@dataclass(frozen=True, slots=True)
class Execution:
    """One plan carried out, or rehearsed (``rehearsal``: the executor's mode is dry run)."""

    plan_id: str
    rehearsal: bool
    window: str
    started: datetime
    finished: datetime
    outcomes: tuple[StepOutcome, ...] = ()
    stuck: tuple[str, ...] = ()
    """Controllers or pods whose replacements stayed Pending past the timeout."""
    stopped: bool = False
    problems: tuple[str, ...] = ()
    findings: tuple[Finding, ...] = field(default=(), hash=False)

    @property
    def counts(self) -> dict[str, int]:
        return dict(sorted(Counter(o.result for o in self.outcomes).items()))

    @property
    def evicted(self) -> tuple[StepOutcome, ...]:
        return tuple(o for o in self.outcomes if o.result == "evicted")

    def to_dict(self) -> dict[str, Any]:
        return {
            "plan_id": self.plan_id,
            "rehearsal": self.rehearsal,
            "window": self.window,
            "started": self.started.isoformat(),
            "finished": self.finished.isoformat(),
            "counts": self.counts,
            "steps": [o.to_dict() for o in self.outcomes],
            "stuck": list(self.stuck),
            "stopped": self.stopped,
            "problems": list(self.problems),
        }


@dataclass(frozen=True, slots=True)
class ReconcileOutcome:
    """What start-up found on one node carrying a journal, the drain taint or a reservation,
    and what it did (``released``: the node carried only a reservation, now removed; ``kept``:
    only a reservation whose room is made and still waits for its pod;
    ``deferred``: another replica that still holds the Lease owns the drain, left alone)."""

    node: str
    plan_id: str
    action: Literal["finished", "rolled-back", "released", "kept", "deferred"]
    remaining: tuple[str, ...] = ()
    """Journal pods still on the node (their evictions are abandoned, never resumed blindly)."""
    pending: tuple[str, ...] = ()
    problem: str = ""
    reservation: str = ""
    """The pod whose reservation (``defrag.io/reserved-for``) on the node was removed (or kept)."""
    owner: str = ""
    """``deferred``: the replica (and Lease generation) still holding the drain."""

    def to_dict(self) -> dict[str, Any]:
        return {
            "node": self.node,
            "plan_id": self.plan_id,
            "action": self.action,
            "remaining": list(self.remaining),
            "pending": list(self.pending),
            "problem": self.problem,
            "reservation": self.reservation,
            "owner": self.owner,
        }
