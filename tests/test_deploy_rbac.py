"""Least privilege for the extender and the node agent: each ClusterRole in
deploy/components grants exactly the API calls that component makes (the daemon's own role is
checked by tests/test_rbac.py)."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from defrag.adapters.kube import KubeActuator, RetryPolicy
from defrag.adapters.nvml import NvmlInventory
from defrag.agent.service import Agent
from tests.support.kubeapi import KubeApi, running
from tests.support.kustomize import render
from tests.support.snapshots import scattered_20
from tests.test_agent import FakeNvml, two_islands

ROOT = Path(__file__).resolve().parents[1]
FAST = RetryPolicy(attempts=1, backoff_s=0.0, timeout_s=2.0)
Grant = tuple[str, str, str]


def component_role(name: str, account: str, only_binding: bool) -> set[Grant]:
    """The grants of ClusterRole ``name``, bound by the ClusterRoleBinding of that name to the
    service account ``account`` only; with ``only_binding``, nothing else binds the account."""
    docs = render(ROOT / "deploy" / "overlays" / "dry-run")
    (binding,) = [
        d for d in docs if d["kind"] == "ClusterRoleBinding" and d["metadata"]["name"] == name
    ]
    assert binding["subjects"] == [
        {"kind": "ServiceAccount", "name": account, "namespace": "defrag-system"}
    ]
    (role,) = [
        d
        for d in docs
        if d["kind"] == "ClusterRole" and d["metadata"]["name"] == binding["roleRef"]["name"]
    ]
    others = [
        d
        for d in docs
        if d["kind"] in ("RoleBinding", "ClusterRoleBinding")
        and d is not binding
        and _binds(d, account)
    ]
    if only_binding:
        assert not others
    return {
        (g, r, v)
        for rule in role["rules"]
        for g in rule["apiGroups"]
        for r in rule["resources"]
        for v in rule["verbs"]
    }


def _binds(binding: dict[str, Any], account: str) -> bool:
    return any(s.get("name") == account for s in binding.get("subjects") or [])


@pytest.fixture
def api() -> Iterator[KubeApi]:
    yield from running(scattered_20()["items"])


def used(api: KubeApi) -> set[Grant]:
    return {(r.group, r.resource, r.verb) for r in api.requests}


def test_extender_role_is_exactly_what_its_list_and_watch_use(api: KubeApi) -> None:
    # The extender container shares the pod (and account) of the second kube-scheduler, whose
    # own bindings tests/test_deploy_scheduler.py checks; this role is the extender's part.
    from defrag.adapters.kube_watch import KubeWatchSource

    source = KubeWatchSource(api.client(), page_size=5, retry=FAST, watch_timeout_s=1)
    source.start(lambda: None)
    try:
        deadline = time.monotonic() + 10
        while source.stats.watches < 4 and time.monotonic() < deadline:
            time.sleep(0.02)
    finally:
        source.stop()
    assert used(api) == component_role("defrag-extender", "defrag-scheduler", only_binding=False)


def test_agent_role_is_exactly_what_publishing_uses(api: KubeApi) -> None:
    node = api.objects("Node")[0]["metadata"]["name"]
    actuator = KubeActuator(api.client(), retry=FAST)
    Agent(node, NvmlInventory(FakeNvml(two_islands())), actuator).sync_once()
    role = component_role("defrag-agent", "defrag-agent", only_binding=True)
    assert used(api) == role == {("", "nodes", "patch")}


def test_each_lease_role_names_the_lease_its_account_elects_on() -> None:
    """The daemon's and the second scheduler's Roles read and renew one Lease by name only (no
    other Lease can be read or taken over; creating cannot be limited by name, the admission
    policy defrag-own-lease does that): the names are the daemon's ``leadership.lease_name`` and the
    scheduler's ``leaderElection.resourceName``, and each is its account's name, as the policy
    assumes."""
    docs = render(ROOT / "deploy" / "overlays" / "enforce")
    settings = yaml.safe_load((ROOT / "deploy" / "base" / "settings.yaml").read_text())
    config = yaml.safe_load(
        (ROOT / "deploy" / "components" / "extender" / "kube-scheduler-config.yaml").read_text()
    )
    elects = {
        "defrag-leader-election": settings["leadership"]["lease_name"],
        "defrag-scheduler-leader-election": config["leaderElection"]["resourceName"],
    }
    for role_name, lease in elects.items():
        (role,) = [d for d in docs if d["kind"] == "Role" and d["metadata"]["name"] == role_name]
        (binding,) = [
            d for d in docs if d["kind"] == "RoleBinding" and d["metadata"]["name"] == role_name
        ]
        (account,) = [s["name"] for s in binding["subjects"]]
        assert lease == account, role_name
        by_verb = {
            verb: rule.get("resourceNames")
            for rule in role["rules"]
            if rule["resources"] == ["leases"]
            for verb in rule["verbs"]
        }
        assert by_verb == {"create": None, "get": [lease], "update": [lease]}, role_name
