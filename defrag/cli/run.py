"""``defrag run``: the daemon, or one cycle (``defrag demo`` is in :mod:`defrag.cli.demo`).

This module is the composition root: it turns :class:`~defrag.settings.Settings` into the
ports (Kubernetes or the simulated cluster, Prometheus, Alertmanager, the Lease), the detector,
the planner and the executor, and hands them to :class:`~defrag.daemon.service.Daemon`.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer
from rich.markup import escape

from defrag.adapters.heap import keep_heap_small
from defrag.cli.app import Output, OutputOpt, UserError, app, print_data, print_line
from defrag.cli.exitcodes import ExitCode
from defrag.redact import redact_text

if TYPE_CHECKING:  # heavy (numpy, scipy, clients): imported when a command runs
    from defrag.adapters.sources import Backend
    from defrag.adapters.watched_cluster import WatchedCluster
    from defrag.daemon.cycle import CycleResult
    from defrag.daemon.service import Daemon, Elector
    from defrag.decide import Planner
    from defrag.plan.config import PlannerConfig
    from defrag.plan.planner import OwnerLookup
    from defrag.ports import Actuator, AlertSink, Clock, ClusterSource, MetricsSource
    from defrag.settings import Settings

log = logging.getLogger(__name__)


def default_rules_dir() -> Path:
    """The shipped rules' folder (for tests and bench): :func:`defrag.rules.default_rules_dir`,
    imported when called so that loading the CLI does not load the detectors."""
    from defrag.rules import default_rules_dir as shipped

    return shipped()


class ClusterKind(StrEnum):
    kube = "kube"
    sim = "sim"


@dataclass(frozen=True, slots=True)
class Wiring:
    """The daemon and the simulated cluster behind it (None on a real cluster)."""

    daemon: Daemon
    sim: Any = None
    watching: bool = False
    """The cycle reads a watched store (its watch threads cannot be joined promptly at exit)."""


def build(settings: Settings, *, watch: bool = True, probe: bool = False) -> Wiring:
    """Every port the settings ask for, wired into a daemon. Bad settings → SettingsError.

    ``watch``: on a live cluster the cycle reads the store list + watch keeps (a serving daemon);
    False lists every cycle instead (``--once``: one list is all one cycle needs). ``probe``:
    connect to the API server and Prometheus once first, so an unreachable one is said at once
    (:class:`~defrag.adapters.sources.SourceUnreachable`, or every query failing at once)."""
    from defrag.daemon.cycle import CyclePorts, SystemClock
    from defrag.daemon.service import AlwaysLeader, Daemon
    from defrag.daemon.unmodelled import UnmodelledReporter
    from defrag.execute.executor import Executor
    from defrag.ports import SpendRecord
    from defrag.rules import RulesError, load_rules, rules_paths
    from defrag.settings import SettingsError

    rules_dirs = rules_paths((), settings.detection.rules_dir)
    try:
        rules = load_rules(rules_dirs)
    except RulesError as exc:
        raise SettingsError(f"rules in {', '.join(map(str, rules_dirs))}:\n{exc}") from None
    except OSError as exc:
        raise SettingsError(
            f"setting detection.rules_dir {settings.detection.rules_dir}: {exc}"
        ) from None

    sim = None
    metrics: MetricsSource | None = None
    owners: OwnerLookup | None = None  # the simulated cluster's owners recreate what they own
    elector: Elector = AlwaysLeader()
    clock: Clock = SystemClock()
    time_scale = 1.0
    sleep: Callable[[float], None] = time.sleep
    backend = _backend(settings, probe=probe)
    source: ClusterSource = backend.source
    fresh: ClusterSource = source  # what the executor reads while it drains
    confirm: ClusterSource | None = None  # read before a drain is taken as done, where fresh lags
    if backend.sim is not None:
        sim = backend.sim
        actuator: Actuator = sim
        clock, time_scale, sleep = sim.clock, settings.sim.speedup, sim.clock.sleep
    else:
        if watch:
            from defrag.adapters.watched_cluster import WatchedOrListed

            watched = _watched(settings, backend.api)
            # the executor polls the store while a drain lasts; its end is confirmed fresh
            source = watched
            fresh = WatchedOrListed(
                watched, backend.source, max_wait_s=settings.execution.poll_interval_s
            )
            confirm = _unscheduled(backend.api)
        actuator, elector = _kube(settings, backend.api)
        metrics = _prometheus(settings)
        if probe and metrics is not None and hasattr(metrics, "probe"):
            metrics.probe()
        owners = _owner_lookup(backend.api)

    alerts = _alerts(settings)
    if probe and alerts is not None and hasattr(alerts, "probe"):
        alerts.probe()
    planner_config = settings.planner_config()
    executor = Executor(
        actuator,
        fresh,
        clock,
        # the planner's budget, enforced again as evictions go out
        settings.executor_settings(planner_config.window_budget()),
        mode=settings.run_mode,  # dry run is decided here, once: the executor owns it
        sleep=sleep,
        time_left=lambda: _cycle_time_left(time_scale),
        # the window's spend rides on the Lease, so a restart or a new leader resumes it
        spend=elector if isinstance(elector, SpendRecord) else None,
        confirm=confirm,
    )
    ports = CyclePorts(
        source=source,
        clock=clock,
        detector=_detector(rules, metrics),
        planner=_planner(planner_config, owners),
        executor=executor,
        unmodelled=UnmodelledReporter(actuator, settings.run_mode),
        alerts=alerts,
    )
    daemon = Daemon(
        ports,
        settings.cycle_config(),
        cycle_interval_s=settings.daemon.cycle_interval_s,
        ready_age_limit_s=settings.daemon.ready_age_limit_s,
        elector=elector,
        time_scale=time_scale,
        http_host=settings.http.host,
        http_port=settings.http.port,
        elector_interval_s=settings.leadership.lease_duration_s / 3,
        # a cycle still running when a good one should have been seen is wedged
        cycle_deadline_s=settings.daemon.ready_age_limit_s,
    )
    return Wiring(daemon, sim, watching=source is not backend.source)


def _cycle_time_left(time_scale: float) -> float | None:
    """Seconds on the executor's clock before the running cycle's deadline (the daemon's
    ``time_budget``: real seconds, sped up by ``time_scale`` on a simulated clock)."""
    from defrag.adapters.deadline import current_budget

    budget = current_budget()
    return None if budget is None else budget.remaining() * time_scale


def _backend(settings: Settings, *, probe: bool = False) -> Backend:
    """The cluster the settings name, through the one factory every command uses."""
    from defrag.adapters.sources import SourceError, SourceSpec, SourceUnreachable, open_source
    from defrag.settings import SettingsError

    cluster = settings.cluster
    if cluster.kind == "sim":
        spec = SourceSpec(
            sim=True, sim_speedup=settings.sim.speedup, profile=settings.profile_config()
        )
    else:
        kubeconfig = Path(cluster.kubeconfig) if cluster.kubeconfig else None
        spec = SourceSpec(live=True, kubeconfig=kubeconfig, context=cluster.context, probe=probe)
    try:
        return open_source(spec)
    except SourceUnreachable:
        raise
    except SourceError as exc:
        raise SettingsError(str(exc)) from None


def _watched(settings: Settings, api: Any) -> WatchedCluster:
    """The cycle's cluster: the store list + watch keeps (converted once per change), refused
    once a watch has been down longer than the daemon's readiness age."""
    from defrag.adapters.kube_watch import KubeWatchSource
    from defrag.adapters.watched_cluster import WatchedCluster

    # A broken watch is retried well within the staleness limit (the chaos soak saw a 30 s
    # backoff hold the view stale past a 30 s limit after a few faults in a row).
    limit = settings.daemon.ready_age_limit_s
    source = KubeWatchSource(api, max_backoff_s=max(1.0, min(30.0, limit / 4)))
    return WatchedCluster(source, max_staleness_s=limit)


