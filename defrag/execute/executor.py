"""The executor: carries a plan out on the cluster, one draining node at a time, safely.

Before anything is written, every eviction the budgets admit is asked as a server-side dry
run (:meth:`Actuator.rehearse_eviction`): a node with a pod its disruption budget refuses now
is not drained at all, rather than tainted and half-emptied for nothing.

Per source node: taint + journal, evictions in bounded concurrent batches through the Eviction
API (a 429 is a skip with its reason, never a delete), wait until the replacements are
scheduled, remove the taint and journal (retried with backoff; a taint that will not come off is
retried every cycle and reported until it does). A node a make-room plan frees for a pending pod
is reserved for it (``defrag.io/reserved-for``, see :mod:`defrag.execute.reservation`) before
its first eviction, until the pod is bound or the replacement timeout passes. Budgets are spent
as steps are admitted; gangs are admitted whole or not at all. Replacements Pending past the
timeout trip the circuit breaker, which stops this and later executions until they are
scheduled.

Fencing (:mod:`defrag.execute.fence`): before every write — taint, journal, reservation, each
eviction, untaint — the executor asks its fence whether this replica still leads; a plan it no
longer owns stops there, and what it left on the node is the new leader's to reconcile. The
journal names the owner and its Lease generation, so a reconcile never undoes the drain of an
owner that still holds the Lease. What earlier runs left is reconciled by
:mod:`defrag.execute.reconcile` with this executor's writes; in dry run it is only reported.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime, timedelta

from defrag.detect.findings import Finding
from defrag.execute.budgets import SpendBook
from defrag.execute.checkpoint import (
    CHECKPOINT_DEADLINE_ANNOTATION,
    CHECKPOINT_REQUESTED_ANNOTATION,
    CheckpointRequest,
    earliest,
    pod_wait,
    seconds_from,
    withdrawn,
)
from defrag.execute.circuit import CircuitBreaker, controller_key, pending_of
from defrag.execute.fence import Fence, LostLeadership, NoFence
from defrag.execute.journal import (
    DRAIN_EFFECT,
    JournalStep,
    cleared,
    new_journal,
)
from defrag.execute.mode import RunMode
from defrag.execute.outcome import Execution, StepOutcome, StepResult
from defrag.execute.reservation import Reservation, read_reservation, released
from defrag.execute.windows import WindowStatus
from defrag.model.cluster import Cluster
from defrag.model.resources import (
    CHECKPOINT_ANNOTATION,
    DRAIN_TAINT_KEY,
    RESERVED_FOR_ANNOTATION,
    Node,
    Pod,
    owner_holder,
)
from defrag.model.utc import utc
from defrag.plan.config import EvictionBudget
from defrag.plan.model import Plan, Step
from defrag.plan.spend import BudgetLedger
from defrag.ports import Actuator, Clock, ClusterSource, EvictionResult, SpendRecord

log = logging.getLogger(__name__)

EVENT_KIND_POD = "Pod"
EVENT_KIND_NODE = "Node"
DRY_RUN_MARK = " (dry run)"
STOPPED = "stopped: the daemon is shutting down"
NOT_LEADER = "not the leader any more: the Lease was lost, the rest of the plan is not ours"


@dataclass(frozen=True, slots=True)
class ExecutorSettings:
    budgets: EvictionBudget = field(default_factory=EvictionBudget)
    batch_size: int = 4
    replacement_timeout_s: float = 600.0
    poll_interval_s: float = 5.0
    untaint_attempts: int = 4
    """Tries to remove a drain taint within one drain (backoff doubling from ``untaint_backoff_s``);
    a taint still on after them is retried every cycle (:mod:`defrag.execute.reconcile`)."""
    untaint_backoff_s: float = 0.5
    checkpoint_wait_s: float = 120.0
    """How long a pod that supports the checkpoint handshake is waited for when it names no
    ``defrag.io/checkpoint-max-wait`` of its own (:mod:`defrag.execute.checkpoint`)."""
    checkpoint_max_wait_s: float = 600.0
    """The longest wait any pod may ask for."""


class Executor:
    """Carries plans out; keeps the budget ledger and the circuit breaker between cycles.

    Built with its :class:`RunMode` (dry run by default): in dry run :meth:`execute` rehearses
    the plan (Events at most, when ``mode.writes_events``), live it evicts."""

    def __init__(
        self,
        actuator: Actuator,
        source: ClusterSource,
        clock: Clock,
        settings: ExecutorSettings | None = None,
        *,
        mode: RunMode | None = None,
        sleep: Callable[[float], None] = time.sleep,
        breaker: CircuitBreaker | None = None,
        fence: Fence | None = None,
        time_left: Callable[[], float | None] | None = None,
        spend: SpendRecord | None = None,
        confirm: ClusterSource | None = None,
    ) -> None:
        self.actuator = actuator
        self.time_left = time_left or _no_deadline
        """Seconds (on ``clock``) left before the cycle's deadline, None when it has none: a
        checkpoint wait ends early enough for one replacement wait after it."""
        self.fence: Fence = fence or NoFence()
        """Asked before every write; the daemon sets its LeaseElector here."""
        self.source = source
        self.confirm = confirm
        """Read once more before a drain's replacements are taken as all scheduled, where
        ``source`` may lag (the daemon's watched store): a store that lags can miss a
        replacement just created, never show one that was not (nor a pod gone that is not),
        so only that verdict needs a fresh read, and only of the pods not yet scheduled (the
        daemon: :class:`~defrag.adapters.kube.KubeUnscheduledPods`). None: ``source`` is read
        fresh each time."""
        self.clock = clock
        self.settings = settings or ExecutorSettings()
        self.mode = mode or RunMode()
        self.sleep = sleep
        self.breaker = breaker or CircuitBreaker()
        self.ledger = BudgetLedger(self.settings.budgets)
        self.book = SpendBook(spend) if spend is not None else SpendBook()
        """Where the window's spend outlives this process (the Lease; None: memory only)."""
        self.stop_requested = threading.Event()
        """Set on SIGTERM: the current node's batch finishes, its taint comes off, nothing more."""
        self._flagged: set[str] = set()

    # --- public ----------------------------------------------------------------------------

    def spent(self, window: WindowStatus) -> BudgetLedger | None:
        """What ``window``'s opening has spent so far (the decision's ledger port): a plan
        spends only what is left. Live, the record (the Lease) is read too, as :meth:`execute`
        does; None for a closed window (its plan is only reported)."""
        if not window.open:
            return None
        ledger = self.ledger.for_window(window.key)
        if self.mode.evicts:
            ledger, _ = self.book.recover(ledger)
        return ledger.copy()

    def execute(self, plan: Plan, cluster: Cluster, window: WindowStatus) -> Execution:
        """Carry ``plan`` out within ``window`` (live), or rehearse it (dry run: Events at most)."""
        started = self.clock.now()
        if not self.mode.evicts:
            outcomes = self._rehearse(plan, cluster, window)
            return Execution(plan.id, True, window.key, started, self.clock.now(), outcomes)
        self._release_stale(cluster)
        refusal = self._refusal(window)
        if refusal:
            outcomes = tuple(self._skip(s, refusal) for s in plan.steps)
            return Execution(plan.id, False, window.key, started, self.clock.now(), outcomes)

        self.ledger = self.ledger.for_window(window.key)
        # What an earlier process or leader spent in this window counts too; unknown stops it.
        self.ledger, unknown = self.book.recover(self.ledger)
        before = self.ledger.copy()
        run = _Run(plan.id, cluster, cluster, window_end=window.end)
        going = _terminating(cluster, plan.steps)
        run.going.update(going)
        run.uncharged.update(going)
        admitted: list[Step]
        if unknown:
            admitted, outcomes_list = [], [_skipped(s, unknown) for s in plan.steps]
        else:
            admitted, outcomes_list = self._admit(plan.steps, self.ledger, going)
        for o in outcomes_list:
            self._event_for(o, "DefragSkipped", f"not evicted: {o.reason}")
        admitted, refused = self._preflight(admitted, run)
        outcomes_list += refused
        if self.ledger.to_dict() != before.to_dict():
            # Write-ahead: recorded before any eviction it counts goes out, or none goes out.
            saved = self.book.save(self.ledger, _until(window, started), started)
            if not saved.ok:
                self.ledger = before
                why = f"cannot record the window's spend: {saved}"
                unrecorded = [_skipped(s, why) for s in admitted]
                for o in unrecorded:
                    self._event_for(o, "DefragSkipped", f"not evicted: {o.reason}")
                outcomes_list += unrecorded
                admitted = []
        try:
            for node, steps in _by_source(admitted).items():
                if self.stop_requested.is_set():
                    outcomes_list += [self._skip(s, STOPPED) for s in steps]
                    run.stopped = True
                    continue
                if run.lost:
                    outcomes_list += [self._skip(s, NOT_LEADER) for s in steps]
                    continue
                if self.breaker.state.open:
                    reason = f"circuit breaker open: {self.breaker.state.reason}"
                    outcomes_list += [self._skip(s, reason) for s in steps]
                    continue
                if window.end is not None and self.clock.now() >= window.end:
                    reason = f"window closed at {window.end.isoformat()}; no new drain started"
                    outcomes_list += [self._skip(s, reason) for s in steps]
                    continue
                outcomes_list += self._drain(node, steps, run)
            self._await_reservations(run, outcomes_list)
        finally:  # never leave a reservation behind that serves nothing, whatever ended the run
            stopping = self.stop_requested.is_set()
            ending = STOPPED if stopping else "the execution ended"
            made = {o.pod for o in outcomes_list if o.result in ("evicted", "gone")}
            for res in list(run.reserved.values()):
                if run.lost:  # not ours to write any more: the new leader's reconcile decides
                    run.reserved.pop(res.node, None)
                    continue
                if (
                    stopping
                    and not res.owners  # a seat goes; a room waits for its pod
                    and all(p in made for p in run.rooms.get(res.node, ()))
                ):
                    # The room is made and its pod not yet bound: released now, a restarted
                    # daemon (or the next leader) would make the pod a second room while this
                    # one empties. The next leader's reconcile releases it once it has served.
                    run.reserved.pop(res.node, None)
                    log.info("kept the reservation of %s for %s across the stop", res.node, res.pod)
                    continue
                self.release(res, ending, run)
        findings = self._findings(plan, run, outcomes_list)
        order = {s.pod: i for i, s in enumerate(plan.steps)}
        outcomes = tuple(sorted(outcomes_list, key=lambda o: order.get(o.pod, len(order))))
        return Execution(
            plan.id,
            False,
            window.key,
            started,
            self.clock.now(),
            outcomes,
            tuple(sorted(run.stuck)),
            run.stopped,
            tuple(run.problems),
            tuple(findings),
        )

    # --- steps -------------------------------------------------------------------------------

    def _refusal(self, window: WindowStatus) -> str:
        if self.breaker.state.open:
            return f"circuit breaker open: {self.breaker.state.reason}"
        if not window.open:
            return f"window closed: {window.reason}"
        if self.stop_requested.is_set():
            return STOPPED
        if not self.fence.still_leader():
            return NOT_LEADER
        return ""

    def _admit(
        self, steps: Sequence[Step], ledger: BudgetLedger, going: Mapping[str, str]
    ) -> tuple[list[Step], list[StepOutcome]]:
        """Steps the budgets allow, gangs whole; the rest skipped with the budget's reason.
        ``going``: pods already Terminating (→ why), admitted without spending budget."""
        admitted: list[Step] = []
        skipped: list[StepOutcome] = []
        for unit in _units(steps):
            # A Terminating pod is already going: its step is carried (the drain waits for it to
            # leave) but it is never evicted, so it spends no budget.
            charged = [s for s in unit if s.pod not in going]
            status = ledger.admit([(_namespace(s.pod), s.source) for s in charged])
            if status.ok:
                admitted += unit
            else:
                skipped += [_skipped(s, str(status)) for s in unit]
        return admitted, skipped

    def _preflight(self, steps: list[Step], run: _Run) -> tuple[list[Step], list[StepOutcome]]:
        """Before the first taint: every admitted eviction asked as a server-side dry run.

        A pod whose disruption budget refuses it now would stop its node's drain half-way,
        after the node was tainted and other pods evicted for nothing. So a node with a refused
        pod is not started at all — nor any gang with a pod on it, nor the nodes of such a gang
        (a node keeping one of its pods is not freed either). Their steps are skipped, with the
        budget they spent given back. Returns the steps that go ahead and the outcomes of the
        rest. Only a refusal (``blocked``) stops a node; any other answer is left to the
        eviction itself. (Each pod is asked alone: two pods of one budget that allows one
        disruption both pass here, and the second is refused when it is evicted.)"""
        asked = [s for s in steps if s.pod not in run.going]
        if not asked:
            return steps, []
        with ThreadPoolExecutor(max_workers=min(len(asked), self.settings.batch_size)) as pool:
            answers = list(pool.map(lambda s: self._ask(s, run), asked))
        refused = {
            s.pod: a.reason for s, a in zip(asked, answers, strict=True) if a.outcome == "blocked"
        }
        if not refused:
            return steps, []
        refused_on: dict[str, list[str]] = {}
        for s in steps:
            if s.pod in refused:
                refused_on.setdefault(s.source, []).append(s.pod)
        stopped = set(refused_on)
        units = _units(steps)
        while True:  # a gang touching a stopped node stops whole, and so do its nodes
            more = {s.source for u in units if any(s.source in stopped for s in u) for s in u}
            if more <= stopped:
                break
            stopped |= more
        kept = [s for s in steps if s.source not in stopped]
        dropped = [s for s in steps if s.source in stopped]
        self.ledger.refund(
            [(_namespace(s.pod), s.source) for s in dropped if s.pod not in run.uncharged]
        )
        outcomes = []
        for step in dropped:
            if step.pod in run.going:  # already leaving: nothing was asked or spent
                outcomes.append(
                    StepOutcome(
                        step.pod, step.source, step.target, step.kind, "gone", run.going[step.pod]
                    )
                )
            elif step.pod in refused:
                why = f"refused before anything was written (server dry run): {refused[step.pod]}"
                outcomes.append(
                    StepOutcome(step.pod, step.source, step.target, step.kind, "blocked", why)
                )
                self._pod_event(step, "DefragSkipped", f"not evicted: {why}", warning=True)
            else:
                blockers = refused_on.get(step.source)
                why = f"drain of {step.source} not started: " + (
                    f"the disruption budget of {', '.join(blockers)} refuses its eviction"
                    if blockers
                    else "a gang with a pod here has one on a node a disruption budget stops"
                )
                outcomes.append(self._skip(step, why))
        return kept, outcomes

    def _ask(self, step: Step, run: _Run) -> EvictionResult:
        ns, name = _split(step.pod)
        pod = run.cluster.pods.get(step.pod)
        try:
            return self.actuator.rehearse_eviction(ns, name, uid=pod.uid if pod is not None else "")
        except Exception as exc:  # no answer: the eviction itself will tell
            return EvictionResult(step.pod, "failed", str(exc) or type(exc).__name__)

    def _rehearse(
        self, plan: Plan, cluster: Cluster, window: WindowStatus
    ) -> tuple[StepOutcome, ...]:
        """Dry run: what would happen, budgets counted on a copy; Events only, marked dry run."""
        ledger = self.ledger.for_window(window.key).copy()
        going = _terminating(cluster, plan.steps)
        admitted, skipped = self._admit(plan.steps, ledger, going)
        outcomes = [
            StepOutcome(s.pod, s.source, s.target, s.kind, "gone", going[s.pod])
            if s.pod in going
            else StepOutcome(s.pod, s.source, s.target, s.kind, "planned", s.reason)
            for s in admitted
        ]
        outcomes = [self._would_ask(o, cluster) for o in outcomes]
        if self.mode.writes_events:
            for node, steps in _by_source(admitted).items():
                self.event(
                    EVENT_KIND_NODE,
                    "",
                    node,
                    "DefragPlanned",
                    f"plan {plan.id} would drain {len(steps)} pod(s){DRY_RUN_MARK}",
                )
            asked = {o.pod for o in outcomes if o.checkpoint}
            for s in admitted:
                first = "ask for a checkpoint, then " if s.pod in asked else ""
                self._pod_event(s, "DefragPlanned", f"would {first}{_describe(s)}{DRY_RUN_MARK}")
            for o in skipped:
                self._event_for(o, "DefragSkipped", f"would skip: {o.reason}{DRY_RUN_MARK}")
        order = {s.pod: i for i, s in enumerate(plan.steps)}
        return tuple(sorted(outcomes + skipped, key=lambda o: order[o.pod]))

    def _drain(self, node: str, steps: list[Step], run: _Run) -> list[StepOutcome]:
        journal = new_journal(
            node,
            run.plan_id,
            self.clock.now(),
            tuple(JournalStep(s.pod, _owner_key(run.cluster, s.pod), s.target) for s in steps),
            owner=self.fence.tenure(),
        )
        room_for = next((s.for_pod for s in steps if s.for_pod), None)
        try:
            self._guard(f"tainting {node}")
            self.actuator.taint_node(node, DRAIN_TAINT_KEY, run.plan_id, DRAIN_EFFECT)
            self._guard(f"writing the journal on {node}")
            self.actuator.annotate_node(node, journal.annotations())
            if room_for:
                self._reserve(
                    Reservation(node, room_for, self.clock.now()),
                    [s.pod for s in steps if s.for_pod == room_for],
                    f"room kept for {room_for} while {node} drains",
                    run,
                )
            for target, owners in _seats(node, steps, run).items():
                self._reserve(
                    Reservation(target, ",".join(owners), self.clock.now()),
                    [s.pod for s in steps if s.target == target],
                    f"kept for the replacement of {', '.join(owners)} moving from {node}",
                    run,
                )
        except LostLeadership as exc:
            run.lost = True
            run.problems.append(f"{exc}; the drain of {node} is left to the new leader")
            return [self._skip(s, NOT_LEADER) for s in steps]
        except Exception as exc:
            reason = f"could not taint/annotate {node}: {exc}"
            run.problems.append(reason)
            self._untaint(node, run)
            return [self._skip(s, reason) for s in steps]
        self.event(
            EVENT_KIND_NODE,
            "",
            node,
            "DefragDrainStarted",
            f"plan {run.plan_id}: evicting {len(steps)} pod(s)",
        )
        outcomes: list[StepOutcome] = []
        try:
            try:
                self._handshake(steps, run)
            except LostLeadership as exc:
                run.lost = True
                run.problems.append(f"{exc}; the drain of {node} is left to the new leader")
            for batch in _batches(steps, self.settings.batch_size):
                if self.stop_requested.is_set():
                    outcomes += [self._skip(s, STOPPED) for s in batch]
                    run.stopped = True
                    continue
                if run.lost:
                    outcomes += [self._skip(s, NOT_LEADER) for s in batch]
                    continue
                outcomes += self._evict_batch(batch, run)
            outcomes = self._checkpointed(outcomes, run)
            migrated = [
                o
                for o in outcomes
                if o.kind == "migrate"
                and (o.result == "evicted" or (o.result == "gone" and o.pod in run.going))
            ]
            leaving = tuple(o.pod for o in outcomes if o.result == "gone" and o.pod in run.going)
            if (migrated or leaving) and not self.stop_requested.is_set() and not run.lost:
                watched = tuple(sorted({_owner_key(run.cluster, o.pod) or o.pod for o in migrated}))
                stuck = self._await_replacements(watched, leaving, run)
                if stuck:
                    run.stuck.update(stuck)
                    self.breaker.trip(
                        stuck,
                        f"replacements Pending longer than {self.settings.replacement_timeout_s:g}"
                        f" s after draining {node}: {', '.join(stuck)}",
                        self.clock.now(),
                    )
        finally:
            self._untaint(node, run)
            self._release_seats(run, outcomes)
        self.event(
            EVENT_KIND_NODE,
            "",
            node,
            "DefragDrainFinished",
            f"plan {run.plan_id}: "
            + ", ".join(f"{n} {r}" for r, n in sorted(_count(outcomes).items())),
        )
        return outcomes

    # --- the checkpoint handshake (defrag.execute.checkpoint) --------------------------------

    def _handshake(self, steps: list[Step], run: _Run) -> None:
        """Ask each of ``steps``' pods that supports it for a checkpoint and wait until each has
        written one, is gone, or its deadline passed. Pods gone meanwhile join ``run.going``
        (not evicted). Raises :class:`LostLeadership` (caught by the drain) before a request
        this replica no longer owns."""
        waiting: dict[str, CheckpointRequest] = {}
        for step in steps:
            pod = run.latest.pods.get(step.pod)
            if step.pod in run.going or pod is None or not pod.checkpoints_on_request:
                continue
            wait = pod_wait(
                pod, self.settings.checkpoint_wait_s, self.settings.checkpoint_max_wait_s
            )
            now = self.clock.now()
            deadline, limit = self._checkpoint_deadline(now, wait.seconds, run)
            request = CheckpointRequest.at(pod, now, deadline, limit)
            self._guard(f"asking {step.pod} for a checkpoint")
            ns, name = _split(step.pod)
            try:
                self.actuator.annotate_pod(ns, name, request.annotations())
            except Exception as exc:
                run.checkpoints[step.pod] = (
                    "request-failed",
                    f"the request could not be written ({exc}); evicted without waiting",
                )
                continue
            run.asked.add(step.pod)
            waiting[step.pod] = request
            note = f" ({wait.note})" if wait.note else ""
            written = request.annotations()
            self._pod_event(
                step,
                "DefragCheckpointRequested",
                f"plan {run.plan_id}: checkpoint requested before eviction from {step.source}: "
                f"write {CHECKPOINT_ANNOTATION} at or after "
                f"{written[CHECKPOINT_REQUESTED_ANNOTATION]}; evicted at "
                f"{written[CHECKPOINT_DEADLINE_ANNOTATION]} at the latest ({limit}){note}",
            )
        while waiting:
            cluster = self.source.snapshot()
            run.latest = cluster
            now = self.clock.now()
            for key, request in list(waiting.items()):
                verdict = request.verdict(cluster, now)
                if verdict is None:
                    continue
                del waiting[key]
                run.checkpoints[key] = verdict
                result, why = verdict
                if result == "gone":
                    run.going[key] = f"{why}; not evicted"
                step = next(s for s in steps if s.pod == key)
                self._pod_event(
                    step,
                    "DefragCheckpointed" if result == "checkpointed" else "DefragCheckpointMissed",
                    f"plan {run.plan_id}: {why}",
                    warning=result != "checkpointed",
                )
            if not waiting or self.stop_requested.is_set():
                break
            nearest = min(r.deadline for r in waiting.values())
            self.sleep(
                min(self.settings.poll_interval_s, max(0.001, (nearest - now).total_seconds()))
            )

    def _checkpoint_deadline(self, now: datetime, wait_s: float, run: _Run) -> tuple[datetime, str]:
        """The earliest of the pod's wait, the window's end, and the cycle's deadline less one
        replacement wait (so the drain can still wait for its replacements in the cycle)."""
        limits: list[tuple[datetime | None, str]] = [
            (seconds_from(now, wait_s), f"its wait of {wait_s:g} s"),
            (run.window_end, "the window's end"),
        ]
        left = self.time_left()
        if left is not None:
            reserve = self.settings.replacement_timeout_s + self.settings.poll_interval_s
            limits.append(
                (seconds_from(now, left - reserve), "the cycle's deadline less a replacement wait")
            )
        return earliest(now, limits)

    def _checkpointed(self, outcomes: list[StepOutcome], run: _Run) -> list[StepOutcome]:
        """``outcomes`` with each pod's handshake result; a request left on a pod that was not
        evicted after all (blocked, failed, skipped) is withdrawn."""
        out = []
        for o in outcomes:
            found = run.checkpoints.get(o.pod)
            if found is not None:
                o = replace(o, checkpoint=found[0], checkpoint_detail=found[1])
            if o.pod in run.asked and o.result not in ("evicted", "gone") and not run.lost:
                ns, name = _split(o.pod)
                try:
                    self._guard(f"withdrawing the checkpoint request of {o.pod}")
                    self.actuator.annotate_pod(ns, name, withdrawn())
                except Exception as exc:
                    log.warning("checkpoint request on %s not withdrawn: %s", o.pod, exc)
            out.append(o)
        return out

    def _would_ask(self, outcome: StepOutcome, cluster: Cluster) -> StepOutcome:
        """Dry run: a planned step whose pod supports the handshake says it would be asked."""
        pod = cluster.pods.get(outcome.pod)
        if outcome.result != "planned" or pod is None or not pod.checkpoints_on_request:
            return outcome
        wait = pod_wait(pod, self.settings.checkpoint_wait_s, self.settings.checkpoint_max_wait_s)
        detail = f"would ask for a checkpoint first and wait up to {wait.seconds:g} s"
        return replace(
            outcome,
            checkpoint="would-ask",
            checkpoint_detail=detail + (f" ({wait.note})" if wait.note else ""),
        )

    def _evict_batch(self, batch: list[Step], run: _Run) -> list[StepOutcome]:
        # Pods Terminating by now (in the latest snapshot this run read) are not evicted again:
        # no Eviction API call, and budget spent on them at admission is given back.
        going = {s.pod: run.going[s.pod] for s in batch if s.pod in run.going}
        going.update(_terminating(run.latest, batch))
        late = [s for s in batch if s.pod in going and s.pod not in run.uncharged]
        self.book.refund(self.ledger, [(_namespace(s.pod), s.source) for s in late])
        run.uncharged.update(going)
        run.going.update(going)
        with ThreadPoolExecutor(max_workers=len(batch)) as pool:
            results = list(
                pool.map(
                    lambda s: (
                        EvictionResult(s.pod, "gone", going[s.pod])
                        if s.pod in going
                        else self._evict_one(s, run)
                    ),
                    batch,
                )
            )
        outcomes = []
        for step, result in zip(batch, results, strict=True):
            if step.pod in going:
                why = result.reason
                outcomes.append(
                    StepOutcome(step.pod, step.source, step.target, step.kind, "gone", why)
                )
                self._pod_event(step, "DefragSkipped", f"not evicted: {result.reason}")
                continue
            if result.outcome == "not-leader":
                if not run.lost:
                    run.problems.append(
                        f"lost the Lease while draining {step.source}; the rest of plan "
                        f"{run.plan_id} and the node are left to the new leader"
                    )
                run.lost = True
                outcomes.append(self._skip(step, NOT_LEADER))
                continue
            outcome: StepResult = (
                result.outcome if result.outcome in ("evicted", "blocked", "gone") else "failed"  # type: ignore[assignment]
            )
            outcomes.append(
                StepOutcome(step.pod, step.source, step.target, step.kind, outcome, result.reason)
            )
            if outcome == "evicted":
                self._pod_event(step, "DefragEvicted", _describe(step, done=True))
            else:
                self._pod_event(
                    step, "DefragSkipped", f"eviction {outcome}: {result.reason}", warning=True
                )
        return outcomes

    def _evict_one(self, step: Step, run: _Run) -> EvictionResult:
        ns, name = _split(step.pod)
        if run.lost or not self.fence.still_leader():
            return EvictionResult(step.pod, "not-leader", NOT_LEADER)
        pod = run.cluster.pods.get(step.pod)
        try:
            # The UID seen when planning: a retry, or a late eviction, never hits a same-named
            # replacement (a StatefulSet's next pod): the API server answers 409 instead.
            return self.actuator.evict(ns, name, uid=pod.uid if pod is not None else "")
        except Exception as exc:
            return EvictionResult(step.pod, "failed", str(exc) or type(exc).__name__)

    def _await_replacements(
        self, watched: tuple[str, ...], leaving: tuple[str, ...] = (), run: _Run | None = None
    ) -> tuple[str, ...]:
        """Poll until no watched controller has an unscheduled pod and every ``leaving`` pod
        (Terminating, its GPUs still held) is gone, at most the replacement timeout; return
        the replacements still stuck Pending (a pod still Terminating is a problem of the run,
        not a stuck replacement)."""
        deadline = self.clock.now() + timedelta(seconds=self.settings.replacement_timeout_s)
        while True:
            self.sleep(self.settings.poll_interval_s)
            cluster = self.source.snapshot()
            pending = pending_of(cluster, watched)
            still = [p for p in leaving if p in cluster.pods]
            if not pending and not still and self.confirm is not None:
                pending = pending_of(self.confirm.snapshot(), watched)
            if run is not None:
                run.latest = cluster
            if not pending and not still:
                return ()
            if self.stop_requested.is_set():
                return ()  # shutting down: not a verdict on the replacements
            if self.clock.now() >= deadline:
                if still and run is not None:
                    run.problems.append(
                        f"still Terminating {self.settings.replacement_timeout_s:g} s later: "
                        + ", ".join(still)
                    )
                return pending

    def _await_reservations(self, run: _Run, outcomes: Sequence[StepOutcome]) -> None:
        """Keep each reservation until its pod is bound (or gone) or it outlives the timeout.

        A room whose evictions did not all go through is released at once: the pod may not
        fit there, and nothing else should be kept off the node for it.
        """
        freed = {o.pod for o in outcomes if o.result in ("evicted", "gone")}
        for node, res in list(run.reserved.items()):
            missed = [p for p in run.rooms.get(node, ()) if p not in freed]
            if missed:
                self.release(res, f"room not made, not evicted: {', '.join(missed)}", run)
        timeout = timedelta(seconds=self.settings.replacement_timeout_s)
        while run.reserved and not self.stop_requested.is_set():
            self.sleep(self.settings.poll_interval_s)
            cluster = self.source.snapshot()
            run.latest = cluster
            now = self.clock.now()
            for res in list(run.reserved.values()):
                why = res.verdict(cluster, now, timeout)
                if why:
                    self.release(res, why, run)

    def _reserve(self, res: Reservation, pods: list[str], why: str, run: _Run) -> None:
        """Write ``res`` (fenced), kept until released; ``pods``: the evictions it depends on."""
        self._guard(f"reserving {res.node}")
        self.actuator.annotate_node(res.node, res.annotations())
        run.reserved[res.node] = res
        run.rooms[res.node] = pods
        self.event(EVENT_KIND_NODE, "", res.node, "DefragReserved", f"plan {run.plan_id}: {why}")

    def _release_seats(self, run: _Run, outcomes: Sequence[StepOutcome]) -> None:
        """After a drain: the seats whose moves did not go through, or whose replacements are
        bound (in the latest snapshot), are released now, so the next drain can seat its own
        replacements there; the others wait in :meth:`_await_reservations`. Not ours any more
        once the Lease is lost: the new leader's reconcile releases them."""
        if run.lost or not self.fence.still_leader():
            return
        freed = {o.pod for o in outcomes if o.result in ("evicted", "gone")}
        timeout = timedelta(seconds=self.settings.replacement_timeout_s)
        now = self.clock.now()
        for target, seat in list(run.reserved.items()):
            moved_here = [o.pod for o in outcomes if o.target == target]
            if not seat.owners or not moved_here:
                continue
            missed = [p for p in moved_here if p not in freed]
            # The drain has waited for its replacements (scheduled, or the breaker tripped): the
            # seat has served either way, whatever the clocks of creationTimestamp say.
            why = (
                f"move not made, not evicted: {', '.join(missed)}"
                if missed
                else seat.verdict(run.latest, now, timeout)
                or "the drain's replacements were waited for"
            )
            self.release(seat, why, run)

    def _release_stale(self, cluster: Cluster) -> None:
        """Remove reservations left by an earlier run whose release failed, once they are done."""
        timeout = timedelta(seconds=self.settings.replacement_timeout_s)
        now = self.clock.now()
        for node in cluster.nodes:
            res = read_reservation(node)
            if res is not None:
                why = res.verdict(cluster, now, timeout)
                if why:
                    self.release(res, why, None)

    def release(self, res: Reservation, why: str, run: _Run | None = None) -> str:
        """Remove ``res`` from its node (fenced); the problem when that failed, else ""."""
        if run is not None:
            run.reserved.pop(res.node, None)
        try:
            self._guard(f"releasing the reservation of {res.node}")
            self.actuator.annotate_node(res.node, released())
        except Exception as exc:
            problem = f"could not remove the reservation of {res.node} for {res.pod}: {exc}"
            if run is not None:
                run.problems.append(problem)
            log.error(problem)
            return problem
        self.event(
            EVENT_KIND_NODE,
            "",
            res.node,
            "DefragReservationReleased",
            f"room no longer kept for {res.pod}: {why}",
        )
        return ""

    def _untaint(self, node: str, run: _Run) -> None:
        if run.lost:
            return  # not ours any more: the new leader reconciles the node
        problem = self.clear_drain(node, self.settings.untaint_attempts)
        if problem:
            run.problems.append(problem)
            run.untaint_failed[node] = problem
            log.error(problem)

    def clear_drain(self, node: str, attempts: int) -> str:
        """Remove the drain taint and the journal, ``attempts`` tries with doubling backoff;
        the problem when the taint is still on (or the journal could not be cleared), else ""."""
        delay = self.settings.untaint_backoff_s
        problem = ""
        for attempt in range(max(1, attempts)):
            if attempt:
                self.sleep(delay)
                delay *= 2
            try:
                self._guard(f"untainting {node}")
                self.actuator.untaint_node(node, DRAIN_TAINT_KEY)
                self.actuator.annotate_node(node, cleared())
                return ""
            except LostLeadership as exc:
                return f"{exc}; the drain taint stays on {node} for the new leader"
            except Exception as exc:
                problem = (
                    f"could not remove the drain taint {DRAIN_TAINT_KEY} from {node} "
                    f"({attempt + 1} tries; retried every cycle): {exc}"
                )
        return problem

    def _guard(self, what: str) -> None:
        """Raise :class:`LostLeadership` unless this replica still leads (before a write)."""
        if not self.fence.still_leader():
            raise LostLeadership(f"not the leader any more before {what}")

    # --- reporting -------------------------------------------------------------------------

    def _findings(self, plan: Plan, run: _Run, outcomes: list[StepOutcome]) -> list[Finding]:
        failed = [o for o in outcomes if o.result == "failed"]
        if not (run.stuck or failed or run.problems):
            return []
        now = self.clock.now()
        parts = []
        if run.stuck:
            parts.append(f"replacements stuck Pending: {', '.join(sorted(run.stuck))}")
        if failed:
            parts.append(f"{len(failed)} eviction(s) failed")
        parts += run.problems
        findings = [
            node_finding(node, problem, now) for node, problem in sorted(run.untaint_failed.items())
        ]
        findings += [
            Finding(
                kind="execution-failed",
                subject="cluster",
                severity="critical",
                summary=f"plan {plan.id}: " + "; ".join(parts),
                evidence={
                    "plan_id": plan.id,
                    "stuck": sorted(run.stuck),
                    "failed": [o.to_dict() for o in failed],
                    "problems": list(run.problems),
                },
                since=now,
                labels={"detector": "executor"},
            )
        ]
        if self.breaker.state.open:
            findings.append(self.breaker.state.finding())
        return findings

    def _skip(self, step: Step, reason: str) -> StepOutcome:
        outcome = _skipped(step, reason)
        self._event_for(outcome, "DefragSkipped", f"not evicted: {reason}")
        return outcome

    def _event_for(self, outcome: StepOutcome, reason: str, message: str) -> None:
        ns, name = _split(outcome.pod)
        self.event(EVENT_KIND_POD, ns, name, reason, message)

    def _pod_event(self, step: Step, reason: str, message: str, warning: bool = False) -> None:
        ns, name = _split(step.pod)
        self.event(EVENT_KIND_POD, ns, name, reason, message, warning)

    def event(
        self,
        kind: str,
        namespace: str,
        name: str,
        reason: str,
        message: str,
        warning: bool = False,
    ) -> None:
        try:
            self.actuator.event(kind, namespace, name, reason, message, warning)
        except Exception as exc:
            log.warning("event %s on %s %s/%s not sent: %s", reason, kind, namespace, name, exc)


@dataclass(slots=True)
class _Run:
    plan_id: str
    cluster: Cluster
    latest: Cluster
    """The newest snapshot this run has read (the plan's, then each wait's)."""
    uncharged: set[str] = field(default_factory=set)
    """Steps' pods that spent no budget: Terminating when admitted, or refunded."""
    going: dict[str, str] = field(default_factory=dict)
    """Steps' pods found Terminating (→ why they are not evicted): never evicted, waited for."""
    stuck: set[str] = field(default_factory=set)
    stopped: bool = False
    problems: list[str] = field(default_factory=list)
    reserved: dict[str, Reservation] = field(default_factory=dict)
    """Node → the reservation this run set on it and has not released yet."""
    rooms: dict[str, list[str]] = field(default_factory=dict)
    """Node → the pods whose eviction makes the reserved room there."""
    lost: bool = False
    """The fence said this replica no longer leads: nothing more is written."""
    untaint_failed: dict[str, str] = field(default_factory=dict)
    """Node → why its drain taint could not be removed."""
    window_end: datetime | None = None
    checkpoints: dict[str, tuple[str, str]] = field(default_factory=dict)
    """Pod → how its checkpoint handshake ended (result, why)."""
    asked: set[str] = field(default_factory=set)
    """Pods carrying a checkpoint request this run wrote."""


def _until(window: WindowStatus, now: datetime) -> datetime | None:
    """Until when a window opening's spend must be kept: its end; the UTC day's end for the
    day's make-room-now budget (no end of its own); None for an opening that never ends."""
    if window.end is not None:
        return window.end
    if window.budget_key:
        day = utc(now).date()
        return datetime(day.year, day.month, day.day, tzinfo=UTC) + timedelta(days=1)
    return None


def _no_deadline() -> float | None:
    return None


def node_finding(node: str, problem: str, now: datetime) -> Finding:
    """A node whose drain taint (or journal) would not come off: reported every cycle until it
    does, under one fingerprint, so its alert does not resolve while the node stays tainted."""
    return Finding(
        kind="execution-failed",
        subject=f"node/{node}",
        severity="critical",
        summary=f"{node}: {problem}",
        evidence={"node": node, "problem": problem},
        since=now,
        labels={"detector": "executor", "node": node},
    )


def _seats(node: str, steps: Iterable[Step], run: _Run) -> dict[str, tuple[str, ...]]:
    """Target node → the owners whose replacements a seat there keeps room for: the moves of
    ``steps`` (a migration to another node, of a pod with a controller that makes a
    replacement) to a node nobody has reserved (this run, another pod, a person)."""
    seats: dict[str, set[str]] = {}
    for step in steps:
        pod = run.cluster.pods.get(step.pod)
        if (
            step.kind != "migrate"
            or not step.target
            or step.target == node
            or step.target in run.reserved
            or pod is None
            or pod.owner is None
            or pod.owner.kind in ("Node", "DaemonSet")
        ):
            continue
        target = _node(run.latest, step.target)
        if target is None or target.annotations.get(RESERVED_FOR_ANNOTATION, "").strip():
            continue
        seats.setdefault(step.target, set()).add(owner_holder(pod.namespace, pod.owner))
    return {target: tuple(sorted(owners)) for target, owners in seats.items()}


def _node(cluster: Cluster, name: str) -> Node | None:
    row = cluster.arrays.index.get(name)
    return cluster.nodes[row] if row is not None else None


def _terminating(cluster: Cluster, steps: Iterable[Step]) -> dict[str, str]:
    """The steps' pods that ``cluster`` shows Terminating (``metadata.deletionTimestamp``), each
    with the reason it is not evicted."""
    out = {}
    for step in steps:
        pod = cluster.pods.get(step.pod)
        if pod is not None and pod.deleting_since is not None:
            since = pod.deleting_since.strftime("%Y-%m-%dT%H:%M:%SZ")
            out[step.pod] = (
                f"terminating: being deleted since {since}, already going; not evicted, no "
                "budget spent"
            )
    return out


def _skipped(step: Step, reason: str) -> StepOutcome:
    return StepOutcome(step.pod, step.source, step.target, step.kind, "skipped", reason)


def _units(steps: Iterable[Step]) -> list[list[Step]]:
    """Steps grouped by gang (a lone pod is its own unit), in plan order."""
    units: dict[str, list[Step]] = {}
    for step in steps:
        units.setdefault(f"gang:{step.gang}" if step.gang else f"pod:{step.pod}", []).append(step)
    return list(units.values())


def _by_source(steps: Iterable[Step]) -> dict[str, list[Step]]:
    out: dict[str, list[Step]] = {}
    for step in steps:
        out.setdefault(step.source, []).append(step)
    return out


def _batches(steps: list[Step], size: int) -> Iterable[list[Step]]:
    for i in range(0, len(steps), size):
        yield steps[i : i + size]


def _count(outcomes: Iterable[StepOutcome]) -> dict[str, int]:
    counts: dict[str, int] = {}
    for o in outcomes:
        counts[o.result] = counts.get(o.result, 0) + 1
    return counts


def _split(key: str) -> tuple[str, str]:
    ns, _, name = key.partition("/")
    return (ns, name) if name else ("default", ns)


def _namespace(key: str) -> str:
    return _split(key)[0]


def _owner_key(cluster: Cluster, pod_key: str) -> str | None:
    pod: Pod | None = cluster.pods.get(pod_key)
    if pod is None or pod.owner is None:
        return None
    return controller_key(pod.namespace, pod.owner.kind, pod.owner.name)


def _describe(step: Step, done: bool = False) -> str:
    verb = "evicted" if done else "evict"
    where = f"; expected on {step.target}" if step.target else "; it will wait (preempted)"
    return f"{verb} from {step.source}{where}: {step.reason}"
