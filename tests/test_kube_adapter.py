"""The Kubernetes adapter with the real client against the emulated API server."""

from __future__ import annotations

import json
import logging
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
import yaml

from defrag.adapters.kube import (
    KubeActuator,
    KubeClusterSource,
    KubeError,
    LeaseElector,
    RetryPolicy,
    connect,
    plural,
)
from defrag.adapters.snapshot import load_snapshot
from tests.support import kubeobjects as k
from tests.support.kubeapi import KubeApi, running
from tests.support.snapshots import FIXTURES, scattered_20

FAST = RetryPolicy(attempts=3, backoff_s=0.0, timeout_s=2.0)
DRAIN = "defrag.io/draining"


@pytest.fixture
def api() -> Iterator[KubeApi]:
    yield from running(scattered_20()["items"])


def actuator(api: KubeApi, **kwargs: object) -> KubeActuator:
    return KubeActuator(api.client(), retry=FAST, **kwargs)  # type: ignore[arg-type]


# --- snapshot ----------------------------------------------------------------------------------


def test_snapshot_pages_through_every_kind_and_matches_the_file(api: KubeApi) -> None:
    api.put(k.priority_class("training-high", 1000))
    live = KubeClusterSource(api.client(), page_size=4, retry=FAST).snapshot()
    from_file = load_snapshot(FIXTURES / "scattered_20.json")
    assert [n for n in live.nodes] == [n for n in from_file.nodes]
    assert sorted(live.pods) == sorted(from_file.pods)
    assert (live.arrays.gpu_free == from_file.arrays.gpu_free).all()
    assert [p.key for p in live.pdbs] == ["serving/serve"]
    assert dict(live.priority_classes) == {"training-high": 1000}
    # 14 nodes in pages of 4 → 4 requests; 37 pods → 10; each listing follows `continue`.
    node_lists = [r for r in api.requests if r.path == "/api/v1/nodes"]
    assert len(node_lists) == 4
    assert all(r.query["limit"] == ["4"] for r in node_lists)
    assert sum("continue" in r.query for r in node_lists) == 3
    assert len([r for r in api.requests if r.path == "/api/v1/pods"]) == 10
    assert not api.writes()


def test_snapshot_leaves_finished_pods_out(api: KubeApi) -> None:
    api.put(k.pod("done-0", "ml", 8, node_name="gpu-01", phase="Succeeded"))
    cluster = KubeClusterSource(api.client(), retry=FAST).snapshot()
    assert "ml/done-0" not in cluster.pods
    assert int(cluster.arrays.free_whole_count().sum()) == 20  # unchanged


def test_snapshot_restarts_a_listing_whose_continue_token_expired(api: KubeApi) -> None:
    api.fail("GET", r"^/api/v1/pods$", status=410, times=1)  # the first page: 410 Gone
    cluster = KubeClusterSource(api.client(), page_size=100, retry=FAST).snapshot()
    assert len(cluster.pods) == 37


def test_snapshot_retries_5xx_then_succeeds(api: KubeApi) -> None:
    api.fail("GET", r"^/api/v1/nodes$", status=503, times=2)
    cluster = KubeClusterSource(api.client(), retry=FAST).snapshot()
    assert len(cluster.nodes) == 14
    statuses = [r.status for r in api.requests if r.path == "/api/v1/nodes"]
    assert statuses == [503, 503, 200]


def test_snapshot_gives_up_after_the_retry_budget(api: KubeApi) -> None:
    api.fail("GET", r"^/api/v1/nodes$", status=500, times=10, message="etcd is down")
    with pytest.raises(KubeError, match=r"cannot list Nodes: HTTP 500: etcd is down"):
        KubeClusterSource(api.client(), retry=FAST).snapshot()
    assert len([r for r in api.requests if r.path == "/api/v1/nodes"]) == 3  # FAST: 3 attempts


def test_a_malformed_object_is_left_out_and_named(api: KubeApi) -> None:
    bad = k.node("gpu-99")
    bad["status"]["allocatable"]["nvidia.com/gpu"] = "eight"
    api.put(bad)
    cluster = KubeClusterSource(api.client(), retry=FAST).snapshot()
    assert "gpu-99" not in {n.name for n in cluster.nodes} and cluster.nodes
    (warning,) = cluster.warnings
    assert warning.startswith('Node gpu-99: status.allocatable["nvidia.com/gpu"]: ')


