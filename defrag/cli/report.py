"""``defrag report`` (fragmentation) and ``defrag place`` (where a pod of a shape would go)."""

from __future__ import annotations

from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer
from rich.table import Table

from defrag.cli.app import (
    DEFAULT_DEADLINE,
    AtOpt,
    ContextOpt,
    DeadlineOpt,
    KubeconfigOpt,
    Output,
    OutputOpt,
    PromCaOpt,
    PromInsecureOpt,
    PromTokenOpt,
    SnapshotOpt,
    StrictOpt,
    UserError,
    app,
    command_deadline,
    load_cluster,
    parse_duration,
    parse_time,
    print_data,
    print_line,
    print_table,
)
from defrag.cli.exitcodes import ExitCode
from defrag.cli.names import GPU_MILLI
from defrag.cli.profile import PolicyOpt, SettingsOpt, cli_settings, profile_config

if TYPE_CHECKING:  # heavy (numpy, scipy, clients): imported when a command runs
    from defrag.adapters.prometheus import PrometheusSource
    from defrag.model.cluster import Cluster
    from defrag.model.resources import Pod
    from defrag.scoring.fragmentation import FragmentationReport
    from defrag.scoring.framework import NodeVerdict, Placement, Unschedulable
    from defrag.scoring.profile import ScoringProfile


def report_table(rep: FragmentationReport, title: str = "Fragmentation") -> Table:
    table = Table(title=title, show_header=True)
    table.add_column("metric")
    table.add_column("value", justify="right")
    table.add_row("GPUs (total / entirely free)", f"{rep.total_gpus} / {rep.free_gpus}")
    table.add_row("free GPU share (incl. partial)", f"{rep.free_gpu_share:.2f}")
    table.add_row("GPU allocation", f"{rep.allocation_pct:.1f}%")
    table.add_row("whole free nodes", f"{rep.whole_free_nodes} of {rep.gpu_nodes}")
    table.add_row("largest placeable job", f"{rep.largest_placeable_job} GPUs")
    for k in rep.placeable:
        table.add_row(
            f"{k}-GPU jobs placeable / stranded GPUs", f"{rep.placeable[k]} / {rep.stranded[k]}"
        )
    table.add_row(
        "FGD fragmented (of idle)",
        f"{rep.fgd_fragmented_gpus:.2f} GPUs ({rep.fgd_frag_pct_of_idle:.1f}%)",
    )
    for pool in rep.pools:
        table.add_row(
            f"{pool.resource} units (total / free / largest request)",
            f"{pool.total} / {pool.free} / {pool.largest_request}",
        )
    return table


def node_table(rep: FragmentationReport) -> Table:
    table = Table(title="Nodes", show_header=True)
    for col in ("node", "GPUs", "free", "free share", "largest job", "stranded for 8"):
        table.add_column(col, justify="left" if col == "node" else "right")
    for n in rep.nodes:
        table.add_row(
            n.name,
            str(n.total),
            str(n.free),
            f"{n.free_share:.2f}",
            str(n.largest_job),
            str(n.stranded.get(8, "")),
        )
    return table


