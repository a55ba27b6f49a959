"""The pod shape cache of ``adapters/kube_convert`` keys a pod by what its shape is made of, so
the pods of one template share one entry however the API server decorated each of them.

The pods here are shaped as the API server returns a ReplicaSet's pods: the ServiceAccount
admission plugin (kubernetes plugin/pkg/admission/serviceaccount/admission.go,
``ServiceAccountVolumeName = "kube-api-access"`` and ``DefaultAPITokenMountPath``) adds to each
pod a projected volume named ``kube-api-access-`` plus five random characters and mounts it into
every container, so the containers of two pods of one template differ by that name.
"""

from __future__ import annotations

import copy
from typing import Any

import pytest

from defrag.adapters import kube_convert
from defrag.adapters.kube_convert import pod_from_json

MOUNT = "/var/run/secrets/kubernetes.io/serviceaccount"


def _pod(name: str, token_volume: str, gpus: str = "2", cpu: str = "4") -> dict[str, Any]:
    mount = {"name": token_volume, "readOnly": True, "mountPath": MOUNT}
    container = {
        "name": "trainer",
        "image": "registry.example/trainer:1.0",
        "resources": {
            "limits": {"nvidia.com/gpu": gpus},
            "requests": {"cpu": cpu, "memory": "16Gi", "nvidia.com/gpu": gpus},
        },
        "volumeMounts": [mount],
        "terminationMessagePath": "/dev/termination-log",
        "terminationMessagePolicy": "File",
        "imagePullPolicy": "IfNotPresent",
    }
    sidecar = {
        "name": "log-shipper",
        "image": "registry.example/shipper:2",
        "restartPolicy": "Always",
        "resources": {"requests": {"cpu": "100m", "memory": "64Mi"}},
        "volumeMounts": [dict(mount)],
    }
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": name,
            "namespace": "ml",
            "uid": f"uid-{name}",
            "labels": {"app": "trainer", "pod-template-hash": "7d9f8c6b5"},
            "ownerReferences": [
                {
                    "apiVersion": "apps/v1",
                    "kind": "ReplicaSet",
                    "name": "trainer-7d9f8c6b5",
                    "uid": "rs-uid",
                    "controller": True,
                    "blockOwnerDeletion": True,
                }
            ],
        },
        "spec": {
            "containers": [container],
            "initContainers": [sidecar],
            "volumes": [
                {
                    "name": token_volume,
                    "projected": {
                        "defaultMode": 420,
                        "sources": [
                            {"serviceAccountToken": {"expirationSeconds": 3607, "path": "token"}}
                        ],
                    },
                }
            ],
            "tolerations": [
                {
                    "key": "node.kubernetes.io/not-ready",
                    "operator": "Exists",
                    "effect": "NoExecute",
                    "tolerationSeconds": 300,
                }
            ],
            "serviceAccountName": "default",
            "schedulerName": "default-scheduler",
        },
        "status": {"phase": "Pending", "qosClass": "Burstable"},
    }


@pytest.fixture(autouse=True)
def empty_cache() -> None:
    kube_convert._shapes.clear()


def test_pods_of_one_template_share_one_cached_shape() -> None:
    pods = [_pod(f"trainer-7d9f8c6b5-{s}", f"kube-api-access-{s}") for s in ("x2k9q", "b7mzt")]
    first, _ = pod_from_json(pods[0])
    second, _ = pod_from_json(pods[1])
    assert len(kube_convert._shapes) == 1
    assert (first.num_gpu, first.cpu_milli) == (2, 4100)  # the sidecar's request counts
    assert (second.num_gpu, second.cpu_milli, second.tolerations) == (
        first.num_gpu,
        first.cpu_milli,
        first.tolerations,
    )


def test_what_the_shape_reads_still_tells_pods_apart() -> None:
    base = _pod("a", "kube-api-access-aaaaa")
    more_gpus = _pod("b", "kube-api-access-bbbbb", gpus="4")
    more_cpu = _pod("c", "kube-api-access-ccccc", cpu="8")
    not_a_sidecar = copy.deepcopy(base)
    del not_a_sidecar["spec"]["initContainers"][0]["restartPolicy"]
    got = [pod_from_json(p)[0] for p in (base, more_gpus, more_cpu, not_a_sidecar)]
    assert len(kube_convert._shapes) == 4
    assert [(p.num_gpu, p.cpu_milli) for p in got] == [(2, 4100), (4, 4100), (2, 8100), (2, 4000)]
