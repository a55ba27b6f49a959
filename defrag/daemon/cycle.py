"""One cycle: observe → detect → decide → execute → alert → report, as a plain function.

:func:`run_cycle` takes the ports (cluster source, detector, planner, executor, alert sink,
clock) and returns a frozen :class:`CycleResult`. It holds no state of its own: the
executor keeps budgets and the circuit breaker, the alert sink its active alerts. What to do
is :func:`defrag.decide.decide`'s, the one decision the simulator runs too; this module wires
it to the real adapters. Execution happens only for the leader, not in dry run, inside an open
window and with the breaker closed; in dry run the executor rehearses the plan (Events marked
"(dry run)").
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from defrag.daemon.unmodelled import UnmodelledReporter
from defrag.decide import CycleConfig, Detected, Detector, Planner, decide
from defrag.detect.findings import Finding
from defrag.execute.executor import Executor
from defrag.execute.mode import RunMode
from defrag.execute.outcome import Execution
from defrag.execute.reconcile import Reconciler
from defrag.execute.windows import WindowStatus
from defrag.model.cluster import Cluster
from defrag.model.gc_policy import YOUNG_EVERY, gc_deferred
from defrag.plan.model import Plan
from defrag.plan.recent import NONE as NO_EVICTIONS
from defrag.plan.recent import RecentEvictions
from defrag.ports import AlertSink, Clock, ClusterSource
from defrag.scoring.fragmentation import fragmentation_report

log = logging.getLogger(__name__)


SUMMARY_KEYS = ("free_gpus", "whole_free_nodes", "largest_placeable_job")


class SystemClock:
    """Wall-clock time, UTC."""

    def now(self) -> datetime:
        return datetime.now(UTC)


@dataclass(frozen=True, slots=True)
class CyclePorts:
    source: ClusterSource
    clock: Clock
    detector: Detector
    planner: Planner
    executor: Executor | None = None
    """None: this daemon never acts (nothing to evict with). Built with the run's mode."""
    alerts: AlertSink | None = None
    wall_clock: Clock = field(default_factory=SystemClock)
    """Alerts carry real time even when ``clock`` is simulated (Alertmanager expires by it)."""
    unmodelled: UnmodelledReporter | None = None
    """Tells the owners of objects the snapshot could not model (leader only)."""

    @property
    def mode(self) -> RunMode:
        """The executor's mode; without an executor nothing is written: a dry run."""
        return self.executor.mode if self.executor is not None else RunMode()


@dataclass(frozen=True, slots=True)
class CycleResult:
    """What one cycle saw, planned and did. ``after`` is observed when moves ran, else expected."""

    started: datetime
    finished: datetime
    leader: bool
    mode: RunMode
    window: WindowStatus
    findings: tuple[Finding, ...]
    plan: Plan | None
    executed: Execution | None
    before: Mapping[str, Any] = field(hash=False)
    after: Mapping[str, Any] = field(hash=False)
    after_source: str = "unchanged"
    """observed (re-read after execution), expected (the plan's), unchanged (no plan)."""
    verification: Mapping[str, Any] | None = field(default=None, hash=False)
    alert_error: str = ""
    circuit: Mapping[str, Any] = field(default_factory=dict, hash=False)
    warnings: tuple[str, ...] = ()
    """Objects of the observed cluster left out or counted conservatively (Cluster.warnings)."""
    rule_failures: Mapping[str, str] = field(default_factory=dict, hash=False)
    """Rules that could not be evaluated (Prometheus down, too slow, a wrong answer) → why.
    Their alerts were held as they were; each has a ``rule-failed`` finding."""
    rules_skipped: Mapping[str, str] = field(default_factory=dict, hash=False)
    """Rules skipped because their inputs are missing (no series, no metrics source) → why."""
    held_back: Mapping[str, str] = field(default_factory=dict, hash=False)
    """Starved pods make-room did not serve this cycle because the scheduler packs → why."""
    packing: Finding | None = field(default=None, hash=False)
    """The packing finding that stood this cycle (found now, or an earlier cycle's within the
    patience's memory): the next cycle's ``last_packing``."""
    evicted: RecentEvictions = field(default=NO_EVICTIONS, hash=False)
    """The daemon's evictions within the anti-thrash guard, this cycle's included: the next
    cycle's ``evicted``."""
    opened_early: datetime | None = None
    """The start of the early window this cycle was in (the next cycle's ``opened_early``)."""

    @property
    def degraded(self) -> bool:
        """Some rule could not be evaluated: the cycle ran, but saw less than it should."""
        return bool(self.rule_failures)

    @property
    def duration_s(self) -> float:
        return (self.finished - self.started).total_seconds()

    def to_dict(self) -> dict[str, Any]:
        return {
            "started": self.started.isoformat(),
            "finished": self.finished.isoformat(),
            "leader": self.leader,
            **self.mode.to_dict(),
            "window": self.window.to_dict(),
            "findings": [f.to_dict() for f in self.findings],
            "plan": self.plan.to_dict() if self.plan else None,
            "executed": self.executed.to_dict() if self.executed else None,
            "before": dict(self.before),
            "after": dict(self.after),
            "after_source": self.after_source,
            "verification": dict(self.verification) if self.verification else None,
            "alert_error": self.alert_error or None,
            "circuit": dict(self.circuit),
            "warnings": list(self.warnings),
            "rule_failures": dict(self.rule_failures),
            "held_back": dict(self.held_back),
        }


