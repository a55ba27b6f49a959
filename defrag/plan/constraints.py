"""Safety constraints on evictions: each a named check returning a Status with its reason.

Two kinds:

* per pod (:func:`check_pod`): a pod already Terminating, opt-out annotation, bare pods,
  DaemonSet and system-critical pods, minimum age, the priority threshold — a pod that fails
  one never moves;
* per plan (:class:`Ledger`): PodDisruptionBudgets (``disruptionsAllowed`` counted down as
  the plan uses it), evictions per plan / node / namespace. A set of evictions (one pod, or
  a whole gang) is checked and then committed as one.

Every failure reason reads ``<constraint>: <detail>``; :func:`blocked_from` turns it into a
:class:`~defrag.plan.model.Blocked`.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

from defrag.model.cluster import PodDisruptionBudget
from defrag.model.resources import EVICTABLE_ANNOTATION, GANG_LABELS, Pod
from defrag.plan.model import Blocked
from defrag.scoring.framework import Status

SYSTEM_CRITICAL_PRIORITY = 2_000_000_000
SYSTEM_CRITICAL_CLASSES = frozenset({"system-node-critical", "system-cluster-critical"})

TERMINATING = "terminating"
"""Already being deleted (``metadata.deletionTimestamp``): it is going; evicting it again
would only spend budgets."""
OPT_OUT = "opt-out"
BARE_POD = "bare-pod"
DAEMONSET = "daemonset"
SYSTEM_CRITICAL = "system-critical"
MIN_AGE = "min-age"
PRIORITY = "priority"
PDB = "pdb"
PLAN_BUDGET = "budget-plan"
NODE_BUDGET = "budget-node"
NAMESPACE_BUDGET = "budget-namespace"
GANG = "gang"
NO_ROOM = "no-room"
NOT_WORTH = "not-worth-it"
"""The cheapest room would lose more work than the pod's wait so far is worth."""
CONSTRAINT_NAMES = (
    TERMINATING, OPT_OUT, BARE_POD, DAEMONSET, SYSTEM_CRITICAL, MIN_AGE, PRIORITY,
    PDB, PLAN_BUDGET, NODE_BUDGET, NAMESPACE_BUDGET, GANG, NO_ROOM, NOT_WORTH,
)  # fmt: skip


@dataclass(frozen=True, slots=True)
class Constraints:
    """What a plan may touch. ``None`` budgets are unlimited."""

    min_age: timedelta = timedelta(minutes=10)
    """Pods younger than this stay (unknown creation time counts as old enough)."""
    protect_priority: int | None = None
    """Pods with priority at or above this are never evicted (system-critical pods never are)."""
    max_evictions: int | None = 50
    """Evictions per plan (one window)."""
    max_per_node: int | None = None
    max_per_namespace: int | None = None


def check_pod(pod: Pod, constraints: Constraints, now: datetime | None) -> Status:
    """Whether ``pod`` may be evicted at all; the first constraint that forbids it."""
    if pod.deleting_since is not None:
        since = _aware(pod.deleting_since).strftime("%Y-%m-%dT%H:%M:%SZ")
        return Status.fail(f"{TERMINATING}: being deleted since {since}, already going")
    if pod.annotations.get(EVICTABLE_ANNOTATION, "").strip().lower() == "false":
        return Status.fail(f"{OPT_OUT}: annotation {EVICTABLE_ANNOTATION}=false")
    if pod.is_daemonset:
        return Status.fail(f"{DAEMONSET}: owned by DaemonSet {pod.owner.name}")  # type: ignore[union-attr]
    if pod.owner is None or pod.owner.kind == "Node":
        return Status.fail(f"{BARE_POD}: no controller would recreate it")
    if pod.priority >= SYSTEM_CRITICAL_PRIORITY or pod.priority_class in SYSTEM_CRITICAL_CLASSES:
        detail = f"priority {pod.priority} {pod.priority_class}".rstrip()
        return Status.fail(f"{SYSTEM_CRITICAL}: {detail}")
    if constraints.protect_priority is not None and pod.priority >= constraints.protect_priority:
        return Status.fail(
            f"{PRIORITY}: priority {pod.priority} ≥ protected {constraints.protect_priority}"
        )
    if now is not None and pod.created_at is not None:
        age = _aware(now) - _aware(pod.created_at)
        if age < constraints.min_age:
            return Status.fail(
                f"{MIN_AGE}: {_minutes(age)} old, younger than {_minutes(constraints.min_age)}"
            )
    return Status.success()


