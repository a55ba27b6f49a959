"""The daemon: cycles on a schedule, windows on their cron, leader election, health and metrics.

:class:`Daemon` runs :func:`~defrag.daemon.cycle.run_cycle` from an APScheduler job every
``cycle_interval_s`` and once more at every window opening (so execution starts when the
window does, not up to one interval later). It serves ``/healthz`` (the process answers
and no cycle has run past its deadline), ``/readyz`` (the last cycle succeeded within
``ready_age_limit_s`` and every rule could be evaluated) and ``/metrics``. A cycle past its
deadline also stops the Lease renewals, so another replica takes over. SIGTERM sets the
executor's stop flag (the current step finishes, its taint comes off), stops the scheduler,
gives up the Lease and closes the server, waiting at most ``stop_grace_s`` for a running cycle;
whatever else the stop or the exit waits on, the process ends by ``stop_grace_s`` +
:data:`STOP_SLACK_S`, with every thread's stack on stderr.
"""

from __future__ import annotations

import faulthandler
import json
import logging
import signal
import sys
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Protocol

from apscheduler.schedulers.background import BackgroundScheduler
from apscheduler.triggers.interval import IntervalTrigger
from prometheus_client import REGISTRY, CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.exposition import generate_latest

from defrag.adapters.deadline import time_budget
from defrag.adapters.health import HealthServer, Probes
from defrag.adapters.kube import KubeError
from defrag.adapters.prometheus import MetricsError
from defrag.adapters.stop_signal import StopSignal
from defrag.alerting import ALERTS
from defrag.daemon.cycle import CyclePorts, CycleResult, run_cycle
from defrag.decide import CycleConfig
from defrag.detection import NO_METRICS_SOURCE
from defrag.execute.checkpoint import CHECKPOINT_RESULTS
from defrag.execute.fence import Fence
from defrag.execute.outcome import ReconcileOutcome
from defrag.execute.reconcile import Reconciler
from defrag.model.status import Status
from defrag.plan.recent import NONE as NO_EVICTIONS
from defrag.redact import redact_text

log = logging.getLogger(__name__)


class Elector(Protocol):
    """Leader election (the Kubernetes adapter's LeaseElector, or always-leader).

    Called from two threads at once — the cycle's leader check (and the executor's fence) and
    the renewal job (:meth:`Daemon._tick_elector`) — so an implementation serialises its own
    reads and writes: a replica racing itself on the Lease would lose it to itself."""

    def is_leader(self) -> bool: ...

    def release(self) -> None: ...


STOP_SLACK_S = 10.0
"""Seconds past ``stop_grace_s`` after which a process told to stop ends whatever it still waits
on (the Lease's release, the HTTP server, a thread that will not be joined): exit status 1, every
thread's stack on stderr. 10 + 10 s stays inside Kubernetes' default grace period of 30 s."""


class AlwaysLeader:
    """A single replica, or the simulated cluster: always the leader."""

    def is_leader(self) -> bool:
        return True

    def release(self) -> None:
        return None


