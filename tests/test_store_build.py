"""The watched store's cluster, built from what changed (``StoreBuild.update``), is the cluster a
fresh full conversion of the same objects makes (``ClusterParts.build(lenient=True)``, what a
relist or ``KubeClusterSource.snapshot`` builds): on random sequences of ADDED / MODIFIED /
DELETED events, applied through the watch's own event path, every node, pod (and its GPU slots,
in the same order), free resource, warning and left-out pod agrees after every build."""

from __future__ import annotations

import copy
import random
from dataclasses import fields
from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from kubernetes import client

from defrag.adapters.kube_convert import ClusterParts
from defrag.adapters.kube_watch import KubeWatchSource
from defrag.model.cluster import Cluster
from tests.support import kubeobjects as k

NODES = ("node-0", "node-1", "node-2", "node-3")
PODS = tuple(f"p-{i}" for i in range(10))
KINDS = ("PriorityClass", "Node", "Pod", "PodDisruptionBudget")


def source() -> KubeWatchSource:
    """A store fed by hand (nothing is ever listed or watched: no request is made)."""
    config = client.Configuration()
    config.host = "http://127.0.0.1:9"
    return KubeWatchSource(client.ApiClient(config))


def apply(store: KubeWatchSource, what: str, obj: dict[str, Any]) -> None:
    """One watch event, through the watch's own event path."""
    kind = next(kind for kind in store._kinds if kind.name == obj["kind"])
    store._apply(kind, {"type": what, "raw_object": copy.deepcopy(obj)})


def full_build(store: KubeWatchSource) -> tuple[Cluster, list[str]]:
    """A fresh conversion of every object held, in listing order."""
    parts = ClusterParts()
    for kind in KINDS:
        for key, obj in sorted(store.objects(kind).items()):
            parts.add(obj, f"{kind} {key}", kind=kind)
    return parts.build(lenient=True), parts.dropped


def assert_same(got: Cluster, want: Cluster) -> None:
    assert got.nodes == want.nodes
    assert list(got.pods.items()) == list(want.pods.items())  # the order too
    assert got.pdbs == want.pdbs
    assert dict(got.priority_classes) == dict(want.priority_classes)
    assert got.warnings == want.warnings
    for f in fields(want.arrays):
        if f.name == "selector_cache":
            continue  # a cache filled on use
        a, b = getattr(got.arrays, f.name), getattr(want.arrays, f.name)
        if isinstance(b, np.ndarray):
            assert a.shape == b.shape and (a == b).all(), f.name
        else:
            assert a == b, f.name


# --- objects ---------------------------------------------------------------------------------


def node_obj(name: str, variant: int) -> dict[str, Any]:
    obj = k.node(
        name,
        gpus=4 if variant == 1 else 8,
        gpu_memory_mib=40960 if variant == 2 else 81920,
        nvlink="0-3,4-7" if variant == 3 else None,
        unschedulable=variant == 4,
        labels={"rack": str(variant)},
    )
    if variant == 5:
        obj["status"]["allocatable"]["cpu"] = "lots"  # unreadable: left out with its pods
    return obj


def pod_obj(name: str, variant: int, node: int, gpus: int) -> dict[str, Any]:
    node_name = None if node == 0 else "node-9" if node == 5 else NODES[node - 1]
    annotations: dict[str, str] = {}
    if variant == 1:
        annotations["defrag.io/gpu-milli"] = "500"
        gpus = 1
    elif variant == 2:
        annotations["defrag.io/gpu-memory"] = "20Gi"
        gpus = 1
    elif variant == 3 and gpus:
        annotations["defrag.io/gpu-indices"] = ",".join(str(i) for i in range(gpus))
    obj = k.pod(
        name,
        "ns-a" if int(name[2:]) % 2 else "ns-b",
        gpus,
        node_name=node_name,
        priority=None if variant in (4, 5) else 7,
        priority_class="pc-0" if variant == 4 else None,
        annotations=annotations or None,
        phase="Succeeded" if variant == 6 else None,
        labels={"app": "serve"} if variant == 7 else None,
    )
    if variant == 8:
        obj["spec"]["containers"][0]["resources"]["requests"]["cpu"] = "some"  # unreadable
    return obj


def other_obj(kind: str, index: int, variant: int) -> dict[str, Any]:
    if kind == "PriorityClass":
        return k.priority_class(f"pc-{index % 2}", 100 * variant, global_default=variant == 3)
    return k.pdb(f"budget-{index % 2}", "ns-a", match_labels={"app": "serve"})


events = st.lists(
    st.one_of(
        st.tuples(
            st.just("Pod"),
            st.sampled_from(("ADDED", "MODIFIED", "DELETED")),
            st.integers(0, len(PODS) - 1),
            st.integers(0, 9),  # variant (0, 9: plain)
            st.integers(0, 5),  # node: pending, a node, or a node that is not there
            st.sampled_from((0, 1, 2, 4, 8)),
        ),
        st.tuples(
            st.just("Node"),
            st.sampled_from(("ADDED", "MODIFIED", "DELETED")),
            st.integers(0, len(NODES) - 1),
            st.integers(0, 6),
            st.just(0),
            st.just(0),
        ),
        st.tuples(
            st.sampled_from(("PriorityClass", "PodDisruptionBudget")),
            st.sampled_from(("ADDED", "DELETED")),
            st.integers(0, 1),
            st.integers(0, 3),
            st.just(0),
            st.just(0),
        ),
    ),
    min_size=1,
    max_size=40,
)


