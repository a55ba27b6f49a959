"""Red team: what defrag's ServiceAccounts can do beyond their job, on the real API server.

RBAC grants a verb on a whole object: with ``patch`` on pods and nodes the daemon's
ServiceAccount ``defrag`` could change a running pod's image, relabel a pod out of its
ReplicaSet and PDB, set a controlling ownerReference to an owner that does not exist (the
garbage collector then deletes the pod, or a whole Node, without the delete verb), taint a node
``NoExecute``, remove another owner's taint, cordon a node or change its GPU labels. The
admission policies of ``deploy/base/admission-policy.yaml`` and the agent's
(``deploy/components/agent/admission-policy.yaml``) close each of those side doors, and the
Lease policy with the daemon's name-limited Role keeps each account to its own Lease.

Every side door below is a request made with a real ServiceAccount token (the agent's bound to
its pod, as the DaemonSet gets it), with the RBAC and policies as the ``enforce`` overlay renders
them, and must be refused with 403 by RBAC or by the named policy with its own message. The
positive controls are defrag's own code (``KubeActuator``, ``LeaseElector``) doing its job
through the same policies; the negative control takes the policy bindings away and shows every
side door the policies close is open with RBAC alone (each request then a dry run).

``test_the_documented_permissions_are_the_api_servers`` asks the API server, as each
ServiceAccount, for a SelfSubjectRulesReview and prints it as
``kubectl auth can-i --list`` does: docs/kubernetes.md, "Permissions and admission", holds that
output.
"""

from __future__ import annotations

import copy
import json
import re
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
import requests
import yaml

from defrag.adapters.kube import KubeActuator, LeaseElector, connect
from defrag.execute.checkpoint import (
    CHECKPOINT_DEADLINE_ANNOTATION,
    CHECKPOINT_REQUESTED_ANNOTATION,
)
from defrag.execute.journal import DRAIN_EFFECT, PLAN_ANNOTATION, STARTED_ANNOTATION
from defrag.execute.reservation import RESERVED_AT_ANNOTATION
from defrag.model.resources import DRAIN_TAINT_KEY, RESERVED_FOR_ANNOTATION
from tests.e2e import cluster as c
from tests.e2e.controlplane import ControlPlane, Rest, wait_for
from tests.e2e.kubelet import add_node
from tests.e2e.test_agent_admission import make_agent_pod

ROOT = Path(__file__).resolve().parents[2]
NS = "defrag-system"
WORK = "least-privilege"
NODE = "lp-gpu-1"
AGENT_NODE = "lp-agent-1"
DAEMON, SCHEDULER, AGENT = "defrag", "defrag-scheduler", "defrag-agent"
# The daemon's Lease is named by leadership.lease_name of the shipped settings.
DAEMON_LEASE = yaml.safe_load((ROOT / "deploy" / "base" / "settings.yaml").read_text())[
    "leadership"
]["lease_name"]
SCHEDULER_LEASE = "defrag-scheduler"
OTHER_TAINT = {"key": "nvidia.com/gpu", "value": "present", "effect": "NoSchedule"}
GHOST = {
    "apiVersion": "apps/v1",
    "kind": "ReplicaSet",
    "name": "ghost",
    "uid": "00000000-0000-0000-0000-000000000001",
    "controller": True,
    "blockOwnerDeletion": True,
}
NODE_GHOST = {**GHOST, "apiVersion": "v1", "kind": "Node", "name": "ghost-node"}
PAUSE_OLD = "registry.k8s.io/pause:3.9"
LEASES = "/apis/coordination.k8s.io/v1/namespaces/{ns}/leases"

