"""Every manifest of both overlays (``dry-run``, ``enforce``) against the real API server.

The offline deploy tests (``tests/test_deploy*.py``) read the rendered YAML; this module asks
kube-apiserver v1.36 itself: each object is server-side applied, first with ``dryRun=All``,
then for real, with ``fieldValidation=Strict`` (an unknown or duplicate field anywhere is an
error, not a silent prune) and read back with nothing of ours lost. The Prometheus Operator
kinds are served by a subset of prometheus-operator v0.93.0's own CRDs
(``fixtures/prometheus-operator-crds.yaml``, written by ``fixtures/make_crds.py``; its header
names the source), strict enough that a typo in our ServiceMonitor is refused.

Pod Security: ``defrag-system`` enforces ``restricted``; the ReplicaSet and DaemonSet
controllers must create every defrag pod there (no ``FailedCreate`` naming PodSecurity, the
pods in the API), and a pod that breaks ``restricted`` is refused (the negative control).
Switching from dry-run to enforce by applying the other overlay changes the daemon's
``DEFRAG_EXECUTION__DRY_RUN``.
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import requests
import yaml

from tests.e2e import cluster as c
from tests.e2e.controlplane import ControlPlane, Rest, wait_for
from tests.e2e.kubelet import add_node

NS = "defrag-system"
FIXTURE = Path(__file__).parent / "fixtures" / "prometheus-operator-crds.yaml"
OVERLAYS = ("dry-run", "enforce")
MONITORING = "monitoring.coreos.com/v1"
# Dependency order of an install: what others refer to goes first.
ORDER = [
    "Namespace",
    "CustomResourceDefinition",
    "ServiceAccount",
    "ClusterRole",
    "ClusterRoleBinding",
    "Role",
    "RoleBinding",
    "ConfigMap",
    "ValidatingAdmissionPolicy",
]
WORKLOADS = ("Deployment", "DaemonSet")


def install_order(objects: list[dict[str, Any]]) -> list[dict[str, Any]]:
    rank = {kind: n for n, kind in enumerate(ORDER)}
    return sorted(objects, key=lambda o: rank.get(o["kind"], len(ORDER)))


def crds() -> list[dict[str, Any]]:
    return [d for d in yaml.safe_load_all(FIXTURE.read_text()) if d]


def name_of(obj: dict[str, Any]) -> str:
    return f"{obj['kind']}/{obj['metadata']['name']}"


# --- the CRD fixture covers what the manifests use -----------------------------------------


def opaque_paths(value: Any, schema: dict[str, Any], path: str = "") -> list[str]:
    """Paths of ``value`` that ``schema`` does not describe (opaque, or no such property)."""
    if schema.get("x-kubernetes-preserve-unknown-fields"):
        return [path or "."]
    if isinstance(value, dict):
        if "additionalProperties" in schema:
            extra = schema["additionalProperties"]
            return [p for k, v in value.items() for p in opaque_paths(v, extra, f"{path}.{k}")]
        found = []
        for key, sub in value.items():
            props = schema.get("properties", {})
            if key not in props:
                found.append(f"{path}.{key} (not in the schema)")
            else:
                found += opaque_paths(sub, props[key], f"{path}.{key}")
        return found
    if isinstance(value, list):
        items = schema.get("items", {})
        return [p for n, v in enumerate(value) for p in opaque_paths(v, items, f"{path}[{n}]")]
    return []


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_crd_fixture_describes_every_field_our_monitors_use(overlay: str) -> None:
    schemas = {
        d["spec"]["names"]["kind"]: d["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
        for d in crds()
    }
    monitors = [o for o in c.render(overlay) if o["apiVersion"] == MONITORING]
    assert {o["kind"] for o in monitors} == set(schemas)
    for obj in monitors:
        spec_schema = schemas[obj["kind"]]["properties"]["spec"]
        assert opaque_paths(obj["spec"], spec_schema, ".spec") == [], (
            f"{name_of(obj)} uses fields the fixture leaves opaque: regenerate it "
            "(tests/e2e/fixtures/make_crds.py)"
        )


# --- the control plane with the CRDs -------------------------------------------------------


@pytest.fixture(scope="module")
def api(plane: ControlPlane) -> Rest:
    admin = plane.admin
    for crd in crds():
        answer = admin.apply(crd, field_validation="Strict")
        assert answer.ok, f"{name_of(crd)}: {answer.status_code} {answer.text}"
    for crd in crds():
        path = f"/apis/apiextensions.k8s.io/v1/customresourcedefinitions/{crd['metadata']['name']}"

        def established(path: str = path) -> bool:
            conditions = admin.get(path).get("status", {}).get("conditions", [])
            return any(x["type"] == "Established" and x["status"] == "True" for x in conditions)

        wait_for(f"{crd['metadata']['name']} established", established, 30)

    def served() -> bool:
        answer = admin.session.get(admin.url(f"/apis/{MONITORING}"), timeout=5)
        kinds = {r["kind"] for r in answer.json().get("resources", [])} if answer.ok else set()
        return kinds >= {"ServiceMonitor", "PodMonitor", "PrometheusRule"}

    wait_for("monitoring.coreos.com/v1 discovery", served, 30)
    # One GPU node, for the agent's DaemonSet to have a target.
    add_node(admin, "gpu-manifests-1", 8)
    return admin


def monitor(overlay: str, kind: str, name: str) -> dict[str, Any]:
    for obj in c.render(overlay):
        if obj["kind"] == kind and obj["metadata"]["name"] == name:
            return obj
    raise AssertionError(f"{overlay} renders no {kind}/{name}")


def _set(path: list[Any], value: Any) -> Callable[[dict[str, Any]], None]:
    def change(obj: dict[str, Any]) -> None:
        node = obj
        for key in path[:-1]:
            node = node[key]
        node[path[-1]] = value

    return change


def _drop(path: list[Any]) -> Callable[[dict[str, Any]], None]:
    def change(obj: dict[str, Any]) -> None:
        node = obj
        for key in path[:-1]:
            node = node[key]
        del node[path[-1]]

    return change


EP = ["spec", "endpoints", 0]
NSSEL = ["spec", "namespaceSelector"]
PM = ["spec", "podMetricsEndpoints", 0]
RULE = ["spec", "groups", 0, "rules", 0]
BROKEN = [
    # (kind, name, change, words the refusal must hold)
    ("ServiceMonitor", "defrag", _set([*EP, "intervall"], "30s"), ["intervall"]),
    ("ServiceMonitor", "defrag", _set([*EP, "interval"], 30), ["interval", "string"]),
    ("ServiceMonitor", "defrag", _set([*EP, "interval"], "30 seconds"), ["interval"]),
    ("ServiceMonitor", "defrag", _set([*NSSEL, "matchName"], [NS]), ["matchName"]),
    ("ServiceMonitor", "defrag", _drop(["spec", "selector"]), ["spec.selector", "Required"]),
    ("ServiceMonitor", "defrag", _set(["spec", "endpoint"], []), ["endpoint"]),
    ("PodMonitor", "defrag-agent", _set([*PM, "prot"], "metrics"), ["prot"]),
    ("PodMonitor", "defrag-scheduler", _set([*PM, "path"], ["/metrics"]), ["path", "string"]),
    ("PrometheusRule", "defrag", _set([*RULE, "exprr"], "up"), ["exprr"]),
    ("PrometheusRule", "defrag", _drop([*RULE, "expr"]), ["expr", "Required"]),
]  # fmt: skip


def _first_alert(change: Callable[[dict[str, Any]], None]) -> Callable[[dict[str, Any]], None]:
    """``change`` applied to the first rule with a ``for`` (an alert)."""

    def on_alert(obj: dict[str, Any]) -> None:
        rules = [r for g in obj["spec"]["groups"] for r in g["rules"] if "for" in r]
        assert rules, "the PrometheusRule has no alert with a `for`"
        change({"rule": rules[0]})

    return on_alert


BROKEN.append(
    ("PrometheusRule", "defrag", _first_alert(_set(["rule", "for"], "ten minutes")), ["for"])
)


def refused(answer: requests.Response, words: list[str]) -> str:
    """The refusal's message, after checking it is one and names ``words``."""
    assert not answer.ok, f"accepted: {answer.status_code} {answer.text}"
    message = str(answer.json()["message"])
    if answer.status_code == 500:
        # kube-apiserver answers server-side apply of a field the schema does not declare (or
        # of the wrong type) with 500 "failed to create typed patch object", not 400: the
        # upstream bug kubernetes/kubernetes#139253 (fix proposed in #139255). A refusal all
        # the same; any other 500 is not.
        assert message.startswith("failed to create typed patch object"), message
    else:
        assert answer.status_code in (400, 422), f"{answer.status_code} {message}"
    for word in words:
        assert word in message, message
    return message