@app.command()
def report(
    snapshot: SnapshotOpt = [],  # noqa: B006 - typer needs a literal default
    strict: StrictOpt = False,
    output: OutputOpt = Output.table,
    prometheus: Annotated[
        str | None,
        typer.Option(help="Prometheus URL: adds GPU utilisation percentiles and leak suspects."),
    ] = None,
    at: AtOpt = None,
    kubeconfig: KubeconfigOpt = None,
    context: ContextOpt = None,
    settings_file: SettingsOpt = None,
    prom_bearer_token_file: PromTokenOpt = None,
    prom_ca_file: PromCaOpt = None,
    prom_insecure: PromInsecureOpt = False,
    prom_timeout: Annotated[
        str | None,
        typer.Option(
            "--prom-timeout",
            help="Per Prometheus request (bare: seconds; default: the setting "
            "prometheus.timeout_s, 10s).",
        ),
    ] = None,
    deadline: DeadlineOpt = DEFAULT_DEADLINE,
) -> None:
    """The fragmentation report of a cluster snapshot (or the live cluster)."""
    from defrag.scoring.fragmentation import fragmentation_report

    with command_deadline(deadline, "report"):
        when = parse_time(at)
        config = profile_config(settings_file, None)
        source = None
        if prometheus:  # the settings' Prometheus TLS, token and timeout, unless a flag says
            settings = cli_settings(settings_file)
            token = prom_bearer_token_file or settings.prometheus.token_file
            ca = prom_ca_file or settings.prometheus.ca_file
            timeout_s = (
                parse_duration(prom_timeout, "--prom-timeout")
                if prom_timeout is not None
                else settings.prometheus.timeout_s
            )
            source = _prometheus(prometheus, token, ca, prom_insecure, timeout_s)
        cluster = load_cluster(snapshot, kubeconfig, context, strict)
        # The snapshot's profile: its mix gives the FGD figure, as on the daemon's /metrics.
        rep = fragmentation_report(cluster, config.for_cluster(cluster).mix)
        extras: dict[str, Any] = _prometheus_extras(source, when) if source is not None else {}
    if output is not Output.table:
        print_data({**rep.to_dict(), **extras, "warnings": list(cluster.warnings)}, output)
        return
    print_table(report_table(rep))
    print_table(node_table(rep))
    if extras:
        print_extras(extras)


def print_extras(extras: dict[str, Any]) -> None:
    """``report --prometheus``'s additions in words and a table (``-o json`` has the fields):
    the GPU utilisation percentiles, the leak suspects, the rules that could not run."""
    from rich.markup import escape

    use = extras.get("utilisation")
    if use:
        hours = float(use["window_s"]) / 3600
        print_line(
            f"GPU utilisation over the last {hours:g} h ({use['gpus']} GPU(s), "
            f"{use['samples']} samples): p50 {use['p50']:g}%, p90 {use['p90']:g}%, "
            f"p99 {use['p99']:g}%"
        )
    elif "utilisation" in extras:
        print_line("GPU utilisation: no samples (is the DCGM exporter scraped?)")
    suspects = extras.get("leak_suspects") or []
    if suspects:
        table = Table(title="GPU memory leak suspects", show_header=True)
        for col in ("subject", "severity", "summary"):
            table.add_column(col, overflow="fold")
        for f in suspects:
            table.add_row(str(f.get("subject", "")), str(f.get("severity", "")),
                          str(f.get("summary", "")))  # fmt: skip
        print_table(table, whole=("subject",))
    else:
        print_line("GPU memory leak suspects: none")
    for name, why in dict(extras.get("skipped") or {}).items():
        print_line(f"skipped rule {escape(str(name))}: {escape(str(why))}")


def _prometheus(
    url: str, token: Path | str | None, ca: Path | str | None, insecure: bool, timeout_s: float
) -> PrometheusSource:
    from defrag.cli.detect import make_source

    return make_source(
        url,
        Path(token) if token else None,
        Path(ca) if ca else None,
        insecure,
        timeout_s,
    )


def _prometheus_extras(source: PrometheusSource, when: datetime) -> dict[str, Any]:
    """GPU utilisation percentiles and leak suspects from Prometheus (see docs/rules.md)."""
    from defrag.adapters.prometheus import MetricsError, PrometheusUnreachable
    from defrag.cli.detect import read_rules
    from defrag.detection import report_extras
    from defrag.redact import redact_text

    try:
        return report_extras(source, read_rules([]), when)
    except PrometheusUnreachable as exc:
        raise UserError(
            f"--prometheus {source.shown}: {redact_text(str(exc))}", ExitCode.UNREACHABLE
        ) from None
    except (MetricsError, ValueError) as exc:
        raise UserError(f"--prometheus {source.shown}: {redact_text(str(exc))}") from None


