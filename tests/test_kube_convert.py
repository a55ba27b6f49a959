"""Real Kubernetes JSON → model: nodes, pods, PDBs, priority classes, and the errors."""

from __future__ import annotations

import copy
from datetime import UTC, datetime
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from defrag.adapters.kube_convert import (
    ClusterParts,
    ConversionError,
    cluster_from_items,
    node_from_json,
    pdb_from_json,
    pod_from_json,
    priority_class_from_json,
)
from defrag.model import OwnerRef, Taint
from defrag.model.selectors import Requirement
from tests.support import kubeobjects as k

# --- nodes -----------------------------------------------------------------------------------


def test_node_reads_allocatable_gfd_labels_taints_and_cordon() -> None:
    raw = k.node(
        "gpu-1",
        cpu="95500m",
        memory="1000Gi",
        product="NVIDIA-H100-80GB-HBM3",
        gpu_memory_mib=81559,
        taints=[{"key": "nvidia.com/gpu", "value": "present", "effect": "NoSchedule"}],
        unschedulable=True,
    )
    node = node_from_json(raw)
    assert node.name == "gpu-1"
    assert node.cpu_milli == 95500
    assert node.memory_mib == 1000 * 1024  # 1000Gi = 1,024,000 MiB
    assert node.num_gpu == 8
    assert node.gpu_model == "NVIDIA-H100-80GB-HBM3"
    assert node.gpu_memory_mib == 81559
    assert node.taints == (Taint("nvidia.com/gpu", "NoSchedule", "present"),)
    assert node.unschedulable
    assert node.domains == ((0, 1, 2, 3, 4, 5, 6, 7),)  # no annotation: one domain


@pytest.mark.parametrize(
    ("annotation", "gpus", "domains"),
    [
        ("0-3,4-7", 8, ((0, 1, 2, 3), (4, 5, 6, 7))),
        ("0-1, 2-3, 4-5, 6-7", 8, ((0, 1), (2, 3), (4, 5), (6, 7))),
        ("0,1", 2, ((0,), (1,))),
        # GPU 7 withdrawn by the device plugin (7 allocatable): dropped from its domain.
        ("0-3,4-7", 7, ((0, 1, 2, 3), (4, 5, 6))),
    ],
)
def test_nvlink_domains_annotation(
    annotation: str, gpus: int, domains: tuple[tuple[int, ...], ...]
) -> None:
    raw = k.node("n", gpus=8, nvlink=annotation)
    raw["status"]["allocatable"]["nvidia.com/gpu"] = str(gpus)
    assert node_from_json(raw).domains == domains


def test_cpu_only_node_has_no_gpus_and_no_model() -> None:
    node = node_from_json(k.node("cpu-1", gpus=0))
    assert (node.num_gpu, node.gpu_model, node.domains) == (0, "", ())


@pytest.mark.parametrize(("pods", "max_pods"), [("58", 58), ("250", 250), (None, 110)])
def test_node_pod_capacity_is_read_from_allocatable(pods: str | None, max_pods: int) -> None:
    # the descheduler's ``pods`` resource is allocatable pods (nodeutilization.go
    # referencedResourceListForNodeCapacity); the kubelet's maxPods is 110 when not reported
    raw = k.node("n", gpus=1)
    raw["status"]["allocatable"].pop("pods", None)
    if pods is not None:
        raw["status"]["allocatable"]["pods"] = pods
    assert node_from_json(raw).max_pods == max_pods


def test_node_without_allocatable_falls_back_to_capacity() -> None:
    raw = k.node("n", gpus=4)
    del raw["status"]["allocatable"]
    assert node_from_json(raw).num_gpu == 4


def _set(obj: dict[str, Any], path: tuple[Any, ...], value: Any) -> dict[str, Any]:
    out = copy.deepcopy(obj)
    target = out
    for key in path[:-1]:
        target = target[key]
    if value is _DELETE:
        del target[path[-1]]
    else:
        target[path[-1]] = value
    return out


