"""``defrag detect`` (findings from Prometheus and/or a snapshot) and ``defrag rules check``."""

from __future__ import annotations

import logging
import re
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, NoReturn

import typer
import yaml
from rich.markup import escape
from rich.table import Table

from defrag.cli.alerts import (
    AlertmanagerOpt,
    BasicAuthOpt,
    BearerTokenFileOpt,
    CaFileOpt,
    ClusterLabelOpt,
    InsecureOpt,
    OldClusterLabelOpt,
    cluster_label,
    make_sink,
)
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
    PromTimeoutOpt,
    PromTokenOpt,
    SnapshotOpt,
    UserError,
    app,
    command_deadline,
    console,
    err_console,
    load_cluster,
    parse_duration,
    parse_time,
    print_data,
    print_line,
    print_table,
)
from defrag.cli.exitcodes import ExitCode
from defrag.cli.profile import PolicyOpt, SettingsOpt, profile_config
from defrag.redact import redact_text, redact_url

if TYPE_CHECKING:  # heavy (numpy, scipy, clients): imported when a command runs
    from defrag.adapters.alertmanager import AlertmanagerSink
    from defrag.adapters.prometheus import PrometheusSource
    from defrag.detection import DetectionReport
    from defrag.model.cluster import Cluster
    from defrag.rules import LoadedRule, RuleIssue, RuleSet

rules_app = typer.Typer(help="Detection rule files.", no_args_is_help=True)
app.add_typer(rules_app, name="rules")


PrometheusOpt = Annotated[
    str | None, typer.Option("--prometheus", help="Prometheus base URL, e.g. http://prom:9090.")
]
RulesOpt = Annotated[
    list[Path],
    typer.Option(
        "--rules",
        "-r",
        help="Rule file or directory (repeatable; default: $DEFRAG_DETECTION__RULES_DIR, else "
        "the shipped rules).",
    ),
]


def make_source(
    url: str, token: Path | None, ca: Path | None, insecure: bool, timeout_s: float
) -> PrometheusSource:
    from defrag.adapters.prometheus import PrometheusSource

    if token is not None and not token.is_file():
        raise UserError(f"--prom-bearer-token-file {token}: no such file")
    if ca is not None and not ca.is_file():
        raise UserError(f"--prom-ca-file {ca}: no such file")
    try:
        source = PrometheusSource(
            url, timeout_s=timeout_s, bearer_token_file=token, ca_bundle=ca, verify_tls=not insecure
        )
    except ValueError as exc:
        raise UserError(f"--prometheus: {redact_text(str(exc))}") from None
    source.probe()  # an unreachable Prometheus fails each query at once, not after retries
    return source


def fail_with_issues(issues: Sequence[object], exit_code: int = 2) -> NoReturn:
    """Every issue on its own plain stderr line (never wrapped or cut), then one error line."""
    for issue in issues:
        sys.stderr.write(f"{issue}\n")
    raise UserError(f"{len(issues)} problem(s) in the rule files", exit_code=exit_code)


def read_rules(paths: list[Path]) -> RuleSet:
    from defrag.rules import RulesError, load_rules

    try:
        return load_rules(paths or None)
    except RulesError as exc:
        fail_with_issues(exc.issues)


