"""The extender's answer ahead of the build (``ClusterCache.ahead``): when the watched store
holds pod changes its last build lacks, the view made of that build and the changes
(``KubeWatchSource.pending`` → ``StoreBuild.ahead`` → ``view_ahead``) has the free resources the
next build has, field for field, and answers ``filter`` and ``prioritize`` byte for byte as the
view of that build made from scratch — after random watch events (tests/test_store_build.py's
objects and event strategy), under every policy kind. The changes it declines (nodes,
PriorityClasses, too many, a pod on a node not there) make the request wait for the build, as
before; taking ``pending`` changes nothing the next build starts from."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import fields

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from bench.fed_source import FedSource
from defrag.adapters.kube_watch import KubeWatchSource
from defrag.adapters.store_build import AHEAD_LIMIT
from defrag.extender.state import ClusterCache, ClusterView, make_view, view_ahead
from defrag.model.arrays import NodeArrays
from defrag.scoring.profile import ProfileConfig
from tests import test_store_build as sb
from tests.support import kubeobjects as k
from tests.test_extender_incremental import POLICIES, answers, assert_same_view, event_obj


def Fed(store: KubeWatchSource) -> FedSource:
    """A watched source over a store fed by hand, always in sync (it never lists)."""
    return FedSource(store, synced=True)


def assert_same_arrays(got: NodeArrays, want: NodeArrays) -> None:
    for f in fields(want):
        if f.name == "selector_cache":
            continue  # a cache filled on use
        a, b = getattr(got, f.name), getattr(want, f.name)
        if isinstance(b, np.ndarray):
            assert a.shape == b.shape and (a == b).all(), f.name
        else:
            assert a == b, f.name


pod_events = st.lists(
    st.tuples(
        st.just("Pod"),
        st.sampled_from(("ADDED", "MODIFIED", "DELETED")),
        st.integers(0, len(sb.PODS) - 1),
        st.sampled_from((0, 1, 2, 6, 7, 9)),  # readable variants, no slots named
        st.integers(0, 4),  # pending or on a node that is there
        st.sampled_from((0, 1, 2)),
    ),
    min_size=1,
    max_size=40,
)
"""Pod churn alone (what is answered ahead, but for a pod that does not fit)."""


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    st.one_of(sb.events, pod_events),
    st.lists(st.integers(1, 5), min_size=1, max_size=8),
    st.sampled_from(POLICIES),
)
def test_the_view_ahead_is_the_view_of_the_next_build(
    sequence: list[tuple[str, str, int, int, int, int]], cuts: list[int], policy: str
) -> None:
    """After every event, where the store answers ahead: its free resources are those of the
    store's full conversion at that moment and the view ahead answers as that cluster's view
    from scratch (between two builds each answer starts from the last one: the events pile
    up). At each cut the store builds, and its build is still the full conversion (``pending``
    changed nothing it reads)."""
    config = ProfileConfig(policy=policy, seed=3)
    store = sb.seeded()
    cluster, generation = store.build()
    view = make_view(cluster, config, 0.0, generation)
    at = 0
    for cut in [*cuts, len(sequence)]:
        for kind, what, index, variant, node, gpus in sequence[at : at + cut]:
            sb.apply(store, what, event_obj(kind, index, variant, node, gpus))
            got = store.pending()
            if got is None:
                continue
            ahead, ahead_generation = got
            assert ahead.base is view.cluster
            assert ahead_generation == store.generation()
            want, _dropped = sb.full_build(store)
            assert_same_arrays(ahead.arrays, want.arrays)
            made = view_ahead(view, ahead, ahead_generation, config, 0.0)
            assert_same_view(made, make_view(want, config, 0.0, ahead_generation))
        at += cut
        cluster, generation = store.build()
        sb.assert_same(cluster, sb.full_build(store)[0])
        view = make_view(cluster, config, 0.0, generation, previous=view)
        if at >= len(sequence):
            break


def bind(store: KubeWatchSource, name: str, node: int, gpus: int = 1, variant: int = 0) -> None:
    """A pod of ``gpus`` created pending, then bound to node ``node`` (1-based; 0: none)."""
    sb.apply(store, "ADDED", sb.pod_obj(name, variant, 0, gpus))
    sb.apply(store, "MODIFIED", sb.pod_obj(name, variant, node, gpus))


@pytest.mark.parametrize("policy", POLICIES)
def test_pod_churn_is_answered_ahead_every_time(policy: str) -> None:
    """The usual changes — pods created, bound (on whole GPUs and shares), deleted, finished —
    are all answered ahead, each as the next build."""
    config = ProfileConfig(policy=policy, seed=3)
    store = sb.seeded()
    cluster, generation = store.build()
    view = make_view(cluster, config, 0.0, generation)
    steps: list[Callable[[], None]] = [
        lambda: bind(store, "p-10", 1),
        lambda: bind(store, "p-11", 2, variant=1),  # a share of one GPU
        lambda: bind(store, "p-12", 3, 2, variant=2),  # a share sized by GPU memory
        lambda: sb.apply(store, "ADDED", sb.pod_obj("p-13", 0, 0, 4)),  # pending only
        lambda: sb.apply(store, "DELETED", sb.pod_obj(sb.PODS[0], 0, 1, 2)),
        lambda: sb.apply(store, "MODIFIED", sb.pod_obj(sb.PODS[3], 6, 2, 2)),  # finished
        lambda: (bind(store, "p-14", 4, 2), bind(store, "p-15", 4, 1)),  # two on one node
    ]
    for step in steps:
        step()
        got = store.pending()
        assert got is not None
        made = view_ahead(view, got[0], got[1], config, 0.0)
        cluster, generation = store.build()
        assert_same_arrays(got[0].arrays, cluster.arrays)
        assert_same_view(made, make_view(cluster, config, 0.0, generation))
        view = make_view(cluster, config, 0.0, generation, previous=view)


def test_pending_pods_share_the_last_builds_arrays() -> None:
    """Pods created pending touch no node: the view ahead reads the last build's own arrays."""
    store = sb.seeded()
    cluster, _ = store.build()
    sb.apply(store, "ADDED", sb.pod_obj("p-10", 0, 0, 2))
    got = store.pending()
    assert got is not None and got[0].arrays is cluster.arrays