POD_POLICY, NODE_POLICY = "defrag-daemon-pod-writes", "defrag-daemon-node-writes"
LEASE_POLICY, AGENT_POLICY = "defrag-own-lease", "defrag-agent-own-node"
POD_ANNOTATIONS = (
    "the defrag daemon may change only the annotations defrag.io/checkpoint-requested and "
    "defrag.io/checkpoint-deadline of a pod"
)
POD_METADATA = "the defrag daemon may not change a pod's labels, ownerReferences or finalizers"
POD_SPEC = "the defrag daemon may not change a pod's spec"
NODE_ANNOTATIONS = "the defrag daemon may change only its own defrag.io/ annotations of a node"
NODE_METADATA = "the defrag daemon may not change a node's labels, ownerReferences or finalizers"
NODE_TAINTS = (
    "the defrag daemon may add or remove only its own taint, defrag.io/draining:NoSchedule"
)
NODE_SPEC = "the defrag daemon may not cordon a node or change its spec beyond its own taint"
OWN_LEASE = (
    "a defrag ServiceAccount may write only its own Lease (defrag, defrag-scheduler) in its own "
    "namespace"
)
AGENT_METADATA = "the defrag agent may not change a node's ownerReferences or finalizers"
PATCH_TYPES = {
    "merge": "application/merge-patch+json",
    "strategic": "application/strategic-merge-patch+json",
}


@dataclass
class World:
    plane: ControlPlane
    accounts: dict[str, Rest]  # the ServiceAccounts' clients (the agent's token pod-bound)
    pod: str  # a pod of the ReplicaSet "web" in WORK
    policies: list[dict[str, Any]]  # the policies and bindings, as rendered


def lease(name: str, ns: str = NS, **annotations: str) -> dict[str, Any]:
    return {
        "apiVersion": "coordination.k8s.io/v1",
        "kind": "Lease",
        "metadata": {"name": name, "namespace": ns, "annotations": annotations},
        "spec": {"holderIdentity": "red-team", "leaseDurationSeconds": 15},
    }


def send(
    api: Rest,
    method: str,
    path: str,
    body: dict[str, Any] | None = None,
    patch: str = "merge",
    dry_run: bool = False,
) -> requests.Response:
    """One raw request: GET, POST/PUT of ``body``, PATCH (``patch``: its type), or DELETE."""
    params = {"dryRun": "All"} if dry_run else {}
    headers = {"Content-Type": PATCH_TYPES[patch] if method == "PATCH" else "application/json"}
    data = json.dumps(body) if body is not None else None
    return api.session.request(
        method, api.url(path), data=data, params=params, headers=headers, timeout=30
    )


# --- the side doors -------------------------------------------------------------------------


@dataclass
class Door:
    """A side door: ``account`` sends ``request(world)`` (method, path, body, patch type); it
    must be refused by ``policy`` with ``message`` (``policy`` None: by RBAC)."""

    door: str
    account: str
    request: Callable[[World], tuple[str, str, dict[str, Any] | None, str]]
    policy: str | None
    message: str


def pod_path(world: World) -> str:
    return f"/api/v1/namespaces/{WORK}/pods/{world.pod}"


def node_path(node: str = NODE) -> str:
    return f"/api/v1/nodes/{node}"


def pod_patch(body: dict[str, Any], kind: str = "merge") -> Callable[[World], Any]:
    return lambda w: ("PATCH", pod_path(w), body, kind)


def node_patch(body: dict[str, Any], node: str = NODE) -> Callable[[World], Any]:
    return lambda w: ("PATCH", node_path(node), body, "merge")


def taints(
    change: Callable[[list[dict[str, Any]]], list[dict[str, Any]]],
) -> Callable[[World], Any]:
    """A merge patch of the node's whole taint list, as read now and changed (taints have no
    merge key: a list is replaced whole, as KubeActuator._update_taints sends it)."""

    def request(w: World) -> Any:
        now = w.plane.admin.get(node_path())["spec"].get("taints", [])
        return ("PATCH", node_path(), {"spec": {"taints": change(now)}}, "merge")

    return request


def scheduler_lease_put(w: World) -> Any:
    held = w.plane.admin.get(f"{LEASES.format(ns=NS)}/{SCHEDULER_LEASE}")
    held["spec"]["holderIdentity"] = "defrag-daemon"
    return ("PUT", f"{LEASES.format(ns=NS)}/{SCHEDULER_LEASE}", held, "merge")