@app.command()
def detect(
    prometheus: PrometheusOpt = None,
    snapshot: SnapshotOpt = [],  # noqa: B006 - typer needs a literal default
    rules: RulesOpt = [],  # noqa: B006
    at: AtOpt = None,
    output: OutputOpt = Output.table,
    kubeconfig: KubeconfigOpt = None,
    context: ContextOpt = None,
    fail_on_findings: Annotated[
        bool, typer.Option("--fail-on-findings", help="Exit 1 when there is any finding.")
    ] = False,
    prom_bearer_token_file: PromTokenOpt = None,
    prom_ca_file: PromCaOpt = None,
    prom_insecure: PromInsecureOpt = False,
    prom_timeout: PromTimeoutOpt = "10s",
    alertmanager: AlertmanagerOpt = [],  # noqa: B006
    label: ClusterLabelOpt = None,
    old_label: OldClusterLabelOpt = None,
    am_bearer_token_file: BearerTokenFileOpt = None,
    am_basic_auth: BasicAuthOpt = None,
    am_ca_file: CaFileOpt = None,
    am_insecure: InsecureOpt = False,
    policy: PolicyOpt = None,
    settings_file: SettingsOpt = None,
    deadline: DeadlineOpt = DEFAULT_DEADLINE,
) -> None:
    """Run the detection rules once and print the findings (optionally send them as alerts)."""
    from defrag.adapters.prometheus import MetricsError
    from defrag.adapters.sources import has_default_cluster
    from defrag.detection import run_detection, with_dcgm_gpu_indices
    from defrag.model.workload import WorkloadMix

    # The live cluster: --kubeconfig or --context, else the one kubectl would read ($KUBECONFIG,
    # the pod's service account, ~/.kube/config), as every other command reads it; --snapshot
    # files win over them.
    live = not snapshot and (kubeconfig is not None or context is not None or has_default_cluster())
    with command_deadline(deadline, "detect"):
        if prometheus is None and not snapshot and not live:
            raise UserError(
                "nothing to detect from: give --prometheus URL and/or --snapshot FILE "
                "(or --kubeconfig FILE; else $KUBECONFIG or ~/.kube/config is read)"
            )
        if at is not None and alertmanager:
            raise UserError("--at cannot be combined with --alertmanager: alerts are sent for now")
        now = parse_time(at)
        config = profile_config(settings_file, policy)
        ruleset = read_rules(rules)
        sink = (
            make_sink(
                alertmanager,
                cluster=cluster_label(label, old_label),
                bearer_token_file=am_bearer_token_file,
                basic_auth=am_basic_auth,
                ca_file=am_ca_file,
                insecure=am_insecure,
            )
            if alertmanager
            else None
        )
        source = (
            make_source(
                prometheus,
                prom_bearer_token_file,
                prom_ca_file,
                prom_insecure,
                parse_duration(prom_timeout, "--prom-timeout"),
            )
            if prometheus
            else None
        )
        cluster = load_cluster(snapshot, kubeconfig, context) if snapshot or live else None
        if cluster is not None and source is not None:
            try:
                cluster = with_dcgm_gpu_indices(cluster, ruleset, source, now)
            except MetricsError as exc:  # the snapshot's own GPU indices stand; rules still run
                err_console.print(
                    f"warning: GPU indices from DCGM not applied: {escape(str(exc))}",
                    soft_wrap=True,
                )
        # the snapshot's profile; without a snapshot, a cluster built from kube-state-metrics gets
        # the same configuration bound to its own mix (run_detection)
        mix = WorkloadMix.default()  # a placeholder: no snapshot, nothing scored against it
        profile = config.for_cluster(cluster) if cluster is not None else config.with_mix(mix)
        report = run_detection(ruleset, source, cluster, now, profile=profile)
        alerts = _send_alerts(sink, report, now) if sink is not None else None
        if output is not Output.table:
            print_data(_document(report, alerts, now, cluster), output)
        else:
            _print_table(report, now)
        _say_rules_and_alerts(report, alerts)
        incomplete = []
        if report.failures:
            names = ", ".join(f.rule for f in report.failures)
            incomplete.append(f"{len(report.failures)} rule(s) could not be evaluated: {names}")
        if alerts is not None and not alerts.delivered:
            incomplete.append(f"alerts not sent: {alerts.error}")
        if incomplete:
            raise UserError("; ".join(incomplete), exit_code=EXIT_INCOMPLETE)
        if not report.ran and report.skipped:
            raise UserError(
                f"nothing evaluated: all {len(report.skipped)} rule(s) were skipped, their "
                "sources hold none of the data they read (above)",
                exit_code=ExitCode.NO_DATA,
            )
        if fail_on_findings and report.findings:
            raise typer.Exit(ExitCode.NO)


EXIT_INCOMPLETE = ExitCode.UNREACHABLE
"""``defrag detect``'s exit code when it could not do all it was asked: a rule could not be
evaluated, or no Alertmanager took the alerts (docs/cli.md, *Exit codes*)."""


