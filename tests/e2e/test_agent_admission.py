"""The agent's ValidatingAdmissionPolicy (``deploy/components/agent/admission-policy.yaml``) on
the real API server, with the token the agent really has: a ServiceAccount token bound to its
pod, which carries the pod's node (``authentication.kubernetes.io/node-name``).

The agent's ClusterRole may patch every Node; the policy narrows that to the node its pod runs
on, and on it to the annotation ``defrag.io/nvlink-domains``. Each request below is made as the
agent's ServiceAccount, with a token bound to an agent pod on node A; the policy's own messages
are what a refusal must say. Last, ``defrag agent --once`` itself (its CLI, KubeActuator, a fake
NVML with the topology of an 8-GPU NVSwitch machine) publishes on A with that token, and is
refused on B.
"""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import pytest
import requests
from typer.testing import CliRunner

import defrag.adapters.nvml as nvml
from defrag.adapters.nvml import NvmlInventory
from defrag.cli import app
from tests.e2e import cluster as c
from tests.e2e.controlplane import ControlPlane, Rest, wait_for, write_kubeconfig
from tests.e2e.kubelet import add_node
from tests.test_agent import FakeNvml, nvswitch_8

NS = "defrag-system"
SA = "defrag-agent"
POLICY = "defrag-agent-own-node"
ANNOTATION = "defrag.io/nvlink-domains"
NODE_A, NODE_B = "agent-gpu-a", "agent-gpu-b"
ONLY_ITS_NODE = "the defrag agent may change only the node it runs on"
ONLY_THE_ANNOTATION = "the defrag agent may change only the defrag.io/nvlink-domains annotation"
NOT_LABELS = "the defrag agent may not change a node's labels, taints or spec"
NOT_OWNERS = "the defrag agent may not change a node's ownerReferences or finalizers"
GHOST_OWNER = {
    "apiVersion": "v1",
    "kind": "Node",
    "name": "ghost",
    "uid": "00000000-0000-0000-0000-000000000001",
    "controller": True,
}


def node_path(name: str) -> str:
    return f"/api/v1/nodes/{name}"


def patch(api: Rest, node: str, body: dict[str, Any], **params: Any) -> requests.Response:
    """A strategic merge patch of ``node`` (as the agent sends it); the raw answer."""
    return api.session.patch(
        api.url(node_path(node)),
        data=json.dumps(body),
        params=params,
        headers={"Content-Type": "application/strategic-merge-patch+json"},
        timeout=30,
    )


def annotate(value: str | None) -> dict[str, Any]:
    return {"metadata": {"annotations": {ANNOTATION: value}}}


def make_agent_pod(admin: Rest, rendered: list[dict[str, Any]], name: str, node: str) -> Any:
    """The shipped DaemonSet's pod, made by hand on ``node`` (no DaemonSet controller runs the
    stage): its token is the one the agent really has, bound to a pod on that node."""
    daemonset = next(o for o in rendered if o["kind"] == "DaemonSet")
    assert daemonset["spec"]["template"]["spec"]["serviceAccountName"] == SA
    spec = copy.deepcopy(daemonset["spec"]["template"]["spec"])
    spec["nodeName"] = node
    labels = daemonset["spec"]["template"]["metadata"]["labels"]
    body = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": NS, "labels": labels},
        "spec": spec,
    }
    return admin.post(f"/api/v1/namespaces/{NS}/pods", body)


@pytest.fixture(scope="module")
def agent_pod(plane: ControlPlane) -> dict[str, Any]:
    """The policy and its binding as the overlay renders them, two GPU nodes, and an agent pod
    on A as the DaemonSet makes it (the namespace enforces Pod Security ``restricted``)."""
    admin = plane.admin
    rendered = c.render("enforce")
    policy = [o for o in rendered if o["metadata"]["name"] == POLICY]
    assert [o["kind"] for o in policy] == [
        "ValidatingAdmissionPolicy",
        "ValidatingAdmissionPolicyBinding",
    ]
    c.apply_all(admin, policy)
    for name in (NODE_A, NODE_B):
        add_node(admin, name, 8)
    pod = make_agent_pod(admin, rendered, "defrag-agent-a", NODE_A)
    # The policy is in force once the admission plugin has loaded and type-checked it: until
    # then the agent's RBAC alone would let it patch node B. Probe with a dry run.
    probe = plane.as_service_account(NS, SA, bound_pod=pod)

    def in_force() -> bool:
        answer = patch(probe, NODE_B, annotate("0-7"), dryRun="All")
        return answer.status_code == 403 and ONLY_ITS_NODE in answer.text

    wait_for("the agent's admission policy in force", in_force, 30)
    status = admin.get(
        f"/apis/admissionregistration.k8s.io/v1/validatingadmissionpolicies/{POLICY}"
    ).get("status", {})
    assert status.get("typeChecking", {}).get("expressionWarnings", []) == [], status
    return pod


def _taint(node: dict[str, Any]) -> dict[str, Any]:
    taints = [*node["spec"].get("taints", []), {"key": "x", "value": "y", "effect": "NoSchedule"}]
    return {"spec": {"taints": taints}}


