"""GPU resource shapes read from real Kubernetes objects (adapters/gpu_shapes.py, issue 12).

Each row is built from the upstream facts it names (tests/conformance/ holds whole objects):
- NVIDIA k8s-device-plugin ``internal/lm/resource.go`` and GPU operator ``gpu-sharing.rst``:
  time-slicing keeps ``nvidia.com/gpu.count`` physical, sets ``nvidia.com/gpu.replicas``, and
  with ``renameByDefault: false`` multiplies allocatable ``nvidia.com/gpu`` (T4 ×4 → 16, product
  ``Tesla-T4-SHARED``); with ``renameByDefault: true`` the replicas are ``nvidia.com/gpu.shared``.
- ``gpu-operator-mig.rst``: MIG single (``nvidia.com/mig.strategy=single``, product
  ``…-MIG-1g.10gb``, ``nvidia.com/gpu`` = 7 slices per GPU); MIG mixed (``nvidia.com/mig-<p>``).
- HAMi ``docs/develop/protocol.md`` / ``pkg/device/devices.go``: ``hami.io/node-nvidia-register``
  (JSON list, or the older ``id,count,devmem,devcore,type,numa,health:`` form); allocatable
  ``nvidia.com/gpu`` = GPUs × deviceSplitCount (10); examples/nvidia/*.yaml for the pod keys.
- KAI-Scheduler ``docs/gpu-sharing/``: ``gpu-fraction`` / ``gpu-memory`` annotations, no
  ``nvidia.com/gpu`` request; reservation pods in ``kai-resource-reservation``.
- Koordinator ``docs/proposals/scheduling/20220629-fine-grained-device-scheduling.md``: 100 =
  one GPU in ``koordinator.sh/gpu-core`` / ``gpu-memory-ratio`` / ``gpu``.
"""

from __future__ import annotations

import json
from typing import Any

import pytest

from defrag.adapters.gpu_shapes import ShapeWarning
from defrag.adapters.kube_convert import ClusterParts, node_from_json, pod_from_json
from tests.support import kubeobjects as k

HAMI_JSON = json.dumps(
    [
        {"id": f"GPU-{i}", "count": 10, "devmem": 81920, "devcore": 100, "type": "NVIDIA-A100"}
        for i in range(2)
    ]
)
HAMI_LEGACY = "GPU-a,10,32768,100,NVIDIA-Tesla V100-PCIE-32GB,0,true:GPU-b,10,32768,100,NVIDIA-Tesla V100-PCIE-32GB,0,true:"  # noqa: E501


def _node(
    gpus: int,
    labels: dict[str, str] | None = None,
    extra: dict[str, str] | None = None,
    annotations: dict[str, str] | None = None,
) -> dict[str, Any]:
    obj = k.node("n1", gpus, labels=labels)
    obj["status"]["allocatable"].update(extra or {})
    obj["metadata"]["annotations"].update(annotations or {})
    return obj