@pytest.mark.parametrize(
    ("event", "why"),
    [
        (("MODIFIED", sb.node_obj("node-1", 4)), "a node changed"),
        (("ADDED", k.priority_class("pc-1", 5)), "a PriorityClass resolves every pod's priority"),
        (("ADDED", sb.pod_obj("p-10", 0, 5, 1)), "a pod bound to a node not there"),
        (("ADDED", sb.pod_obj("p-10", 8, 1, 1)), "an unreadable pod hides its node's usage"),
        (("ADDED", sb.pod_obj("p-10", 0, 1, 8)), "a pod that does not fit its node"),
    ],
)
def test_what_only_a_build_can_say_is_not_answered_ahead(
    event: tuple[str, dict[str, object]], why: str
) -> None:
    store = sb.seeded()
    store.build()
    sb.apply(store, *event)
    assert store.pending() is None, why


def test_too_many_changes_are_not_answered_ahead() -> None:
    store = sb.seeded()
    store.build()
    for i in range(AHEAD_LIMIT + 1):
        sb.apply(store, "ADDED", sb.pod_obj(f"p-{100 + i}", 0, 0, 1))
    assert store.pending() is None
    store.build()
    sb.apply(store, "ADDED", sb.pod_obj("p-99", 0, 0, 1))
    assert store.pending() is not None


def test_no_answer_ahead_while_a_build_is_under_way() -> None:
    store = sb.seeded()
    store.build()
    bind(store, "p-10", 1)
    with store._build_lock:  # a build under way holds it
        assert store.pending() is None
    assert store.pending() is not None


def test_a_request_is_answered_ahead_without_a_build() -> None:
    """Through the cache, as the extender asks (no builder thread: nothing is built unless
    asked): a binding is answered ahead, as the build would answer, without building; a node's
    change is not: the request waits for a build (here none comes: after ``fresh_wait_s`` it
    gets the last view built), and the next build has it."""
    store = sb.seeded()
    cache = ClusterCache(Fed(store), ProfileConfig(), fresh_wait_s=0.2)
    hows: list[str] = []
    cache.on_fresh = hows.append
    assert cache.refresh().ok
    first = cache.view()
    assert first is not None and first.ahead is None
    builds = store._builder.partial_builds + store._builder.full_builds
    bind(store, "p-10", 2, 2)
    view = cache.view()
    assert view is not None and view.ahead is not None
    assert view.generation == store.generation()
    assert cache.latest() is view  # prioritize reads the same view, not the one built
    assert cache.view() is view  # kept until the next change
    assert store._builder.partial_builds + store._builder.full_builds == builds
    assert answers(view) == answers(make_view(sb.full_build(store)[0], ProfileConfig(), 0.0))
    sb.apply(store, "MODIFIED", sb.node_obj("node-2", 4))  # cordoned: a node changed
    waited = cache.view()
    assert waited is first  # no build came
    assert hows == ["current", "ahead", "ahead", "waited"]
    assert cache.refresh().ok
    built = cache.view()
    assert built is not None and built.ahead is None
    assert built.generation == store.generation()
    assert hows[-1] == "current"


def test_a_view_ahead_is_never_carried_into_the_next_build() -> None:
    """The view kept (and carried from by the next build) is always a built one."""
    store = sb.seeded()
    cache = ClusterCache(Fed(store), ProfileConfig(policy="fgd"))
    assert cache.refresh().ok
    bind(store, "p-10", 1, 4)
    ahead = cache.view()
    assert isinstance(ahead, ClusterView) and ahead.ahead is not None
    assert cache.refresh().ok
    built = cache._view
    assert built is not None and built.ahead is None
    assert built.generation == ahead.generation
    assert_same_view(ahead, built)