def event_obj(kind: str, index: int, variant: int, node: int, gpus: int) -> dict[str, Any]:
    if kind == "Pod":
        return pod_obj(PODS[index], variant, node, gpus)
    if kind == "Node":
        return node_obj(NODES[index], variant)
    return other_obj(kind, index, variant)


def seeded() -> KubeWatchSource:
    store = source()
    apply(store, "ADDED", k.priority_class("pc-0", 1000))
    for i, name in enumerate(NODES):
        apply(store, "ADDED", node_obj(name, 0))
        for j in range(2):
            apply(store, "ADDED", pod_obj(PODS[2 * i + j], 0, i + 1, 2))
    return store


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(events, st.lists(st.integers(1, 5), min_size=1, max_size=8))
def test_a_build_from_the_changes_is_a_full_build(
    sequence: list[tuple[str, str, int, int, int, int]], cuts: list[int]
) -> None:
    store = seeded()
    store.build()
    at = 0
    for cut in [*cuts, len(sequence)]:
        for kind, what, index, variant, node, gpus in sequence[at : at + cut]:
            apply(store, what, event_obj(kind, index, variant, node, gpus))
        at += cut
        got, _generation = store.build()
        want, _dropped = full_build(store)
        assert_same(got, want)
        if at >= len(sequence):
            break


def test_pod_churn_is_always_built_from_the_changes() -> None:
    """Pods coming, going and changing in every readable shape that fits (shares, whole GPUs,
    finished, pending, on a node that is not there) never need a full build, and each build
    equals a full one: the property above is not met by building in full. (At most 8 pods of
    at most one GPU each: none overcommits an 8-GPU node, which a full build handles.)"""
    rng = random.Random(26)
    store = seeded()
    store.build()
    for _ in range(60):
        for _event in range(rng.randint(1, 4)):
            what = rng.choice(("ADDED", "MODIFIED", "DELETED"))
            name = rng.choice(PODS[:8])
            variant = rng.choice((0, 1, 2, 4, 5, 6, 7, 9))
            obj = pod_obj(name, variant, rng.randint(0, 5), rng.choice((0, 1)))
            apply(store, what, obj)
        got, _ = store.build()
        assert_same(got, full_build(store)[0])
    assert store._builder.full_builds == 1
    assert store._builder.partial_builds == 60


def test_a_few_pod_changes_are_not_a_full_build() -> None:
    """The usual change — pods coming, going, changing — redoes only the nodes they touch:
    the others' rows and pods are the previous cluster's objects."""
    store = seeded()
    first, _ = store.build()
    apply(store, "DELETED", pod_obj(PODS[0], 0, 1, 2))
    apply(store, "ADDED", pod_obj("p-11", 0, 3, 4))
    apply(store, "MODIFIED", pod_obj(PODS[7], 7, 4, 2))
    got, _ = store.build()
    assert store._builder.full_builds == 1 and store._builder.partial_builds == 1
    assert_same(got, full_build(store)[0])
    assert got.pods["ns-b/p-2"] is first.pods["ns-b/p-2"]  # on node-1, untouched
    assert got.nodes[2] is first.nodes[2]
    assert "ns-b/p-0" not in got.pods and "ns-a/p-11" in got.pods


@pytest.mark.parametrize(
    ("event", "why"),
    [
        (("ADDED", k.priority_class("pc-1", 5)), "a PriorityClass resolves every pod's priority"),
        (("ADDED", node_obj("node-7", 0)), "a new node: pods may have waited for it"),
        (("DELETED", node_obj("node-3", 0)), "a node gone: its pods are left out"),
        (("MODIFIED", node_obj("node-0", 5)), "a node unreadable: left out with its pods"),
        (("MODIFIED", pod_obj(PODS[0], 8, 1, 2)), "an unreadable pod: its node takes nothing"),
    ],
)
def test_a_change_to_the_whole_cluster_is_a_full_build(
    event: tuple[str, dict[str, Any]], why: str
) -> None:
    store = seeded()
    store.build()
    apply(store, *event)
    got, _ = store.build()
    assert store._builder.full_builds == 2, why
    assert_same(got, full_build(store)[0])


def test_an_event_that_changes_nothing_kept_changes_no_build() -> None:
    """A node's heartbeat (status.conditions, not kept) or a pod's new IP moves the
    resourceVersion only: the store's generation stays, so no cluster is built for it."""
    store = seeded()
    first, generation = store.build()
    node = node_obj("node-1", 0)
    node["metadata"]["resourceVersion"] = "5001"
    node["status"]["conditions"][0]["lastHeartbeatTime"] = "2026-11-29T12:05:00Z"
    apply(store, "MODIFIED", node)
    pod = pod_obj(PODS[0], 0, 1, 2)
    pod["metadata"]["resourceVersion"] = "5002"
    pod["status"]["podIP"] = "10.244.9.9"
    apply(store, "MODIFIED", pod)
    assert store.generation() == generation
    assert store.stats.unchanged == 2
    assert store.objects("Node")["node-1"]["metadata"]["resourceVersion"] == "5001"
    assert store.resource_version("Pod") == "5002"
    node["spec"]["unschedulable"] = True  # kept: a change
    apply(store, "MODIFIED", node)
    assert store.generation() == generation + 1
    got, _ = store.build()
    assert_same(got, full_build(store)[0])
    assert got.node("node-1").unschedulable and not first.node("node-1").unschedulable