@pytest.mark.parametrize(
    ("kind", "name", "change", "words"),
    BROKEN,
    ids=[f"{k}-{'-'.join(w)}" for k, _, _, w in BROKEN],
)
def test_a_broken_monitor_is_refused_naming_the_field(
    api: Rest, kind: str, name: str, change: Callable[[dict[str, Any]], None], words: list[str]
) -> None:
    good = monitor("enforce", kind, name)
    broken = copy.deepcopy(good)
    change(broken)
    broken["metadata"]["name"] = f"broken-{name}"
    # As `kubectl apply --server-side` sends it, and as a plain create (`kubectl create`).
    refused(api.apply(broken, field_validation="Strict"), words)
    base, plural, _ = api.resource(MONITORING, kind)
    collection = api.url(f"{base}/namespaces/{NS}/{plural}")
    created = api.session.post(
        collection, json=broken, params={"fieldValidation": "Strict"}, timeout=30
    )
    message = refused(created, words)
    assert created.status_code in (400, 422), message
    # The unbroken object is accepted both ways (the refusal is the change's doing).
    good["metadata"]["name"] = f"unbroken-{name}"
    assert api.apply(good, dry_run=True, field_validation="Strict").status_code in (200, 201)
    answer = api.session.post(
        collection, json=good, params={"fieldValidation": "Strict", "dryRun": "All"}, timeout=30
    )
    assert answer.status_code == 201, answer.text