DOORS = [
    Door("pod image changed", DAEMON,
         pod_patch({"spec": {"containers": [{"name": "main", "image": PAUSE_OLD}]}}, "strategic"),
         POD_POLICY, POD_SPEC),
    Door("pod relabelled out of its ReplicaSet", DAEMON,
         pod_patch({"metadata": {"labels": {"app": "elsewhere"}}}), POD_POLICY, POD_METADATA),
    Door("pod given a ghost controlling ownerReference (the GC would delete it)", DAEMON,
         pod_patch({"metadata": {"ownerReferences": [GHOST]}}), POD_POLICY, POD_METADATA),
    Door("pod given a finalizer", DAEMON,
         pod_patch({"metadata": {"finalizers": ["example.com/hold"]}}), POD_POLICY, POD_METADATA),
    Door("pod annotation other than the checkpoint request", DAEMON,
         pod_patch({"metadata": {"annotations": {"defrag.io/evictable": "true"}}}),
         POD_POLICY, POD_ANNOTATIONS),
    Door("node tainted NoExecute", DAEMON,
         taints(lambda t: [*t, {"key": "example.com/out", "effect": "NoExecute"}]),
         NODE_POLICY, NODE_TAINTS),
    Door("node given defrag's taint with NoExecute", DAEMON,
         taints(lambda t: [*t, {"key": DRAIN_TAINT_KEY, "value": "p", "effect": "NoExecute"}]),
         NODE_POLICY, NODE_TAINTS),
    Door("another owner's taint removed", DAEMON,
         taints(lambda t: [x for x in t if x["key"] != OTHER_TAINT["key"]]),
         NODE_POLICY, NODE_TAINTS),
    Door("node cordoned (spec.unschedulable)", DAEMON,
         node_patch({"spec": {"unschedulable": True}}), NODE_POLICY, NODE_SPEC),
    Door("node GPU label changed", DAEMON,
         node_patch({"metadata": {"labels": {"nvidia.com/gpu.product": "NVIDIA-H200"}}}),
         NODE_POLICY, NODE_METADATA),
    Door("node given a ghost controlling ownerReference (the GC would delete it)", DAEMON,
         node_patch({"metadata": {"ownerReferences": [NODE_GHOST]}}),
         NODE_POLICY, NODE_METADATA),
    Door("node given a finalizer", DAEMON,
         node_patch({"metadata": {"finalizers": ["example.com/hold"]}}),
         NODE_POLICY, NODE_METADATA),
    Door("node annotation not defrag's", DAEMON,
         node_patch({"metadata": {"annotations": {"example.com/owner": "defrag"}}}),
         NODE_POLICY, NODE_ANNOTATIONS),
    Door("the agent's NVLink annotation written by the daemon", DAEMON,
         node_patch({"metadata": {"annotations": {"defrag.io/nvlink-domains": "0-7"}}}),
         NODE_POLICY, NODE_ANNOTATIONS),
    Door("the scheduler's Lease read by the daemon", DAEMON,
         lambda w: ("GET", f"{LEASES.format(ns=NS)}/{SCHEDULER_LEASE}", None, "merge"),
         None, 'cannot get resource "leases"'),
    Door("the scheduler's Lease taken over by the daemon", DAEMON, scheduler_lease_put,
         None, 'cannot update resource "leases"'),
    Door("the scheduler's Lease deleted by the daemon", DAEMON,
         lambda w: ("DELETE", f"{LEASES.format(ns=NS)}/{SCHEDULER_LEASE}", None, "merge"),
         None, 'cannot delete resource "leases"'),
    Door("another Lease created by the daemon", DAEMON,
         lambda w: ("POST", LEASES.format(ns=NS), lease("kube-scheduler"), "merge"),
         LEASE_POLICY, OWN_LEASE),
    Door("the daemon's Lease created by the scheduler", SCHEDULER,
         lambda w: ("POST", LEASES.format(ns=NS), lease(DAEMON_LEASE), "merge"),
         LEASE_POLICY, OWN_LEASE),
    Door("a Lease of kube-system created by the scheduler (system:kube-scheduler may)", SCHEDULER,
         lambda w: ("POST", LEASES.format(ns="kube-system"), lease(SCHEDULER_LEASE, "kube-system"),
                    "merge"),
         LEASE_POLICY, OWN_LEASE),
    Door("the agent's own Node given a finalizer", AGENT,
         node_patch({"metadata": {"finalizers": ["example.com/hold"]}}, AGENT_NODE),
         AGENT_POLICY, AGENT_METADATA),
    Door("the agent's own Node given a ghost controlling ownerReference", AGENT,
         node_patch({"metadata": {"ownerReferences": [NODE_GHOST]}},
                    AGENT_NODE),
         AGENT_POLICY, AGENT_METADATA),
]  # fmt: skip


