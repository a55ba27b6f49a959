"""The spreading detector (defrag/detectors/spreading): placements replayed in bind order
against the spreading score (least-allocated) and the packing scores, on hand-built clusters.

Every cluster here: 8-GPU nodes with 64 CPUs and 512 GiB; the pods ask GPUs only, so a node's
least-allocated score is mean(cpu 1, memory 1, free GPU fraction after the pod) × 100,
truncated, and most-allocated's is 100 minus that mean (before truncation).
"""

from __future__ import annotations

from dataclasses import replace
from datetime import datetime, timedelta

import pytest

from defrag.adapters.kube_convert import pod_from_json
from defrag.alerting import ALERTS
from defrag.detectors.registry import Inputs, MissingInput
from defrag.detectors.spreading.core import (
    PACKING,
    SpreadingParams,
    Stranded,
    detect_spreading,
    packed_bound,
    replay,
    stranded,
)
from defrag.detectors.spreading.registration import SPREADING
from defrag.model import Cluster, Node, Pod
from defrag.model.utc import UTC
from defrag.scoring.profile import ProfileConfig, ScoringProfile
from tests.support import kubeobjects

NOW = datetime(2026, 12, 1, 12, 0, tzinfo=UTC)
LOOSE = SpreadingParams(min_placements=2, min_stranded_gpus=1.0)


def build(
    layout: list[tuple[str, int]],
    *,
    old: list[tuple[str, int]] = (),
    nodes: int = 4,  # type: ignore[assignment]
) -> Cluster:
    """``nodes`` 8-GPU nodes n0…; ``layout``: (node, GPUs) per pod in bind order, bound one
    minute apart in the last hour; ``old``: pods bound two days ago (before the window)."""
    ns = [Node(f"n{i}", 64000, 512 * 1024, 8, "A100") for i in range(nodes)]
    pods = []
    for i, (node, gpus) in enumerate(layout):
        at = NOW - timedelta(minutes=60 - i)
        pods.append(Pod(f"p{i:02d}", num_gpu=gpus, node=node, phase="Running", scheduled_at=at))
    for i, (node, gpus) in enumerate(old):
        at = NOW - timedelta(days=2)
        pods.append(Pod(f"old{i}", num_gpu=gpus, node=node, phase="Running", scheduled_at=at))
    return Cluster.build(ns, pods)


def profile(cluster: Cluster, policy: str = "reserve-binpack") -> ScoringProfile:
    return ProfileConfig(policy).for_cluster(cluster)


SPREAD = [("n0", 1), ("n1", 1), ("n2", 1), ("n3", 1)]
PACKED = [("n0", 1), ("n0", 1), ("n0", 1), ("n0", 1)]


