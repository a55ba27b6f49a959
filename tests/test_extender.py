"""The scheduler extender: real-shaped ExtenderArgs over HTTP, the worked example of
docs/concepts.md, reservations, and garbage in."""

from __future__ import annotations

import http.client
import json
import os
import threading
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest

from defrag.adapters.kube_convert import cluster_from_items
from defrag.adapters.snapshot import SnapshotFileSource
from defrag.extender.server import ExtenderHTTPServer, serve, stop
from defrag.extender.state import ClusterCache
from defrag.extender.verbs import R_UNKNOWN_NODE, Extender
from defrag.extender.wire import encode_priorities, extender_score, parse_args
from defrag.model.cluster import Cluster
from defrag.scoring.framework import Placement
from defrag.scoring.policies.reserve_binpack import ReserveBinpack
from defrag.scoring.profile import ProfileConfig
from defrag.scoring.scheduler import schedule

# --- real-shaped v1 objects ------------------------------------------------------------------


def v1_node(name: str, gpus: int = 8, annotations: dict[str, str] | None = None) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {
            "name": name,
            "labels": {"kubernetes.io/hostname": name, "nvidia.com/gpu.product": "A100-SXM4-80GB"},
            "annotations": dict(annotations or {}),
        },
        "spec": {},
        "status": {
            "allocatable": {"cpu": "64", "memory": "512Gi", "nvidia.com/gpu": str(gpus)},
            "capacity": {"cpu": "64", "memory": "512Gi", "nvidia.com/gpu": str(gpus)},
        },
    }


def v1_pod(
    name: str, gpus: int, node: str | None = None, namespace: str = "default"
) -> dict[str, Any]:
    spec: dict[str, Any] = {
        "containers": [
            {
                "name": "main",
                "image": "trainer:1",
                "resources": {
                    "requests": {"cpu": "1", "memory": "4Gi", "nvidia.com/gpu": str(gpus)},
                    "limits": {"nvidia.com/gpu": str(gpus)},
                },
            }
        ],
        "schedulerName": "default-scheduler",
    }
    if node is not None:
        spec["nodeName"] = node
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": namespace, "uid": f"uid-{name}"},
        "spec": spec,
        "status": {"phase": "Running" if node else "Pending"},
    }


def worked_example(annotations: dict[str, dict[str, str]] | None = None) -> list[dict[str, Any]]:
    """docs/concepts.md's worked example: node-1 has 1 of 8 GPUs free, node-2 8, node-3 4."""
    ann = annotations or {}
    return [
        v1_node("node-1", annotations=ann.get("node-1")),
        v1_node("node-2", annotations=ann.get("node-2")),
        v1_node("node-3", annotations=ann.get("node-3")),
        v1_pod("seven", 7, "node-1"),
        v1_pod("four", 4, "node-3"),
    ]


NAMES = ["node-1", "node-2", "node-3"]


class StaticSource:
    def __init__(self, cluster: Cluster) -> None:
        self.cluster = cluster

    def snapshot(self) -> Cluster:
        return self.cluster


class BrokenSource:
    def snapshot(self) -> Cluster:
        raise ConnectionError("API server unreachable")


def make_extender(items: list[dict[str, Any]], policy: str = "reserve-binpack") -> Extender:
    cache = ClusterCache(StaticSource(cluster_from_items(items)), ProfileConfig(policy))
    assert cache.refresh().ok
    return Extender(cache)


def args_body(
    pod: dict[str, Any], names: list[str] | None = None, nodes: list[Any] | None = None
) -> bytes:
    doc: dict[str, Any] = {"pod": pod}
    if names is not None:
        doc["NodeNames"] = names
    if nodes is not None:
        doc["nodes"] = {"apiVersion": "v1", "kind": "NodeList", "metadata": {}, "items": nodes}
    return json.dumps(doc).encode()


# --- the worked example ----------------------------------------------------------------------


def test_one_gpu_pod_ranks_node1_first_as_the_scheduler_does() -> None:
    items = worked_example()
    ext = make_extender(items)
    pod_json = v1_pod("small", 1)
    answer = ext.prioritize(parse_args(args_body(pod_json, NAMES)))
    # reserve-binpack, R=1 < T=8: node-1 F=1 → (1 - 0/8)·100 = 100 → the winner → 10;
    # node-3 F=4 → (1 - 3/8)·100 = 62.5 → floor(6.25) = 6; node-2 F=T → 0 → 0.
    assert answer == [
        {"Host": "node-1", "Score": 10},
        {"Host": "node-2", "Score": 0},
        {"Host": "node-3", "Score": 6},
    ]
    # defrag place's engine on the same snapshot picks the same node.
    cluster = cluster_from_items(items)
    pod = parse_args(args_body(pod_json, NAMES)).pod
    placement = schedule(pod, cluster, ReserveBinpack())
    assert isinstance(placement, Placement) and placement.node == "node-1"