def run_cycle(
    ports: CyclePorts,
    config: CycleConfig,
    *,
    leader: bool = True,
    last_packing: Finding | None = None,
    evicted: RecentEvictions = NO_EVICTIONS,
    opened_early: datetime | None = None,
) -> CycleResult:
    """One full cycle. Errors observing or planning propagate; alert failures are recorded.

    ``last_packing``, ``evicted``, ``opened_early``: what the last cycle left
    (:attr:`CycleResult.packing`, :attr:`~CycleResult.evicted`,
    :attr:`~CycleResult.opened_early`)."""
    started = ports.clock.now()
    cluster = ports.source.snapshot()
    # Detection and planning make objects by the hundred thousand at fleet scale, nearly all
    # dying young by reference counting; at the default thresholds the cyclic collector walked
    # them (and the snapshot's) again and again — the young generation more rarely, as the
    # simulator's timeline does (defrag.model.gc_policy).
    with gc_deferred(YOUNG_EVERY):
        return _cycle(ports, config, started, cluster, leader, last_packing, evicted, opened_early)


def _cycle(
    ports: CyclePorts,
    config: CycleConfig,
    started: datetime,
    cluster: Cluster,
    leader: bool,
    last_packing: Finding | None,
    evicted: RecentEvictions,
    opened_early: datetime | None,
) -> CycleResult:
    """:func:`run_cycle` once the snapshot is taken."""
    # One profile for this snapshot: the detectors, the planner and the figures on /metrics
    # (and so alert evidence and `defrag report`) all score with it.
    profile = config.profile.for_cluster(cluster)
    before = _summary(fragmentation_report(cluster, profile.mix).to_dict(with_nodes=False))
    detected = ports.detector(cluster, started, profile)
    failed: dict[str, str] = {}
    skipped: dict[str, str] = {}
    if isinstance(detected, Detected):
        failed, skipped = dict(detected.failed), dict(detected.skipped)
        findings = list(detected.findings)
    else:
        findings = list(detected)
    findings += [rule_failed_finding(rule, why) for rule, why in sorted(failed.items())]

    breaker = ports.executor.breaker if ports.executor else None
    if breaker is not None:
        breaker.refresh(cluster)
    if ports.executor is not None and (leader or not ports.mode.reconciles):
        # What earlier runs left (a crashed drain, a taint that would not come off, a stale
        # reservation): reconciled by the leader, reported in dry run.
        findings += Reconciler(ports.executor).maintain(cluster)
    if ports.unmodelled is not None and leader:
        ports.unmodelled.report(cluster.warnings)
    spent = ports.executor.spent if ports.executor is not None else None
    if config.evict_again_after is not None:
        evicted = evicted.pruned(started, config.evict_again_after)
    decision = decide(
        cluster, findings, started, config, ports.planner, profile,
        last_packing=last_packing, spent=spent, evicted=evicted, opened_early=opened_early,
    )  # fmt: skip
    window, plan = decision.window, decision.plan
    findings += decision.findings

    executed: Execution | None = None
    if plan is not None and not plan.empty and ports.executor is not None and leader:
        if not ports.mode.evicts:  # a rehearsal, whatever the window
            executed = ports.executor.execute(plan, cluster, window)
        elif window.open and not ports.executor.breaker.state.open:
            executed = ports.executor.execute(plan, cluster, window)
            findings += executed.findings
            gone = (cluster.pods.get(o.pod) for o in executed.evicted)
            evicted = evicted.record((p for p in gone if p is not None), executed.finished)
    if (
        breaker is not None
        and breaker.state.open
        and not any(f.kind == "circuit-open" for f in findings)
    ):
        findings.append(breaker.state.finding())

    after, after_source, verification = dict(before), "unchanged", None
    if executed is not None and not executed.rehearsal and executed.evicted:
        observed = ports.source.snapshot()
        seen = config.profile.for_cluster(observed)  # a new snapshot, its own profile
        after = _summary(fragmentation_report(observed, seen.mix).to_dict(with_nodes=False))
        after_source = "observed"
        verification = _verify(plan, after, observed) if plan else None
    elif plan is not None and plan.after:
        after, after_source = _summary(plan.after), "expected"

    alert_error = ""
    # A leader deposed during this cycle (its execution stopped at the fence) sends nothing: its
    # findings are from the snapshot at the start, and the new leader may already have resolved
    # an alert they still hold — sending them would fire it again.
    if ports.alerts is not None and leader and _still_leading(ports):
        try:
            # a rule that could not be evaluated keeps its alerts as they were
            ports.alerts.sync(findings, ports.wall_clock.now(), held_rules=tuple(failed))
        except Exception as exc:  # the sink keeps what failed and retries next cycle
            alert_error = f"{type(exc).__name__}: {exc}"
            log.error("alerts not delivered: %s", alert_error)

    return CycleResult(
        started=started,
        finished=ports.clock.now(),
        leader=leader,
        mode=ports.mode,
        window=window,
        findings=tuple(findings),
        plan=plan,
        executed=executed,
        before=before,
        after=after,
        after_source=after_source,
        verification=verification,
        alert_error=alert_error,
        circuit=breaker.state.to_dict() if breaker else {},
        warnings=cluster.warnings,
        rule_failures=failed,
        rules_skipped=skipped,
        held_back=decision.held_back,
        packing=decision.packing,
        evicted=evicted,
        opened_early=decision.opened_early,
    )