def gang_of(pod: Pod) -> str | None:
    """The namespace-qualified job a pod belongs to (pods of one gang move together)."""
    if pod.gang_key:
        return pod.gang_key
    for label in GANG_LABELS:
        value = pod.labels.get(label)
        if value:
            return f"{pod.namespace}/{value}"
    return None


class Ledger:
    """The budgets one plan draws down: PDB disruptions and eviction counts.

    ``check`` a set of evictions first, then ``commit`` it; ``snapshot``/``restore`` let a
    planner try a set and take it back.
    """

    def __init__(self, pdbs: Sequence[PodDisruptionBudget], constraints: Constraints) -> None:
        self.pdbs = tuple(pdbs)
        self.constraints = constraints
        self.pdb_left: dict[str, int] = {p.key: max(p.disruptions_allowed, 0) for p in pdbs}
        self.evictions = 0
        self.per_node: Counter[str] = Counter()
        self.per_namespace: Counter[str] = Counter()
        self._pdbs_of: dict[str, tuple[PodDisruptionBudget, ...]] = {}

    def pdbs_of(self, pod: Pod) -> tuple[PodDisruptionBudget, ...]:
        found = self._pdbs_of.get(pod.key)
        if found is None:
            found = tuple(p for p in self.pdbs if p.selects(pod))
            self._pdbs_of[pod.key] = found
        return found

    def check(self, evictions: Iterable[tuple[Pod, str]]) -> tuple[Status, str | None]:
        """Whether evicting every (pod, node) pair fits the budgets; the pod that breaks one."""
        c = self.constraints
        pdb_use: Counter[str] = Counter()
        node_use: Counter[str] = Counter()
        ns_use: Counter[str] = Counter()
        for count, (pod, node) in enumerate(evictions, start=1):
            if c.max_evictions is not None and self.evictions + count > c.max_evictions:
                return Status.fail(
                    f"{PLAN_BUDGET}: at most {c.max_evictions} evictions per plan"
                ), pod.key
            node_use[node] += 1
            if c.max_per_node is not None and self.per_node[node] + node_use[node] > c.max_per_node:
                return Status.fail(
                    f"{NODE_BUDGET}: at most {c.max_per_node} evictions on node {node}"
                ), pod.key
            ns_use[pod.namespace] += 1
            if (
                c.max_per_namespace is not None
                and self.per_namespace[pod.namespace] + ns_use[pod.namespace] > c.max_per_namespace
            ):
                return Status.fail(
                    f"{NAMESPACE_BUDGET}: at most {c.max_per_namespace} evictions in namespace "
                    f"{pod.namespace}"
                ), pod.key
            for pdb in self.pdbs_of(pod):
                pdb_use[pdb.key] += 1
                if pdb_use[pdb.key] > self.pdb_left[pdb.key]:
                    left = self.pdb_left[pdb.key]
                    return Status.fail(
                        f"{PDB}: PodDisruptionBudget {pdb.key} allows {left} more disruption(s)"
                    ), pod.key
        return Status.success(), None

    def commit(self, evictions: Iterable[tuple[Pod, str]]) -> None:
        for pod, node in evictions:
            self.evictions += 1
            self.per_node[node] += 1
            self.per_namespace[pod.namespace] += 1
            for pdb in self.pdbs_of(pod):
                self.pdb_left[pdb.key] -= 1

    def snapshot(self) -> tuple[dict[str, int], int, Counter[str], Counter[str]]:
        return dict(self.pdb_left), self.evictions, self.per_node.copy(), self.per_namespace.copy()

    def restore(self, state: tuple[dict[str, int], int, Counter[str], Counter[str]]) -> None:
        self.pdb_left = dict(state[0])
        self.evictions = state[1]
        self.per_node = state[2].copy()
        self.per_namespace = state[3].copy()

    def remaining(self) -> int | None:
        if self.constraints.max_evictions is None:
            return None
        return self.constraints.max_evictions - self.evictions


def blocked_from(pod: str, status: Status) -> Blocked:
    """A Blocked entry from a failed check whose reason reads ``<constraint>: <detail>``."""
    reason = status.reasons[0] if status.reasons else "unknown"
    name, _, detail = reason.partition(": ")
    return Blocked(pod=pod, constraint=name, detail=detail)


def _aware(moment: datetime) -> datetime:
    return moment if moment.tzinfo else moment.replace(tzinfo=UTC)


def _minutes(delta: timedelta) -> str:
    return f"{delta.total_seconds() / 60:.0f}m"