# --- evictions ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("pod", "budget", "faults", "outcome", "reason", "deleted"),
    [
        ("ml/batch-01-0-0", None, [], "evicted", "", True),
        ("serving/serve-7d9f-07", 0, [], "blocked", "violate the pod's disruption budget", False),
        ("serving/serve-7d9f-07", 1, [], "evicted", "", True),
        ("ml/ghost", None, [], "gone", "no longer exists", False),
        ("ml/batch-01-0-0", None, [(503, 2)], "evicted", "", True),
        ("ml/batch-01-0-0", None, [(503, 5)], "failed", "HTTP 503", False),
        ("ml/batch-01-0-0", None, [(429, 1)], "evicted", "", True),  # API throttling: retried
        ("ml/batch-01-0-0", None, [(403, 1)], "failed", "HTTP 403", False),
    ],
)
def test_eviction_outcomes(
    api: KubeApi,
    pod: str,
    budget: int | None,
    faults: list[tuple[int, int]],
    outcome: str,
    reason: str,
    deleted: bool,
) -> None:
    if budget is not None:
        api.put(
            k.pdb(
                "serve", "serving", match_labels={"app": "serve-7d9f"}, disruptions_allowed=budget
            )
        )
    for status, times in faults:
        api.fail("POST", r"/eviction$", status=status, times=times)
    ns, name = pod.split("/")
    result = actuator(api).evict(ns, name)
    assert (result.pod, result.outcome) == (pod, outcome)
    assert reason in result.reason
    assert (api.get("Pod", name, ns) is None) == (deleted or name == "ghost")
    evictions = [r for r in api.requests if r.resource == "pods/eviction"]
    assert evictions[-1].body["kind"] == "Eviction"
    assert evictions[-1].body["apiVersion"] == "policy/v1"
    if budget == 1:
        pdb = api.get("PodDisruptionBudget", "serve", "serving")
        assert pdb is not None and pdb["status"]["disruptionsAllowed"] == 0  # 1 - 1


def test_blocked_eviction_reports_the_budget_cause(api: KubeApi) -> None:
    result = actuator(api).evict("serving", "serve-7d9f-07")
    assert result.outcome == "blocked"
    assert "The disruption budget serve needs 1 healthy pods" in result.reason


def test_eviction_timeout_is_retried_then_fails(api: KubeApi) -> None:
    api.fail("POST", r"/eviction$", status=0, delay_s=0.6, times=5)
    act = KubeActuator(api.client(), retry=RetryPolicy(attempts=2, backoff_s=0, timeout_s=0.2))
    result = act.evict("ml", "batch-01-0-0")
    assert result.outcome == "failed"
    assert "did not answer within 0.2 s (the whole request)" in result.reason


def test_a_rehearsed_eviction_is_a_server_side_dry_run_and_changes_nothing(api: KubeApi) -> None:
    result = actuator(api).rehearse_eviction("ml", "batch-01-0-0")
    assert result.outcome == "evicted" and result.reason == "server dry run"
    (request,) = [r for r in api.requests if r.resource == "pods/eviction"]
    assert request.query["dryRun"] == ["All"]
    assert api.get("Pod", "batch-01-0-0", "ml") is not None
    blocked = actuator(api).rehearse_eviction("serving", "serve-7d9f-07")
    assert blocked.outcome == "blocked"  # the server still checks the PDB


def test_client_side_dry_run_sends_no_write(api: KubeApi) -> None:
    act = actuator(api, send_writes=False)
    assert act.evict("ml", "batch-01-0-0").outcome == "evicted"
    act.taint_node("gpu-01", DRAIN, "p1", "NoSchedule")
    act.annotate_node("gpu-01", {"defrag.io/plan": "p1"})
    act.untaint_node("gpu-01", DRAIN)
    act.event("Pod", "ml", "batch-01-0-0", "Planned", "would move")
    assert api.writes() == []
    assert [i.action for i in act.intents] == [
        "evict",
        f"taint {DRAIN}=p1:NoSchedule",
        "annotate",
        f"untaint {DRAIN}",
        "event",
    ]


# --- nodes ---------------------------------------------------------------------------------


def _taints(api: KubeApi, node: str) -> list[dict[str, str]]:
    obj = api.get("Node", node)
    assert obj is not None
    return list(obj["spec"].get("taints") or [])


