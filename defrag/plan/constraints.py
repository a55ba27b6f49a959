"""Safety constraints on evictions: each a named check returning a Status with its reason.

Two kinds:

* per pod (:func:`check_pod`): a pod already Terminating, opt-out annotation, pods no
  controller would recreate (:mod:`defrag.plan.owners`), DaemonSet and system-critical pods,
  minimum age, and the operator's eviction filters (:func:`check_filters`: namespaces, label
  selector, priority threshold) — a pod that fails one never moves;
* per plan (:class:`Ledger`): PodDisruptionBudgets (``disruptionsAllowed`` counted down as
  the plan uses it), a looked-up Job's retries (spent like a disruption budget), the
  :class:`~defrag.plan.config.EvictionBudget` (per plan / node / namespace). A set of
  evictions (one pod, or a whole gang) is checked and then committed as one.

Every failure reason reads ``<constraint>: <detail>``; :func:`blocked_from` turns it into a
:class:`~defrag.plan.model.Blocked`.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import replace
from datetime import datetime, timedelta

from defrag.model.cluster import PodDisruptionBudget
from defrag.model.resources import EVICTABLE_ANNOTATION, GANG_LABELS, Pod
from defrag.model.status import Status
from defrag.model.utc import utc
from defrag.plan.config import Constraints
from defrag.plan.model import Blocked
from defrag.plan.owners import (
    BARE_POD,
    JOB_RETRIES,
    OwnerFacts,
    describe_retries,
    owner_key,
    recreation,
    retry_budget,
    retry_key,
)
from defrag.plan.recent import RECENTLY_EVICTED
from defrag.plan.spend import NAMESPACE_BUDGET, NODE_BUDGET, WINDOW_BUDGET, BudgetLedger

SYSTEM_CRITICAL_PRIORITY = 2_000_000_000
SYSTEM_CRITICAL_CLASSES = frozenset({"system-node-critical", "system-cluster-critical"})

TERMINATING = "terminating"
"""Already being deleted (``metadata.deletionTimestamp``): it is going; evicting it again
would only spend budgets."""
OPT_OUT = "opt-out"
DAEMONSET = "daemonset"
SYSTEM_CRITICAL = "system-critical"
MIN_AGE = "min-age"
PRIORITY = "priority"
"""At or above the eviction filter ``planner.evict_priority_threshold`` (``--protect-priority``), or
(make-room) not below the pending pod where it could only be preempted."""
EVICT_NAMESPACE = "evict-namespace"
"""The eviction filters ``planner.evict_namespaces_include`` / ``…_exclude``."""
EVICT_LABELS = "evict-label-selector"
"""The eviction filter ``planner.evict_label_selector``."""
PDB = "pdb"
PLAN_BUDGET = WINDOW_BUDGET
"""A plan spends what is left of its window's eviction budget (:mod:`defrag.plan.spend`)."""
GANG = "gang"
NO_ROOM = "no-room"
NOT_WORTH = "not-worth-it"
"""The cheapest room costs more lost work and restarts than it is worth (the wait it saves,
or the pod's wait so far; :class:`~defrag.plan.config.RoomValue`)."""
MOVED = "moved"
"""A pod this plan has already moved: its replacement is a new pod, not this plan's to evict."""
SPARED = "spared"
"""A multi-GPU job that does not answer the checkpoint handshake, kept in place for a multi-GPU
pod of equal or lower priority (:mod:`defrag.plan.spare`)."""
CONSTRAINT_NAMES = (
    TERMINATING, OPT_OUT, BARE_POD, DAEMONSET, SYSTEM_CRITICAL, MIN_AGE, PRIORITY,
    EVICT_NAMESPACE, EVICT_LABELS, PDB, JOB_RETRIES, PLAN_BUDGET, NODE_BUDGET,
    NAMESPACE_BUDGET, GANG, NO_ROOM, NOT_WORTH, SPARED, MOVED, RECENTLY_EVICTED,
)  # fmt: skip


