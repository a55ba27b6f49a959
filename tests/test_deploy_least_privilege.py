"""Least privilege in deploy/: the agent changes only its own node's NVLink annotation (a
ValidatingAdmissionPolicy, its CEL run here by cel-python against admission requests), every
workload passes the Pod Security Standard "restricted" the namespace enforces, and every
workload's egress is limited to what it talks to.

Sources: the per-node policy follows upstream's own e2e policy
(kubernetes test/e2e/auth/e2edata/per_node_validatingadmissionpolicy.yaml); the node-name claim
is NodeNameKey of k8s.io/apiserver pkg/authentication/serviceaccount; the admission request's
``userInfo`` is authentication.k8s.io/v1 UserInfo (``extra``: map of string lists). The
restricted checks are the controls of https://kubernetes.io/docs/concepts/security/pod-security-standards
(Baseline's, which Restricted includes, and Restricted's own).
"""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import celpy
import kubernetes_validate
import pytest
import yaml

from tests.test_deploy import DEPLOY, K8S_VERSION, Obj, one, render, workloads

POLICY_FILE = DEPLOY / "components" / "agent" / "admission-policy.yaml"
NODE_NAME_KEY = "authentication.kubernetes.io/node-name"
NVLINK = "defrag.io/nvlink-domains"
AGENT = "system:serviceaccount:defrag-system:defrag-agent"


@pytest.fixture(scope="module")
def objs() -> list[Obj]:
    return render(DEPLOY / "overlays" / "dry-run")


# --- the ValidatingAdmissionPolicy ------------------------------------------------------------


def _policy() -> tuple[Obj, Obj]:
    policy, binding = (d for d in yaml.safe_load_all(POLICY_FILE.read_text()) if d)
    return policy, binding


def test_the_policy_and_binding_validate_at_1_30(objs: list[Obj]) -> None:
    """admissionregistration.k8s.io/v1 ValidatingAdmissionPolicy is GA from 1.30: the schema of
    1.30 has it; both objects are rendered by every overlay (the agent component)."""
    for kind in ("ValidatingAdmissionPolicy", "ValidatingAdmissionPolicyBinding"):
        obj = one(objs, kind, "defrag-agent-own-node")
        assert obj["apiVersion"] == "admissionregistration.k8s.io/v1"
        kubernetes_validate.validate(obj, K8S_VERSION, strict=True)
    binding = one(objs, "ValidatingAdmissionPolicyBinding", "defrag-agent-own-node")
    assert binding["spec"]["policyName"] == "defrag-agent-own-node"
    assert binding["spec"]["validationActions"] == ["Deny"]


def test_the_policy_matches_node_updates_and_names_the_right_fields() -> None:
    policy, _ = _policy()
    spec = policy["spec"]
    assert spec["failurePolicy"] == "Fail"
    (rule,) = spec["matchConstraints"]["resourceRules"]
    assert rule["resources"] == ["nodes"] and rule["operations"] == ["UPDATE"]  # PATCH = UPDATE
    text = " ".join(
        " ".join(e["expression"].split())
        for e in (*spec["matchConditions"], *spec["variables"], *spec["validations"])
    )
    assert f"request.userInfo.extra['{NODE_NAME_KEY}']" in text
    assert "object.metadata.name == variables.nodeName" in text
    assert f"'{NVLINK}'" in text


def _cel(expression: str, activation: dict[str, Any]) -> Any:
    env = celpy.Environment()
    return env.program(env.compile(expression)).evaluate(activation)


def admit(request: Obj, new: Obj, old: Obj) -> str | None:
    """None when the policy admits the request (or does not match it), else the denial's
    message; variables evaluated in order, as the API server does (each sees those before)."""
    spec = _policy()[0]["spec"]
    activation: dict[str, Any] = {
        "request": celpy.json_to_cel(request),
        "object": celpy.json_to_cel(new),
        "oldObject": celpy.json_to_cel(old),
    }
    if not all(_cel(c["expression"], activation) for c in spec["matchConditions"]):
        return None
    variables: dict[Any, Any] = {}
    for v in spec["variables"]:
        activation["variables"] = celpy.celtypes.MapType(variables)
        variables[celpy.celtypes.StringType(v["name"])] = _cel(v["expression"], activation)
    activation["variables"] = celpy.celtypes.MapType(variables)
    for validation in spec["validations"]:
        if not _cel(validation["expression"], activation):
            return str(validation["message"])
    return None


OLD: Obj = {
    "metadata": {
        "name": "gpu-1",
        "labels": {"nvidia.com/gpu.present": "true"},
        "annotations": {"node.alpha.kubernetes.io/ttl": "0", NVLINK: "0-3,4-7"},
    },
    "spec": {"podCIDR": "10.244.1.0/24"},
}


def _request(user: str = AGENT, node: str | None = "gpu-1", extra: bool = True) -> Obj:
    info: Obj = {"username": user}
    if extra:
        info["extra"] = {NODE_NAME_KEY: [node]} if node is not None else {}
    return {"userInfo": info}