_DELETE = object()


@pytest.mark.parametrize(
    ("path", "value", "field", "words"),
    [
        (("status", "allocatable", "cpu"), "lots", "status.allocatable.cpu", "quantity"),
        (("status", "allocatable", "memory"), _DELETE, "status.allocatable.memory", "missing"),
        (
            ("status", "allocatable", "nvidia.com/gpu"),
            "1.5",
            'status.allocatable["nvidia.com/gpu"]',
            "whole",
        ),
        (
            ("metadata", "annotations", "defrag.io/nvlink-domains"),
            "0-3,3-7",
            'metadata.annotations["defrag.io/nvlink-domains"]',
            "two domains",
        ),
        (
            ("metadata", "annotations", "defrag.io/nvlink-domains"),
            "0-3",
            'metadata.annotations["defrag.io/nvlink-domains"]',
            "no NVLink domain",
        ),
        (
            ("metadata", "annotations", "defrag.io/nvlink-domains"),
            "a-b",
            'metadata.annotations["defrag.io/nvlink-domains"]',
            "range",
        ),
        (
            ("metadata", "labels", "nvidia.com/gpu.memory"),
            "80GB",
            'metadata.labels["nvidia.com/gpu.memory"]',
            "integer",
        ),
        (
            ("metadata", "labels", "nvidia.com/gpu.count"),
            "four",
            'metadata.labels["nvidia.com/gpu.count"]',
            "integer",
        ),
        (
            ("spec", "taints"),
            [{"key": "x", "effect": "Sometimes"}],
            "spec.taints[0].effect",
            "Sometimes",
        ),
        (("status", "allocatable"), _DELETE, "status.allocatable", "missing"),
    ],
)
def test_malformed_node_names_object_and_field(
    path: tuple[str, ...], value: object, field: str, words: str
) -> None:
    raw = _set(k.node("gpu-7"), path, value)
    if path == ("status", "allocatable"):
        del raw["status"]["capacity"]
    with pytest.raises(ConversionError) as info:
        node_from_json(raw)
    assert info.value.obj == "Node gpu-7"
    assert info.value.path == field
    assert words.lower() in str(info.value).lower()


# --- pods ------------------------------------------------------------------------------------


def test_pod_reads_everything_the_model_keeps() -> None:
    raw = k.pod(
        "train-0",
        "ml",
        4,
        node_name="gpu-1",
        cpu="1500m",
        memory="64Gi",
        priority=1000,
        priority_class="high",
        owner=("Job", "train"),
        labels={"training.kubeflow.org/job-name": "bert"},
        annotations={"defrag.io/gpu-indices": "4-7", "defrag.io/gpu-memory": "40Gi"},
        tolerations=[{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}],
    )
    raw["spec"]["nodeSelector"] = {"nvidia.com/gpu.product": "NVIDIA-A100-SXM4-80GB"}
    pod, explicit = pod_from_json(raw)
    assert explicit
    assert (pod.namespace, pod.name, pod.num_gpu, pod.gpu_milli) == ("ml", "train-0", 4, 1000)
    assert (pod.cpu_milli, pod.memory_mib) == (1500, 64 * 1024)
    assert (pod.priority, pod.priority_class, pod.qos) == (1000, "high", "Burstable")
    ref = raw["metadata"]["ownerReferences"][0]
    assert pod.owner == OwnerRef("Job", "train", True, "batch/v1", ref["uid"])
    assert pod.owner.group == "batch"
    assert pod.gang == "bert"  # the label wins over the owner
    assert (pod.node, pod.gpu_indices, pod.phase) == ("gpu-1", (4, 5, 6, 7), "Running")
    assert pod.gpu_memory_mib == 40 * 1024
    assert pod.gpu_models == frozenset({"NVIDIA-A100-SXM4-80GB"})
    assert pod.created_at == datetime(2026, 11, 1, 8, 0, tzinfo=UTC)
    assert pod.pending_since is None
    assert pod.tolerations[0].operator == "Exists"
    assert pod.uid