class DaemonMetrics:
    """The daemon's own series, on a registry of its own (several daemons may share a process)."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        r = self.registry
        self.free_gpus = Gauge("defrag_free_gpus", "Whole free GPUs in the cluster.", registry=r)
        self.stranded = Gauge(
            "defrag_stranded_gpus", "Free GPUs no job of this size can use.", ["size"], registry=r
        )
        self.whole_free_nodes = Gauge(
            "defrag_whole_free_nodes", "GPU nodes with every GPU free.", registry=r
        )
        self.largest_job = Gauge(
            "defrag_largest_placeable_job_gpus", "The largest GPU job that fits now.", registry=r
        )
        self.fgd_pct = Gauge(
            "defrag_fgd_fragmentation_pct_of_idle",
            "FGD fragmentation, % of idle GPUs.",
            registry=r,
        )
        self.findings = Gauge(
            "defrag_findings", "Findings in the last cycle.", ["kind"], registry=r
        )
        self.plan_steps = Gauge(
            "defrag_plan_steps", "Steps in the last plan.", ["kind"], registry=r
        )
        self.held_back = Gauge(
            "defrag_make_room_held_back",
            "Starved pods the last cycle made no room for because the scheduler packs.",
            registry=r,
        )
        self.rooms = Gauge(
            "defrag_plan_rooms",
            "Rooms the last plan makes by evictions: their count, what they are worth and what "
            "they cost (GPU-hours; docs/planning.md, what a room is worth).",
            ["measure"],
            registry=r,
        )
        self.evictions = Counter(
            "defrag_evictions", "Evictions by result (planned = dry run).", ["result"], registry=r
        )
        self.checkpoints = Counter(
            "defrag_checkpoint_requests",
            "Checkpoint handshakes before an eviction, by result (checkpointed, "
            "deadline-passed, gone, request-failed; would-ask = dry run).",
            ["result"],
            registry=r,
        )
        self.cycles = Counter("defrag_cycles", "Cycles run, by outcome.", ["outcome"], registry=r)
        self.cycle_seconds = Histogram(
            "defrag_cycle_duration_seconds",
            "Wall time of one cycle.",
            registry=r,
            buckets=(0.1, 0.5, 1, 2, 5, 10, 30, 60, 120, 300),
        )
        self.last_success = Gauge(
            "defrag_last_success_timestamp_seconds", "When the last cycle succeeded.", registry=r
        )
        self.circuit_open = Gauge(
            "defrag_circuit_open", "1 while the circuit breaker stops execution.", registry=r
        )
        self.leader = Gauge("defrag_leader", "1 when this replica holds the Lease.", registry=r)
        self.window_open = Gauge(
            "defrag_window_open", "1 while an execution window is open.", registry=r
        )
        self.unmodelled = Gauge(
            "defrag_unmodelled_objects",
            "Objects of the last observed cluster left out or counted conservatively "
            "(unknown GPU resource shapes, unreadable objects; named in the log).",
            registry=r,
        )
        self.rule_skipped = Gauge(
            "defrag_rule_skipped",
            "1 while a detection rule is skipped: its queries return no series or its labels "
            "match nothing (the reason is logged and shown by `defrag detect`).",
            ["rule"],
            registry=r,
        )
        self.rule_failures = Counter(
            "defrag_rule_evaluation_failures",
            "Cycles in which a detection rule could not be evaluated (Prometheus unreachable, "
            "past its deadline, or a wrong answer); its alerts were held as they were.",
            ["rule"],
            registry=r,
        )
        self.rule_failing = Gauge(
            "defrag_rule_evaluation_failing",
            "1 while a detection rule cannot be evaluated (the reason is logged and in /readyz).",
            ["rule"],
            registry=r,
        )
        self.cycle_overdue = Gauge(
            "defrag_cycle_overdue",
            "1 while a cycle runs past its deadline (/healthz fails, the Lease is not renewed).",
            registry=r,
        )
        self._skipped: dict[str, str] = {}
        self._failing: dict[str, str] = {}
        for finding_kind in ALERTS.kinds():  # every registered detector's, and the daemon's
            self.findings.labels(kind=finding_kind).set(0)
        for step_kind in ("migrate", "preempt"):
            self.plan_steps.labels(kind=step_kind).set(0)
        for checkpoint in CHECKPOINT_RESULTS:  # each result on /metrics from the start, at 0
            self.checkpoints.labels(result=checkpoint)

    def record(self, result: CycleResult, wall_s: float) -> None:
        before = result.before
        self.free_gpus.set(before.get("free_gpus", 0))
        for size, n in dict(before.get("stranded", {})).items():
            self.stranded.labels(size=str(size)).set(n)
        self.whole_free_nodes.set(before.get("whole_free_nodes", 0))
        self.largest_job.set(before.get("largest_placeable_job", 0))
        self.fgd_pct.set(before.get("fgd_frag_pct_of_idle", 0.0))
        self.unmodelled.set(len(result.warnings))
        counts: dict[str, int] = {}
        for f in result.findings:
            counts[f.kind] = counts.get(f.kind, 0) + 1
        for kind in list(_label_values(self.findings)) + list(counts):
            self.findings.labels(kind=kind).set(counts.get(kind, 0))
        self.held_back.set(len(result.held_back))
        steps = result.plan.steps if result.plan else ()
        for kind in ("migrate", "preempt"):
            self.plan_steps.labels(kind=kind).set(sum(1 for s in steps if s.kind == kind))
        rooms = result.plan.rooms if result.plan else ()
        self.rooms.labels(measure="count").set(len(rooms))
        self.rooms.labels(measure="value_gpu_hours").set(sum(r.value for r in rooms))
        self.rooms.labels(measure="cost_gpu_hours").set(sum(r.cost for r in rooms))
        if result.executed is not None:
            for outcome in result.executed.outcomes:
                self.evictions.labels(result=outcome.result).inc()
                if outcome.checkpoint:
                    self.checkpoints.labels(result=outcome.checkpoint).inc()
        self.record_rule_failures(result.rule_failures)
        self.record_skipped(result.rules_skipped)
        self.cycles.labels(outcome="degraded" if result.degraded else "success").inc()
        self.cycle_seconds.observe(wall_s)
        if not result.degraded:
            self.last_success.set(time.time())
        self.circuit_open.set(1 if result.circuit.get("open") else 0)
        self.leader.set(1 if result.leader else 0)
        # a configured window; make-room-now runs outside them (its budget_key says so)
        configured = result.window.open and not result.window.budget_key
        self.window_open.set(1 if configured else 0)

    def record_skipped(self, skipped: Mapping[str, str]) -> None:
        """The rules the last detection skipped, with why: the gauge for each, and a log line
        when a rule starts being skipped (or its reason changes) and when it runs again."""
        for rule, reason in skipped.items():
            if self._skipped.get(rule) != reason:
                # No Prometheus configured is a choice, said once at INFO; a configured source
                # that returns nothing is a missing input, said at WARNING.
                level = logging.INFO if reason == NO_METRICS_SOURCE else logging.WARNING
                log.log(level, "rule %s skipped: %s", rule, reason)
            self.rule_skipped.labels(rule=rule).set(1)
        for rule in set(self._skipped) - set(skipped):
            log.info("rule %s runs again: its inputs are back", rule)
            self.rule_skipped.labels(rule=rule).set(0)
        self._skipped = dict(skipped)

    def record_rule_failures(self, failures: Mapping[str, str]) -> None:
        """The rules the last cycle could not evaluate: counted, flagged, logged when a rule
        starts failing (or its reason changes) and when it is evaluated again."""
        for rule, reason in failures.items():
            if self._failing.get(rule) != reason:
                log.error("rule %s could not be evaluated (alerts held): %s", rule, reason)
            self.rule_failures.labels(rule=rule).inc()
            self.rule_failing.labels(rule=rule).set(1)
        for rule in set(self._failing) - set(failures):
            log.warning("rule %s is evaluated again", rule)
            self.rule_failing.labels(rule=rule).set(0)
        self._failing = dict(failures)

    def failed(self, wall_s: float) -> None:
        self.cycles.labels(outcome="failure").inc()
        self.cycle_seconds.observe(wall_s)

    def exposition(self) -> bytes:
        """This daemon's series, then the process-wide ones (alert sends, Python runtime)."""
        return generate_latest(self.registry) + generate_latest(REGISTRY)


