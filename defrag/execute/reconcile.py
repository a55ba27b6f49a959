"""Reconcile: what earlier runs left on the nodes, finished, rolled back or reported.

A drain that a crash, a lost Lease or a failed untaint interrupted leaves its taint
(``defrag.io/draining``) and its journal on the node; a make-room plan may leave a reservation
(``defrag.io/reserved-for``). The :class:`Reconciler` repairs them with its executor's writes
(fenced by the same Lease): at start (:meth:`Reconciler.reconcile`, the daemon calls it before
its first cycle as leader) and every cycle before planning (:meth:`Reconciler.maintain`). In dry
run (the executor's :class:`~defrag.execute.mode.RunMode`) it writes nothing: each leftover is
reported as a warning finding instead.
"""

from __future__ import annotations

import logging
from datetime import datetime, timedelta
from typing import Literal

from defrag.detect.findings import Finding
from defrag.execute.circuit import pending_of
from defrag.execute.executor import EVENT_KIND_NODE, Executor, node_finding
from defrag.execute.journal import Journal, read_journal
from defrag.execute.outcome import ReconcileOutcome
from defrag.execute.reservation import Reservation, read_reservation
from defrag.model.cluster import Cluster
from defrag.model.resources import DRAIN_TAINT_KEY, Node

log = logging.getLogger(__name__)


