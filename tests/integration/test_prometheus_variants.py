"""Leak detection against the real Prometheus on every DCGM label variant, backfilled.

One 8-hour history at 30 s holds five layouts of the same DCGM families, told apart by a
``variant`` label the rules select on. Label sets follow NVIDIA/dcgm-exporter's own writer
(``internal/pkg/rendermetrics/render_metrics.go``: ``gpu``, ``UUID``, ``pci_bus_id``,
``device``, ``modelName``, MIG ``GPU_I_PROFILE``/``GPU_I_ID``, ``hostname`` since commit d5e5f51
"Rename Hostname label to hostname", nothing with ``--no-hostname``) and what Prometheus makes of
them behind the chart's ServiceMonitor (``deployment/values.yaml``: ``honorLabels: false`` — the
exporter's own ``namespace``/``pod``/``container`` are target labels and the workload's become
``exported_*``), or with the GPU operator's suggested relabelling of
``__meta_kubernetes_pod_node_name`` into ``instance`` (``deployments/gpu-operator/values.yaml``).

- ``hostname``: a leaking GPU and a flat one, ``DCGM_FI_DEV_FB_RESERVED`` exported;
- ``nohost``: ``--no-hostname``, no ``instance``: GPU 0 of two nodes, one leaking (keyed by UUID);
- ``instance``: the node name relabelled into ``instance``, pods as ``exported_pod``; another GPU
  whose ``instance`` is still ``address:port``;
- ``exporter``: pod mapping off behind the ServiceMonitor: only the exporter's own pod is named,
  and the exporter restarts (a new pod name) half-way;
- ``mig``: three MIG instances of one GPU: one leaking, a busy sibling refilling a cache, a flat
  one — each with its own capacity;
- ``bare``: series naming neither a UUID nor a node (the rule must say so).
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

from defrag.adapters.prometheus import PrometheusSource
from defrag.cli import app
from defrag.detection import run_detection
from defrag.detectors.leak.registration import LeakRule, leak_series
from defrag.rules import load_rules
from defrag.scoring.profile import ScoringProfile
from tests.support.prometheus import END, HOUR, gauge_family, prometheus_server

PROFILE = ScoringProfile.default()
"""The default scoring profile (no cluster snapshot: rules build theirs from kube-state)."""

pytestmark = pytest.mark.integration

HOURS = 8.0
TIMES = np.arange(END.timestamp() - HOURS * HOUR + 30, END.timestamp() + 1, 30.0)
H = (TIMES - TIMES[0]) / HOUR
RNG = np.random.default_rng(14)
GPU_MIB = 81920.0
MODEL = {"modelName": "NVIDIA H100 80GB HBM3", "device": "nvidia0"}


def noisy(clean: np.ndarray, sigma: float = 300.0) -> np.ndarray:
    return np.clip(clean + RNG.normal(0, sigma, len(clean)), 0, None)


def leak(start: float, rate: float) -> np.ndarray:
    return noisy(start + rate * H)


def flat(level: float) -> np.ndarray:
    return noisy(np.full_like(H, level))


# (labels, used MiB, capacity MiB (used + free), reserved MiB or None)
Row = tuple[dict[str, str], np.ndarray, float, float | None]


def gpu(uuid: str, index: str, **labels: str) -> dict[str, str]:
    return {"gpu": index, "UUID": uuid, "pci_bus_id": f"00000000:{index}A:00.0"} | MODEL | labels


def rows() -> list[Row]:
    out: list[Row] = []
    # hostname (dcgm-exporter main, honorLabels: true style pod labels); 512 MiB reserved
    host = {"variant": "hostname", "hostname": "node-a"}
    out.append(
        (
            gpu("GPU-a0", "0") | host | {"namespace": "ml", "pod": "leak-a", "container": "c"},
            leak(20000, 1536),
            GPU_MIB - 512,
            512.0,
        )
    )
    out.append((gpu("GPU-a1", "1") | host, flat(30000), GPU_MIB - 512, 512.0))
    # --no-hostname and no instance: GPU 0 of two nodes
    out.append((gpu("GPU-b0", "0") | {"variant": "nohost"}, leak(20000, 2048), GPU_MIB, None))
    out.append((gpu("GPU-c0", "0") | {"variant": "nohost"}, flat(60000), GPU_MIB, None))
    # node name relabelled into instance; workload pods renamed exported_* (honorLabels: false)
    target = {"namespace": "gpu-operator", "pod": "nvidia-dcgm-exporter-q8r4z"}
    target |= {"container": "nvidia-dcgm-exporter", "job": "nvidia-dcgm-exporter"}
    inst = {"variant": "instance", "instance": "node-c"} | target
    workload = {"exported_namespace": "ml", "exported_pod": "leak-c", "exported_container": "c"}
    out.append((gpu("GPU-d0", "0") | inst | workload, leak(30000, 1024), GPU_MIB, None))
    addr = {"variant": "instance", "instance": "10.0.0.7:9400"} | target
    out.append((gpu("GPU-e3", "3") | addr, flat(2000), GPU_MIB, None))
    # pod mapping off behind the ServiceMonitor: only the exporter is named (restarts at 4 h)
    out.append(
        (
            gpu("GPU-f0", "0") | {"variant": "exporter", "Hostname": "node-d"} | target,
            leak(30000, 2048),
            GPU_MIB,
            None,
        )
    )
    # MIG: three instances of GPU 2 on node-e, each its own capacity
    mig = {"variant": "mig", "hostname": "node-e", "namespace": "ml"}
    big = {"GPU_I_PROFILE": "3g.40gb"}
    out.append(
        (
            gpu("GPU-e2", "2") | mig | big | {"GPU_I_ID": "1", "pod": "mig-leak"},
            leak(12000, 1024),
            40192.0,
            None,
        )
    )
    cache = 15000.0 + 8000.0 * ((H % 0.75) / 0.75) + 600.0 * np.minimum(H, 2.0)  # warm-up + cache
    out.append(
        (
            gpu("GPU-e2", "2") | mig | big | {"GPU_I_ID": "2", "pod": "mig-busy"},
            noisy(cache),
            40192.0,
            None,
        )
    )
    small = {"GPU_I_PROFILE": "1g.10gb", "GPU_I_ID": "9", "pod": "mig-flat"}
    out.append((gpu("GPU-e2", "2") | mig | small, flat(4000), 9851.0, None))
    # neither UUID nor a node label
    out.append(({"gpu": "0", "variant": "bare"}, leak(1000, 1024), GPU_MIB, None))
    return out


ROWS = rows()


def write_history(path: Path) -> None:
    used, free, reserved = [], [], []
    for labels, values, capacity, res in ROWS:
        if labels.get("variant") == "exporter":  # a new exporter pod after a 2-min gap at 4 h
            first, second = H < 4.0, H >= 4.0 + 2 / 60
            renamed = labels | {"pod": "nvidia-dcgm-exporter-7hx2m"}
            for lab, keep in ((labels, first), (renamed, second)):
                used.append((lab, TIMES[keep], values[keep]))
                free.append((lab, TIMES[keep], capacity - values[keep]))
            continue
        used.append((labels, TIMES, values))
        free.append((labels, TIMES, np.clip(capacity - values, 0, None)))
        if res is not None:
            reserved.append((labels, TIMES, np.full_like(values, res)))
    with path.open("w") as out:
        out.write(gauge_family("DCGM_FI_DEV_FB_USED", used))
        out.write(gauge_family("DCGM_FI_DEV_FB_FREE", free))
        out.write(gauge_family("DCGM_FI_DEV_FB_RESERVED", reserved))
        out.write("# EOF\n")


@pytest.fixture(scope="module")
def prom(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    path = tmp_path_factory.mktemp("om") / "variants.om"
    write_history(path)
    with prometheus_server(path) as server:
        yield server.url


def rule_file(
    tmp_path: Path, variant: str, prefilter: bool = True, reserved: bool = False, name: str = "leak"
) -> Path:
    sel = f'{{variant="{variant}"}}'
    text = (
        f"rules:\n  - name: {name}\n    detector: leak\n    queries:\n"
        f"      used: DCGM_FI_DEV_FB_USED{sel}\n      free: DCGM_FI_DEV_FB_FREE{sel}\n"
        + (f"      reserved: DCGM_FI_DEV_FB_RESERVED{sel}\n" if reserved else "")
        + f"    prefilter: {str(prefilter).lower()}\n"
    )
    path = tmp_path / f"{variant}.yaml"
    path.write_text(text)
    return path


def source(url: str) -> PrometheusSource:
    return PrometheusSource(url, retries=0, timeout_s=10)


# variant → (subject, node label, gpu subject, capacity MiB, hours to exhaustion)
# hours: the noiseless line at END against the usable memory, e.g. hostname:
# 20000 + 1536 × 8 = 32288 at END; (81408 − 32288) / 1536 = 32.0 h
CASES = {
    "hostname": ("pod/ml/leak-a", "node-a", "gpu/node-a/0", 81920.0, 32.0),
    "nohost": ("gpu/GPU-b0", "", None, 81920.0, (81920 - 20000 - 2048 * 8) / 2048),
    "instance": ("pod/ml/leak-c", "node-c", "gpu/node-c/0", 81920.0, (81920 - 38192) / 1024),
    "exporter": ("gpu/node-d/0", "node-d", None, 81920.0, (81920 - 30000 - 2048 * 8) / 2048),
    "mig": ("pod/ml/mig-leak", "node-e", "gpu/node-e/2/mig-1", 40192.0, (40192 - 20192) / 1024),
}


@pytest.mark.parametrize("prefilter", [True, False])
@pytest.mark.parametrize("variant", sorted(CASES))
def test_each_variant_gives_the_right_subject_and_capacity(
    prom: str, tmp_path: Path, variant: str, prefilter: bool
) -> None:
    subject, node, gpu_subject, capacity, hours = CASES[variant]
    rules = load_rules([rule_file(tmp_path, variant, prefilter, reserved=variant == "hostname")])
    report = run_detection(rules, source(prom), None, END, profile=PROFILE)
    assert report.failures == () and dict(report.skipped) == {}
    [finding] = report.findings
    assert finding.subject == subject
    assert finding.labels["node"] == node
    if gpu_subject:
        assert finding.evidence["gpu_subject"] == gpu_subject
    else:
        assert "unattributable" in finding.summary
    assert finding.evidence["total_mib"] == pytest.approx(capacity, abs=1.0)
    assert finding.evidence["hours_to_exhaust"] == pytest.approx(hours, rel=0.10)


def test_exporter_pod_is_never_the_leaking_pod(prom: str, tmp_path: Path) -> None:
    rules = load_rules([rule_file(tmp_path, "exporter", prefilter=False)])
    [finding] = run_detection(rules, source(prom), None, END, profile=PROFILE).findings
    assert "pod" not in finding.labels and "namespace" not in finding.labels
    assert "only the exporter's own pod" in finding.summary
    assert finding.evidence["pods"] == []


def test_mig_instances_are_separate_series_with_their_own_profile(
    prom: str, tmp_path: Path
) -> None:
    rule = load_rules([rule_file(tmp_path, "mig", prefilter=False)]).rules[0].rule
    assert isinstance(rule, LeakRule)
    series = {s.instance: s for s in leak_series(rule, source(prom), END)}
    assert sorted(series) == ["1", "2", "9"]
    assert {k: s.profile for k, s in series.items()} == {
        "1": "3g.40gb",
        "2": "3g.40gb",
        "9": "1g.10gb",
    }
    assert series["9"].total_mib == pytest.approx(9851.0, abs=1.0)
    assert series["1"].pods == ("ml/mig-leak",) and series["2"].pods == ("ml/mig-busy",)


def test_gpus_of_different_nodes_never_merge_without_a_node_label(
    prom: str, tmp_path: Path
) -> None:
    rule = load_rules([rule_file(tmp_path, "nohost", prefilter=False)]).rules[0].rule
    assert isinstance(rule, LeakRule)
    series = leak_series(rule, source(prom), END)
    assert sorted(s.uuid for s in series) == ["GPU-b0", "GPU-c0"]
    assert all(s.gpu == "0" and s.node == "" for s in series)


def test_instance_address_loses_its_port(prom: str, tmp_path: Path) -> None:
    rule = load_rules([rule_file(tmp_path, "instance", prefilter=False)]).rules[0].rule
    assert isinstance(rule, LeakRule)
    nodes = sorted(s.node for s in leak_series(rule, source(prom), END))
    assert nodes == ["10.0.0.7", "node-c"]


# --- missing inputs are said ---------------------------------------------------------------------

KSM = Path(__file__).resolve().parents[2] / "rules" / "starvation.yaml"


def test_missing_and_unlabelled_inputs_are_reported_as_skipped(prom: str, tmp_path: Path) -> None:
    bare = rule_file(tmp_path, "bare", name="leak-bare")
    absent = rule_file(tmp_path, "absent", name="leak-absent")
    rules = load_rules([bare, absent, KSM])
    report = run_detection(rules, source(prom), None, END, profile=PROFILE)
    assert report.findings == () and report.failures == ()
    skipped = dict(report.skipped)
    assert skipped["leak-bare"].startswith("no DCGM series carries a GPU UUID or a node and GPU")
    assert "return no series: is the DCGM exporter scraped?" in skipped["leak-absent"]
    assert skipped["high-priority-starved"].startswith(
        "queries.allocatable (kube_node_status_allocatable{resource=~"
    )
    assert skipped["high-priority-starved"].endswith(
        "returns no series: is kube-state-metrics scraped?"
    )


def test_cli_detect_lists_skipped_rules_in_json_and_table(prom: str) -> None:
    """Every rule skipped (no kube-state-metrics series): nothing evaluated, exit 4
    (docs/cli.md, Exit codes), with the skipped rules and why in both outputs."""
    runner = CliRunner()
    args = ["detect", "--prometheus", prom, "--at", END.isoformat(), "--rules", str(KSM)]
    result = runner.invoke(app, [*args, "-o", "json"])
    assert result.exit_code == 4, result.output
    data = json.loads(result.stdout)
    assert data["findings"] == [] and data["failures"] == []
    assert "kube-state-metrics" in data["skipped"]["high-priority-starved"]
    table = runner.invoke(app, args)
    assert table.exit_code == 4
    assert "skipped rule high-priority-starved: queries.allocatable" in table.stderr
    assert "error: nothing evaluated" in table.stderr


def test_daemon_detector_sets_the_skipped_gauge_and_logs_once(
    prom: str, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    from defrag.cli.run import _detector
    from defrag.daemon.service import DaemonMetrics
    from defrag.model.cluster import Cluster
    from defrag.scoring.profile import ScoringProfile

    metrics = DaemonMetrics()
    rules = load_rules([rule_file(tmp_path, "absent", name="leak-absent")])
    detect = _detector(rules, source(prom))
    with caplog.at_level("INFO", logger="defrag.daemon"):
        empty = Cluster.build([])
        profile = ScoringProfile.default(empty)
        for _ in range(2):  # still skipped the second time: no second line
            detected = detect(empty, END, profile)
            assert list(detected) == [] and set(detected.skipped) == {"leak-absent"}
            metrics.record_skipped(detected.skipped)  # as DaemonMetrics.record does
    text = metrics.exposition().decode()
    assert 'defrag_rule_skipped{rule="leak-absent"} 1.0' in text
    lines = [r.getMessage() for r in caplog.records if "leak-absent" in r.getMessage()]
    assert len(lines) == 1 and lines[0].startswith("rule leak-absent skipped: queries.used")
    with caplog.at_level("INFO", logger="defrag.daemon"):
        metrics.record_skipped({})  # the inputs came back
    assert 'defrag_rule_skipped{rule="leak-absent"} 0.0' in metrics.exposition().decode()
    assert caplog.records[-1].getMessage() == "rule leak-absent runs again: its inputs are back"


def test_report_extras_lists_a_leak_rule_without_inputs_as_skipped(
    prom: str, tmp_path: Path
) -> None:
    from defrag.detection import report_extras

    rules = load_rules([rule_file(tmp_path, "absent", name="leak-absent")])
    extras = report_extras(source(prom), rules, END)
    assert extras["leak_suspects"] == []
    assert "return no series" in extras["skipped"]["leak-absent"]
