"""Carrying plans out safely: windows, budgets, the drain journal, the circuit breaker."""

from defrag.execute.budgets import BudgetLedger, Budgets
from defrag.execute.circuit import CircuitBreaker, CircuitState
from defrag.execute.executor import Executor, ExecutorSettings
from defrag.execute.outcome import Execution, ReconcileOutcome, StepOutcome
from defrag.execute.windows import Window, WindowStatus, window_status

__all__ = [
    "BudgetLedger",
    "Budgets",
    "CircuitBreaker",
    "CircuitState",
    "Execution",
    "Executor",
    "ExecutorSettings",
    "ReconcileOutcome",
    "StepOutcome",
    "Window",
    "WindowStatus",
    "window_status",
]