def probes() -> list[Door]:
    """One side door per policy: all refused with their messages once the policies are in
    force."""
    policies = (POD_POLICY, NODE_POLICY, LEASE_POLICY, AGENT_POLICY)
    return [next(d for d in DOORS if d.policy == p) for p in policies]


def admitted(response: requests.Response) -> bool:
    """Admission let the request through: it succeeded, or storage refused a create of a name
    that exists (after admission)."""
    if response.status_code in (200, 201):
        return True
    return response.status_code == 409 and response.json().get("reason") == "AlreadyExists"


def answer(world: World, door: Door, dry_run: bool = False) -> requests.Response:
    method, path, body, kind = door.request(world)
    return send(world.accounts[door.account], method, path, body, kind, dry_run)


def refused_by(world: World, door: Door, response: requests.Response) -> bool:
    if response.status_code != 403:
        return False
    message = str(response.json().get("message", ""))
    if door.policy is not None and f"ValidatingAdmissionPolicy '{door.policy}'" not in message:
        return False
    return door.message in message


def wait_in_force(world: World) -> None:
    """Until each policy refuses its probe (the admission plugin loads a policy and its binding
    a moment after they are written; until then RBAC alone decides)."""
    for door in probes():
        wait_for(
            f"{door.policy} in force",
            lambda door=door: refused_by(world, door, answer(world, door, dry_run=True)),
            30,
        )


def apply_policies(world: World) -> None:
    c.apply_all(world.plane.admin, world.policies)
    wait_in_force(world)


@pytest.fixture(scope="module")
def world(plane: ControlPlane) -> World:
    """The policies as the enforce overlay renders them (RBAC: the plane fixture's), a GPU node
    with another owner's taint, a ReplicaSet's pods, the scheduler's Lease (written by the
    scheduler's account), and an agent pod on its own node for the agent's pod-bound token."""
    admin = plane.admin
    rendered = c.render("enforce")
    policies = [o for o in rendered if o["apiVersion"].startswith("admissionregistration")]
    policies.sort(key=lambda o: o["kind"])  # each policy before the bindings
    assert {o["metadata"]["name"] for o in policies} == {
        POD_POLICY,
        NODE_POLICY,
        LEASE_POLICY,
        AGENT_POLICY,
    }
    add_node(admin, NODE, 8, taints=[OTHER_TAINT])
    add_node(admin, AGENT_NODE, 8)
    c.namespace(admin, WORK)
    labels = {"app": "web"}
    admin.post(
        f"/apis/apps/v1/namespaces/{WORK}/replicasets",
        {
            "apiVersion": "apps/v1",
            "kind": "ReplicaSet",
            "metadata": {"name": "web", "namespace": WORK},
            "spec": {
                "replicas": 2,
                "selector": {"matchLabels": labels},
                "template": {"metadata": {"labels": labels}, "spec": c.pod_spec(0)},
            },
        },
    )
    pods = c.wait_pods(admin, WORK, "app=web", lambda ps: len(ps) == 2, 30)
    agent_pod = make_agent_pod(admin, rendered, "lp-agent", AGENT_NODE)
    accounts = {
        DAEMON: plane.as_service_account(NS, DAEMON),
        SCHEDULER: plane.as_service_account(NS, SCHEDULER),
        AGENT: plane.as_service_account(NS, AGENT, bound_pod=agent_pod),
    }
    world = World(plane, accounts, pods[0]["metadata"]["name"], policies)
    apply_policies(world)
    # The scheduler's own Lease, created by its own account: the policy lets it.
    created = send(accounts[SCHEDULER], "POST", LEASES.format(ns=NS), lease(SCHEDULER_LEASE))
    assert created.status_code == 201, created.text
    for policy in policies:
        if policy["kind"] == "ValidatingAdmissionPolicy":
            status = admin.get(admin.object_path(policy)).get("status", {})
            warnings = status.get("typeChecking", {}).get("expressionWarnings", [])
            assert warnings == [], (policy["metadata"]["name"], warnings)
    return world


