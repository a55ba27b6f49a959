"""Runs one Helm action with the real Helm v4 engine (the ``helm-sdkpy`` package, Helm's Go
library as a shared object) and prints its answer as JSON.

It runs in the tools virtualenv (``make tools-helm``, ``.tools/helm``), not in defrag's: the
package is a test tool, never a runtime dependency. Only the standard library and ``helm_sdkpy``
are imported. tests/support/helm.py drives it.

    echo '{"action": "lint", "chart": "charts/defrag"}' | .tools/helm/bin/python helm_engine.py

Input: one JSON object, ``action`` one of lint, install, upgrade, list, status, uninstall, and
that action's fields (see ``run``). Output: ``{"ok": true, "result": ...}`` or
``{"ok": false, "error": <Helm's message>, "kind": <the exception's class>}``.
"""

from __future__ import annotations

import asyncio
import json
import sys
from typing import Any


def run(request: dict[str, Any]) -> Any:
    import helm_sdkpy as helm

    action = request["action"]
    config = helm.Configuration(
        namespace=request.get("namespace", "default"), kubeconfig=request.get("kubeconfig")
    )
    timeout = int(request.get("timeout_s", 120))
    if action == "lint":
        return asyncio.run(helm.Lint(config).run(request["chart"]))
    if action == "install":
        return asyncio.run(
            helm.Install(config).run(
                request["release"],
                request["chart"],
                values=request.get("values") or None,
                create_namespace=bool(request.get("create_namespace", False)),
                wait=bool(request.get("wait", False)),
                timeout=timeout,
                # Helm v4's own default for install: server-side apply, with strict field
                # validation (an unknown field is refused, not pruned).
                server_side_apply=True,
            )
        )
    if action == "upgrade":
        return asyncio.run(
            helm.Upgrade(config).run(
                request["release"],
                request["chart"],
                values=request.get("values") or None,
                wait=bool(request.get("wait", False)),
                timeout=timeout,
                server_side_apply=True,
                reset_values=bool(request.get("reset_values", False)),
                reuse_values=bool(request.get("reuse_values", False)),
            )
        )
    if action == "list":
        return asyncio.run(helm.List(config).run(all=bool(request.get("all", False))))
    if action == "status":
        return asyncio.run(helm.Status(config).run(request["release"]))
    if action == "uninstall":
        return asyncio.run(
            helm.Uninstall(config).run(
                request["release"], wait=bool(request.get("wait", True)), timeout=timeout
            )
        )
    if action == "version":
        return {"helm_sdkpy": helm.__version__}
    raise ValueError(f"unknown action {action!r}")


def main() -> int:
    request = json.load(sys.stdin)
    try:
        answer: dict[str, Any] = {"ok": True, "result": run(request)}
    except Exception as exc:  # every Helm error comes back to the test as data
        answer = {"ok": False, "error": str(exc), "kind": type(exc).__name__}
    json.dump(answer, sys.stdout)
    return 0


if __name__ == "__main__":
    sys.exit(main())
