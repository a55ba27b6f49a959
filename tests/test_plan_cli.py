"""``defrag plan``: the JSON contract, YAML round trip, clear errors."""

from __future__ import annotations

import json
from pathlib import Path

import yaml
from typer.testing import CliRunner

from defrag.cli import app
from defrag.plan import Plan

SEED = Path(__file__).parent / "fixtures" / "snapshots" / "scattered_20.json"
NOW = "2026-11-29T12:00:00Z"
runner = CliRunner()


def run(*args: str) -> tuple[int, str]:
    result = runner.invoke(app, ["plan", *args])
    return result.exit_code, result.output


def test_json_output_has_the_issue_keys() -> None:
    code, out = run("--snapshot", str(SEED), "--goal", "make-room", "--now", NOW, "-o", "json")
    assert code == 0, out
    data = json.loads(out)
    assert {"steps", "blocked", "before", "after", "cost"} <= set(data)
    assert data["steps"], "the seed scenario needs moves"
    for step in data["steps"]:
        assert {"pod", "from", "to", "kind", "reason"} <= set(step)
        assert step["kind"] in ("migrate", "preempt")
        assert (step["to"] is None) == (step["kind"] == "preempt")
    assert data["after"]["largest_placeable_job"] >= 8 > data["before"]["largest_placeable_job"]


def test_yaml_output_round_trips() -> None:
    code, out = run("--snapshot", str(SEED), "--now", NOW, "-o", "yaml")
    assert code == 0, out
    plan = Plan.from_dict(yaml.safe_load(out))
    assert plan.to_dict() == yaml.safe_load(out)
    code, again = run("--snapshot", str(SEED), "--now", NOW, "-o", "yaml")
    assert again == out  # deterministic


def test_max_evictions_zero_plans_nothing() -> None:
    code, out = run("-s", str(SEED), "--now", NOW, "--max-evictions", "0", "-o", "json")
    assert code == 0
    data = json.loads(out)
    assert data["steps"] == []
    assert any(b["constraint"] == "budget-window" for b in data["blocked"])


def test_table_output_names_the_steps() -> None:
    code, out = run("-s", str(SEED), "--now", NOW, "--goal", "make-room")
    assert code == 0
    assert "migrate" in out and "largest_placeable_job" in out


def test_errors_are_one_line_and_exit_2(tmp_path: Path) -> None:
    code, out = run("-s", str(tmp_path / "missing.json"))
    assert code == 2 and "missing.json" in out and "Traceback" not in out
    code, out = run("-s", str(SEED), "--policy", "nope")
    assert code == 2 and "unknown policy 'nope'" in out
    code, out = run("-s", str(SEED), "--at", "tuesday")
    assert code == 2 and "--at" in out


def test_a_live_plan_reads_the_owners_of_its_victims(tmp_path: Path) -> None:
    """On a live cluster ``defrag plan`` decides as the daemon does: every victim's controller
    is read first. With the controllers there, it plans moves; once every Job is out of
    retries and every other controller gone, it moves nothing and says why."""
    from tests.support.kubeapi import KubeApi
    from tests.support.snapshots import scattered_20
    from tests.test_daemon_cli import kubeconfig

    with KubeApi(scattered_20()["items"]) as api:
        config = kubeconfig(tmp_path, api.url)
        args = ("--kubeconfig", str(config), "--goal", "make-room", "--now", NOW, "-o", "json")
        code, out = run(*args)
        assert code == 0, out
        assert json.loads(out)["steps"]
        gets = [r for r in api.requests if r.verb == "get" and r.resource != "leases"]
        assert gets, "the victims' owners were not read"
        for job in api.objects("Job"):
            job["spec"]["backoffLimit"] = 0
            api.put(job)
        for kind in ("ReplicaSet", "StatefulSet", "ReplicationController"):
            for obj in api.objects(kind):
                api.remove(kind, obj["metadata"]["name"], obj["metadata"]["namespace"])
        code, out = run(*args)
        assert code == 0, out
        plan = json.loads(out)
        assert plan["steps"] == []
        details = {(b["constraint"], "does not exist" in b["detail"]) for b in plan["blocked"]}
        assert {("job-retries", False), ("bare-pod", True)} <= details, plan["blocked"]
