"""``filter``'s FailedNodes: every node the request names that fails gets the reasons
``filter_reasons`` gives its row, in the request's order, whatever mix of failures the request
holds (nodes failing different filters, unknown nodes, a node reserved for another pod,
names asked twice)."""

from __future__ import annotations

from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from defrag.extender.verbs import R_UNKNOWN_NODE
from defrag.extender.wire import parse_args
from defrag.model.resources import RESERVED_FOR_ANNOTATION
from defrag.scoring.filters import filter_reasons
from tests.test_extender import args_body, make_extender, v1_node, v1_pod


def node(i: int, gpus: int, cpu: int, cordoned: bool, reserved: bool) -> dict[str, Any]:
    obj = v1_node(f"n-{i}", gpus=gpus)
    obj["status"]["allocatable"]["cpu"] = obj["status"]["capacity"]["cpu"] = str(cpu)
    if cordoned:
        obj["spec"]["unschedulable"] = True
    if reserved:
        obj["metadata"]["annotations"][RESERVED_FOR_ANNOTATION] = "ml/someone-else"
    return obj


nodes = st.lists(
    st.tuples(
        st.sampled_from([0, 2, 4, 8]),  # GPUs
        st.sampled_from([1, 8, 64]),  # CPU cores
        st.booleans(),  # cordoned
        st.integers(0, 5).map(lambda x: x == 0),  # reserved for another pod
        st.integers(0, 8),  # GPUs taken by a running pod
    ),
    min_size=1,
    max_size=12,
)


@settings(max_examples=60, deadline=None)
@given(
    fleet=nodes,
    gpus=st.sampled_from([0, 1, 2, 4, 8]),
    cpu=st.sampled_from(["1", "4", "32"]),
    asked=st.lists(st.integers(0, 14), min_size=1, max_size=20),
)
def test_failed_nodes_are_filter_reasons_per_row_in_request_order(
    fleet: list[tuple[int, int, bool, bool, int]], gpus: int, cpu: str, asked: list[int]
) -> None:
    items: list[dict[str, Any]] = []
    for i, (g, c, cordoned, reserved, used) in enumerate(fleet):
        items.append(node(i, g, c, cordoned, reserved))
        if g and used:
            items.append(v1_pod(f"run-{i}", min(used, g), node=f"n-{i}"))
    pod = v1_pod("p", gpus)
    pod["spec"]["containers"][0]["resources"]["requests"]["cpu"] = cpu
    names = [f"n-{i}" for i in asked]  # indices past the fleet are unknown nodes
    ext = make_extender(items)
    args = parse_args(args_body(pod, names))
    result = ext.filter(args)

    view = ext.cache.latest()
    assert view is not None
    arrays = view.arrays
    reasons = filter_reasons(args.pod, arrays)
    reserved = set(result["FailedAndUnresolvableNodes"])
    expected: dict[str, str] = {n: R_UNKNOWN_NODE for n in names if n not in arrays.index}
    for n in names:
        row = arrays.index.get(n)
        if row is None or n in reserved or n in result["NodeNames"]:
            continue
        expected[n] = "; ".join(reasons[row]) or "does not fit"
    assert result["FailedNodes"] == expected
    assert list(result["FailedNodes"]) == list(expected)  # the request's order
    assert all(not reasons[arrays.index[n]] for n in result["NodeNames"])