@pytest.mark.parametrize("door", DOORS, ids=[d.door for d in DOORS])
def test_the_side_door_is_closed(world: World, door: Door) -> None:
    """Each side door (its id names it) is refused with 403 by RBAC or by the named policy,
    with that policy's own message, and the object is left as it was."""
    method, path, _, _ = door.request(world)
    before = world.plane.admin.session.get(world.plane.admin.url(path), timeout=30)
    response = answer(world, door)
    assert response.status_code == 403, response.text
    message = response.json()["message"]
    if door.policy is not None:
        assert f"ValidatingAdmissionPolicy '{door.policy}'" in message, message
    assert door.message in message, message
    after = world.plane.admin.session.get(world.plane.admin.url(path), timeout=30)
    assert after.status_code == before.status_code
    if before.ok and method != "POST":
        version = before.json()["metadata"]["resourceVersion"]
        assert after.json()["metadata"]["resourceVersion"] == version


def test_the_agent_still_publishes_its_nvlink_annotation(world: World) -> None:
    """Positive control of the agent's narrowed policy: its one annotation passes."""
    body = {"metadata": {"annotations": {"defrag.io/nvlink-domains": "0-3,4-7"}}}
    response = send(world.accounts[AGENT], "PATCH", node_path(AGENT_NODE), body, "strategic")
    assert response.status_code == 200, response.text


# --- positive controls: defrag's own writes pass --------------------------------------------


@pytest.fixture(scope="module")
def actuator(world: World) -> KubeActuator:
    return KubeActuator(connect(str(world.plane.service_account_kubeconfig(NS, DAEMON))))


def test_the_daemon_reserves_a_node(world: World, actuator: KubeActuator) -> None:
    """Positive control: the reservation annotations (defrag.io/reserved-for, reserved-at),
    written and removed as the executor does, pass the node policy."""
    stamp = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    notes = {RESERVED_FOR_ANNOTATION: f"{WORK}/waiting", RESERVED_AT_ANNOTATION: stamp}
    actuator.annotate_node(NODE, notes)
    held = world.plane.admin.get(node_path())["metadata"]["annotations"]
    assert {k: held.get(k) for k in notes} == notes
    actuator.annotate_node(NODE, dict.fromkeys(notes))
    held = world.plane.admin.get(node_path())["metadata"]["annotations"]
    assert not set(notes) & set(held)


def test_the_daemon_drains_and_releases_a_node(world: World, actuator: KubeActuator) -> None:
    """Positive control: the drain taint defrag.io/draining:NoSchedule and the drain journal
    added, then removed, as the executor does; the other owner's taint stays."""
    actuator.taint_node(NODE, DRAIN_TAINT_KEY, "plan-1", DRAIN_EFFECT)
    actuator.annotate_node(NODE, {PLAN_ANNOTATION: "plan-1", STARTED_ANNOTATION: "now"})
    node = world.plane.admin.get(node_path())
    assert node["spec"]["taints"] == [
        OTHER_TAINT,
        {"key": DRAIN_TAINT_KEY, "value": "plan-1", "effect": DRAIN_EFFECT},
    ]
    assert node["metadata"]["annotations"][PLAN_ANNOTATION] == "plan-1"
    actuator.untaint_node(NODE, DRAIN_TAINT_KEY)
    actuator.annotate_node(NODE, {PLAN_ANNOTATION: None, STARTED_ANNOTATION: None})
    node = world.plane.admin.get(node_path())
    assert node["spec"]["taints"] == [OTHER_TAINT]
    assert PLAN_ANNOTATION not in node["metadata"]["annotations"]


def test_the_daemon_asks_a_pod_to_checkpoint(world: World, actuator: KubeActuator) -> None:
    """Positive control: the checkpoint request written and withdrawn (annotate_pod)."""
    notes = {
        CHECKPOINT_REQUESTED_ANNOTATION: "2026-11-29T12:00:00Z",
        CHECKPOINT_DEADLINE_ANNOTATION: "2026-11-29T12:05:00Z",
    }
    actuator.annotate_pod(WORK, world.pod, notes)
    held = world.plane.admin.get(pod_path(world))["metadata"]["annotations"]
    assert {k: held.get(k) for k in notes} == notes
    actuator.annotate_pod(WORK, world.pod, dict.fromkeys(notes))
    held = world.plane.admin.get(pod_path(world))["metadata"].get("annotations") or {}
    assert not set(notes) & set(held)


