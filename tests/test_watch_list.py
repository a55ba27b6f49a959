"""The watched store's list: page by page with the next page read ahead, each object trimmed by
a made trimmer and held as compact JSON beside its conversion. What it builds is what the plain
lister (``KubeClusterSource``, whole objects, no store) builds from the same API; the made
trimmer keeps what the plain recursive trim (tests/support/kube_trim.py) keeps; the held JSON
gives back the trimmed object; a page read ahead on another thread still ends by the listing
thread's budget.

The objects are :mod:`tests.support.kubeobjects`' (shaped as the API server serves them), with
the ``managedFields`` a real API server adds to every object (read by nothing here)."""

from __future__ import annotations

import copy
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from defrag.adapters.deadline import time_budget
from defrag.adapters.kube import KubeClusterSource, RetryPolicy, connect
from defrag.adapters.kube_watch import (
    KEEP,
    LAST_APPLIED,
    TRIMMERS,
    Held,
    KubeWatchSource,
    encode,
    hold,
)
from tests.support import kubeobjects as k
from tests.support.kube_trim import trim
from tests.support.kubeapi import KubeApi, running
from tests.test_extender_watch import bulky
from tests.test_store_build import assert_same

FAST = RetryPolicy(attempts=1, backoff_s=0.0, timeout_s=5.0)
KINDS = ("PriorityClass", "Node", "Pod", "PodDisruptionBudget")


def served(obj: dict[str, Any]) -> dict[str, Any]:
    """``obj`` with server-side apply's bookkeeping, as every object is served
    (meta/v1 ``ManagedFieldsEntry``)."""
    out = copy.deepcopy(obj)
    out["metadata"]["managedFields"] = [
        {
            "manager": "kubelet",
            "operation": "Update",
            "apiVersion": "v1",
            "time": "2026-11-01T08:00:00Z",
            "fieldsType": "FieldsV1",
            "fieldsV1": {"f:status": {"f:conditions": {}}},
        }
    ]
    return out


def fleet() -> list[dict[str, Any]]:
    """Nodes with GPUs and NVLink domains, bound and pending pods (whole GPUs, shares, named
    slots, tolerations, an owner), budgets, classes: more of each than a page holds."""
    items: list[dict[str, Any]] = [
        k.priority_class("high", 1000),
        k.priority_class("low", 10, global_default=True),
    ]
    drain = {"key": "drain", "effect": "NoSchedule"}
    for n in range(9):
        items.append(served(k.node(f"gpu-{n}", nvlink="0-3,4-7" if n % 2 else None)))
    for i in range(23):
        node = f"gpu-{i % 9}" if i % 4 else None
        annotations = {"defrag.io/gpu-milli": "250"} if i % 7 == 3 else None
        items.append(
            served(
                k.pod(
                    f"w-{i:02d}",
                    f"team-{i % 3}",
                    1 if annotations else (i % 3),
                    node_name=node,
                    priority=None if i % 5 else 1000,
                    priority_class="high" if i % 5 == 0 else "low",
                    tolerations=[drain] if i % 6 == 0 else None,
                    annotations=annotations,
                    labels={"job-name": f"job-{i // 4}"},
                    owner=("Job", f"job-{i // 4}") if i % 2 else None,
                )
            )
        )
    items += [k.pdb("serve", f"team-{t}", match_labels={"app": "serve"}) for t in range(3)]
    return items


@pytest.fixture
def api() -> Iterator[KubeApi]:
    yield from running(fleet())


@pytest.mark.parametrize("read_ahead", [True, False])
def test_listed_store_builds_what_the_plain_lister_builds(api: KubeApi, read_ahead: bool) -> None:
    """Pages of 4 (several per kind, the last one short), read ahead or not: the same nodes,
    pods in the same order, slots, free resources, budgets and warnings as the plain lister's
    snapshot of the same API (whole objects converted, nothing held)."""
    store = KubeWatchSource(api.client(), page_size=4, retry=FAST, read_ahead=read_ahead)
    store.sync()
    got, _ = store.build()
    want = KubeClusterSource(api.client(), page_size=4, retry=FAST).snapshot()
    assert len(got.pods) == 23 and len(got.nodes) == 9
    assert_same(got, want)
    pages = [r for r in api.requests if r.method == "GET" and r.path == "/api/v1/pods"]
    # every page asked for once (23 pods: 5 pages of 4 and one of 3), each after the last one's
    # continue token; the plain lister's pages included
    assert len(pages) == 2 * 6
    assert sum(1 for r in pages if "continue" not in r.query) == 2


def test_held_objects_are_the_trimmed_ones(api: KubeApi) -> None:
    """What the store gives back for each object is ``trim`` of the object as served, its
    resourceVersion included: the compact JSON loses nothing kept."""
    store = KubeWatchSource(api.client(), page_size=4, retry=FAST)
    store.sync()
    for kind in KINDS:
        served = {
            (f"{o['metadata']['namespace']}/" if o["metadata"].get("namespace") else "")
            + o["metadata"]["name"]: {f: v for f, v in o.items() if f not in ("kind", "apiVersion")}
            for o in api.objects(kind)
        }
        held = store.objects(kind)
        assert held.keys() == served.keys(), kind
        for key, obj in served.items():
            assert held[key] == trim(obj, KEEP[kind]), key
            assert held[key]["metadata"]["resourceVersion"] == obj["metadata"]["resourceVersion"]