@pytest.mark.parametrize(
    ("layout", "old", "policy", "counts", "stranded_now", "packed"),
    [
        # Spread. A node's rank by a score: the share of the other feasible nodes scoring
        # higher, equals counted half; it matches a score when its rank is < 0.5 (top_share).
        # p00 lands on an empty cluster: every node scores alike, rank 0.5 by every score:
        # uninformative. For p01, n0 holds 1 GPU: least-allocated n0 = (1 + 1 + 6/8)/3 × 100
        # = 91, the others (1 + 1 + 7/8)/3 × 100 = 95 → n1's rank (0 + 2 × 0.5)/3 = 0.33:
        # spreading; most-allocated n0 = 8, the others 4 → n1's rank (1 + 1)/3 = 0.67: not
        # packing. p02 on n2: ranks 0.5/3 = 0.17 vs 2.5/3 = 0.83; p03 on n3: 0 vs 1.
        # Now 4 partly used nodes × 7 free = 28 stranded; the 28 free GPUs ideally packed fill
        # 3 whole nodes and leave 28 mod 8 = 4 on one.
        (SPREAD, [], "reserve-binpack", (4, 3, 3, 0), Stranded(28, 4), Stranded(4, 1)),
        (SPREAD, [], "least-allocated", (4, 3, 3, 0), Stranded(28, 4), Stranded(4, 1)),
        # Packed: p01..p03 go to n0, the only fullest node: rank 0 by most-allocated, 1 by
        # least-allocated → 3 informative, 3 packing; n0 alone is partly used with 4 free: as
        # ideal a packing as 28 free GPUs allow.
        (PACKED, [], "reserve-binpack", (4, 3, 0, 3), Stranded(4, 1), Stranded(4, 1)),
        # Before the window n0 holds 4 GPUs and n1 2. p00 (1 GPU) on n1: least-allocated n0 79,
        # n1 87, n2 = n3 = 95 → rank 2/3; most-allocated n0 20, n1 12, n2 = n3 4 → rank 1/3:
        # packing (a fuller node than most). p01 on n2 (n1 now 3): least-allocated rank
        # 0.5/3 = 0.17, most-allocated 2.5/3 = 0.83: spreading.
        (
            [("n1", 1), ("n2", 1)],
            [("n0", 4), ("n1", 2)],
            "reserve-binpack",
            (2, 2, 1, 1),
            # n0 4 + n1 5 + n2 7 = 16 free on partly used nodes; with n3's 8, 24 free GPUs
            # ideally fill 3 whole nodes: 24 mod 8 = 0 stranded
            Stranded(16, 3),
            Stranded(0, 0),
        ),
    ],
)
def test_replay_counts_each_placement_against_both_scores(
    layout: list[tuple[str, int]],
    old: list[tuple[str, int]],
    policy: str,
    counts: tuple[int, int, int, int],
    stranded_now: Stranded,
    packed: Stranded,
) -> None:
    cluster = build(layout, old=old)
    rep = replay(cluster, LOOSE, NOW, profile(cluster, policy))
    assert (rep.placements, rep.informative, rep.spreading, rep.packing) == counts
    assert rep.stranded == stranded_now
    assert rep.packed == packed


@pytest.mark.parametrize(
    ("layout", "params", "kinds", "evidence_ok"),
    [
        # 3 of 3 informative spread (share 1.0 ≥ 0.6), 28 - 4 = 24 stranded ≥ 1: a finding
        (SPREAD, LOOSE, ["spreading"], True),
        # the same with a 30-GPU threshold: 24 < 30, evidence enough but no finding (and the
        # pack share 0 < 0.6: no packing finding either)
        (SPREAD, replace(LOOSE, min_stranded_gpus=30.0), [], True),
        # 3 informative < 4 needed: thin evidence, no finding
        (SPREAD, replace(LOOSE, min_placements=4), [], False),
        # packed: 0 of 3 spread, 3 of 3 pack (share 1.0 ≥ 0.6): the packing finding
        (PACKED, LOOSE, ["packing"], True),
        # packed but thin (3 < 4 informative): nothing said either way
        (PACKED, replace(LOOSE, min_placements=4), [], False),
        # packed, with the packing bar at 100%: 3 of 3 pack = 1.0 still packs
        (PACKED, replace(LOOSE, min_pack_share=1.0), ["packing"], True),
        # then a fifth pod on empty n1 (n0 holds 4): least-allocated ranks n1 (0 + 2 × 0.5)/3
        # = 0.33 < 0.5, most-allocated (1 + 1)/3 = 0.67: spreading. 3 of 4 pack: 0.75 < 0.85,
        # and 1 of 4 spreads: 0.25 < 0.6 — neither finding; with a 0.7 bar, packing.
        ([*PACKED, ("n1", 1)], LOOSE, [], True),
        ([*PACKED, ("n1", 1)], replace(LOOSE, min_pack_share=0.7), ["packing"], True),
        # a 30-minute window keeps p30.. only: no pod of this layout is that recent
        (SPREAD, replace(LOOSE, window_s=1800.0), [], False),
    ],
)
def test_verdict(
    layout: list[tuple[str, int]], params: SpreadingParams, kinds: list[str], evidence_ok: bool
) -> None:
    cluster = build(layout)
    verdict = detect_spreading(cluster, params, NOW, profile=profile(cluster))
    assert [f.kind for f in verdict.findings] == kinds
    assert verdict.evidence.ok is evidence_ok


