"""The circuit breaker: replacements stuck Pending stop all further execution until they run."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from defrag.detect.findings import Finding
from defrag.model.cluster import Cluster


@dataclass(frozen=True, slots=True)
class CircuitState:
    """Closed (execution allowed) or open with the reason and the pods that tripped it."""

    open: bool = False
    reason: str = ""
    since: datetime | None = None
    pods: tuple[str, ...] = ()
    """Controllers (``ns/Kind/name``) or pods whose replacements were stuck Pending."""

    def to_dict(self) -> dict[str, object]:
        return {
            "open": self.open,
            "reason": self.reason,
            "since": self.since.isoformat() if self.since else None,
            "pods": list(self.pods),
        }

    def finding(self) -> Finding:
        return Finding(
            kind="circuit-open",
            subject="cluster",
            severity="critical",
            summary=f"defrag execution stopped: {self.reason}",
            evidence={"stuck": list(self.pods)},
            since=self.since,
            labels={"detector": "executor"},
        )


class CircuitBreaker:
    """Holds the state between cycles. Clears when nothing it tripped on is Pending any more."""

    def __init__(self) -> None:
        self.state = CircuitState()

    def trip(self, stuck: tuple[str, ...], reason: str, now: datetime) -> None:
        if not self.state.open:
            self.state = CircuitState(True, reason, now, stuck)

    def reset(self) -> None:
        self.state = CircuitState()

    def refresh(self, cluster: Cluster) -> CircuitState:
        """Close the breaker when every replacement it waited for has been scheduled."""
        if self.state.open and not pending_of(cluster, self.state.pods):
            self.reset()
        return self.state


def controller_key(namespace: str, owner_kind: str, owner_name: str) -> str:
    return f"{namespace}/{owner_kind}/{owner_name}"


def pending_of(cluster: Cluster, watched: tuple[str, ...]) -> tuple[str, ...]:
    """The watched names (pod ``ns/name``, controller ``ns/Kind/name``) with an unscheduled pod."""
    wanted = set(watched)
    stuck: set[str] = set()
    for pod in cluster.pending_pods():
        if pod.key in wanted:
            stuck.add(pod.key)
        if pod.owner is not None:
            key = controller_key(pod.namespace, pod.owner.kind, pod.owner.name)
            if key in wanted:
                stuck.add(key)
    return tuple(sorted(stuck))
