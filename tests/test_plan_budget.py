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