# --- both overlays, applied ----------------------------------------------------------------


def contained(ours: Any, theirs: Any, path: str = "") -> list[str]:
    """Where what the server holds differs from what we applied (its defaults aside)."""
    if isinstance(ours, dict):
        if not isinstance(theirs, dict):
            return [f"{path}: {theirs!r}"]
        return [p for k, v in ours.items() for p in contained(v, theirs.get(k), f"{path}.{k}")]
    if isinstance(ours, list):
        if not isinstance(theirs, list) or len(theirs) != len(ours):
            return [f"{path}: {theirs!r}"]
        pairs = enumerate(zip(ours, theirs, strict=True))
        return [p for n, (a, b) in pairs for p in contained(a, b, f"{path}[{n}]")]
    return [] if ours == theirs else [f"{path}: ours {ours!r}, server {theirs!r}"]


def apply_overlay(api: Rest, overlay: str) -> list[dict[str, Any]]:
    objects = install_order(c.render(overlay))
    problems = []
    for dry_run in (True, False):
        for obj in objects:
            answer = api.apply(obj, dry_run=dry_run, field_validation="Strict")
            if answer.status_code not in (200, 201):
                problems.append(
                    f"{name_of(obj)} dry_run={dry_run}: {answer.status_code} {answer.text}"
                )
            elif "PodSecurity" in answer.headers.get("Warning", ""):
                problems.append(f"{name_of(obj)}: {answer.headers['Warning']}")
        assert problems == [], "\n".join(problems)
    return objects


def env_of(api: Rest, deployment: str, name: str) -> str | None:
    obj = api.get(f"/apis/apps/v1/namespaces/{NS}/deployments/{deployment}")
    for container in obj["spec"]["template"]["spec"]["containers"]:
        for var in container.get("env", []):
            if var["name"] == name:
                return str(var.get("value"))
    return None


def pod_security_refusals(api: Rest) -> list[str]:
    events = api.get(f"/api/v1/namespaces/{NS}/events")["items"]
    return [
        f"{e['involvedObject']['kind']}/{e['involvedObject']['name']}: {e['message']}"
        for e in events
        if e.get("reason") == "FailedCreate" and "PodSecurity" in e.get("message", "")
    ]


def wait_workload_pods(api: Rest, objects: list[dict[str, Any]]) -> None:
    """Each Deployment's replicas and the DaemonSet's one pod (one GPU node) exist."""
    for obj in objects:
        if obj["kind"] not in WORKLOADS:
            continue
        want = obj["spec"].get("replicas", 1) if obj["kind"] == "Deployment" else 1
        labels = obj["spec"]["selector"]["matchLabels"]
        selector = ",".join(f"{k}={v}" for k, v in sorted(labels.items()))

        def enough(selector: str = selector, want: int = want) -> bool:
            if pod_security_refusals(api):
                return True  # fail below, with the events' words
            return len(c.pods(api, NS, selector)) >= want

        try:
            wait_for(f"pods of {name_of(obj)}", enough, 30)
        except TimeoutError as exc:
            raise AssertionError(f"no pods of {name_of(obj)} ({selector})") from exc
        assert pod_security_refusals(api) == []


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_every_object_applies_reads_back_and_its_pods_pass_pod_security(
    api: Rest, overlay: str
) -> None:
    objects = apply_overlay(api, overlay)
    lost = []
    for obj in objects:
        held = api.get(api.object_path(obj))
        assert held["metadata"]["name"] == obj["metadata"]["name"]
        for part in ("spec", "data", "rules", "roleRef", "subjects", "webhooks"):
            if part in obj:
                lost += [f"{name_of(obj)} {p}" for p in contained(obj[part], held.get(part), part)]
    assert lost == [], "\n".join(lost)
    namespace = api.get(f"/api/v1/namespaces/{NS}")
    assert namespace["metadata"]["labels"]["pod-security.kubernetes.io/enforce"] == "restricted"
    wait_workload_pods(api, objects)
    want = "true" if overlay == "dry-run" else "false"
    assert env_of(api, "defrag", "DEFRAG_EXECUTION__DRY_RUN") == want