@dataclass(frozen=True, slots=True)
class AlertsSent:
    """What ``detect --alertmanager`` delivered: each Alertmanager's outcome and counts."""

    results: tuple[dict[str, object], ...]
    delivered: bool
    error: str = ""

    def to_dict(self) -> dict[str, object]:
        return {"delivered": self.delivered, "results": list(self.results)}


def _send_alerts(sink: AlertmanagerSink, report: DetectionReport, now: datetime) -> AlertsSent:
    """Sync the findings (and one alert per rule that could not be evaluated, whose earlier
    alerts stay as they were) to every Alertmanager; never raises."""
    from defrag.daemon.cycle import rule_failed_finding

    failed = {f.rule: redact_text(f.message) for f in report.failures}
    reported = [*report.findings, *(rule_failed_finding(r, w) for r, w in failed.items())]
    # each failure is said below, once; the sink's own error log would only repeat it
    logging.getLogger("defrag.adapters.alertmanager").setLevel(logging.CRITICAL)
    sync = sink.sync_report(reported, now, held_rules=tuple(failed))
    results = tuple(
        {
            "url": r.url,
            "outcome": r.outcome,
            "firing": r.firing,
            "resolved": r.resolved,
            **({"reason": redact_text(r.reason)} if r.reason else {}),
        }
        for r in sync.results
    )
    error = "; ".join(f"{url}: {redact_text(why)}" for url, why in sync.failures.items())
    return AlertsSent(results, not sync.all_failed, error)


def _document(
    report: DetectionReport, alerts: AlertsSent | None, now: datetime, cluster: Cluster | None
) -> dict[str, object]:
    """``-o json|yaml``: the findings, which rules ran, were skipped (why) or failed, and what
    the alerts did (``null`` without ``--alertmanager``)."""
    return {
        "at": now.isoformat(),
        "complete": not report.failures and (alerts is None or alerts.delivered),
        "findings": [f.to_dict() for f in report.findings],
        "ran": list(report.ran),
        "skipped": dict(report.skipped),
        "failures": [redact_text(str(f)) for f in report.failures],
        "alerts": alerts.to_dict() if alerts is not None else None,
        "warnings": list(cluster.warnings) if cluster is not None else [],
    }


def _print_table(report: DetectionReport, now: datetime) -> None:
    table = Table(title=f"Findings at {now.isoformat(timespec='seconds')}", show_header=True)
    for col in ("kind", "severity", "subject", "action", "summary"):
        table.add_column(col, overflow="fold")
    for f in report.findings:
        table.add_row(f.kind, f.severity, f.subject, f.action, f.summary)
    if report.findings:
        print_table(table)
        return
    ran = len(report.ran)
    if not report.skipped and not report.failures:
        print_line(f"no findings: all {ran} rule(s) ran")
    elif ran:
        print_line(f"no findings from the {ran} rule(s) that ran; the others did not run (below)")
    else:
        print_line("nothing evaluated: no rule ran (below)")


def _say_rules_and_alerts(report: DetectionReport, alerts: AlertsSent | None) -> None:
    """On stderr, for people: which rules ran, which were skipped and why, which could not be
    evaluated, and where the alerts went (how many)."""
    err = sys.stderr
    ran = f" ({', '.join(report.ran)})" if report.ran else ""
    parts = [f"{len(report.ran)} ran{ran}"]
    if report.skipped:
        parts.append(f"{len(report.skipped)} skipped")
    if report.failures:
        parts.append(f"{len(report.failures)} not evaluated")
    err.write(f"rules: {', '.join(parts)}\n")
    for name, why in report.skipped.items():
        err.write(f"skipped rule {name}: {why}\n")
    for failure in report.failures:
        err.write(f"not evaluated: {redact_text(str(failure))}\n")
    if alerts is None:
        err.write("alerts: not sent (no --alertmanager)\n")
        return
    for r in alerts.results:
        if r["outcome"] == "failed":
            err.write(f"alerts: not delivered to {r['url']}: {r.get('reason', '')}\n")
        elif r["outcome"] == "idle":
            err.write(f"alerts: {r['url']} already up to date (nothing changed)\n")
        else:
            err.write(
                f"alerts: delivered to {r['url']}: {r['firing']} firing, {r['resolved']} resolved\n"
            )


