"""``defrag simulate --sweep``: a sweep file's mistakes are one ``error:`` line naming the file
and the field (exit 2); a sweep end to end on the embedded LocalCluster writes its table,
summary, plots and the winning settings file, which the daemon's settings loader reads; the
winner follows the stated rule (defrag/sim/sweep/best.py)."""

from __future__ import annotations

import csv
from pathlib import Path

import pytest
from typer.testing import CliRunner

from defrag.cli import app
from defrag.settings import load_settings
from defrag.sim.sweep.best import Candidate, pareto
from defrag.sim.sweep.spec import SweepError, load_sweep
from tests.test_sweep_dask import require_distributed

runner = CliRunner()

GOOD = """\
traces:
  - {synthetic: 200, scale: 0.1}
seeds: [42]
policies: [least-allocated]
rows: [none, defrag, descheduler-hnu]
timeline: {load: 0.9, duration: 1h, warmup: 30m, window_every: 1h}
grid:
  planner.make_room_worth: [1, 4]
"""


def invoke(*args: str) -> tuple[int, str, str]:
    result = runner.invoke(app, ["simulate", *args])
    return result.exit_code, result.stdout, result.stderr


@pytest.mark.parametrize(
    ("text", "field"),
    [
        ("seeds: 0\n", "seeds: a count of seeds must be >= 1"),
        ("rows: [none, defrag-typo]\n", "rows.1: unknown defragmenter 'defrag-typo'"),
        ("policies: [fastest]\n", "policies: unknown fastest"),
        ("timeline: {duration: 2}\n", "timeline.duration: expected a duration"),
        ("timeline: {warmup: 1x}\n", "timeline.warmup: cannot read '1x'"),
        ("grid: {planner.make_room_wurth: [1]}\n", "planner.make_room_wurth"),
        ("grid: {planner.make_room_worth: [-3]}\n", "planner.make_room_worth"),
        ("grid: {make_room_worth: [1]}\n", "grid: 'make_room_worth' is not a dotted setting"),
        ("traces: [{pods: nope.csv, nodes: nope.csv}]\n", "traces.0: "),
        ("traces: [alibaba]\n", "traces.0: expected synthetic, openb:<trace>"),
        ("colour: blue\n", "colour: Extra inputs are not permitted"),
        ("- just a list\n", "expected a mapping of sweep fields"),
        ("seeds: [1, 1]\n", "seeds: a seed is listed twice"),
    ],
)
def test_a_bad_sweep_file_is_one_error_line(tmp_path: Path, text: str, field: str) -> None:
    path = tmp_path / "bad.yaml"
    path.write_text(text, encoding="utf-8")
    code, out, err = invoke("--sweep", str(path))
    assert code == 2, (out, err)
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    assert lines[0].startswith(f"error: {path}") and field in lines[0], lines[0]


def test_a_missing_sweep_file_and_stray_flags(tmp_path: Path) -> None:
    code, _, err = invoke("--sweep", str(tmp_path / "none.yaml"))
    assert code == 2 and err.startswith(f"error: {tmp_path / 'none.yaml'}: cannot read")
    code, _, err = invoke("--best")
    assert code == 2 and err.strip() == "error: --dask/--best go with --sweep FILE"


