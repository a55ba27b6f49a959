"""The daemon's cluster kept by list + watch (against the emulated API server, the real client's
watch code running): built once per change, not per cycle; a change seen without a relist; a
watch down longer than the bound makes the cycle fail saying so, with nothing planned; the
executor reads the store while every watch is up and lists the API while one is down."""

from __future__ import annotations

import time
from collections.abc import Iterator
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest
from prometheus_client import REGISTRY

from defrag.adapters.kube import KubeClusterSource, KubeUnscheduledPods
from defrag.adapters.watched_cluster import StaleCluster, WatchedCluster, WatchedOrListed
from defrag.daemon.cycle import CyclePorts, SystemClock, run_cycle
from defrag.decide import CycleConfig
from defrag.execute.circuit import pending_of
from defrag.model.cluster import Cluster
from defrag.plan import make_plan
from defrag.plan.model import Plan
from defrag.scoring.profile import ScoringProfile
from tests.support.kubeapi import KubeApi, running
from tests.test_extender import v1_pod
from tests.test_extender_watch import (
    FAST,
    NODES,
    cluster_items,
    lists,
    watch_source,
    watches,
    within,
)


@pytest.fixture
def api() -> Iterator[KubeApi]:
    yield from running(cluster_items())


@pytest.fixture
def watched(api: KubeApi) -> Iterator[WatchedCluster]:
    view = WatchedCluster(watch_source(api), max_staleness_s=0.3)
    yield view
    view.stop()


def test_an_unchanged_store_is_built_once(api: KubeApi, watched: WatchedCluster) -> None:
    first = watched.snapshot()
    second = watched.snapshot()
    assert second is first  # nothing changed: the same frozen cluster, no second build
    assert watched.builds == 1
    assert sorted(first.arrays.names) == ["node-1", "node-2", "node-3"]
    assert lists(api) == 1


def test_a_change_is_seen_without_a_relist(api: KubeApi, watched: WatchedCluster) -> None:
    before = watched.snapshot()
    assert before.node("node-2").taints  # drained: tainted
    untaint(api, "node-2")
    within(2.0, lambda: not watched.snapshot().node("node-2").taints, "the untainted node")
    assert watched.builds == 2  # one build per change, however many snapshots were asked
    assert lists(api) == 1  # by the watch, not a relist


def test_a_terminating_pod_is_seen_terminating(api: KubeApi, watched: WatchedCluster) -> None:
    # Before: the store trimmed metadata.deletionTimestamp away, so the daemon's planner took a
    # pod already going for a victim again (tests/e2e/test_daemon_makeroom.py caught it).
    assert watched.snapshot().pods["default/seven"].deleting_since is None
    start_terminating(api, "default", "seven")

    def terminating() -> bool:
        return watched.snapshot().pods["default/seven"].deleting_since is not None

    within(2.0, terminating, "the pod seen terminating")


def test_a_watch_down_past_the_bound_is_refused(api: KubeApi, watched: WatchedCluster) -> None:
    watched.snapshot()
    break_node_watch(api, watched)
    time.sleep(0.4)  # past max_staleness_s (0.3 s)
    with pytest.raises(
        StaleCluster, match=r"stale: a watch has been down .*watching Nodes: HTTP 503"
    ):
        watched.snapshot()


def break_node_watch(api: KubeApi, watched: WatchedCluster) -> None:
    """Drop the open node watch and refuse every reconnect, until the store says it is down."""
    within(2.0, lambda: len(watches(api)) >= 1, "the node watch open")
    api.fail("GET", f"^{NODES}$", status=503, times=10_000)
    api.drop_watches()

    def down() -> bool:
        return any("Nodes" in reason for reason in watched.watch.health().reasons)

    within(3.0, down, "the node watch down")


def test_a_stale_cycle_says_so_and_plans_nothing(api: KubeApi, watched: WatchedCluster) -> None:
    planned: list[Any] = []

    def planner(
        cluster: Cluster, goal: str, now: datetime, *, profile: ScoringProfile,
        pods: frozenset[str] | None = None, spent: object = None, history: object = None,
    ) -> Plan:  # fmt: skip
        planned.append(goal)
        return make_plan(cluster, goal, now=now, profile=profile)

    ports = CyclePorts(watched, SystemClock(), lambda c, now, p: [], planner)
    run_cycle(ports, CycleConfig(goal="repack"))  # fresh: it plans
    assert planned == ["repack"]
    planned.clear()
    break_node_watch(api, watched)
    time.sleep(0.4)
    with pytest.raises(StaleCluster, match="not planning on it"):
        run_cycle(ports, CycleConfig(goal="repack"))
    assert planned == []


def test_the_executor_reads_the_store_while_every_watch_is_up(
    api: KubeApi, watched: WatchedCluster
) -> None:
    lister = KubeClusterSource(api.client(), retry=FAST)
    view = WatchedOrListed(watched, lister)
    before = {source: reads(source) for source in ("store", "list")}
    # the first read starts the store: its list is the only one (the daemon's reconcile at
    # start reads here before any cycle has started the watches)
    first = view.snapshot()
    assert sorted(first.arrays.names) == ["node-1", "node-2", "node-3"]
    assert watched.started
    assert (view.listed, view.stored, lists(api)) == (0, 1, 1)
    assert view.snapshot() is first  # unchanged: the same cluster, no build and no list
    start_terminating(api, "default", "seven")

    def terminating() -> bool:
        return view.snapshot().pods["default/seven"].deleting_since is not None

    within(2.0, terminating, "the eviction seen through the store")
    assert view.listed == 0 and lists(api) == 1  # the store's own first list, none since
    assert reads("list") - before["list"] == 0
    assert reads("store") - before["store"] == view.stored


