"""The Helm chart (charts/defrag) installed by the real Helm engine on the real control plane.

Helm v4's own library (PyPI ``helm-sdkpy``, in the tools virtualenv ``make tools-helm`` makes)
installs, upgrades, lists and uninstalls the chart on kube-apiserver v1.36 as the e2e suite
starts it. Helm v4 applies server-side with ``fieldValidation=Strict`` (pkg/kube/client.go,
``Create``: an unknown or duplicate field is an error, not a silent prune). Each release's
manifest, what Helm rendered and applied, is compared object by object with what kustomize
renders from the overlay the values stand for (tests/support/chart_parity.py): the chart and the
kustomize tree are kept in step here. The namespace enforces Pod Security ``restricted`` and the
controllers create every defrag pod in it.

Under ``CI=true`` a missing Helm engine or missing control plane binaries fail these tests;
elsewhere they skip with one line naming what to run.
"""

from __future__ import annotations

import copy
from collections.abc import Iterator
from typing import Any

import pytest
import yaml

from defrag import __version__
from tests.e2e import cluster as c
from tests.e2e.controlplane import (
    ControlPlane,
    Rest,
    control_plane,
    require_assets,
    wait_for,
)
from tests.e2e.kubelet import add_node
from tests.e2e.test_manifests import (
    MONITORING,
    contained,
    crds,
    name_of,
    pod_security_refusals,
    wait_workload_pods,
)
from tests.support.chart_parity import CASES, Case, compare, manifest_objects
from tests.support.helm import Helm, HelmError, require_helm

NS = "defrag-system"
RELEASE = "defrag"
PARTS = ("spec", "data", "rules", "roleRef", "subjects")


@pytest.fixture(scope="module")
def helm() -> Helm:
    return require_helm()


@pytest.fixture(scope="module")
def plane(tmp_path_factory: pytest.TempPathFactory, helm: Helm) -> Iterator[ControlPlane]:
    """A bare control plane: nothing of defrag's applied (Helm must own every object it makes),
    the Prometheus Operator's CRDs served, one GPU node for the agent's DaemonSet."""
    require_assets()
    with control_plane(tmp_path_factory.mktemp("helm-controlplane")) as started:
        admin = started.admin
        for crd in crds():
            answer = admin.apply(crd, field_validation="Strict")
            assert answer.ok, f"{name_of(crd)}: {answer.status_code} {answer.text}"

        def served() -> bool:
            answer = admin.session.get(admin.url(f"/apis/{MONITORING}"), timeout=5)
            kinds = {r["kind"] for r in answer.json().get("resources", [])} if answer.ok else set()
            return kinds >= {"ServiceMonitor", "PodMonitor", "PrometheusRule"}

        wait_for("monitoring.coreos.com/v1 discovery", served, 30)
        add_node(admin, "gpu-helm-1", 8)
        yield started


def case(name: str) -> Case:
    return next(x for x in CASES if x.name == name)


def read_back(api: Rest, objects: list[dict[str, Any]]) -> list[str]:
    """Where what the server holds differs from what Helm applied (server defaults aside)."""
    lost = []
    for obj in objects:
        held = api.get(api.object_path(obj))
        labels = held["metadata"].get("labels", {})
        annotations = held["metadata"].get("annotations", {})
        if labels.get("app.kubernetes.io/managed-by") != "Helm":
            lost.append(f"{name_of(obj)}: not labelled managed-by Helm")
        if annotations.get("meta.helm.sh/release-name") != RELEASE:
            lost.append(f"{name_of(obj)}: no meta.helm.sh/release-name {RELEASE}")
        for part in PARTS:
            if part in obj:
                lost += [f"{name_of(obj)} {p}" for p in contained(obj[part], held.get(part), part)]
    return lost


def env_of(api: Rest, name: str) -> str | None:
    obj = api.get(f"/apis/apps/v1/namespaces/{NS}/deployments/defrag")
    for var in obj["spec"]["template"]["spec"]["containers"][0].get("env", []):
        if var["name"] == name:
            return str(var.get("value"))
    return None


@pytest.fixture(scope="module")
def installed(plane: ControlPlane, helm: Helm) -> dict[str, Any]:
    """The release as `helm install defrag charts/defrag -n defrag-system --create-namespace`
    with the dry-run overlay's values makes it."""
    return helm.install(RELEASE, NS, plane.admin_kubeconfig, case("dry-run").values())


