"""Property tests: invariants of scoring and placement on generated clusters."""

from __future__ import annotations

import numpy as np
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from defrag.model import Cluster, Node, Pod
from defrag.model.workload import Shape, WorkloadMix
from defrag.scoring.fgd_model import FragModel
from defrag.scoring.filters import feasible_mask
from defrag.scoring.framework import Placement
from defrag.scoring.policies import POLICY_NAMES, make_policy
from defrag.scoring.scheduler import schedule

MODELS = ("A100", "T4")
PER_CLUSTER_POLICIES = ("random", "best-fit")
"""Scores that depend on other nodes: random draws per call; best-fit min–max normalises over
the feasible nodes (as the paper's simulator does). Every other score is a function of the node."""
SETTINGS = settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@st.composite
def pods(draw: st.DrawFn, name: str = "p") -> Pod:
    sharing = draw(st.booleans())
    if sharing:
        num_gpu, milli = 1, draw(st.sampled_from([100, 250, 300, 500, 700]))
    else:
        num_gpu, milli = draw(st.sampled_from([0, 1, 1, 2, 4, 8])), 1000
    return Pod(
        name,
        num_gpu=num_gpu,
        gpu_milli=milli,
        cpu_milli=draw(st.sampled_from([0, 1000, 4000, 16000])),
        gpu_models=draw(st.sampled_from([frozenset(), frozenset({"A100"})])),
    )


@st.composite
def clusters(draw: st.DrawFn) -> Cluster:
    n = draw(st.integers(1, 6))
    nodes = []
    for i in range(n):
        gpus = draw(st.sampled_from([0, 1, 2, 4, 8]))
        domains: tuple[tuple[int, ...], ...] = ()
        if gpus == 8 and draw(st.booleans()):
            domains = ((0, 1, 2, 3), (4, 5, 6, 7))
        nodes.append(
            Node(f"n{i}", 32000, 10**6, gpus, draw(st.sampled_from(MODELS)), nvlink_domains=domains)
        )
    cluster = Cluster.build(nodes)
    # Fill with pods the scheduler places (so the cluster is consistent).
    for j in range(draw(st.integers(0, 12))):
        pod = draw(pods(f"fill{j}"))
        placement = schedule(pod, cluster, make_policy("random"))
        if isinstance(placement, Placement):
            cluster = cluster.with_pod_added(
                Pod(**{**_fields(pod), "node": placement.node, "gpu_indices": placement.gpus})
            )
    return cluster


def _fields(pod: Pod) -> dict[str, object]:
    return {f: getattr(pod, f) for f in pod.__slots__}  # type: ignore[attr-defined]


@SETTINGS
@given(clusters(), pods("new"), st.sampled_from(POLICY_NAMES))
def test_scores_in_range_and_placements_within_capacity(
    cluster: Cluster, pod: Pod, policy: str
) -> None:
    pol = make_policy(policy, mix=WorkloadMix.from_pods(cluster.pods.values()))
    feasible = feasible_mask(pod, cluster.arrays)
    scores = pol.score(pod, cluster.arrays, feasible)
    assert np.all((scores[feasible] >= 0) & (scores[feasible] <= 100))
    placement = schedule(pod, cluster, pol)
    if isinstance(placement, Placement):
        assert feasible[placement.row]
        arrays = cluster.arrays.copy()
        arrays.allocate(placement.row, pod, placement.gpus)
        assert (arrays.gpu_free >= 0).all() and (arrays.cpu_free >= 0).all()
        assert len(set(placement.gpus)) == pod.num_gpu
        assert all(g < cluster.arrays.gpu_total[placement.row] for g in placement.gpus)
    else:
        assert not feasible.any()


@SETTINGS
@given(clusters(), pods("extra"))
def test_add_then_remove_is_identity(cluster: Cluster, pod: Pod) -> None:
    placement = schedule(pod, cluster, make_policy("reserve-binpack"))
    if not isinstance(placement, Placement):
        return
    bound = Pod(**{**_fields(pod), "node": placement.node, "gpu_indices": placement.gpus})
    assert cluster.with_pod_added(bound).with_pod_removed(bound.key).same_state(cluster)


def _single_node(cluster: Cluster, name: str) -> Cluster:
    return Cluster.build([cluster.node(name)], list(cluster.pods_on(name)))