def test_taint_and_untaint_keep_other_taints_and_are_idempotent(api: KubeApi) -> None:
    other = {"key": "nvidia.com/gpu", "value": "present", "effect": "NoSchedule"}
    node = k.node("gpu-01", taints=[other])
    api.put(node)
    act = actuator(api)
    act.taint_node("gpu-01", DRAIN, "p1", "NoSchedule")
    assert _taints(api, "gpu-01") == [other, {"key": DRAIN, "value": "p1", "effect": "NoSchedule"}]
    act.taint_node("gpu-01", DRAIN, "p1", "NoSchedule")  # already there: no second patch
    act.taint_node("gpu-01", DRAIN, "p2", "NoSchedule")  # a new plan id replaces the value
    assert _taints(api, "gpu-01")[1]["value"] == "p2"
    act.untaint_node("gpu-01", DRAIN)
    act.untaint_node("gpu-01", DRAIN)  # nothing to remove: no patch
    assert _taints(api, "gpu-01") == [other]
    patches = [r for r in api.requests if r.method == "PATCH"]
    assert len(patches) == 3  # taint p1, retaint p2, untaint
    assert all(r.content_type == "application/strategic-merge-patch+json" for r in patches)
    assert all("resourceVersion" in r.body["metadata"] for r in patches)


def test_taint_retries_when_the_node_changed_meanwhile(api: KubeApi) -> None:
    api.fail("PATCH", r"^/api/v1/nodes/gpu-02$", status=409, times=1)
    actuator(api).taint_node("gpu-02", DRAIN, "p1", "NoSchedule")
    assert _taints(api, "gpu-02") == [{"key": DRAIN, "value": "p1", "effect": "NoSchedule"}]
    gets = [r for r in api.requests if r.method == "GET" and r.path == "/api/v1/nodes/gpu-02"]
    assert len(gets) == 2  # read again after the conflict


def test_taint_of_a_missing_node_is_an_error(api: KubeApi) -> None:
    with pytest.raises(
        KubeError, match=r'cannot read node ghost: HTTP 404: nodes "ghost" not found'
    ):
        actuator(api).taint_node("ghost", DRAIN, "p1", "NoSchedule")


def test_annotations_set_and_remove(api: KubeApi) -> None:
    act = actuator(api)
    act.annotate_node("gpu-03", {"defrag.io/plan": "p1", "defrag.io/started": "2026-11-29T12:00Z"})
    act.annotate_node("gpu-03", {"defrag.io/started": None})
    obj = api.get("Node", "gpu-03")
    assert obj is not None
    assert obj["metadata"]["annotations"] == {
        "node.alpha.kubernetes.io/ttl": "0",
        "defrag.io/plan": "p1",
    }


# --- events ----------------------------------------------------------------------------------


def test_events_on_pods_and_nodes(api: KubeApi) -> None:
    act = actuator(api, instance="defrag-0")
    act.event("Pod", "ml", "batch-01-0-0", "DefragEvicted", "moved to gpu-07")
    act.event("Node", "", "gpu-01", "DefragBlocked", "PDB serve", warning=True)
    events = {e["involvedObject"]["kind"]: e for e in api.objects("Event")}
    pod_event, node_event = events["Pod"], events["Node"]
    assert pod_event["metadata"]["namespace"] == "ml"
    assert pod_event["involvedObject"] == {
        "kind": "Pod",
        "name": "batch-01-0-0",
        "namespace": "ml",
        "apiVersion": "v1",
    }
    assert (pod_event["reason"], pod_event["type"]) == ("DefragEvicted", "Normal")
    assert node_event["metadata"]["namespace"] == "default"  # the API server takes no other
    assert "namespace" not in node_event["involvedObject"]
    assert node_event["involvedObject"]["kind"] == "Node"
    assert node_event["type"] == "Warning"
    assert node_event["source"] == {"component": "defrag", "host": "defrag-0"}


