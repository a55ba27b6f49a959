"""The cluster model: the units it reads quantities in, the immutable cluster and its numpy
views (parsing a quantity: test_quantity.py)."""

from __future__ import annotations

import pytest

from defrag.model import Cluster, ModelError, Node, Pod
from defrag.model.units import QuantityError, count, cpu_milli, memory_mib


def test_units() -> None:
    assert cpu_milli("250m") == 250
    assert cpu_milli("1.0005") == 1001  # rounded up, as the API server does
    assert memory_mib("1Gi") == 1024
    assert count("8") == 8
    with pytest.raises(QuantityError):
        count("0.5")


def _cluster() -> Cluster:
    nodes = [
        Node("a", 16000, 65536, 8, "A100"),
        Node("b", 16000, 65536, 8, "A100", nvlink_domains=((0, 1, 2, 3), (4, 5, 6, 7))),
    ]
    pods = [Pod("p", num_gpu=2, node="b", phase="Running", cpu_milli=1000)]
    return Cluster.build(nodes, pods)


def test_bound_pod_takes_resources_and_gets_gpu_slots() -> None:
    c = _cluster()
    row = c.arrays.index["b"]
    assert c.pods["default/p"].gpu_indices == (0, 1)
    assert list(c.arrays.gpu_free[row]) == [0, 0] + [1000] * 6
    assert c.arrays.cpu_free[row] == 15000
    # domain 0 has GPUs 2,3 free; domain 1 is whole → largest job 4
    assert list(c.arrays.domain_free()[row]) == [2, 4]
    assert c.arrays.largest_job()[row] == 4


def test_add_remove_roundtrip_and_immutability() -> None:
    c = _cluster()
    before = c.arrays.gpu_free.copy()
    c2 = c.with_pod_added(Pod("q", num_gpu=1, gpu_milli=300, node="a"))
    assert (c.arrays.gpu_free == before).all()  # the original is untouched
    assert c2.arrays.gpu_free[c2.arrays.index["a"]].sum() == 8000 - 300
    assert c2.with_pod_removed("default/q").same_state(c)


@pytest.mark.parametrize(
    ("pod", "message"),
    [
        (Pod("x", num_gpu=1, node="zzz"), "unknown node"),
        (Pod("x", num_gpu=9, node="a"), "more than it has free"),
        (Pod("x", num_gpu=1, node="b", gpu_indices=(0,)), "overcommitted"),
        (Pod("x", num_gpu=2, node="a", gpu_indices=(0,)), "do not fit"),
    ],
)
def test_inconsistent_pods_are_errors(pod: Pod, message: str) -> None:
    with pytest.raises(ModelError, match=message):
        _cluster().with_pod_added(pod)


def test_duplicate_nodes_rejected() -> None:
    with pytest.raises(ModelError, match="duplicate node"):
        Cluster.build([Node("a", 1, 1), Node("a", 1, 1)])


def test_finished_pods_hold_nothing() -> None:
    c = Cluster.build(
        [Node("a", 1000, 1000, 1, "T4")], [Pod("done", num_gpu=1, node="a", phase="Succeeded")]
    )
    assert c.arrays.gpu_free[0, 0] == 1000


def test_on_misfit_reports_instead_of_raising() -> None:
    seen: list[str] = []
    cluster = Cluster.build(
        [Node("a", 16000, 65536, 2, "T4")],
        [Pod("big", num_gpu=4, node="a"), Pod("ok", num_gpu=1, node="a")],
        on_misfit=lambda pod, exc: seen.append(f"{pod.key}: {exc}"),
    )
    assert list(cluster.pods) == ["default/ok"]
    assert (
        len(seen) == 1 and seen[0].startswith("default/big:") and "more than it has free" in seen[0]
    )


def test_a_copy_of_the_pods_is_the_clusters_own_to_change() -> None:
    cluster = _cluster()
    copied = cluster.pods_copy()
    assert copied == dict(cluster.pods) and list(copied) == list(cluster.pods)
    copied.clear()
    assert len(cluster.pods) > 0  # the cluster's map is untouched
    added = cluster.with_pod_added(Pod("late", namespace="t"))
    assert list(added.pods) == [*cluster.pods, "t/late"]
    assert list(added.with_pod_removed("t/late").pods) == list(cluster.pods)