def test_the_daemon_holds_its_own_lease(world: World) -> None:
    """Positive control: LeaseElector creates and renews the daemon's Lease (its name from the
    shipped settings) with the daemon's RBAC, and an annotation on it (the window's spend is
    recorded there) is the daemon's to write."""
    api = connect(str(world.plane.service_account_kubeconfig(NS, DAEMON)))
    elector = LeaseElector(api, NS, DAEMON_LEASE, identity="defrag-a")
    assert elector.is_leader(), elector.last  # created
    assert elector.is_leader(), elector.last  # renewed
    path = f"{LEASES.format(ns=NS)}/{DAEMON_LEASE}"
    daemon = world.accounts[DAEMON]
    held = daemon.get(path)
    held["metadata"].setdefault("annotations", {})["defrag.io/window-spend"] = '{"evictions": 1}'
    response = send(daemon, "PUT", path, held)
    assert response.status_code == 200, response.text
    elector.release()
    assert world.plane.admin.get(path)["metadata"]["annotations"]["defrag.io/window-spend"]


def test_the_daemon_evicts_a_replicaset_pod(world: World, actuator: KubeActuator) -> None:
    """Positive control: the Eviction API (pods/eviction CREATE) is not narrowed."""
    pods = c.pods(world.plane.admin, WORK, "app=web")
    victim = next(p["metadata"]["name"] for p in pods if p["metadata"]["name"] != world.pod)
    result = actuator.evict(WORK, victim)
    assert result.outcome == "evicted", result


# --- the negative control: RBAC alone leaves them open ----------------------------------------


def test_without_the_policies_rbac_alone_leaves_the_side_doors_open(world: World) -> None:
    """Negative control: with the policy bindings deleted, every side door a policy closes is
    admitted (as a dry run, so nothing changes); the ones RBAC closes stay closed. The policies
    are then bound again."""
    admin = world.plane.admin
    bindings = [o for o in world.policies if o["kind"] == "ValidatingAdmissionPolicyBinding"]
    try:
        for binding in bindings:
            gone = admin.delete(admin.object_path(binding))
            assert gone.status_code == 200, gone.text

        def all_open() -> bool:
            return all(admitted(answer(world, d, dry_run=True)) for d in probes())

        wait_for("the policies out of force", all_open, 30)
        for door in DOORS:
            response = answer(world, door, dry_run=True)
            if door.policy is None:
                assert refused_by(world, door, response), (door.door, response.text)
            else:
                assert admitted(response), (door.door, response.text)
    finally:
        apply_policies(world)


# --- kubectl auth can-i --list, from the API server -----------------------------------------


def _rule_key(rule: dict[str, Any]) -> str:
    """rbac/v1 PolicyRule's String() (gogo protobuf), which kubectl sorts its rows by."""

    def f(key: str) -> str:
        return "[" + " ".join(rule.get(key) or []) + "]"

    return (
        f"&PolicyRule{{Verbs:{f('verbs')},APIGroups:{f('apiGroups')},"
        f"Resources:{f('resources')},ResourceNames:{f('resourceNames')},"
        f"NonResourceURLs:{f('nonResourceURLs')},}}"
    )