class Reconciler:
    """Repairs (live) or reports (dry run) what earlier runs of ``executor`` left on the nodes,
    with the executor's fence, breaker, clock and writes."""

    def __init__(self, executor: Executor) -> None:
        self.executor = executor

    def maintain(self, cluster: Cluster) -> list[Finding]:
        """Once a cycle, before planning: what earlier runs left on the nodes.

        Enforce mode (the leader): every leftover drain taint, journal or reservation is
        reconciled (:meth:`reconcile`) — a taint whose removal failed is retried here every
        cycle, and reported by a node finding (``DefragExecutionFailed``) for as long as it stays.
        Dry run writes nothing: each leftover is reported (a warning finding per node).
        """
        leftovers = [n for n in cluster.nodes if read_journal(n) or read_reservation(n)]
        if not leftovers:
            return []
        if not self.executor.mode.reconciles:
            return [
                _leftover_finding(n.name, _leftover_parts(n), self.executor.clock.now())
                for n in leftovers
            ]
        findings = []
        for outcome in self.reconcile(cluster):
            if outcome.problem:
                findings.append(
                    node_finding(outcome.node, outcome.problem, self.executor.clock.now())
                )
        return findings

    def reconcile(self, cluster: Cluster | None = None) -> tuple[ReconcileOutcome, ...]:
        """On start: every node with a drain taint or journal is finished or rolled back.

        Journal pods no longer on the node were evicted: that drain is *finished*. Pods still
        there were never evicted: the drain is *rolled back* (the next cycle plans afresh from
        what the cluster is now). Either way the taint and journal come off; replacements still
        Pending trip the circuit breaker. A reservation defrag set is removed once it has served
        or cannot (:meth:`_stale`), and kept while its room, made, waits for its pod. A drain
        whose journal names another owner that still holds the Lease is *deferred*: left alone,
        its owner is still at work.
        """
        if cluster is None:
            cluster = self.executor.source.snapshot()
        results: list[ReconcileOutcome] = []
        for node in cluster.nodes:
            journal = read_journal(node)
            reservation = read_reservation(node)
            if journal is not None and self._owned_elsewhere(journal):
                log.info(
                    "reconcile %s: drain owned by %s, still held; left alone",
                    node.name,
                    journal.owner,
                )
                results.append(
                    ReconcileOutcome(
                        node.name,
                        journal.plan_id,
                        "deferred",
                        problem="",
                        owner=str(journal.owner),
                    )
                )
                continue
            on_node = {p.key for p in cluster.pods_on(node.name)}
            remaining = tuple(s.pod for s in journal.steps if s.pod in on_node) if journal else ()
            held = ""
            kept = False
            if reservation is not None:
                stale = (
                    f"room not proven made: {journal.problem}"
                    if journal is not None and journal.problem
                    else self._stale(reservation, cluster, remaining)
                )
                if stale:
                    held = self.executor.release(reservation, f"reconciled: {stale}")
                else:
                    kept = True
            if journal is None:
                if reservation is not None:
                    results.append(
                        ReconcileOutcome(
                            node.name,
                            "",
                            "kept" if kept else "released",
                            problem=held,
                            reservation=reservation.pod,
                        )
                    )
                continue
            watched = tuple(s.owner or s.pod for s in journal.steps if s.pod not in on_node)
            pending = pending_of(cluster, watched)
            action: Literal["finished", "rolled-back"] = (
                "finished" if journal.steps and not remaining else "rolled-back"
            )
            problem = held or journal.problem
            failure = self.executor.clear_drain(node.name, attempts=1)
            if failure:
                problem = failure
                log.error("reconcile %s: %s", node.name, problem)
            if pending:
                self.executor.breaker.trip(
                    pending,
                    f"replacements of plan {journal.plan_id} still Pending at start",
                    self.executor.clock.now(),
                )
            self.executor.event(
                EVENT_KIND_NODE,
                "",
                node.name,
                "DefragReconciled",
                f"plan {journal.plan_id or '?'} {action} after a restart"
                + (f"; not evicted: {', '.join(remaining)}" if remaining else ""),
                warning=bool(problem),
            )
            results.append(
                ReconcileOutcome(
                    node.name,
                    journal.plan_id,
                    action,
                    remaining,
                    pending,
                    problem,
                    reservation.pod if reservation else "",
                )
            )
        return tuple(results)

    def _stale(
        self, reservation: Reservation, cluster: Cluster, not_evicted: tuple[str, ...]
    ) -> str:
        """Why a reservation found on a node should go now, or "" while its room still serves
        its pod: made (no victim of the drain left on the node) and the pod not bound yet
        (within the replacement timeout) — a room a stopped or deposed leader made is kept for
        its pod, so that no second room is made for it while this one empties."""
        if reservation.owners:
            # A seat for a move's replacement: the moves of the stopped run that were not made
            # cannot be told from it, and the scheduler places a replacement without it.
            return "a seat for replacements is not kept across a restart"
        if not_evicted:
            return f"room not made, not evicted: {', '.join(not_evicted)}"
        timeout = timedelta(seconds=self.executor.settings.replacement_timeout_s)
        return reservation.verdict(cluster, self.executor.clock.now(), timeout)

    def _owned_elsewhere(self, journal: Journal) -> bool:
        """Whether the journal's drain belongs to another replica that still holds the Lease."""
        owner = journal.owner
        if owner is None or owner == self.executor.fence.tenure():
            return False
        return self.executor.fence.holds(owner)


def _leftover_parts(node: Node) -> list[str]:
    parts = []
    journal = read_journal(node)
    if journal is not None:
        what = f"taint {DRAIN_TAINT_KEY}" if journal.tainted else "drain journal"
        owner = f", started by {journal.owner}" if journal.owner else ""
        parts.append(f"{what} of plan {journal.plan_id or '?'}{owner}")
    reservation = read_reservation(node)
    if reservation is not None:
        parts.append(f"reservation defrag.io/reserved-for={reservation.pod}")
    return parts


def _leftover_finding(node: str, parts: list[str], now: datetime) -> Finding:
    return Finding(
        kind="execution-failed",
        subject=f"node/{node}",
        severity="warning",
        summary=(
            f"{node} carries what an earlier defrag run left: {'; '.join(parts)}. Dry run does "
            "not remove it: run in enforce mode (the leader reconciles it) or remove it by hand"
        ),
        evidence={"node": node, "leftovers": parts},
        since=now,
        labels={"detector": "executor", "node": node},
    )


__all__ = ["Reconciler"]