def _label_values(gauge: Gauge) -> list[str]:
    return [s.labels["kind"] for m in gauge.collect() for s in m.samples]


@dataclass(frozen=True, slots=True)
class HealthState:
    last_success: datetime | None = None
    last_error: str = ""
    last_result: CycleResult | None = None


class Daemon:
    """Wires the ports, the cycle, the schedule, the HTTP endpoints and the signals together."""

    def __init__(
        self,
        ports: CyclePorts,
        config: CycleConfig,
        *,
        cycle_interval_s: float = 300.0,
        ready_age_limit_s: float = 900.0,
        elector: Elector | None = None,
        time_scale: float = 1.0,
        http_host: str = "127.0.0.1",
        http_port: int = 0,
        elector_interval_s: float = 5.0,
        cycle_deadline_s: float | None = None,
        stop_grace_s: float = 10.0,
    ) -> None:
        self.ports = ports
        self.config = config
        self.cycle_interval_s = cycle_interval_s
        self.ready_age_limit_s = ready_age_limit_s
        self.elector = elector or AlwaysLeader()
        self.time_scale = time_scale
        """Simulated seconds per real second (the simulated cluster runs faster)."""
        self.metrics = DaemonMetrics()
        self.health = HealthState()
        self.stopped = threading.Event()
        self._cycle_lock = threading.Lock()
        self._scheduler: BackgroundScheduler | None = None
        self._server: HealthServer | None = None
        self._http = (http_host, http_port)
        self.elector_interval_s = elector_interval_s
        self.cycle_deadline_s = (
            cycle_deadline_s if cycle_deadline_s is not None else ready_age_limit_s
        )
        """Clock seconds one cycle may take; past it /healthz fails and the Lease lapses."""
        self.stop_grace_s = stop_grace_s
        """Real seconds SIGTERM waits for a running cycle before the process goes anyway."""
        self._cycle_started: float | None = None  # time.monotonic() of the running cycle
        self._reconciled = False
        self._leading = False
        """Whether the last cycle ran as the leader (a change hands the alerts over)."""
        if isinstance(self.elector, Fence):
            # Leadership is re-checked before every write, not only once per cycle.
            if ports.executor is not None:
                ports.executor.fence = self.elector
            if ports.unmodelled is not None:
                ports.unmodelled.fence = self.elector
        self.on_cycle: Callable[[CycleResult], None] | None = None

    # --- one cycle -------------------------------------------------------------------------

    def run_once(self) -> CycleResult:
        """One cycle, recorded in metrics and health. Errors are recorded, then re-raised."""
        with self._cycle_lock:
            t0 = time.perf_counter()
            self._cycle_started = time.monotonic()
            # Every request of the cycle (API server, Prometheus, Alertmanager) ends by the
            # cycle's deadline: a trickling answer cannot hold the cycle past it.
            limit = self.cycle_deadline_s / self.time_scale
            try:
                with time_budget(limit, f"the cycle's deadline of {limit:g} s"):
                    if not self._reconciled:
                        self.reconcile()
                    leader = self.elector.is_leader()
                    if leader and not self._leading and self.ports.alerts is not None:
                        self.ports.alerts.take_over()
                    self._leading = leader
                    last = self.health.last_result
                    result = run_cycle(
                        self.ports,
                        self.config,
                        leader=leader,
                        last_packing=last.packing if last is not None else None,
                        evicted=last.evicted if last is not None else NO_EVICTIONS,
                        opened_early=last.opened_early if last is not None else None,
                    )
            except Exception as exc:
                self.metrics.failed(time.perf_counter() - t0)
                self.health = HealthState(
                    self.health.last_success,
                    redact_text(f"{type(exc).__name__}: {exc}"),
                    self.health.last_result,
                )
                raise
            finally:
                self._cycle_started = None
                self.metrics.cycle_overdue.set(0)
            self.metrics.record(result, time.perf_counter() - t0)
            self.health = HealthState(result.finished, "", result)
        log.info(
            "%s",
            cycle_summary(result),
            extra={
                "fields": {
                    "leader": result.leader,
                    "findings": len(result.findings),
                    "steps": len(result.plan.steps) if result.plan else 0,
                    "executed": result.executed.counts if result.executed else None,
                    "window": result.window.reason,
                }
            },
        )
        if self.on_cycle is not None:
            self.on_cycle(result)
        return result

    def reconcile(self) -> tuple[ReconcileOutcome, ...]:
        """Finish or roll back what a previous run left on the nodes (leader, not dry run).

        Runs once, before the first cycle in which this replica leads: at start, or when it
        takes over from a leader that died mid-drain. Errors propagate (the cycle fails and
        the next one tries again).
        """
        executor = self.ports.executor
        if executor is None or not executor.mode.reconciles:
            self._reconciled = True
            return ()
        if not self.elector.is_leader():
            return ()
        outcomes = Reconciler(executor).reconcile()
        self._reconciled = True
        for o in outcomes:
            log.warning("reconciled node %s: plan %s %s", o.node, o.plan_id, o.action)
        return outcomes

    @property
    def cycle_running(self) -> bool:
        return self._cycle_started is not None

    def live(self) -> Status:
        """Liveness: failed while a cycle runs past its deadline (a wedged daemon)."""
        started = self._cycle_started
        if started is None:
            return Status.success()
        elapsed = time.monotonic() - started
        limit = self.cycle_deadline_s / self.time_scale
        if elapsed <= limit:
            return Status.success()
        self.metrics.cycle_overdue.set(1)
        return Status.fail(
            f"a cycle has been running for {elapsed:.0f} s, past its deadline of {limit:.0f} s"
        )

    def ready(self) -> Status:
        """Readiness: a recent good cycle, and every rule evaluated in the last one."""
        last_result = self.health.last_result
        failing = dict(last_result.rule_failures) if last_result is not None else {}
        if failing and not self.health.last_error:
            return Status.fail(
                *(f"rule {rule} could not be evaluated: {why}" for rule, why in failing.items())
            )
        last = self.health.last_success
        if last is None:
            return Status.fail("no cycle has succeeded yet" + _suffix(self.health.last_error))
        age = (self.ports.clock.now() - last).total_seconds()
        if age > self.ready_age_limit_s:
            return Status.fail(
                f"last good cycle {age:.0f} s ago (limit {self.ready_age_limit_s:.0f} s)"
                + _suffix(self.health.last_error)
            )
        return Status.success()

    # --- running -------------------------------------------------------------------------

    def start(self) -> None:
        """Serve HTTP and schedule cycles (the first one now) in background threads."""
        self._serve_http()
        scheduler = BackgroundScheduler(timezone="UTC")
        interval = self.cycle_interval_s / self.time_scale
        scheduler.add_job(
            self._safe_cycle,
            IntervalTrigger(seconds=interval),
            id="cycle",
            max_instances=1,
            coalesce=True,
            next_run_time=datetime.now().astimezone(),
        )
        scheduler.add_job(
            self._tick_elector,
            IntervalTrigger(seconds=self.elector_interval_s),
            id="lease",
            max_instances=1,
            coalesce=True,
        )
        if self.time_scale == 1.0:
            for i, window in enumerate(self.config.windows):
                scheduler.add_job(
                    self._safe_cycle,
                    window.trigger(),
                    id=f"window-{i}",
                    max_instances=1,
                    coalesce=True,
                )
        scheduler.start()
        self._scheduler = scheduler

    def stop(self) -> None:
        """Finish the current step, take taints off, stop scheduling, release the Lease.

        Waits at most ``stop_grace_s`` for a running cycle (one stuck on a dead dependency
        must not hold the process past its termination grace period); ``cycle_running`` then
        says whether it was left behind.
        """
        if self.ports.executor is not None:
            self.ports.executor.stop_requested.set()
        if self._scheduler is not None:
            self._scheduler.shutdown(wait=False)
            self._scheduler = None
        if self._cycle_lock.acquire(timeout=self.stop_grace_s):
            self._cycle_lock.release()
        else:
            log.error(
                "a cycle is still running %.0f s after the stop request; stopping without it",
                self.stop_grace_s,
            )
        try:
            self.elector.release()
        except Exception:  # the API server may be the reason we are stuck
            log.exception("could not release the Lease; it lapses by itself")
        if self._server is not None:
            self._server.stop()
            self._server = None
        self.stopped.set()

    def serve_forever(self) -> None:
        """Run until SIGTERM or SIGINT, then :meth:`stop`; the process ends by ``stop_grace_s``
        + :data:`STOP_SLACK_S` after the first signal whatever the stop waits on.

        The handler only records the signal (:class:`~defrag.adapters.stop_signal.StopSignal`:
        a handler that took a lock, as logging and starting a thread do, could deadlock the
        main thread, and one stuck so never armed the watchdog); the main thread, waiting in
        slices, sees it, arms the watchdog, logs and stops."""
        sigterm = StopSignal().install(signal.SIGTERM, signal.SIGINT)
        self.start()
        signum = sigterm.wait(self.stopped)
        if signum is None:  # stopped by a call to stop(), not by a signal
            return
        # The last resort first, from a thread of faulthandler's own (no Python lock can hold
        # it; a stderr that blocks the log line below cannot keep it from being armed): past
        # the bound, every thread's stack goes to stderr and the process exits 1.
        faulthandler.dump_traceback_later(self.stop_grace_s + STOP_SLACK_S, exit=True)
        log.warning("signal %d: finishing the current step and stopping", signum)
        self.stop()

    @property
    def http_address(self) -> tuple[str, int]:
        if self._server is None:
            raise RuntimeError("the HTTP server is not running")
        host, port = self._server.server_address[:2]
        return str(host), int(port)

    def _tick_elector(self) -> None:
        """Renew (or try to take) the Lease between cycles, so it never lapses while we lead.

        Not while a cycle runs past its deadline: a wedged leader lets its Lease lapse so
        another replica takes over (its own writes are fenced by the same Lease).
        """
        liveness = self.live()
        if not liveness.ok:
            log.error("not renewing the Lease: %s", liveness)
            self.metrics.leader.set(0)
            return
        try:
            self.metrics.leader.set(1 if self.elector.is_leader() else 0)
        except Exception:
            log.exception("leader election failed")

    def _safe_cycle(self) -> None:
        try:
            self.run_once()
        except EXPECTED_FAILURES as exc:  # the outside failed: one line with the reason
            log.error("cycle failed: %s", redact_text(f"{type(exc).__name__}: {exc}"))
        except Exception:  # a defect: the traceback is what a bug report needs
            log.exception("cycle failed")

    def _serve_http(self) -> None:
        probes = Probes(self.metrics.exposition, live=self.live, ready=self.ready)
        self._server = HealthServer(self._http, probes, logger=log).start("defrag-http")


