"""The extender's view carried over from the last one (``make_view(..., previous=)``) is the view
made from scratch: after any sequence of watch events (applied through the watch's own event
path, as tests/test_store_build.py does, whose objects and event strategy are reused here),
the carried view holds the same shape counts, mix, reservations and answer prefixes, and answers
``filter`` and ``prioritize`` byte for byte as the fresh one, for pods of every shape and under
the policies that read the mix (fgd) or draw from a seeded generator (random)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from defrag.adapters import jsonio
from defrag.extender.state import MIX_POLICIES, ClusterView, make_view
from defrag.extender.verbs import Extender
from defrag.extender.wire import parse_args
from defrag.model.resources import RESERVED_FOR_ANNOTATION
from defrag.model.workload import Shape, WorkloadMix
from defrag.scoring.filters import feasible_mask, filter_reasons
from defrag.scoring.policies import POLICY_NAMES, make_policy
from defrag.scoring.profile import ProfileConfig
from defrag.scoring.scheduler import node_scores
from tests import test_store_build as sb
from tests.support import kubeobjects as k

POLICIES = ("reserve-binpack", "fgd", "random")


class _Fixed:
    """A cache that always answers with one view (what the verbs read of ``ClusterCache``)."""

    def __init__(self, view: ClusterView) -> None:
        self._view = view

    def view(self) -> ClusterView:
        return self._view

    def latest(self) -> ClusterView:
        return self._view

    def nudge(self) -> None:
        pass


def event_obj(kind: str, index: int, variant: int, node: int, gpus: int) -> dict[str, Any]:
    """test_store_build's objects; a node of variant 6 is reserved for one pod."""
    obj = sb.event_obj(kind, index, variant, node, gpus)
    if kind == "Node" and variant == 6:
        obj["metadata"].setdefault("annotations", {})[RESERVED_FOR_ANNOTATION] = "ns-a/p-1"
    return obj


def requests() -> Iterator[bytes]:
    """ExtenderArgs for pods of each shape, asking about every node and one not there."""
    names = [*sb.NODES, "node-9"]
    for i, gpus in enumerate((0, 1, 2, 4, 8)):
        pod = k.pod(f"p-{i}", "ns-a", gpus)  # p-1 holds node reservations
        yield jsonio.dumps({"Pod": pod, "Nodes": None, "NodeNames": names})
    share = k.pod("p-7", "ns-b", 1, annotations={"defrag.io/gpu-milli": "500"})
    yield jsonio.dumps({"Pod": share, "Nodes": None, "NodeNames": names})


def answers(view: ClusterView) -> list[Any]:
    extender = Extender(_Fixed(view))  # type: ignore[arg-type]
    out: list[Any] = []
    for body in requests():
        args = parse_args(body)
        out.append(jsonio.dumps(extender.filter(args)))
        out.append(extender.prioritize_body(args))
    return out


def assert_same_view(got: ClusterView, want: ClusterView) -> None:
    assert got.shape_counts == want.shape_counts
    assert got.profile.mix == want.profile.mix
    assert dict(got.reserved_for) == dict(want.reserved_for)
    assert (got.hosts is None) == (want.hosts is None)
    if want.hosts is not None and got.hosts is not None:
        assert got.hosts.tolist() == want.hosts.tolist()
    assert answers(got) == answers(want)


@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    sb.events,
    st.lists(st.integers(1, 5), min_size=1, max_size=8),
    st.sampled_from(POLICIES),
)
def test_a_carried_view_is_the_view_from_scratch(
    sequence: list[tuple[str, str, int, int, int, int]], cuts: list[int], policy: str
) -> None:
    config = ProfileConfig(policy=policy, seed=3)
    store = sb.seeded()
    cluster, generation = store.build()
    view = make_view(cluster, config, 0.0, generation)
    at = 0
    for cut in [*cuts, len(sequence)]:
        for kind, what, index, variant, node, gpus in sequence[at : at + cut]:
            sb.apply(store, what, event_obj(kind, index, variant, node, gpus))
        at += cut
        cluster, generation = store.build()
        view = make_view(cluster, config, 0.0, generation, previous=view)
        assert_same_view(view, make_view(cluster, config, 0.0, generation))
        if at >= len(sequence):
            break