def _unscheduled(api: Any) -> ClusterSource:
    from defrag.adapters.kube import KubeUnscheduledPods

    return KubeUnscheduledPods(api)


def _kube(settings: Settings, api: Any) -> tuple[Actuator, Elector]:
    from defrag.adapters.kube import KubeActuator, LeaseElector
    from defrag.daemon.service import AlwaysLeader

    # In dry run without Events nothing may be written: the actuator only logs intents.
    mode = settings.run_mode
    # Events go where the API server takes them: a pod's in its namespace, a node's in default.
    actuator = KubeActuator(api, send_writes=mode.writes_events)
    elector: Elector = AlwaysLeader()
    # Dry run writes nothing to the cluster, not even the Lease: every replica plans and reports.
    if mode.takes_lease:
        lease = settings.leadership
        elector = LeaseElector(
            api,
            lease.lease_namespace,
            lease.lease_name,
            lease.identity,
            int(lease.lease_duration_s),
        )
        # a retried eviction asks the Lease again (a retry may come seconds later)
        actuator.fence = elector.still_leader
        actuator.send_guard = elector.holds_now
    return actuator, elector


def _prometheus(settings: Settings) -> MetricsSource | None:
    from defrag.settings import SettingsError

    prometheus = settings.prometheus
    if not prometheus.url:
        return None
    from defrag.adapters.prometheus import PrometheusSource

    try:
        return PrometheusSource(
            prometheus.url,
            timeout_s=prometheus.timeout_s,
            bearer_token_file=prometheus.token_file,
            ca_bundle=prometheus.ca_file,
            concurrency=prometheus.concurrent_queries,
        )
    except ValueError as exc:
        raise SettingsError(f"setting prometheus.url: {redact_text(str(exc))}") from None