@SETTINGS
@given(
    clusters(),
    pods("new"),
    st.sampled_from([p for p in POLICY_NAMES if p not in PER_CLUSTER_POLICIES]),
)
def test_vectorised_and_per_node_scores_agree(cluster: Cluster, pod: Pod, policy: str) -> None:
    pol = make_policy(policy)
    feasible = feasible_mask(pod, cluster.arrays)
    everything = pol.score(pod, cluster.arrays, feasible)
    for row, name in enumerate(cluster.arrays.names):
        alone = _single_node(cluster, name)
        one = pol.score(pod, alone.arrays, feasible_mask(pod, alone.arrays))
        assert feasible_mask(pod, alone.arrays)[0] == feasible[row]
        if feasible[row]:
            assert one[0] == everything[row]


def reference_frag(free: list[int], cpu_free: int, model: str, mix: WorkloadMix) -> float:
    """FGD node fragmentation written out loop by loop (the paper's definition)."""
    total = sum(free)
    frag = 0.0
    for shape, w in zip(mix.shapes, mix.weights, strict=True):
        fits = [f for f in free if f >= shape.gpu_milli]
        runs = (
            shape.num_gpu > 0
            and cpu_free >= shape.cpu_milli
            and (not shape.gpu_models or model in shape.gpu_models)
            and len(fits) >= shape.num_gpu
        )
        frag += w * (sum(f for f in free if f < shape.gpu_milli) if runs else total)
    return frag


@SETTINGS
@given(clusters())
def test_fgd_vectorised_matches_reference(cluster: Cluster) -> None:
    mix = WorkloadMix(
        (
            Shape(0, 1, 300),
            Shape(4000, 1, 1000),
            Shape(0, 2, 1000, frozenset({"A100"})),
            Shape(1000, 0, 0),
        ),
        (0.4, 0.3, 0.2, 0.1),
    )
    a = cluster.arrays
    got = FragModel.build(mix, a.models).node_frag(a.gpu_free, a.cpu_free, a.model_code)
    for row in range(len(a)):
        total = int(a.gpu_total[row])
        model = a.models[a.model_code[row]] if a.model_code[row] >= 0 else ""
        want = reference_frag(list(a.gpu_free[row, :total]), int(a.cpu_free[row]), model, mix)
        assert got[row] == np.float64(want) or abs(got[row] - want) < 1e-6


@SETTINGS
@given(clusters(), pods("new"))
def test_fgd_delta_matches_brute_force(cluster: Cluster, pod: Pod) -> None:
    from defrag.scoring.policies.fgd import Fgd

    mix = WorkloadMix((Shape(0, 1, 300), Shape(0, 1, 700), Shape(2000, 2, 1000)), (0.5, 0.3, 0.2))
    fgd = Fgd(mix)
    a = cluster.arrays
    feasible = feasible_mask(pod, a)
    delta = fgd.deltas(pod, a)
    for row in np.flatnonzero(feasible):
        total = int(a.gpu_total[row])
        model = a.models[a.model_code[row]] if a.model_code[row] >= 0 else ""
        free = list(a.gpu_free[row, :total])
        before = reference_frag(free, int(a.cpu_free[row]), model, mix)
        cpu_after = int(a.cpu_free[row]) - pod.cpu_milli
        if pod.num_gpu == 0:
            options = [free]
        elif pod.gpu_milli < 1000:
            options = [
                [f - pod.gpu_milli if i == j else f for i, f in enumerate(free)]
                for j in range(total)
                if free[j] >= pod.gpu_milli
            ]
        else:
            taken = [i for i, f in enumerate(free) if f >= 1000][: pod.num_gpu]
            options = [[0 if i in taken else f for i, f in enumerate(free)]]
        best = min(reference_frag(o, cpu_after, model, mix) for o in options) - before
        assert abs(delta[row] - best) < 1e-6


def reference_gpu_packing(pod: Pod, free: list[int]) -> float:
    """The paper's gpu-packing score for one node, written out (docs/concepts.md)."""
    if pod.num_gpu == 0:
        return 0.0
    whole = sum(1 for f in free if f >= 1000)
    if whole == len(free):
        return float(max(33 - whole, whole))
    taken = sorted(f for f in free if f >= pod.gpu_milli)[: pod.num_gpu]
    full = sum(1 for f in taken if f == 1000)
    if full:
        return float(max(50 - full, 33))
    return float(max(100 - sum(f * 100 // 1000 for f in taken) // 10, 50))


@SETTINGS
@given(clusters(), pods("new"))
def test_gpu_packing_matches_its_definition(cluster: Cluster, pod: Pod) -> None:
    a = cluster.arrays
    feasible = feasible_mask(pod, a)
    scores = make_policy("gpu-packing").score(pod, a, feasible)
    for row in np.flatnonzero(feasible & (a.gpu_total > 0)):
        free = [int(f) for f in a.gpu_free[row, : a.gpu_total[row]]]
        assert scores[row] == reference_gpu_packing(pod, free)