def test_the_tie_winner_is_the_smallest_node_as_the_scheduler_picks() -> None:
    # node-a: 1 of 8 GPUs free; node-b: 1 of 2 free. A 1-GPU pod scores
    # (1 − 0/8)·100 = 100 on node-a and (1 − 0/2)·100 = 100 on node-b: a tie the scheduler
    # breaks to the fewest GPUs, node-b → 10; node-a → min(9, floor(100/10)) = 9.
    items = [
        v1_node("node-a", gpus=8),
        v1_node("node-b", gpus=2),
        v1_pod("seven", 7, node="node-a"),
        v1_pod("one", 1, node="node-b"),
    ]
    names = ["node-a", "node-b"]
    answer = make_extender(items).prioritize(parse_args(args_body(v1_pod("small", 1), names)))
    assert answer == [{"Host": "node-a", "Score": 9}, {"Host": "node-b", "Score": 10}]
    pod = parse_args(args_body(v1_pod("small", 1), names)).pod
    placement = schedule(pod, cluster_from_items(items), ReserveBinpack())
    assert isinstance(placement, Placement) and placement.node == "node-b"


def test_eight_gpu_pod_filters_to_node2_with_reasons() -> None:
    ext = make_extender(worked_example())
    body = args_body(v1_pod("big", 8), NAMES)
    result = ext.filter(parse_args(body))
    assert result["NodeNames"] == ["node-2"]
    assert set(result["FailedNodes"]) == {"node-1", "node-3"}
    assert all("insufficient gpu" in r for r in result["FailedNodes"].values())
    assert result["FailedAndUnresolvableNodes"] == {} and result["Error"] == ""
    # R = T = 8: node-2 entirely free → 100 → 10; the others are filtered → 0.
    assert ext.prioritize(parse_args(body)) == [
        {"Host": "node-1", "Score": 0},
        {"Host": "node-2", "Score": 10},
        {"Host": "node-3", "Score": 0},
    ]


def test_nodes_mode_returns_the_node_objects_untouched() -> None:
    items = worked_example()
    nodes = [o for o in items if o["kind"] == "Node"]
    ext = make_extender(items)
    result = ext.filter(parse_args(args_body(v1_pod("mid", 4), nodes=nodes)))
    # R=4: node-1 (1 free) fails; node-2 (8) and node-3 (4) pass, as sent.
    assert result["NodeNames"] is None
    assert result["Nodes"] == {"metadata": {}, "items": [nodes[1], nodes[2]]}
    assert list(result["FailedNodes"]) == ["node-1"]


def test_only_requested_nodes_compete() -> None:
    """kube-scheduler sends only nodes its own filters kept; the winner is among them."""
    ext = make_extender(worked_example())
    answer = ext.prioritize(parse_args(args_body(v1_pod("small", 1), ["node-2", "node-3"])))
    # node-1 is not a candidate: node-3 (62.5) wins → 10; node-2 (0) → 0.
    assert answer == [{"Host": "node-2", "Score": 0}, {"Host": "node-3", "Score": 10}]


def test_unknown_node_fails_with_reason_and_scores_zero() -> None:
    ext = make_extender(worked_example())
    body = args_body(v1_pod("small", 1), ["node-9", "node-3"])
    result = ext.filter(parse_args(body))
    assert result["FailedNodes"] == {"node-9": R_UNKNOWN_NODE}
    assert result["NodeNames"] == ["node-3"]
    assert ext.prioritize(parse_args(body)) == [
        {"Host": "node-9", "Score": 0},
        {"Host": "node-3", "Score": 10},
    ]


# --- reservations ----------------------------------------------------------------------------


RESERVED = {"node-1": {"defrag.io/reserved-for": "team-a/vip"}}


@pytest.mark.parametrize(
    ("namespace", "name", "passes_node1", "winner"),
    [
        ("team-a", "vip", True, "node-1"),  # the pod the room was made for
        ("default", "vip", False, "node-3"),  # same name, other namespace
        ("team-a", "other", False, "node-3"),
    ],
)
def test_reserved_node_only_admits_its_pod(
    namespace: str, name: str, passes_node1: bool, winner: str
) -> None:
    ext = make_extender(worked_example(RESERVED))
    body = args_body(v1_pod(name, 1, namespace=namespace), NAMES)
    result = ext.filter(parse_args(body))
    assert ("node-1" in result["NodeNames"]) is passes_node1
    if not passes_node1:
        assert "team-a/vip" in result["FailedAndUnresolvableNodes"]["node-1"]
        assert "node-1" not in result["FailedNodes"]
    scores = {h["Host"]: h["Score"] for h in ext.prioritize(parse_args(body))}
    assert max(scores, key=lambda h: scores[h]) == winner and scores[winner] == 10


