"""`defrag detect --alertmanager`: findings become alerts in the real Alertmanager."""

from __future__ import annotations

from pathlib import Path

import pytest
from typer.testing import CliRunner

from defrag.cli import app
from tests.support.alertmanager import alertmanager_with_receiver
from tests.support.binaries import free_port

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]
SCATTERED = ROOT / "tests" / "fixtures" / "snapshots" / "scattered_20.json"
runner = CliRunner()


def test_detect_sends_findings_to_alertmanager() -> None:
    with alertmanager_with_receiver() as (server, _receiver):
        result = runner.invoke(
            app,
            [
                "detect",
                "-s",
                str(SCATTERED),
                "-r",
                str(ROOT / "rules" / "fragmentation.yaml"),
                "--alertmanager",
                server.url,
                "--cluster-label",
                "lab",
                "-o",
                "json",
            ],
        )
        assert result.exit_code == 0, result.output
        alerts = server.alerts(detector="fragmentation", cluster="lab")
        subjects = sorted(a["labels"].get("node", "cluster") for a in alerts)
        # the cluster finding plus gpu-01 … gpu-06 (2 stranded GPUs each, see test_rules_cli)
        assert subjects == ["cluster"] + [f"gpu-0{i}" for i in range(1, 7)]


def test_unreachable_alertmanager_exits_nonzero() -> None:
    url = f"http://127.0.0.1:{free_port()}"
    result = runner.invoke(
        app, ["detect", "-s", str(SCATTERED), "-r", str(ROOT / "rules"), "--alertmanager", url]
    )
    assert result.exit_code == 3  # incomplete: no Alertmanager took the alerts
    assert "alerts not sent" in result.stderr


def test_at_and_alertmanager_do_not_mix() -> None:
    result = runner.invoke(
        app, ["detect", "-s", str(SCATTERED), "--at", "0", "--alertmanager", "http://x:9093"]
    )
    assert result.exit_code == 2 and "--at cannot be combined" in result.stderr
