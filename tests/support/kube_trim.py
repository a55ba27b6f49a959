"""The plain recursive reading of the watched store's field trimming: the reference the store's
trimmers (``defrag.adapters.kube_watch.trimmer``, built once per spec) are checked against."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from defrag.adapters.kube_watch import LAST_APPLIED, Spec


def trim(obj: Mapping[str, Any], spec: Spec) -> dict[str, Any]:
    """``obj`` with only the fields ``spec`` names, walked plainly for every object."""
    out: dict[str, Any] = {}
    for key, keep in spec.items():
        if key not in obj:
            continue
        value = obj[key]
        if keep is True:
            out[key] = value
        elif isinstance(value, dict):
            out[key] = trim(value, keep)
        elif isinstance(value, list):
            out[key] = [trim(v, keep) if isinstance(v, dict) else v for v in value]
        else:
            out[key] = value
    meta = out.get("metadata")
    if isinstance(meta, dict):
        annotations = meta.get("annotations")
        if isinstance(annotations, dict) and LAST_APPLIED in annotations:
            meta["annotations"] = {k: v for k, v in annotations.items() if k != LAST_APPLIED}
    return out