@pytest.mark.parametrize(
    ("namespace", "involved", "code"),
    [
        ("default", None, 201),  # a Node's Event: default is the one namespace allowed
        ("defrag-system", None, 422),  # what defrag used to send for nodes
        ("ml", "ml", 201),  # a Pod's Event in the pod's namespace
        ("defrag-system", "ml", 422),
    ],
)
def test_the_emulator_validates_event_namespaces_as_the_api_server(
    api: KubeApi, namespace: str, involved: str | None, code: int
) -> None:
    """core/v1 Event validation (kubernetes pkg/apis/core/validation/events.go, an Event
    without eventTime): about a cluster-scoped object only in ``default``, about a namespaced
    one only in its namespace; else 422 Invalid naming ``involvedObject.namespace``."""
    from kubernetes import client
    from kubernetes.client.exceptions import ApiException

    obj: dict[str, str] = {"kind": "Pod" if involved else "Node", "name": "x"}
    if involved:
        obj["namespace"] = involved
    body = {"metadata": {"name": "x.1", "namespace": namespace}, "involvedObject": obj}
    core = client.CoreV1Api(api.client())
    if code == 201:
        core.create_namespaced_event(namespace, body, _preload_content=False)
        assert [e["metadata"]["namespace"] for e in api.objects("Event")] == [namespace]
        return
    with pytest.raises(ApiException) as info:
        core.create_namespaced_event(namespace, body, _preload_content=False)
    status = json.loads(info.value.body)
    assert (info.value.status, status["kind"], status["reason"]) == (422, "Status", "Invalid")
    shown = involved or ""
    assert status["message"] == (
        f'Event "x.1" is invalid: involvedObject.namespace: Invalid value: "{shown}": '
        "does not match event.namespace"
    )
    assert status["details"]["causes"][0]["field"] == "involvedObject.namespace"
    assert api.objects("Event") == []


def test_event_failure_is_logged_not_raised(api: KubeApi, caplog: pytest.LogCaptureFixture) -> None:
    api.fail("POST", r"/events$", status=500, times=10)
    with caplog.at_level(logging.WARNING, logger="defrag.adapters.kube"):
        actuator(api).event("Pod", "ml", "x", "R", "m")  # no exception
    # sent as often as the retry policy allows, then given up with one warning
    posts = [r for r in api.requests if r.method == "POST" and r.path.endswith("/events")]
    assert len(posts) == FAST.attempts
    warned = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warned) == 1 and warned[0].startswith("cannot record event R on Pod x: "), warned
    assert api.objects("Event") == []


# --- leader election -------------------------------------------------------------------------


@dataclass
class FakeClock:
    t: datetime = field(default_factory=lambda: datetime(2026, 11, 29, 12, 0, tzinfo=UTC))

    def now(self) -> datetime:
        return self.t


def elector(api: KubeApi, who: str, clock: FakeClock) -> LeaseElector:
    return LeaseElector(
        api.client(),
        "defrag-system",
        "defrag",
        identity=who,
        lease_duration_s=15,
        clock=clock,
        retry=FAST,
    )


def test_one_leader_renewal_expiry_takeover_and_release(api: KubeApi) -> None:
    clock = FakeClock()
    a, b = elector(api, "a", clock), elector(api, "b", clock)
    assert a.is_leader() and not b.is_leader()
    assert b.last.holder == "a"
    clock.t += timedelta(seconds=10)
    assert a.is_leader() and not b.is_leader()  # a renewed at +10 s; b sees it held
    clock.t += timedelta(seconds=14)  # +24 s: a's renewal (+10 s) has 1 s left
    assert not b.is_leader()
    clock.t += timedelta(seconds=2)  # +26 s > 10 + 15: expired; b takes over
    status = b.tick()
    assert status.leader and status.reason == "took over the Lease from a"
    assert not a.is_leader()
    lease = api.get("Lease", "defrag", "defrag-system")
    assert lease is not None
    assert lease["spec"]["holderIdentity"] == "b"
    assert lease["spec"]["leaseTransitions"] == 1
    with b:
        pass  # leaving the block releases the Lease
    assert a.is_leader()  # free at once, no need to wait for expiry
    assert a.last.reason == "acquired a free Lease"


def test_a_lost_race_makes_a_follower(api: KubeApi) -> None:
    clock = FakeClock()
    a = elector(api, "a", clock)
    assert a.is_leader()
    clock.t += timedelta(seconds=60)
    api.fail("PUT", r"/leases/defrag$", status=409, times=1)  # someone else wrote first
    b = elector(api, "b", clock)
    assert not b.is_leader()
    assert "409" in b.last.reason


