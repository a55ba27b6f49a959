"""One object never harms the rest (issue 15, item 1), on the live path.

Before: any user who could create a pod could stop defrag cluster-wide — a pod annotated
``defrag.io/gpu-milli: "half"`` failed every snapshot (every daemon cycle failed, every extender
replica went not-ready); ``defrag.io/gpu-indices: "0-20000000"`` built a 20-million element list
on each relist; ``defrag.io/nvlink-domains: "0-999999999"`` cost 32 s of CPU; a pod asking −4
GPUs made full nodes look free. Each case below failed then (an exception out of ``snapshot()``,
or the negative request accepted); now the object is left out with a warning naming it and the
field, and everything else is read.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from defrag.adapters.kube import KubeClusterSource, RetryPolicy
from defrag.extender.state import ClusterCache
from defrag.scoring.profile import ProfileConfig
from tests.support import kubeobjects as k
from tests.support.kubeapi import KubeApi, running

FAST = RetryPolicy(attempts=1, backoff_s=0.0, timeout_s=5.0)


def _pod(annotations: dict[str, str] | None = None, gpus: str = "1") -> dict[str, Any]:
    obj = k.pod("hostile", "tenant", 1, node_name="gpu-1", annotations=annotations)
    obj["spec"]["containers"][0]["resources"]["requests"]["nvidia.com/gpu"] = gpus
    obj["spec"]["containers"][0]["resources"]["limits"]["nvidia.com/gpu"] = gpus
    return obj


def _node(nvlink: str) -> dict[str, Any]:
    return k.node("gpu-2", 8, nvlink=nvlink)


CASES = [
    (_pod({"defrag.io/gpu-milli": "half"}),
     'Pod tenant/hostile: metadata.annotations["defrag.io/gpu-milli"]'),
    (_pod({"defrag.io/gpu-indices": "0-20000000"}), "GPU indices stop at 1023"),
    (_node("0-999999999"), 'Node gpu-2: metadata.annotations["defrag.io/nvlink-domains"]'),
    (_pod(gpus="-4"), "negative quantity"),
]  # fmt: skip


@pytest.fixture(params=range(len(CASES)), ids=["gpu-milli", "gpu-indices", "nvlink", "negative"])
def case(request: pytest.FixtureRequest) -> Iterator[tuple[KubeApi, str]]:
    obj, said = CASES[request.param]
    objects = [k.node("gpu-1", 8), k.pod("train", "ml", 4, node_name="gpu-1"), obj]
    for api in running(objects):
        yield api, said


def test_one_hostile_object_is_left_out_and_the_rest_is_read(case: tuple[KubeApi, str]) -> None:
    api, said = case
    source = KubeClusterSource(api.client(), retry=FAST)
    cluster = source.snapshot()
    assert "ml/train" in cluster.pods and "gpu-1" in {n.name for n in cluster.nodes}
    assert "tenant/hostile" not in cluster.pods
    (warning,) = cluster.warnings
    assert said in warning
    # the extender stays ready on the same API
    cache = ClusterCache(source, ProfileConfig())
    assert cache.refresh().ok and cache.readiness().ok
    # gpu-1 holds 4 GPUs of ml/train: never read as more free than that (a −4 request would)
    free = int(cluster.arrays.free_whole_count()[cluster.arrays.index["gpu-1"]])
    assert free == 4
