"""The live path survives every GPU shape and one unreadable object (issue 12, issue 15 item 1).

The emulated API server serves nodes and pods shaped as the device plugin, GPU Feature
Discovery, HAMi and DRA write them (facts cited in tests/test_gpu_shapes.py), plus a pod with
an unreadable ``defrag.io/gpu-milli`` (any user can create one). A daemon cycle through the real
``kubernetes`` client completes, says each object once, and the extender stays ready.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest

from defrag.adapters.kube import KubeClusterSource, RetryPolicy
from defrag.cli.run import _detector, _planner, default_rules_dir
from defrag.daemon.cycle import CyclePorts, run_cycle
from defrag.daemon.service import DaemonMetrics
from defrag.daemon.unmodelled import UnmodelledReporter
from defrag.decide import CycleConfig
from defrag.execute.mode import RunMode
from defrag.extender.state import ClusterCache
from defrag.rules import load_rules
from defrag.scoring.profile import ProfileConfig
from defrag.settings import load_settings
from tests.support import kubeobjects as k
from tests.support.kubeapi import KubeApi, running
from tests.test_cycle import RecordingSink

FAST = RetryPolicy(attempts=1, backoff_s=0.0, timeout_s=5.0)


def _with(obj: dict[str, Any], allocatable: dict[str, str], **meta: dict[str, str]) -> Any:
    obj["status"]["allocatable"].update(allocatable)
    obj["status"]["capacity"] = dict(obj["status"]["allocatable"])
    for key, values in meta.items():
        obj["metadata"].setdefault(key, {}).update(values)
    return obj


def objects() -> list[dict[str, Any]]:
    timesliced = _with(
        k.node("ts-1", 16, product="Tesla-T4-SHARED"),
        {},
        labels={"nvidia.com/gpu.count": "4", "nvidia.com/gpu.replicas": "4"},
    )
    mig = _with(
        k.node("mig-1", 0),
        {"nvidia.com/mig-1g.10gb": "7"},
        labels={"nvidia.com/mig.strategy": "mixed"},
    )
    hami = _with(
        k.node("hami-1", 20),
        {},
        annotations={
            "hami.io/node-nvidia-register": json.dumps(
                [{"id": f"GPU-{i}", "count": 10, "devmem": 81920, "devcore": 100} for i in (0, 1)]
            )
        },
    )
    amd = _with(k.node("amd-1", 0), {"amd.com/gpu": "8"})
    dra = k.pod("dra", "ml")
    dra["spec"]["resourceClaims"] = [{"name": "gpu", "resourceClaimTemplateName": "one-gpu"}]
    bad = k.pod("bad", "ml", 1, node_name="hami-1", annotations={"defrag.io/gpu-milli": "half"})
    mig_pod = k.pod("slice", "ml", node_name="mig-1")
    mig_pod["spec"]["containers"][0]["resources"]["requests"]["nvidia.com/mig-1g.10gb"] = "1"
    return [k.node("a100-1", 8), timesliced, mig, hami, amd, dra, bad, mig_pod,
            k.pod("train", "ml", 8, node_name="a100-1")]  # fmt: skip


@pytest.fixture
def api() -> Iterator[KubeApi]:
    yield from running(objects())


def test_a_daemon_cycle_and_the_extender_survive_every_shape(api: KubeApi) -> None:
    source = KubeClusterSource(api.client(), retry=FAST)
    cluster = source.snapshot()
    # whole GPUs only on a100-1 (8) and hami-1 (2 physical behind 20 split units)
    assert {n.name: n.num_gpu for n in cluster.nodes} == {
        "a100-1": 8, "amd-1": 0, "hami-1": 2, "mig-1": 0, "ts-1": 0,
    }  # fmt: skip
    assert cluster.node("ts-1").pools == {"nvidia.com/gpu": 16}
    assert "ml/slice" in cluster.pods and "ml/dra" not in cluster.pods
    said = sorted(w.split(":")[0] for w in cluster.warnings)
    assert said == ["Node amd-1", "Pod ml/bad", "Pod ml/dra"]

    rules = load_rules([default_rules_dir()])
    settings = load_settings(None, {})
    sink = RecordingSink()
    ports = CyclePorts(source, _clock(), _detector(rules, None), _planner(settings), None, sink)
    result = run_cycle(ports, CycleConfig())
    assert sorted(w.split(":")[0] for w in result.warnings) == said
    metrics = DaemonMetrics()
    metrics.record(result, 0.1)
    assert metrics.unmodelled._value.get() == 3  # type: ignore[attr-defined]
    assert api.writes() == []  # dry run: nothing written

    cache = ClusterCache(source, ProfileConfig())
    assert cache.refresh().ok and cache.readiness().ok


def _clock() -> Any:
    from defrag.adapters.simcluster import SimClock

    return SimClock(speedup=0)


def test_the_leader_puts_one_warning_event_on_each_object_it_cannot_model(api: KubeApi) -> None:
    from tests.test_execute_kube import executor

    rules = load_rules([default_rules_dir()])

    def ports(mode: RunMode) -> CyclePorts:
        ex = executor(api, mode=mode)
        detector, planner = _detector(rules, None), _planner(load_settings(None, {}))
        reporter = UnmodelledReporter(ex.actuator, mode)
        return CyclePorts(ex.source, _clock(), detector, planner, ex, unmodelled=reporter)

    run_cycle(ports(RunMode()), CycleConfig())  # dry run: no Event (nothing written)
    assert api.writes() == []
    live = ports(RunMode.live())
    run_cycle(live, CycleConfig())  # no window open: only the Events are written
    events = [o for o in api.objects("Event") if o["reason"] == "DefragNotModelled"]
    on = sorted(
        f"{e['involvedObject']['kind']} {e['involvedObject'].get('namespace', '')}/"
        f"{e['involvedObject']['name']}"
        for e in events
    )
    assert on == ["Node /amd-1", "Pod ml/bad", "Pod ml/dra"]
    assert all(e["type"] == "Warning" for e in events)
    run_cycle(live, CycleConfig())  # said once while it lasts
    assert len([o for o in api.objects("Event") if o["reason"] == "DefragNotModelled"]) == 3
