"""The Helm chart (charts/defrag) and the kustomize tree (deploy/) render the same objects.

Each case pairs a kustomization (an overlay, or an overlay plus components in a temporary
kustomization) with the chart's values file under charts/defrag/ci/. What each engine adds by
design is taken off before comparing: Helm's labels (managed-by, instance, version, chart) and its
resource policy, the chart's checksum annotations on pod templates, kustomize's hash suffix on the
ConfigMaps it generates. The files in ConfigMaps are compared parsed (YAML, JSON), since one is
written by a person with comments and the other by ``toYaml``.
"""

from __future__ import annotations

import copy
import json
import os
import re
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from tests.support import kustomize

ROOT = Path(__file__).resolve().parents[2]
DEPLOY = ROOT / "deploy"
CHART = ROOT / "charts" / "defrag"
HELM_LABELS = (
    "app.kubernetes.io/managed-by",
    "app.kubernetes.io/instance",
    "app.kubernetes.io/version",
    "helm.sh/chart",
)
HELM_ANNOTATIONS = ("helm.sh/resource-policy",)
# The ConfigMaps kustomize's configMapGenerator names with a content hash.
GENERATED = (
    "defrag-settings",
    "defrag-rules",
    "defrag-scheduler-config",
    "defrag-most-allocated-scheduler-config",
)
HASHED = re.compile(r"^(?P<base>" + "|".join(GENERATED) + r")-[a-z0-9]{10}$")

Obj = dict[str, Any]
Key = tuple[str, str, str]


@dataclass(frozen=True)
class Case:
    name: str
    overlay: str
    components: tuple[str, ...]
    values_file: Path

    def values(self) -> dict[str, Any]:
        return dict(yaml.safe_load(self.values_file.read_text(encoding="utf-8")) or {})

    def kustomize(self) -> list[Obj]:
        overlay = DEPLOY / "overlays" / self.overlay
        if not self.components:
            return kustomize.render(overlay)
        with tempfile.TemporaryDirectory() as tmp:
            # kustomize takes only relative paths to other kustomizations.
            def rel(path: Path) -> str:
                return os.path.relpath(path, tmp)

            doc = {
                "apiVersion": "kustomize.config.k8s.io/v1beta1",
                "kind": "Kustomization",
                "resources": [rel(overlay)],
                "components": [rel(DEPLOY / "components" / c) for c in self.components],
            }
            (Path(tmp) / "kustomization.yaml").write_text(yaml.safe_dump(doc), encoding="utf-8")
            return kustomize.render(Path(tmp))


CASES = (
    Case("dry-run", "dry-run", (), CHART / "ci" / "dry-run-values.yaml"),
    Case("enforce", "enforce", (), CHART / "ci" / "enforce-values.yaml"),
    Case(
        "enforce-most-allocated-kube-prometheus-stack",
        "enforce",
        ("most-allocated", "kube-prometheus-stack"),
        CHART / "ci" / "enforce-most-allocated-kube-prometheus-stack-values.yaml",
    ),
)


def manifest_objects(manifest: str) -> list[Obj]:
    """The objects of a release's manifest (what Helm rendered and applied)."""
    return [doc for doc in yaml.safe_load_all(manifest) if doc]


def key(obj: Obj) -> Key:
    meta = obj["metadata"]
    return (obj["kind"], meta.get("namespace", ""), meta["name"])


def _drop(mapping: dict[str, Any], parent: dict[str, Any], field: str, keys: Any) -> None:
    for k in list(mapping):
        if k in keys or any(k.startswith(p) for p in keys if p.endswith("/")):
            del mapping[k]
    if not mapping:
        del parent[field]


def _parsed_files(data: dict[str, str]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for name, text in data.items():
        if name.endswith((".yaml", ".yml")):
            out[name] = yaml.safe_load(text)
        elif name.endswith(".json"):
            out[name] = json.loads(text)
        else:
            out[name] = text
    return out


def normalise(obj: Obj) -> Obj:
    """``obj`` without what its engine adds by design (module docstring)."""
    obj = copy.deepcopy(obj)
    meta = obj["metadata"]
    if "labels" in meta:
        _drop(meta["labels"], meta, "labels", HELM_LABELS)
    if "annotations" in meta:
        _drop(meta["annotations"], meta, "annotations", HELM_ANNOTATIONS)
    if obj["kind"] == "ConfigMap":
        match = HASHED.match(meta["name"])
        if match:
            meta["name"] = match["base"]
        obj["data"] = _parsed_files(obj.get("data") or {})
    template = obj.get("spec", {}).get("template")
    if isinstance(template, dict):
        tmeta = template.get("metadata", {})
        if "annotations" in tmeta:
            _drop(tmeta["annotations"], tmeta, "annotations", ("checksum/",))
        for volume in template.get("spec", {}).get("volumes", []):
            config_map = volume.get("configMap")
            if config_map:
                match = HASHED.match(config_map["name"])
                if match:
                    config_map["name"] = match["base"]
    return obj


def differences(ours: Any, theirs: Any, path: str = "") -> list[str]:
    """Where two normalised objects differ, by path (empty when equal)."""
    if isinstance(ours, dict) and isinstance(theirs, dict):
        found = []
        for k in sorted(set(ours) | set(theirs), key=str):
            if k not in theirs:
                found.append(f"{path}.{k}: only in the chart")
            elif k not in ours:
                found.append(f"{path}.{k}: only in kustomize")
            else:
                found += differences(ours[k], theirs[k], f"{path}.{k}")
        return found
    if isinstance(ours, list) and isinstance(theirs, list) and len(ours) == len(theirs):
        pairs = enumerate(zip(ours, theirs, strict=True))
        return [d for n, (a, b) in pairs for d in differences(a, b, f"{path}[{n}]")]
    return [] if ours == theirs else [f"{path}: chart {ours!r}, kustomize {theirs!r}"]


def compare(helm_objects: list[Obj], kustomize_objects: list[Obj]) -> list[str]:
    """Every object missing on one side or differing, one line each (empty when in step)."""
    chart = {key(o): o for o in map(normalise, helm_objects)}
    kust = {key(o): o for o in map(normalise, kustomize_objects)}
    problems = [f"{'/'.join(k)}: only in the chart" for k in sorted(set(chart) - set(kust))]
    problems += [f"{'/'.join(k)}: only in kustomize" for k in sorted(set(kust) - set(chart))]
    for k in sorted(set(chart) & set(kust)):
        problems += [f"{'/'.join(k)} {d}" for d in differences(chart[k], kust[k])]
    return problems