def _alerts(settings: Settings) -> AlertSink | None:
    from defrag.settings import SettingsError

    alerts = settings.alerts
    if not alerts.urls:
        return None
    from defrag.adapters.alertmanager import AlertmanagerSink

    try:
        return AlertmanagerSink(
            alerts.urls,
            cluster=settings.cluster.name,
            resend_interval_s=alerts.resend_interval_s,
            runbook_url=alerts.runbook_url,
            generator_url=alerts.generator_url,
            ttl_s=alerts.ttl_s,
            bearer_token_file=alerts.token_file,
            ca_file=alerts.ca_file,
        )
    except ValueError as exc:
        raise SettingsError(f"setting alerts.urls: {exc}") from None


def _detector(rules: Any, metrics: MetricsSource | None) -> Any:
    from defrag.detection import cycle_detector

    return cycle_detector(rules, metrics)


def _owner_lookup(api: Any) -> OwnerLookup | None:
    """Victims' owners read from the API server (None without one: kinds alone decide)."""
    if api is None:
        return None
    from defrag.adapters.kube_owners import KubeOwnerLookup

    return KubeOwnerLookup(api)


def _planner(config: Settings | PlannerConfig, owners: OwnerLookup | None = None) -> Planner:
    """The cycle's planner port (:func:`defrag.decide.planner_port`) for these settings."""
    from defrag.decide import planner_port
    from defrag.settings import Settings

    return planner_port(config.planner_config() if isinstance(config, Settings) else config, owners)


# --- the commands --------------------------------------------------------------------------


def _settings(path: Path | None, overrides: dict[str, Any]) -> Settings:
    from defrag.settings import SettingsError, load_settings

    try:
        return load_settings(path, overrides)
    except SettingsError as exc:
        raise UserError(redact_text(str(exc))) from None


def _build(settings: Settings, *, once: bool) -> Wiring:
    from defrag.adapters.sources import SourceUnreachable
    from defrag.settings import SettingsError

    try:
        return build(settings, watch=not once, probe=once)
    except SourceUnreachable as exc:
        raise UserError(redact_text(str(exc)), ExitCode.UNREACHABLE) from None
    except SettingsError as exc:
        raise UserError(redact_text(str(exc))) from None