def reads(source: str) -> float:
    return (
        REGISTRY.get_sample_value("defrag_executor_cluster_reads_total", {"source": source}) or 0.0
    )


def test_a_store_down_within_its_bound_answers_late_and_no_list_is_made(
    api: KubeApi, watched: WatchedCluster
) -> None:
    watched.max_staleness_s = 30.0
    view = WatchedOrListed(watched, KubeClusterSource(api.client(), retry=FAST), max_wait_s=0.05)
    first = view.snapshot()
    listed = lists(api)
    drop_node_watch(api, watched)  # lists still answer
    untaint(api, "node-2")
    # the view waits 0.05 s for the watch, then answers what the store holds: late, not wrong
    assert view.snapshot() is first and first.node("node-2").taints
    assert (view.stored, view.listed, lists(api)) == (2, 0, listed)


def test_the_executor_lists_the_api_once_the_store_is_refused(
    api: KubeApi, watched: WatchedCluster
) -> None:
    view = WatchedOrListed(watched, KubeClusterSource(api.client(), retry=FAST), max_wait_s=0.05)
    view.snapshot()
    drop_node_watch(api, watched)  # lists still answer
    untaint(api, "node-2")
    time.sleep(0.4)  # down past the store's bound (0.3 s): the cycle would refuse it too
    with pytest.raises(StaleCluster):
        watched.snapshot()
    assert not view.snapshot().node("node-2").taints  # the executor's list sees the change
    assert view.listed == 1


def test_a_read_waits_for_a_dropped_watch_to_resume_instead_of_listing(
    api: KubeApi, watched: WatchedCluster
) -> None:
    # A dropped watch resumes from its resourceVersion within a moment and loses nothing: the
    # executor does not list the whole cluster for each drop (a chaos soak drops them often).
    view = WatchedOrListed(watched, KubeClusterSource(api.client(), retry=FAST), max_wait_s=10)
    view.snapshot()
    listed = lists(api)
    drop_node_watch(api, watched, refusals=5)  # five reconnects refused
    untaint(api, "node-2")
    view.snapshot()  # waits until the watch is back, and reads the store
    assert (view.stored, view.listed, lists(api)) == (2, 0, listed)
    # the change made while it was down arrives through the resumed watch, not a list
    within(2.0, lambda: not view.snapshot().node("node-2").taints, "the change seen")
    assert view.listed == 0 and lists(api) == listed


def test_a_drains_end_is_confirmed_on_the_unscheduled_pods_alone(api: KubeApi) -> None:
    pending = v1_pod("replacement", 8)  # no node: what a drain waits on
    pending["metadata"]["ownerReferences"] = [
        {"apiVersion": "apps/v1", "kind": "ReplicaSet", "name": "train", "controller": True,
         "uid": "u-train"}
    ]  # fmt: skip
    api.put(pending)
    cluster = KubeUnscheduledPods(api.client(), retry=FAST).snapshot()
    assert sorted(cluster.pods) == ["default/replacement"]  # the bound pods are not listed
    assert pending_of(cluster, ("default/ReplicaSet/train",)) == ("default/ReplicaSet/train",)
    listed = [r for r in api.requests if r.verb == "list"]
    assert [r.path for r in listed] == ["/api/v1/pods"]
    assert listed[0].query["fieldSelector"] == [
        "spec.nodeName=,status.phase!=Succeeded,status.phase!=Failed"
    ]


def test_the_daemon_plans_on_the_watch_and_evicts_on_fresh_reads(
    api: KubeApi, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from defrag.cli.run import build
    from defrag.settings import load_settings
    from tests.test_daemon_cli import kubeconfig

    settings = load_settings(None, {"cluster.kubeconfig": str(kubeconfig(tmp_path, api.url))})
    wiring = build(settings)
    ports = wiring.daemon.ports
    assert isinstance(ports.source, WatchedCluster)
    assert ports.executor is not None
    executor_view = ports.executor.source
    assert isinstance(executor_view, WatchedOrListed) and executor_view.watched is ports.source
    assert isinstance(executor_view.lister, KubeClusterSource)
    assert executor_view.max_wait_s == settings.execution.poll_interval_s
    assert isinstance(ports.executor.confirm, KubeUnscheduledPods)  # a drain's end, fresh
    assert ports.source.max_staleness_s == settings.daemon.ready_age_limit_s
    assert wiring.watching
    # `defrag run --once` lists once instead: no watch threads to outlive the one cycle.
    once = build(settings, watch=False)
    assert isinstance(once.daemon.ports.source, KubeClusterSource) and not once.watching
    assert once.daemon.ports.executor is not None
    assert once.daemon.ports.executor.confirm is None  # its reads are lists already


def drop_node_watch(api: KubeApi, watched: WatchedCluster, refusals: int = 10_000) -> None:
    """Cut the open node watch and refuse the next ``refusals`` watch requests (lists still
    answer), until the store says it is not current."""
    within(2.0, lambda: len(watches(api)) >= 1, "the node watch open")
    api.fail("GET", f"^{NODES}$", status=503, times=refusals, watch=True)
    api.drop_watches()
    within(3.0, lambda: not watched.watch.current(), "the node watch down")


def start_terminating(api: KubeApi, namespace: str, name: str) -> None:
    pod = api.get("Pod", name, namespace)
    assert pod is not None
    pod["metadata"]["deletionTimestamp"] = "2026-12-02T01:00:00Z"
    api.put(pod)


def untaint(api: KubeApi, name: str) -> None:
    node = api.get("Node", name)
    assert node is not None
    node["spec"]["taints"] = []
    api.put(node)
