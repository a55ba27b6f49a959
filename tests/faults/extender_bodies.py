"""Bodies kube-scheduler could never have sent, each with the field the 400 must name.

The pod and nodes are the worked example of ``tests/test_extender.py`` (v1 JSON as the API
serves it). Each case changes one thing; ``field`` is what the answer's ``Error`` must mention.
"""

from __future__ import annotations

import copy
import json
from typing import Any

from tests.test_extender import NAMES, v1_node, v1_pod


def _args(pod: Any, names: Any = NAMES, nodes: Any = None) -> dict[str, Any]:
    return {"Pod": pod, "Nodes": nodes, "NodeNames": names if nodes is None else None}


def _pod(**containers_patch: Any) -> dict[str, Any]:
    pod = v1_pod("bad", 1)
    pod["spec"]["containers"][0].update(containers_patch)
    return pod


def _limits(value: Any) -> dict[str, Any]:
    return _pod(resources={"limits": {"nvidia.com/gpu": value}})


def _nodes_with(meta_patch: dict[str, Any]) -> dict[str, Any]:
    node = v1_node("node-1")
    node["metadata"].update(meta_patch)
    return {"metadata": {}, "items": [node]}


def _raw(text: str) -> bytes:
    return text.encode()


def _json(obj: Any) -> bytes:
    return json.dumps(obj).encode()


def _with_nan() -> bytes:
    body = json.dumps(_args(_limits("1")))
    return body.replace('"nvidia.com/gpu": "1"}', '"nvidia.com/gpu": NaN}', 1).encode()


MALFORMED: list[tuple[str, bytes, str]] = [
    ("not JSON", b"\xff\xfe{", "body"),
    ("JSON nested 100,000 deep", b"[" * 100_000 + b"]" * 100_000, "body"),
    ("Pod nested deep", _raw('{"Pod":' + '{"a":' * 5000 + "1" + "}" * 5000 + "}"), "body"),
    ("NaN quantity", _with_nan(), "body"),
    ("a list, not ExtenderArgs", _json([1, 2]), "body"),
    ("no Pod", _json({"NodeNames": NAMES}), "Pod"),
    ("Pod metadata a list", _json(_args({**v1_pod("x", 1), "metadata": []})), "Pod"),
    ("containers an object", _json(_args(_pod() | {"spec": {"containers": {}}})), "Pod"),
    ("resources a string", _json(_args(_pod(resources="lots"))), "Pod"),
    ("limits a list", _json(_args(_pod(resources={"limits": ["nvidia.com/gpu"]}))), "Pod"),
    ("GPU limit an object", _json(_args(_limits({"n": 1}))), "Pod"),
    ("negative GPU request", _json(_args(_limits("-1"))), "Pod"),
    ("NodeNames of numbers", _json(_args(v1_pod("x", 1), [1, 2])), "NodeNames"),
    ("Nodes a list", _json({"Pod": v1_pod("x", 1), "Nodes": [], "NodeNames": None}), "Nodes"),
    (
        "node annotations a list",
        _json(_args(v1_pod("x", 1), nodes=_nodes_with({"annotations": ["a"]}))),
        "annotations",
    ),
    (
        "node metadata without a name",
        _json(_args(v1_pod("x", 1), nodes=_nodes_with({"name": None}))),
        "metadata.name",
    ),
]


VALID: list[tuple[str, bytes]] = [
    # resource.Quantity's UnmarshalJSON trims the quotes if any: a bare JSON number is a quantity
    ("GPU limit a JSON number", _json(_args(_limits(4)))),
    (
        "lowercase field names (encoding/json folds case)",
        _json({"pod": v1_pod("x", 1), "nodenames": NAMES}),
    ),
    (
        "NaN inside a string is just text",
        _json(_args({**v1_pod("x", 1), "metadata": {"name": "NaN", "namespace": "default"}})),
    ),
]


def good_body(gpus: int = 1) -> bytes:
    return _json(_args(copy.deepcopy(v1_pod("good", gpus))))
