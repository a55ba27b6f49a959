"""`defrag run` and `defrag demo` from the command line, on the simulated and emulated clusters."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest
from typer.testing import CliRunner

from defrag.cli import app
from tests.support.kubeapi import KubeApi
from tests.support.snapshots import scattered_20

runner = CliRunner()


@pytest.fixture(autouse=True)
def clean_env(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    import os

    for key in list(os.environ):
        if key.startswith("DEFRAG_"):
            monkeypatch.delenv(key)
    yield


def test_once_on_the_simulated_cluster_prints_a_larger_job_after() -> None:
    result = runner.invoke(app, ["run", "--cluster", "sim", "--once", "--output", "json"])
    assert result.exit_code == 0, result.output
    doc = json.loads(result.stdout)
    assert set(doc) >= {"findings", "plan", "executed", "before", "after"}
    # Built-in cluster: 20 free GPUs, one or two per 8-GPU node → a whole node after the plan.
    assert doc["before"]["largest_placeable_job"] == 2
    assert doc["after"]["largest_placeable_job"] == 8
    assert doc["dry_run"] is True and doc["executed"]["counts"] == {
        "planned": len(doc["plan"]["steps"])
    }


def kubeconfig(tmp_path: Path, url: str) -> Path:
    path = tmp_path / "kubeconfig"
    path.write_text(
        "apiVersion: v1\nkind: Config\ncurrent-context: emu\n"
        f"clusters:\n- name: emu\n  cluster:\n    server: {url}\n"
        "users:\n- name: me\n  user: {}\n"
        "contexts:\n- name: emu\n  context:\n    cluster: emu\n    user: me\n"
    )
    return path


def test_once_against_an_api_server_in_dry_run_writes_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    with KubeApi(scattered_20()["items"]) as api:
        monkeypatch.setenv("DEFRAG_CLUSTER__KUBECONFIG", str(kubeconfig(tmp_path, api.url)))
        result = runner.invoke(app, ["run", "--once", "--output", "json"])
        assert result.exit_code == 0, result.output
        doc = json.loads(result.stdout)
        assert doc["plan"]["steps"] and doc["after"]["largest_placeable_job"] == 8
        assert api.writes() == []  # no eviction, taint, Event or Lease
        assert {r.method for r in api.requests} == {"GET"}


@pytest.mark.parametrize(
    ("args", "env", "message"),
    [
        (["run", "--cluster", "sim", "--once", "--rules", "/nonexistent"], {}, "/nonexistent"),
        (
            ["run", "--cluster", "sim", "--once"],
            {"DEFRAG_EXECUTION__BATCH_SIZE": "0"},
            "setting execution.batch_size (env DEFRAG_EXECUTION__BATCH_SIZE)",
        ),
        (["run", "--once", "--settings", "/nonexistent.yaml"], {}, "no such file"),
        (
            ["run", "--once"],
            {"DEFRAG_CLUSTER__KUBECONFIG": "/nonexistent-kubeconfig"},
            "kubeconfig /nonexistent-kubeconfig: no such file",
        ),
    ],
)
def test_bad_input_is_one_clear_line_and_exit_2(
    monkeypatch: pytest.MonkeyPatch, args: list[str], env: dict[str, str], message: str
) -> None:
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    result = runner.invoke(app, args)
    assert result.exit_code == 2
    assert message in " ".join(result.output.split())  # rich may wrap the line
    assert "Traceback" not in result.output


def test_demo_moves_pods_in_the_window_and_writes_a_plot(tmp_path: Path) -> None:
    plot = tmp_path / "demo.png"
    result = runner.invoke(app, ["demo", "--cycles", "4", "--plot", str(plot), "-o", "json"])
    assert result.exit_code == 0, result.output
    doc = json.loads(result.stdout)
    executed = [c["executed"] for c in doc["cycles"]]
    # 01:50 and 01:55: outside the 02:00 window, nothing runs; 02:00: the moves.
    assert executed[0] is None and executed[1] is None
    assert executed[2]["counts"].get("evicted", 0) > 0
    # Re-observed after the moves: the starving 8-GPU job took the room made for it.
    assert doc["cycles"][2]["verification"]["met"]
    assert doc["cycles"][2]["verification"]["targets_placed"] == ["research/train-llm-0"]
    assert doc["train_llm_node"] is not None
    kinds = [{f["kind"] for f in c["findings"]} for c in doc["cycles"]]
    assert "starvation" in kinds[0] and "starvation" not in kinds[3]
    assert plot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
