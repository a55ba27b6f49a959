"""The planner's configuration is read once (defrag/plan/config.py, issue 23 item 1):
``Settings.planner_config()`` builds it, the daemon's planner port and ``defrag plan
--settings`` plan with it, so the same settings file gives the same plan."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
import yaml
from hypothesis import HealthCheck, given
from hypothesis import settings as hsettings
from hypothesis import strategies as st
from typer.testing import CliRunner

from defrag.adapters.snapshot import load_snapshot
from defrag.cli import app
from defrag.cli.run import _planner
from defrag.model.selectors import parse_label_selector
from defrag.plan import Goal
from defrag.plan.config import (
    Constraints,
    EvictionBudget,
    MakeRoomMode,
    PlannerConfig,
    PlanOptions,
    RoomValue,
)
from defrag.settings import SECTIONS, Settings, load_settings, nested

FIXTURES = Path(__file__).parent / "fixtures" / "snapshots"
SEED = FIXTURES / "scattered_20.json"
AT = "2026-11-29T12:00:00Z"
NOW = datetime(2026, 11, 29, 12, tzinfo=UTC)
runner = CliRunner()


def plan_json(*args: str) -> dict[str, Any]:
    result = runner.invoke(app, ["plan", *args, "--at", AT, "-o", "json"])
    assert result.exit_code == 0, result.output
    data: dict[str, Any] = json.loads(result.output)
    return data


def daemon_plan(settings: Settings, snapshot: Path, goal: Goal = Goal.ALL) -> dict[str, Any]:
    """What `defrag run` would plan for this snapshot: the planner port `build` wires."""
    cluster = load_snapshot(snapshot)
    profile = settings.profile_config().for_cluster(cluster)
    plan = _planner(settings)(cluster, goal, NOW, profile=profile)
    return plan.to_dict()


# --- each knob reaches the planner ---------------------------------------------------------

KNOBS: list[tuple[str, object, Any, object]] = [
    # (setting, value, where it lands in PlannerConfig, what it must read there)
    ("planner.min_pod_age_s", 900, lambda c: c.constraints.min_age, timedelta(minutes=15)),
    ("windows.max_evictions_per_window", 3, lambda c: c.constraints.budget.total, 3),
    ("windows.max_evictions_per_node", 2, lambda c: c.constraints.budget.per_node, 2),
    ("windows.max_evictions_per_namespace", 1, lambda c: c.constraints.budget.per_namespace, 1),
    ("planner.make_room_moves_any_priority", False, lambda c: c.options.mode,
     MakeRoomMode.LOWER_PRIORITY),
    ("planner.make_room_swaps", True, lambda c: c.options.swaps, True),
    ("planner.make_room_worth", 2.5, lambda c: c.options.room_worth, 2.5),
    ("planner.make_room_value", "waited", lambda c: c.options.room_value, RoomValue.WAITED),
    ("planner.make_room_horizon_s", 7200, lambda c: c.options.room_horizon_h, 2.0),
    ("planner.evict_again_after_s", 3600, lambda c: c.constraints.evict_again_after,
     timedelta(hours=1)),
    ("planner.make_room_spares_jobs", True, lambda c: c.options.spare_jobs, True),
    ("planner.evict_namespaces_include", ["ml", "batch"],
     lambda c: c.constraints.namespaces_include, frozenset({"ml", "batch"})),
    ("planner.evict_namespaces_exclude", ["kube-system"],
     lambda c: c.constraints.namespaces_exclude, frozenset({"kube-system"})),
    ("planner.evict_label_selector", "app=batch,tier!=db", lambda c: c.constraints.label_selector,
     parse_label_selector("app=batch,tier!=db")),
    ("planner.evict_priority_threshold", 1000, lambda c: c.constraints.priority_threshold, 1000),
    ("planner.evict_owner_kinds", ["MyJob.batch.example.com"],
     lambda c: c.constraints.owner_kinds, frozenset({"MyJob.batch.example.com"})),
    ("planner.depth", 2, lambda c: c.options.depth, 2),
    ("planner.min_gain_per_cost", 0.2, lambda c: c.options.min_gain_per_cost, 0.2),
    ("planner.candidates", 8, lambda c: c.options.candidates, 8),
    ("planner.tries", 3, lambda c: c.options.tries, 3),
    ("planner.max_moves_per_room", 4, lambda c: c.options.max_moves_per_room, 4),
    ("planner.max_rooms_per_cycle", None, lambda c: c.options.max_rooms, None),
    ("planner.repack_on_demand", False, lambda c: c.options.repack_on_demand, False),
    ("planner.unknown_hours", 6.0, lambda c: c.options.cost.unknown_hours, 6.0),
    ("windows.budget_follows_demand", False, lambda c: c.demand, None),
    ("windows.max_evictions_per_window_ceiling", 40, lambda c: c.demand.ceiling, 40),
    ("windows.evictions_per_starved_gpu", 2.0, lambda c: c.demand.per_gpu, 2.0),
]  # fmt: skip


@pytest.mark.parametrize(("name", "value", "where", "expected"), KNOBS)
def test_each_setting_reaches_the_planner(
    name: str, value: object, where: Any, expected: object
) -> None:
    assert where(Settings().planner_config()) != expected  # the default differs
    assert where(Settings(**nested({name: value})).planner_config()) == expected


def test_every_planner_setting_is_in_the_table() -> None:
    """A planner knob added to the settings without reaching PlannerConfig fails here."""
    planner_fields = {f"planner.{f}" for f in SECTIONS["planner"].model_fields}
    planner_fields |= {f"windows.{f}" for f in SECTIONS["windows"].model_fields}
    # the goal, the windows and the idle gate, make-room's patience under a packing scheduler
    # and its memory of the packing finding are the cycle's (Settings.cycle_config();
    # tests/test_plan_patience.py), not the planner's
    cycle = {"planner.goal", "windows.schedule", "windows.idle_gate"}
    cycle |= {"planner.make_room_packing_patience_s", "planner.make_room_packing_memory_s"}
    # windows opened early on a backlog are the cycle's too (tests/test_decide.py)
    cycle |= {f"windows.open_early_{f}" for f in ("backlog_gpu_h", "every_s", "length_s")}
    assert planner_fields - cycle == {name for name, *_ in KNOBS}


def test_the_settings_defaults_are_the_planners() -> None:
    """No hand-kept copy: the daemon's defaults are PlannerConfig's own, but for the two that
    keep a cycle's plan small."""
    daemon = PlannerConfig().with_options(max_rooms=32, repack_on_demand=True)
    assert Settings().planner_config() == daemon
    assert PlannerConfig().constraints.budget == EvictionBudget(10, 8, 5)
    assert PlannerConfig().constraints.min_age == timedelta(0)