def test_a_mixed_window_says_nothing_either_way() -> None:
    # p00 on n1 then p01 on n2 after n0 = 4 and n1 = 2 before the window (the replay table's
    # last row): 1 packing + 1 spreading of 2 informative → shares 0.5 and 0.5, both < 0.6.
    cluster = build([("n1", 1), ("n2", 1)], old=[("n0", 4), ("n1", 2)])
    verdict = detect_spreading(cluster, LOOSE, NOW, profile=profile(cluster))
    assert verdict.evidence.ok and verdict.findings == ()


def test_packing_finding_is_never_alerted_and_names_its_evidence() -> None:
    cluster = build(PACKED)
    (finding,) = detect_spreading(cluster, LOOSE, NOW, profile=profile(cluster)).findings
    assert finding.kind == PACKING and finding.subject == "cluster"
    assert finding.summary.startswith("the scheduler packs GPU pods: of 3 informative")
    assert finding.evidence["packing"] == 3 and finding.evidence["pack_share"] == 1.0
    assert ALERTS.spec(finding) is None  # declared NotAlerted: never sent to Alertmanager


def test_finding_names_the_evidence_and_both_remedies() -> None:
    cluster = build(SPREAD)
    (finding,) = detect_spreading(cluster, LOOSE, NOW, profile=profile(cluster)).findings
    assert (finding.kind, finding.subject, finding.severity) == ("spreading", "cluster", "info")
    ev = finding.evidence
    assert (ev["informative"], ev["spreading"], ev["packing"], ev["spread_share"]) == (3, 3, 0, 1.0)
    assert (ev["stranded_gpus"], ev["packed_stranded_gpus"]) == (28, 4)
    assert ev["packing_policies"] == ["most-allocated", "reserve-binpack"]
    assert "of 3 informative placement(s) in the last 24 h, 3 (100%) went to a node in " in (
        finding.summary
    )
    assert "28 free GPU(s) stranded on 4 partly used node(s), 4 on 1 were the free " in (
        finding.summary
    )
    assert "scheduler extender" in finding.summary
    assert "deploy/components/most-allocated" in finding.summary
    assert len(ev["remedies"]) == 2


def test_thin_evidence_says_why_and_the_rule_is_skipped() -> None:
    cluster = build(SPREAD[:2])
    verdict = detect_spreading(cluster, SpreadingParams(), NOW, profile=profile(cluster))
    # p00 on an empty cluster says nothing; p01 is the one informative placement of 2
    assert str(verdict.evidence) == (
        "insufficient evidence: 1 informative placement(s) of 2 GPU pod(s) bound in the last "
        "24 h (spreading and packing scores agree on the rest); the rule needs 20"
    )
    rule = SPREADING.model.model_validate({"name": "r", "detector": "spreading"})
    inputs = Inputs(now=NOW, profile=profile(cluster), cluster=cluster)
    with pytest.raises(MissingInput, match="1 informative placement"):
        SPREADING.evaluate(rule, inputs)


def test_a_node_cordoned_since_is_infeasible_not_evidence() -> None:
    cluster = build(SPREAD)
    ns = [replace(n, unschedulable=n.name == "n1") for n in cluster.nodes]
    cordoned = Cluster.build(ns, cluster.pods.values())
    rep = replay(cordoned, LOOSE, NOW, profile(cordoned))
    # p01 sits on n1, cordoned since: the replay cannot rank it; p02 and p03 still spread
    assert (rep.informative, rep.spreading, rep.infeasible) == (2, 2, 1)