EXPECTED_FAILURES: tuple[type[BaseException], ...] = (KubeError, MetricsError, TimeoutError)
"""What a cycle may fail with when the outside fails — the API server (its errors after the
retries, a stale watched view), Prometheus, a deadline — as opposed to a defect."""


def _suffix(error: str) -> str:
    return f"; last error: {error}" if error else ""


class JsonFormatter(logging.Formatter):
    """One JSON object per line: time, level, logger, message and any ``extra={"fields": …}``."""

    def format(self, record: logging.LogRecord) -> str:
        out: dict[str, Any] = {
            "time": datetime.fromtimestamp(record.created).astimezone().isoformat(),
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
        }
        fields = getattr(record, "fields", None)
        if isinstance(fields, dict):
            out.update(fields)
        if record.exc_info:
            out["exception"] = self.formatException(record.exc_info)
        return json.dumps(out, default=str)


def cycle_summary(result: CycleResult) -> str:
    """One log line that says what a cycle did: findings, plan, execution, window."""
    kinds: dict[str, int] = {}
    for f in result.findings:
        kinds[f.kind] = kinds.get(f.kind, 0) + 1
    findings = ", ".join(f"{n} {k}" for k, n in sorted(kinds.items())) or "none"
    if result.plan is None:
        plan = "no plan"
    else:
        plan = f"plan {len(result.plan.steps)} step(s), {len(result.plan.blocked)} blocked"
    if result.executed is None:
        executed = "executed nothing"
    else:
        counts = ", ".join(f"{n} {r}" for r, n in result.executed.counts.items())
        executed = f"executed: {counts or 'nothing'}"
    if result.held_back:
        plan += f"; {len(result.held_back)} starved pod(s) held back: the scheduler packs"
    role = "leader" if result.leader else "follower"
    mode = result.mode.name
    return (
        f"cycle ({role}, {mode}): findings {findings}; {plan}; {executed}; "
        f"window: {result.window.reason}"
    )


# Client libraries whose INFO lines say nothing an operator needs (job added, request sent).
_CHATTY = ("apscheduler", "kubernetes", "urllib3", "matplotlib", "requests")


class _StderrHandler(logging.StreamHandler):
    """Writes to whatever ``sys.stderr`` is when a record is emitted, not the stream of the
    moment it was made (so a replaced and closed stderr never swallows a line)."""

    def __init__(self) -> None:
        super().__init__(sys.stderr)

    @property
    def stream(self) -> Any:
        return sys.stderr

    @stream.setter
    def stream(self, value: Any) -> None:
        pass

    def format(self, record: logging.LogRecord) -> str:
        """The line with every URL's credentials masked (a library's message names the URL
        it failed on, query string included)."""
        return redact_text(super().format(record))


def configure_logging(fmt: str = "text", level: str = "INFO") -> None:
    """defrag's own lines at ``level``; the libraries' at WARNING unless ``level`` is DEBUG."""
    for name in _CHATTY:
        logging.getLogger(name).setLevel(logging.DEBUG if level == "DEBUG" else logging.WARNING)
    handler = _StderrHandler()
    if fmt == "json":
        handler.setFormatter(JsonFormatter())
    else:
        handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level)
