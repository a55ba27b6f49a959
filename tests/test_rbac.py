"""Least privilege: the RBAC in deploy/ grants exactly what the Kubernetes adapter uses.

Every adapter method runs against the emulated API server; the (API group, resource, verb)
triples in its request log must all be granted by the rendered kustomize base, and every
granted triple must have been used.
"""

from __future__ import annotations

import copy
import time
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from defrag.adapters.kube import KubeActuator, KubeClusterSource, LeaseElector, RetryPolicy
from defrag.adapters.kube_owners import PLURALS, KubeOwnerLookup
from defrag.adapters.kube_watch import KubeWatchSource
from defrag.adapters.watched_cluster import WatchedCluster
from defrag.cli.run import _kube
from defrag.model.resources import OwnerRef
from defrag.settings import Settings
from tests.support.kubeapi import KubeApi, Request, running
from tests.support.kustomize import render
from tests.support.snapshots import scattered_20

ROOT = Path(__file__).resolve().parents[1]
Grant = tuple[str, str, str]  # (apiGroup, resource, verb)
FAST = RetryPolicy(attempts=1, backoff_s=0.0, timeout_s=2.0)


@pytest.fixture(scope="module")
def manifests() -> list[dict[str, Any]]:
    return render(ROOT / "deploy" / "base")


def _grants(role: dict[str, Any]) -> set[Grant]:
    return {
        (group, resource, verb)
        for rule in role.get("rules") or []
        for group in rule.get("apiGroups") or []
        for resource in rule.get("resources") or []
        for verb in rule.get("verbs") or []
    }


def _bound_roles(manifests: list[dict[str, Any]], account: tuple[str, str]) -> list[dict[str, Any]]:
    """The Roles/ClusterRoles bound to the service account ``(namespace, name)``."""
    by_ref = {
        (m["kind"], m["metadata"]["name"], m["metadata"].get("namespace", "")): m
        for m in manifests
        if m["kind"] in ("Role", "ClusterRole")
    }
    roles = []
    for binding in manifests:
        if binding["kind"] not in ("RoleBinding", "ClusterRoleBinding"):
            continue
        subjects = {
            (s.get("namespace", ""), s["name"])
            for s in binding.get("subjects") or []
            if s["kind"] == "ServiceAccount"
        }
        if account not in subjects:
            continue
        ref = binding["roleRef"]
        ns = binding["metadata"].get("namespace", "") if ref["kind"] == "Role" else ""
        roles.append(by_ref[(ref["kind"], ref["name"], ns)])
    return roles


@pytest.fixture
def api() -> Iterator[KubeApi]:
    yield from running(scattered_20()["items"])


class Clock:
    def __init__(self) -> None:
        self.t = datetime(2026, 11, 29, 12, tzinfo=UTC)

    def now(self) -> datetime:
        return self.t


def exercise_every_adapter_method(api: KubeApi, lease_namespace: str) -> None:
    KubeClusterSource(api.client(), page_size=5, retry=FAST).snapshot()  # the executor's reads
    # The cycle's cluster as the daemon wires it: listed, then every kind watched.
    watched = WatchedCluster(KubeWatchSource(api.client(), page_size=5, retry=FAST))
    try:
        watched.snapshot()
        deadline = time.monotonic() + 10
        while watched.watch.stats.watches < 4 and time.monotonic() < deadline:
            time.sleep(0.02)
    finally:
        watched.stop()
    # The actuator as the daemon wires it (defrag/cli/run.py), so its Events go where the
    # daemon's do.
    settings = Settings(
        execution={"dry_run": False}, leadership={"lease_namespace": lease_namespace}
    )
    act, _ = _kube(settings, api.client())
    assert isinstance(act, KubeActuator)
    # The daemon guards each send with its Lease (no Lease is held here): this test is about
    # which verbs the adapter uses, so every eviction is sent.
    act.send_guard = None
    act.taint_node("gpu-01", "defrag.io/draining", "p1", "NoSchedule")
    act.annotate_node("gpu-01", {"defrag.io/plan": "p1"})
    act.evict("ml", "batch-01-0-0")
    act.evict("serving", "serve-7d9f-01")  # blocked by its PDB
    act.rehearse_eviction("ml", "batch-02-0-0")  # the executor's preflight (dryRun=All)
    # the checkpoint request before an eviction (defrag/execute/checkpoint.py)
    act.annotate_pod(
        "ml", "batch-02-0-0", {"defrag.io/checkpoint-requested": "2026-11-29T12:00:00Z"}
    )
    act.event("Pod", "ml", "batch-01-0-0", "DefragEvicted", "moved")
    act.event("Node", "", "gpu-01", "DefragDraining", "plan p1")
    act.untaint_node("gpu-01", "defrag.io/draining")
    act.annotate_node("gpu-01", {"defrag.io/plan": None})
    # The owners of a plan's victims, one of each kind defrag reads (absent here: 404 is an
    # answer, not a problem).
    lookup = KubeOwnerLookup(api.client(), retry=FAST)
    for (group, kind), (version, _) in PLURALS.items():
        ref = OwnerRef(kind, "absent", True, f"{group}/{version}" if group else version)
        facts = lookup.read("ml", ref)
        assert (facts.found, facts.problem) == (False, ""), (kind, facts)
    clock = Clock()
    a = LeaseElector(api.client(), lease_namespace, "defrag", identity="a", clock=clock)
    b = LeaseElector(api.client(), lease_namespace, "defrag", identity="b", clock=clock)
    assert a.is_leader()  # create
    assert a.is_leader()  # renew (update)
    clock.t += timedelta(minutes=5)
    assert b.is_leader()  # take over (update)
    b.release()


