"""The real Helm engine for the chart's tests: Helm v4's Go library (PyPI ``helm-sdkpy``, pinned in
the Makefile) in its own virtualenv, driven through tests/support/helm_engine.py.

The package declares Python >= 3.12 and lives apart from defrag's dependencies (``make
tools-helm`` installs it into ``.tools/helm``; ``HELM_TOOLS_PYTHON`` names another interpreter
that has it). Without it the tests skip with one line saying so; under ``CI=true`` they fail.
"""

from __future__ import annotations

import json
import os
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tests.support.binaries import unavailable

ROOT = Path(__file__).resolve().parents[2]
CHART = ROOT / "charts" / "defrag"
ENGINE = Path(__file__).with_name("helm_engine.py")
TOOLS_PYTHON = ROOT / ".tools" / "helm" / "bin" / "python"
HOW_TO_GET = "no Helm engine: run `make tools-helm` (helm-sdkpy in .tools/helm)"
# Lint severities of Helm's pkg/chart/v2/lint/support/message.go (InfoSev, WarningSev, ErrorSev).
INFO, WARNING, ERROR = 1, 2, 3


class HelmError(AssertionError):
    """Helm refused; ``str()`` is Helm's own message."""


@dataclass(frozen=True)
class Helm:
    python: Path

    def call(self, action: str, timeout_s: float = 300, **fields: Any) -> Any:
        """Helm's answer to ``action``; raises HelmError with Helm's message when it refuses."""
        done = subprocess.run(
            [str(self.python), str(ENGINE)],
            input=json.dumps({"action": action, **fields}),
            capture_output=True,
            text=True,
            timeout=timeout_s,
            check=False,
        )
        if done.returncode != 0 or not done.stdout.strip():
            raise RuntimeError(f"helm engine exited {done.returncode}: {done.stderr[-2000:]}")
        answer = json.loads(done.stdout)
        if not answer["ok"]:
            raise HelmError(answer["error"])
        return answer["result"]

    def lint(self, chart: Path = CHART) -> list[dict[str, Any]]:
        """Lint's messages (``Severity``, ``Path``), as ``helm lint`` runs its rules."""
        result = self.call("lint", chart=str(chart))
        return list(result.get("Messages") or [])

    def install(
        self,
        release: str,
        namespace: str,
        kubeconfig: Path,
        values: dict[str, Any],
        chart: Path = CHART,
        *,
        create_namespace: bool = True,
    ) -> dict[str, Any]:
        return dict(
            self.call(
                "install",
                release=release,
                chart=str(chart),
                namespace=namespace,
                kubeconfig=str(kubeconfig),
                values=values,
                create_namespace=create_namespace,
            )
        )

    def upgrade(
        self,
        release: str,
        namespace: str,
        kubeconfig: Path,
        values: dict[str, Any],
        chart: Path = CHART,
        *,
        reuse_values: bool = False,
    ) -> dict[str, Any]:
        return dict(
            self.call(
                "upgrade",
                release=release,
                chart=str(chart),
                namespace=namespace,
                kubeconfig=str(kubeconfig),
                values=values,
                reuse_values=reuse_values,
                reset_values=not reuse_values,
            )
        )

    def list(self, namespace: str, kubeconfig: Path) -> list[dict[str, Any]]:
        return list(
            self.call("list", namespace=namespace, kubeconfig=str(kubeconfig), all=True) or []
        )

    def uninstall(self, release: str, namespace: str, kubeconfig: Path) -> dict[str, Any]:
        return dict(
            self.call("uninstall", release=release, namespace=namespace, kubeconfig=str(kubeconfig))
        )


def find_helm() -> Helm | None:
    python = Path(os.environ.get("HELM_TOOLS_PYTHON") or TOOLS_PYTHON)
    if not os.access(python, os.X_OK):
        return None
    probe = subprocess.run(
        [str(python), "-c", "import helm_sdkpy"], capture_output=True, text=True, check=False
    )
    return Helm(python) if probe.returncode == 0 else None


def require_helm() -> Helm:
    """The engine, or skip with the line saying how to get it (fail under CI=true)."""
    helm = find_helm()
    if helm is None:
        unavailable(HOW_TO_GET)
    return helm