@pytest.mark.parametrize(
    ("obj", "num_gpu", "pools", "warned"),
    [
        pytest.param(_node(8), 8, {}, "", id="plain GFD node: 8 exclusive GPUs"),
        pytest.param(
            _node(
                16,
                {
                    "nvidia.com/gpu.count": "4",
                    "nvidia.com/gpu.replicas": "4",
                    "nvidia.com/gpu.product": "Tesla-T4-SHARED",
                    "nvidia.com/gpu.sharing-strategy": "time-slicing",
                },
            ),
            0,
            {"nvidia.com/gpu": 16},
            "",
            id="time-slicing renameByDefault false: 16 replica units, no whole GPU",
        ),
        pytest.param(
            _node(
                0,
                {"nvidia.com/gpu.count": "8", "nvidia.com/gpu.replicas": "10"},
                {"nvidia.com/gpu": "0", "nvidia.com/gpu.shared": "80"},
            ),
            0,
            {"nvidia.com/gpu.shared": 80},
            "",
            id="time-slicing renameByDefault true: nvidia.com/gpu.shared pool",
        ),
        pytest.param(
            _node(
                7,
                {
                    "nvidia.com/mig.strategy": "single",
                    "nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3-MIG-1g.10gb",
                    "nvidia.com/gpu.count": "7",
                },
            ),
            0,
            {"nvidia.com/gpu": 7},
            "",
            id="MIG single: 7 slices are pool units",
        ),
        pytest.param(
            _node(
                0,
                {"nvidia.com/mig.strategy": "mixed", "nvidia.com/gpu.replicas": "0"},
                {"nvidia.com/mig-1g.10gb": "2", "nvidia.com/mig-3g.40gb": "1"},
            ),
            0,
            {"nvidia.com/mig-1g.10gb": 2, "nvidia.com/mig-3g.40gb": 1},
            "",
            id="MIG mixed: one pool per profile",
        ),
        pytest.param(
            _node(
                20,
                {"gpu": "on"},
                annotations={"hami.io/node-nvidia-register": HAMI_JSON},
            ),
            2,
            {},
            "",
            id="HAMi (JSON register): 2 physical GPUs behind 20 split units",
        ),
        pytest.param(
            _node(20, annotations={"hami.io/node-nvidia-register": HAMI_LEGACY}),
            2,
            {},
            "",
            id="HAMi (legacy register string): 2 GPUs",
        ),
        pytest.param(
            _node(
                20, {"nvidia.com/gpu.count": "2"}, annotations={"hami.io/node-nvidia-register": "?"}
            ),
            2,
            {},
            'Node n1: metadata.annotations["hami.io/node-nvidia-register"]',
            id="HAMi register unreadable: gpu.count taken, warned",
        ),
        pytest.param(
            _node(16, {"nvidia.com/gpu.count": "4"}),
            0,
            {"nvidia.com/gpu": 16},
            'Node n1: status.allocatable["nvidia.com/gpu"]: 16 allocatable but label',
            id="count contradicts allocatable, nothing explains it: shared units, warned",
        ),
        pytest.param(
            _node(0, extra={"amd.com/gpu": "8"}),
            0,
            {},
            'Node n1: status.allocatable["amd.com/gpu"]: 8 unit(s) of amd.com/gpu',
            id="unknown vendor: left out, warned",
        ),
        pytest.param(
            _node(
                0,
                extra={"koordinator.sh/gpu-core": "400", "koordinator.sh/gpu-memory-ratio": "400"},
            ),
            4,
            {},
            "",
            id="Koordinator: 400 gpu-core = 4 GPUs",
        ),
    ],
)
def test_node_shapes(obj: dict[str, Any], num_gpu: int, pools: dict[str, int], warned: str) -> None:
    warnings: list[ShapeWarning] = []
    node = node_from_json(obj, "n1", warnings)
    assert node.num_gpu == num_gpu
    assert dict(node.pools) == pools
    if warned:
        assert len(warnings) == 1 and str(warnings[0]).startswith(warned), warnings
    else:
        assert warnings == []


def _pod(
    requests: dict[str, str] | None = None,
    annotations: dict[str, str] | None = None,
    namespace: str = "ml",
    bound: bool = False,
    **spec: Any,
) -> dict[str, Any]:
    obj = k.pod("p", namespace, annotations=annotations, node_name="n1" if bound else None)
    obj["spec"]["containers"][0]["resources"]["requests"].update(requests or {})
    obj["spec"].update(spec)
    return obj


