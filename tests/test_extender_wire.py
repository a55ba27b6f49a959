"""The extender against requests in kube-scheduler's own wire form (tests/conformance/extender/,
sources in its SOURCES.md): both nodeCacheCapable modes, the lowercase and mixed-case forms, the
exact answer keys, and the same top node as `defrag place` on the same snapshot."""

from __future__ import annotations

import copy
import http.client
import json
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from defrag.adapters.snapshot import SnapshotFileSource, load_snapshot
from defrag.cli import app
from defrag.extender.server import ExtenderHTTPServer, serve, stop
from defrag.extender.wire import ARGS_FIELDS, go_fields, go_fold, parse_args
from defrag.scoring.framework import Placement
from defrag.scoring.policies.reserve_binpack import ReserveBinpack
from defrag.scoring.scheduler import schedule

ROOT = Path(__file__).resolve().parents[1]
CORPUS = ROOT / "tests" / "conformance" / "extender"
SNAPSHOT = ROOT / "tests" / "fixtures" / "snapshots" / "worked_example.json"

FILTER_KEYS = ["Nodes", "NodeNames", "FailedNodes", "FailedAndUnresolvableNodes", "Error"]
"""ExtenderFilterResult's fields in declaration order (extender/v1/types.go)."""
PRIORITY_KEYS = ["Host", "Score"]
"""HostPriority's fields (extender/v1/types.go)."""

# Each request body of the corpus, and whether it is in nodeCacheCapable (NodeNames) mode.
REQUESTS = {
    "args-nodenames.json": True,
    "args-nodes.json": False,
    "args-lowercase.json": True,
    "args-mixedcase.json": True,
}


def body(name: str) -> Any:
    return json.loads((CORPUS / name).read_text())


def with_gpus(doc: dict[str, Any], gpus: int) -> dict[str, Any]:
    """The request with its pod asking ``gpus`` GPUs (requests and limits)."""
    doc = copy.deepcopy(doc)
    pod = go_fields(doc, ARGS_FIELDS)["Pod"]
    for kind in ("requests", "limits"):
        pod["spec"]["containers"][0]["resources"][kind]["nvidia.com/gpu"] = str(gpus)
    return doc


@pytest.fixture(scope="module")
def server() -> Iterator[ExtenderHTTPServer]:
    srv = serve(SnapshotFileSource([SNAPSHOT]), host="127.0.0.1", port=0)
    thread = threading.Thread(target=srv.serve_forever, args=(0.05,), daemon=True)
    thread.start()
    yield srv
    srv.shutdown()
    stop(srv)
    thread.join(timeout=5)


def post(srv: ExtenderHTTPServer, verb: str, payload: bytes | str) -> tuple[int, Any]:
    """POST as kube-scheduler's HTTPExtender.send does: JSON body, Content-Type set."""
    conn = http.client.HTTPConnection(*srv.server_address[:2], timeout=5)
    conn.request("POST", f"/{verb}", payload, {"Content-Type": "application/json"})
    resp = conn.getresponse()
    return resp.status, json.loads(resp.read())


# --- the corpus, byte for byte ----------------------------------------------------------------


@pytest.mark.parametrize("name", sorted(REQUESTS))
def test_corpus_filter_answer_is_the_upstream_shape(server: ExtenderHTTPServer, name: str) -> None:
    code, answer = post(server, "filter", (CORPUS / name).read_bytes())
    assert code == 200
    assert list(answer) == FILTER_KEYS  # exactly these keys, in Go's order
    mode = "nodenames" if REQUESTS[name] else "nodes"
    assert answer == body(f"answer-filter-{mode}.json")


@pytest.mark.parametrize("name", sorted(REQUESTS))
def test_corpus_prioritize_answer_is_the_upstream_shape(
    server: ExtenderHTTPServer, name: str
) -> None:
    code, answer = post(server, "prioritize", (CORPUS / name).read_bytes())
    assert code == 200
    assert all(list(h) == PRIORITY_KEYS for h in answer)
    # 1 GPU, reserve-binpack: node-1 100 (the winner) → 10, node-2 0 → 0, node-3 62.5 → 6.
    assert answer == body("answer-prioritize.json")


def test_the_two_modes_fill_the_lists_as_kube_scheduler_reads_them(
    server: ExtenderHTTPServer,
) -> None:
    """nodeCacheCapable: kube-scheduler reads NodeNames (non-nil) else Nodes; otherwise only
    Nodes (pkg/scheduler/extender.go Filter). An 8-GPU pod fits node-2 only."""
    by_names = post(server, "filter", json.dumps(with_gpus(body("args-nodenames.json"), 8)))[1]
    assert by_names["NodeNames"] == ["node-2"] and by_names["Nodes"] is None
    by_nodes = post(server, "filter", json.dumps(with_gpus(body("args-nodes.json"), 8)))[1]
    assert by_nodes["NodeNames"] is None
    assert [n["metadata"]["name"] for n in by_nodes["Nodes"]["items"]] == ["node-2"]
    sent = body("args-nodes.json")["Nodes"]["items"]
    assert by_nodes["Nodes"]["items"] == [sent[1]]  # the object as sent, untouched
    for answer in (by_names, by_nodes):
        assert set(answer["FailedNodes"]) == {"node-1", "node-3"}
        assert all("insufficient gpu" in r for r in answer["FailedNodes"].values())


# --- the same choice as `defrag place` ----------------------------------------------------------


