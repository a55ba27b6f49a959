"""detection.detect over a fake MetricsSource: routing, skipping and failures per rule."""

from __future__ import annotations

from dataclasses import replace
from datetime import UTC, datetime
from pathlib import Path

import pytest

from defrag.detection import DetectionError, detect, run_detection, with_dcgm_gpu_indices
from defrag.detectors.leak.registration import LeakRule, leak_range_query, leak_range_shards
from defrag.model.cluster import Cluster
from defrag.model.resources import Node, Pod
from defrag.ports import Sample
from defrag.rules import RuleSet, load_rules
from defrag.scoring.profile import ScoringProfile

ROOT = Path(__file__).resolve().parents[1]
NOW = datetime(2026, 3, 2, 12, 0, tzinfo=UTC)
RULES = load_rules([ROOT / "rules"])
PROFILE = ScoringProfile.default()


class FakeMetrics:
    """Answers every range query with ``series`` and every instant query with nothing."""

    def __init__(self, series: list[Sample]) -> None:
        self.series = series
        self.queries: list[str] = []

    def instant(self, query: str, at: datetime | None = None) -> list[Sample]:
        self.queries.append(query)
        return []

    def range(self, query: str, start: datetime, end: datetime, step_s: float) -> list[Sample]:
        self.queries.append(query)
        return self.series


def quiet_curve() -> list[Sample]:
    t0 = NOW.timestamp()
    return [Sample({}, tuple((t0 - 60.0 * i, 3.0) for i in range(60, -1, -1)))]


def test_without_metrics_only_cluster_rules_run() -> None:
    cluster = Cluster.build(
        [Node("n1", 1000, 1000, num_gpu=8), Node("n2", 1000, 1000, num_gpu=8)],
        [Pod("a", num_gpu=5, node="n1", phase="Running")],
    )
    report = run_detection(RULES, None, cluster, NOW, profile=PROFILE)
    assert report.skipped == {
        "gpu-memory-leak": "no metrics source",
        "cluster-idle": "no metrics source",
        # the spreading rule runs and finds too little to decide (pod "a" has no time at all)
        "gpu-pods-spread": (
            "insufficient evidence: 0 informative placement(s) of 0 GPU pod(s) bound in the "
            "last 24 h (spreading and packing scores agree on the rest); the rule needs 20; "
            "1 bound GPU pod(s) have no bind or creation time"
        ),
    }
    assert [f.subject for f in report.findings] == ["node/n1"]  # 3 free, stranded for 4 and 8


def without_kube_state_queries(rules: RuleSet) -> RuleSet:
    return RuleSet(
        tuple(
            replace(r, rule=r.rule.model_copy(update={"queries": None}))
            if r.rule.detector in ("starvation", "fragmentation")
            else r
            for r in rules
        )
    )


KSM_QUERY = (
    "kube_node_status_allocatable"
    '{resource=~"nvidia_com_.+|amd_com_.+|gpu_intel_com_.+|habana_ai_.+"}'
)
KSM_MISSING = f"queries.allocatable ({KSM_QUERY}) returns no series: is kube-state-metrics scraped?"
FREE_MISSING = "queries.free (DCGM_FI_DEV_FB_FREE) returns no series: no GPU's capacity is known"


def test_cluster_rules_build_the_cluster_from_kube_state_metrics() -> None:
    metrics = FakeMetrics(quiet_curve())
    report = run_detection(RULES, metrics, None, NOW, profile=PROFILE)
    # every instant query answers nothing: each rule that needs one says so (issue 14)
    assert report.skipped == {
        "gpu-fragmentation": KSM_MISSING,
        "high-priority-starved": KSM_MISSING,
        "fragmented-starved": KSM_MISSING,
        "unsatisfiable-pending": KSM_MISSING,
        "gpu-memory-leak": FREE_MISSING,
        "gpu-pods-spread": "no cluster snapshot",  # no queries: bind times are not in KSM
    }
    assert report.failures == ()
    allocatable = next(
        r.rule.queries.allocatable  # type: ignore[attr-defined]
        for r in RULES
        if r.rule.detector == "starvation"
    )
    assert allocatable.startswith("kube_node_status_allocatable{resource=~")
    assert "nvidia_com_" in allocatable
    # built once for the four rules (same queries): allocatable asked once
    assert metrics.queries.count(allocatable) == 1


def test_without_cluster_only_metric_rules_run() -> None:
    metrics = FakeMetrics(quiet_curve())
    report = run_detection(without_kube_state_queries(RULES), metrics, None, NOW, profile=PROFILE)
    assert report.skipped == {
        "gpu-fragmentation": "no cluster snapshot",
        "high-priority-starved": "no cluster snapshot",
        "fragmented-starved": "no cluster snapshot",
        "unsatisfiable-pending": "no cluster snapshot",
        "gpu-memory-leak": FREE_MISSING,
        "gpu-pods-spread": "no cluster snapshot",
    }
    assert [f.kind for f in report.findings] == ["idle"]  # 3% for an hour, threshold 20%
    assert "avg(DCGM_FI_DEV_GPU_UTIL)" in metrics.queries
    assert "DCGM_FI_DEV_FB_FREE" in metrics.queries


def test_idle_query_with_several_series_fails_that_rule_only() -> None:
    metrics = FakeMetrics(quiet_curve() * 2)
    report = run_detection(RULES, metrics, None, NOW, profile=PROFILE)
    assert [f.rule for f in report.failures] == ["cluster-idle"]
    with pytest.raises(
        DetectionError, match=r"rule cluster-idle \(.*rules/idle.yaml:4\): .*returned 2"
    ):
        detect(RULES, metrics, None, NOW, profile=PROFILE)


ON = "UUID, uuid, Hostname, hostname, node, kubernetes_node, gpu, GPU_I_ID"