def check_pod(
    pod: Pod,
    constraints: Constraints,
    now: datetime | None,
    owners: Mapping[str, OwnerFacts] | None = None,
) -> Status:
    """Whether ``pod`` may be evicted at all; the first constraint that forbids it.

    ``owners``: the controlling owners looked up (by :func:`~defrag.plan.owners.owner_key`);
    a pod whose owner is not among them is judged by its owner's kind alone — given (even
    empty) while the owners are being read (:func:`~defrag.plan.planner.plan_with_owners`,
    which reads every victim before its plan stands), so a kind trusted only once read may
    be chosen and then read; None when nothing will be read, so such a kind stays."""
    if pod.deleting_since is not None:
        since = utc(pod.deleting_since).strftime("%Y-%m-%dT%H:%M:%SZ")
        return Status.fail(f"{TERMINATING}: being deleted since {since}, already going")
    if pod.annotations.get(EVICTABLE_ANNOTATION, "").strip().lower() == "false":
        return Status.fail(f"{OPT_OUT}: annotation {EVICTABLE_ANNOTATION}=false")
    if pod.is_daemonset:
        return Status.fail(f"{DAEMONSET}: owned by DaemonSet {pod.owner.name}")  # type: ignore[union-attr]
    key = owner_key(pod)
    recreated = recreation(
        pod,
        owners.get(key) if owners and key else None,
        constraints.owner_kinds,
        reading=owners is not None,
    )
    if not recreated.ok:
        return recreated
    if pod.priority >= SYSTEM_CRITICAL_PRIORITY or pod.priority_class in SYSTEM_CRITICAL_CLASSES:
        detail = f"priority {pod.priority} {pod.priority_class}".rstrip()
        return Status.fail(f"{SYSTEM_CRITICAL}: {detail}")
    filtered = check_filters(pod, constraints)
    if not filtered.ok:
        return filtered
    if now is not None and pod.created_at is not None:
        age = utc(now) - utc(pod.created_at)
        if age < constraints.min_age:
            return Status.fail(
                f"{MIN_AGE}: {_minutes(age)} old, younger than {_minutes(constraints.min_age)}"
            )
    return Status.success()


def check_filters(pod: Pod, constraints: Constraints) -> Status:
    """The operator's eviction filters (descheduler's DefaultEvictor arguments), each named in
    its reason: namespaces included or excluded, the label selector, the priority threshold.
    The simulator, which skips the checks that need owners and ages, still applies these."""
    c = constraints
    if c.namespaces_include and pod.namespace not in c.namespaces_include:
        return Status.fail(
            f"{EVICT_NAMESPACE}: namespace {pod.namespace} is not in "
            f"planner.evict_namespaces_include ({', '.join(sorted(c.namespaces_include))})"
        )
    if pod.namespace in c.namespaces_exclude:
        return Status.fail(
            f"{EVICT_NAMESPACE}: namespace {pod.namespace} is in planner.evict_namespaces_exclude"
        )
    if c.label_selector is not None and not c.label_selector.matches(pod.labels):
        return Status.fail(
            f"{EVICT_LABELS}: labels do not match planner.evict_label_selector "
            f"{str(c.label_selector)!r}"
        )
    if c.priority_threshold is not None and pod.priority >= c.priority_threshold:
        return Status.fail(
            f"{PRIORITY}: priority {pod.priority} ≥ planner.evict_priority_threshold "
            f"{c.priority_threshold}"
        )
    return Status.success()


def gang_of(pod: Pod) -> str | None:
    """The namespace-qualified job a pod belongs to (pods of one gang move together)."""
    if pod.gang:
        return pod.gang_key
    labels = pod.labels
    if labels:
        for label in GANG_LABELS:
            value = labels.get(label)
            if value:
                return f"{pod.namespace}/{value}"
    return None


LedgerState = tuple[dict[str, int], tuple[int, Counter[str], Counter[str]], Counter[str]]