def test_install_renders_the_dry_run_overlay_and_its_pods_pass_pod_security(
    plane: ControlPlane, installed: dict[str, Any]
) -> None:
    api = plane.admin
    assert installed["info"]["status"] == "deployed", installed["info"]
    assert installed["apply_method"] == "ssa"
    objects = manifest_objects(installed["manifest"])
    assert compare(objects, case("dry-run").kustomize()) == []
    assert read_back(api, objects) == []
    labels = api.get(f"/api/v1/namespaces/{NS}")["metadata"]["labels"]
    assert labels["pod-security.kubernetes.io/enforce"] == "restricted"
    wait_workload_pods(api, objects)
    assert pod_security_refusals(api) == []
    # The negative control: the agent's pod as its DaemonSet makes it, run as root, is refused.
    agent = next(o for o in objects if o["kind"] == "DaemonSet")
    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "root-agent", "namespace": NS},
        "spec": copy.deepcopy(agent["spec"]["template"]["spec"]),
    }
    pod["spec"]["securityContext"]["runAsUser"] = 0
    answer = api.session.post(api.url(f"/api/v1/namespaces/{NS}/pods"), json=pod, timeout=30)
    assert answer.status_code == 403, answer.text
    assert 'violates PodSecurity "restricted:' in answer.json()["message"]
    assert env_of(api, "DEFRAG_EXECUTION__DRY_RUN") == "true"
    notes = installed["info"]["notes"]
    assert "Mode: dry-run" in notes and "evicts nothing" in notes


@pytest.mark.parametrize("name", [x.name for x in CASES if x.name != "dry-run"])
def test_upgrade_renders_the_overlay_its_values_stand_for(
    plane: ControlPlane, helm: Helm, installed: dict[str, Any], name: str
) -> None:
    api = plane.admin
    release = helm.upgrade(RELEASE, NS, plane.admin_kubeconfig, case(name).values())
    assert release["info"]["status"] == "deployed"
    assert release["version"] > installed["version"]
    objects = manifest_objects(release["manifest"])
    assert compare(objects, case(name).kustomize()) == []
    assert read_back(api, objects) == []
    assert env_of(api, "DEFRAG_EXECUTION__DRY_RUN") == "false"
    wait_workload_pods(api, objects)
    if name.endswith("kube-prometheus-stack"):
        for obj in objects:
            if obj["apiVersion"] == MONITORING:
                held = api.get(api.object_path(obj))
                assert held["metadata"]["labels"]["release"] == "kube-prometheus-stack"
        api.get("/api/v1/namespaces/kube-system/configmaps/defrag-most-allocated-scheduler-config")


def test_upgrade_of_a_window_changes_the_settings_and_rolls_the_daemon(
    plane: ControlPlane, helm: Helm, installed: dict[str, Any]
) -> None:
    api = plane.admin
    values = case("enforce").values()
    helm.upgrade(RELEASE, NS, plane.admin_kubeconfig, values)
    template = api.get(f"/apis/apps/v1/namespaces/{NS}/deployments/defrag")["spec"]["template"]
    window = {"cron": "30 22 * * 6", "length_s": 14400, "timezone": "Europe/Berlin"}
    values["settings"] = {"windows": {"schedule": [window], "max_evictions_per_window": 3}}
    release = helm.upgrade(RELEASE, NS, plane.admin_kubeconfig, values)
    held = api.get(f"/api/v1/namespaces/{NS}/configmaps/defrag-settings")
    settings = yaml.safe_load(held["data"]["settings.yaml"])
    assert settings["windows"]["schedule"] == [window]
    assert settings["windows"]["max_evictions_per_window"] == 3
    # The rest of the chart's settings stay (Helm merges the values into the defaults).
    assert settings["windows"]["max_evictions_per_node"] == 8
    assert settings["leadership"]["lease_namespace"] == NS
    rolled = api.get(f"/apis/apps/v1/namespaces/{NS}/deployments/defrag")["spec"]["template"]
    key = "checksum/settings"
    assert rolled["metadata"]["annotations"][key] != template["metadata"]["annotations"][key]
    assert "Mode: enforce" in release["info"]["notes"]


def test_enforce_as_the_notes_say_keeps_the_other_values(
    plane: ControlPlane, helm: Helm, installed: dict[str, Any]
) -> None:
    """`helm upgrade ... --reuse-values --set mode=enforce`, the command NOTES.txt gives."""
    api = plane.admin
    helm.upgrade(RELEASE, NS, plane.admin_kubeconfig, case("dry-run").values())
    assert env_of(api, "DEFRAG_EXECUTION__DRY_RUN") == "true"
    release = helm.upgrade(
        RELEASE, NS, plane.admin_kubeconfig, {"mode": "enforce"}, reuse_values=True
    )
    assert env_of(api, "DEFRAG_EXECUTION__DRY_RUN") == "false"
    # The dry-run values' pinned kube-scheduler stays: the rest equals the enforce overlay.
    assert compare(manifest_objects(release["manifest"]), case("enforce").kustomize()) == []


