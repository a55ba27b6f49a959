"""`defrag simulate` end to end (small synthetic workloads) and the report helpers."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from typer.testing import CliRunner

from defrag.cli import app
from defrag.cli.simulate import parse_seeds
from defrag.model.resources import Node, Pod
from defrag.sim.fill import fill
from defrag.sim.report import fill_rows, markdown_table, paper_medians, summarize_fill
from tests.support.data import require_data

runner = CliRunner()
SMALL = ["--pods", "300", "--scale", "0.2"]


def invoke(*args: str) -> tuple[int, str]:
    result = runner.invoke(app, ["simulate", *args])
    return result.exit_code, result.output


def squeeze(text: str) -> str:
    """Text without whitespace or box drawing, so rich's wrapping does not matter."""
    return re.sub(r"[\s│╭╮╰╯─]+", "", text)


def test_fill_json_has_runs_and_summary(tmp_path: Path) -> None:
    png = tmp_path / "fill.png"
    code, out = invoke(
        *SMALL,
        "-p",
        "best-fit",
        "-p",
        "least-allocated",
        "--seeds",
        "2",
        "-o",
        "json",
        "--plot",
        str(png),
    )
    assert code == 0, out
    data = json.loads(out)
    assert data["protocol"] == "fill" and data["workload"] == "synthetic"
    runs = data["runs"]
    assert [(r["policy"], r["seed"]) for r in runs] == [
        ("best-fit", 42),
        ("best-fit", 43),
        ("least-allocated", 42),
        ("least-allocated", 43),
    ]
    for r in runs:
        assert {"allocation_at_100", "frag_at_100", "failed_pods", "migrations"} <= set(r)
    best = sorted(r["allocation_at_100"] for r in runs if r["policy"] == "best-fit")
    # The median of two values is their mean.
    assert data["summary"]["best-fit"]["allocation_at_100_median"] == pytest.approx(
        sum(best) / 2, abs=1e-3
    )
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_timeline_table_and_plot(tmp_path: Path) -> None:
    png = tmp_path / "timeline.png"
    args = ("--protocol", "timeline", "--duration", "3h", "--warmup", "1h", "-p", "least-allocated")
    code, out = invoke(*SMALL, *args, "--plot", str(png))
    assert code == 0, out
    assert "mean pending time" in out and "least-allocated" in out and "8-GPU h" in out
    assert "training: checkpoint every 30–60 min, restart 10 min" in out
    assert png.exists()
    code, out = invoke(*SMALL, *args, "-o", "json")
    data = json.loads(out)
    (run,) = data["runs"]
    assert run["policy"] == "least-allocated" and run["load"] == 0.9
    assert (
        "1" in run["pending_by_gpus"]
        and "mean_wait_h_by_gpus" in data["summary"]["least-allocated"]
    )


def test_timeline_defragmenters_side_by_side_json() -> None:
    args = ("--protocol", "timeline", "--duration", "3h", "--warmup", "1h", "-p", "least-allocated")
    names = ("none", "descheduler-hnu", "kai-consolidation")
    code, out = invoke(
        *SMALL, *args, *(x for n in names for x in ("--defragmenter", n)), "-o", "json"
    )
    assert code == 0, out
    runs = {r["defragmenter"]: r for r in json.loads(out)["runs"]}
    assert set(runs) == set(names)
    assert runs["descheduler-hnu"]["scheduler"] == "most-allocated"
    assert runs["kai-consolidation"]["scheduler"] == "kai-binpack"
    for run in runs.values():
        assert {"goodput_pct", "lost_gpu_hours", "migrations", "evictions", "cost"} <= set(run)
        for stats in run["pending_by_gpus"].values():
            assert {"mean_wait_h", "p95_wait_h"} <= set(stats)
    assert runs["none"]["evictions"] == 0 and runs["none"]["lost_gpu_hours"] == 0
    assert runs["none"]["cost"]["training"]["restart_overhead_h"] == pytest.approx(10 / 60, 1e-3)
    # --defrag stays a shorthand: with and without the planner
    code, out = invoke(*SMALL, *args, "--defrag", "-o", "json")
    assert [r["defragmenter"] for r in json.loads(out)["runs"]] == ["none", "defrag"]


def test_the_deployments_settings_file_drives_the_daemon_in_the_simulator() -> None:
    """The file the Deployment mounts: its window (02:00, an hour after the warm-up's start) is
    the daemon's; a setting given with --set wins over it (no evictions at all)."""
    args = ("--protocol", "timeline", "--duration", "3h", "--warmup", "1h", "-p", "least-allocated")
    base = ("--defrag", "--settings", "deploy/base/settings.yaml", "-o", "json")
    code, out = invoke(*SMALL, *args, *base)
    assert code == 0, out
    runs = {r["defragmenter"]: r for r in json.loads(out)["runs"]}
    assert runs["defrag"]["evictions"] > 0
    code, out = invoke(*SMALL, *args, *base, "--set", "windows.max_evictions_per_window=0")
    assert code == 0, out
    runs = {r["defragmenter"]: r for r in json.loads(out)["runs"]}
    assert runs["defrag"]["evictions"] == 0


