"""`defrag report` and `defrag place` end to end on real-shaped Kubernetes snapshots."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from defrag.cli import app

SNAPSHOTS = Path(__file__).parent / "fixtures" / "snapshots"
runner = CliRunner()


def run_json(*args: str) -> dict:  # type: ignore[type-arg]
    result = runner.invoke(app, [*args, "--output", "json"])
    assert result.exit_code == 0, result.output
    return json.loads(result.stdout)  # type: ignore[no-any-return]


@pytest.mark.parametrize(
    ("gpus", "node", "scores"),
    [
        # worked example of docs/concepts.md: 1-GPU pod → node-1 (100);
        # node-3 int((1 − 3/8)·100) = int(62.5) = 62; node-2 0
        (1, "node-1", {"node-1": 100, "node-2": 0, "node-3": 62}),
        # 8-GPU pod → node-2 (100); the others are filtered
        (8, "node-2", {"node-1": None, "node-2": 100.0, "node-3": None}),
    ],
)
def test_place_worked_example(gpus: int, node: str, scores: dict[str, float | None]) -> None:
    data = run_json(
        "place", "--snapshot", str(SNAPSHOTS / "worked_example.json"), "--gpus", str(gpus)
    )
    assert data["node"] == node
    assert data["score"] == 100.0
    got = {n["node"]: n["score"] for n in data["nodes"]}
    assert got == scores
    for n in data["nodes"]:
        assert bool(n["reasons"]) == (n["score"] is None)


def test_report_seed_scenario() -> None:
    data = run_json("report", "--snapshot", str(SNAPSHOTS / "scattered_20.json"))
    assert data["free_gpus"] == 20
    assert data["largest_placeable_job"] < 8
    assert data["stranded"]["8"] == 20
    assert set(data["placeable"]) == {"1", "2", "4", "8"}
    assert all({"name", "total", "free"} <= set(n) for n in data["nodes"])


def test_place_nvlink_reason_names_topology() -> None:
    data = run_json("place", "--snapshot", str(SNAPSHOTS / "nvlink.json"), "--gpus", "4")
    reasons = {n["node"]: n["reasons"] for n in data["nodes"]}
    assert any("nvlink" in r for rs in reasons.values() for r in rs)


def test_table_output_mentions_the_choice() -> None:
    result = runner.invoke(
        app, ["place", "--snapshot", str(SNAPSHOTS / "worked_example.json"), "--gpus", "1"]
    )
    assert result.exit_code == 0
    assert "node-1" in result.stdout and "62" in result.stdout and "62.5" not in result.stdout


BAD_NODE = (
    '{"kind": "List", "items": [{"kind": "Node", "metadata": {"name": "a"}, '
    '"status": {"allocatable": {"cpu": "lots"}}}]}'
)


@pytest.mark.parametrize(
    ("content", "needle", "flags"),
    [
        (BAD_NODE, "status.allocatable.cpu", ["--strict"]),
        ("{not json", "invalid JSON", []),
    ],
)
def test_bad_snapshot_is_a_clear_error(
    tmp_path: Path, content: str, needle: str, flags: list[str]
) -> None:
    bad = tmp_path / "bad.json"
    bad.write_text(content)
    proc = subprocess.run(
        [
            sys.executable,
            "-c",
            "from defrag.cli import main; main()",
            "report",
            "--snapshot",
            str(bad),
            *flags,
        ],
        capture_output=True,
        text=True,
        check=False,
    )
    assert proc.returncode == 2
    assert needle in proc.stderr and str(bad.name) in proc.stderr
    assert "Traceback" not in proc.stderr


def test_an_unreadable_object_is_a_warning_not_a_failed_report(tmp_path: Path) -> None:
    bad = tmp_path / "bad.json"
    bad.write_text(BAD_NODE)
    result = runner.invoke(app, ["report", "--snapshot", str(bad), "-o", "json"])
    assert result.exit_code == 0, result.output
    warning = "warning: Node a: status.allocatable.cpu: not a Kubernetes quantity: 'lots'; left out"
    assert warning in result.stderr
    assert json.loads(result.stdout)["warnings"][0].startswith("Node a: status.allocatable.cpu")


def test_bad_flags_are_errors() -> None:
    result = runner.invoke(
        app,
        [
            "place",
            "--snapshot",
            str(SNAPSHOTS / "worked_example.json"),
            "--gpus",
            "2",
            "--gpu-milli",
            "500",
        ],
    )
    assert result.exit_code == 2
    result = runner.invoke(
        app, ["place", "--snapshot", str(SNAPSHOTS / "worked_example.json"), "--policy", "nope"]
    )
    assert result.exit_code == 2
