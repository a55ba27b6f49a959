"""Tables fit an 80-column terminal (issue 22, D): at 80 columns every cell of the timeline
table was ``…``. Now the lowest-priority columns are left out, said in a caption, while a cell
would be cut; ``-o json`` and a pipe keep every column."""

from __future__ import annotations

import io
import json
import sys
from pathlib import Path

import pytest
from rich.console import Console
from typer.testing import CliRunner

from defrag.cli import app

TIMELINE = [
    *("simulate", "--protocol", "timeline", "--pods", "200", "--scale", "0.1"),
    *("-p", "best-fit", "--duration", "2h", "--warmup", "1h", "--defrag"),
]
KEY_COLUMNS = ("policy", "alloc", "1-GPU", "8-GPU h", "multi", "8/1")
runner = CliRunner()


def _on_terminal(monkeypatch: pytest.MonkeyPatch, width: int, args: list[str]) -> str:
    screen = Console(file=io.StringIO(), width=width, force_terminal=True, color_system=None)
    monkeypatch.setattr(sys.modules["defrag.cli.app"], "console", screen)
    result = runner.invoke(app, args)
    assert result.exit_code == 0, result.output
    text = screen.file.getvalue()  # type: ignore[attr-defined]
    assert isinstance(text, str)
    return text


def _cells(text: str) -> list[str]:
    return [
        cell.strip()
        for line in text.splitlines()
        if line.startswith(("│", "┃"))
        for cell in line.strip("│┃").replace("┃", "│").split("│")
    ]


def test_the_timeline_table_fits_80_columns(monkeypatch: pytest.MonkeyPatch) -> None:
    text = _on_terminal(monkeypatch, 80, TIMELINE)
    assert max(len(line) for line in text.splitlines()) <= 80
    cells = _cells(text)
    assert cells and "…" not in cells
    assert not any(c.endswith("…") for c in cells), cells
    for column in KEY_COLUMNS:
        assert column in text, (column, text)
    assert "best-fit+defrag" in cells
    assert "left out at 80 columns: scheduler, seeds" in " ".join(text.split())


def test_a_wide_terminal_shows_every_column(monkeypatch: pytest.MonkeyPatch) -> None:
    text = _on_terminal(monkeypatch, 220, TIMELINE)
    assert "left out" not in text
    for column in ("scheduler", "evictions", "multi p95 h", "lost GPU·h"):
        assert column in text


def test_json_keeps_every_column() -> None:
    doc = json.loads(runner.invoke(app, [*TIMELINE, "-o", "json"]).stdout)
    run = doc["runs"][0] if "runs" in doc else doc
    assert "evictions" in json.dumps(run) and "scheduler" in json.dumps(run)


SCATTERED = str(Path(__file__).parent / "fixtures" / "snapshots" / "scattered_20.json")


@pytest.mark.parametrize(
    "args",
    [
        ["plan", "-s", SCATTERED, "--at", "2026-11-29T12:00:00Z"],
        ["demo", "--cycles", "3", "--plot", "{tmp}/demo.png"],
    ],
)
def test_the_steps_table_keeps_pod_and_node_names_whole_at_80_columns(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, args: list[str]
) -> None:
    """Before: four rows of the demo's Steps read ``inference/ch…`` while the long reason
    column stayed. Now every pod and node name of the plan is a whole cell; the reason folds."""
    args = [a.format(tmp=tmp_path) for a in args]
    doc = json.loads(runner.invoke(app, [*args, "-o", "json"]).stdout)
    plan = doc.get("plan", doc)
    if "steps" not in plan:  # the demo's document: its plan is the first cycle's
        plan = next(c["plan"] for c in doc["cycles"] if c.get("plan"))
    names = {s["pod"] for s in plan["steps"]} | {s["from"] for s in plan["steps"]}
    text = _on_terminal(monkeypatch, 80, args)
    assert max(len(line) for line in text.splitlines()) <= 80
    steps = text.split("Steps", 1)[1].split("└", 1)[0]
    cells = set(_cells(steps))
    assert names and names <= cells, sorted(names - cells)
    assert not any(c.endswith("…") for c in cells), cells