def test_trace_and_nodes_files(tmp_path: Path) -> None:
    nodes = tmp_path / "nodes.csv"
    nodes.write_text("sn,cpu_milli,memory_mib,gpu,model\nn0,64000,1024,8,G2\nn1,64000,1024,2,T4\n")
    pods = tmp_path / "pods.csv"
    pods.write_text(
        "name,cpu_milli,memory_mib,num_gpu,gpu_milli\np0,1000,1,1,500\np1,2000,1,2,1000\n"
    )
    code, out = invoke("--trace", str(pods), "--nodes", str(nodes), "-p", "best-fit", "-o", "json")
    assert code == 0, out
    assert json.loads(out)["workload"] == "pods"


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--seeds", "x"], "--seeds: expected a count or a comma-separated list"),
        (["--seeds", "0"], "a count must be >= 1"),
        (["-p", "tetris"], "unknown policy tetris"),
        (["--trace", "pods.csv"], "--trace needs --nodes"),
        (["--plot", "out.jpg"], "must end in .png"),
        (["--protocol", "timeline", "--load", "0"], "load must be in (0, 5]"),
        (["--protocol", "timeline", "--run-time-scale", "0"], "--run-time-scale must be > 0"),
        (["--jobs", "0"], "--jobs must be >= 1"),
        (["--protocol", "timeline", "--defragmenter", "tetris"], "--defragmenter: unknown tetris"),
        (["--defragmenter", "descheduler-hnu"], "only none and defrag run in the fill protocol"),
        (["--protocol", "timeline", "--checkpoint-scale", "0"], "checkpoint scale must be > 0"),
        (["--protocol", "timeline", "--defrag", "--settings", "nowhere.yaml"], "nowhere.yaml"),
        (["--protocol", "timeline", "--defrag", "--set", "planner.bogus=1"], "planner.bogus"),
        (["--protocol", "timeline", "--defrag", "--set", "max_evictions_per_window=3"],
         "is now windows.max_evictions_per_window"),
        (["--protocol", "timeline", "--defrag", "--set", "planner.depth"], "expected KEY=VALUE"),
        (["--protocol", "timeline", "--defrag", "--window-every", "5h"], "no crontab form"),
        (["--settings", "deploy/base/settings.yaml"], "give --defrag in the timeline"),
    ],
)  # fmt: skip
def test_user_mistakes_are_one_line_errors(args: list[str], message: str) -> None:
    code, out = invoke(*SMALL, *args)
    assert code == 2
    assert squeeze(message) in squeeze(out)
    assert "Traceback" not in out


def test_malformed_trace_names_file_and_line(tmp_path: Path) -> None:
    nodes = tmp_path / "nodes.csv"
    nodes.write_text("sn,cpu_milli,memory_mib,gpu,model\nn0,64000,1024,8,G2\n")
    pods = tmp_path / "pods.csv"
    pods.write_text("name,cpu_milli,memory_mib,num_gpu,gpu_milli\np0,1000,1,one,500\n")
    code, out = invoke("--trace", str(pods), "--nodes", str(nodes))
    assert code == 2
    assert squeeze(f"{pods}:2: column 'num_gpu': expected an integer, got 'one'") in squeeze(out)


@pytest.mark.parametrize(
    ("text", "seeds"),
    [("3", [42, 43, 44]), ("7,9", [7, 9]), ("5,", [5]), (" 1 ", [42]), ("4,4,5", [4, 5])],
)
def test_parse_seeds(text: str, seeds: list[int]) -> None:
    assert parse_seeds(text) == seeds


def test_summary_rows_and_markdown() -> None:
    nodes = [Node("n", 8000, 1, num_gpu=2, gpu_model="T4")]
    runs = [
        fill(nodes, [Pod("a", num_gpu=1), Pod("b", num_gpu=2)], "best-fit", seed=s)
        for s in (1, 2, 3)
    ]
    (summary,) = summarize_fill(runs)
    # a fits (50% arrived, 50% allocated), b does not: 150% arrived, so the headline point
    # (100%) is interpolated between 50% and 150% → 50% allocated.
    assert summary.allocation_at_100_median == pytest.approx(50.0)
    assert summary.failed_pods_median == 1
    (row,) = fill_rows(runs)
    assert row[:3] == ("best-fit", "3", "50.00")
    md = markdown_table(("a", "b"), [("1", "2")])
    assert md == "| a | b |\n|---|---|\n| 1 | 2 |\n"


def test_paper_medians_match_the_readme() -> None:
    medians = paper_medians(require_data("fgd/allo.csv") / "fgd" / "allo.csv")
    # README table: default FGD 95.23, BestFit 92.91; cpu050 Random 88.98.
    assert medians[("default", "fgd")] == pytest.approx(95.23, abs=0.01)
    assert medians[("default", "best-fit")] == pytest.approx(92.91, abs=0.01)
    assert medians[("cpu050", "random")] == pytest.approx(88.98, abs=0.01)
