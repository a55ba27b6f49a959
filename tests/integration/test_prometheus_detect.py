"""Leak and idle detection against the real Prometheus, on backfilled 12-hour DCGM histories.

A dozen GPUs at 30 s: one linear leak, one plateau after warm-up, one sawtooth, one step, flat
ones (one of them shared by two pods). The leak detector must flag exactly the leak, with the
predicted exhaustion time within 10% of the truth — with plain ``pod`` labels and with the
``exported_pod`` variant a ServiceMonitor without honorLabels produces.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from datetime import datetime, timedelta
from pathlib import Path

import pytest
from typer.testing import CliRunner

from defrag.adapters.prometheus import (
    PrometheusSource,
    PrometheusUnreachable,
    PromQLError,
    apply_gpu_indices,
    gpu_indices_by_pod,
)
from defrag.cli import app
from defrag.detection import DetectionError, detect, idle_status, report_extras, run_detection
from defrag.detectors.leak.core import DcgmLabels
from defrag.detectors.leak.registration import LeakRuleFields, _ask_leak_queries
from defrag.model.cluster import Cluster
from defrag.model.resources import Node, Pod
from defrag.ports import Sample
from defrag.rules import load_rules
from defrag.scoring.profile import ScoringProfile
from tests.support.binaries import free_port, require_binary
from tests.support.prometheus import (
    END,
    HOUR,
    leak_exhaustion,
    make_fleet,
    prometheus_server,
    write_openmetrics,
)

PROFILE = ScoringProfile.default()
"""The default scoring profile (no cluster snapshot: rules build theirs from kube-state)."""

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]
SHAPES = ["leak", "plateau", "sawtooth", "step"] + ["flat"] * 8 + ["leak"]
# GPU 11 (node-001 GPU 3, flat) and GPU 12 (node-001 GPU 4, leaking) are each shared by two
# pods: DCGM exports one series per pod for them.
FLEET = make_fleet(SHAPES, hours=12, step_s=30, shared=(11, 12))
# The single-pod leak, and the shared one reported as unattributable (subjects sort gpu < pod).
LEAKS = ["gpu/node-001/4", "pod/ml/leak-0"]


@pytest.fixture(scope="module", params=["pod", "exported_pod"])
def prom(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    exported = request.param == "exported_pod"
    path = tmp_path_factory.mktemp("om") / "history.om"
    with path.open("w") as out:
        write_openmetrics(FLEET, out, exported=exported)
    with prometheus_server(path) as server:
        yield server.url


def source(url: str) -> PrometheusSource:
    return PrometheusSource(url, retries=0, timeout_s=5)


@pytest.mark.parametrize("prefilter", [True, False])
def test_leak_detector_flags_exactly_the_leak(prom: str, prefilter: bool, tmp_path: Path) -> None:
    text = (ROOT / "rules" / "leak.yaml").read_text()
    rule_file = tmp_path / "leak.yaml"
    rule_file.write_text(text.replace("prefilter: true", f"prefilter: {str(prefilter).lower()}"))
    rules = load_rules([rule_file])
    assert rules.rules[0].rule.prefilter is prefilter  # type: ignore[union-attr]
    findings = detect(rules, source(prom), None, END, profile=PROFILE)
    assert [f.subject for f in findings] == LEAKS
    shared, leak = findings
    assert "unattributable" in shared.summary and "pod" not in shared.labels
    assert shared.evidence["pods"] == ["ml/leak-12-a", "ml/leak-12-b"]
    assert leak.labels["pod"] == "leak-0" and leak.labels["namespace"] == "ml"
    assert leak.labels["node"] == "node-000" and leak.labels["gpu"] == "0"
    assert leak.evidence["query"] == "DCGM_FI_DEV_FB_USED"
    # truth: 8000 MiB + 2000 MiB/h on 81920 MiB, starting 12 h before END → 24.96 h after END
    truth_h = (leak_exhaustion(END.timestamp() - 12 * HOUR) - END.timestamp()) / HOUR
    predicted_h = leak.evidence["hours_to_exhaust"]
    assert abs(predicted_h - truth_h) <= 0.10 * truth_h, (predicted_h, truth_h)
    predicted_at = datetime.fromisoformat(leak.evidence["exhaust_at"])
    assert abs(predicted_at - (END + timedelta(hours=truth_h))) < timedelta(hours=0.1 * truth_h)


def test_gpu_indices_by_pod_reads_dcgm_labels(prom: str) -> None:
    holdings = gpu_indices_by_pod(source(prom), "DCGM_FI_DEV_FB_USED", END, DcgmLabels())
    assert holdings["ml/leak-0"].node == "node-000" and holdings["ml/leak-0"].gpus == (0,)
    assert holdings["ml/flat-9"].node == "node-001" and holdings["ml/flat-9"].gpus == (1,)
    # the shared GPU (position 11 = node-001 GPU 3) is held by both pods
    assert holdings["ml/flat-11-a"].gpus == holdings["ml/flat-11-b"].gpus == (3,)
    assert not any(k.startswith("gpu-operator/") for k in holdings)  # never the exporter pod

    nodes = [Node("node-000", 64000, 512000, num_gpu=8, gpu_model="H100")]
    pods = [
        Pod("leak-0", "ml", num_gpu=1, node="node-000", phase="Running"),
        Pod("other", "ml", num_gpu=1, node="node-000", phase="Running"),
    ]
    cluster = Cluster.build(nodes, pods)
    update = apply_gpu_indices(cluster, holdings)
    assert update.cluster.pods["ml/leak-0"].gpu_indices == (0,)
    # "other" is re-assigned around GPU 0 (best fit: the lowest free index left)
    assert update.cluster.pods["ml/other"].gpu_indices == (1,)
    assert update.applied == ("ml/leak-0",)
    assert update.skipped["ml/flat-9"] == "not a bound pod of the cluster"


def test_idle_gate_and_report_extras(prom: str) -> None:
    rules = load_rules([ROOT / "rules" / "idle.yaml", ROOT / "rules" / "leak.yaml"])
    status = idle_status(rules, source(prom), END)
    assert status.idle, status.reasons  # every GPU at ~10% (sd 2) for 12 h, threshold 20%
    extras = report_extras(source(prom), rules, END)
    util = extras["utilisation"]
    assert 9.0 < util["p50"] < 11.0 and util["p50"] <= util["p90"] <= util["p99"] < 20.0
    assert [s["subject"] for s in extras["leak_suspects"]] == LEAKS


def test_bad_promql_names_the_query_and_prometheus_message(prom: str) -> None:
    with pytest.raises(PromQLError) as caught:
        source(prom).instant("sum(rate(DCGM_FI_DEV_FB_USED[5m])", END)
    message = str(caught.value)
    assert "sum(rate(DCGM_FI_DEV_FB_USED[5m])" in message
    assert "bad_data" in message and "parse error" in message


def test_failed_rule_is_reported_and_others_still_run(prom: str, tmp_path: Path) -> None:
    (tmp_path / "r.yaml").write_text(
        (ROOT / "rules" / "leak.yaml").read_text()
        + "  - name: broken\n    detector: idle\n    query: avg(DCGM_FI_DEV_GPU_UTIL\n"
    )
    rules = load_rules([tmp_path])
    report = run_detection(rules, source(prom), None, END, profile=PROFILE)
    assert [f.subject for f in report.findings] == LEAKS
    [failure] = report.failures
    assert failure.rule == "broken" and "parse error" in failure.message
    with pytest.raises(DetectionError, match=r"rule broken \(.*r.yaml:\d+\)"):
        detect(rules, source(prom), None, END, profile=PROFILE)


def test_unreachable_server_is_a_clear_error() -> None:
    url = f"http://127.0.0.1:{free_port()}"
    with pytest.raises(PrometheusUnreachable, match=f"Prometheus at {url} is unreachable"):
        source(url).instant("up", END)


# --- the command line against the same server ---------------------------------------------------

runner = CliRunner()


def test_cli_detect_json_lists_the_leak(prom: str) -> None:
    result = runner.invoke(
        app,
        [
            "detect",
            "--prometheus",
            prom,
            "--at",
            END.isoformat(),
            "-o",
            "json",
            "--rules",
            str(ROOT / "rules" / "leak.yaml"),
            "--rules",
            str(ROOT / "rules" / "idle.yaml"),
        ],
    )
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)
    assert [(f["kind"], f["subject"]) for f in data["findings"]] == [
        ("leak", "gpu/node-001/4"),
        ("leak", "pod/ml/leak-0"),
        ("idle", "cluster"),
    ]
    leak = data["findings"][1]
    assert {"kind", "subject", "severity", "fingerprint", "evidence"} <= set(leak)
    assert leak["evidence"]["query"] == "DCGM_FI_DEV_FB_USED"


BAD_PROMQL = "rules:\n  - name: i\n    detector: idle\n    query: avg(DCGM_FI_DEV_GPU_UTIL\n"


def test_cli_rules_check_asks_prometheus_to_parse(prom: str, tmp_path: Path) -> None:
    (tmp_path / "r.yaml").write_text(BAD_PROMQL)
    result = runner.invoke(app, ["rules", "check", str(tmp_path), "--prometheus", prom])
    assert result.exit_code == 2
    assert (
        f"{tmp_path / 'r.yaml'}:4: rules[0].query: rule i: invalid PromQL: bad_data:"
        in result.stderr
    )
    assert "parse error" in result.stderr
    ok = runner.invoke(app, ["rules", "check", str(ROOT / "rules"), "--prometheus", prom])
    assert ok.exit_code == 0 and f"PromQL checked by Prometheus at {prom}" in ok.stdout


def test_cli_rules_check_uses_promtool_offline(tmp_path: Path) -> None:
    require_binary("promtool")
    (tmp_path / "r.yaml").write_text(BAD_PROMQL)
    result = runner.invoke(app, ["rules", "check", str(tmp_path)])
    assert result.exit_code == 2
    assert (
        f"{tmp_path / 'r.yaml'}:4: rules[0].query: rule i: invalid PromQL (promtool):"
        in result.stderr
    )
    assert "unclosed left parenthesis" in result.stderr


def test_cli_detect_unreachable_prometheus_exits_nonzero() -> None:
    url = f"http://127.0.0.1:{free_port()}"
    result = runner.invoke(
        app, ["detect", "--prometheus", url, "--prom-timeout", "2", "-r", str(ROOT / "rules")]
    )
    assert result.exit_code == 3  # incomplete
    # one line per failed rule, naming the rule, its file and the query
    assert (
        f"rule gpu-memory-leak ({ROOT / 'rules' / 'leak.yaml'}:4): Prometheus at {url} "
        "is unreachable" in result.stderr
    )
    # the first query asked: whether Prometheus records the leak rule's series
    # (rules/prometheus/defrag.detection.rules.yaml's last rule)
    assert "query 'max(timestamp(cluster:DCGM_FI_DEV_FB_USED:count))'" in result.stderr
    # leak, idle, and the four from kube-state-metrics, named
    assert (
        "6 rule(s) could not be evaluated: gpu-fragmentation, cluster-idle, gpu-memory-leak, "
        "high-priority-starved, fragmented-starved, unsatisfiable-pending" in result.stderr
    )
    assert "Traceback" not in result.output


def test_leak_suspects_ignore_the_horizon(prom: str, tmp_path: Path) -> None:
    # exhaustion ≈ 25 h after END: beyond a 12 h horizon, so no finding — but still a suspect
    text = (ROOT / "rules" / "leak.yaml").read_text().replace("horizon: 48h", "horizon: 12h")
    (tmp_path / "leak.yaml").write_text(text)
    rules = load_rules([tmp_path / "leak.yaml"])
    assert detect(rules, source(prom), None, END, profile=PROFILE) == []
    extras = report_extras(source(prom), rules, END)
    assert [s["subject"] for s in extras["leak_suspects"]] == LEAKS


class OneAtATime:
    """The source's plain methods only: the leak rule asks it its one range query."""

    def __init__(self, inner: PrometheusSource) -> None:
        self.inner = inner

    def instant(self, query: str, at: datetime | None = None) -> list[Sample]:
        return self.inner.instant(query, at)

    def range(self, query: str, start: datetime, end: datetime, step_s: float) -> list[Sample]:
        return self.inner.range(query, start, end, step_s)


@pytest.mark.parametrize("prefilter", [True, False])
def test_two_rounds_answer_as_the_one_range_query(
    prom: str, prefilter: bool, tmp_path: Path
) -> None:
    # the prefilter first, then the medians of the GPUs that passed (narrowed by UUID, joined
    # here) in shards: the same series, points and order as the one query with its and on(...)
    text = (ROOT / "rules" / "leak.yaml").read_text()
    rule_file = tmp_path / "leak.yaml"
    rule_file.write_text(text.replace("prefilter: true", f"prefilter: {str(prefilter).lower()}"))
    rule = load_rules([rule_file]).rules[0].rule
    assert isinstance(rule, LeakRuleFields)
    start = END - timedelta(hours=6)
    one = _ask_leak_queries(rule, OneAtATime(source(prom)), start, END)
    two = _ask_leak_queries(rule, source(prom), start, END)
    assert two == one
    every = len(FLEET.gpus) + 2  # the two shared GPUs have a series per pod
    if prefilter:  # the flat GPUs do not pass; the leaks do
        assert 0 < len(one[0]) < every
    else:
        assert len(one[0]) == every