def owned(pod: dict[str, Any], kind: str, name: str) -> dict[str, Any]:
    """``pod`` with a controlling ownerReference (core/v1 ``metadata.ownerReferences``)."""
    ref = {"apiVersion": "apps/v1", "kind": kind, "name": name, "uid": f"uid-{name}",
           "controller": True}  # fmt: skip
    pod["metadata"]["ownerReferences"] = [ref]
    return pod


OWNER_RESERVED = {
    "node-1": {"defrag.io/reserved-for": "owner:team-a/ReplicaSet/train-7d9f, team-a/vip"}
}


@pytest.mark.parametrize(
    ("namespace", "owner", "name", "passes_node1"),
    [
        ("team-a", ("ReplicaSet", "train-7d9f"), "train-7d9f-x2k4", True),  # the replacement
        ("team-a", None, "vip", True),  # the other holder of the same node, named as a pod
        ("team-a", ("ReplicaSet", "other-5c6b"), "other-5c6b-q1", False),  # another owner
        ("team-a", ("StatefulSet", "train-7d9f"), "train-7d9f-0", False),  # same name, kind
        ("default", ("ReplicaSet", "train-7d9f"), "train-7d9f-x2k4", False),  # other namespace
        ("team-a", None, "train-7d9f-x2k4", False),  # a bare pod of that name
    ],
)
def test_an_owner_reservation_admits_any_pod_of_that_owner_only(
    namespace: str, owner: tuple[str, str] | None, name: str, passes_node1: bool
) -> None:
    """``defrag.io/reserved-for: owner:<ns>/<Kind>/<name>`` (a repack's target, kept for the
    moved pod's replacement, whose name nobody knows before its controller creates it)."""
    ext = make_extender(worked_example(OWNER_RESERVED))
    pod = v1_pod(name, 1, namespace=namespace)
    body = args_body(owned(pod, *owner) if owner else pod, NAMES)
    result = ext.filter(parse_args(body))
    assert ("node-1" in result["NodeNames"]) is passes_node1
    if not passes_node1:
        assert (
            "owner:team-a/ReplicaSet/train-7d9f" in result["FailedAndUnresolvableNodes"]["node-1"]
        )
    scores = {h["Host"]: h["Score"] for h in ext.prioritize(parse_args(body))}
    # node-1 (1 GPU free of 8) wins for a 1-GPU pod that may use it; node-3 otherwise.
    winner = "node-1" if passes_node1 else "node-3"
    assert max(scores, key=lambda h: scores[h]) == winner and scores[winner] == 10


def test_reservation_in_request_node_objects_beats_the_stale_cache() -> None:
    """In nodes mode the node objects are fresher than the last relist."""
    ext = make_extender(worked_example())  # the cache knows no reservation
    nodes = [o for o in worked_example(RESERVED) if o["kind"] == "Node"]
    result = ext.filter(parse_args(args_body(v1_pod("other", 1), nodes=nodes)))
    assert list(result["FailedAndUnresolvableNodes"]) == ["node-1"]
    assert [n["metadata"]["name"] for n in result["Nodes"]["items"]] == ["node-2", "node-3"]


# --- the score mapping -----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("score", "winner", "expected"),
    [
        (100.0, True, 10),
        (100.0, False, 9),  # a tie lost on the node name stays below the winner
        (95.0, False, 9),
        (62.5, False, 6),
        (9.99, False, 0),
        (0.0, True, 10),  # the winner is 10 even when every candidate scores 0
        (0.0, False, 0),
        (float("nan"), False, 0),
        (-5.0, False, 0),
    ],
)
def test_extender_score(score: float, winner: bool, expected: int) -> None:
    assert extender_score(score, winner) == expected


@pytest.mark.parametrize("policy", ["reserve-binpack", "least-allocated", "best-fit", "fgd"])
def test_top_score_is_the_schedulers_choice_for_each_policy(policy: str) -> None:
    items = worked_example()
    ext = make_extender(items, policy)
    body = args_body(v1_pod("two", 2), NAMES)
    scores = {h["Host"]: h["Score"] for h in ext.prioritize(parse_args(body))}
    view = ext.cache.view()
    assert view is not None
    choice = schedule(parse_args(body).pod, view.cluster, view.policy)
    assert isinstance(choice, Placement)
    assert [h for h, s in scores.items() if s == 10] == [choice.node]