def can_i_list(api: Rest, namespace: str) -> str:
    """``kubectl auth can-i --list -n namespace`` for the caller: a SelfSubjectRulesReview,
    each rule broken down and compacted and sorted, printed in kubectl's tab-aligned table, as
    kubectl (staging/src/k8s.io/kubectl/pkg/cmd/auth/cani.go: printStatus, with
    k8s.io/component-helpers/auth/rbac BreakdownRule, CompactRules, SortableRuleSlice and
    CombineResourceGroup) prints it."""
    review = api.post(
        "/apis/authorization.k8s.io/v1/selfsubjectrulesreviews",
        {
            "apiVersion": "authorization.k8s.io/v1",
            "kind": "SelfSubjectRulesReview",
            "spec": {"namespace": namespace},
        },
    )["status"]
    assert not review.get("incomplete"), review
    broken: list[dict[str, Any]] = []
    for rule in review.get("resourceRules", []):
        for group in rule.get("apiGroups") or []:
            for resource in rule.get("resources") or []:
                for name in rule.get("resourceNames") or [None]:
                    sub = {"apiGroups": [group], "resources": [resource], "verbs": rule["verbs"]}
                    if name is not None:
                        sub["resourceNames"] = [name]
                    broken.append(sub)
    for rule in review.get("nonResourceRules", []):
        for url in rule.get("nonResourceURLs") or []:
            broken.append({"nonResourceURLs": [url], "verbs": rule["verbs"]})
    compact: list[dict[str, Any]] = []
    simple: dict[tuple[str, str, str], dict[str, Any]] = {}
    for rule in broken:
        names = rule.get("resourceNames") or []
        if "resources" in rule and len(names) <= 1:
            key = (rule["apiGroups"][0], rule["resources"][0], names[0] if names else "")
            if key in simple:
                simple[key]["verbs"] = [*simple[key]["verbs"], *rule["verbs"]]
            else:
                simple[key] = copy.deepcopy(rule)
                compact.append(simple[key])
        else:
            compact.append(rule)
    compact.sort(key=_rule_key)
    rows = [["Resources", "Non-Resource URLs", "Resource Names", "Verbs"]]
    for rule in compact:
        resources = rule.get("resources") or []
        combined = ""
        if resources:
            head, _, sub = resources[0].partition("/")
            group = rule["apiGroups"][0]
            combined = head + (f".{group}" if group else "") + (f"/{sub}" if sub else "")
        rows.append(
            [
                combined,
                "[" + " ".join(rule.get("nonResourceURLs") or []) + "]",
                "[" + " ".join(rule.get("resourceNames") or []) + "]",
                "[" + " ".join(rule["verbs"]) + "]",
            ]
        )
    # text/tabwriter as kubectl's printers.GetNewTabWriter sets it: minwidth 10, padding 3; the
    # last cell of a line is not a column.
    widths = [max(10, max(len(r[i]) for r in rows) + 3) for i in range(3)]
    return "\n".join(
        "".join(cell.ljust(w) for cell, w in zip(r[:3], widths, strict=True)) + r[3] for r in rows
    )


DOC = ROOT / "docs" / "kubernetes.md"


@pytest.mark.parametrize("account", [DAEMON, SCHEDULER, AGENT])
def test_the_documented_permissions_are_the_api_servers(world: World, account: str) -> None:
    """docs/kubernetes.md shows, for each ServiceAccount, what the API server answers it
    (``kubectl auth can-i --list -n defrag-system``), word for word."""
    table = can_i_list(world.accounts[account], NS)
    print(f"--- can-i {account}\n{table}\n--- end")  # `pytest -s` prints it for the doc
    blocks = re.findall(r"```text\n(Resources .*?)```", DOC.read_text(), flags=re.DOTALL)
    shown = [_rows(b) for b in blocks]
    assert _rows(table) in shown, f"docs/kubernetes.md lacks, for {account}:\n{table}"


def _rows(table: str) -> list[tuple[str, ...]]:
    """The table's rows, each cell's words in order, the rows sorted: the order of rules in a
    SelfSubjectRulesReview (the roles' bindings are gathered from a cache) is not fixed, so
    kubectl's order of the verbs it merges into one row, and of rows whose rules print alike,
    is not either."""
    rows = []
    for line in table.strip().splitlines():
        cells = re.findall(r"\[[^\]]*\]|\S+", line)
        rows.append(tuple(" ".join(sorted(c[1:-1].split())) if c[0] == "[" else c for c in cells))
    return sorted(rows)


def test_the_node_policy_compares_every_field_of_node_spec(world: World) -> None:
    """The node policy compares NodeSpec field by field (CEL cannot drop ``taints`` from a typed
    object): every field the API server's own schema has must be named in it, or a new field
    would be a side door."""
    schema = world.plane.admin.get("/openapi/v3/api/v1")["components"]["schemas"]
    fields = set(schema["io.k8s.api.core.v1.NodeSpec"]["properties"])
    policy = next(p for p in world.policies if p["metadata"]["name"] == NODE_POLICY)
    text = " ".join(v["expression"] for v in policy["spec"]["validations"])
    named = set(re.findall(r"object\.spec\.(\w+)", text))
    assert fields == named, (fields, named)