def test_the_scheduler_image_follows_the_cluster_version_unless_set(
    plane: ControlPlane, helm: Helm, installed: dict[str, Any]
) -> None:
    api = plane.admin
    server = api.get("/version")["gitVersion"]  # v1.36.2
    release = helm.upgrade(RELEASE, NS, plane.admin_kubeconfig, {"mode": "enforce"})
    (scheduler,) = [
        o
        for o in manifest_objects(release["manifest"])
        if o["kind"] == "Deployment" and o["metadata"]["name"] == "defrag-scheduler"
    ]
    images = {x["name"]: x["image"] for x in scheduler["spec"]["template"]["spec"]["containers"]}
    assert images["kube-scheduler"] == f"registry.k8s.io/kube-scheduler:{server.split('-')[0]}"


@pytest.mark.parametrize(
    ("values", "words"),
    [
        ({"mode": "enforced"}, ["mode", "enforce"]),
        ({"daemon": {"replicas": "two"}}, ["replicas", "integer"]),
        ({"extender": {"wieght": 100}}, ["wieght"]),
        ({"settings": {"windowz": {}}}, ["windowz"]),
    ],
    ids=["enum", "type", "unknown-key", "unknown-settings-section"],
)
def test_bad_values_are_refused_by_the_schema_before_anything_changes(
    plane: ControlPlane,
    helm: Helm,
    installed: dict[str, Any],
    values: dict[str, Any],
    words: list[str],
) -> None:
    history_before = [r["version"] for r in helm.list(NS, plane.admin_kubeconfig)]
    with pytest.raises(HelmError) as refused:
        helm.upgrade(RELEASE, NS, plane.admin_kubeconfig, {**case("enforce").values(), **values})
    message = str(refused.value)
    assert "values don't meet the specifications of the schema" in message, message
    for word in words:
        assert word in message, message
    assert [r["version"] for r in helm.list(NS, plane.admin_kubeconfig)] == history_before


def test_a_lease_the_admission_policy_refuses_is_refused_by_the_chart_naming_it(
    plane: ControlPlane, helm: Helm, installed: dict[str, Any]
) -> None:
    values = case("enforce").values()
    values["settings"] = {"leadership": {"lease_name": "my-defrag"}}
    with pytest.raises(HelmError) as refused:
        helm.upgrade(RELEASE, NS, plane.admin_kubeconfig, values)
    message = str(refused.value)
    assert 'settings.leadership.lease_name is "my-defrag"' in message, message
    assert "defrag-own-lease" in message, message


def test_list_shows_the_release(plane: ControlPlane, helm: Helm, installed: dict[str, Any]) -> None:
    releases = helm.list(NS, plane.admin_kubeconfig)
    assert [(r["name"], r["namespace"], r["info"]["status"]) for r in releases] == [
        (RELEASE, NS, "deployed")
    ]
    chart = releases[0]["chart"]["metadata"]
    assert (chart["name"], chart["version"], chart["appVersion"]) == (
        "defrag",
        __version__,
        __version__,
    )


def test_uninstall_removes_every_object_but_the_namespace(
    plane: ControlPlane, helm: Helm, installed: dict[str, Any]
) -> None:
    api = plane.admin
    values = case("enforce-most-allocated-kube-prometheus-stack").values()
    last = helm.upgrade(RELEASE, NS, plane.admin_kubeconfig, values)
    objects = manifest_objects(last["manifest"])
    helm.uninstall(RELEASE, NS, plane.admin_kubeconfig)

    def gone(obj: dict[str, Any]) -> bool:
        answer = api.session.get(api.url(api.object_path(obj)), timeout=10)
        return answer.status_code == 404

    def left() -> list[str]:
        objs = [name_of(o) for o in objects if o["kind"] != "Namespace" and not gone(o)]
        return objs + [f"Pod/{p['metadata']['name']}" for p in c.pods(api, NS)]

    try:
        wait_for("every object of the release and its pods deleted", lambda: left() == [], 60)
    except TimeoutError as exc:
        raise AssertionError(f"left after uninstall: {left()}") from exc
    assert helm.list(NS, plane.admin_kubeconfig) == []
    # helm.sh/resource-policy: keep: the namespace stays (empty of defrag), still restricted.
    namespace = api.get(f"/api/v1/namespaces/{NS}")
    assert namespace["metadata"]["labels"]["pod-security.kubernetes.io/enforce"] == "restricted"
