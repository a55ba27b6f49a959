"""Planning: repack and make-room plans, made with the scheduler's own filter + score."""

from defrag.plan.config import (
    DEFAULT_OPTIONS,
    Constraints,
    EvictionBudget,
    Goal,
    MakeRoomMode,
    PlannerConfig,
    PlanOptions,
)
from defrag.plan.cost import CostModel
from defrag.plan.model import Blocked, Plan, PlanFormatError, Step
from defrag.plan.planner import PlanError, make_plan

__all__ = [
    "DEFAULT_OPTIONS",
    "Blocked",
    "Constraints",
    "CostModel",
    "EvictionBudget",
    "Goal",
    "MakeRoomMode",
    "Plan",
    "PlanError",
    "PlanFormatError",
    "PlanOptions",
    "PlannerConfig",
    "Step",
    "make_plan",
]
