"""Planning: repack and make-room plans, made with the scheduler's own filter + score."""

from defrag.plan.constraints import Constraints
from defrag.plan.cost import CostModel
from defrag.plan.model import Blocked, Plan, PlanFormatError, Step
from defrag.plan.planner import DEFAULT_OPTIONS, PlanError, PlanOptions, make_plan

__all__ = [
    "DEFAULT_OPTIONS",
    "Blocked",
    "Constraints",
    "CostModel",
    "Plan",
    "PlanError",
    "PlanFormatError",
    "PlanOptions",
    "Step",
    "make_plan",
]