# --- over HTTP -------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ExtenderHTTPServer]:
    path = tmp_path_factory.mktemp("extender") / "snapshot.json"
    path.write_text(json.dumps({"apiVersion": "v1", "kind": "List", "items": worked_example()}))
    srv = serve(SnapshotFileSource([path]), host="127.0.0.1", port=0)
    thread = threading.Thread(target=srv.serve_forever, args=(0.05,), daemon=True)
    thread.start()
    yield srv
    srv.shutdown()
    stop(srv)
    thread.join(timeout=5)


def post(
    srv: ExtenderHTTPServer, path: str, body: bytes, conn: http.client.HTTPConnection | None = None
) -> tuple[int, Any]:
    c = conn or http.client.HTTPConnection(*srv.server_address[:2], timeout=5)
    c.request("POST", path, body, {"Content-Type": "application/json"})
    resp = c.getresponse()
    data = resp.read()
    return resp.status, json.loads(data)


def get(srv: ExtenderHTTPServer, path: str) -> tuple[int, str]:
    c = http.client.HTTPConnection(*srv.server_address[:2], timeout=5)
    c.request("GET", path)
    resp = c.getresponse()
    return resp.status, resp.read().decode()


def test_http_filter_and_prioritize(server: ExtenderHTTPServer) -> None:
    conn = http.client.HTTPConnection(*server.server_address[:2], timeout=5)
    body = args_body(v1_pod("small", 1), NAMES)
    code, result = post(server, "/filter", body, conn)
    assert code == 200 and result["NodeNames"] == NAMES
    code, prio = post(server, "/prioritize", body, conn)  # same keep-alive connection
    assert code == 200
    assert prio[0] == {"Host": "node-1", "Score": 10}


GOOD_POD = v1_pod("small", 1)


@pytest.mark.parametrize(
    ("body", "reason"),
    [
        (b"not json", "not JSON"),
        (b"\xff\xfe", "not JSON"),
        (b"[]", "expected a JSON object"),
        (b"{}", "Pod: missing"),
        (json.dumps({"pod": 1, "nodenames": []}).encode(), "Pod: missing or not an object"),
        (json.dumps({"Pod": None, "NodeNames": []}).encode(), "Pod: null"),
        (json.dumps({"pod": GOOD_POD}).encode(), "Nodes and NodeNames: both null or missing"),
        (
            json.dumps({"Pod": GOOD_POD, "Nodes": None, "NodeNames": None}).encode(),
            "Nodes and NodeNames: both null",
        ),
        (json.dumps({"pod": GOOD_POD, "nodenames": "node-1"}).encode(), "NodeNames: expected"),
        (json.dumps({"pod": GOOD_POD, "nodenames": [1, 2]}).encode(), "NodeNames: expected"),
        (json.dumps({"pod": GOOD_POD, "nodes": []}).encode(), "Nodes: expected a v1 NodeList"),
        (json.dumps({"Pod": GOOD_POD, "Nodes": {"items": {}}}).encode(), "Nodes.items: expected"),
        (
            json.dumps({"pod": GOOD_POD, "nodes": {"items": [{"metadata": {}}]}}).encode(),
            "Nodes.items[0].metadata.name",
        ),
        (
            json.dumps(
                {
                    "pod": {
                        "metadata": {"name": "x"},
                        "spec": {
                            "containers": [
                                {"name": "c", "resources": {"requests": {"nvidia.com/gpu": "lots"}}}
                            ]
                        },
                    },
                    "nodenames": ["node-1"],
                }
            ).encode(),
            "nvidia.com/gpu",
        ),
    ],
)
@pytest.mark.parametrize("verb", ["filter", "prioritize"])
def test_garbage_gets_400_with_reason_and_server_lives_on(
    server: ExtenderHTTPServer, body: bytes, reason: str, verb: str
) -> None:
    code, result = post(server, f"/{verb}", body)
    assert code == 400
    assert reason in result["Error"]
    code, _ = post(server, f"/{verb}", args_body(GOOD_POD, NAMES))
    assert code == 200


def test_unknown_verb_is_404(server: ExtenderHTTPServer) -> None:
    code, result = post(server, "/bind", args_body(GOOD_POD, NAMES))
    assert code == 404 and "filter, prioritize" in result["Error"]