def test_a_binding_carries_everything_but_the_counts_it_moves() -> None:
    """The usual change: a pending pod bound. The reservations and answer prefixes are the
    last view's objects; the counts (kept for fgd, the policy that reads the mix) move only
    where the pod's shape went."""
    config = ProfileConfig(policy="fgd")
    store = sb.seeded()
    sb.apply(store, "ADDED", sb.pod_obj("p-9", 0, 0, 4))  # pending, 4 GPUs
    cluster, generation = store.build()
    first = make_view(cluster, config, 0.0, generation)
    sb.apply(store, "MODIFIED", sb.pod_obj("p-9", 0, 2, 4))  # bound to node-1
    cluster, generation = store.build()
    second = make_view(cluster, config, 0.0, generation, previous=first)
    assert second.reserved_for is first.reserved_for
    assert second.hosts is first.hosts
    assert second.shape_counts == first.shape_counts  # a binding changes no pod's shape
    sb.apply(store, "DELETED", sb.pod_obj("p-9", 0, 2, 4))
    cluster, generation = store.build()
    third = make_view(cluster, config, 0.0, generation, previous=second)
    assert sum(third.shape_counts.values()) == sum(first.shape_counts.values()) - 1
    assert_same_view(third, make_view(cluster, config, 0.0, generation))


@pytest.mark.parametrize("policy", POLICIES)
def test_no_gpu_pods_left_is_the_default_mix(policy: str) -> None:
    config = ProfileConfig(policy=policy)
    store = sb.seeded()
    cluster, generation = store.build()
    view = make_view(cluster, config, 0.0, generation)
    for i in range(len(sb.NODES) * 2):
        sb.apply(store, "DELETED", sb.pod_obj(sb.PODS[i], 0, 1, 2))
    cluster, generation = store.build()
    view = make_view(cluster, config, 0.0, generation, previous=view)
    assert not view.shape_counts
    assert_same_view(view, make_view(cluster, config, 0.0, generation))


def test_only_the_mix_policies_read_the_mix() -> None:
    """Every policy but those of ``MIX_POLICIES`` scores and picks GPUs alike under any mix (so
    a view that counts no shapes for them answers as one that does); fgd does not."""
    cluster, _ = sb.seeded().build()
    other = WorkloadMix((Shape(4000, 8, 1000),), (1.0,))
    pods = [parse_args(body).pod for body in requests()]
    differs = set()
    for name in POLICY_NAMES:
        plain = make_policy(name, mix=WorkloadMix.default(), seed=3)
        skewed = make_policy(name, mix=other, seed=3)
        for pod in pods:
            feasible = feasible_mask(pod, cluster.arrays)
            a = node_scores(pod, cluster.arrays, plain, feasible)
            b = node_scores(pod, cluster.arrays, skewed, feasible)
            same = bool(np.array_equal(a, b, equal_nan=True))
            if same and feasible.any():
                row = int(np.flatnonzero(feasible)[0])
                same = plain.choose_gpus(pod, cluster.arrays, row) == skewed.choose_gpus(
                    pod, cluster.arrays, row
                )
            if not same:
                differs.add(name)
    assert differs == set(MIX_POLICIES)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(sb.events)
def test_the_filters_reasons_are_filter_reasons(
    sequence: list[tuple[str, str, int, int, int, int]],
) -> None:
    """The filter answer's reason for each node it refuses is ``filter_reasons``' for that node
    (worked out for the requested rows only), on clusters after random watch events."""
    store = sb.seeded()
    for kind, what, index, variant, node, gpus in sequence:
        sb.apply(store, what, event_obj(kind, index, variant, node, gpus))
    cluster, generation = store.build()
    view = make_view(cluster, ProfileConfig(), 0.0, generation)
    extender = Extender(_Fixed(view))  # type: ignore[arg-type]
    arrays = cluster.arrays
    for body in requests():
        args = parse_args(body)
        want = filter_reasons(args.pod, arrays)
        answer = extender.filter(args)
        # every node asked about is answered once: fits, fails, or fails for good
        answered = [*answer["NodeNames"], *answer["FailedNodes"]]
        answered += answer["FailedAndUnresolvableNodes"]
        assert sorted(answered) == sorted(args.node_names)
        for name, reason in answer["FailedNodes"].items():
            if name in arrays.index:
                assert reason == ("; ".join(want[arrays.index[name]]) or "does not fit")
        for name in answer["NodeNames"]:
            assert not want[arrays.index[name]]


def test_a_cluster_of_no_nodes_fails_every_node_as_unknown() -> None:
    """Every node has left (or none joined yet): each one asked about is unknown, for every
    pod, not an error of the answer (an empty row array indexed at -1)."""
    from defrag.model.cluster import Cluster

    view = make_view(Cluster.build([]), ProfileConfig(policy="reserve-binpack"), 0.0)
    extender = Extender(_Fixed(view))  # type: ignore[arg-type]
    for body in requests():
        answer = extender.filter(parse_args(body))
        assert not answer["NodeNames"]
        assert set(answer["FailedNodes"]) == {*sb.NODES, "node-9"}