def test_creating_the_lease_twice_makes_one_leader(api: KubeApi) -> None:
    clock = FakeClock()
    a, b = elector(api, "a", clock), elector(api, "b", clock)
    assert a.is_leader()
    api.fail("GET", r"/leases/defrag$", status=404, times=1)  # b read before a's create landed
    assert not b.is_leader()
    assert b.last.reason == "another candidate created the Lease first"


def test_api_failure_makes_a_follower_without_raising(api: KubeApi) -> None:
    api.fail("GET", r"/leases/", status=503, times=10)
    a = elector(api, "a", FakeClock())
    assert not a.is_leader()
    assert "503" in a.last.reason


# --- connection ------------------------------------------------------------------------------


def test_connect_with_a_kubeconfig(api: KubeApi, tmp_path: Path) -> None:
    kubeconfig = tmp_path / "config"
    kubeconfig.write_text(
        yaml.safe_dump(
            {
                "apiVersion": "v1",
                "kind": "Config",
                "clusters": [{"name": "emu", "cluster": {"server": api.url}}],
                "users": [{"name": "u", "user": {"token": "t0ken"}}],
                "contexts": [{"name": "emu", "context": {"cluster": "emu", "user": "u"}}],
                "current-context": "emu",
            }
        )
    )
    cluster = KubeClusterSource(connect(str(kubeconfig)), retry=FAST).snapshot()
    assert len(cluster.nodes) == 14


def test_connect_in_cluster_uses_the_service_account(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from kubernetes.config import incluster_config

    token, ca = tmp_path / "token", tmp_path / "ca.crt"
    token.write_text("sa-token")
    ca.write_text("-----BEGIN CERTIFICATE-----\n")
    monkeypatch.setattr(incluster_config, "SERVICE_TOKEN_FILENAME", str(token))
    monkeypatch.setattr(incluster_config, "SERVICE_CERT_FILENAME", str(ca))
    monkeypatch.setenv("KUBERNETES_SERVICE_HOST", "10.96.0.1")
    monkeypatch.setenv("KUBERNETES_SERVICE_PORT", "443")
    api = connect()  # no kubeconfig, in a pod: the service account
    assert api.configuration.host == "https://10.96.0.1:443"
    assert api.configuration.api_key["BearerToken"] == "bearer sa-token"
    assert api.configuration.ssl_ca_cert == str(ca)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"kubeconfig": "/nonexistent/config"}, "cannot load Kubernetes credentials from"),
        ({"in_cluster": True}, "in-cluster service account"),
    ],
)
def test_connect_errors_are_clear(kwargs: dict[str, object], message: str) -> None:
    with pytest.raises(KubeError, match=message):
        connect(**kwargs)  # type: ignore[arg-type]


# --- the emulator itself ---------------------------------------------------------------------


def test_emulator_patch_flavours_and_conflicts(api: KubeApi) -> None:
    from kubernetes import client

    core = client.CoreV1Api(api.client())
    core.patch_node("gpu-01", [{"op": "add", "path": "/metadata/labels/x", "value": "1"}])
    core.patch_node(
        "gpu-01",
        {"metadata": {"labels": {"y": "2"}}},
        _content_type="application/merge-patch+json",
    )
    node = api.get("Node", "gpu-01")
    assert node is not None
    assert (node["metadata"]["labels"]["x"], node["metadata"]["labels"]["y"]) == ("1", "2")
    with pytest.raises(client.ApiException) as info:
        core.patch_node("gpu-01", {"metadata": {"resourceVersion": "1"}, "spec": {}})
    assert info.value.status == 409
    assert json.loads(info.value.body)["reason"] == "Conflict"


def test_emulator_list_selectors(api: KubeApi) -> None:
    from kubernetes import client

    core = client.CoreV1Api(api.client())
    on_node = core.list_pod_for_all_namespaces(field_selector="spec.nodeName=gpu-07")
    assert sorted(p.metadata.name for p in on_node.items) == [
        "batch-07-0-0",
        "batch-07-1-0",
        "serve-7d9f-07",
    ]
    jobs = core.list_namespaced_pod("ml", label_selector="job-name=batch-03-1")
    assert [p.metadata.name for p in jobs.items] == ["batch-03-1-0"]


def test_emulator_on_eviction_creates_a_replacement(api: KubeApi) -> None:
    def replace(server: KubeApi, pod: dict[str, object]) -> None:
        server.put(k.pod("batch-01-0-0r", "ml", 4, node_name="gpu-02"))

    api.on_eviction = replace
    assert actuator(api).evict("ml", "batch-01-0-0").outcome == "evicted"
    assert api.get("Pod", "batch-01-0-0r", "ml") is not None
    assert api.evicted == [("ml", "batch-01-0-0")]