def rbac_problems(requests: list[Request], manifests: list[dict[str, Any]]) -> list[str]:
    """What the request log needs that the service account lacks, and what it has but never used."""
    (account,) = [m for m in manifests if m["kind"] == "ServiceAccount"]
    sa = (account["metadata"]["namespace"], account["metadata"]["name"])
    roles = _bound_roles(manifests, sa)
    cluster_wide = set().union(*(_grants(r) for r in roles if r["kind"] == "ClusterRole"))
    namespaced = {r["metadata"]["namespace"]: _grants(r) for r in roles if r["kind"] == "Role"}
    problems = []
    used: set[Grant] = set()
    for request in requests:
        grant = (request.group, request.resource, request.verb)
        used.add(grant)
        if grant not in cluster_wide and grant not in namespaced.get(request.namespace, set()):
            problems.append(f"{request.method} {request.path} needs {grant}, not granted")
    unused = cluster_wide.union(*namespaced.values()) - used
    problems += [f"granted but never used: {grant}" for grant in sorted(unused)]
    return sorted(set(problems))


@pytest.fixture
def request_log(api: KubeApi, manifests: list[dict[str, Any]]) -> list[Request]:
    (account,) = [m for m in manifests if m["kind"] == "ServiceAccount"]
    exercise_every_adapter_method(api, account["metadata"]["namespace"])
    return api.requests


def test_the_adapter_uses_exactly_what_deploy_grants(
    request_log: list[Request], manifests: list[dict[str, Any]]
) -> None:
    assert rbac_problems(request_log, manifests) == []


def test_the_check_finds_a_missing_and_an_extra_grant(
    request_log: list[Request], manifests: list[dict[str, Any]]
) -> None:
    edited = copy.deepcopy(manifests)
    (role,) = [m for m in edited if m["kind"] == "ClusterRole"]
    for rule in role["rules"]:
        if rule["resources"] == ["nodes"]:
            rule["verbs"].remove("patch")
    role["rules"].append({"apiGroups": [""], "resources": ["pods"], "verbs": ["delete"]})
    assert rbac_problems(request_log, edited) == [
        "PATCH /api/v1/nodes/gpu-01 needs ('', 'nodes', 'patch'), not granted",
        "granted but never used: ('', 'pods', 'delete')",
    ]


def _may(manifests: list[dict[str, Any]], grant: Grant, namespace: str) -> bool:
    """Whether the daemon's service account may ``grant`` in ``namespace`` (cluster-wide, or by
    a Role bound in that namespace)."""
    (account,) = [m for m in manifests if m["kind"] == "ServiceAccount"]
    sa = (account["metadata"]["namespace"], account["metadata"]["name"])
    return any(
        grant in _grants(role)
        and (role["kind"] == "ClusterRole" or role["metadata"]["namespace"] == namespace)
        for role in _bound_roles(manifests, sa)
    )


def test_node_events_go_to_default_and_the_rbac_lets_them(
    api: KubeApi, request_log: list[Request], manifests: list[dict[str, Any]]
) -> None:
    """Before: node Events were written to the daemon's namespace, which the API server refuses
    (422, core/v1 Event validation: an Event about a cluster-scoped object belongs in
    ``default``), so no node ever got one. Now they are created in ``default`` and pod Events in
    the pod's namespace, and the rendered RBAC grants ``create events`` in both (a ClusterRole:
    pods live in any namespace, so no narrower grant covers them)."""
    posts = {
        (r.namespace, r.status)
        for r in request_log
        if r.resource == "events" and r.verb == "create"
    }
    assert posts == {("default", 201), ("ml", 201)}
    events = {e["involvedObject"]["kind"]: e["metadata"]["namespace"] for e in api.objects("Event")}
    assert events == {"Node": "default", "Pod": "ml"}
    for namespace in ("default", "ml", "any-other-namespace"):
        assert _may(manifests, ("", "events", "create"), namespace), namespace


def test_leases_are_granted_only_in_the_daemons_namespace(manifests: list[dict[str, Any]]) -> None:
    cluster_roles = [m for m in manifests if m["kind"] == "ClusterRole"]
    assert all(g[1] != "leases" for r in cluster_roles for g in _grants(r))
    (account,) = [m for m in manifests if m["kind"] == "ServiceAccount"]
    roles = [m for m in manifests if m["kind"] == "Role"]
    assert {r["metadata"]["namespace"] for r in roles} == {account["metadata"]["namespace"]}


def test_no_delete_of_pods_is_granted(manifests: list[dict[str, Any]]) -> None:
    # docs/daemon.md (safety): evictions only via the Eviction API.
    granted = set().union(*(_grants(m) for m in manifests if m["kind"].endswith("Role")))
    assert ("", "pods", "delete") not in granted
    assert ("", "pods/eviction", "create") in granted