@pytest.mark.parametrize("gpus", [1, 2, 4, 8])
@pytest.mark.parametrize("name", sorted(REQUESTS))
def test_top_node_is_the_one_defrag_place_picks(
    server: ExtenderHTTPServer, name: str, gpus: int
) -> None:
    request = with_gpus(body(name), gpus)
    code, answer = post(server, "prioritize", json.dumps(request).encode())
    assert code == 200
    top = [h["Host"] for h in answer if h["Score"] == max(x["Score"] for x in answer)]
    result = CliRunner().invoke(
        app,
        ["place", "-s", str(SNAPSHOT), "--gpus", str(gpus), "--cpu-milli", "4000", "-o", "json"],
    )
    assert result.exit_code == 0, result.output
    assert top == [json.loads(result.output)["node"]]
    # And the engine itself, on the pod exactly as decoded from the wire.
    placement = schedule(
        parse_args(json.dumps(request)).pod, load_snapshot([SNAPSHOT]), ReserveBinpack()
    )
    assert isinstance(placement, Placement) and top == [placement.node]


# --- decoding: encoding/json's rules ------------------------------------------------------------


def test_compat_body_decodes_the_same_lowercased() -> None:
    """TestCompatibility: the ExtenderArgs JSON, lowercased, decodes to the same fields."""
    text = (CORPUS / "args-compat.json").read_text()
    exact = go_fields(json.loads(text), ARGS_FIELDS)
    lowered = go_fields(json.loads(text.lower()), ARGS_FIELDS)
    assert list(exact) == list(lowered) == ["Pod", "Nodes", "NodeNames"]
    # Its values are lowercase already; the inner objects' camelCase keys (daemonEndpoints) are
    # lowered too, which Go's v1.Node decoding folds back and defrag never reads.
    assert exact["Pod"] == lowered["Pod"] and exact["NodeNames"] == lowered["NodeNames"] == [
        "node1"
    ]
    for args in (exact, lowered):
        assert args["Nodes"]["items"][0]["metadata"]["name"] == "nodename"


def test_compat_body_pod_without_containers_is_refused_by_field(
    server: ExtenderHTTPServer,
) -> None:
    code, answer = post(server, "filter", (CORPUS / "args-compat.json").read_bytes())
    assert code == 400
    assert answer["Error"].startswith("Pod: ") and "spec.containers" in answer["Error"]


@pytest.mark.parametrize(
    ("key", "field"),
    [
        ("NodeNames", "NodeNames"),
        ("nodenames", "NodeNames"),
        ("NODENAMES", "NodeNames"),
        ("nodeNames", "NodeNames"),
        ("NodeName\u017f", "NodeNames"),  # ſ folds to S (unicode caseOrbit)
        ("\u212aey", None),  # Kelvin sign folds to K, but no field is "KEY"
        ("Node_Names", None),  # v1 encoding/json ignores no separators
        ("NodeNamesX", None),
        ("Pod", "Pod"),
        ("pOD", "Pod"),
        ("nodes", "Nodes"),
        ("Nodes ", None),
    ],
)
def test_go_key_matching(key: str, field: str | None) -> None:
    got = go_fields({key: 1}, ARGS_FIELDS)
    assert got == ({field: 1} if field else {})


def test_go_fold_is_encoding_json_fold() -> None:
    # fold.go: ASCII a-z upper-cased; U+212A → K and U+017F → S (the smallest rune of their
    # SimpleFold orbits); other runes unchanged (ı U+0131 folds only to itself: caseOrbit).
    assert go_fold("nodeNames") == "NODENAMES"
    assert go_fold("\u212a\u017f") == "KS"
    assert go_fold("\u0131d") == "\u0131D"


@pytest.mark.parametrize(
    ("doc", "names"),
    [
        # A later member for the same field overwrites the earlier one, whatever its case.
        ('{"NodeNames": ["node-1"], "nodenames": ["node-3"]}', ["node-3"]),
        ('{"nodenames": ["node-3"], "NodeNames": ["node-1"]}', ["node-1"]),
        ('{"NodeNames": ["node-1"], "nodenames": ["node-2"], "NodeNames": ["node-3"]}', ["node-3"]),
    ],
)
def test_last_member_for_a_field_wins(doc: str, names: list[str]) -> None:
    pod = json.dumps(body("args-nodenames.json")["Pod"])
    args = parse_args("{" + f'"Pod": {pod}, ' + doc[1:])
    assert list(args.node_names) == names


def test_null_after_a_list_clears_it() -> None:
    """``"NodeNames": [...]`` then ``"nodenames": null``: Go leaves the pointer nil, so the
    request is in Nodes mode."""
    doc = body("args-nodes.json")
    payload = json.dumps(doc)[:-1] + ', "nodeNames": ["node-9"], "NODENAMES": null}'
    args = parse_args(payload)
    assert args.node_objects is not None and list(args.node_names) == [
        "node-1",
        "node-2",
        "node-3",
    ]


def test_empty_nodelist_items_null(server: ExtenderHTTPServer) -> None:
    """Go marshals an empty NodeList's nil Items as ``null``."""
    doc = body("args-nodes.json")
    doc["Nodes"] = {"metadata": {}, "items": None}
    code, answer = post(server, "filter", json.dumps(doc).encode())
    assert code == 200
    assert answer["Nodes"] == {"metadata": {}, "items": []} and answer["NodeNames"] is None
    code, answer = post(server, "prioritize", json.dumps(doc).encode())
    assert code == 200 and answer == []


def test_unknown_top_level_keys_are_ignored(server: ExtenderHTTPServer) -> None:
    doc = body("args-nodenames.json")
    doc["NodeNameToVictims"] = {}  # a field of another extender type: Go ignores it
    code, answer = post(server, "prioritize", json.dumps(doc).encode())
    assert code == 200 and answer == body("answer-prioritize.json")