CASES = [
    # (case, node, patch of that node (a function of the node as it is), refusal or None)
    ("its-annotation", NODE_A, lambda n: annotate("0-3,4-7"), None),
    ("its-annotation-removed", NODE_A, lambda n: annotate(None), None),
    ("other-node", NODE_B, lambda n: annotate("0-7"), ONLY_ITS_NODE),
    ("other-annotation", NODE_A, lambda n: {"metadata": {"annotations": {"x": "y"}}},
     ONLY_THE_ANNOTATION),
    ("both-annotations", NODE_A,
     lambda n: {"metadata": {"annotations": {ANNOTATION: "0-7", "x": "y"}}}, ONLY_THE_ANNOTATION),
    ("label", NODE_A, lambda n: {"metadata": {"labels": {"x": "y"}}}, NOT_LABELS),
    ("taint", NODE_A, _taint, NOT_LABELS),
    ("cordon", NODE_A, lambda n: {"spec": {"unschedulable": True}}, NOT_LABELS),
    # A finalizer holds the Node's deletion; a controlling owner that does not exist has the
    # garbage collector delete the Node.
    ("finalizer", NODE_A, lambda n: {"metadata": {"finalizers": ["example.com/hold"]}},
     NOT_OWNERS),
    ("ghost-owner", NODE_A, lambda n: {"metadata": {"ownerReferences": [GHOST_OWNER]}},
     NOT_OWNERS),
]  # fmt: skip


@pytest.mark.parametrize(
    ("case", "node", "body", "refusal"), CASES, ids=[case[0] for case in CASES]
)
def test_a_pod_bound_token_changes_only_its_nodes_annotation(
    plane: ControlPlane, agent_pod: dict[str, Any], case: str, node: str, body: Any, refusal: str
) -> None:
    admin = plane.admin
    agent = plane.as_service_account(NS, SA, bound_pod=agent_pod)
    if case == "its-annotation-removed":  # there to remove, whatever ran before
        annotated = admin.patch(node_path(node), annotate("0-1"))
        assert annotated["metadata"]["annotations"][ANNOTATION] == "0-1"
    before = admin.get(node_path(node))
    answer = patch(agent, node, body(before))
    after = admin.get(node_path(node))
    if refusal is None:
        assert answer.status_code == 200, answer.text
        wanted = body(before)["metadata"]["annotations"][ANNOTATION]
        assert after["metadata"].get("annotations", {}).get(ANNOTATION) == wanted
        return
    assert answer.status_code == 403, answer.text
    message = answer.json()["message"]
    assert f"ValidatingAdmissionPolicy '{POLICY}'" in message, message
    assert refusal in message, message
    assert after["metadata"]["resourceVersion"] == before["metadata"]["resourceVersion"]


def test_a_token_not_bound_to_a_pod_is_refused(
    plane: ControlPlane, agent_pod: dict[str, Any]
) -> None:
    unbound = plane.as_service_account(NS, SA)
    answer = patch(unbound, NODE_A, annotate("0-7"))
    assert answer.status_code == 403, answer.text
    assert ONLY_ITS_NODE in answer.json()["message"]


def test_node_status_is_not_the_agents(plane: ControlPlane, agent_pod: dict[str, Any]) -> None:
    """RBAC, not the policy, keeps it off ``nodes/status`` (the policy matches ``nodes``)."""
    agent = plane.as_service_account(NS, SA, bound_pod=agent_pod)
    answer = agent.session.patch(
        agent.url(node_path(NODE_A) + "/status"),
        data=json.dumps({"status": {"capacity": {"nvidia.com/gpu": "16"}}}),
        headers={"Content-Type": "application/strategic-merge-patch+json"},
        timeout=30,
    )
    assert answer.status_code == 403, answer.text
    assert 'cannot patch resource "nodes/status"' in answer.json()["message"]


def run_agent(monkeypatch: pytest.MonkeyPatch, kubeconfig: Path, node: str) -> tuple[int, str]:
    """``defrag agent --once`` with NVML faked as an 8-GPU NVSwitch machine."""
    monkeypatch.setattr(nvml, "NvmlInventory", lambda: NvmlInventory(FakeNvml(nvswitch_8())))
    result = CliRunner().invoke(
        app,
        ["agent", "--once", "--node", node, "--kubeconfig", str(kubeconfig), "-o", "json"],
    )
    return result.exit_code, result.output


def test_the_agent_publishes_on_its_node_and_is_refused_elsewhere(
    plane: ControlPlane,
    agent_pod: dict[str, Any],
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
) -> None:
    admin = plane.admin
    admin.patch(node_path(NODE_A), annotate(None), kind="strategic")
    token = plane.token(NS, SA, bound_pod=agent_pod)
    kubeconfig = write_kubeconfig(
        tmp_path / "agent.kubeconfig", plane.server, plane.pki.ca, token=token
    )
    code, output = run_agent(monkeypatch, kubeconfig, NODE_A)
    assert code == 0, output
    annotations = admin.get(node_path(NODE_A))["metadata"].get("annotations", {})
    assert annotations.get(ANNOTATION) == "0-7", annotations
    # The same token, told it runs on B (a wrong NODE_NAME): refused, B untouched.
    before = admin.get(node_path(NODE_B))["metadata"].get("annotations", {}).get(ANNOTATION)
    code, output = run_agent(monkeypatch, kubeconfig, NODE_B)
    assert code != 0
    assert ONLY_ITS_NODE in output, output
    after = admin.get(node_path(NODE_B))["metadata"].get("annotations", {}).get(ANNOTATION)
    assert after == before
