"""Eviction budgets per window, per node and per namespace, counted as evictions go out.

The limits are the planner's :class:`~defrag.plan.config.EvictionBudget` (one value, built
from the settings with the rest of the planner's configuration): the planner plans within
it, and this ledger enforces it again across every plan of one window opening.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field

from defrag.model.status import Status
from defrag.plan.config import EvictionBudget


@dataclass(slots=True)
class BudgetLedger:
    """What one window opening has spent. A new window key starts a fresh ledger."""

    budgets: EvictionBudget
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
        limit = self.budgets.total
        if limit is not None and total > limit:
            return Status.fail(
                f"window budget: {self.total} of {limit} evictions spent, {len(pods)} more asked"
            )
        nodes = Counter(node for _, node in pods)
        refused = _over("node", "from", nodes, self.by_node, self.budgets.per_node)
        if refused is not None:
            return refused
        spaces = Counter(ns for ns, _ in pods)
        refused = _over("namespace", "in", spaces, self.by_namespace, self.budgets.per_namespace)
        if refused is not None:
            return refused
        self.total = total
        self.by_node.update(nodes)
        self.by_namespace.update(spaces)
        return Status.success()

    def refund(self, pods: Sequence[tuple[str, str]]) -> None:
        """Give back what :meth:`admit` spent on ``pods`` (never below nothing): steps that
        turned out not to need an eviction (a pod already Terminating)."""
        for namespace, node in pods:
            self.total = max(self.total - 1, 0)
            self.by_node[node] = max(self.by_node[node] - 1, 0)
            self.by_namespace[namespace] = max(self.by_namespace[namespace] - 1, 0)


def _over(
    what: str, where: str, asked: Counter[str], spent: Counter[str], limit: int | None
) -> Status | None:
    """The refusal for the first key (in name order) that ``asked`` would take past ``limit``
    (None: unlimited)."""
    if limit is None:
        return None
    for key, n in sorted(asked.items()):
        if spent[key] + n > limit:
            return Status.fail(
                f"{what} budget: {spent[key]} of {limit} evictions {where} {key} spent, "
                f"{n} more asked"
            )
    return None
