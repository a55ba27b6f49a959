"""`defrag rules check` and `defrag detect` without a Prometheus: errors are one clear message."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from defrag.cli import app

ROOT = Path(__file__).resolve().parents[1]
SCATTERED = ROOT / "tests" / "fixtures" / "snapshots" / "scattered_20.json"
runner = CliRunner()


def test_rules_check_passes_on_shipped_rules(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PATH", "/nonexistent")  # no promtool: types only, said so
    result = runner.invoke(app, ["rules", "check", str(ROOT / "rules")])
    assert result.exit_code == 0, result.output
    assert "7 rule(s) in 5 file(s) OK; PromQL not checked (no promtool)" in result.output


@pytest.mark.parametrize(
    ("text", "needle"),
    [
        ("rules:\n  - name: x\n    detector: magic\n", "r.yaml:3: rules[0].detector:"),
        (
            "rules:\n  - name: i\n    detector: idle\n    query: up\n    for: soon\n",
            "r.yaml:5: rules[0].for: bad duration 'soon'",
        ),
        (
            "rules:\n  - name: i\n    detector: idle\n    query: up\n    threshold_pct: high\n",
            "r.yaml:5: rules[0].threshold_pct:",
        ),
    ],
)
def test_rules_check_reports_file_line_field(tmp_path: Path, text: str, needle: str) -> None:
    (tmp_path / "r.yaml").write_text(text)
    result = runner.invoke(app, ["rules", "check", str(tmp_path)])
    assert result.exit_code == 2
    assert needle in result.output
    assert "Traceback" not in result.output


def test_detect_needs_a_source() -> None:
    result = runner.invoke(app, ["detect"])
    assert result.exit_code == 2
    assert "give --prometheus URL and/or --snapshot FILE" in result.output


def test_detect_bad_time_is_a_user_error() -> None:
    result = runner.invoke(app, ["detect", "-s", str(SCATTERED), "--at", "yesterday"])
    assert result.exit_code == 2 and "--at: cannot read 'yesterday'" in result.output


def test_detect_from_a_snapshot_prints_json_findings() -> None:
    result = runner.invoke(
        app, ["detect", "-s", str(SCATTERED), "--at", "2026-03-02T12:00:00Z", "-o", "json"]
    )
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)
    assert data["at"] == "2026-03-02T12:00:00+00:00"
    kinds = {(f["kind"], f["subject"]) for f in data["findings"]}
    # 20 free GPUs scattered 2 per node over the partly used nodes: none placeable for 8
    assert ("fragmentation", "cluster") in kinds
    cluster = next(f for f in data["findings"] if f["subject"] == "cluster")
    assert cluster["evidence"]["stranded"]["8"] == 20
    assert set(cluster) >= {"kind", "subject", "severity", "fingerprint", "evidence"}
    assert data["skipped"] == {
        "cluster-idle": "no metrics source",
        "gpu-memory-leak": "no metrics source",
        # the snapshot's pods were created more than a day before --at
        "gpu-pods-spread": (
            "insufficient evidence: 0 informative placement(s) of 0 GPU pod(s) bound in the "
            "last 24 h (spreading and packing scores agree on the rest); the rule needs 20"
        ),
    }