def _still_leading(ports: CyclePorts) -> bool:
    """Whether this replica still holds the Lease it began the cycle with (its executor's fence;
    a replica without election always does)."""
    if ports.executor is None:
        return True
    try:
        return bool(ports.executor.fence.still_leader())
    except Exception:  # cannot tell: say nothing rather than send stale alerts
        return False


def rule_failed_finding(rule: str, reason: str) -> Finding:
    """A rule that could not be evaluated this cycle (``DefragRuleEvaluationFailed``)."""
    return Finding(
        kind="rule-failed",
        subject=f"rule/{rule}",
        severity="warning",
        summary=f"rule {rule} could not be evaluated; its alerts are held as they were",
        evidence={"reason": reason},
        labels={"rule": rule, "detector": "defrag"},
    )


def _summary(report: Mapping[str, Any]) -> dict[str, Any]:
    """A fragmentation report without the per-node list (which grows with the cluster)."""
    return {k: v for k, v in report.items() if k != "nodes"}


def _verify(plan: Plan, achieved: Mapping[str, Any], observed: Cluster) -> dict[str, Any]:
    """Expected vs achieved, after the moves ran.

    Met when no figure the plan promised fell short — or when every pod the plan made room
    for is now scheduled (it took the room, so the figures dropped for the right reason).
    """
    expected = plan.after
    rows = {
        key: {"expected": expected.get(key), "achieved": achieved.get(key)}
        for key in SUMMARY_KEYS
        if key in expected
    }
    short = [
        k
        for k, r in rows.items()
        if isinstance(r["expected"], int | float) and (r["achieved"] or 0) < r["expected"]
    ]
    pods = [t.split(" ", 1)[0] for t in plan.targets if "/" in t.split(" ", 1)[0]]
    placed = [t for t in pods if t in observed.pods and observed.pods[t].node is not None]
    met = not short or (bool(pods) and len(placed) == len(pods))
    return {"figures": rows, "short": short, "targets_placed": placed, "met": met}
