"""The checkpoint handshake: a workload that can save its state is asked to, before its eviction.

A workload declares support on its pod template (so on every pod it makes)::

    defrag.io/checkpoint: "supported"
    defrag.io/checkpoint-max-wait: "5m"      # optional; a duration or bare seconds

Before evicting such a pod the executor writes, on the pod::

    defrag.io/checkpoint-requested: <RFC 3339 time of the request, whole seconds, UTC>
    defrag.io/checkpoint-deadline:  <RFC 3339 time after which it evicts anyway>

with a ``DefragCheckpointRequested`` Event, then reads the cluster every poll until the pod's
``defrag.io/last-checkpoint`` is at or after the request (``checkpointed``), the pod is gone or
Terminating (``gone``: not evicted), or the deadline passes (``deadline-passed``: evicted, as it
would have been without the handshake). The deadline is the earliest of the pod's wait (its own,
capped by the daemon's ``checkpoint_max_wait_s``; ``checkpoint_wait_s`` when it names none), the
window's end and the cycle's deadline less one replacement wait. A request that cannot be
written (``request-failed``) does not hold the eviction up. Pods without the annotation are
never asked: their eviction is exactly what it was. Dry run asks nothing and reports
``would-ask``.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Literal

from defrag.model.cluster import Cluster
from defrag.model.resources import Pod
from defrag.model.units import DURATION_FORM, duration_seconds
from defrag.model.utc import utc
from defrag.plan.cost import last_checkpoint

CHECKPOINT_MAX_WAIT_ANNOTATION = "defrag.io/checkpoint-max-wait"
CHECKPOINT_REQUESTED_ANNOTATION = "defrag.io/checkpoint-requested"
CHECKPOINT_DEADLINE_ANNOTATION = "defrag.io/checkpoint-deadline"
REQUEST_ANNOTATIONS = (CHECKPOINT_REQUESTED_ANNOTATION, CHECKPOINT_DEADLINE_ANNOTATION)

CheckpointResult = Literal["checkpointed", "deadline-passed", "gone", "request-failed", "would-ask"]
"""How the handshake ended for one pod (a step's ``checkpoint``; "" when the pod was not asked)."""
CHECKPOINT_RESULTS: tuple[CheckpointResult, ...] = (
    "checkpointed",
    "deadline-passed",
    "gone",
    "request-failed",
    "would-ask",
)


@dataclass(frozen=True, slots=True)
class Wait:
    """How long one pod may be waited for, and a note when its own annotation was not taken."""

    seconds: float
    note: str = ""


def pod_wait(pod: Pod, default_s: float, cap_s: float) -> Wait:
    """The wait ``pod`` asks for (``defrag.io/checkpoint-max-wait``), capped at ``cap_s``;
    ``default_s`` when it names none or an unreadable one (with a note saying so)."""
    text = pod.annotations.get(CHECKPOINT_MAX_WAIT_ANNOTATION, "").strip()
    default = min(default_s, cap_s)
    if not text:
        return Wait(default)
    try:
        seconds = float(text) if _is_number(text) else duration_seconds(text)
    except ValueError:
        return Wait(
            default,
            f"{CHECKPOINT_MAX_WAIT_ANNOTATION} {text!r} unreadable (expected seconds or "
            f"{DURATION_FORM}); waiting {default:g} s",
        )
    if seconds < 0:
        return Wait(default, f"{CHECKPOINT_MAX_WAIT_ANNOTATION} {text!r} is negative")
    if seconds > cap_s:
        return Wait(cap_s, f"{CHECKPOINT_MAX_WAIT_ANNOTATION} {text!r} capped at {cap_s:g} s")
    return Wait(seconds)


def _is_number(text: str) -> bool:
    try:
        float(text)
    except ValueError:
        return False
    return True


@dataclass(frozen=True, slots=True)
class CheckpointRequest:
    """``pod`` (with ``uid``) asked at ``requested`` to checkpoint by ``deadline`` (set by
    ``limit``: what made the deadline that early)."""

    pod: str
    uid: str
    requested: datetime
    deadline: datetime
    limit: str

    @classmethod
    def at(cls, pod: Pod, now: datetime, deadline: datetime, limit: str) -> CheckpointRequest:
        # Whole seconds: a workload that stamps its checkpoint to the second, within the
        # request's second, is still seen as newer.
        requested = utc(now).replace(microsecond=0)
        return cls(pod.key, pod.uid, requested, max(utc(deadline), requested), limit)

    def annotations(self) -> dict[str, str | None]:
        return {
            CHECKPOINT_REQUESTED_ANNOTATION: _rfc3339(self.requested),
            CHECKPOINT_DEADLINE_ANNOTATION: _rfc3339(self.deadline),
        }

    def verdict(self, cluster: Cluster, now: datetime) -> tuple[CheckpointResult, str] | None:
        """How the handshake ends on ``cluster`` at ``now`` (result, why), or None to wait on."""
        pod = cluster.pods.get(self.pod)
        if pod is None or (self.uid and pod.uid and pod.uid != self.uid):
            return "gone", "gone while its checkpoint was awaited"
        if pod.terminating:
            return "gone", "Terminating while its checkpoint was awaited"
        last = last_checkpoint(pod)
        if last is not None and utc(last) >= self.requested:
            return "checkpointed", (
                f"checkpointed at {_rfc3339(utc(last))}, "
                f"{(utc(last) - self.requested).total_seconds():g} s after the request"
            )
        if utc(now) >= self.deadline:
            return "deadline-passed", (
                f"no checkpoint newer than {_rfc3339(self.requested)} by "
                f"{_rfc3339(self.deadline)} ({self.limit}); evicted anyway"
            )
        return None


def withdrawn() -> dict[str, str | None]:
    """The annotation patch that removes a request (a pod that was not evicted after all)."""
    return dict.fromkeys(REQUEST_ANNOTATIONS)


def earliest(now: datetime, limits: list[tuple[datetime | None, str]]) -> tuple[datetime, str]:
    """The earliest of the named limits (None: no such limit), never before ``now``."""
    known = [(utc(at), why) for at, why in limits if at is not None]
    at, why = min(known, key=lambda item: item[0]) if known else (utc(now), "no time to wait")
    return max(at, utc(now)), why


def seconds_from(now: datetime, seconds: float) -> datetime:
    return utc(now) + timedelta(seconds=max(0.0, seconds))


def _rfc3339(moment: datetime) -> str:
    return utc(moment).strftime("%Y-%m-%dT%H:%M:%SZ")