def compliant_pod(name: str) -> dict[str, Any]:
    """The agent's pod as its DaemonSet makes it (restricted), to be broken one way per case."""
    agent = next(o for o in c.render("enforce") if o["kind"] == "DaemonSet")
    spec = copy.deepcopy(agent["spec"]["template"]["spec"])
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": NS},
        "spec": spec,
    }


def _capability(pod: dict[str, Any]) -> None:
    # (privileged: true itself never reaches Pod Security here: kube-apiserver runs without
    # --allow-privileged and its validation refuses it first, 422.)
    pod["spec"]["containers"][0]["securityContext"]["capabilities"]["add"] = ["SYS_ADMIN"]


def _unconfined(pod: dict[str, Any]) -> None:
    pod["spec"]["securityContext"]["seccompProfile"] = {"type": "Unconfined"}


def _host_path(pod: dict[str, Any]) -> None:
    pod["spec"]["volumes"].append({"name": "dev", "hostPath": {"path": "/dev"}})


def _no_security_context(pod: dict[str, Any]) -> None:
    del pod["spec"]["securityContext"]
    del pod["spec"]["containers"][0]["securityContext"]


def _host_network(pod: dict[str, Any]) -> None:
    pod["spec"]["hostNetwork"] = True


def _root(pod: dict[str, Any]) -> None:
    pod["spec"]["securityContext"]["runAsUser"] = 0


VIOLATIONS = [
    ("capability", _capability, "SYS_ADMIN"),
    ("seccomp-unconfined", _unconfined, "seccompProfile"),
    ("host-path", _host_path, "hostPath"),
    ("no-security-context", _no_security_context, "allowPrivilegeEscalation"),
    ("host-network", _host_network, "hostNetwork"),
    ("root", _root, "runAsUser=0"),
]


@pytest.mark.parametrize(("case", "breaks", "named"), VIOLATIONS, ids=[v[0] for v in VIOLATIONS])
def test_a_pod_that_breaks_restricted_is_refused(
    api: Rest, case: str, breaks: Callable[[dict[str, Any]], None], named: str
) -> None:
    path = f"/api/v1/namespaces/{NS}/pods"
    # The positive control: the unbroken pod is admitted (dry run).
    api.post(path, compliant_pod(f"ok-{case}"), dryRun="All")
    pod = compliant_pod(f"bad-{case}")
    breaks(pod)
    with pytest.raises(requests.HTTPError) as refused:
        api.post(path, pod)
    answer = refused.value.response
    assert answer is not None
    assert answer.status_code == 403, answer.text
    message = answer.json()["message"]
    assert 'violates PodSecurity "restricted:' in message, message
    assert named in message, message


def test_switching_dry_run_to_enforce_changes_the_daemon(api: Rest) -> None:
    apply_overlay(api, "dry-run")
    assert env_of(api, "defrag", "DEFRAG_EXECUTION__DRY_RUN") == "true"
    before = api.get(f"/apis/apps/v1/namespaces/{NS}/deployments/defrag")["metadata"]["generation"]
    objects = apply_overlay(api, "enforce")
    assert env_of(api, "defrag", "DEFRAG_EXECUTION__DRY_RUN") == "false"
    after = api.get(f"/apis/apps/v1/namespaces/{NS}/deployments/defrag")
    assert after["metadata"]["generation"] == before + 1

    # The Deployment controller rolls a ReplicaSet out with the new template, whose pods pass
    # Pod Security like the old ones.
    def rolled() -> list[dict[str, Any]]:
        sets = api.get(f"/apis/apps/v1/namespaces/{NS}/replicasets")["items"]
        return [
            rs
            for rs in sets
            if any(o["name"] == "defrag" for o in rs["metadata"].get("ownerReferences", []))
            and any(
                v == {"name": "DEFRAG_EXECUTION__DRY_RUN", "value": "false"}
                for ct in rs["spec"]["template"]["spec"]["containers"]
                for v in ct.get("env", [])
            )
            and rs.get("status", {}).get("replicas", 0) >= 1
        ]

    wait_for("the enforce ReplicaSet with a pod", rolled, 30)
    wait_workload_pods(api, objects)
