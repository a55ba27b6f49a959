"""deploy/components/most-allocated: the MostAllocated remedy for a spreading scheduler.

The KubeSchedulerConfiguration uses only fields kube-scheduler knows (it decodes strictly), the
default profile's NodeResourcesFit scores MostAllocated with the GPU weighing most, every weight
is in kube-scheduler's range, and the component renders one ConfigMap holding that file.
Field names: k8s.io/kube-scheduler config/v1 types_pluginargs.go (NodeResourcesFitArgs l. 63-81,
ScoringStrategy l. 206-220, ResourceSpec l. 141-147) and types.go (PluginConfig: name, args).
tests/e2e/test_most_allocated.py runs the file in the real kube-scheduler.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.test_deploy import DEPLOY, render
from tests.test_deploy_scheduler import unknown_keys

COMPONENT = DEPLOY / "components" / "most-allocated"
CONFIG_FILE = COMPONENT / "kube-scheduler-config.yaml"

PLUGIN_CONFIG = {"name", "args"}
NODE_RESOURCES_FIT_ARGS = {
    "apiVersion",
    "kind",
    "ignoredResources",
    "ignoredResourceGroups",
    "scoringStrategy",
}
SCORING_STRATEGY = {"type", "resources", "requestedToCapacityRatio"}
RESOURCE_SPEC = {"name", "weight"}
STRATEGY_TYPES = {"LeastAllocated", "MostAllocated", "RequestedToCapacityRatio"}


def fit_args(config: dict[str, Any]) -> dict[str, Any]:
    (profile,) = config["profiles"]
    (entry,) = [p for p in profile["pluginConfig"] if p["name"] == "NodeResourcesFit"]
    args: dict[str, Any] = entry["args"]
    return args


def plugin_config_unknown_keys(config: dict[str, Any]) -> list[str]:
    found = []
    for i, profile in enumerate(config["profiles"]):
        for j, entry in enumerate(profile.get("pluginConfig") or []):
            where = f"profiles[{i}].pluginConfig[{j}]"
            found += [f"{where}.{k}" for k in entry if k not in PLUGIN_CONFIG]
            if entry.get("name") != "NodeResourcesFit":
                continue
            args = entry.get("args") or {}
            found += [f"{where}.args.{k}" for k in args if k not in NODE_RESOURCES_FIT_ARGS]
            strategy = args.get("scoringStrategy") or {}
            found += [
                f"{where}.args.scoringStrategy.{k}" for k in strategy if k not in SCORING_STRATEGY
            ]
            for n, res in enumerate(strategy.get("resources") or []):
                found += [
                    f"{where}.args.scoringStrategy.resources[{n}].{k}"
                    for k in res
                    if k not in RESOURCE_SPEC
                ]
    return found


@pytest.fixture(scope="module")
def config() -> dict[str, Any]:
    loaded: dict[str, Any] = yaml.safe_load(CONFIG_FILE.read_text(encoding="utf-8"))
    return loaded


def test_every_key_is_a_field_kube_scheduler_knows(config: dict[str, Any]) -> None:
    assert (config["apiVersion"], config["kind"]) == (
        "kubescheduler.config.k8s.io/v1",
        "KubeSchedulerConfiguration",
    )
    assert unknown_keys(config) == []
    assert plugin_config_unknown_keys(config) == []


@pytest.mark.parametrize(
    ("edit", "reported"),
    [
        (lambda a: a.update(scoringStrategie={}), ["args.scoringStrategie"]),
        (lambda a: a["scoringStrategy"].update(strategy="x"), ["args.scoringStrategy.strategy"]),
        (
            lambda a: a["scoringStrategy"]["resources"][0].update(wieght=1),
            ["args.scoringStrategy.resources[0].wieght"],
        ),
    ],
)
def test_a_misspelt_field_is_reported(
    config: dict[str, Any], edit: Any, reported: list[str]
) -> None:
    broken = yaml.safe_load(yaml.safe_dump(config))
    edit(fit_args(broken))
    assert plugin_config_unknown_keys(broken) == [
        f"profiles[0].pluginConfig[0].{r}" for r in reported
    ]


def test_default_profile_packs_by_gpu(config: dict[str, Any]) -> None:
    (profile,) = config["profiles"]
    # the profile every pod without spec.schedulerName gets (config/v1 defaults)
    assert profile["schedulerName"] == "default-scheduler"
    strategy = fit_args(config)["scoringStrategy"]
    assert strategy["type"] == "MostAllocated" and strategy["type"] in STRATEGY_TYPES
    weights = {r["name"]: r["weight"] for r in strategy["resources"]}
    assert set(weights) == {"nvidia.com/gpu", "cpu", "memory"}
    assert all(1 <= w <= 100 for w in weights.values())  # "Allowed weights go from 1 to 100"
    # the GPU outweighs CPU and memory together: 10 > 1 + 1
    assert weights["nvidia.com/gpu"] > weights["cpu"] + weights["memory"]
    # no leader election or client connection: those stay the installed scheduler's own
    assert set(config) == {"apiVersion", "kind", "profiles"}


def test_component_renders_the_file_as_one_configmap(tmp_path: Path) -> None:
    (tmp_path / "kustomization.yaml").write_text(
        yaml.safe_dump(
            {
                "apiVersion": "kustomize.config.k8s.io/v1beta1",
                "kind": "Kustomization",
                "components": [os.path.relpath(COMPONENT, tmp_path)],
            }
        )
    )
    (cm,) = render(tmp_path)
    assert cm["kind"] == "ConfigMap"
    assert cm["metadata"]["namespace"] == "kube-system"
    assert cm["metadata"]["name"].startswith("defrag-most-allocated-scheduler-config-")
    assert cm["data"]["kube-scheduler-config.yaml"] == CONFIG_FILE.read_text(encoding="utf-8")