def _container(name: str, cpu: str, gpus: int = 0, sidecar: bool = False) -> dict[str, Any]:
    requests: dict[str, str] = {"cpu": cpu}
    limits: dict[str, str] = {"nvidia.com/gpu": str(gpus)} if gpus else {}
    c: dict[str, Any] = {"name": name, "resources": {"requests": requests, "limits": limits}}
    if sidecar:
        c["restartPolicy"] = "Always"
    return c


@pytest.mark.parametrize(
    ("apps", "inits", "cpu_milli", "gpus"),
    [
        # Two app containers: requests add up (1 + 0.5 CPU; 2 + 1 GPUs).
        ([("a", "1", 2), ("b", "500m", 1)], [], 1500, 3),
        # An init container bigger than the apps' sum sets the request: max(4, 1) CPU, max(8, 2).
        ([("a", "1", 2)], [("init", "4", 8, False)], 4000, 8),
        # A smaller init container changes nothing.
        ([("a", "2", 4)], [("init", "1", 1, False)], 2000, 4),
        # A sidecar (restartPolicy Always) adds to the apps: 1 + 0.25 CPU; and a later init
        # container runs beside it: max(1.25, 0.25 + 1) = 1.25 CPU.
        ([("a", "1", 1)], [("side", "250m", 0, True), ("init", "1", 0, False)], 1250, 1),
        # Init after a sidecar dominates: 0.25 + 2 = 2.25 > 1 + 0.25.
        ([("a", "1", 0)], [("side", "250m", 0, True), ("init", "2", 0, False)], 2250, 0),
    ],
)
def test_pod_requests_follow_the_init_container_rule(
    apps: list[tuple[str, str, int]],
    inits: list[tuple[str, str, int, bool]],
    cpu_milli: int,
    gpus: int,
) -> None:
    raw = k.pod("p", "default")
    raw["spec"]["containers"] = [_container(n, c, g) for n, c, g in apps]
    if inits:
        raw["spec"]["initContainers"] = [_container(n, c, g, s) for n, c, g, s in inits]
    pod, _ = pod_from_json(raw)
    assert (pod.cpu_milli, pod.num_gpu) == (cpu_milli, gpus)


def test_pod_overhead_is_added() -> None:
    raw = k.pod("p", cpu="1", memory="1Gi")
    raw["spec"]["overhead"] = {"cpu": "250m", "memory": "120Mi"}
    pod, _ = pod_from_json(raw)
    assert (pod.cpu_milli, pod.memory_mib) == (1250, 1024 + 120)


def test_gpu_limit_alone_is_the_request() -> None:
    raw = k.pod("p", gpus=2)
    del raw["spec"]["containers"][0]["resources"]["requests"]["nvidia.com/gpu"]
    assert pod_from_json(raw)[0].num_gpu == 2


@pytest.mark.parametrize(
    ("gpus", "milli", "num_gpu", "share"),
    [(1, "500", 1, 500), (0, "250", 1, 250), (2, "1000", 2, 1000)],
)
def test_gpu_share_annotation(gpus: int, milli: str, num_gpu: int, share: int) -> None:
    raw = k.pod("p", gpus=gpus, annotations={"defrag.io/gpu-milli": milli})
    pod, _ = pod_from_json(raw)
    assert (pod.num_gpu, pod.gpu_milli) == (num_gpu, share)


@pytest.mark.parametrize(
    ("labels", "owner", "gang"),
    [
        ({"job-name": "j1"}, ("Job", "j1"), "j1"),
        ({"volcano.sh/job-name": "v"}, ("ReplicaSet", "rs"), "v"),
        ({"scheduling.x-k8s.io/pod-group": "pg"}, None, "pg"),
        ({}, ("PyTorchJob", "bert"), "pytorchjob/bert"),
        ({}, ("ReplicaSet", "serve"), None),  # replicas are not a gang
        ({}, None, None),
    ],
)
def test_gang_key(labels: dict[str, str], owner: tuple[str, str] | None, gang: str | None) -> None:
    pod, _ = pod_from_json(k.pod("p", "ns", labels=labels, owner=owner))
    assert pod.gang == gang
    assert pod.gang_key == (f"ns/{gang}" if gang else None)


