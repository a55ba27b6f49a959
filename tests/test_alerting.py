"""Finding → alert mapping and the active-alert state (pure, no Alertmanager)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import pytest

import defrag.detectors  # noqa: F401  (registers the built-in detectors and their alerts)
from defrag.alerting import (
    ALERTS,
    RUNBOOK_URL,
    ActiveAlerts,
    Alert,
    AlertSendError,
    AlertTemplate,
    alert_name,
    own_alert_names,
    parse_rfc3339,
    rfc3339,
    subject_labels,
)
from defrag.detect.findings import Finding

T0 = datetime(2026, 3, 2, 12, 0, tzinfo=UTC)
TEMPLATE = AlertTemplate(cluster="prod-a", generator_url="http://defrag.example/f")


def finding(kind: str = "leak", subject: str = "pod/ml/train-0", **kw: object) -> Finding:
    kw.setdefault("severity", "warning")
    kw.setdefault("summary", f"{kind} on {subject}")
    return Finding(kind=kind, subject=subject, **kw)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("kind", "subject", "labels", "expected"),
    [
        ("fragmentation", "cluster", {}, "GPUClusterFragmented"),
        ("fragmentation", "node/gpu-7", {}, "GPUNodeFragmented"),
        ("fragmentation", "gpu/gpu-7/3", {"node": "gpu-7"}, "GPUNodeFragmented"),
        ("leak", "pod/ml/train-0", {}, "GPUMemoryLeakSuspected"),
        ("starvation", "pod/ml/big-job", {}, "GPUJobStarved"),
        ("unsatisfiable", "pod/ml/huge-job", {}, "GPUJobUnsatisfiable"),
        ("plan-blocked", "plan/p-1", {}, "DefragPlanBlocked"),
        ("execution-failed", "plan/p-1", {}, "DefragExecutionFailed"),
        ("circuit-open", "cluster", {}, "DefragCircuitOpen"),
        ("idle", "cluster", {}, None),
    ],
)
def test_alert_name_by_kind_and_subject(
    kind: str, subject: str, labels: dict[str, str], expected: str | None
) -> None:
    assert alert_name(finding(kind, subject, labels=labels)) == expected
    if expected is not None:
        assert expected in own_alert_names()


@pytest.mark.parametrize(
    ("subject", "expected"),
    [
        ("node/gpu-7", {"node": "gpu-7"}),
        ("pod/ml/train-0", {"namespace": "ml", "pod": "train-0"}),
        ("gpu/gpu-7/3", {"node": "gpu-7", "gpu": "3"}),
        ("cluster", {}),
        ("pod/only-name", {}),  # malformed: no label guessed
        ("node/", {}),
    ],
)
def test_subject_labels(subject: str, expected: dict[str, str]) -> None:
    assert subject_labels(subject) == expected


def test_alert_labels_annotations_and_links() -> None:
    f = finding(
        "leak",
        "pod/ml/train-0",
        severity="critical",
        evidence={"slope_mib_per_h": 2000.0, "query": "DCGM_FI_DEV_FB_USED"},
        since=T0,
        labels={"node": "gpu-7", "detector": "gpu-memory-leak", "team": "ignored"},
    )
    alert = TEMPLATE.alert(f)
    assert alert is not None
    assert dict(alert.labels) == {
        "alertname": "GPUMemoryLeakSuspected",
        "severity": "critical",
        "cluster": "prod-a",
        "node": "gpu-7",
        "namespace": "ml",
        "pod": "train-0",
        "detector": "gpu-memory-leak",
    }
    assert alert.annotations["summary"] == "leak on pod/ml/train-0"
    assert alert.annotations["runbook_url"] == f"{RUNBOOK_URL}#gpumemoryleaksuspected"
    assert alert.annotations["description"].splitlines() == [
        "leak on pod/ml/train-0, since 2026-03-02T12:00:00.000Z",
        "query: DCGM_FI_DEV_FB_USED",
        "slope_mib_per_h: 2000",
    ]
    assert alert.generator_url == f"http://defrag.example/f/{f.fingerprint}"
    assert alert.starts_at == T0
    body = alert.to_api(T0 + timedelta(minutes=15))
    assert body["startsAt"] == "2026-03-02T12:00:00.000Z"
    assert body["endsAt"] == "2026-03-02T12:15:00.000Z"
    assert body["generatorURL"] == alert.generator_url


def test_finding_labels_win_over_subject_and_detector_defaults_to_kind() -> None:
    alert = TEMPLATE.alert(finding("fragmentation", "node/a", labels={"node": "b"}))
    assert alert is not None
    assert alert.labels["node"] == "b"
    assert alert.labels["detector"] == "fragmentation"


def test_idle_is_never_alerted_and_clashing_findings_make_one_alert() -> None:
    findings = [
        finding("idle", "cluster"),
        finding("fragmentation", "node/a", summary="first"),
        finding("fragmentation", "node/a", summary="second"),  # same labels
        finding("fragmentation", "cluster"),
    ]
    alerts = TEMPLATE.alerts(findings)
    assert sorted(a.name for a in alerts.values()) == ["GPUClusterFragmented", "GPUNodeFragmented"]
    node = next(a for a in alerts.values() if a.name == "GPUNodeFragmented")
    assert node.annotations["summary"] == "first"


@pytest.mark.parametrize(
    ("labels", "generator", "owned"),
    [
        ({"alertname": "GPUJobStarved", "cluster": "prod-a"}, "http://defrag.example/f/x", True),
        ({"alertname": "GPUJobStarved", "cluster": "prod-b"}, "http://defrag.example/f/x", False),
        ({"alertname": "GPUJobStarved", "cluster": "prod-a"}, "http://prometheus/graph", False),
        ({"alertname": "NodeDown", "cluster": "prod-a"}, "http://defrag.example/f/x", False),
    ],
)
def test_owns_only_this_senders_alerts(labels: dict[str, str], generator: str, owned: bool) -> None:
    assert TEMPLATE.owns(labels, generator) is owned


def test_time_formats_round_trip() -> None:
    # Alertmanager answers with nanoseconds; Python keeps microseconds.
    assert parse_rfc3339("2026-03-02T12:00:01.123456789Z") == T0 + timedelta(
        seconds=1, microseconds=123456
    )
    assert parse_rfc3339("2026-03-02T12:00:00Z") == T0
    east = datetime(2026, 3, 2, 14, 0, tzinfo=timezone(timedelta(hours=2)))
    assert rfc3339(east) == "2026-03-02T12:00:00.000Z"
    assert rfc3339(datetime(2026, 3, 2, 12, 0)) == "2026-03-02T12:00:00.000Z"  # naive = UTC


def keyed(*findings: Finding) -> dict[tuple[tuple[str, str], ...], Alert]:
    return TEMPLATE.alerts(findings)


def test_state_fires_keeps_and_resolves() -> None:
    state = ActiveAlerts()
    a, b = finding("leak", "pod/ml/a"), finding("leak", "pod/ml/b")
    first = state.update(keyed(a, b), T0)
    assert [x.labels["pod"] for x in first.fired] == ["a", "b"]
    assert first.kept == () and first.resolved == ()
    # no `since`: the start is the first cycle's time, and it stays so
    assert {x.starts_at for x in first.fired} == {T0}
    second = state.update(keyed(a), T0 + timedelta(minutes=1))
    assert second.fired == ()
    assert [(x.labels["pod"], x.starts_at) for x in second.kept] == [("a", T0)]
    assert [x.labels["pod"] for x in second.resolved] == ["b"]
    assert len(state) == 1


def test_severity_change_resolves_old_alert_and_fires_new() -> None:
    state = ActiveAlerts()
    state.update(keyed(finding("starvation", "pod/ml/j", severity="warning")), T0)
    step = state.update(keyed(finding("starvation", "pod/ml/j", severity="critical")), T0)
    assert [x.labels["severity"] for x in step.fired] == ["critical"]
    assert [x.labels["severity"] for x in step.resolved] == ["warning"]


def test_adopted_alerts_keep_their_start_and_resolve_when_gone() -> None:
    """A restarted sender adopts what Alertmanager holds: still found → kept with the old
    start (no re-fire); no longer found → resolved (not forgotten)."""
    a, b = finding("leak", "pod/ml/a"), finding("leak", "pod/ml/b")
    held = [x.with_start(T0) for x in keyed(a, b).values()]
    state = ActiveAlerts()
    assert state.adopt(held) == 2
    assert state.adopt(held) == 0  # idempotent
    step = state.update(keyed(a), T0 + timedelta(hours=1))
    assert step.fired == ()
    assert [(x.labels["pod"], x.starts_at) for x in step.kept] == [("a", T0)]
    assert [x.labels["pod"] for x in step.resolved] == ["b"]


def test_earliest_start_wins() -> None:
    state = ActiveAlerts()
    late = finding("leak", "pod/ml/a", since=T0 + timedelta(hours=1))
    state.update(keyed(late), T0 + timedelta(hours=2))
    state.adopt([x.with_start(T0) for x in keyed(late).values()])
    step = state.update(keyed(late), T0 + timedelta(hours=3))
    assert step.kept[0].starts_at == T0


def test_send_error_names_every_url() -> None:
    error = AlertSendError({"http://b:9093": "HTTP 500", "http://a:9093": "cannot connect"})
    assert str(error) == (
        "no Alertmanager took the alerts (http://a:9093: cannot connect; http://b:9093: HTTP 500)"
    )


def test_a_failing_rule_is_its_own_alert_named_by_a_rule_label() -> None:
    f = finding(
        "rule-failed",
        "rule/gpu-memory-leak",
        labels={"rule": "gpu-memory-leak", "detector": "defrag"},
        evidence={"reason": "Prometheus at http://prom:9090 is unreachable"},
    )
    alert = TEMPLATE.alert(f)
    assert alert is not None and alert.rule == ""  # never held itself
    assert dict(alert.labels) == {
        "alertname": "DefragRuleEvaluationFailed",
        "severity": "warning",
        "cluster": "prod-a",
        "detector": "defrag",
        "rule": "gpu-memory-leak",
    }
    assert alert.annotations["runbook_url"] == f"{RUNBOOK_URL}#defragruleevaluationfailed"
    assert "DefragRuleEvaluationFailed" in own_alert_names()


LEAK_A = finding("leak", "pod/ml/a", labels={"rule": "leak-rule"})
LEAK_B = finding("leak", "pod/ml/b", labels={"rule": "leak-rule"})
FRAG = finding("fragmentation", "node/gpu-1", labels={"rule": "frag-rule"})
BLOCKED = finding("plan-blocked", "cluster")


@pytest.mark.parametrize(
    ("now_found", "held", "kept", "resolved"),
    [
        # the leak rule could not be evaluated: its alerts stay, the others follow findings
        ((FRAG,), ("leak-rule",), {"pod/ml/a", "pod/ml/b", "node/gpu-1"}, {"cluster"}),
        ((), ("leak-rule", "frag-rule"), {"pod/ml/a", "pod/ml/b", "node/gpu-1"}, {"cluster"}),
        # evaluated again: what it no longer finds resolves
        ((LEAK_A,), (), {"pod/ml/a"}, {"pod/ml/b", "node/gpu-1", "cluster"}),
        # a held rule that still finds something: kept as usual, never fired again
        ((LEAK_A,), ("leak-rule",), {"pod/ml/a", "pod/ml/b"}, {"node/gpu-1", "cluster"}),
    ],
)
def test_alerts_of_a_rule_not_evaluated_are_held_as_they_were(
    now_found: tuple[Finding, ...], held: tuple[str, ...], kept: set[str], resolved: set[str]
) -> None:
    """Before: ActiveAlerts knew nothing of rules; a cycle whose leak rule failed resolved every
    leak alert (and the next good cycle fired them again)."""

    def subject(a: Alert) -> str:
        return a.annotations["description"].split(" on ", 1)[1].split(",")[0]

    state = ActiveAlerts()
    state.update(keyed(LEAK_A, LEAK_B, FRAG, BLOCKED), T0)
    step = state.update(keyed(*now_found), T0 + timedelta(minutes=5), held_rules=held)
    assert step.fired == ()
    assert {subject(a) for a in step.kept} == kept
    assert {subject(a) for a in step.resolved} == resolved
    assert all(a.starts_at == T0 for a in step.kept)  # same alert, same start


def test_the_rule_of_an_adopted_alert_survives_a_restart() -> None:
    """An alert read back from Alertmanager after a restart names its rule (annotation), so a
    rule failing in the first cycle after the restart still holds it."""
    from defrag.adapters.alertmanager import AlertmanagerSink

    sent = TEMPLATE.alert(LEAK_A)
    assert sent is not None and sent.annotations["rule"] == "leak-rule"
    sink = AlertmanagerSink(
        ["http://am:9093"], cluster="prod-a", generator_url="http://defrag.example/f"
    )
    item = sent.to_api(T0 + timedelta(minutes=15))  # Alertmanager's gettableAlert has these
    adopted = sink._parse(item)
    assert adopted is not None and adopted.rule == "leak-rule"
    state = ActiveAlerts()
    state.adopt([adopted])
    step = state.update({}, T0, held_rules=("leak-rule",))
    assert step.resolved == () and len(step.kept) == 1


NOT_ALERTED = {"idle", "packing"}  # the window gate; make-room's input


def test_every_finding_kind_has_an_alert_with_a_runbook() -> None:
    """A finding kind without an alert would be detected and never reach anyone: every kind a
    registered detector (or the daemon) emits has an alert with a runbook section, or is
    declared never alerted; the built-in kinds are all there."""
    from pathlib import Path

    from defrag.detect.findings import DAEMON_KINDS
    from defrag.detectors import registry

    kinds = set(ALERTS.kinds())
    assert {"fragmentation", "leak", "starvation", "idle", *DAEMON_KINDS} <= kinds
    for detector in registry.detectors():
        assert set(detector.kinds) <= kinds, detector.name
    assert {k for k in kinds if not ALERTS.alerted(k)} == NOT_ALERTED
    runbooks = (Path(__file__).resolve().parents[1] / "docs" / "alerts.md").read_text()
    for kind in kinds:
        for spec in ALERTS.alerted(kind):
            assert f"## {spec.name}" in runbooks or f"### {spec.name}" in runbooks, spec.name
            assert spec.anchor == spec.name.lower()  # the heading's anchor on GitHub


def _prometheus_alerts() -> list[dict[str, Any]]:
    import yaml

    rules = Path(__file__).resolve().parents[1] / "rules" / "prometheus"
    return [
        rule
        for path in sorted(rules.glob("*.yaml"))
        for group in yaml.safe_load(path.read_text())["groups"]
        for rule in group["rules"]
        if "alert" in rule
    ]


def test_every_prometheus_side_alert_links_its_runbook_section() -> None:
    """The rules of rules/prometheus/ page someone too: each has an absolute runbook_url to its
    own section of docs/alerts.md, and the self-monitoring alerts are there."""
    runbooks = (Path(__file__).resolve().parents[1] / "docs" / "alerts.md").read_text()
    alerts = _prometheus_alerts()
    names = {rule["alert"] for rule in alerts}
    assert {
        "DefragDown",
        "DefragCyclesFailing",
        "DefragEvictionsFailing",
        "DefragLeaseFlapping",
        "DefragRuleEvaluationFailing",
        "DefragSchedulerUnavailable",
        "DefragExtenderDown",
        "DefragAgentUnavailable",
        "DefragAgentDown",
    } <= names
    assert not names & set(own_alert_names())  # never the daemon's own names
    for rule in alerts:
        name = rule["alert"]
        assert rule["annotations"].get("runbook_url") == f"{RUNBOOK_URL}#{name.lower()}", name
        assert f"## {name}\n" in runbooks or f"### {name}\n" in runbooks, name


def test_self_monitoring_alerts_read_series_the_daemon_exports() -> None:
    """A self-monitoring rule on a series nobody exports would never fire."""
    import re

    from defrag.daemon.service import DaemonMetrics

    families = list(DaemonMetrics().registry.collect())
    exported = {f.name for f in families if f.type == "gauge"}
    exported |= {f"{f.name}_total" for f in families if f.type == "counter"} | {"up"}
    # The second scheduler's and the agent's workloads, as kube-state-metrics exports them
    # (kubernetes/kube-state-metrics docs/metrics/workload/deployment-metrics.md and
    # daemonset-metrics.md, both STABLE).
    exported |= {
        "kube_deployment_spec_replicas",
        "kube_deployment_status_replicas_available",
        "kube_daemonset_status_number_unavailable",
    }
    for rule in _prometheus_alerts():
        if rule["labels"].get("detector") != "self":
            continue
        used = set(re.findall(r"\b(defrag_[a-z_]+|kube_[a-z_]+|up)\b", rule["expr"]))
        assert used and used <= exported, (rule["alert"], used - exported)


@pytest.mark.parametrize(
    ("overrides", "runbook", "generator"),
    [
        ({}, RUNBOOK_URL, "http://defrag.invalid/findings"),
        (
            {
                "alerts.runbook_url": "https://wiki.example/defrag/alerts/",
                "alerts.generator_url": "https://grafana.example/d/defrag",
            },
            "https://wiki.example/defrag/alerts",
            "https://grafana.example/d/defrag",
        ),
    ],
)
def test_alert_links_come_from_the_settings(
    overrides: dict[str, str], runbook: str, generator: str
) -> None:
    from defrag.settings import load_settings

    settings = load_settings(None, overrides)
    template = AlertTemplate("c", settings.alerts.generator_url, settings.alerts.runbook_url)
    alert = template.test_alert(datetime(2026, 1, 1, tzinfo=UTC))
    assert alert.annotations["runbook_url"] == f"{runbook}#defragtestalert"
    assert alert.generator_url == f"{generator}/test"


@pytest.mark.parametrize("bad", ["docs/alerts.md", "ftp://x/alerts.md", "https://"])
def test_a_relative_runbook_url_is_refused(bad: str) -> None:
    from defrag.settings import SettingsError, load_settings

    with pytest.raises(SettingsError, match=r"alerts\.runbook_url"):
        load_settings(None, {"alerts.runbook_url": bad})
