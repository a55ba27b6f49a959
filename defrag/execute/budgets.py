"""Eviction budgets per window, per node and per namespace, counted as evictions go out."""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field

from defrag.scoring.framework import Status


@dataclass(frozen=True, slots=True)
class Budgets:
    """The most evictions allowed in one window opening: in all, from one node, in one namespace."""

    per_window: int = 10
    per_node: int = 8
    per_namespace: int = 5


@dataclass(slots=True)
class BudgetLedger:
    """What one window opening has spent. A new window key starts a fresh ledger."""

    budgets: Budgets
    window: str = ""
    total: int = 0
    by_node: Counter[str] = field(default_factory=Counter)
    by_namespace: Counter[str] = field(default_factory=Counter)

    def for_window(self, key: str) -> BudgetLedger:
        """This ledger if it counts ``key``'s window, else a fresh one for it."""
        if key == self.window:
            return self
        return BudgetLedger(self.budgets, key)

    def copy(self) -> BudgetLedger:
        return BudgetLedger(
            self.budgets, self.window, self.total, Counter(self.by_node), Counter(self.by_namespace)
        )

    def admit(self, pods: Sequence[tuple[str, str]]) -> Status:
        """Spend budget for ``pods`` — (namespace, node) pairs, a gang at once — or refuse all."""
        total = self.total + len(pods)
        if total > self.budgets.per_window:
            return Status.fail(
                f"window budget: {self.total} of {self.budgets.per_window} evictions spent, "
                f"{len(pods)} more asked"
            )
        nodes = Counter(node for _, node in pods)
        for node, n in sorted(nodes.items()):
            if self.by_node[node] + n > self.budgets.per_node:
                return Status.fail(
                    f"node budget: {self.by_node[node]} of {self.budgets.per_node} evictions "
                    f"from {node} spent, {n} more asked"
                )
        spaces = Counter(ns for ns, _ in pods)
        for ns, n in sorted(spaces.items()):
            if self.by_namespace[ns] + n > self.budgets.per_namespace:
                return Status.fail(
                    f"namespace budget: {self.by_namespace[ns]} of {self.budgets.per_namespace} "
                    f"evictions in {ns} spent, {n} more asked"
                )
        self.total = total
        self.by_node.update(nodes)
        self.by_namespace.update(spaces)
        return Status.success()