def test_health_readiness_and_metrics(server: ExtenderHTTPServer) -> None:
    assert get(server, "/healthz")[0] == 200
    assert get(server, "/readyz") == (200, "ok\n")
    requests = server.metrics.requests
    ok_before = requests.labels(verb="filter", code="200")._value.get()
    bad_before = requests.labels(verb="filter", code="400")._value.get()
    post(server, "/filter", args_body(GOOD_POD, NAMES))
    post(server, "/filter", b"garbage")
    code, text = get(server, "/metrics")
    assert code == 200
    assert f'defrag_extender_requests_total{{code="200",verb="filter"}} {ok_before + 1}' in text
    assert f'defrag_extender_requests_total{{code="400",verb="filter"}} {bad_before + 1}' in text
    assert 'defrag_extender_relists_total{result="ok"} 1.0' in text


def test_not_ready_until_the_source_answers() -> None:
    source = BrokenSource()
    srv = serve(source, host="127.0.0.1", port=0, relist_interval_s=3600)
    thread = threading.Thread(target=srv.serve_forever, args=(0.05,), daemon=True)
    thread.start()
    try:
        code, text = get(srv, "/readyz")
        assert code == 503 and "API server unreachable" in text
        code, result = post(srv, "/filter", args_body(GOOD_POD, NAMES))
        assert code == 503 and "not ready" in result["Error"]
        # The source recovers: the next relist makes the extender ready.
        srv.extender.cache.source = StaticSource(cluster_from_items(worked_example()))
        assert srv.extender.cache.refresh().ok
        assert get(srv, "/readyz")[0] == 200
        assert post(srv, "/filter", args_body(GOOD_POD, NAMES))[0] == 200
    finally:
        srv.shutdown()
        stop(srv)


def test_failed_relist_keeps_the_last_state_then_goes_stale() -> None:
    now = [0.0]
    cache = ClusterCache(
        StaticSource(cluster_from_items(worked_example())),
        ProfileConfig(),
        max_staleness_s=60,
        clock=lambda: now[0],
    )
    assert cache.refresh().ok
    cache.source = BrokenSource()
    now[0] = 30.0
    status = cache.refresh()
    assert not status.ok and "unreachable" in status.reasons[0]
    assert cache.view() is not None and cache.readiness().ok  # 30 s old ≤ 60 s
    now[0] = 61.0
    readiness = cache.readiness()
    assert not readiness.ok and "61s old" in readiness.reasons[0]


def test_snapshot_source_follows_the_file(tmp_path: Any) -> None:
    path = tmp_path / "snap.json"
    path.write_text(json.dumps({"kind": "List", "items": worked_example()}))
    source = SnapshotFileSource([path])
    first = source.snapshot()
    assert source.snapshot() is first  # unchanged file: not reread
    items = [*worked_example(), v1_pod("one-more", 1, "node-1")]
    path.write_text(json.dumps({"kind": "List", "items": items}))
    os.utime(path, (1, 1))  # a different mtime even within the clock's resolution
    second = source.snapshot()
    assert second is not first
    assert int(second.arrays.free_whole_count()[second.arrays.index["node-1"]]) == 0
    assert np.array_equal(first.arrays.free_whole_count(), [1, 8, 4])


def test_empty_candidate_list() -> None:
    ext = make_extender(worked_example())
    body = args_body(v1_pod("small", 1), [])
    assert ext.filter(parse_args(body))["NodeNames"] == []
    assert ext.prioritize(parse_args(body)) == []


@pytest.mark.parametrize(
    "hosts",
    [
        ["node-1", "gpu-a.zone-b.example.com"],
        ['we"ird', "back\\slash", "ünïcode"],  # not RFC 1123: the slow, escaping path
        [],
    ],
)
def test_priority_encoding_is_plain_json(hosts: list[str]) -> None:
    items = [{"Host": h, "Score": i} for i, h in enumerate(hosts)]
    assert json.loads(encode_priorities(hosts, list(range(len(hosts))))) == items


def test_chunked_body_and_missing_length(server: ExtenderHTTPServer) -> None:
    body = args_body(GOOD_POD, NAMES)
    conn = http.client.HTTPConnection(*server.server_address[:2], timeout=5)
    conn.request(
        "POST",
        "/prioritize",
        iter([body[:10], body[10:]]),
        {"Transfer-Encoding": "chunked"},
        encode_chunked=True,
    )
    resp = conn.getresponse()
    assert resp.status == 200 and json.loads(resp.read())[0] == {"Host": "node-1", "Score": 10}
    # No Content-Length and not chunked: 400, and the server closes that connection.
    raw = http.client.HTTPConnection(*server.server_address[:2], timeout=5)
    raw.putrequest("POST", "/filter")
    raw.endheaders()
    resp = raw.getresponse()
    assert resp.status == 400 and "Content-Length or chunked" in json.loads(resp.read())["Error"]