def _changed(path: list[str], value: Any) -> Obj:
    new: Obj = copy.deepcopy(OLD)
    target: Any = new
    for key in path[:-1]:
        target = target.setdefault(key, {})
    if value is None:
        target.pop(path[-1], None)
    else:
        target[path[-1]] = value
    return new


OWN = "the defrag agent may change only the node it runs on"
ONLY_NVLINK = "the defrag agent may change only the defrag.io/nvlink-domains annotation"
NO_SPEC = "the defrag agent may not change a node's labels, taints or spec"
NO_OWNERS = "the defrag agent may not change a node's ownerReferences or finalizers"

CASES = [
    # (what, request, new object, old object, expected denial or None)
    (
        "its own node's NVLink annotation",
        _request(),
        _changed(["metadata", "annotations", NVLINK], "0-7"),
        OLD,
        None,
    ),
    (
        "the annotation removed",
        _request(),
        _changed(["metadata", "annotations", NVLINK], None),
        OLD,
        None,
    ),
    (
        "the annotation first set",
        _request(),
        _changed(["metadata", "annotations", NVLINK], "0-7"),
        _changed(["metadata", "annotations", NVLINK], None),
        None,
    ),
    (
        "another node",
        _request(node="gpu-2"),
        _changed(["metadata", "annotations", NVLINK], "0-7"),
        OLD,
        OWN,
    ),
    (
        "a token without the node claim",
        _request(node=None),
        _changed(["metadata", "annotations", NVLINK], "0-7"),
        OLD,
        OWN,
    ),
    (
        "a token without any extra",
        _request(extra=False),
        _changed(["metadata", "annotations", NVLINK], "0-7"),
        OLD,
        OWN,
    ),
    (
        "another annotation changed",
        _request(),
        _changed(["metadata", "annotations", "node.alpha.kubernetes.io/ttl"], "1"),
        OLD,
        ONLY_NVLINK,
    ),
    (
        "another annotation added",
        _request(),
        _changed(["metadata", "annotations", "x"], "1"),
        OLD,
        ONLY_NVLINK,
    ),
    (
        "another annotation removed",
        _request(),
        _changed(["metadata", "annotations", "node.alpha.kubernetes.io/ttl"], None),
        OLD,
        ONLY_NVLINK,
    ),
    (
        "a label changed",
        _request(),
        _changed(["metadata", "labels", "nvidia.com/gpu.present"], "false"),
        OLD,
        NO_SPEC,
    ),
    (
        "a taint added",
        _request(),
        _changed(["spec", "taints"], [{"key": "k", "effect": "NoSchedule"}]),
        OLD,
        NO_SPEC,
    ),
    ("cordoned", _request(), _changed(["spec", "unschedulable"], True), OLD, NO_SPEC),
    (
        "a finalizer added (it holds the Node's deletion)",
        _request(),
        _changed(["metadata", "finalizers"], ["example.com/hold"]),
        OLD,
        NO_OWNERS,
    ),
    (
        "a controlling ownerReference to an owner that does not exist (the GC deletes the Node)",
        _request(),
        _changed(
            ["metadata", "ownerReferences"],
            [{"apiVersion": "v1", "kind": "Node", "name": "ghost", "uid": "0", "controller": True}],
        ),
        OLD,
        NO_OWNERS,
    ),
    (
        "another user: not matched",
        _request(user="system:serviceaccount:defrag-system:defrag"),
        _changed(["spec", "unschedulable"], True),
        OLD,
        None,
    ),
]


@pytest.mark.parametrize(
    ("what", "request_", "new", "old", "denied"), CASES, ids=[c[0] for c in CASES]
)
def test_the_agent_may_change_only_its_own_nodes_nvlink_annotation(
    what: str, request_: Obj, new: Obj, old: Obj, denied: str | None
) -> None:
    assert admit(request_, new, old) == denied


# --- Pod Security Standard "restricted" --------------------------------------------------------

RESTRICTED_VOLUMES = {
    "configMap",
    "csi",
    "downwardAPI",
    "emptyDir",
    "ephemeral",
    "persistentVolumeClaim",
    "projected",
    "secret",
}


def _pod_spec(o: Obj) -> Obj:
    return o["spec"]["template"]["spec"]


def _containers(pod: Obj) -> list[Obj]:
    return [*pod.get("initContainers", []), *pod["containers"], *pod.get("ephemeralContainers", [])]


def _effective(pod: Obj, c: Obj, key: str) -> Any:
    """A container's securityContext field, else the pod's (as the kubelet resolves it)."""
    own = c.get("securityContext", {})
    return own[key] if key in own else pod.get("securityContext", {}).get(key)