def test_pending_pod_takes_its_unschedulable_time_and_reason() -> None:
    raw = k.pod("p", gpus=8, created="2026-11-29T06:00:00Z")
    raw["status"]["conditions"][0]["lastTransitionTime"] = "2026-11-29T06:00:05Z"
    pod, _ = pod_from_json(raw)
    assert pod.node is None and pod.phase == "Pending"
    assert pod.pending_since == datetime(2026, 11, 29, 6, 0, 5, tzinfo=UTC)
    assert pod.pending_reason == "Unschedulable"


def test_pending_pod_without_condition_is_pending_since_creation() -> None:
    raw = k.pod("p", created="2026-11-29T06:00:00Z")
    raw["status"] = {"phase": "Pending"}
    assert pod_from_json(raw)[0].pending_since == datetime(2026, 11, 29, 6, tzinfo=UTC)


def test_non_controller_owner_is_kept_when_no_controller() -> None:
    raw = k.pod("p")
    ref = raw["metadata"]["ownerReferences"][0]
    ref["controller"] = False
    owner = pod_from_json(raw)[0].owner
    assert owner == OwnerRef("ReplicaSet", "serve-7d9f", False, "apps/v1", ref["uid"])


@pytest.mark.parametrize(
    ("mutate", "field", "words"),
    [
        (
            lambda p: p["spec"]["containers"][0]["resources"]["requests"].update(cpu="x"),
            "spec.containers[0].resources.requests.cpu",
            "quantity",
        ),
        (
            lambda p: p["spec"].update(
                initContainers=[{"name": "i", "resources": {"requests": {"memory": "1Qi"}}}]
            ),
            "spec.initContainers[0].resources.requests.memory",
            "quantity",
        ),
        (lambda p: p["spec"].update(containers=[]), "spec.containers", "missing"),
        (lambda p: p["spec"].update(priority="high"), "spec.priority", "integer"),
        (
            lambda p: p["metadata"].update(annotations={"defrag.io/gpu-milli": "1500"}),
            'metadata.annotations["defrag.io/gpu-milli"]',
            "outside",
        ),
        (
            lambda p: p["metadata"].update(annotations={"defrag.io/gpu-milli": "half"}),
            'metadata.annotations["defrag.io/gpu-milli"]',
            "integer",
        ),
        (
            lambda p: p["metadata"].update(annotations={"defrag.io/gpu-indices": "0,0"}),
            'metadata.annotations["defrag.io/gpu-indices"]',
            "twice",
        ),
        (
            lambda p: p["metadata"].update(creationTimestamp="yesterday"),
            "metadata.creationTimestamp",
            "RFC 3339",
        ),
        (
            lambda p: p["spec"].update(tolerations=[{"key": "a", "operator": "Maybe"}]),
            "spec.tolerations[0].operator",
            "Maybe",
        ),
        (
            lambda p: p["metadata"].update(ownerReferences=[{"kind": "Job"}]),
            "metadata.ownerReferences[0]",
            "kind and name",
        ),
        (
            lambda p: (
                p["spec"]["containers"][0]["resources"]["limits"].update({"nvidia.com/gpu": "0.5"})
                or p["spec"]["containers"][0]["resources"]["requests"].update(
                    {"nvidia.com/gpu": "0.5"}
                )
            ),
            "spec.containers[*].resources",
            "fractional",
        ),
    ],
)
def test_malformed_pod_names_object_and_field(mutate: Any, field: str, words: str) -> None:
    raw = k.pod("serve-1", "serving", 2, node_name="gpu-1")
    mutate(raw)
    with pytest.raises(ConversionError) as info:
        pod_from_json(raw)
    assert info.value.obj == "Pod serving/serve-1"
    assert info.value.path == field
    assert words in str(info.value)