@app.command()
def run(
    cluster: Annotated[
        ClusterKind | None, typer.Option("--cluster", help="kube (default) or sim")
    ] = None,
    once: Annotated[bool, typer.Option("--once", help="Run one cycle, print it, exit.")] = False,
    dry_run: Annotated[
        bool | None,
        typer.Option("--dry-run/--no-dry-run", help="Plan and report only (the default)."),
    ] = None,
    output: OutputOpt = Output.table,
    settings_file: Annotated[
        Path | None, typer.Option("--settings", help="YAML/JSON settings file.")
    ] = None,
    rules: Annotated[Path | None, typer.Option("--rules", help="Detection rule directory.")] = None,
    prometheus: Annotated[
        str | None,
        typer.Option("--prometheus", help="Prometheus base URL (setting prometheus.url)."),
    ] = None,
    kubeconfig: Annotated[
        Path | None,
        typer.Option("--kubeconfig", help="kubeconfig file (setting cluster.kubeconfig)."),
    ] = None,
    context: Annotated[
        str | None,
        typer.Option("--context", help="kubeconfig context (setting cluster.context)."),
    ] = None,
) -> None:
    """The daemon: observe, detect, plan and (inside windows, not in dry run) execute."""
    from defrag.daemon.service import configure_logging

    if kubeconfig is not None and not kubeconfig.is_file():
        raise UserError(f"--kubeconfig {kubeconfig}: no such file")
    settings = _settings(
        settings_file,
        {
            "cluster.kind": cluster.value if cluster else None,
            "execution.dry_run": dry_run,
            "detection.rules_dir": str(rules) if rules else None,
            "prometheus.url": prometheus,
            "cluster.kubeconfig": str(kubeconfig) if kubeconfig else None,
            "cluster.context": context,
        },
    )
    logs = settings.logging
    configure_logging(logs.format, logs.level if not once else "WARNING")
    if not once:
        keep_heap_small()  # before _build starts the watch threads
    wiring = _build(settings, once=once)
    daemon = wiring.daemon
    if not once:
        try:
            daemon.serve_forever()
        except OSError as exc:  # the HTTP port: taken, not ours to bind, no such address
            http = settings.http
            raise UserError(
                f"cannot listen on {http.host}:{http.port} (setting http.port, env "
                f"DEFRAG_HTTP__PORT): {exc.strerror or exc}"
            ) from None
        # A cycle stuck past the grace period, or the watch threads (blocked reading their
        # streams), cannot be joined promptly: leave without waiting for them.
        if daemon.cycle_running or wiring.watching:
            logging.shutdown()
            os._exit(0)
        return
    from defrag.daemon.service import EXPECTED_FAILURES

    try:
        result = daemon.run_once()  # reconciles first when leading outside dry run
    except UserError:
        raise
    except EXPECTED_FAILURES as exc:  # the outside failed: a server, a deadline
        raise UserError(
            redact_text(f"cycle failed: {type(exc).__name__}: {exc}"), ExitCode.UNREACHABLE
        ) from None
    except Exception as exc:
        raise UserError(f"cycle failed: {type(exc).__name__}: {exc}", ExitCode.NO) from None
    if output is not Output.table:
        print_data(result.to_dict(), output)
    else:
        print_cycle(result)
    # as `detect`: what could not be done because a server failed is incomplete (exit 3)
    if result.alert_error:
        raise UserError(f"alerts not delivered: {result.alert_error}", ExitCode.UNREACHABLE)
    if result.rule_failures:
        raise UserError(
            f"{len(result.rule_failures)} rule(s) could not be evaluated: "
            + ", ".join(sorted(result.rule_failures)),
            ExitCode.UNREACHABLE,
        )


def print_cycle(result: CycleResult, title: str = "cycle") -> None:
    """A cycle for people: window, findings, plan, execution, the figures before and after."""
    b, a = result.before, result.after
    mode = result.mode.name
    print_line(
        f"[bold]{title}[/bold] {result.started:%Y-%m-%d %H:%M} ({mode}, "
        f"{'leader' if result.leader else 'follower'}): {result.window.reason}"
    )
    kinds: dict[str, int] = {}
    for f in result.findings:
        kinds[f.kind] = kinds.get(f.kind, 0) + 1
    print_line(f"  findings: {', '.join(f'{n} {k}' for k, n in kinds.items()) or 'none'}")
    for rule, why in sorted(result.rule_failures.items()):
        print_line(f"  rule {rule} not evaluated (its alerts held): {escape(why)}")
    if result.plan is not None:
        p = result.plan
        print_line(
            f"  plan {p.id}: {len(p.steps)} step(s) ({p.migrations} migrate, "
            f"{p.preemptions} preempt), {len(p.blocked)} blocked, cost {p.cost:.1f}"
        )
    if result.executed is not None:
        counts = ", ".join(f"{n} {r}" for r, n in result.executed.counts.items())
        print_line(f"  executed: {counts or 'nothing'}")
        asked: dict[str, list[str]] = {}
        for o in result.executed.outcomes:
            if o.checkpoint:
                asked.setdefault(o.checkpoint, []).append(o.pod)
        for outcome, pods in sorted(asked.items()):
            verb = "would ask" if outcome == "would-ask" else outcome
            print_line(f"  checkpoint {escape(verb)}: {escape(', '.join(pods))}")
    print_line(
        f"  largest placeable job {b.get('largest_placeable_job')} → "
        f"{a.get('largest_placeable_job')} GPUs ({result.after_source}); whole free nodes "
        f"{b.get('whole_free_nodes')} → {a.get('whole_free_nodes')}"
    )