def pod_shape(gpus: int, gpu_milli: int, cpu_milli: int, models: list[str]) -> Pod:
    from defrag.model.resources import Pod

    if gpus < 0 or not 0 < gpu_milli <= GPU_MILLI:
        raise UserError("--gpus must be ≥ 0 and --gpu-milli in 1..1000")
    if gpu_milli < GPU_MILLI and gpus != 1:
        raise UserError("a GPU-sharing pod (--gpu-milli < 1000) asks exactly one GPU (--gpus 1)")
    return Pod(
        "new-pod",
        num_gpu=gpus,
        gpu_milli=gpu_milli,
        cpu_milli=cpu_milli,
        gpu_models=frozenset(models),
    )


@app.command()
def place(
    snapshot: SnapshotOpt = [],  # noqa: B006
    strict: StrictOpt = False,
    gpus: Annotated[int, typer.Option(help="GPUs the pod asks (R).")] = 1,
    gpu_milli: Annotated[int, typer.Option(help="Share of each GPU, 1000 = whole.")] = GPU_MILLI,
    cpu_milli: Annotated[int, typer.Option(help="CPU request in milli-CPU.")] = 0,
    gpu_model: Annotated[list[str], typer.Option(help="Allowed GPU model (repeatable).")] = [],  # noqa: B006
    policy: PolicyOpt = None,
    output: OutputOpt = Output.table,
    kubeconfig: KubeconfigOpt = None,
    context: ContextOpt = None,
    settings_file: SettingsOpt = None,
) -> None:
    """Where a new pod of this shape would go, and why every other node scores less or fails.
    Exits 1 when it fits nowhere."""
    from defrag.scoring.framework import Placement

    config = profile_config(settings_file, policy)
    cluster = load_cluster(snapshot, kubeconfig, context, strict)
    pod = pod_shape(gpus, gpu_milli, cpu_milli, gpu_model)
    profile = config.for_cluster(cluster)
    result, verdicts = placement(pod, cluster, profile)
    chosen = result if isinstance(result, Placement) else None
    data: dict[str, Any] = {
        "policy": profile.name,
        "node": chosen.node if chosen else None,
        "gpus": list(chosen.gpus) if chosen else [],
        "score": chosen.score if chosen else None,
        "unschedulable": None if chosen else result.summary,  # type: ignore[union-attr]
        "nodes": [
            {
                "node": v.node,
                "score": None if v.score is None else v.score,
                "reasons": list(v.reasons),
            }
            for v in verdicts
        ],
    }
    if output is not Output.table:
        print_data(data, output)
    else:
        _print_place(chosen, verdicts, profile.name, str(data["unschedulable"]))
    if chosen is None:
        raise typer.Exit(1)


def placement(
    pod: Pod, cluster: Cluster, profile: ScoringProfile
) -> tuple[Placement | Unschedulable, list[NodeVerdict]]:
    """``defrag place``'s answer: where ``pod`` goes under ``profile`` (the one built for
    ``cluster``), and every node's verdict."""
    from defrag.scoring.scheduler import explain, schedule

    return schedule(pod, cluster, profile.policy), explain(pod, cluster, profile.policy)


def _print_place(
    chosen: Placement | None, verdicts: list[Any], policy: str, unschedulable: str
) -> None:
    if chosen:
        print_line(
            f"[bold]{chosen.node}[/] GPUs {list(chosen.gpus)} — score {chosen.score} ({policy})"
        )
    else:
        print_line(f"[bold red]unschedulable[/]: {unschedulable}")
    table = Table(show_header=True)
    table.add_column("node")
    table.add_column("score", justify="right")
    table.add_column("filtered because")
    ranked = sorted(verdicts, key=lambda v: (v.score is None, -(v.score or 0), v.node))
    for v in ranked:
        table.add_row(v.node, "" if v.score is None else str(v.score), "; ".join(v.reasons))
    print_table(table)