def test_object_without_a_name_is_named_by_list_index() -> None:
    bad = k.node("x")
    del bad["metadata"]["name"]
    with pytest.raises(ConversionError, match=r"^items\[1\]: metadata.name: missing"):
        cluster_from_items([k.node("ok"), bad], strict=True)
    assert cluster_from_items([k.node("ok"), bad]).warnings[0].startswith("items[1]: metadata.name")


# --- PDBs and priority classes ---------------------------------------------------------------


def test_pdb_selector_and_disruptions_allowed() -> None:
    raw = k.pdb(
        "serve",
        "serving",
        match_labels={"app": "serve"},
        match_expressions=[{"key": "tier", "operator": "In", "values": ["gpu", "cpu"]}],
        disruptions_allowed=2,
    )
    pdb = pdb_from_json(raw)
    assert pdb is not None
    assert pdb.match_labels == {"app": "serve"}
    assert pdb.match_expressions == (Requirement("tier", "In", ("gpu", "cpu")),)
    assert pdb.disruptions_allowed == 2


def test_pdb_with_null_selector_selects_nothing_and_is_dropped() -> None:
    raw = k.pdb("none", "serving")
    del raw["spec"]["selector"]
    assert pdb_from_json(raw) is None


@pytest.mark.parametrize(
    ("path", "value", "field"),
    [
        (("status", "disruptionsAllowed"), -1, "status.disruptionsAllowed"),
        (
            ("spec", "selector", "matchExpressions"),
            [{"key": "a", "operator": "Near"}],
            "spec.selector.matchExpressions[0].operator",
        ),
    ],
)
def test_malformed_pdb(path: tuple[str, ...], value: object, field: str) -> None:
    raw = _set(k.pdb("p", "ns", match_labels={"a": "b"}), path, value)
    with pytest.raises(ConversionError) as info:
        pdb_from_json(raw)
    assert (info.value.obj, info.value.path) == ("PodDisruptionBudget ns/p", field)


def test_priority_class_resolves_pods_without_spec_priority() -> None:
    parts = ClusterParts()
    parts.add(k.priority_class("high", 1000), "0")
    parts.add(k.priority_class("normal", 10, global_default=True), "1")
    parts.add(k.pod("a", priority=None, priority_class="high"), "2")
    parts.add(k.pod("b", priority=None), "3")  # no class: the global default
    parts.add(k.pod("c", priority=5, priority_class="high"), "4")  # spec.priority wins
    cluster = parts.build()
    assert {p.name: p.priority for p in cluster.pods.values()} == {"a": 1000, "b": 10, "c": 5}
    assert dict(cluster.priority_classes) == {"high": 1000, "normal": 10}


def test_priority_class_value_must_be_an_integer() -> None:
    raw = k.priority_class("high", 1000)
    raw["value"] = "1000"
    with pytest.raises(ConversionError, match="PriorityClass high: value"):
        priority_class_from_json(raw)


def test_unknown_kinds_are_ignored_and_kindless_items_are_errors() -> None:
    svc = {"apiVersion": "v1", "kind": "Service", "metadata": {"name": "s"}}
    assert len(cluster_from_items([k.node("n"), svc]).nodes) == 1
    with pytest.raises(ConversionError, match="kind: missing"):
        cluster_from_items([{"metadata": {"name": "x"}}], strict=True)
    # lenient (a snapshot is a dump of a live cluster): left out, said
    (warning,) = cluster_from_items([{"metadata": {"name": "x"}}, "?"], strict=False).warnings[:1]
    assert "kind: missing; left out" in warning


def test_pod_bound_to_unknown_node_is_an_error_naming_the_source() -> None:
    with pytest.raises(ConversionError, match="unknown node 'ghost'"):
        cluster_from_items([k.pod("p", node_name="ghost")], source="api")


