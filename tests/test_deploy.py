"""deploy/: every overlay renders with kustomize, validates against the Kubernetes OpenAPI schema
offline, and hangs together (selectors, ports, references, settings, rules, dashboard)."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml

from defrag.settings import check_environment, load_settings
from tests.support import kustomize
from tests.support.binaries import require_binary

ROOT = Path(__file__).resolve().parents[1]
DEPLOY = ROOT / "deploy"
OVERLAYS = ("dry-run", "enforce")
K8S_VERSION = "1.30.0"
CRD_KINDS = {"ServiceMonitor", "PodMonitor", "PrometheusRule"}
IMAGE = "ghcr.io/defrag-io/defrag:0.1.0"

Obj = dict[str, Any]
CLUSTER_SCOPED = {
    "Namespace",
    "ClusterRole",
    "ClusterRoleBinding",
    "ValidatingAdmissionPolicy",
    "ValidatingAdmissionPolicyBinding",
}


def render(path: Path) -> list[Obj]:
    return kustomize.render(path)


@pytest.fixture(scope="module")
def rendered() -> dict[str, list[Obj]]:
    return {name: render(DEPLOY / "overlays" / name) for name in OVERLAYS}


def one(objs: list[Obj], kind: str, name: str) -> Obj:
    found = [o for o in objs if o["kind"] == kind and o["metadata"]["name"] == name]
    assert len(found) == 1, f"{kind}/{name}: {len(found)} found"
    return found[0]


def workloads(objs: list[Obj]) -> Iterator[Obj]:
    return (o for o in objs if o["kind"] in ("Deployment", "DaemonSet"))


# --- rendering and schema ----------------------------------------------------------------------


EXPECTED = {
    ("Namespace", "defrag-system"),
    ("ServiceAccount", "defrag"),
    ("ClusterRole", "defrag"),
    ("ClusterRoleBinding", "defrag"),
    ("Role", "defrag-leader-election"),
    ("RoleBinding", "defrag-leader-election"),
    ("Deployment", "defrag"),
    ("Service", "defrag"),
    ("ServiceMonitor", "defrag"),
    ("PrometheusRule", "defrag"),
    ("NetworkPolicy", "defrag"),
    ("ConfigMap", "defrag-grafana-dashboard"),
    ("ServiceAccount", "defrag-scheduler"),
    ("ClusterRoleBinding", "defrag-scheduler-as-kube-scheduler"),
    ("ClusterRoleBinding", "defrag-scheduler-as-volume-scheduler"),
    ("RoleBinding", "defrag-scheduler-extension-apiserver-authentication-reader"),
    ("Role", "defrag-scheduler-leader-election"),
    ("RoleBinding", "defrag-scheduler-leader-election"),
    ("ClusterRole", "defrag-extender"),
    ("ClusterRoleBinding", "defrag-extender"),
    ("Deployment", "defrag-scheduler"),
    ("PodMonitor", "defrag-scheduler"),
    ("NetworkPolicy", "defrag-scheduler"),
    ("ServiceAccount", "defrag-agent"),
    ("ClusterRole", "defrag-agent"),
    ("ClusterRoleBinding", "defrag-agent"),
    ("DaemonSet", "defrag-agent"),
    ("PodMonitor", "defrag-agent"),
    ("NetworkPolicy", "defrag-agent"),
    ("NetworkPolicy", "defrag-egress"),
    ("NetworkPolicy", "defrag-scheduler-egress"),
    ("NetworkPolicy", "defrag-agent-egress"),
    ("ValidatingAdmissionPolicy", "defrag-agent-own-node"),
    ("ValidatingAdmissionPolicyBinding", "defrag-agent-own-node"),
    ("ValidatingAdmissionPolicy", "defrag-daemon-pod-writes"),
    ("ValidatingAdmissionPolicyBinding", "defrag-daemon-pod-writes"),
    ("ValidatingAdmissionPolicy", "defrag-daemon-node-writes"),
    ("ValidatingAdmissionPolicyBinding", "defrag-daemon-node-writes"),
    ("ValidatingAdmissionPolicy", "defrag-own-lease"),
    ("ValidatingAdmissionPolicyBinding", "defrag-own-lease"),
}


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_overlay_renders_every_object(rendered: dict[str, list[Obj]], overlay: str) -> None:
    objs = rendered[overlay]
    kinds = {(o["kind"], o["metadata"]["name"]) for o in objs}
    assert kinds >= EXPECTED
    # Plus the three hashed ConfigMaps (rules, the second scheduler's configuration, settings).
    hashed = sorted(n for k, n in kinds - EXPECTED)
    assert [re.sub(r"-[a-z0-9]{10}$", "", n) for n in hashed] == [
        "defrag-rules",
        "defrag-scheduler-config",
        "defrag-settings",
    ]
    for o in objs:
        assert o["metadata"]["labels"]["app.kubernetes.io/part-of"] == "defrag", o["kind"]
        if o["kind"] not in CLUSTER_SCOPED:
            # The one exception: kube-scheduler's delegated authentication reads a ConfigMap
            # of kube-system, so its reader RoleBinding lives there.
            reader = o["metadata"]["name"].endswith("-extension-apiserver-authentication-reader")
            want = "kube-system" if o["kind"] == "RoleBinding" and reader else "defrag-system"
            assert o["metadata"]["namespace"] == want, o["kind"]
        else:
            # kustomize's `namespace:` would give the admission policies one (it does not know
            # they are cluster-scoped); deploy/base/kustomization.yaml takes it off again.
            assert "namespace" not in o["metadata"], (o["kind"], o["metadata"]["name"])


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_builtin_kinds_validate_against_the_openapi_schema(
    rendered: dict[str, list[Obj]], overlay: str
) -> None:
    checked = 0
    for o in rendered[overlay]:
        if o["kind"] in CRD_KINDS:
            continue
        kubernetes_validate.validate(o, K8S_VERSION, strict=True)
        checked += 1
    assert checked == len(rendered[overlay]) - 4  # ServiceMonitor, 2 PodMonitors, PrometheusRule


def test_schema_validation_would_catch_a_mistake(rendered: dict[str, list[Obj]]) -> None:
    """The validator is not a no-op: a misspelt field in the Deployment fails strict mode."""
    bad = json.loads(json.dumps(one(rendered["dry-run"], "Deployment", "defrag")))
    bad["spec"]["template"]["spec"]["containers"][0]["readOnlyRootFS"] = True
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(bad, K8S_VERSION, strict=True)


def test_overlays_differ_only_in_dry_run(rendered: dict[str, list[Obj]]) -> None:
    def env(objs: list[Obj]) -> dict[str, Any]:
        container = one(objs, "Deployment", "defrag")["spec"]["template"]["spec"]["containers"][0]
        return {e["name"]: e.get("value") for e in container["env"]}

    assert env(rendered["dry-run"])["DEFRAG_EXECUTION__DRY_RUN"] == "true"
    assert env(rendered["enforce"])["DEFRAG_EXECUTION__DRY_RUN"] == "false"
    strip = [
        o
        for o in rendered["enforce"]
        if not (o["kind"] == "Deployment" and o["metadata"]["name"] == "defrag")
    ]
    same = [
        o
        for o in rendered["dry-run"]
        if not (o["kind"] == "Deployment" and o["metadata"]["name"] == "defrag")
    ]
    assert strip == same


# --- workloads -----------------------------------------------------------------------------------


def test_workloads_are_locked_down(rendered: dict[str, list[Obj]]) -> None:
    objs = rendered["dry-run"]
    accounts = {o["metadata"]["name"] for o in objs if o["kind"] == "ServiceAccount"}
    config_maps = {o["metadata"]["name"] for o in objs if o["kind"] == "ConfigMap"}
    for w in workloads(objs):
        pod = w["spec"]["template"]["spec"]
        who = w["metadata"]["name"]
        assert pod["securityContext"]["runAsNonRoot"] is True, who
        assert pod["securityContext"]["seccompProfile"]["type"] == "RuntimeDefault", who
        assert pod["serviceAccountName"] in accounts, who
        for volume in pod.get("volumes", []):
            if "configMap" in volume:
                assert volume["configMap"]["name"] in config_maps, (who, volume)
        for c in pod["containers"]:
            sc = c["securityContext"]
            assert sc["readOnlyRootFilesystem"] is True, who
            assert sc["allowPrivilegeEscalation"] is False, who
            assert sc["capabilities"]["drop"] == ["ALL"], who
            if c["name"] == "kube-scheduler":  # the upstream image, pinned
                assert re.fullmatch(r"registry\.k8s\.io/kube-scheduler:v\d+\.\d+\.\d+", c["image"])
            else:
                assert c["image"] == IMAGE
            assert {"cpu", "memory"} <= set(c["resources"]["requests"]), who
            assert "memory" in c["resources"]["limits"], who
            ports = {p["name"] for p in c["ports"]}
            for probe in ("livenessProbe", "readinessProbe"):
                assert c[probe]["httpGet"]["port"] in ports, (who, probe)


@pytest.mark.parametrize(
    ("name", "replicas", "container", "ready"),
    [
        ("defrag", 2, "defrag", "/readyz"),
        ("defrag-scheduler", 2, "extender", "/readyz"),
        ("defrag-scheduler", 2, "kube-scheduler", "/healthz"),
    ],
)
def test_deployments(
    rendered: dict[str, list[Obj]], name: str, replicas: int, container: str, ready: str
) -> None:
    d = one(rendered["dry-run"], "Deployment", name)
    assert d["spec"]["replicas"] == replicas
    (c,) = [c for c in d["spec"]["template"]["spec"]["containers"] if c["name"] == container]
    assert c["readinessProbe"]["httpGet"]["path"] == ready
    assert c["livenessProbe"]["httpGet"]["path"] == "/healthz"


def test_daemon_args_and_settings_load(rendered: dict[str, list[Obj]], tmp_path: Path) -> None:
    objs = rendered["dry-run"]
    d = one(objs, "Deployment", "defrag")["spec"]["template"]["spec"]
    c = d["containers"][0]
    assert c["args"][:1] == ["run"]
    mounts = {m["mountPath"]: m for m in c["volumeMounts"]}
    assert "/etc/defrag/settings.yaml" in mounts and "/etc/defrag/rules" in mounts
    settings_cm = next(
        o
        for o in objs
        if o["kind"] == "ConfigMap" and o["metadata"]["name"].startswith("defrag-settings")
    )
    path = tmp_path / "settings.yaml"
    path.write_text(settings_cm["data"]["settings.yaml"])
    # the real loader: every field is known
    settings = load_settings(path, {"execution.dry_run": True})
    assert settings.http.port == int(c["ports"][0]["containerPort"])
    lease = settings.leadership
    assert lease.enabled and lease.lease_namespace == "defrag-system"
    assert lease.lease_name == "defrag"
    # the Deployment's variables are settings of the sectioned layout
    env = {e["name"]: e.get("value") for e in c["env"] if e["name"].startswith("DEFRAG_")}
    assert set(env) == {"DEFRAG_EXECUTION__DRY_RUN", "DEFRAG_LEADERSHIP__IDENTITY"}
    check_environment(env)


def test_agent_daemonset_targets_gpu_nodes(rendered: dict[str, list[Obj]]) -> None:
    ds = one(rendered["dry-run"], "DaemonSet", "defrag-agent")["spec"]["template"]["spec"]
    assert ds["nodeSelector"] == {"nvidia.com/gpu.present": "true"}
    assert any(t["key"] == "nvidia.com/gpu" for t in ds["tolerations"])
    env = {e["name"]: e for e in ds["containers"][0]["env"]}
    assert env["NODE_NAME"]["valueFrom"]["fieldRef"]["fieldPath"] == "spec.nodeName"
    assert env["NVIDIA_VISIBLE_DEVICES"]["value"] == "all"
    # It asks no GPU: it must not take one from the workloads it measures.
    assert "nvidia.com/gpu" not in json.dumps(ds["containers"][0]["resources"])


# --- services, monitors, network policies ---------------------------------------------------------


def pod_of(objs: list[Obj], selector: dict[str, str]) -> Obj:
    matches = [
        w
        for w in workloads(objs)
        if selector.items() <= w["spec"]["template"]["metadata"]["labels"].items()
    ]
    assert len(matches) == 1, selector
    return matches[0]["spec"]["template"]


def container_ports(template: Obj) -> dict[str, int]:
    return {
        p["name"]: p["containerPort"] for c in template["spec"]["containers"] for p in c["ports"]
    }


def test_services_and_monitors_reach_their_pods(rendered: dict[str, list[Obj]]) -> None:
    objs = rendered["dry-run"]
    for svc in (o for o in objs if o["kind"] == "Service"):
        ports = container_ports(pod_of(objs, svc["spec"]["selector"]))
        for p in svc["spec"]["ports"]:
            assert p["targetPort"] in ports, svc["metadata"]["name"]
    sm = one(objs, "ServiceMonitor", "defrag")
    svc = one(objs, "Service", "defrag")
    assert sm["spec"]["selector"]["matchLabels"].items() <= svc["metadata"]["labels"].items()
    assert {e["port"] for e in sm["spec"]["endpoints"]} <= {p["name"] for p in svc["spec"]["ports"]}
    pms = [one(objs, "PodMonitor", name) for name in ("defrag-agent", "defrag-scheduler")]
    for pm in pms:
        template = pod_of(objs, pm["spec"]["selector"]["matchLabels"])
        endpoints = {e["port"] for e in pm["spec"]["podMetricsEndpoints"]}
        assert endpoints <= set(container_ports(template))
    for monitor in (sm, *pms):
        assert monitor["apiVersion"] == "monitoring.coreos.com/v1"
        assert monitor["spec"]["namespaceSelector"]["matchNames"] == ["defrag-system"]


def test_network_policies_open_only_the_served_ports(rendered: dict[str, list[Obj]]) -> None:
    objs = rendered["dry-run"]
    policies = [
        o for o in objs if o["kind"] == "NetworkPolicy" and "Ingress" in o["spec"]["policyTypes"]
    ]
    assert len(policies) == 3  # egress: tests/test_deploy_least_privilege.py
    for np_ in policies:
        template = pod_of(objs, np_["spec"]["podSelector"]["matchLabels"])
        served = set(container_ports(template).values())
        opened = {p["port"] for rule in np_["spec"]["ingress"] for p in rule["ports"]}
        assert opened == served, np_["metadata"]["name"]
        assert np_["spec"]["policyTypes"] == ["Ingress"]


# --- rules, dashboard ----------------------------------------------------------------


def test_rule_copies_are_in_step_with_rules_dir() -> None:
    result = subprocess.run(
        [sys.executable, str(DEPLOY / "sync.py"), "--check"], capture_output=True, text=True
    )
    assert result.returncode == 0, f"run `python deploy/sync.py`: {result.stderr}"


def test_prometheus_rule_passes_promtool(rendered: dict[str, list[Obj]], tmp_path: Path) -> None:
    promtool = require_binary("promtool")
    rule = one(rendered["dry-run"], "PrometheusRule", "defrag")
    assert rule["spec"]["groups"], "no rule groups"
    path = tmp_path / "rules.yaml"
    path.write_text(yaml.safe_dump({"groups": rule["spec"]["groups"]}))
    result = subprocess.run([promtool, "check", "rules", str(path)], capture_output=True, text=True)
    assert result.returncode == 0, result.stdout + result.stderr


def test_self_monitoring_alerts_name_jobs_the_monitors_make(
    rendered: dict[str, list[Obj]],
) -> None:
    """``up{job=...}`` in an alert matches a job the shipped monitors give their targets: a
    ServiceMonitor's is its Service's name, a PodMonitor's ``<namespace>/<name>``
    (prometheus-operator's defaults, pkg/prometheus/promcfg.go); one that matched nothing would
    never fire."""
    objs = rendered["dry-run"]
    jobs = {o["metadata"]["name"] for o in objs if o["kind"] == "Service"}
    jobs |= {
        f"{o['metadata']['namespace']}/{o['metadata']['name']}"
        for o in objs
        if o["kind"] == "PodMonitor"
    }
    rule = one(objs, "PrometheusRule", "defrag")
    selectors = [
        (m["op"], m["job"])
        for g in rule["spec"]["groups"]
        for r in g["rules"]
        if "alert" in r
        for m in re.finditer(r'up\{job(?P<op>=~?)"(?P<job>[^"]+)"\}', r["expr"])
    ]
    assert {job for _, job in selectors} >= {"defrag", ".+/defrag-scheduler", ".+/defrag-agent"}
    for op, job in selectors:
        matched = [j for j in jobs if (re.fullmatch(job, j) if op == "=~" else j == job)]
        assert matched, f"up{{job{op}{job!r}}} matches no monitor's job of {sorted(jobs)}"


def defined_metrics() -> set[str]:
    """Metric names the code registers (prometheus_client adds _total/_bucket suffixes)."""
    names: set[str] = set()
    for path in (ROOT / "defrag").rglob("*.py"):
        names.update(re.findall(r'"(defrag_[a-z0-9_]+)"', path.read_text(encoding="utf-8")))
    return names


def test_grafana_dashboard_uses_only_metrics_the_code_exports(
    rendered: dict[str, list[Obj]],
) -> None:
    cm = one(rendered["dry-run"], "ConfigMap", "defrag-grafana-dashboard")
    assert cm["metadata"]["labels"]["grafana_dashboard"] == "1"
    dashboard = json.loads(cm["data"]["defrag.json"])
    exprs = [t["expr"] for p in dashboard["panels"] for t in p["targets"]]
    used = {m for e in exprs for m in re.findall(r"\b(defrag_[a-z0-9_]+)", e)}
    known = defined_metrics()
    for metric in used:
        base = re.sub(r"_(total|bucket|count|sum)$", "", metric)
        assert metric in known or base in known, f"dashboard queries unknown metric {metric}"
    titles = " ".join(p["title"].lower() for p in dashboard["panels"])
    for topic in ("free", "stranded", "largest placeable job", "findings", "plan", "evictions"):
        assert topic in titles
    ids = [p["id"] for p in dashboard["panels"]]
    assert len(ids) == len(set(ids))
