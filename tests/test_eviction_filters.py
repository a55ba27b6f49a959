"""The eviction filters (issue 22 item 8), as descheduler's DefaultEvictor takes them:
namespaces included or excluded, a label selector, a priority threshold — set in the daemon's
settings, honoured by the planner as named constraints, by the simulator through the same
PlannerConfig."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from defrag.cli import app
from defrag.model.resources import Node, Pod
from defrag.model.selectors import SelectorSyntaxError, parse_label_selector
from defrag.model.workload import WorkloadMix
from defrag.plan import make_plan
from defrag.plan.config import Constraints, PlannerConfig
from defrag.plan.constraints import blocked_from, check_pod
from defrag.scoring.policies import make_policy
from defrag.settings import SettingsError, load_settings
from defrag.sim.fill_hook import FILL_PLANNER, FillHook
from defrag.sim.state import SimState
from tests.test_plan_support import NOW, cluster, fill, gpu_node, pending, running

SEED = Path(__file__).parent / "fixtures" / "snapshots" / "scattered_20.json"
runner = CliRunner()

# --- the label selector grammar (k8s.io/apimachinery/pkg/labels.Parse) ----------------------


@pytest.mark.parametrize(
    ("text", "labels", "matches"),
    [
        ("", {}, True),  # selects everything
        ("app=web", {"app": "web"}, True),
        ("app==web", {"app": "web"}, True),
        ("app=web", {"app": "db"}, False),
        ("app!=web", {}, True),  # NotIn: an absent label matches
        ("app!=web", {"app": "web"}, False),
        ("tier in (a, b)", {"tier": "b"}, True),
        ("tier in (a,b)", {"tier": "c"}, False),
        ("tier notin (a,b)", {"tier": "c"}, True),
        ("tier notin (a,b)", {}, True),
        ("gpu", {"gpu": ""}, True),  # Exists
        ("gpu", {}, False),
        ("!gpu", {}, True),  # DoesNotExist
        ("!gpu", {"gpu": "1"}, False),
        # every requirement must hold: app=batch ✓, tier!=db ✓ (absent), in ✓, !canary ✓
        ("app=batch, tier!=db, zone in (x,y), !canary", {"app": "batch", "zone": "y"}, True),
        ("app=batch,!canary", {"app": "batch", "canary": "1"}, False),
        ("example.com/team=ml", {"example.com/team": "ml"}, True),
    ],
)
def test_label_selector_matches(text: str, labels: dict[str, str], matches: bool) -> None:
    assert parse_label_selector(text).matches(labels) is matches


@pytest.mark.parametrize(
    ("text", "where"),
    [
        ("app=", None),  # an empty value is allowed: app="" — not an error
        ("=web", "character 1: expected a label key"),
        ("app in a,b", "character 8: expected '('"),
        ("app in (a,b", "expected ',' or ')'"),
        ("app web", "expected '=', '==', '!=', 'in', 'notin', ',' or the end"),
        ("app=web,", "character 9: expected a label key"),
        ("app=web)", "expected ',' or the end"),
    ],
)
def test_label_selector_syntax_errors_name_the_position(text: str, where: str | None) -> None:
    if where is None:
        assert parse_label_selector(text).matches({"app": ""})
        return
    with pytest.raises(SelectorSyntaxError) as err:
        parse_label_selector(text)
    assert str(err.value).startswith(f"label selector {text!r}: at character ")
    assert where in str(err.value)


# --- each filter as a named constraint ------------------------------------------------------


@pytest.mark.parametrize(
    ("pod", "constraints", "blocked_by", "detail"),
    [
        # namespaces included: ml is in, serving is not
        (running("a", "n", namespace="ml"), Constraints(namespaces_include=frozenset({"ml"})),
         None, None),
        (running("a", "n", namespace="serving"),
         Constraints(namespaces_include=frozenset({"ml"})), "evict-namespace",
         "namespace serving is not in planner.evict_namespaces_include (ml)"),
        # namespaces excluded
        (running("a", "n", namespace="serving"),
         Constraints(namespaces_exclude=frozenset({"serving"})), "evict-namespace",
         "namespace serving is in planner.evict_namespaces_exclude"),
        (running("a", "n", namespace="ml"),
         Constraints(namespaces_exclude=frozenset({"serving"})), None, None),
        # label selector
        (running("a", "n", labels={"app": "batch"}),
         Constraints(label_selector=parse_label_selector("app=batch")), None, None),
        (running("a", "n", labels={"app": "web"}),
         Constraints(label_selector=parse_label_selector("app=batch")), "evict-label-selector",
         "labels do not match planner.evict_label_selector 'app=batch'"),
        # priority threshold: at it never moves (500 ≥ 500), just below it may (499 < 500)
        (running("a", "n", priority=500), Constraints(priority_threshold=500), "priority",
         "priority 500 ≥ planner.evict_priority_threshold 500"),
        (running("a", "n", priority=499), Constraints(priority_threshold=500), None, None),
    ],
)  # fmt: skip
def test_each_filter_is_a_named_constraint(
    pod: Pod, constraints: Constraints, blocked_by: str | None, detail: str | None
) -> None:
    status = check_pod(pod, constraints, NOW)
    if blocked_by is None:
        assert status.ok
        return
    blocked = blocked_from(pod.key, status)
    assert (blocked.constraint, blocked.detail) == (blocked_by, detail)


def test_a_filtered_pod_shows_in_the_plans_blocked_reasons() -> None:
    # n1 holds 6 GPUs of "keep" pods (namespace keep), 2 free; n2 is full of namespace-default
    # pods. A 4-GPU job needs 2 more GPUs on n1 (8 − 6 + 2 = 4), only from namespace keep.
    nodes = [gpu_node("n1"), gpu_node("n2")]
    pods = [
        *fill("n1", 6, namespace="keep"),
        *fill("n2", 8, prefix="d"),
        pending("job", 4, priority=1000),
    ]
    excluded = Constraints(namespaces_exclude=frozenset({"keep", "default"}))
    plan = make_plan(cluster(nodes, pods), "make-room", now=NOW, constraints=excluded)
    assert plan.steps == ()
    reasons = {(b.constraint, b.detail) for b in plan.blocked}
    assert ("evict-namespace", "namespace keep is in planner.evict_namespaces_exclude") in reasons


# --- settings: the filters, their contradiction ---------------------------------------------


def test_include_and_exclude_together_are_refused_in_one_line(tmp_path: Path) -> None:
    path = tmp_path / "defrag.yaml"
    path.write_text(
        "planner:\n  evict_namespaces_include: [ml]\n  evict_namespaces_exclude: [serving]\n"
    )
    with pytest.raises(SettingsError) as err:
        load_settings(path)
    message = str(err.value)
    assert "\n" not in message
    assert message.startswith(
        f"settings planner.evict_namespaces_include ({path}) and "
        f"planner.evict_namespaces_exclude ({path}) contradict each other"
    )


def test_a_bad_label_selector_is_refused_naming_the_setting(tmp_path: Path) -> None:
    path = tmp_path / "defrag.yaml"
    path.write_text("planner:\n  evict_label_selector: 'app in web'\n")
    with pytest.raises(
        SettingsError, match=r"setting planner\.evict_label_selector \(.*\): label sel"
    ):
        load_settings(path)


def test_namespace_lists_read_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DEFRAG_PLANNER__EVICT_NAMESPACES_EXCLUDE", "kube-system, monitoring")
    config = load_settings().planner_config()
    assert config.constraints.namespaces_exclude == frozenset({"kube-system", "monitoring"})


# --- the command line -----------------------------------------------------------------------


def test_plan_settings_filters_block_with_the_filter_named(tmp_path: Path) -> None:
    # scattered_20: room for the 8-GPU llm-train takes evicting ml pods (4 + 2 GPUs a node);
    # excluding ml leaves only the 1-GPU serving pods, too few on any node
    path = tmp_path / "defrag.yaml"
    path.write_text("planner:\n  evict_namespaces_exclude: [ml]\n")
    result = runner.invoke(
        app,
        ["plan", "--settings", str(path), "-s", str(SEED), "--goal", "make-room",
         "--at", "2026-11-29T12:00:00Z", "-o", "json"],
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    data = json.loads(result.output)
    assert data["steps"] == []
    named = [b for b in data["blocked"] if b["constraint"] == "evict-namespace"]
    assert named and all(b["pod"].startswith("ml/") for b in named)
    assert named[0]["detail"] == "namespace ml is in planner.evict_namespaces_exclude"


def test_protect_priority_flag_is_the_priority_threshold(tmp_path: Path) -> None:
    path = tmp_path / "defrag.yaml"
    path.write_text("planner:\n  evict_priority_threshold: 5000\n")
    args = ["plan", "--settings", str(path), "-s", str(SEED), "-o", "json",
            "--at", "2026-11-29T12:00:00Z", "--goal", "make-room"]  # fmt: skip
    # the flag overrides the file: 0 protects every pod (priority ≥ 0)
    result = runner.invoke(app, [*args, "--protect-priority", "0"])
    data = json.loads(result.output)
    assert data["steps"] == []
    assert any(
        b["detail"].endswith("≥ planner.evict_priority_threshold 0") for b in data["blocked"]
    )
    assert json.loads(runner.invoke(app, args).output)["steps"]  # 5000: nothing protected


# --- the simulator's hook honours them through the same PlannerConfig -----------------------


def test_the_fill_hook_honours_the_eviction_filters() -> None:
    # two 2-GPU nodes, every GPU holding a 300-milli pod: a whole-GPU pod needs one moved
    nodes = [Node(n, cpu_milli=32_000, memory_mib=0, num_gpu=2, gpu_model="T4") for n in "ab"]
    mix = WorkloadMix.default()

    def state() -> SimState:
        s = SimState.new(nodes, make_policy("reserve-binpack", mix=mix), "reserve-binpack", mix)
        for row in range(2):
            for gpu in range(2):
                pod = Pod(f"s{row}{gpu}", namespace="web", num_gpu=1, gpu_milli=300)
                s.place(pod, row, (gpu,))
        return s

    whole = Pod("whole", num_gpu=1)
    assert FillHook().on_unschedulable(state(), whole, 0.0)
    kept: PlannerConfig = FILL_PLANNER.with_constraints(namespaces_exclude=frozenset({"web"}))
    hook = FillHook(kept)
    assert hook.on_unschedulable(state(), whole, 0.0) == ()