@given(
    gpus=st.integers(0, 16),
    cpu_milli=st.integers(0, 512_000),
    memory_mib=st.integers(0, 4 * 2**20),
    init_gpus=st.integers(0, 16),
)
@settings(max_examples=60, deadline=None)
def test_pod_shape_round_trips_through_kubernetes_json(
    gpus: int, cpu_milli: int, memory_mib: int, init_gpus: int
) -> None:
    raw = k.pod("p", gpus=gpus, cpu=f"{cpu_milli}m", memory=f"{memory_mib}Mi")
    raw["spec"]["initContainers"] = [_container("init", "1m", init_gpus)]
    pod, _ = pod_from_json(raw)
    assert pod.num_gpu == max(gpus, init_gpus)  # an init container runs alone, before the app
    assert pod.cpu_milli == max(cpu_milli, 1)
    assert pod.memory_mib == memory_mib


# --- terminating pods --------------------------------------------------------------------------


def _deleted(obj: dict[str, Any], at: str = "2026-11-29T12:00:30Z") -> dict[str, Any]:
    """``obj`` as the API server leaves it on a graceful delete: ``metadata.deletionTimestamp``
    (RFC 3339: now + the grace period) and ``deletionGracePeriodSeconds`` set, the pod still
    there until its kubelet confirms it stopped (meta/v1 ObjectMeta)."""
    out = copy.deepcopy(obj)
    out["metadata"]["deletionTimestamp"] = at
    out["metadata"]["deletionGracePeriodSeconds"] = 30
    return out


def test_deletion_timestamp_is_read_and_the_pod_still_holds_its_gpus() -> None:
    bound = _deleted(k.pod("train-0", "ml", 4, node_name="gpu-1", phase="Running"))
    waiting = _deleted(k.pod("wait-0", "ml", 2, phase="Pending"))
    pod, _ = pod_from_json(bound)
    assert pod.terminating
    assert pod.deleting_since == datetime(2026, 11, 29, 12, 0, 30, tzinfo=UTC)
    assert not pod_from_json(k.pod("live-0", "ml", 1, node_name="gpu-1"))[0].terminating
    cluster = cluster_from_items([k.node("gpu-1"), bound, waiting])
    # gpu-1 has 8 GPUs; the terminating pod still holds 4 of them until it is gone: 8 − 4 = 4
    assert int(cluster.arrays.free_whole_count()[0]) == 4
    assert [p.key for p in cluster.bound_pods()] == ["ml/train-0"]
    assert list(cluster.pending_pods()) == []  # a terminating pod waits for nothing


def test_a_bad_deletion_timestamp_names_the_field() -> None:
    with pytest.raises(ConversionError, match=r"metadata\.deletionTimestamp"):
        pod_from_json(_deleted(k.pod("p", "ml", 1), at="yesterday"))


def test_pods_of_one_template_share_their_shape_and_each_warns_by_name() -> None:
    """A pod's shape (requests, GPUs, tolerations, selectors) is made once per template and
    shared; one whose shape warned is made per pod, so each warning names its own pod."""
    parts = ClusterParts()
    for name in ("a", "b"):
        parts.add(k.pod(name, "ml", 2, node_name="n1"), name, kind="Pod")
    (a, _), (b, _) = parts.pods
    assert (a.name, b.name) == ("a", "b")
    assert a.tolerations is b.tolerations and (a.num_gpu, a.cpu_milli) == (b.num_gpu, 4000)
    claimed = ClusterParts()
    for name in ("c", "d"):
        obj = k.pod(name, "ml", 1, node_name="n1")
        obj["spec"]["resourceClaims"] = [{"name": "gpu", "resourceClaimTemplateName": "one"}]
        claimed.add(obj, name, kind="Pod")
    assert [w.obj for w in claimed.warnings] == ["Pod ml/c", "Pod ml/d"]