def test_bind_time_falls_back_to_creation_and_undated_pods_are_counted() -> None:
    ns = [Node(f"n{i}", 64000, 512 * 1024, 8, "A100") for i in range(2)]
    created = Pod("c", num_gpu=1, node="n0", phase="Running", created_at=NOW - timedelta(hours=1))
    undated = Pod("u", num_gpu=1, node="n1", phase="Running")
    cpu_only = Pod("cpu", cpu_milli=1000, node="n1", phase="Running", scheduled_at=NOW)
    cluster = Cluster.build(ns, [created, undated, cpu_only])
    rep = replay(cluster, LOOSE, NOW, profile(cluster))
    # only "c" is replayed: "u" has no time, "cpu" asks no GPU
    assert (rep.placements, rep.undated) == (1, 1)
    assert "1 bound GPU pod(s) have no bind or creation time" in str(
        detect_spreading(cluster, LOOSE, NOW, profile=profile(cluster)).evidence
    )


@pytest.mark.parametrize(
    ("used", "expected"),
    [
        # n0 3 of 8 used → 5 free; n1 empty and n2 full are not partly used
        ({"n0": 3, "n2": 8}, Stranded(5, 1)),
        # n0 1 used, n1 7 used → 7 + 1
        ({"n0": 1, "n1": 7}, Stranded(8, 2)),
        ({}, Stranded(0, 0)),
    ],
)
def test_stranded_counts_whole_free_gpus_on_partly_used_nodes(
    used: dict[str, int], expected: Stranded
) -> None:
    ns = [Node(f"n{i}", 64000, 512 * 1024, 8, "A100") for i in range(3)]
    pods = [Pod(f"on-{n}", num_gpu=g, node=n, phase="Running") for n, g in used.items()]
    assert stranded(Cluster.build(ns, pods).arrays) == expected


@pytest.mark.parametrize(
    ("sizes", "used", "expected"),
    [
        # 8-GPU nodes with 3 and 0 used, a 4-GPU node with 1 used: free 5 + 8 = 13 on the
        # 8-GPU nodes → 13 mod 8 = 5 on one node; 3 on the 4-GPU node → 3 mod 4 = 3 on one
        ((8, 8, 4), (3, 0, 1), Stranded(8, 2)),
        # 16 free on 8-GPU nodes fill two: nothing left over
        ((8, 8, 8), (4, 4, 8), Stranded(0, 0)),
        ((8, 8), (8, 8), Stranded(0, 0)),
    ],
)
def test_packed_bound_leaves_one_remainder_per_node_size(
    sizes: tuple[int, ...], used: tuple[int, ...], expected: Stranded
) -> None:
    ns = [Node(f"n{i}", 64000, 512 * 1024, g, "A100") for i, g in enumerate(sizes)]
    pods = [
        Pod(f"on-{i}", num_gpu=u, node=f"n{i}", phase="Running") for i, u in enumerate(used) if u
    ]
    assert packed_bound(Cluster.build(ns, pods).arrays) == expected


@pytest.mark.parametrize(
    ("condition", "expected"),
    [
        # k8s.io/api core/v1 types.go: PodScheduled, PodCondition.lastTransitionTime
        (
            {
                "type": "PodScheduled",
                "status": "True",
                "lastTransitionTime": "2026-11-30T10:05:01Z",
            },
            datetime(2026, 11, 30, 10, 5, 1, tzinfo=UTC),
        ),
        (
            {
                "type": "PodScheduled",
                "status": "False",
                "lastTransitionTime": "2026-11-30T10:05:01Z",
            },
            None,
        ),
    ],
)
def test_converter_reads_the_bind_time(
    condition: dict[str, str], expected: datetime | None
) -> None:
    obj = kubeobjects.pod("train", gpus=1, node_name="n0")
    obj["status"]["conditions"] = [condition]
    pod, _ = pod_from_json(obj)
    assert pod.scheduled_at == expected


def test_rule_file_settings_are_validated_with_the_field_named() -> None:
    model = SPREADING.model
    for field, value in [("min_spread_share", 1.5), ("min_placements", 0), ("window", "soon")]:
        with pytest.raises(ValueError, match=field):
            model.model_validate({"name": "r", "detector": "spreading", field: value})
    rule = model.model_validate({"name": "r", "detector": "spreading", "window": "6h"})
    assert SPREADING.settings_of(rule).window_s == 6 * 3600
