"""``defrag run`` (the daemon, or one cycle) and ``defrag demo`` (the daemon on a simulated
cluster).

This module is the composition root: it turns :class:`~defrag.settings.Settings` into the
ports (Kubernetes or the simulated cluster, Prometheus, Alertmanager, the Lease), the detector,
the planner and the executor, and hands them to :class:`~defrag.daemon.Daemon`.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from enum import StrEnum
from pathlib import Path
from typing import Annotated, Any

import typer

from defrag.cli.app import UserError, app, console, print_json
from defrag.cycle import CycleConfig, CyclePorts, CycleResult, SystemClock
from defrag.daemon import AlwaysLeader, Daemon, DaemonMetrics, Elector, configure_logging
from defrag.detect.findings import Finding
from defrag.execute.budgets import Budgets
from defrag.execute.executor import Executor, ExecutorSettings
from defrag.execute.windows import Window
from defrag.model.cluster import Cluster
from defrag.plan.model import Plan
from defrag.ports import Actuator, AlertSink, Clock, ClusterSource, MetricsSource
from defrag.settings import Settings, SettingsError, WindowSetting, load_settings

log = logging.getLogger(__name__)


class ClusterKind(StrEnum):
    kube = "kube"
    sim = "sim"


class Output(StrEnum):
    text = "text"
    json = "json"


TextOutputOpt = Annotated[Output, typer.Option("--output", "-o", help="text or json")]


@dataclass(frozen=True, slots=True)
class Wiring:
    """The daemon and the simulated cluster behind it (None on a real cluster)."""

    daemon: Daemon
    sim: Any = None


def build(settings: Settings) -> Wiring:
    """Every port the settings ask for, wired into a daemon. Bad settings → SettingsError."""
    from defrag.rules import RulesError, load_rules

    rules_dir = Path(settings.rules_dir) if settings.rules_dir else default_rules_dir()
    try:
        rules = load_rules([rules_dir])
    except RulesError as exc:
        raise SettingsError(f"rules in {rules_dir}:\n{exc}") from None
    except OSError as exc:
        raise SettingsError(f"setting rules_dir {rules_dir}: {exc}") from None

    sim = None
    metrics: MetricsSource | None = None
    elector: Elector = AlwaysLeader()
    clock: Clock = SystemClock()
    time_scale = 1.0
    sleep: Callable[[float], None] = time.sleep
    if settings.cluster == "sim":
        from defrag.adapters.simcluster import SimClock, SimCluster, fragmented_cluster

        sim_clock = SimClock(speedup=settings.sim_speedup)
        sim = SimCluster(fragmented_cluster(), sim_clock, policy=settings.policy)
        source: ClusterSource = sim
        actuator: Actuator = sim
        clock, time_scale, sleep = sim_clock, settings.sim_speedup, sim_clock.sleep
    else:
        source, actuator, elector = _kube(settings)
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
            dry_run_events=settings.dry_run_events,
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
        dry_run=settings.dry_run,
        goal=settings.plan_goal,
        windows=tuple(_window(w) for w in settings.windows),
        idle_gate=settings.idle_gate,
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
    )
    skipped_to.append(daemon.metrics)
    return Wiring(daemon, sim)


def _window(w: WindowSetting) -> Window:
    return Window(w.cron, w.length_s, w.timezone)


def _kube(settings: Settings) -> tuple[ClusterSource, Actuator, Elector]:
    from defrag.adapters.kube import (
        KubeActuator,
        KubeClusterSource,
        KubeError,
        LeaseElector,
        connect,
    )

    try:
        api = connect(settings.kubeconfig, settings.kube_context)
    except KubeError as exc:
        raise SettingsError(str(exc)) from None
    # In dry run without Events nothing may be written: the actuator only logs intents.
    send = not settings.dry_run or settings.dry_run_events
    actuator = KubeActuator(api, send_writes=send, event_namespace=settings.lease_namespace)
    elector: Elector = AlwaysLeader()
    # Dry run writes nothing to the cluster, not even the Lease: every replica plans and reports.
    if settings.leader_election and not settings.dry_run:
        elector = LeaseElector(
            api,
            settings.lease_namespace,
            settings.lease_name,
            settings.identity,
            int(settings.lease_duration_s),
        )
    return KubeClusterSource(api), actuator, elector


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
        raise SettingsError(f"setting prometheus_url: {exc}") from None


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
    rules: Any, metrics: MetricsSource | None, skipped_to: Sequence[DaemonMetrics] = ()
) -> Any:
    from defrag.detection import run_detection

    def detect(cluster: Cluster, now: datetime) -> Sequence[Finding]:
        report = run_detection(rules, metrics, cluster, now)
        for failure in report.failures:  # one broken rule never stops the others
            log.error("rule failed: %s", failure)
        for sink in skipped_to:  # missing inputs: a gauge and a log line
            sink.record_skipped(report.skipped)
        return report.findings

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
        cluster: Cluster, goal: str, now: datetime, *, pods: frozenset[str] | None = None
    ) -> Plan:
        options = PlanOptions(only=pods)
        return make_plan(
            cluster, goal, policy=settings.policy, constraints=constraints, now=now, options=options
        )

    return plan


def default_rules_dir() -> Path:
    """``rules`` here, else the rules shipped beside the package (a source checkout)."""
    here = Path("rules")
    if here.is_dir():
        return here
    return Path(__file__).resolve().parents[2] / "rules"


# --- the commands --------------------------------------------------------------------------


def _settings(path: Path | None, overrides: dict[str, Any]) -> Settings:
    try:
        return load_settings(path, overrides)
    except SettingsError as exc:
        raise UserError(str(exc)) from None


def _build(settings: Settings) -> Wiring:
    try:
        return build(settings)
    except SettingsError as exc:
        raise UserError(str(exc)) from None


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
    output: TextOutputOpt = Output.text,
    settings_file: Annotated[
        Path | None, typer.Option("--settings", help="YAML/JSON settings file.")
    ] = None,
    rules: Annotated[Path | None, typer.Option("--rules", help="Detection rule directory.")] = None,
) -> None:
    """The daemon: observe, detect, plan and (inside windows, not in dry run) execute."""
    settings = _settings(
        settings_file,
        {
            "cluster": cluster.value if cluster else None,
            "dry_run": dry_run,
            "rules_dir": str(rules) if rules else None,
        },
    )
    configure_logging(settings.log_format, settings.log_level if not once else "WARNING")
    wiring = _build(settings)
    daemon = wiring.daemon
    if not once:
        daemon.serve_forever()
        return
    try:
        result = daemon.run_once()  # reconciles first when leading outside dry run
    except UserError:
        raise
    except Exception as exc:
        raise UserError(f"cycle failed: {type(exc).__name__}: {exc}", exit_code=1) from None
    if output is Output.json:
        print_json(result.to_dict())
    else:
        _print_cycle(result)
    if result.alert_error:
        raise UserError(f"alerts not delivered: {result.alert_error}", exit_code=1)


def _print_cycle(result: CycleResult, title: str = "cycle") -> None:
    b, a = result.before, result.after
    mode = "dry run" if result.dry_run else "live"
    console.print(
        f"[bold]{title}[/bold] {result.started:%Y-%m-%d %H:%M} ({mode}, "
        f"{'leader' if result.leader else 'follower'}): {result.window.reason}"
    )
    kinds: dict[str, int] = {}
    for f in result.findings:
        kinds[f.kind] = kinds.get(f.kind, 0) + 1
    console.print(f"  findings: {', '.join(f'{n} {k}' for k, n in kinds.items()) or 'none'}")
    if result.plan is not None:
        p = result.plan
        console.print(
            f"  plan {p.id}: {len(p.steps)} step(s) ({p.migrations} migrate, "
            f"{p.preemptions} preempt), {len(p.blocked)} blocked, cost {p.cost:g}"
        )
    if result.executed is not None:
        counts = ", ".join(f"{n} {r}" for r, n in result.executed.counts.items())
        console.print(f"  executed: {counts or 'nothing'}")
    console.print(
        f"  largest placeable job {b.get('largest_placeable_job')} → "
        f"{a.get('largest_placeable_job')} GPUs ({result.after_source}); whole free nodes "
        f"{b.get('whole_free_nodes')} → {a.get('whole_free_nodes')}"
    )


@app.command()
def demo(
    cycles: Annotated[int, typer.Option(help="Cycles to run (5 simulated minutes apart).")] = 6,
    plot: Annotated[Path, typer.Option(help="Where to write the PNG plot.")] = Path(
        "defrag-demo.png"
    ),
    output: TextOutputOpt = Output.text,
) -> None:
    """The daemon on a simulated fragmented cluster: findings, a plan, moves in a window."""
    if cycles < 1:
        raise UserError("--cycles must be at least 1")
    settings = _settings(
        None,
        {
            "cluster": "sim",
            "dry_run": False,
            "cycle_interval_s": 300,
            "min_pod_age_s": 600,
            "windows": [{"cron": "0 2 * * *", "length_s": 3600}],
            "max_evictions_per_window": 12,
            "max_evictions_per_node": 8,
            "max_evictions_per_namespace": 12,
            "replacement_timeout_s": 300,
            "poll_interval_s": 10,
            "plan_goal": "auto",
            "sim_speedup": 1.0,
        },
    )
    configure_logging("text", "WARNING")
    wiring = _build(settings)
    daemon, sim = wiring.daemon, wiring.sim
    sim.clock.speedup = 0.0  # the demo moves simulated time itself, cycle by cycle
    results = []
    start = sim.clock.now()
    for i in range(cycles):
        sim.clock.advance_to(start + timedelta(seconds=i * settings.cycle_interval_s))
        result = daemon.run_once()
        results.append(result)
        if output is Output.text:
            _print_cycle(result, f"cycle {i + 1}")
    final = sim.snapshot()
    train = final.pods.get("research/train-llm-0")
    write_plot(results, plot)
    if output is Output.json:
        print_json(
            {
                "cycles": [r.to_dict() for r in results],
                "plot": str(plot),
                "train_llm_node": train.node if train else None,
            }
        )
        return
    console.print(
        f"\nresearch/train-llm-0 (8 GPUs, pending 2 h): "
        f"{'running on ' + train.node if train and train.node else 'still pending'}"
    )
    console.print(f"plot: {plot}")
    console.print(
        "\nOn a real cluster: `defrag run --once` (dry run: plan and report only) with your "
        "kubeconfig, add DEFRAG_PROMETHEUS_URL and DEFRAG_ALERTMANAGER_URLS, set windows in a "
        "settings file, then `--no-dry-run` — see docs/daemon.md and deploy/."
    )


def write_plot(results: Sequence[CycleResult], path: Path) -> None:
    """What each cycle observed at its start (solid), what its plan expected (dashed), and the
    evictions it made."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    xs = [r.started.strftime("%H:%M") for r in results]
    largest = [r.before.get("largest_placeable_job", 0) for r in results]
    whole = [r.before.get("whole_free_nodes", 0) for r in results]
    stranded = [dict(r.before.get("stranded", {})).get("8", 0) for r in results]
    expected = [
        r.plan.after.get("largest_placeable_job", 0) if r.plan and r.plan.steps else None
        for r in results
    ]
    evicted = [len(r.executed.evicted) if r.executed else 0 for r in results]
    starving = [sum(1 for f in r.findings if f.kind == "starvation") for r in results]
    fig, (top, bottom) = plt.subplots(2, 1, figsize=(8, 6), sharex=True)
    top.plot(xs, largest, marker="o", label="largest placeable job (GPUs)")
    top.plot(xs, whole, marker="s", label="whole free nodes")
    top.plot(xs, stranded, marker="^", label="GPUs stranded for 8-GPU jobs")
    top.plot(xs, starving, marker="x", color="tab:red", label="starving jobs")
    top.plot(
        xs,
        [e if e is not None else float("nan") for e in expected],
        linestyle="--",
        color="tab:blue",
        alpha=0.6,
        label="largest job the plan expects",
    )
    top.set_title("defrag demo: 12 fragmented 8-GPU nodes; the window opens at 02:00")
    top.set_ylabel("observed at cycle start")
    top.legend(loc="best")
    top.grid(alpha=0.3)
    bottom.bar(xs, evicted, color="tab:orange", label="evictions")
    bottom.set_ylabel("evictions")
    bottom.set_xlabel("simulated time (UTC)")
    bottom.legend(loc="best")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
