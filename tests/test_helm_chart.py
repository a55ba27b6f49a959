"""charts/defrag without a cluster: ``helm lint`` by Helm v4's own library (the tools
virtualenv, tests/support/helm.py), its values.schema.json refusing bad values, its version, and
the parity machinery the e2e suite uses (tests/e2e/test_helm_chart.py installs the chart and
compares each release with kustomize's rendering).
"""

from __future__ import annotations

import copy
import shutil
from pathlib import Path
from typing import Any

import pytest
import yaml

from defrag import __version__
from tests.support.chart_parity import CASES, DEPLOY, compare, normalise
from tests.support.helm import CHART, ERROR, WARNING, Helm, require_helm
from tests.support.kustomize import render


@pytest.fixture(scope="module")
def helm() -> Helm:
    return require_helm()


def merged(base: dict[str, Any], change: dict[str, Any]) -> dict[str, Any]:
    out = copy.deepcopy(base)
    for k, v in change.items():
        out[k] = merged(out[k], v) if isinstance(v, dict) and isinstance(out.get(k), dict) else v
    return out


def chart_with(tmp_path: Path, change: dict[str, Any]) -> Path:
    """A copy of the chart whose values.yaml has ``change`` merged in."""
    target = tmp_path / "defrag"
    shutil.copytree(CHART, target)
    values = yaml.safe_load((target / "values.yaml").read_text(encoding="utf-8"))
    (target / "values.yaml").write_text(yaml.safe_dump(merged(values, change)), encoding="utf-8")
    return target


def serious(messages: list[dict[str, Any]]) -> list[tuple[int, str]]:
    return sorted((m["Severity"], m["Path"]) for m in messages if m["Severity"] >= WARNING)


def test_chart_version_and_image_are_the_package_version() -> None:
    chart = yaml.safe_load((CHART / "Chart.yaml").read_text(encoding="utf-8"))
    assert chart["apiVersion"] == "v2"
    assert chart["version"] == chart["appVersion"] == __version__
    values = yaml.safe_load((CHART / "values.yaml").read_text(encoding="utf-8"))
    image = yaml.safe_load((DEPLOY / "components" / "image" / "kustomization.yaml").read_text())
    assert values["image"]["repository"] == image["images"][0]["newName"]
    assert values["image"]["tag"] == ""  # the appVersion


def test_helm_lint_passes(helm: Helm, tmp_path: Path) -> None:
    # helm-sdkpy's lint runs Helm's action.Lint without a namespace, where the Helm CLI passes
    # its --namespace ("default"): the Namespace object, named after the release namespace, is
    # then named "" and warned about. That warning is the only one.
    assert serious(helm.lint()) == [(WARNING, "templates/namespace.yaml")]
    # Without that object the chart lints with no warning and no error.
    assert serious(helm.lint(chart_with(tmp_path, {"namespace": {"create": False}}))) == []


@pytest.mark.parametrize(
    "change",
    [
        {"mode": "enforced"},
        {"daemon": {"replicas": "two"}},
        {"extender": {"wieght": 100}},
        {"settings": {"windowz": {}}},
        {"settings": {"windows": {"max_evictions_per_windw": 3}}},
        {"rules": {"leak.yaml": {"rules": [{"name": "x", "detector": "leaks"}]}}},
        {"image": {"pullPolicy": "Sometimes"}},
        {"networkPolicy": {"apiServer": {"ports": [70000]}}},
    ],
    ids=[
        "mode-enum",
        "replicas-type",
        "unknown-key",
        "unknown-settings-section",
        "unknown-settings-field",
        "unknown-detector",
        "pull-policy-enum",
        "port-range",
    ],
)
def test_lint_refuses_values_the_schema_does_not_allow(
    helm: Helm, tmp_path: Path, change: dict[str, Any]
) -> None:
    found = serious(helm.lint(chart_with(tmp_path, {"namespace": {"create": False}, **change})))
    assert (ERROR, "values.yaml") in found, found


def value_paths(values: dict[str, Any], prefix: str = "") -> list[str]:
    """Dotted paths of the chart's values, maps of the user's own (labels, resources) whole."""
    whole = ("settings", "rules", "resources", "nodeSelector", "labels", "podLabels")
    paths = []
    for k, v in values.items():
        path = f"{prefix}.{k}" if prefix else k
        if isinstance(v, dict) and v and not path.endswith(whole):
            paths += value_paths(v, path)
        else:
            paths.append(path)
    return paths


def test_the_chart_readme_has_every_value() -> None:
    values = yaml.safe_load((CHART / "values.yaml").read_text(encoding="utf-8"))
    readme = (CHART / "README.md").read_text(encoding="utf-8")
    missing = [p for p in value_paths(values) if f"| `{p}` |" not in readme]
    assert missing == []


# --- the parity machinery ---------------------------------------------------------------------


def test_every_overlay_and_component_has_a_parity_case() -> None:
    overlays = {p.name for p in (DEPLOY / "overlays").iterdir() if p.is_dir()}
    assert overlays <= {c.overlay for c in CASES}
    used = {c for case in CASES for c in case.components}
    for overlay in overlays:
        doc = yaml.safe_load((DEPLOY / "overlays" / overlay / "kustomization.yaml").read_text())
        used |= {Path(c).name for c in doc.get("components", [])}
    components = {p.name for p in (DEPLOY / "components").iterdir() if p.is_dir()}
    assert components == used
    for case in CASES:
        assert case.values_file.is_file(), case.values_file


def test_the_comparison_sees_a_difference_and_ignores_what_each_engine_adds() -> None:
    dry_run = render(DEPLOY / "overlays" / "dry-run")
    enforce = render(DEPLOY / "overlays" / "enforce")
    assert compare(dry_run, dry_run) == []
    assert compare(dry_run, enforce) == [
        "Deployment/defrag-system/defrag .spec.template.spec.containers[0].env[0].value: "
        "chart 'true', kustomize 'false'"
    ]
    # Helm's labels, its keep policy and the chart's checksums are not differences; kustomize's
    # hashed ConfigMap names are not either.
    helmish = copy.deepcopy(dry_run)
    for obj in helmish:
        obj["metadata"].setdefault("labels", {})["helm.sh/chart"] = "defrag-0.1.0"
        if obj["kind"] == "Namespace":
            obj["metadata"]["annotations"] = {"helm.sh/resource-policy": "keep"}
        if obj["kind"] == "Deployment":
            obj["spec"]["template"]["metadata"]["annotations"] = {"checksum/settings": "0f"}
    assert compare(helmish, dry_run) == []
    settings = next(o for o in dry_run if o["metadata"]["name"].startswith("defrag-settings-"))
    assert normalise(settings)["metadata"]["name"] == "defrag-settings"
    # A changed file inside a ConfigMap is a difference, named by its parsed path.
    changed = copy.deepcopy(dry_run)
    cm = next(o for o in changed if o["metadata"]["name"].startswith("defrag-settings-"))
    cm["data"]["settings.yaml"] = cm["data"]["settings.yaml"].replace("port: 8080", "port: 8081")
    assert compare(changed, dry_run) == [
        "ConfigMap/defrag-system/defrag-settings .data.settings.yaml.http.port: "
        "chart 8081, kustomize 8080"
    ]