# --- `defrag plan --settings` is the daemon's plan ---------------------------------------

setting_values = st.fixed_dictionaries(
    {},
    optional={
        "planner.min_pod_age_s": st.sampled_from([0, 600, 4 * 3600]),
        "windows.max_evictions_per_window": st.integers(0, 12),
        "windows.max_evictions_per_node": st.integers(0, 4),
        "windows.max_evictions_per_namespace": st.integers(0, 10),
        "planner.make_room_moves_any_priority": st.booleans(),
        "planner.make_room_swaps": st.booleans(),
        "planner.make_room_worth": st.sampled_from([0, 0.5, 1, 100]),
        "planner.make_room_spares_jobs": st.booleans(),
        "planner.evict_namespaces_exclude": st.sampled_from([["serving"], ["ml"], []]),
        "planner.evict_label_selector": st.sampled_from(
            ["", "app!=serve-7d9f", "job-name", "!job-name"]
        ),
        "planner.evict_priority_threshold": st.sampled_from([None, 100, 1000]),
        "planner.max_rooms_per_cycle": st.sampled_from([None, 1, 32]),
        "planner.repack_on_demand": st.booleans(),
        "scoring.policy": st.sampled_from(["reserve-binpack", "fgd", "least-allocated"]),
    },
)


@hsettings(
    max_examples=6, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    values=setting_values,
    snapshot=st.sampled_from(["scattered_20.json", "worked_example.json", "nvlink.json"]),
    goal=st.sampled_from(list(Goal)),
)
def test_plan_with_settings_is_the_daemons_plan(
    tmp_path: Path, values: dict[str, object], snapshot: str, goal: Goal
) -> None:
    path = tmp_path / "defrag.yaml"
    path.write_text(yaml.safe_dump(nested(values)))
    cli = plan_json("--settings", str(path), "-s", str(FIXTURES / snapshot), "--goal", goal)
    assert cli == daemon_plan(load_settings(path), FIXTURES / snapshot, goal)