def test_an_object_json_cannot_encode_compactly_is_held_as_it_is() -> None:
    """A priority past 64 bits (the API server would refuse it; a snapshot may hold it): held
    as the trimmed object itself, given back, compared, and converted as before."""
    pod = k.pod("huge", "ml", 1, node_name="gpu-0")
    pod["spec"]["priority"] = 2**70
    held = hold("Pod", pod, "ml/huge")
    assert isinstance(held.body, dict)
    assert held.trimmed() == trim(pod, KEEP["Pod"])
    again = copy.deepcopy(pod)
    again["metadata"]["resourceVersion"] = "9999"
    assert held.same_but_version(encode("Pod", again)[1])
    assert not held.piece.pods and held.piece.warnings  # unreadable: left out, as before
    assert not held.same_but_version(hold("Pod", k.pod("huge", "ml", 1), "ml/huge"))


def test_version_alone_is_no_change() -> None:
    """Two versions of one object that differ only in what the store does not keep (a
    heartbeat, an IP, managedFields) and in resourceVersion hold the same JSON."""
    node = k.node("gpu-0")
    later = bulky(node)
    later["metadata"]["resourceVersion"] = "123456"
    later["status"].setdefault("conditions", []).append({"type": "Ready", "status": "True"})
    a, b = hold("Node", node, "gpu-0"), hold("Node", later, "gpu-0")
    assert a.same_but_version(b) and a.version != b.version
    cordoned = copy.deepcopy(later)
    cordoned["spec"]["unschedulable"] = True
    assert not a.same_but_version(hold("Node", cordoned, "gpu-0"))
    assert isinstance(a, Held) and isinstance(a.body, bytes)


# --- the made trimmer is trim ----------------------------------------------------------------


def _spec_keys(spec: Any) -> set[str]:
    if spec is True:
        return set()
    out = set(spec)
    for sub in spec.values():
        out |= _spec_keys(sub)
    return out


NAMES = sorted(
    {"kind", "managedFields", "image", "env", "podIP", LAST_APPLIED, "x"}
    | {key for spec in KEEP.values() for key in _spec_keys(spec)}
)
SCALARS = st.none() | st.booleans() | st.integers(-5, 5) | st.text(max_size=3)
JSON = st.recursive(
    SCALARS,
    lambda inner: (
        st.lists(inner, max_size=3) | st.dictionaries(st.sampled_from(NAMES), inner, max_size=6)
    ),
    max_leaves=25,
)


@settings(max_examples=300, deadline=None)
@given(kind=st.sampled_from(sorted(KEEP)), obj=st.dictionaries(st.sampled_from(NAMES), JSON))
def test_made_trimmer_keeps_what_trim_keeps(kind: str, obj: dict[str, Any]) -> None:
    """Random JSON made of the names the specs keep (and others), at every depth and with
    values of every type where an object or a list is expected."""
    assert TRIMMERS[kind](obj) == trim(obj, KEEP[kind])


# --- the page read ahead keeps the budget ----------------------------------------------------


def test_a_page_read_ahead_ends_by_the_listing_threads_budget(tmp_path: Path) -> None:
    """Every pod page answers after 0.4 s; the list runs under a 1 s budget, its own request
    deadline 10 s: a page read ahead on the other thread ends by the budget, and the error names
    it (without the budget there, each page would have its own 10 s and the list would end
    well, 2.4 s later)."""
    pods = [k.pod(f"p-{i}", "ml", 0) for i in range(12)]
    with KubeApi([k.node("gpu-0"), *pods]) as api:
        config = tmp_path / "kubeconfig"
        config.write_text(
            "apiVersion: v1\nkind: Config\ncurrent-context: emu\n"
            f"clusters:\n- name: emu\n  cluster:\n    server: {api.url}\n"
            "users:\n- name: me\n  user: {}\n"
            "contexts:\n- name: emu\n  context:\n    cluster: emu\n    user: me\n"
        )
        api.fail("GET", r"/api/v1/pods$", status=0, times=100, delay_s=0.4)
        store = KubeWatchSource(
            connect(str(config)), page_size=2, retry=RetryPolicy(attempts=1, timeout_s=10)
        )
        with pytest.raises(TimeoutError) as caught, time_budget(1.0, "the test's budget of 1 s"):
            store.sync()
    assert "did not answer before the test's budget of 1 s" in str(caught.value)


# --- a build from changes keeps the pods in the full build's order ----------------------------


@pytest.mark.parametrize("unnamespaced", [False, True])
def test_pods_added_by_events_take_their_place_in_order(unnamespaced: bool) -> None:
    """New pods (store keys before, between and after the held ones) built from the changes
    come in the order a full build gives them — also when one pod object has no namespace
    (stored as ``name``, its pod keyed ``default/name``: the keys' order is not the store's)."""
    from tests.test_store_build import apply, full_build, source

    store = source()
    for name in ("node-0", "node-1"):
        apply(store, "ADDED", {"kind": "Node", **k.node(name)})
    for name in ("b-1", "d-1", "f-1"):
        apply(store, "ADDED", {"kind": "Pod", **k.pod(name, "ml", 1, node_name="node-0")})
    if unnamespaced:
        pod = {"kind": "Pod", **k.pod("zz", "ml", 1, node_name="node-1")}
        del pod["metadata"]["namespace"]
        apply(store, "ADDED", pod)
    store.build()
    for name in ("a-1", "c-1", "e-1", "g-1"):
        apply(store, "ADDED", {"kind": "Pod", **k.pod(name, "ml", 1, node_name="node-1")})
    got, _ = store.build()
    assert store._builder.partial_builds == 1
    assert_same(got, full_build(store)[0])
    assert [p.name for p in got.pods.values()][:7] == [
        "a-1",
        "b-1",
        "c-1",
        "d-1",
        "e-1",
        "f-1",
        "g-1",
    ]