@pytest.mark.parametrize(
    ("obj", "shape", "warned"),
    [
        pytest.param(_pod({"nvidia.com/gpu": "2"}), (2, 1000, "", 0), "", id="whole GPUs"),
        pytest.param(
            _pod({"nvidia.com/mig-1g.10gb": "1"}),
            (0, 1000, "nvidia.com/mig-1g.10gb", 1),
            "",
            id="MIG profile: one pool unit",
        ),
        pytest.param(
            _pod({"nvidia.com/gpu.shared": "2"}),
            (0, 1000, "nvidia.com/gpu.shared", 2),
            "",
            id="renamed time-sliced replicas",
        ),
        # HAMi: gpumem-percentage 50 with gpucores 30 → max(0.30, 0.50) = 500 milli on each of 2
        pytest.param(
            _pod(
                {
                    "nvidia.com/gpu": "2",
                    "nvidia.com/gpumem-percentage": "50",
                    "nvidia.com/gpucores": "30",
                }
            ),
            (2, 500, "", 0),
            "",
            id="HAMi memory percentage",
        ),
        # HAMi: gpucores alone still takes the whole GPU's memory → a whole GPU
        pytest.param(
            _pod({"nvidia.com/gpu": "1", "nvidia.com/gpucores": "30"}),
            (1, 1000, "", 0),
            "",
            id="HAMi cores alone = whole GPU",
        ),
        # KAI: gpu-fraction 0.5 → 500 milli of one GPU, no nvidia.com/gpu request
        pytest.param(
            _pod(annotations={"gpu-fraction": "0.5"}), (1, 500, "", 0), "", id="KAI fraction"
        ),
        pytest.param(
            _pod(annotations={"gpu-fraction": "half"}),
            (1, 1000, "", 0),
            'Pod ml/p: metadata.annotations["gpu-fraction"]',
            id="KAI fraction unreadable: whole GPU, warned",
        ),
        # Koordinator: gpu-memory-ratio 50 → 500 milli; 200 → 2 whole GPUs
        pytest.param(
            _pod({"koordinator.sh/gpu-memory-ratio": "50", "koordinator.sh/gpu-core": "50"}),
            (1, 500, "", 0),
            "",
            id="Koordinator half GPU",
        ),
        pytest.param(
            _pod({"koordinator.sh/gpu": "200"}), (2, 1000, "", 0), "", id="Koordinator 2 GPUs"
        ),
        pytest.param(
            _pod({"amd.com/gpu": "1"}, bound=True),
            (0, 1000, "", 0),
            "Pod ml/p: spec.containers[*].resources.requests['amd.com/gpu']",
            id="unknown vendor, bound: kept for CPU and memory, warned",
        ),
        pytest.param(
            _pod(resourceClaims=[{"name": "gpu", "resourceClaimTemplateName": "one"}], bound=True),
            (0, 1000, "", 0),
            "Pod ml/p: spec.resourceClaims",
            id="DRA claim, bound: kept, warned",
        ),
    ],
)
def test_pod_shapes(obj: dict[str, Any], shape: tuple[int, int, str, int], warned: str) -> None:
    warnings: list[ShapeWarning] = []
    pod, _ = pod_from_json(obj, "p", warnings)
    assert (pod.num_gpu, pod.gpu_milli, pod.pool, pod.pool_units) == shape
    if warned:
        assert len(warnings) == 1 and str(warnings[0]).startswith(warned), warnings
    else:
        assert warnings == []


@pytest.mark.parametrize(
    "pod",
    [
        pytest.param(_pod({"amd.com/gpu": "1"}), id="unknown vendor"),
        pytest.param(
            _pod(resourceClaims=[{"name": "gpu", "resourceClaimTemplateName": "one"}]), id="DRA"
        ),
        pytest.param(
            _pod({"nvidia.com/mig-1g.10gb": "1", "nvidia.com/mig-2g.20gb": "1"}),
            id="two MIG profiles",
        ),
    ],
)
def test_pending_pods_defrag_cannot_model_are_left_out_with_one_warning(
    pod: dict[str, Any],
) -> None:
    parts = ClusterParts()
    parts.add(k.node("n1", 8), "n1")
    parts.add(pod, "p")
    cluster = parts.build()
    assert "ml/p" not in cluster.pods
    assert len(cluster.warnings) == 1 and cluster.warnings[0].startswith("Pod ml/p: ")


