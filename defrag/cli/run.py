"""``defrag run``: the daemon, or one cycle (``defrag demo`` is in :mod:`defrag.cli.demo`).

This module is the composition root: it turns :class:`~defrag.settings.Settings` into the
ports (Kubernetes or the simulated cluster, Prometheus, Alertmanager, the Lease), the detector,
the planner and the executor, and hands them to :class:`~defrag.daemon.service.Daemon`.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from enum import StrEnum
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.markup import escape

from defrag.adapters.sources import Backend, SourceError, SourceSpec, open_source
from defrag.cli.app import Output, OutputOpt, UserError, app, print_data, print_line
from defrag.daemon.cycle import CycleConfig, CyclePorts, CycleResult, Detected, SystemClock
from defrag.daemon.service import AlwaysLeader, Daemon, DaemonMetrics, Elector, configure_logging
from defrag.execute.budgets import Budgets
from defrag.execute.executor import Executor, ExecutorSettings
from defrag.execute.mode import mode_name
from defrag.execute.windows import Window
from defrag.model.cluster import Cluster
from defrag.plan.model import Plan
from defrag.ports import Actuator, AlertSink, Clock, ClusterSource, MetricsSource
from defrag.redact import redact_text
from defrag.rules import default_rules_dir as default_rules_dir  # re-exported (tests, bench)
from defrag.rules import rules_paths
from defrag.scoring.profile import ScoringProfile
from defrag.settings import Settings, SettingsError, WindowSetting, load_settings

log = logging.getLogger(__name__)


class ClusterKind(StrEnum):
    kube = "kube"
    sim = "sim"


@dataclass(frozen=True, slots=True)
class Wiring:
    """The daemon and the simulated cluster behind it (None on a real cluster)."""

    daemon: Daemon
    sim: Any = None


def build(settings: Settings) -> Wiring:
    """Every port the settings ask for, wired into a daemon. Bad settings → SettingsError."""
    from defrag.rules import RulesError, load_rules

    rules_dirs = rules_paths((), settings.rules_dir)
    try:
        rules = load_rules(rules_dirs)
    except RulesError as exc:
        raise SettingsError(f"rules in {', '.join(map(str, rules_dirs))}:\n{exc}") from None
    except OSError as exc:
        raise SettingsError(f"setting rules_dir {settings.rules_dir}: {exc}") from None

    sim = None
    metrics: MetricsSource | None = None
    elector: Elector = AlwaysLeader()
    clock: Clock = SystemClock()
    time_scale = 1.0
    sleep: Callable[[float], None] = time.sleep
    backend = _backend(settings)
    source: ClusterSource = backend.source
    if backend.sim is not None:
        sim = backend.sim
        actuator: Actuator = sim
        clock, time_scale, sleep = sim.clock, settings.sim_speedup, sim.clock.sleep
    else:
        actuator, elector = _kube(settings, backend.api)
        metrics = _prometheus(settings)

    executor = Executor(
        actuator,
        source,
        clock,
        ExecutorSettings(
            budgets=Budgets(
                settings.max_evictions_per_window,
                settings.max_evictions_per_node,
                settings.max_evictions_per_namespace,
            ),
            batch_size=settings.eviction_batch_size,
            replacement_timeout_s=settings.replacement_timeout_s,
            poll_interval_s=settings.poll_interval_s,
            dry_run_events=settings.run_mode.events,
        ),
        sleep=sleep,
    )
    skipped_to: list[DaemonMetrics] = []  # the daemon's metrics, once it exists
    ports = CyclePorts(
        source=source,
        clock=clock,
        detector=_detector(rules, metrics, skipped_to),
        planner=_planner(settings),
        executor=executor,
        alerts=_alerts(settings),
    )
    config = CycleConfig(
        mode=settings.run_mode,
        goal=settings.plan_goal,
        windows=tuple(_window(w) for w in settings.windows),
        idle_gate=settings.idle_gate,
        profile=settings.profile_config(),
    )
    daemon = Daemon(
        ports,
        config,
        cycle_interval_s=settings.cycle_interval_s,
        ready_age_limit_s=settings.ready_age_limit_s,
        elector=elector,
        time_scale=time_scale,
        http_host=settings.http_host,
        http_port=settings.http_port,
        elector_interval_s=settings.lease_duration_s / 3,
        # a cycle still running when a good one should have been seen is wedged
        cycle_deadline_s=settings.ready_age_limit_s,
    )
    skipped_to.append(daemon.metrics)
    return Wiring(daemon, sim)


def _window(w: WindowSetting) -> Window:
    return Window(w.cron, w.length_s, w.timezone)


def _backend(settings: Settings) -> Backend:
    """The cluster the settings name, through the one factory every command uses."""
    if settings.cluster == "sim":
        spec = SourceSpec(
            sim=True, sim_speedup=settings.sim_speedup, profile=settings.profile_config()
        )
    else:
        kubeconfig = Path(settings.kubeconfig) if settings.kubeconfig else None
        spec = SourceSpec(live=True, kubeconfig=kubeconfig, context=settings.kube_context)
    try:
        return open_source(spec)
    except SourceError as exc:
        raise SettingsError(str(exc)) from None


def _kube(settings: Settings, api: Any) -> tuple[Actuator, Elector]:
    from defrag.adapters.kube import KubeActuator, LeaseElector
    # In dry run without Events nothing may be written: the actuator only logs intents.
    mode = settings.run_mode
    # Events go where the API server takes them: a pod's in its namespace, a node's in default.
    actuator = KubeActuator(api, send_writes=mode.writes_events)
    elector: Elector = AlwaysLeader()
    # Dry run writes nothing to the cluster, not even the Lease: every replica plans and reports.
    if mode.takes_lease:
        elector = LeaseElector(
            api,
            settings.lease_namespace,
            settings.lease_name,
            settings.identity,
            int(settings.lease_duration_s),
        )
        # a retried eviction asks the Lease again (a retry may come seconds later)
        actuator.fence = elector.still_leader
        actuator.send_guard = elector.holds_now
    return actuator, elector


def _prometheus(settings: Settings) -> MetricsSource | None:
    if not settings.prometheus_url:
        return None
    from defrag.adapters.prometheus import PrometheusSource

    try:
        return PrometheusSource(
            settings.prometheus_url,
            timeout_s=settings.prometheus_timeout_s,
            bearer_token_file=settings.prometheus_token_file,
            ca_bundle=settings.prometheus_ca_file,
        )
    except ValueError as exc:
        raise SettingsError(f"setting prometheus_url: {redact_text(str(exc))}") from None


def _alerts(settings: Settings) -> AlertSink | None:
    if not settings.alertmanager_urls:
        return None
    from defrag.adapters.alertmanager import AlertmanagerSink

    try:
        return AlertmanagerSink(
            settings.alertmanager_urls,
            cluster=settings.cluster_name,
            resend_interval_s=settings.alert_resend_interval_s,
            ttl_s=settings.alert_ttl_s,
            bearer_token_file=settings.alertmanager_token_file,
            ca_file=settings.alertmanager_ca_file,
        )
    except ValueError as exc:
        raise SettingsError(f"setting alertmanager_urls: {exc}") from None


def _detector(
    rules: Any,
    metrics: MetricsSource | None,
    skipped_to: Sequence[DaemonMetrics] = (),
) -> Any:
    from defrag.detection import run_detection

    def detect(cluster: Cluster, now: datetime, profile: ScoringProfile) -> Detected:
        report = run_detection(rules, metrics, cluster, now, profile=profile)
        # One broken rule never stops the others; the daemon logs, counts and alerts on the
        # failed ones, and holds their alerts as they were.
        failed = {f.rule: redact_text(f"{f.message} ({f.file}:{f.line})") for f in report.failures}
        for sink in skipped_to:  # missing inputs: a gauge and a log line
            sink.record_skipped(report.skipped)
        return Detected(report.findings, failed)

    return detect


def _planner(settings: Settings) -> Any:
    from defrag.plan.constraints import Constraints
    from defrag.plan.planner import PlanOptions, make_plan

    constraints = Constraints(
        min_age=timedelta(seconds=settings.min_pod_age_s),
        max_evictions=settings.max_evictions_per_window,
        max_per_node=settings.max_evictions_per_node,
        max_per_namespace=settings.max_evictions_per_namespace,
    )

    def plan(
        cluster: Cluster,
        goal: str,
        now: datetime,
        *,
        profile: ScoringProfile,
        pods: frozenset[str] | None = None,
    ) -> Plan:
        options = PlanOptions(
            only=pods,
            migrate_any_priority=settings.make_room_moves_any_priority,
            swaps=settings.make_room_swaps,
            room_worth=settings.make_room_worth,
        )
        return make_plan(
            cluster, goal, profile=profile, constraints=constraints, now=now, options=options
        )

    return plan


# --- the commands --------------------------------------------------------------------------


def _settings(path: Path | None, overrides: dict[str, Any]) -> Settings:
    try:
        return load_settings(path, overrides)
    except SettingsError as exc:
        raise UserError(redact_text(str(exc))) from None


def _build(settings: Settings) -> Wiring:
    try:
        return build(settings)
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
        typer.Option("--prometheus", help="Prometheus base URL (setting prometheus_url)."),
    ] = None,
    kubeconfig: Annotated[
        Path | None, typer.Option("--kubeconfig", help="kubeconfig file (setting kubeconfig).")
    ] = None,
    context: Annotated[
        str | None, typer.Option("--context", help="kubeconfig context (setting kube_context).")
    ] = None,
) -> None:
    """The daemon: observe, detect, plan and (inside windows, not in dry run) execute."""
    if kubeconfig is not None and not kubeconfig.is_file():
        raise UserError(f"--kubeconfig: no such file: {kubeconfig}")
    settings = _settings(
        settings_file,
        {
            "cluster": cluster.value if cluster else None,
            "dry_run": dry_run,
            "rules_dir": str(rules) if rules else None,
            "prometheus_url": prometheus,
            "kubeconfig": str(kubeconfig) if kubeconfig else None,
            "kube_context": context,
        },
    )
    configure_logging(settings.log_format, settings.log_level if not once else "WARNING")
    wiring = _build(settings)
    daemon = wiring.daemon
    if not once:
        daemon.serve_forever()
        if daemon.cycle_running:  # stuck past the grace period: its thread cannot be joined
            logging.shutdown()
            os._exit(0)
        return
    try:
        result = daemon.run_once()  # reconciles first when leading outside dry run
    except UserError:
        raise
    except Exception as exc:
        raise UserError(f"cycle failed: {type(exc).__name__}: {exc}", exit_code=1) from None
    if output is not Output.table:
        print_data(result.to_dict(), output)
    else:
        print_cycle(result)
    if result.alert_error:
        raise UserError(f"alerts not delivered: {result.alert_error}", exit_code=1)
    if result.rule_failures:
        raise UserError(
            f"{len(result.rule_failures)} rule(s) could not be evaluated: "
            + ", ".join(sorted(result.rule_failures)),
            exit_code=1,
        )


def print_cycle(result: CycleResult, title: str = "cycle") -> None:
    """A cycle for people: window, findings, plan, execution, the figures before and after."""
    b, a = result.before, result.after
    mode = mode_name(result.dry_run)
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
    print_line(
        f"  largest placeable job {b.get('largest_placeable_job')} → "
        f"{a.get('largest_placeable_job')} GPUs ({result.after_source}); whole free nodes "
        f"{b.get('whole_free_nodes')} → {a.get('whole_free_nodes')}"
    )
