"""The window budget that follows its backlog (defrag.plan.budget, issue 25)."""

from __future__ import annotations

import pytest

from defrag.model.resources import Pod
from defrag.plan.budget import DemandBudget


@pytest.mark.parametrize(
    ("budget", "gpus", "milli", "expected"),
    [
        (DemandBudget(10), [8, 8], 1000, 16),  # 16 GPUs × 1 = 16
        (DemandBudget(10), [1, 1], 1000, 10),  # 2 GPUs: the floor
        (DemandBudget(10), [], 1000, 10),  # nobody starved: the floor
        (DemandBudget(10, ceiling=12), [8, 8], 1000, 12),  # 16 capped at 12
        (DemandBudget(0, per_gpu=2.0), [4], 1000, 8),  # 4 GPUs × 2 = 8
        (DemandBudget(0), [1, 1, 1], 300, 1),  # 3 × 0.3 = 0.9 GPU → 1 eviction
        (DemandBudget(0), [1, 1, 1, 1, 1], 200, 1),  # 5 × 0.2 = 1.0 (no round-up past 1)
    ],
)
def test_budget_is_the_backlogs_gpus_within_floor_and_ceiling(
    budget: DemandBudget, gpus: list[int], milli: int, expected: int
) -> None:
    pods = [Pod(f"p{i}", num_gpu=g, gpu_milli=milli) for i, g in enumerate(gpus)]
    assert budget.total(pods) == expected


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"floor": -1}, "floor must be >= 0"),
        ({"floor": 10, "ceiling": 5}, "ceiling (5) must be >= floor (10)"),
        ({"floor": 1, "per_gpu": -1.0}, "per_gpu must be a finite number >= 0"),
        ({"floor": 1, "per_gpu": float("nan")}, "per_gpu must be a finite number >= 0"),
    ],
)
def test_bad_budget_is_refused(kwargs: dict[str, float], message: str) -> None:
    with pytest.raises(ValueError, match=message.replace("(", r"\(").replace(")", r"\)")):
        DemandBudget(**kwargs)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("demand", "steps"),
    [
        # n3's two 1-GPU pods must move for the 8-GPU job; the fixed budget is 1 eviction.
        (None, 0),  # fixed: 1 < 2, no room (budget-window)
        (DemandBudget(1), 2),  # the backlog asks 8 GPUs: 8 evictions allowed, 2 used
        (DemandBudget(1, ceiling=1), 0),  # the ceiling holds it at 1
    ],
)
def test_a_make_room_plan_is_sized_by_its_backlog(demand: DemandBudget | None, steps: int) -> None:
    from defrag.plan import make_plan
    from defrag.plan.config import Constraints, EvictionBudget, PlannerConfig
    from tests.test_plan_support import NOW, cluster, fill, gpu_node, pending

    nodes = [gpu_node(f"n{i}") for i in range(1, 4)]
    pods = [*fill("n1", 4), *fill("n2", 4), *fill("n3", 2), pending("job", 8)]
    config = PlannerConfig(Constraints(budget=EvictionBudget(1, None, None)), demand=demand)
    plan = make_plan(cluster(nodes, pods), "make-room", now=NOW, config=config)
    assert len(plan.steps) == steps
    if not steps:
        assert any(b.constraint == "budget-window" for b in plan.blocked)


def test_a_ceiling_below_the_fixed_budget_is_refused_naming_both() -> None:
    from defrag.settings import Settings

    with pytest.raises(ValueError, match="max_evictions_per_window_ceiling") as err:
        Settings(windows={"max_evictions_per_window": 20, "max_evictions_per_window_ceiling": 10})
    assert "windows.max_evictions_per_window (20)" in str(err.value)
    fixed = Settings(
        windows={
            "max_evictions_per_window": 20,
            "max_evictions_per_window_ceiling": 10,
            "budget_follows_demand": False,
        }
    )
    assert fixed.planner_config().demand is None
    assert fixed.planner_config().window_budget().total == 20
    assert Settings().planner_config().window_budget().total == 512  # the ceiling


@pytest.mark.parametrize(
    ("fixed", "ceiling", "in_force"),
    [
        (10, None, 512),  # the defaults: the shipped ceiling
        (600, None, 600),  # a fixed budget raised above 512 raises the default ceiling with it
        (100_000, None, 100_000),  # the chaos soak's settings (before: refused at start)
        (600, 700, 700),  # a ceiling set is the one in force
    ],
)
def test_the_default_ceiling_never_sits_below_the_fixed_budget(
    fixed: int, ceiling: int | None, in_force: int
) -> None:
    from defrag.settings import Settings

    extra = {} if ceiling is None else {"max_evictions_per_window_ceiling": ceiling}
    settings = Settings(windows={"max_evictions_per_window": fixed, **extra})
    assert settings.planner_config().window_budget().total == in_force