def test_openb_traces_come_from_the_data_directory(tmp_path: Path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    monkeypatch.setenv("DEFRAG_DATA_DIR", str(tmp_path / "empty"))
    path = tmp_path / "s.yaml"
    path.write_text("traces: [openb:default]\n", encoding="utf-8")
    code, _, err = invoke("--sweep", str(path))
    assert code == 2 and "traces.0: reference data not found" in err, err


def test_a_sweep_end_to_end_on_the_embedded_cluster(tmp_path: Path) -> None:
    require_distributed()
    base = tmp_path / "base.yaml"
    base.write_text(
        "windows:\n  schedule:\n    - {cron: '0 * * * *', length_s: 1800}\n"
        "  max_evictions_per_node: 100\n",
        encoding="utf-8",
    )
    path = tmp_path / "sweep.yaml"
    path.write_text(GOOD + "settings: base.yaml\nresults: out\n", encoding="utf-8")
    code, out, err = invoke("--sweep", str(path), "--best")
    assert code == 0, (out, err)
    results = tmp_path / "out"
    rows = list(csv.DictReader((results / "runs.csv").open(encoding="utf-8")))
    assert [(r["row"], r["planner.make_room_worth"]) for r in rows] == [
        ("none", ""), ("defrag", "1"), ("defrag", "4"), ("descheduler-hnu", ""),
    ]  # fmt: skip
    assert len({r["key"] for r in rows}) == 4
    for name in ("runs.parquet", "summary.csv", "summary.md", "pareto.png"):
        assert (results / name).stat().st_size > 0, name
    assert (results / "setting-planner.make_room_worth.png").stat().st_size > 0
    best = results / "best-settings.yaml"
    settings = load_settings(best)  # ready to deploy: the daemon's own loader reads it
    assert settings.planner.make_room_worth in (1.0, 4.0)
    assert settings.windows.max_evictions_per_node == 100  # the base file kept
    assert "best: planner.make_room_worth=" in out
    # run again: everything comes from the cache
    code, out, _ = invoke("--sweep", str(path))
    assert code == 0 and "4 runs: 0 made, 4 from the cache, 0 failed" in out


def _c(name: str, goodput: float, lost: float) -> Candidate:
    return Candidate("defrag", 0, name, 1, goodput, lost, None)


def test_the_pareto_front_keeps_what_nothing_beats_on_both() -> None:
    a, b, c, d = _c("a", 90, 10), _c("b", 92, 20), _c("c", 89, 15), _c("d", 92, 25)
    assert [x.label for x in pareto([a, b, c, d])] == ["a", "b"]


def test_a_grid_is_every_combination_then_the_points(tmp_path: Path) -> None:
    path = tmp_path / "s.yaml"
    path.write_text(
        "grid: {planner.make_room_worth: [1, 2], windows.max_evictions_per_window: [8, 16]}\n"
        "points: [{planner.make_room_worth: 1, windows.max_evictions_per_window: 8},"
        " {planner.goal: repack}]\n",
        encoding="utf-8",
    )
    spec = load_sweep(path)
    points = spec.settings_points()
    assert len(points) == 5  # 4 combinations, the listed duplicate once, one more
    assert points[-1] == {"planner.goal": "repack"}
    assert spec.swept_keys() == [
        "planner.make_room_worth", "windows.max_evictions_per_window", "planner.goal",
    ]  # fmt: skip


def test_sweep_error_names_the_file(tmp_path: Path) -> None:
    path = tmp_path / "s.yaml"
    path.write_text("seeds: [\n", encoding="utf-8")
    with pytest.raises(SweepError, match=f"^{path}: line"):
        load_sweep(path)


def test_openb_and_file_traces_are_keyed_by_their_bytes(tmp_path: Path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    import hashlib

    from defrag.sim.sweep.tasks import plan_sweep
    from tests.support.data import require_data

    data = require_data("openb/openb_node_list_gpu_node.csv", "openb/openb_pod_list_default.csv")
    monkeypatch.setenv("DEFRAG_DATA_DIR", str(data))
    nodes = data / "openb" / "openb_node_list_gpu_node.csv"
    pods = data / "openb" / "openb_pod_list_default.csv"
    path = tmp_path / "s.yaml"
    path.write_text(
        f"traces: [openb:default, {{pods: {pods}, nodes: {nodes}, name: mine}}]\n"
        "rows: [none]\nseeds: [42]\n",
        encoding="utf-8",
    )
    plan = plan_sweep(load_sweep(path), path)
    default, mine = plan.traces
    assert (default.label, mine.label) == ("default", "mine")
    digest = hashlib.sha256(pods.read_bytes() + nodes.read_bytes()).hexdigest()
    assert default.digest == mine.digest == digest
    assert len(default.workload.nodes) == 1213  # the openb GPU node list
    # the same inputs make the same key, whichever way the trace was named
    assert plan.tasks[0].key == plan.tasks[1].key


def test_without_the_sweep_extra_it_says_what_to_install(tmp_path: Path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda name, *a: None if name == "pyarrow" else real(name, *a)
    )
    path = tmp_path / "s.yaml"
    path.write_text(GOOD, encoding="utf-8")
    code, _, err = invoke("--sweep", str(path))
    assert code == 2
    assert err.strip() == "error: --sweep needs pyarrow: pip install 'defrag[sweep]'"