def test_memory_shares_are_sized_against_their_node() -> None:
    # KAI gpu-memory 20480 MiB on an 80 GiB (81920 MiB) GPU: ⌈1000·20480/81920⌉ = 250 milli;
    # pending, against the largest GPU in the cluster (the same 81920 MiB) → 250 as well.
    # HAMi gpumem 40960 with gpucores 60 on the same GPU: max(600, ⌈1000·40960/81920⌉ = 500) = 600.
    parts = ClusterParts()
    parts.add(k.node("n1", 8, gpu_memory_mib=81920), "n1")
    parts.add(_pod(annotations={"gpu-memory": "20480"}), "p")
    hami = _pod({"nvidia.com/gpu": "1", "nvidia.com/gpumem": "40960", "nvidia.com/gpucores": "60"})
    hami["metadata"]["name"] = "h"
    hami["spec"]["nodeName"] = "n1"
    parts.add(hami, "h")
    cluster = parts.build()
    assert cluster.pods["ml/p"].gpu_milli == 250
    assert cluster.pods["ml/h"].gpu_milli == 600
    assert cluster.warnings == ()


def test_bound_kai_fraction_is_held_by_its_reservation_pod() -> None:
    # KAI backs fractions with a reservation pod asking a whole nvidia.com/gpu in
    # kai-resource-reservation; charging the bound fraction too would count that GPU twice.
    parts = ClusterParts()
    parts.add(k.node("n1", 1), "n1")
    reservation = k.pod("gpu-reservation-n1-x7k2p", "kai-resource-reservation", 1, node_name="n1")
    parts.add(reservation, "r")
    parts.add(_pod(annotations={"gpu-fraction": "0.5"}, bound=True), "p")
    cluster = parts.build()
    assert cluster.pods["ml/p"].num_gpu == 0
    held = cluster.pods["kai-resource-reservation/gpu-reservation-n1-x7k2p"]
    assert held.num_gpu == 1 and held.annotations["defrag.io/evictable"] == "false"
    assert int(cluster.arrays.free_whole_count()[0]) == 0


@pytest.mark.parametrize(
    ("labels", "annotations", "gang"),
    [
        # Volcano vcjob pods: label volcano.sh/job-name and the PodGroup annotation
        # (volcano pkg/controllers/job/job_controller_util.go createJobPod)
        ({}, {"scheduling.k8s.io/group-name": "mnist-2f1b"}, "mnist-2f1b"),
        # Kueue plain-pod groups (kueue site/static/examples/pods-kueue/kueue-pod-group.yaml)
        ({"kueue.x-k8s.io/pod-group-name": "sample-group"},
         {"kueue.x-k8s.io/pod-group-total-count": "2"}, "sample-group"),
        # KAI-Scheduler's pod grouper (pkg/podgrouper/pod_controller.go)
        ({}, {"pod-group-name": "pg-trainer-7c1e"}, "pg-trainer-7c1e"),
        ({"volcano.sh/job-name": "mnist"}, {"scheduling.k8s.io/group-name": "mnist-2f1b"},
         "mnist"),
    ],
)  # fmt: skip
def test_gangs_of_batch_schedulers(
    labels: dict[str, str], annotations: dict[str, str], gang: str
) -> None:
    obj = k.pod("w-0", "ml", 1, labels=labels, annotations=annotations, owner=None)
    pod, _ = pod_from_json(obj)
    assert pod.gang == gang and pod.gang_key == f"ml/{gang}"


def test_priority_from_kai_label_through_priority_classes() -> None:
    # KAI-Scheduler docs/priority/: label priorityClassName: train (PriorityClass value 50)
    parts = ClusterParts()
    parts.add(k.priority_class("train", 50), "pc")
    obj = k.pod("w", "ml", 1, labels={"priorityClassName": "train"}, priority=None)
    parts.add(obj, "w")
    pod = parts.build().pods["ml/w"]
    assert (pod.priority_class, pod.priority) == ("train", 50)


def test_gated_pod_reads_its_gates() -> None:
    # Kueue's webhook adds the gate (pkg/controller/jobs/pod/constants); the API server sets
    # PodScheduled=False reason SchedulingGated (k8s pkg/registry/core/pod/strategy.go).
    obj = k.pod("w", "ml", 1, pending_reason="SchedulingGated")
    obj["spec"]["schedulingGates"] = [{"name": "kueue.x-k8s.io/admission"}]
    pod, _ = pod_from_json(obj)
    assert pod.scheduling_gates == ("kueue.x-k8s.io/admission",) and pod.is_gated and pod.gated
    assert pod.pending_reason == "SchedulingGated"