JOB = 'DCGM_FI_DEV_FB_USED{job="dcgm"}'


def passes(sel: str, whole: str) -> str:
    """The prefilter of a 6 h lookback, 5-min steps and a 64 MiB/h minimum: series rising at
    half the minimum, or with fewer samples than the fleet's fullest (``whole``) less 1.5 steps
    (0.979167 of them: began or had a hole inside the lookback), or none in the last step
    (ended), or that fell to half their peak (a restart)."""
    look = "[21600s] @ end()"
    return (
        f"deriv({sel}{look}) * 3600 > 32"
        f" or count_over_time({sel}{look}) < 0.979167 * scalar(max(count_over_time({whole}{look})))"
        f" or count_over_time({sel}{look}) unless count_over_time({sel}[300s] @ end())"
        f" or min_over_time({sel}{look}) < 0.5 * max_over_time({sel}{look})"
    )


@pytest.mark.parametrize(
    ("used", "prefilter", "query"),
    [
        (
            "DCGM_FI_DEV_FB_USED",
            True,
            # 5-min medians, every series of the GPUs one of whose series passes (evaluated
            # once at the end of the range); on() the labels that name a GPU, not instance nor
            # the pod labels
            f"(quantile_over_time(0.5, DCGM_FI_DEV_FB_USED[300s])) and on({ON}) "
            f"({passes('DCGM_FI_DEV_FB_USED', 'DCGM_FI_DEV_FB_USED')})",
        ),
        (
            'DCGM_FI_DEV_FB_USED{job="dcgm"}',
            True,
            '(quantile_over_time(0.5, DCGM_FI_DEV_FB_USED{job="dcgm"}[300s])) and '
            f"on({ON}) "
            f"({passes(JOB, JOB)})",
        ),
        (
            "DCGM_FI_DEV_FB_USED",
            False,
            "quantile_over_time(0.5, DCGM_FI_DEV_FB_USED[300s])",
        ),
        # not a plain selector: no range selector can be put on it, so no prefilter
        ("sum by (gpu) (DCGM_FI_DEV_FB_USED)", True, "sum by (gpu) (DCGM_FI_DEV_FB_USED)"),
    ],
)
def test_leak_range_query(used: str, prefilter: bool, query: str) -> None:
    rule = LeakRule.model_validate(
        {
            "name": "l",
            "detector": "leak",
            "queries": {"used": used, "free": "F"},
            "prefilter": prefilter,
        }
    )
    assert leak_range_query(rule) == query


class DcgmMetrics(FakeMetrics):
    """Instant answers: DCGM FB-used series, one per (node, gpu, pod)."""

    def __init__(self, holdings: list[tuple[str, str, str]]) -> None:
        super().__init__([])
        self.holdings = holdings

    def instant(self, query: str, at: datetime | None = None) -> list[Sample]:
        self.queries.append(query)
        return [
            Sample({"Hostname": node, "gpu": gpu, "namespace": "ml", "pod": pod}, ((0.0, 1.0),))
            for node, gpu, pod in self.holdings
        ]


def test_dcgm_gpu_indices_are_written_into_the_cluster() -> None:
    cluster = Cluster.build(
        [Node("n1", 1000, 1000, num_gpu=4)],
        [
            Pod("two", "ml", num_gpu=2, node="n1", phase="Running"),
            Pod("one", "ml", num_gpu=1, node="n1", phase="Running"),
        ],
    )
    # without DCGM the model guesses: best fit from the lowest index
    assert cluster.pods["ml/two"].gpu_indices == (0, 1)
    metrics = DcgmMetrics([("n1", "2", "two"), ("n1", "3", "two"), ("n1", "0", "one")])
    updated = with_dcgm_gpu_indices(cluster, RULES, metrics, NOW)
    assert metrics.queries == ["DCGM_FI_DEV_FB_USED"]
    assert updated.pods["ml/two"].gpu_indices == (2, 3)
    assert updated.pods["ml/one"].gpu_indices == (0,)
    assert updated.arrays.free_whole_count().tolist() == [1]  # GPU 1 left


@pytest.mark.parametrize(
    ("used", "selectors"),
    [
        (
            "DCGM_FI_DEV_FB_USED",
            ['DCGM_FI_DEV_FB_USED{gpu=~"[0-3]"}', 'DCGM_FI_DEV_FB_USED{gpu!~"[0-3]"}'],
        ),
        (
            ' DCGM_FI_DEV_FB_USED{job="dcgm",} ',  # PromQL allows the trailing comma
            [
                'DCGM_FI_DEV_FB_USED{job="dcgm", gpu=~"[0-3]"}',
                'DCGM_FI_DEV_FB_USED{job="dcgm", gpu!~"[0-3]"}',
            ],
        ),
        # not a plain selector: one query, unsplit
        ("sum by (gpu) (DCGM_FI_DEV_FB_USED)", ["sum by (gpu) (DCGM_FI_DEV_FB_USED)"]),
    ],
)
def test_leak_range_shards_split_both_sides_of_the_prefilter(
    used: str, selectors: list[str]
) -> None:
    # the same matcher on the medians and on the slope: the join on the GPU's labels (gpu
    # among them) pairs series within one shard, and each series is in exactly one
    rule = LeakRule.model_validate(
        {"name": "l", "detector": "leak", "queries": {"used": used, "free": "F"}}
    )
    whole = leak_range_query(rule)
    # … except the fleet's fullest series, counted over the whole selector in every shard
    fullest = f"scalar(max(count_over_time({used.strip()}"
    assert leak_range_shards(rule) == [
        whole.replace(used.strip(), s).replace(f"scalar(max(count_over_time({s}", fullest)
        for s in selectors
    ]