class Ledger:
    """The budgets one plan draws down: PDB disruptions and eviction counts.

    ``check`` a set of evictions first, then ``commit`` it; ``snapshot``/``restore`` let a
    planner try a set and take it back.
    """

    def __init__(
        self,
        pdbs: Sequence[PodDisruptionBudget],
        constraints: Constraints,
        owners: Mapping[str, OwnerFacts] | None = None,
        spent: BudgetLedger | None = None,
    ) -> None:
        self.pdbs = tuple(pdbs)
        self.constraints = constraints
        self.owners: Mapping[str, OwnerFacts] | None = owners
        """The owners read so far; None when nothing will be read (:func:`check_pod`)."""
        self.pdb_left: dict[str, int] = {p.key: max(p.disruptions_allowed, 0) for p in pdbs}
        self.retries_used: Counter[str] = Counter()
        """Evictions this plan spends on each looked-up Job (or Indexed Job's index)."""
        self.count = (
            BudgetLedger(constraints.budget) if spent is None else _within(spent, constraints)
        )
        """The evictions counted against the budget: the window's spend so far (``spent``),
        then this plan's."""
        self._pdbs_of: dict[str, tuple[PodDisruptionBudget, ...]] = {}

    def pdbs_of(self, pod: Pod) -> tuple[PodDisruptionBudget, ...]:
        found = self._pdbs_of.get(pod.key)
        if found is None:
            found = tuple(p for p in self.pdbs if p.selects(pod))
            self._pdbs_of[pod.key] = found
        return found

    def check(self, evictions: Iterable[tuple[Pod, str]]) -> tuple[Status, str | None]:
        """Whether evicting every (pod, node) pair fits the budgets; the pod that breaks one."""
        pairs = list(evictions)
        status, broken = self.count.check([(pod.namespace, node) for pod, node in pairs])
        if broken is not None:
            return status, pairs[broken][0].key
        pdb_use: Counter[str] = Counter()
        retry_use: Counter[str] = Counter()
        for pod, _ in pairs:
            for pdb in self.pdbs_of(pod):
                pdb_use[pdb.key] += 1
                if pdb_use[pdb.key] > self.pdb_left[pdb.key]:
                    left = self.pdb_left[pdb.key]
                    return Status.fail(
                        f"{PDB}: PodDisruptionBudget {pdb.key} allows {left} more disruption(s)"
                    ), pod.key
            retries = self._retries(pod)
            if retries is not None:
                key, limit = retries
                retry_use[key] += 1
                if self.retries_used[key] + retry_use[key] > limit:
                    facts = (self.owners or {})[owner_key(pod) or ""]
                    left = max(limit - self.retries_used[key], 0)
                    return Status.fail(
                        f"{JOB_RETRIES}: {describe_retries(pod, facts, left)}"
                    ), pod.key
        return Status.success(), None

    def _retries(self, pod: Pod) -> tuple[str, int] | None:
        """(what the retries are counted under, how many are left) for a looked-up Job's pod."""
        if not self.owners:
            return None
        facts = self.owners.get(owner_key(pod) or "")
        limit = retry_budget(pod, facts)
        key = retry_key(pod, facts)
        return None if limit is None or key is None else (key, limit)

    def commit(self, evictions: Iterable[tuple[Pod, str]]) -> None:
        pairs = list(evictions)
        self.count.commit([(pod.namespace, node) for pod, node in pairs])
        for pod, _ in pairs:
            for pdb in self.pdbs_of(pod):
                self.pdb_left[pdb.key] -= 1
            retries = self._retries(pod)
            if retries is not None:
                self.retries_used[retries[0]] += 1

    def snapshot(self) -> LedgerState:
        return dict(self.pdb_left), self.count.snapshot(), self.retries_used.copy()

    def restore(self, state: LedgerState) -> None:
        self.pdb_left = dict(state[0])
        self.count.restore(state[1])
        self.retries_used = state[2].copy()

    def remaining(self) -> int | None:
        return self.count.left


def _within(spent: BudgetLedger, constraints: Constraints) -> BudgetLedger:
    """The window's spend, counted on for one plan: the plan evicts at most its own total (sized
    by its backlog) and at most what the window's limits (``spent.budgets``: the executor's) have
    left; the per-node and per-namespace limits are the window's."""
    own, left = constraints.budget.total, spent.left
    totals = [t for t in (own, left) if t is not None]
    total = spent.total + min(totals) if totals else None
    return spent.within(replace(constraints.budget, total=total))


def blocked_from(pod: str, status: Status) -> Blocked:
    """A Blocked entry from a failed check whose reason reads ``<constraint>: <detail>``."""
    reason = status.reasons[0] if status.reasons else "unknown"
    name, _, detail = reason.partition(": ")
    return Blocked(pod=pod, constraint=name, detail=detail)


def _minutes(delta: timedelta) -> str:
    return f"{delta.total_seconds() / 60:.0f}m"