def test_emulator_create_conflicts_and_dry_run(api: KubeApi) -> None:
    from kubernetes import client

    core = client.CoreV1Api(api.client())
    body = k.pod("new-0", "ml", 1)
    core.create_namespaced_pod("ml", body, dry_run="All", _preload_content=False)
    assert api.get("Pod", "new-0", "ml") is None  # dry run: not stored
    core.create_namespaced_pod("ml", body, _preload_content=False)
    created = api.get("Pod", "new-0", "ml")
    assert created is not None and created["metadata"]["resourceVersion"]
    with pytest.raises(client.ApiException) as info:
        core.create_namespaced_pod("ml", body, _preload_content=False)
    assert info.value.status == 409
    assert json.loads(info.value.body)["message"] == 'pods "new-0" already exists'


def test_snapshot_leaves_out_pods_on_nodes_it_did_not_list(api: KubeApi) -> None:
    # A node that joined after the node list was read: its pods appear in the pod list.
    api.put(k.pod("late-0", "ml", 2, node_name="gpu-99"))
    cluster = KubeClusterSource(api.client(), retry=FAST).snapshot()
    assert "ml/late-0" not in cluster.pods
    assert len(cluster.pods) == 37


def test_snapshot_ignores_conflicting_gpu_index_annotations(api: KubeApi) -> None:
    gi = {"defrag.io/gpu-indices": "0-3"}  # batch-01-0-0 holds 0-3 (assumed); say so twice
    api.put(k.pod("batch-01-0-0", "ml", 4, node_name="gpu-01", annotations=gi))
    api.put(
        k.pod("stale-0", "ml", 2, node_name="gpu-01", annotations={"defrag.io/gpu-indices": "2,3"})
    )
    api.remove("Pod", "batch-01-1-0", "ml")  # room for stale-0's 2 GPUs
    cluster = KubeClusterSource(api.client(), retry=FAST).snapshot()
    assert cluster.pods["ml/stale-0"].gpu_indices != (2, 3)  # slots re-assumed, best fit
    assert int(cluster.arrays.free_whole_count()[cluster.arrays.index["gpu-01"]]) == 2  # 8-4-2


def test_snapshot_survives_gpus_gone_from_allocatable_under_running_pods(api: KubeApi) -> None:
    # gpu-01 runs pods on 6 of its 8 GPUs (scattered_20: 2 free). A GPU falls off the bus and
    # the device plugin reports 4 allocatable: the pods no longer fit. The daemon must keep
    # observing the cluster — the pods that do not fit are left out (and logged), not fatal.
    node = next(n for n in scattered_20()["items"] if n["metadata"]["name"] == "gpu-01")
    node["status"]["allocatable"]["nvidia.com/gpu"] = "4"
    api.put(node)
    cluster = KubeClusterSource(api.client(), retry=FAST).snapshot()
    row = cluster.arrays.index["gpu-01"]
    assert cluster.arrays.gpu_total[row] == 4
    assert (cluster.arrays.gpu_free[row] >= 0).all()
    on_node = [p for p in cluster.pods_on("gpu-01")]
    assert sum(p.num_gpu for p in on_node) <= 4
    assert len(cluster.pods) < 37  # some of gpu-01's pods were left out


@pytest.mark.parametrize(
    ("kind", "said"),
    [
        ("PriorityClass", "PriorityClasses"),
        ("Node", "Nodes"),
        ("PodDisruptionBudget", "PodDisruptionBudgets"),
    ],
)
def test_kinds_are_named_in_the_plural_in_messages(kind: str, said: str) -> None:
    assert plural(kind) == said


def test_an_unlistable_kind_is_named_in_one_clean_line(api: KubeApi) -> None:
    api.fail("GET", r"/priorityclasses$", status=403, times=10)
    with pytest.raises(KubeError) as caught:
        KubeClusterSource(api.client(), retry=RetryPolicy(attempts=1, backoff_s=0)).snapshot()
    message = str(caught.value)
    assert message.startswith("cannot list PriorityClasses: HTTP 403"), message
    assert "\n" not in message and "urllib3" not in message
