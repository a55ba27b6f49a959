"""ExtenderArgs bodies as kube-scheduler sends them, for sizing and loading the extender.

A ``Nodes``-mode request (extender not ``nodeCacheCapable``) carries every candidate v1 Node in
full, as the scheduler's informer holds it. Besides the metadata, capacity and conditions
(``tests.support.kubeobjects.node``), a real node's status lists the images on it: the kubelet
reports at most ``nodeStatusMaxImages`` of them, 50 by default (KubeletConfiguration defaults,
``pkg/kubelet/apis/config``), each a ``ContainerImage`` ``{names: [digest, tag], sizeBytes}``
(``core/v1`` types.go). Those images are most of the bytes of a GPU node (CUDA images).
"""

from __future__ import annotations

import hashlib
import json
from typing import Any

from tests.support import kubeobjects as k

MAX_IMAGES = 50
"""KubeletConfiguration ``nodeStatusMaxImages`` default."""


def images(i: int, n: int = MAX_IMAGES) -> list[dict[str, Any]]:
    out = []
    for j in range(n):
        repo = f"nvcr.io/nvidia/team-{j % 7}/workload-{(i + j) % 40}"
        digest = hashlib.sha256(f"{i}/{j}".encode()).hexdigest()
        out.append(
            {
                "names": [f"{repo}@sha256:{digest}", f"{repo}:24.{j % 12:02d}-py3"],
                "sizeBytes": 9_000_000_000 + j * 1_000_003,
            }
        )
    return out


def node_object(i: int, with_images: bool = True) -> dict[str, Any]:
    node = k.node(f"gpu-{i:05d}")
    if with_images:
        node["status"]["images"] = images(i)
    return node


def pod_object(gpus: int = 1) -> dict[str, Any]:
    return k.pod("trainer-0", "ml", gpus, owner=("Job", "trainer"))


def nodes_body(n: int, with_images: bool = True, gpus: int = 1) -> bytes:
    """A ``Nodes``-mode ExtenderArgs for ``n`` nodes, as Go's json.Marshal writes it."""
    args = {
        "Pod": pod_object(gpus),
        "Nodes": {"metadata": {}, "items": [node_object(i, with_images) for i in range(n)]},
        "NodeNames": None,
    }
    return json.dumps(args, separators=(",", ":")).encode()


def names_body(names: list[str], gpus: int = 1) -> bytes:
    """A ``NodeNames``-mode (nodeCacheCapable) ExtenderArgs."""
    args = {"Pod": pod_object(gpus), "Nodes": None, "NodeNames": names}
    return json.dumps(args, separators=(",", ":")).encode()


if __name__ == "__main__":
    for n in (1000, 5000):
        for imgs in (False, True):
            size = len(nodes_body(n, imgs))
            print(f"Nodes mode, {n} nodes, images={imgs}: {size:,} bytes ({size / 2**20:.1f} MiB)")
    size = len(names_body([f"gpu-{i:05d}" for i in range(5000)]))
    print(f"NodeNames mode, 5000 nodes: {size:,} bytes")