def test_plan_without_settings_plans_with_the_daemons_defaults() -> None:
    # scattered_20: 8-GPU llm-train pending; the daemon's default budget (10 in all, 8 per
    # node, 5 per namespace) is what `defrag plan` plans within now (it was 50, unlimited)
    assert plan_json("-s", str(SEED)) == daemon_plan(Settings(), SEED)


def test_flags_override_the_settings_file(tmp_path: Path) -> None:
    path = tmp_path / "defrag.yaml"
    path.write_text("windows:\n  max_evictions_per_window: 0\nplanner:\n  min_pod_age_s: 36000\n")
    # the file's budget of 0 blocks every step; the flag gives the plan 10 back
    blocked = plan_json("--settings", str(path), "-s", str(SEED))
    assert blocked["steps"] == []
    flagged = plan_json(
        "--settings", str(path), "-s", str(SEED), "--max-evictions", "10", "--min-age", "0"
    )
    daemon = daemon_plan(
        load_settings(path, {"windows.max_evictions_per_window": 10, "planner.min_pod_age_s": 0}),
        SEED,
    )
    assert flagged == daemon and flagged["steps"]


def test_no_preempt_keeps_the_rest_of_the_mode() -> None:
    assert MakeRoomMode.MIGRATE_THEN_PREEMPT.without_preemption() is MakeRoomMode.MIGRATE
    assert MakeRoomMode.LOWER_PRIORITY.without_preemption() is MakeRoomMode.LOWER_PRIORITY_MIGRATE
    assert MakeRoomMode.FILL.without_preemption() is MakeRoomMode.FILL


@pytest.mark.parametrize(
    ("preempt", "migrate_any", "mode"),
    [
        (True, True, MakeRoomMode.MIGRATE_THEN_PREEMPT),
        (False, True, MakeRoomMode.MIGRATE),
        (True, False, MakeRoomMode.LOWER_PRIORITY),
        (False, False, MakeRoomMode.LOWER_PRIORITY_MIGRATE),
    ],
)
def test_mode_of_the_two_switches(preempt: bool, migrate_any: bool, mode: MakeRoomMode) -> None:
    got = MakeRoomMode.of(preempt=preempt, migrate_any_priority=migrate_any)
    assert got is mode and got.preempts == preempt and got.migrates_any_priority == migrate_any


def test_constraints_refuse_include_and_exclude_together() -> None:
    with pytest.raises(ValueError, match="mutually exclusive"):
        Constraints(namespaces_include=frozenset({"a"}), namespaces_exclude=frozenset({"b"}))


def test_eviction_budget_refuses_a_negative_limit() -> None:
    with pytest.raises(ValueError, match="per_node"):
        EvictionBudget(1, -1, 1)


def test_plan_options_default_mode() -> None:
    assert PlanOptions().mode is MakeRoomMode.MIGRATE_THEN_PREEMPT