CONTROLS = {
    "host namespaces": lambda pod, c: (
        not any(pod.get(k) for k in ("hostNetwork", "hostPID", "hostIPC"))
    ),
    "privileged": lambda pod, c: not c.get("securityContext", {}).get("privileged"),
    "capabilities: drop ALL, add at most NET_BIND_SERVICE": lambda pod, c: (
        "ALL" in c["securityContext"].get("capabilities", {}).get("drop", [])
        and set(c["securityContext"]["capabilities"].get("add", [])) <= {"NET_BIND_SERVICE"}
    ),
    "volume types": lambda pod, c: all(
        (set(v) - {"name"}) <= RESTRICTED_VOLUMES for v in pod.get("volumes", [])
    ),
    "host ports": lambda pod, c: not any(p.get("hostPort") for p in c.get("ports", [])),
    "privilege escalation": lambda pod, c: (
        c["securityContext"].get("allowPrivilegeEscalation") is False
    ),
    "running as non-root": lambda pod, c: _effective(pod, c, "runAsNonRoot") is True,
    "non-root user": lambda pod, c: _effective(pod, c, "runAsUser") != 0,
    "seccomp RuntimeDefault or Localhost": lambda pod, c: (
        (_effective(pod, c, "seccompProfile") or {}).get("type") in ("RuntimeDefault", "Localhost")
    ),
    "sysctls: none": lambda pod, c: not pod.get("securityContext", {}).get("sysctls"),
    "procMount default": lambda pod, c: (
        c.get("securityContext", {}).get("procMount", "Default") == "Default"
    ),
}


def _workload_containers() -> list[tuple[str, str]]:
    objs = render(DEPLOY / "overlays" / "dry-run")
    return [
        (w["metadata"]["name"], c["name"])
        for w in workloads(objs)
        for c in _containers(_pod_spec(w))
    ]


@pytest.mark.parametrize("control", sorted(CONTROLS))
@pytest.mark.parametrize(("workload", "container"), _workload_containers())
def test_every_workload_passes_restricted(
    objs: list[Obj], workload: str, container: str, control: str
) -> None:
    w = next(o for o in workloads(objs) if o["metadata"]["name"] == workload)
    pod = _pod_spec(w)
    c = next(c for c in _containers(pod) if c["name"] == container)
    assert CONTROLS[control](pod, c), f"{workload}/{container}: {control}"


def test_the_namespace_enforces_restricted(objs: list[Obj]) -> None:
    labels = one(objs, "Namespace", "defrag-system")["metadata"]["labels"]
    for mode in ("enforce", "audit", "warn"):
        assert labels[f"pod-security.kubernetes.io/{mode}"] == "restricted"


def test_the_restricted_checks_catch_a_root_container(objs: list[Obj]) -> None:
    w = copy.deepcopy(one(objs, "Deployment", "defrag"))
    pod = _pod_spec(w)
    pod["securityContext"]["runAsNonRoot"] = False
    pod["containers"][0]["securityContext"]["capabilities"] = {"add": ["SYS_ADMIN"]}
    c = pod["containers"][0]
    failed = {name for name, check in CONTROLS.items() if not check(pod, c)}
    assert failed == {"running as non-root", "capabilities: drop ALL, add at most NET_BIND_SERVICE"}


# --- egress ------------------------------------------------------------------------------------

DNS = {(53, "UDP"), (53, "TCP")}
API = {(443, "TCP"), (6443, "TCP")}


@pytest.mark.parametrize(
    ("workload", "allowed"),
    [
        ("defrag", DNS | API | {(9090, "TCP"), (9093, "TCP")}),
        ("defrag-scheduler", DNS | API),
        ("defrag-agent", DNS | API),
    ],
)
def test_every_workload_has_an_egress_policy_for_what_it_reaches(
    objs: list[Obj], workload: str, allowed: set[tuple[int, str]]
) -> None:
    labels = _pod_spec(next(o for o in workloads(objs) if o["metadata"]["name"] == workload))
    policy = one(objs, "NetworkPolicy", f"{workload}-egress")
    kubernetes_validate.validate(policy, K8S_VERSION, strict=True)
    assert policy["spec"]["policyTypes"] == ["Egress"]
    assert policy["spec"]["podSelector"]["matchLabels"] == {"app.kubernetes.io/name": workload}
    assert labels is not None
    opened = {
        (p["port"], p["protocol"]) for rule in policy["spec"]["egress"] for p in rule["ports"]
    }
    assert opened == allowed
    for rule in policy["spec"]["egress"]:
        ports = {(p["port"], p["protocol"]) for p in rule["ports"]}
        peers = rule["to"]
        if ports == DNS:  # only to the cluster DNS pods
            assert peers[0]["podSelector"]["matchLabels"] == {"k8s-app": "kube-dns"}
        elif ports & {(9090, "TCP"), (9093, "TCP")}:  # only to the Prometheus Operator's pods
            name = peers[0]["podSelector"]["matchLabels"]["app.kubernetes.io/name"]
            assert name in ("prometheus", "alertmanager")
        else:
            assert ports == API


def test_documented(tmp_path: Path) -> None:
    text = (DEPLOY.parent / "docs" / "operations.md").read_text()
    for needle in ("ValidatingAdmissionPolicy", NODE_NAME_KEY, "restricted", "defrag-egress"):
        assert needle in text, needle