# --- rules check ---------------------------------------------------------------------------------


@rules_app.command("check")
def rules_check(
    paths: Annotated[
        list[Path] | None,
        typer.Argument(
            help="Rule files or directories (default: $DEFRAG_DETECTION__RULES_DIR, else the "
            "shipped rules)."
        ),
    ] = None,
    prometheus: Annotated[
        str | None,
        typer.Option("--prometheus", help="Also ask this Prometheus to parse every query."),
    ] = None,
    output: OutputOpt = Output.table,
) -> None:
    """Validate rule files: types, durations, detectors, and every query's PromQL.

    PromQL is parsed by Prometheus itself: the server given with --prometheus, else the local
    ``promtool`` (skipped with a note when neither is available).
    """
    ruleset = read_rules(list(paths or []))
    queries = [
        (loaded, path, query) for loaded in ruleset for path, query in loaded.rule.promql().items()
    ]
    if prometheus:
        issues = _check_with_server(queries, make_source(prometheus, None, None, False, 10.0))
        checker = f"Prometheus at {redact_url(prometheus)}"
    elif shutil.which("promtool"):
        issues = _check_with_promtool(queries)
        checker = "promtool"
    else:
        issues, checker = [], ""
    if issues:
        fail_with_issues(issues)
    files = sorted({r.file for r in ruleset})
    note = f"PromQL checked by {checker}" if checker else "PromQL not checked (no promtool)"
    if output is not Output.table:
        data = {"rules": [r.rule.name for r in ruleset], "files": files, "promql": checker or None}
        print_data(data, output)
        return
    console.print(f"{len(ruleset)} rule(s) in {len(files)} file(s) OK; {note}", soft_wrap=True)


Query = tuple["LoadedRule", str, str]


def _issue(loaded: LoadedRule, path: str, message: str) -> RuleIssue:
    from defrag.rules import RuleIssue

    field = f"rules[{loaded.index}].{path}"
    return RuleIssue(
        loaded.file, loaded.line_of(path), field, f"rule {loaded.rule.name}: {message}"
    )


def _check_with_server(queries: list[Query], source: PrometheusSource) -> list[RuleIssue]:
    from defrag.adapters.prometheus import MetricsError, PrometheusUnreachable, PromQLError

    issues = []
    for loaded, path, query in queries:
        try:
            source.instant(query)
        except PromQLError as exc:
            issues.append(_issue(loaded, path, f"invalid PromQL: {exc.prometheus_message}"))
        except PrometheusUnreachable as exc:
            raise UserError(str(exc), ExitCode.UNREACHABLE) from None
        except MetricsError as exc:
            raise UserError(str(exc)) from None
    return issues


_PROMTOOL_LINE = re.compile(r'rule (\d+), "q\d+": (.*)$')


def _check_with_promtool(queries: list[Query]) -> list[RuleIssue]:
    """Parse every query with promtool, as recording rules of a throwaway file."""
    if not queries:
        return []
    doc = {
        "groups": [
            {
                "name": "defrag-rules-check",
                "rules": [{"record": f"q{i}", "expr": q} for i, (_, _, q) in enumerate(queries)],
            }
        ]
    }
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "check.yaml"
        path.write_text(yaml.safe_dump(doc))
        promtool = shutil.which("promtool") or "promtool"
        done = subprocess.run(
            [promtool, "check", "rules", str(path)], capture_output=True, text=True, check=False
        )
    if done.returncode == 0:
        return []
    issues = []
    for line in (done.stdout + done.stderr).splitlines():
        match = _PROMTOOL_LINE.search(line)
        if match:
            loaded, field, _ = queries[int(match.group(1)) - 1]
            message = match.group(2).replace("could not parse expression: ", "")
            issues.append(_issue(loaded, field, f"invalid PromQL (promtool): {message}"))
    if not issues:
        raise UserError(f"promtool failed: {(done.stderr or done.stdout).strip()}")
    return issues
