"""Render a kustomization as ``kubectl kustomize`` does (the deploy tests and the e2e suite)."""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Any

import yaml

from tests.support.binaries import require_binary


def render(kustomization: Path) -> list[dict[str, Any]]:
    """Every object ``kubectl kustomize`` renders from ``kustomization``, in order."""
    kubectl = require_binary("kubectl")
    out = subprocess.run(
        [kubectl, "kustomize", str(kustomization)],
        check=True,
        capture_output=True,
        text=True,
        timeout=60,
    ).stdout
    return [doc for doc in yaml.safe_load_all(out) if doc]
