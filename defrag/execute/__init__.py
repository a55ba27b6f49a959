"""Carrying plans out safely: windows, budgets, the drain journal, the circuit breaker."""

from defrag.execute.circuit import CircuitBreaker, CircuitState
from defrag.execute.executor import Executor, ExecutorSettings
from defrag.execute.outcome import Execution, ReconcileOutcome, StepOutcome
from defrag.execute.reconcile import Reconciler
from defrag.execute.windows import Window, WindowStatus, window_status
from defrag.plan.config import EvictionBudget
from defrag.plan.spend import BudgetLedger

__all__ = [
    "BudgetLedger",
    "CircuitBreaker",
    "CircuitState",
    "EvictionBudget",
    "Execution",
    "Executor",
    "ExecutorSettings",
    "ReconcileOutcome",
    "Reconciler",
    "StepOutcome",
    "Window",
    "WindowStatus",
    "window_status",
]
